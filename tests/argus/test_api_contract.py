"""The node agents' routes keep the OpenAPI contract (the rest of the API is checked against a real `argus serve` in
test_api_contract_real.py, whose Argus takes no node agents: its fleet would start agents on the session's cluster).
schemathesis generates requests from the document, in-process, and checks every answer as that test does."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from argus.agents.inbox import AgentInbox
from argus.api.app import create_app
from argus.store.store import Store
from argus.store.tokens import Role


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_the_node_agents_routes_keep_their_contract(mode: schemathesis.GenerationMode, tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    app = create_app(store=store, node_agents=AgentInbox(max_lines=10_000))
    tokens = {role: store.create_token(f"t-{role.value}", role, created_by="tests")[1]
              for role in (Role.VIEWER, Role.NODE_AGENT)}
    schema = schemathesis.openapi.from_asgi("/openapi.json", app).include(path_regex="^/v1/agents")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert sorted(f"{o.method.upper()} {o.path}" for o in operations) == ["GET /v1/agents", "POST /v1/agents/batch"]
    try:
        for operation in operations:
            role = Role.NODE_AGENT if operation.path.endswith("/batch") else Role.VIEWER
            _keeps_its_contract(operation, mode, {"Authorization": f"Bearer {tokens[role]}"})
    finally:
        store.close()


def _keeps_its_contract(operation: schemathesis.APIOperation, mode: schemathesis.GenerationMode,
                        auth: dict[str, str]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=auth)

    check()
