"""The OpenAPI document states the errors each route answers, in the one error model the API sends: a client
generated from it must not break on the first 401, 404 or 503."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
from fastapi.testclient import TestClient

from argus.api.app import create_app
from argus.store.store import Store
from argus.store.tokens import Role


@pytest.fixture
def app(tmp_path: Path):
    store = Store(f"sqlite:///{tmp_path / 'argus.db'}")
    yield create_app(store=store)
    store.close()


def test_every_operation_documents_its_errors_with_the_error_model(app) -> None:
    schema = app.openapi()
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            wanted = {"500", "503"}
            wanted |= {"401", "403"} if operation.get("security") else set()
            wanted |= {"404"} if "{" in path else set()
            wanted |= {"409", "413"} if method in ("post", "put", "patch", "delete") else set()
            assert wanted <= set(responses), (method, path, sorted(responses))
            for code, response in responses.items():
                if code.startswith(("4", "5")):
                    assert response["content"]["application/json"]["schema"] == error_ref, (method, path, code)
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    assert schema is app.openapi()  # generated once: the errors are not added twice


def test_the_errors_the_api_sends_are_the_documented_model(app, tmp_path: Path) -> None:
    validator = jsonschema.Draft202012Validator(app.openapi()["components"]["schemas"]["ErrorBody"])
    token = app.state.store.create_token("t", Role.VIEWER, created_by="tests")[1]
    client = TestClient(app, raise_server_exceptions=False)
    auth = {"Authorization": f"Bearer {token}"}
    answers = [client.get("/v1/incidents"),  # 401: no token
               client.get("/v1/incidents/inc-000000000000", headers=auth),  # 404
               client.get("/v1/incidents?limit=0", headers=auth),  # 422
               client.post("/v1/incidents/inc-000000000000:resolve", json={"reason": "x"}, headers=auth)]  # 403
    assert [a.status_code for a in answers] == [401, 404, 422, 403]
    for answer in answers:
        assert not list(validator.iter_errors(answer.json())), answer.json()


def test_a_wrong_method_names_every_method_of_the_path_and_ids_never_swallow_a_verb(app) -> None:
    token = app.state.store.create_token("t", Role.VIEWER, created_by="tests")[1]
    client = TestClient(app, raise_server_exceptions=False, headers={"Authorization": f"Bearer {token}"})
    nodes = client.request("OPTIONS", "/v1/nodes")  # GET and POST are two routes: Starlette named the first only
    assert nodes.status_code == 405 and nodes.headers["allow"] == "GET, POST"
    # `/v1/incidents/{id}` must not match `inc-1:resolve`: the path's one method is POST
    verb = client.get("/v1/incidents/inc-000000000001:resolve")
    assert verb.status_code == 405 and verb.headers["allow"] == "POST"
    assert client.get("/v1/incidents/" + "a" * 65).status_code == 422  # the id's pattern, named in problems


def test_a_date_is_rfc_3339_text_not_a_number(app) -> None:
    token = app.state.store.create_token("t", Role.VIEWER, created_by="tests")[1]
    client = TestClient(app, raise_server_exceptions=False, headers={"Authorization": f"Bearer {token}"})
    assert client.get("/v1/incidents", params={"since": "0.5"}).status_code == 422  # not 1970-01-01T00:00:00.5
    assert client.get("/v1/incidents", params={"since": "2026-11-29T08:00:00Z"}).status_code == 200
