"""The committed OpenAPI document matches the app, and the app honours it under fuzzing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    missing_required_header,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api.sse import event_component
from app.api.ui_messages import UI_CHUNK_SCHEMA
from app.config import Settings
from app.eventlog.registry import PAYLOADS, EventType
from app.main import create_app
from tests.conftest import LiveServer

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_committed_document_is_current() -> None:
    current = json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"
    assert COMMITTED.read_text() == current, "run `make openapi` and commit openapi/openapi.json"


def test_streams_are_documented_as_event_streams_only(app: FastAPI) -> None:
    """A streaming response declares text/event-stream alone (a generated client types it by
    its events, not as unknown JSON); its events are the registry's, one schema per type
    discriminated by `event`. The JSON answers of the same operations are other statuses."""
    document = app.openapi()
    streaming = {}
    for operations in document["paths"].values():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                content = response.get("content", {})
                if "text/event-stream" in content:
                    assert list(content) == ["text/event-stream"], operation["operationId"]
                    assert status == "200"
                    streaming[operation["operationId"]] = content["text/event-stream"]["schema"]
    # The AI SDK's chat protocol streams its own chunks (app/api/ui_stream.py).
    assert streaming.pop("uiChat") == streaming.pop("resumeUiChat") == UI_CHUNK_SCHEMA
    assert set(streaming) == {"ask", "compactSession", "joinSessionStream", "streamRunEvents"}
    assert all(s == {"$ref": "#/components/schemas/RunEvent"} for s in streaming.values())
    union = document["components"]["schemas"]["RunEvent"]
    assert set(union["discriminator"]["mapping"]) == {str(t) for t in EventType}
    assert len(union["oneOf"]) == len(PAYLOADS)
    for operation_id, path in (("ask", "/ask"), ("compactSession", "/compact")):
        queued = document["paths"][f"/v1/sessions/{{session_id}}{path}"]["post"]["responses"]
        assert queued["202"]["content"] == {
            "application/json": {"schema": {"$ref": "#/components/schemas/Run"}}
        }, operation_id


def test_a_session_config_is_the_session_config_component(app: FastAPI) -> None:
    """Not an inline object: its generated name collided with SessionConfig's."""
    schemas = app.openapi()["components"]["schemas"]
    config = {"$ref": "#/components/schemas/SessionConfig"}
    assert schemas["Session"]["properties"]["config"] == config
    assert schemas["SessionCreate"]["properties"]["config"]["$ref"] == config["$ref"]


