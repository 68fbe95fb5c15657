"""The stage's agent loop reads what the model asks for: a native tool call, a JSON object in its text (fenced or
not), or an answer; anything else is its answer as text."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage

from stage.localstack.mcp_agent import tool_request


@pytest.mark.parametrize(("message", "wanted"), [
    (AIMessage("", tool_calls=[{"name": "get_report", "args": {"incident_id": "inc-1"}, "id": "c1"}]),
     ("get_report", {"incident_id": "inc-1"})),
    (AIMessage('```json\n{"name": "list_incidents", "arguments": {"state": "open"}}\n```'),
     ("list_incidents", {"state": "open"})),
    (AIMessage('{"name": "argus_health"}'), ("argus_health", {})),
    (AIMessage('{"name": "get_report", "arguments": "inc-1"}'), ("get_report", {})),
    (AIMessage('{"answer": "node_lost"}'), "node_lost"),
    (AIMessage("The incident is node_lost."), "The incident is node_lost."),
    (AIMessage('{"name": broken json'), '{"name": broken json'),
])
def test_what_the_model_asks_for(message: AIMessage, wanted: object) -> None:
    assert tool_request(message) == wanted
