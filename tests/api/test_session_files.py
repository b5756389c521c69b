"""Session files: export → import → export round trips, hostile files, tenants."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.services.keys import create_key
from testkit.api import append, history, message, new_session
from tests.api.test_projection import _build, journal_steps
from tests.images import data_url, png

NDJSON = {"Content-Type": "application/x-ndjson"}
THOUGHT = {"type": "thinking", "thinking": "the user wants brevity", "signature": "c2lnbmF0dXJl"}
SEEN = [
    {
        "kind": "message",
        "payload": {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "url": data_url("image/png", png(2, 2))},
            ],
        },
    },
    {
        "kind": "message",
        "payload": {
            "role": "assistant",
            "content": [
                THOUGHT,
                {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
                {"type": "text", "text": "A tiny grey square."},
            ],
        },
    },
]


def lines(body: bytes) -> list[dict[str, Any]]:
    assert body.endswith(b"\n")
    return [json.loads(line) for line in body.split(b"\n")[:-1]]


async def export(api: httpx.AsyncClient, sid: str, **params: Any) -> bytes:
    response = await api.get(f"/v1/sessions/{sid}/export", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"].endswith(f'session-{sid}.jsonl"')
    return response.content


async def import_file(api: httpx.AsyncClient, body: Any) -> httpx.Response:
    return await api.post("/v1/sessions/import", content=body, headers=NDJSON)


def file_of(*entries: dict[str, Any], version: int = 1, end: int | None = None) -> bytes:
    """A session file holding `entries` (seq, id and created_at given where missing)."""
    header = {
        "type": "header",
        "format": "threadline.session",
        "version": version,
        "session": {"title": "t", "metadata": {}, "config": {}},
    }
    out = [header]
    for seq, entry in enumerate(entries, 1):
        out.append(
            {
                "type": "entry",
                "seq": seq,
                "id": f"e{seq}",
                "refs": {},
                "created_at": "2026-11-28T12:00:00+00:00",
                **entry,
            }
        )
    out.append({"type": "end", "entries": len(entries) if end is None else end})
    return b"".join(json.dumps(line).encode() + b"\n" for line in out)


@settings(max_examples=10, suppress_health_check=list(HealthCheck), derandomize=True)
@given(steps=journal_steps(), seen=st.booleans(), budget=st.sampled_from([1500, 6000]))
async def test_export_import_export_gives_the_same_entries_and_projection(
    client: httpx.AsyncClient, steps: list[tuple[str, Any]], seen: bool, budget: int
) -> None:
    """Any journal (tool groups, interrupted calls, summaries, rollbacks, forks, images,
    thinking): the imported session exports the same entries, byte for byte, and projects the
    same request for the same ask."""
    api = client
    policy = {"max_input_tokens": budget, "reserve_output_tokens": 200, "window_chunk_tokens": 400}
    config = {"model": "openai:gpt-4o", "system_prompt": "Be brief.", "context_policy": policy}
    first = await new_session(api, title="trip", metadata={"k": "v"}, config=config)
    if seen:
        assert (await append(api, first["id"], *SEEN)).status_code == 201
    original = (await _build(api, first["id"], steps)).sid
    exported = await export(api, original)

    imported = await import_file(api, exported)
    assert imported.status_code == 201, imported.text
    copy = imported.json()
    assert copy["id"] != original and copy["parent_id"] is None
    assert copy["rev"] == (await api.get(f"/v1/sessions/{original}")).json()["rev"]
    again = await export(api, copy["id"])

    before, after = lines(exported), lines(again)
    assert before[1:] == after[1:]  # every entry (ids, seqs, payloads, refs, counts, times)
    assert exported.split(b"\n", 1)[1] == again.split(b"\n", 1)[1]  # byte for byte
    head, copied_head = before[0]["session"], after[0]["session"]
    assert copied_head == {**head, "fork_origin": None}
    assert before[-1] == {"type": "end", "entries": copy["rev"]}

    ask = {"pending": [message("and now?")], "format": "openai"}
    dry = await api.post(f"/v1/sessions/{original}/projection", json=ask)
    dry_copy = await api.post(f"/v1/sessions/{copy['id']}/projection", json=ask)
    assert dry.status_code == dry_copy.status_code
    assert dry.content == dry_copy.content


async def test_a_forks_file_holds_its_inherited_prefix(client: httpx.AsyncClient) -> None:
    api = client
    parent = (await new_session(api))["id"]
    texts = [message(f"m{i}") for i in range(4)]
    assert (await append(api, parent, *texts)).status_code == 201
    fork = (await api.post(f"/v1/sessions/{parent}/fork", json={"at_seq": 2})).json()
    assert (await append(api, fork["id"], message("own"))).status_code == 201
    exported = lines(await export(api, fork["id"]))
    assert exported[0]["session"]["fork_origin"] == {"session_id": parent, "fork_seq": 2}
    entries = [line for line in exported if line["type"] == "entry"]
    assert [e["seq"] for e in entries] == [1, 2, 3]
    assert [e["payload"]["content"] for e in entries] == ["m0", "m1", "own"]
    # The parent's own entries past the fork point are not the fork's.
    imported = await import_file(api, await export(api, fork["id"]))
    assert imported.status_code == 201, imported.text
    got = await history(api, imported.json()["id"])
    assert [e["payload"]["content"] for e in got] == ["m0", "m1", "own"]


async def test_a_file_from_an_earlier_version_with_a_token_total_imports(
    client: httpx.AsyncClient,
) -> None:
    """Earlier versions wrote the thread's running token sum in the header (their windowing's
    coordinate): it is read and ignored, and an export no longer writes it."""
    older = json.loads(file_of(message("hi")).split(b"\n", 1)[0])
    older["session"]["token_total"] = 12_345
    body = json.dumps(older).encode() + b"\n" + file_of(message("hi")).split(b"\n", 1)[1]
    imported = await import_file(client, body)
    assert imported.status_code == 201, imported.text
    exported = lines(await export(client, imported.json()["id"]))
    assert "token_total" not in exported[0]["session"]


async def test_memory_travels_when_asked_and_never_overwrites(
    client: httpx.AsyncClient, make_client: Any, new_key: Any
) -> None:
    api = client
    sid = (await new_session(api, config={"memory_namespace": "notes"}))["id"]
    assert (await api.put("/v1/memory/notes", json={"content": "likes tea\n"})).status_code in (
        200,
        201,
    )
    assert (await append(api, sid, message("hi"))).status_code == 201
    plain = lines(await export(api, sid))
    assert [line["type"] for line in plain] == ["header", "entry", "end"]
    with_memory = await export(api, sid, memory="true")
    assert lines(with_memory)[-2] == {
        "type": "memory",
        "namespace": "notes",
        "content": "likes tea\n",
    }

    # Another tenant receives it; the same content again is fine; other content is refused.
    other = make_client(await new_key())
    imported = await other.post("/v1/sessions/import", content=with_memory, headers=NDJSON)
    assert imported.status_code == 201, imported.text
    assert (await other.get("/v1/memory/notes")).json()["content"] == "likes tea\n"
    assert (await import_file(api, with_memory)).status_code == 201
    await api.put("/v1/memory/notes", json={"content": "likes coffee\n"})
    refused = await import_file(api, with_memory)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "memory_conflict"


async def _sessions(api: httpx.AsyncClient) -> list[str]:
    return [s["id"] for s in (await api.get("/v1/sessions")).json()["data"]]


CALL = {
    "kind": "tool_call",
    "payload": {"name": "f", "arguments": {}},
    "refs": {"tool_call_id": "t1"},
}
RESULT = {"kind": "tool_result", "payload": {"content": "ok"}, "refs": {"tool_call_id": "t1"}}
HELLO = {"kind": "message", "payload": {"role": "user", "content": "hello"}}
GOOD = file_of(HELLO, CALL, RESULT)


def _without_end(body: bytes) -> bytes:
    return body[: body.rstrip(b"\n").rfind(b"\n") + 1]


def _with_entry(body: bytes, index: int, **changes: Any) -> bytes:
    parsed = lines(body)
    parsed[index] = {**parsed[index], **changes}
    return b"".join(json.dumps(line).encode() + b"\n" for line in parsed)


HOSTILE: list[tuple[str, bytes, int, str]] = [
    ("truncated at a line", _without_end(GOOD), 422, "truncated"),
    ("truncated mid-line", GOOD[: len(GOOD) - 45], 422, "truncated"),
    ("wrong version", file_of(HELLO, version=2), 422, "unsupported_version"),
    ("no header", GOOD.split(b"\n", 1)[1], 422, "not_a_session_file"),
    ("duplicate seqs", _with_entry(GOOD, 2, seq=1), 422, "seq_not_dense"),
    ("a seq skipped", _with_entry(GOOD, 3, seq=4), 422, "seq_not_dense"),
    ("duplicate ids", _with_entry(GOOD, 2, id="e1"), 422, "invalid_entries"),
    (
        "a range past the end",
        file_of(HELLO, {"kind": "rollback", "payload": {"from_seq": 1, "to_seq": 2}}),
        422,
        "invalid_entries",
    ),
    (
        "another kind than declared",
        file_of(HELLO, {"kind": "tool_call", "payload": {"role": "user", "content": "hi"}}),
        422,
        "invalid_entries",
    ),
    ("an unknown kind", file_of({"kind": "note", "payload": {}}), 422, "invalid_entry_line"),
    ("invalid JSON", GOOD.replace(b'"hello"', b"'hello'"), 400, "invalid_json"),
    ("a tool result without a call", file_of(HELLO, RESULT), 422, "tool_result_without_call"),
    ("a count that lies", file_of(HELLO, end=2), 422, "entry_count_mismatch"),
    ("lines after the end", GOOD + GOOD.split(b"\n")[1] + b"\n", 422, "misplaced_line"),
    ("a blank line", GOOD.replace(b"\n", b"\n\n", 1), 400, "blank_line"),
    (
        "content a provider refuses",
        file_of({"kind": "message", "payload": {"role": "user", "content": []}}),
        422,
        "invalid_content",
    ),
    ("a lone surrogate", GOOD.replace(b"hello", b"\\ud800"), 400, "invalid_unicode"),
    ("empty", b"", 422, "empty_file"),
]


async def test_hostile_files_are_refused_and_write_nothing(client: httpx.AsyncClient) -> None:
    api = client
    assert (await import_file(api, GOOD)).status_code == 201  # the file they all start from
    before = await _sessions(api)
    for name, body, status, code in HOSTILE:
        response = await import_file(api, body)
        assert response.status_code == status, (name, response.text)
        error = response.json()["error"]
        assert error["code"] == code, (name, error)
        assert error["message"], name
        assert await _sessions(api) == before, name


async def test_errors_name_the_line(client: httpx.AsyncClient) -> None:
    api = client
    response = await import_file(api, file_of(HELLO, HELLO, RESULT))
    assert response.json()["error"]["details"]["line"] == 4
    bad = file_of(
        HELLO, {"kind": "summary", "payload": {"from_seq": 1, "to_seq": 9, "content": "s"}}
    )
    errors = (await import_file(api, bad)).json()["error"]["details"]["errors"]
    assert errors[0]["line"] == 3 and errors[0]["loc"] == ["payload", "to_seq"]


async def test_a_gigabyte_of_whitespace_is_refused_without_reading_it(
    client: httpx.AsyncClient,
) -> None:
    """The upload streams: a line is bounded, so the server stops reading long before 1 GB."""
    api = client
    sent = 0

    async def spaces(chunk: bytes) -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(1024):  # 1024 chunks of 1 MiB
            sent += len(chunk)
            yield chunk

    for chunk, status, code in [
        (b" " * 2**20, 413, "line_too_long"),
        (b"\n" * 2**20, 400, "blank_line"),
    ]:
        sent = 0
        response = await import_file(api, spaces(chunk))
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code
        assert sent <= 17 * 2**20  # a line's bound and a chunk: not the gigabyte
    assert await _sessions(api) == []


async def test_only_json_lines_are_read(client: httpx.AsyncClient) -> None:
    api = client
    response = await api.post(
        "/v1/sessions/import", content=GOOD, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    jsonl = await api.post(
        "/v1/sessions/import", content=GOOD, headers={"Content-Type": "application/jsonl"}
    )
    assert jsonl.status_code == 201
    bare = await api.post("/v1/sessions/import", content=b"")  # no type: bytes; none here
    assert bare.status_code == 422 and bare.json()["error"]["code"] == "empty_file"


async def test_tenants_cannot_export_others_sessions(
    client: httpx.AsyncClient, make_client: Any, new_key: Any
) -> None:
    sid = (await new_session(client))["id"]
    assert (await append(client, sid, message("secret"))).status_code == 201
    other = make_client(await new_key())
    response = await other.get(f"/v1/sessions/{sid}/export")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"
    # What one imports is its own: the other tenant does not see it.
    imported = await client.post(
        "/v1/sessions/import", content=await _export_in(client, sid), headers=NDJSON
    )
    assert imported.status_code == 201
    assert (await other.get(f"/v1/sessions/{imported.json()['id']}")).status_code == 404
    assert (await other.get("/v1/sessions")).json()["data"] == []


async def _export_in(client: httpx.AsyncClient, sid: str) -> bytes:
    response = await client.get(f"/v1/sessions/{sid}/export")
    assert response.status_code == 200
    return response.content


async def test_a_read_only_key_exports_but_cannot_import(make_client: Any, engine: Any) -> None:
    tenant = f"tenant-{uuid.uuid4()}"
    client = make_client(await create_key(engine, tenant))
    sid = (await new_session(client))["id"]
    reader = make_client(await create_key(engine, tenant, read_only=True))
    body = (await reader.get(f"/v1/sessions/{sid}/export")).content
    refused = await reader.post("/v1/sessions/import", content=body, headers=NDJSON)
    assert refused.status_code == 403


async def test_a_session_with_real_runs_round_trips(api: httpx.AsyncClient, upstream: Any) -> None:
    """Entries runs wrote (run_start, usage, run_end, ids of the form run:<id>:...) import as
    they are, and the copy projects the same request."""
    from testkit.upstream import Text

    sid = (await new_session(api, config={"model": "openai:gpt-4o-mini"}))["id"]
    for question in ("first?", "second?"):
        upstream.script(Text(f"answer to {question}"))
        asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": question, "stream": False})
        assert asked.status_code == 202, asked.text
        run = await api.get(
            f"/v1/runs/{asked.json()['id']}", params={"wait": "true", "timeout": 30}
        )
        assert run.json()["status"] == "completed", run.text
    exported = await export(api, sid)
    kinds = {line["kind"] for line in lines(exported) if line["type"] == "entry"}
    assert {"run_start", "run_end", "message"} <= kinds
    imported = await import_file(api, exported)
    assert imported.status_code == 201, imported.text
    copy = imported.json()["id"]
    assert exported.split(b"\n", 1)[1] == (await export(api, copy)).split(b"\n", 1)[1]
    ask = {"pending": [message("third?")], "format": "openai"}
    dry = await api.post(f"/v1/sessions/{sid}/projection", json=ask)
    dry_copy = await api.post(f"/v1/sessions/{copy}/projection", json=ask)
    assert dry.status_code == 200 and dry.content == dry_copy.content
