"""The committed OpenAPI document matches the app, and the app honours it under fuzzing."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from app.config import Settings
from app.main import create_app
from tests.conftest import LiveServer

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_committed_document_is_current() -> None:
    current = json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
    assert COMMITTED.read_text() == current, "run `make openapi` and commit openapi/openapi.json"


def test_operation_ids_are_stable_and_errors_documented(app: FastAPI) -> None:
    document = app.openapi()
    ids = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            ids.append(operation["operationId"])
            assert "_" not in operation["operationId"], (method, path)
            if path.startswith("/v1/"):
                for status in ("401", "422"):
                    schema = operation["responses"][status]["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (method, path)
    assert len(ids) == len(set(ids))


@pytest.fixture(scope="session")
def api_schema(live_server: LiveServer) -> Any:
    return schemathesis.openapi.from_url(f"{live_server.url}/openapi.json")


@pytest.fixture(scope="session")
def real_session_id(live_server: LiveServer) -> str:
    """A session of the fuzzing tenant, so generated requests reach real rows too."""
    auth = {"Authorization": f"Bearer {live_server.key}"}
    created = httpx.post(f"{live_server.url}/v1/sessions", json={"title": "fuzz"}, headers=auth)
    session_id: str = created.json()["id"]
    body = {"entries": [{"kind": "message", "payload": {"role": "user", "content": "hi"}}]}
    httpx.post(f"{live_server.url}/v1/sessions/{session_id}/entries", json=body, headers=auth)
    return session_id


schema = schemathesis.pytest.from_fixture("api_schema")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_input_gives_500_and_responses_conform(
    case: Any, live_server: LiveServer, real_session_id: str
) -> None:
    headers = {"Authorization": f"Bearer {live_server.key}"}
    case.call_and_validate(base_url=live_server.url, headers=headers, checks=CHECKS)
    if case.path_parameters and "session_id" in case.path_parameters:
        # The same request against a session that exists (a random uuid only ever finds 404).
        if case.method.upper() == "DELETE" or case.path.endswith("/stream"):
            return
        if case.path.endswith("/ask"):
            # This server runs no workers, so a stream would never end: ask in the background.
            if not isinstance(case.body, dict):
                return
            case.body["stream"] = False
        case.path_parameters["session_id"] = real_session_id
        case.call_and_validate(base_url=live_server.url, headers=headers, checks=CHECKS)


def test_fuzzing_tenant_cannot_reach_other_tenants(live_server: LiveServer) -> None:
    response = httpx.get(
        f"{live_server.url}/v1/sessions/{uuid.uuid4()}",
        headers={"Authorization": f"Bearer {live_server.key}"},
    )
    assert response.status_code == 404