def test_openapi_python_client_generates_every_operation(tmp_path: Path) -> None:
    """openapi-python-client, the generator most Python users reach for, builds a client from
    the committed document with no warning, every operation and every schema in it."""
    from openapi_python_client.strings import snake_case

    document = json.loads(COMMITTED.read_text())
    bin_dir = os.path.dirname(sys.executable)  # its post-hooks run ruff from the venv
    generated = subprocess.run(
        [
            os.path.join(bin_dir, "openapi-python-client"),
            "generate",
            "--path",
            str(COMMITTED),
            "--output-path",
            str(tmp_path / "client"),
            "--meta",
            "none",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        timeout=300,
    )
    output = generated.stdout + generated.stderr
    assert generated.returncode == 0, output
    assert "warning" not in output.lower(), output
    modules = {p.stem for p in (tmp_path / "client" / "api").rglob("*.py")}
    operations = {
        snake_case(op["operationId"]) for ops in document["paths"].values() for op in ops.values()
    }
    assert operations - modules == set()
    models = (tmp_path / "client" / "models").glob("*.py")
    classes = {
        line.removeprefix("class ").split("(")[0].split(":")[0]
        for module in models
        for line in module.read_text().splitlines()
        if line.startswith("class ")
    }
    events = {event_component(model) for model in PAYLOADS.values()}
    assert {"Session", "SessionList", "SessionConfig", "Run", *events} - classes == set()


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


def test_paged_limits_are_documented_as_enforced(live_server: LiveServer) -> None:
    """The document's `limit` maximum is the server's max_page_size: the largest documented
    value is accepted and the next one refused."""
    document = httpx.get(f"{live_server.url}/openapi.json").json()
    auth = {"Authorization": f"Bearer {live_server.key}"}
    session = httpx.post(f"{live_server.url}/v1/sessions", json={}, headers=auth).json()
    paths = {
        "listSessions": "/v1/sessions",
        "listEntries": f"/v1/sessions/{session['id']}/entries",
        "listMemory": "/v1/memory",
    }
    for operation_id, path in paths.items():
        operation = next(
            op
            for ops in document["paths"].values()
            for op in ops.values()
            if op["operationId"] == operation_id
        )
        limit = next(p for p in operation["parameters"] if p["name"] == "limit")
        largest = limit["schema"]["maximum"]
        assert largest == Settings().max_page_size, operation_id
        accepted = httpx.get(f"{live_server.url}{path}?limit={largest}", headers=auth)
        assert accepted.status_code == 200, (operation_id, accepted.text)
        refused = httpx.get(f"{live_server.url}{path}?limit={largest + 1}", headers=auth)
        assert refused.status_code == 422, (operation_id, refused.text)
        assert refused.json()["error"]["details"]["loc"] == ["query", "limit"]


def test_a_configured_page_size_is_what_the_document_says() -> None:
    document = create_app(Settings(max_page_size=50)).openapi()
    limit = next(
        p for p in document["paths"]["/v1/memory"]["get"]["parameters"] if p["name"] == "limit"
    )
    assert limit["schema"]["maximum"] == 50


def test_sent_headers_are_documented(app: FastAPI) -> None:
    memory = app.openapi()["paths"]["/v1/memory/{namespace}"]
    for method, status in (("get", "200"), ("put", "200"), ("put", "201"), ("patch", "200")):
        assert "ETag" in memory[method]["responses"][status]["headers"], (method, status)
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            if "401" in operation["responses"]:
                assert "WWW-Authenticate" in operation["responses"]["401"]["headers"], (
                    method,
                    path,
                )


async def test_401_sends_the_documented_header(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/sessions", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.fixture(scope="session")
def api_schema(live_server: LiveServer) -> Any:
    loaded = schemathesis.openapi.from_url(f"{live_server.url}/openapi.json")
    # Authenticated as the fuzzing tenant through the schema's config, so that the fuzzer knows
    # which cases it sent without a key (and expects 401 for them).
    loaded.config.update(
        base_url=live_server.url, headers={"Authorization": f"Bearer {live_server.key}"}
    )
    # Schema-violating requests must be refused with one of the documented refusals (413 for a
    # body over the limit, 412 for a failed precondition included), never accepted.
    # The check's own config class (its defaults, and the type the checks declare), which
    # schemathesis.config does not export: take it from the config it replaces.
    checks = loaded.config.checks
    checks.negative_data_rejection = type(checks.negative_data_rejection)(
        expected_statuses=[400, 401, 404, 405, 409, 412, 413, 422]
    )
    return loaded


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
# What the document promises: statuses, media types, bodies and headers of every response, and
# that data the schema forbids is refused. (positive_data_acceptance is left out on purpose:
# schema-valid requests may still be refused for their meaning, e.g. 409 busy, 412 stale ETag,
# 422 context_overflow, and each of those is a documented status. ignored_auth is left out too:
# it cannot tell its own generated keys from the tenant's key the config sends.)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
    missing_required_header,
]
# For a case whose parts the test replaced: it no longer is the violation the fuzzer generated.
RESPONSE_CHECKS = CHECKS[:5]


def _never_hang(case: Any) -> bool:
    """This server runs no workers, so a stream would never end: ask, compact and wait in the
    background. False: the case cannot be made finite (the SSE operations; tested end to end
    against a served API in tests/api/test_runs.py)."""
    if case.path.endswith(("/stream", "/events")):
        return False
    if case.path.endswith(("/ask", "/compact")) and isinstance(case.body, dict):
        case.body["stream"] = False
    if case.path == "/v1/runs/{run_id}" and case.query:
        case.query["wait"] = "false"
    return True


@schema.parametrize()
@settings(
    max_examples=25,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_no_input_gives_500_and_responses_conform(
    case: Any, live_server: LiveServer, real_session_id: str
) -> None:
    if not _never_hang(case):
        return
    case.call_and_validate(checks=CHECKS)
    if case.path_parameters and "session_id" in case.path_parameters:
        # The same request against a session that exists (a random uuid only ever finds 404).
        if case.method.upper() == "DELETE":
            return
        case.path_parameters["session_id"] = real_session_id
        case.call_and_validate(checks=RESPONSE_CHECKS)


def test_stateful_sequences_conform(api_schema: Any, live_server: LiveServer) -> None:
    """Chains that follow the document's links (create a session, then read, fork, append, ask,
    search, project it; put memory, then patch and delete it), every response checked."""
    finite = api_schema.exclude(path_regex=r"/(stream|events)$")

    class Sequences(finite.as_state_machine()):  # type: ignore[misc]
        def before_call(self, case: Any) -> None:
            _never_hang(case)

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    Sequences.run(
        settings=settings(
            max_examples=15,
            stateful_step_count=6,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
    )


def test_fuzzing_tenant_cannot_reach_other_tenants(live_server: LiveServer) -> None:
    response = httpx.get(
        f"{live_server.url}/v1/sessions/{uuid.uuid4()}",
        headers={"Authorization": f"Bearer {live_server.key}"},
    )
    assert response.status_code == 404
