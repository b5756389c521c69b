"""One error shape for every failure, with the right status and the offending path."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from testkit.api import new_session


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


async def test_malformed_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/sessions", content=b'{"title": ', headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "invalid_json")


async def test_wrong_type_names_the_path(client: httpx.AsyncClient) -> None:
    error = assert_error(
        await client.post("/v1/sessions", json={"title": 5}), 422, "validation_error"
    )
    assert error["details"]["errors"][0]["loc"] == ["body", "title"]


async def test_unknown_fields_are_refused(client: httpx.AsyncClient) -> None:
    error = assert_error(
        await client.post("/v1/sessions", json={"config": {"modle": "openai:gpt-4o"}}),
        422,
        "validation_error",
    )
    assert error["details"]["errors"][0]["loc"] == ["body", "config", "modle"]


async def test_bad_entry_payload_names_the_path(client: httpx.AsyncClient) -> None:
    session = await new_session(client)
    body = {"entries": [{"kind": "message", "payload": {"role": "robot", "content": "hi"}}]}
    error = assert_error(
        await client.post(f"/v1/sessions/{session['id']}/entries", json=body),
        422,
        "validation_error",
    )
    assert error["details"]["errors"][0]["loc"][:5] == ["body", "entries", 0, "message", "payload"]


@pytest.mark.parametrize("declared", [True, False])
async def test_oversized_body_is_413(client: httpx.AsyncClient, declared: bool) -> None:
    payload = b'{"title": "' + b"x" * 1_100_000 + b'"}'
    if declared:
        response = await client.post(
            "/v1/sessions", content=payload, headers={"content-type": "application/json"}
        )
    else:  # chunked, no Content-Length: counted as it streams in

        async def chunks() -> Any:
            for i in range(0, len(payload), 65536):
                yield payload[i : i + 65536]

        response = await client.post(
            "/v1/sessions", content=chunks(), headers={"content-type": "application/json"}
        )
    assert_error(response, 413, "request_too_large")


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing"), 404, "not_found")
    assert_error(await client.put("/v1/sessions"), 405, "method_not_allowed")


async def test_malformed_ids_and_cursors(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/sessions/not-a-uuid"), 422, "validation_error")
    assert_error(
        await client.get("/v1/sessions", params={"cursor": "garbage"}), 422, "invalid_cursor"
    )


async def test_nul_characters_are_refused_not_500(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/sessions", json={"title": "a\u0000b"})
    assert response.status_code == 422


async def test_limits(client: httpx.AsyncClient) -> None:
    session = await new_session(client)
    assert_error(await client.get("/v1/sessions", params={"limit": 600}), 422, "limit_too_large")
    many = {"entries": [{"kind": "message", "payload": {"role": "user", "content": "x"}}] * 1001}
    assert_error(
        await client.post(f"/v1/sessions/{session['id']}/entries", json=many),
        422,
        "too_many_entries",
    )


@pytest.mark.parametrize(
    "body",
    [b'{"title": ', b'{"title": "\xff"}', b"\xfe\xff\x00{", b'{"title": "caf\xe9"}'],
    ids=["truncated", "invalid-utf8", "bad-bom", "latin1"],
)
async def test_an_unreadable_body_has_one_code(client: httpx.AsyncClient, body: bytes) -> None:
    response = await client.post(
        "/v1/sessions", content=body, headers={"content-type": "application/json"}
    )
    error = assert_error(response, 400, "invalid_json")
    assert error["message"] == "the request body is not valid JSON"


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/v1/sessions", "GET, POST"),
        ("POST", "/v1/sessions/{id}", "DELETE, GET, PATCH"),
        ("OPTIONS", "/v1/sessions/{id}/entries", "GET, POST"),
        ("POST", "/v1/memory/notes", "DELETE, GET, PATCH, PUT"),
        ("DELETE", "/v1/runs/{id}/cancel", "POST"),
    ],
)
async def test_405_allows_every_method_of_the_path(
    client: httpx.AsyncClient, method: str, path: str, allowed: str
) -> None:
    response = await client.request(method, path.format(id=uuid.uuid4()))
    assert_error(response, 405, "method_not_allowed")
    # HEAD comes with GET (Starlette serves it); the rest is what the OpenAPI document lists.
    listed = [m.strip() for m in response.headers["allow"].split(",")]
    assert [m for m in listed if m != "HEAD"] == allowed.split(", ")
    assert ("HEAD" in listed) == ("GET" in listed)
