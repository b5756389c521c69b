"""Request bodies are exactly as strict as the OpenAPI document says: no more, no less."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.core.entries import MAX_ENTRY_SEQ
from testkit.api import append, append_texts, message, new_session
from tests.api.test_errors import assert_error

TOOL_CALL = {
    "kind": "tool_call",
    "payload": {"name": "lookup", "arguments": {}},
    "refs": {"tool_call_id": "t1"},
}


async def test_a_boolean_is_not_a_seq(client: httpx.AsyncClient) -> None:
    session = await new_session(client)
    await append_texts(client, session["id"], "one", "two")
    response = await client.post(f"/v1/sessions/{session['id']}/fork", json={"at_seq": False})
    error = assert_error(response, 422, "validation_error")
    assert error["details"]["errors"][0]["loc"] == ["body", "at_seq"]
    listed = await client.get("/v1/sessions")
    assert len(listed.json()["data"]) == 1, "no fork was made"


# (path under the session, body, where the wrong type is)
WRONG_TYPES: list[tuple[str, dict[str, Any], list[Any]]] = [
    ("/fork", {"at_seq": True}, ["body", "at_seq"]),
    ("/entries", {"entries": [message("x")], "expected_rev": False}, ["body", "expected_rev"]),
    (
        "/entries",
        {
            "entries": [
                {"kind": "summary", "payload": {"from_seq": 1, "to_seq": False, "content": "s"}}
            ]
        },
        ["body", "entries", 0, "summary", "payload", "to_seq"],
    ),
    (
        "/entries",
        {"entries": [{"kind": "rollback", "payload": {"from_seq": True, "to_seq": 1}}]},
        ["body", "entries", 0, "rollback", "payload", "from_seq"],
    ),
    (
        "/entries",
        {"entries": [{**TOOL_CALL, "refs": {"tool_call_id": "t1", "iteration": True}}]},
        ["body", "entries", 0, "tool_call", "refs", "iteration"],
    ),
    (
        "/entries",
        {
            "entries": [
                TOOL_CALL,
                {
                    "kind": "tool_result",
                    "payload": {"content": "ok", "is_error": 1},
                    "refs": {"tool_call_id": "t1"},
                },
            ]
        },
        ["body", "entries", 1, "tool_result", "payload", "is_error"],
    ),
    ("/compact", {"keep_last_turns": False}, ["body", "keep_last_turns"]),
    ("/compact", {"stream": 0}, ["body", "stream"]),
    ("/ask", {"input": "hi", "stream": 0}, ["body", "stream"]),
    (
        "/ask",
        {"input": "hi", "max_output_tokens": True, "stream": False},
        ["body", "max_output_tokens"],
    ),
    ("/ask", {"input": "hi", "temperature": False, "stream": False}, ["body", "temperature"]),
    (
        "/ask",
        {"input": "hi", "run_policy": {"max_iterations": True}, "stream": False},
        ["body", "run_policy", "max_iterations"],
    ),
    (
        "/projection",
        {"policy": {"window_chunk_tokens": False}},
        ["body", "policy", "window_chunk_tokens"],
    ),
    ("/projection", {"policy": {"keep_last_turns": "3"}}, ["body", "policy", "keep_last_turns"]),
]


# Asks say stream: false so that, where the server wrongly accepts them, the test fails at once
# instead of following a stream no worker will end.
@pytest.mark.parametrize(("path", "body", "loc"), WRONG_TYPES)
async def test_booleans_and_integers_do_not_stand_in_for_each_other(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], loc: list[Any]
) -> None:
    session = await new_session(client)
    await append_texts(client, session["id"], "one", "two")
    response = await client.post(f"/v1/sessions/{session['id']}{path}", json=body)
    error = assert_error(response, 422, "validation_error")
    assert [e["loc"] for e in error["details"]["errors"]] == [loc]
    after = await client.get(f"/v1/sessions/{session['id']}")
    assert after.json()["rev"] == 2, "nothing was written"


async def test_session_config_types_are_strict(client: httpx.AsyncClient) -> None:
    policy = {"context_policy": {"max_input_tokens": True}}
    created = await client.post("/v1/sessions", json={"config": policy})
    error = assert_error(created, 422, "validation_error")
    assert error["details"]["errors"][0]["loc"] == [
        "body",
        "config",
        "context_policy",
        "max_input_tokens",
    ]
    tool = {"name": "t", "timeout_seconds": True}
    created = await client.post("/v1/sessions", json={"config": {"tools": [tool]}})
    assert_error(created, 422, "validation_error")


async def test_memory_booleans_are_strict(client: httpx.AsyncClient) -> None:
    await client.put("/v1/memory/notes", json={"content": "a a"})
    body = {"old_string": "a", "new_string": "b", "replace_all": 1}
    error = assert_error(await client.patch("/v1/memory/notes", json=body), 422, "validation_error")
    assert error["details"]["errors"][0]["loc"] == ["body", "replace_all"]
    assert (await client.get("/v1/memory/notes")).json()["content"] == "a a"


async def test_what_strict_still_accepts(client: httpx.AsyncClient) -> None:
    """Integers are numbers, JSON arrays are the policy's lists: strictness refuses only what
    the document refuses."""
    policy = {"compress_threshold": 1, "estimate_margin": 0, "include_kinds": ["message"]}
    session = await new_session(client, config={"context_policy": policy})
    await append_texts(client, session["id"], "one")
    projected = await client.post(
        f"/v1/sessions/{session['id']}/projection",
        json={"policy": {"keep_last_turns": 1, "include_kinds": ["message", "summary"]}},
    )
    assert projected.status_code == 200, projected.text
    forked = await client.post(f"/v1/sessions/{session['id']}/fork", json={"at_seq": 0})
    assert forked.status_code == 201 and forked.json()["fork_seq"] == 0


async def test_a_tool_result_may_be_null(client: httpx.AsyncClient) -> None:
    session = await new_session(client)
    result = {"kind": "tool_result", "payload": {"content": None}, "refs": {"tool_call_id": "t1"}}
    response = await append(client, session["id"], TOOL_CALL, {**result, "id": "r1"})
    assert response.status_code == 201, response.text
    assert response.json()["entries"][1]["payload"].get("content") is None
    # The same append again is a replay of the same entry: null and absent are one canonical form.
    replayed = await append(client, session["id"], {**result, "id": "r1"})
    assert replayed.status_code == 200 and replayed.json()["replayed"], replayed.text
    projected = await client.post(
        f"/v1/sessions/{session['id']}/projection", json={"format": "openai"}
    )
    assert projected.status_code == 200, projected.text
    tool_message = projected.json()["request"]["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == "t1"


async def test_the_largest_seq_is_what_the_document_says(client: httpx.AsyncClient) -> None:
    session = await new_session(client)
    at_max = await client.post(f"/v1/sessions/{session['id']}/fork", json={"at_seq": MAX_ENTRY_SEQ})
    assert_error(at_max, 422, "fork_seq_out_of_range")
    over = await client.post(
        f"/v1/sessions/{session['id']}/fork", json={"at_seq": MAX_ENTRY_SEQ + 1}
    )
    assert_error(over, 422, "validation_error")
    # Every JSON client reads the bound exactly (a double holds it), so it is the one enforced.
    assert float(MAX_ENTRY_SEQ) == MAX_ENTRY_SEQ and float(MAX_ENTRY_SEQ + 1) != MAX_ENTRY_SEQ
