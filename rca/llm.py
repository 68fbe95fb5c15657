"""The LLM writer: the only module that imports langchain.

ChatOpenAI against any OpenAI-compatible server (vLLM, Ollama, llama.cpp's llama-server, a gateway) with a
configurable base URL and model, structured output into LlmAnalysis (`json_schema` by default; servers
differ, so the method is a setting), prompts as jinja2 files beside this module. The bundle goes into the
prompt between markers carrying a random nonce, so a log line cannot close the data block and speak as
the operator; the system prompt says that text inside is data, never instructions.

Every failure (no server, timeout, refusal, output that is not the schema) is an LlmOutcome with ok=False
and the reason; the caller then writes the deterministic report.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from core.types import Category
from rca.evidence import EvidenceBundle
from rca.verdict import CATEGORY_MEANINGS

PROMPTS = Path(__file__).parent / "prompts"
Method = Literal["json_schema", "json_mode", "function_calling"]
CategoryName = Literal[tuple(c.value for c in Category)]  # type: ignore[valid-type]


class TimelineEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    at: str | None = Field(default=None, max_length=64, description="time shown by the evidence, if any")
    event: str = Field(max_length=400)


class LlmAnalysis(BaseModel):
    """What the LLM writes. Bounded: a verbose or looping model cannot flood the report."""

    model_config = ConfigDict(extra="ignore")

    category: CategoryName  # type: ignore[valid-type]
    summary: str = Field(max_length=800, description="two sentences at most")
    root_cause: str = Field(max_length=2000)
    timeline: list[TimelineEntry] = Field(default_factory=list, max_length=15)
    next_steps: list[str] = Field(default_factory=list, max_length=8,
                                  description="ids of the RECOMMENDED ACTIONS offered, most useful first")
    evidence_refs: list[int] = Field(default_factory=list, max_length=30)
    confidence: float = Field(ge=0.0, le=1.0)


@dataclass(frozen=True)
class LlmOutcome:
    ok: bool
    model: str
    seconds: float
    analysis: LlmAnalysis | None = None
    error: str | None = None


class LlmWriter:
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 1,
        method: Method = "json_schema",
        temperature: float = 0.0,
        max_tokens: int = 1024,  # 600 cut off a 1.5B model's answers with long evidence lists (demo, 3 of 6)
        prompts: Path = PROMPTS,
    ) -> None:
        from langchain_openai import ChatOpenAI

        self.model = model
        self.base_url = base_url.rstrip("/")
        self.method = method
        # A local server needs no key, but the client insists on one.
        chat = ChatOpenAI(base_url=self.base_url, model=model, api_key=SecretStr(api_key or "not-needed"),
                          timeout=timeout_s, max_retries=max_retries, temperature=temperature,
                          max_completion_tokens=max_tokens)  # ChatOpenAI's max_tokens, by its alias
        self._runnable = chat.with_structured_output(LlmAnalysis, method=method, include_raw=True)
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(prompts), undefined=jinja2.StrictUndefined,
                                 autoescape=False, keep_trailing_newline=True)
        self._system = env.get_template("system.jinja2")
        self._user = env.get_template("user.jinja2")

    def messages(self, bundle: EvidenceBundle) -> list[tuple[str, str]]:
        nonce = secrets.token_hex(6)
        markers = {"open_marker": f"<<<CLUSTER-DATA-{nonce}", "close_marker": f"CLUSTER-DATA-{nonce}>>>"}
        categories = [(c.value, meaning) for c, meaning in CATEGORY_MEANINGS.items()]
        return [
            ("system", self._system.render(categories=categories, **markers)),
            ("human", self._user.render(bundle=bundle, **markers)),
        ]

    def analyze(self, bundle: EvidenceBundle) -> LlmOutcome:
        started = time.monotonic()

        def failed(reason: str) -> LlmOutcome:
            return LlmOutcome(ok=False, model=self.model, seconds=round(time.monotonic() - started, 2),
                              error=reason[:500])

        try:
            result: dict[str, Any] = self._runnable.invoke(self.messages(bundle))
        except ValidationError as exc:
            return failed(f"the answer did not fit the report schema: {_first_error(exc)}")
        except Exception as exc:  # noqa: BLE001 - openai/httpx/langchain raise many types; all mean "no analysis"
            return failed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}")
        parsed = result.get("parsed")
        if isinstance(parsed, LlmAnalysis):
            return LlmOutcome(ok=True, model=self.model, seconds=round(time.monotonic() - started, 2),
                              analysis=parsed)
        problem = result.get("parsing_error")
        raw = getattr(result.get("raw"), "content", "") or ""
        detail = _first_error(problem) if isinstance(problem, ValidationError) else str(problem or "no parsed output")
        return failed(f"the answer did not fit the report schema ({detail}); it began: {json.dumps(raw[:160])}")


def _first_error(exc: Any) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or 'answer'}: {err['msg']}"
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
