"""A small ops agent for the stage: an LLM (langchain's ChatOpenAI on any OpenAI-compatible server) that reads Argus
through `argus mcp` with the MCP SDK's client. It stands in for the user's ops agent in tests and demos; it is not
part of Argus.

The local model (a 1.5B coder model on llama-server) does not emit OpenAI tool calls, so the loop takes either: the
server's `tool_calls`, or one JSON object `{"name": ..., "arguments": {...}}` in the reply's text (prompted tool
calling, as MCP hosts do for models without native tool calls). It offers only the read-only tools (their MCP
annotations say so): an agent this small may read, never approve.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from mcp import Client
from pydantic import SecretStr

RESULT_CHARS = 1500  # of each tool result shown to the model: a small context holds a few of them
_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


@dataclass
class Step:
    tool: str
    arguments: dict[str, Any]
    ok: bool
    result: str


@dataclass
class Transcript:
    steps: list[Step] = field(default_factory=list)
    answer: str | None = None


def tool_request(message: AIMessage) -> tuple[str, dict[str, Any]] | str:
    """The tool the model asks for (name, arguments), or its final answer as text."""
    if message.tool_calls:
        call = message.tool_calls[0]
        return call["name"], dict(call["args"])
    text = message.content if isinstance(message.content, str) else json.dumps(message.content)
    found = _JSON_OBJECT.search(text)
    if found:
        try:
            asked = json.loads(found.group(0))
        except ValueError:
            return text
        if isinstance(asked, dict) and isinstance(asked.get("name"), str):
            arguments = asked.get("arguments") or {}
            return asked["name"], arguments if isinstance(arguments, dict) else {}
        if isinstance(asked, dict) and "answer" in asked:
            return str(asked["answer"])
    return text


async def run_agent(client: Client, *, base_url: str, model: str, task: str, max_steps: int = 6,
                    timeout_s: float = 300.0) -> Transcript:
    """Let the model work on `task` with Argus's read-only MCP tools, at most `max_steps` tool calls."""
    tools = [t for t in (await client.list_tools()).tools if t.annotations and t.annotations.read_only_hint]
    offered = {t.name for t in tools}
    catalogue = "\n".join(f"- {t.name}: {t.description} Arguments (JSON Schema): "
                          f"{json.dumps(t.input_schema.get('properties', {}))}" for t in tools)
    system = ("You are an ops agent for Argus, which watches GPU training jobs on Ray. You have these tools:\n"
              f"{catalogue}\n"
              'To call a tool reply with only one JSON object: {"name": "<tool>", "arguments": {...}}. '
              "Ids come from tool results: list first, never invent an id. "
              'When you have what the task asks for, reply with only {"answer": "<your answer>"}.')
    chat = ChatOpenAI(base_url=base_url, model=model, api_key=SecretStr("not-needed"), temperature=0,
                      timeout=timeout_s, max_retries=0)
    messages: list[BaseMessage] = [SystemMessage(system), HumanMessage(task)]
    transcript = Transcript()
    for _ in range(max_steps):
        reply = await chat.ainvoke(messages)
        assert isinstance(reply, AIMessage)
        asked = tool_request(reply)
        if isinstance(asked, str):
            transcript.answer = asked
            return transcript
        name, arguments = asked
        messages.append(AIMessage(json.dumps({"name": name, "arguments": arguments})))
        if name not in offered:
            result, ok = f"there is no tool {name!r}; the tools are: {', '.join(sorted(offered))}", False
        else:
            called = await client.call_tool(name, arguments)
            result = "".join(getattr(block, "text", "") for block in called.content)
            ok = not called.is_error
        transcript.steps.append(Step(name, arguments, ok, result))
        messages.append(HumanMessage(f"Result of {name}:\n{result[:RESULT_CHARS]}\n"
                                     "Next: call another tool, or give your answer."))
    return transcript
