"""Every SSE response ends: after the run's terminal event, or at once when the run is over and
nothing is left to send (204 for GETs, the run itself for a repeated ask), over a real uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import uuid
from typing import Any
from urllib.parse import urlsplit

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine
from sse_starlette import ServerSentEvent

from app.api.sse import frame
from app.eventlog import store as event_store
from app.eventlog.registry import EventType
from testkit.api import new_session
from testkit.sse_client import TERMINAL, Event, collect, read_to_end, until_closed
from testkit.upstream import FakeUpstream, Stall, Text
from tests.api.test_compaction import converse
from tests.e2e import Service

JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()


def json_nested(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3)


async def _finished_run(
    api: httpx.AsyncClient, upstream: FakeUpstream, **ask: Any
) -> tuple[str, str, list[Event]]:
    """A session and a run of it that has ended; the run's events, read from the ask's stream
    to the server's end of it."""
    sid = (await new_session(api))["id"]
    upstream.script(Text("done"))
    answered = await read_to_end(api, "POST", f"/v1/sessions/{sid}/ask", **ask)
    assert answered.status == 200 and answered.events[-1].type == "run.completed"
    assert [e.type for e in answered.events].count("run.completed") == 1
    return sid, str(answered.events[0].data["run_id"]), answered.events


async def test_resuming_a_finished_run_after_its_terminal_event_ends_at_once(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid, run_id, events = await _finished_run(api, upstream, json={"input": "q"})
    url, terminal = f"/v1/runs/{run_id}/events", events[-1].id
    seen_it_all: list[dict[str, Any]] = [
        {"headers": {"Last-Event-ID": str(terminal)}},
        {"headers": {"Last-Event-ID": str(terminal + 7)}},
        {"headers": {"Last-Event-ID": str(2**31)}},  # past any seq the database can hold
        {"params": {"starting_after": terminal}},
        {"params": {"starting_after": 2**31}},
    ]
    for resume in seen_it_all:
        ended = await read_to_end(api, "GET", url, **resume)
        assert (ended.status, ended.events) == (204, []), resume
    # What the client has not seen yet is replayed, through the terminal event; then the end.
    for resume in (
        {"headers": {"Last-Event-ID": str(terminal - 2)}},
        {"params": {"starting_after": terminal - 2}},
    ):
        rest = await read_to_end(api, "GET", url, **resume)
        assert (rest.status, rest.events) == (200, events[-2:]), resume
    whole = await read_to_end(api, "GET", url)
    assert (whole.status, whole.events) == (200, events)
    for not_a_seq in (b"\xb2", b"-1", b"3.0", b""):  # "²" (Latin-1) is a digit, not a seq
        ignored = await read_to_end(api, "GET", url, headers={"Last-Event-ID": not_a_seq})
        assert (ignored.status, ignored.events) == (200, events), not_a_seq
    joined = await read_to_end(
        api, "GET", f"/v1/sessions/{sid}/stream", headers={"Last-Event-ID": str(terminal)}
    )
    assert joined.status == 204  # no run in progress


async def test_a_resume_point_past_any_seq_is_refused_before_a_stream_starts(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """A Last-Event-ID or starting_after beyond 2**31 (one past the largest seq) is no seq: 422,
    whether the run is live or over, on both streams; never a stream that cannot resume."""
    sid = (await new_session(api))["id"]
    upstream.script(Text("first"), Stall(600), Text("never"))  # live until cancelled
    started = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go"}, until="message.delta"
    )
    run_id = started[0].data["run_id"]
    urls = (f"/v1/runs/{run_id}/events", f"/v1/sessions/{sid}/stream")
    too_far = ("99999999999999999999", str(2**31 + 1), "9" * 32)
    try:
        for url in urls:
            for value in too_far:
                for resume, where in (
                    ({"headers": {"Last-Event-ID": value}}, ["header", "last-event-id"]),
                    ({"params": {"starting_after": value}}, ["query", "starting_after"]),
                ):
                    refused = await read_to_end(api, "GET", url, **resume)
                    assert refused.status == 422 and refused.events == [], (url, resume)
                    error = json.loads(refused.body)["error"]
                    assert error["code"] == "validation_error", error
                    assert error["details"]["errors"][0]["loc"] == where, error
            # The largest accepted point is past every seq: the live run's stream, nothing in it
            # yet (the existing resume tests read such streams to their end).
            async with api.stream("GET", url, params={"starting_after": 2**31}) as beyond:
                assert beyond.status_code == 200
    finally:
        assert (await api.post(f"/v1/runs/{run_id}/cancel")).status_code == 200
    for url in urls[:1]:  # over now: still refused, not 204
        refused = await read_to_end(api, "GET", url, headers={"Last-Event-ID": too_far[0]})
        assert refused.status == 422


async def test_a_run_whose_events_are_gone_answers_at_once(
    api: httpx.AsyncClient, upstream: FakeUpstream, e2e_engine: AsyncEngine
) -> None:
    key = {"Idempotency-Key": f"gone-{uuid.uuid4()}"}
    sid, run_id, events = await _finished_run(api, upstream, json={"input": "q"}, headers=key)
    async with e2e_engine.begin() as conn:  # the retention window has passed for this run
        assert (await event_store.prune(conn, 0)).events >= len(events)
    url = f"/v1/runs/{run_id}/events"
    for resume in ({}, {"headers": {"Last-Event-ID": "1"}}, {"params": {"starting_after": 0}}):
        ended = await read_to_end(api, "GET", url, **resume)
        assert (ended.status, ended.events) == (204, []), resume
    # The same ask again (its Idempotency-Key): no stream to replay, so the run as it ended.
    again = await read_to_end(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "q"}, headers=key
    )
    assert again.status == 202
    run = json.loads(again.body)
    assert (run["id"], run["status"], run["result"]) == (run_id, "completed", "done")
    assert (await read_to_end(api, "GET", f"/v1/sessions/{sid}/stream")).status == 204


async def test_streams_of_a_live_run_end_when_it_ends(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Clients attached to a live run from any point, even one past its last event, are let go
    when it ends: with the events they had not seen, through the terminal one."""
    sid = (await new_session(api))["id"]
    # Stalled until cancelled (the stall only bounds a test that went wrong).
    upstream.script(Text("first"), Stall(600), Text("never"))
    started = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go"}, until="message.delta"
    )
    run_id, seen = started[0].data["run_id"], started[-1].id
    beyond = {"Last-Event-ID": str(seen + 1000)}
    attach: dict[str, tuple[str, dict[str, Any]]] = {
        "from the start": (f"/v1/runs/{run_id}/events", {}),
        "resumed": (f"/v1/runs/{run_id}/events", {"headers": {"Last-Event-ID": str(seen)}}),
        "resumed by query": (f"/v1/runs/{run_id}/events", {"params": {"starting_after": seen}}),
        "beyond its last event": (f"/v1/runs/{run_id}/events", {"headers": beyond}),
        "joined": (f"/v1/sessions/{sid}/stream", {}),
        "joined beyond its last event": (f"/v1/sessions/{sid}/stream", {"headers": beyond}),
    }
    async with contextlib.AsyncExitStack() as stack:
        streams = {}
        for name, (url, resume) in attach.items():
            streams[name] = await stack.enter_async_context(api.stream("GET", url, **resume))
            assert streams[name].status_code == 200, name  # the run is live: a stream
        assert (await api.post(f"/v1/runs/{run_id}/cancel")).status_code == 200
        received = {name: await until_closed(response) for name, response in streams.items()}
    whole = received["from the start"]
    assert whole[: len(started)] == started
    assert [e.id for e in whole] == list(range(1, len(whole) + 1))
    assert [e.type for e in whole if e.type in TERMINAL] == ["run.cancelled"] == [whole[-1].type]
    assert received["joined"] == whole
    assert received["resumed"] == received["resumed by query"] == whole[seen:]
    assert received["beyond its last event"] == received["joined beyond its last event"] == []
    # Over now: nothing is left to send to a client that has the terminal event.
    last = {"Last-Event-ID": str(whole[-1].id)}
    assert (await read_to_end(api, "GET", f"/v1/runs/{run_id}/events", headers=last)).status == 204


async def test_a_repeated_compaction_whose_events_are_gone_answers_with_its_run(
    api: httpx.AsyncClient, upstream: FakeUpstream, e2e_engine: AsyncEngine
) -> None:
    sid = (await new_session(api))["id"]
    await converse(api, upstream, sid, 3)
    upstream.script(Text("Three billing questions were asked."))
    key = {"Idempotency-Key": f"compact-{uuid.uuid4()}"}
    body = {"stream": True, "keep_last_turns": 1}
    url = f"/v1/sessions/{sid}/compact"
    streamed = await read_to_end(api, "POST", url, json=body, headers=key)
    assert streamed.status == 200 and streamed.events[-1].type == "run.completed"
    async with e2e_engine.begin() as conn:
        await event_store.prune(conn, 0)
    again = await read_to_end(api, "POST", url, json=body, headers=key)
    assert again.status == 202
    run = json.loads(again.body)
    assert (run["id"], run["kind"], run["status"]) == (
        streamed.events[0].data["run_id"],
        "compaction",
        "completed",
    )


def _raw_ask(url: str, key: str, session_id: str) -> socket.socket:
    """POST an ask with stream: true on a raw socket with a small receive buffer (so that a
    client that stops reading soon backs the server's writes up), headers sent, nothing read."""
    parts = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((parts.hostname, parts.port))
    body = json.dumps({"input": "go", "stream": True}).encode()
    sock.sendall(
        (
            f"POST /v1/sessions/{session_id}/ask HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        + body
    )
    return sock


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(60)  # a failure bound: the server closes the connection after the stream
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks)


def _sse_events(response: bytes) -> list[Event]:
    """The events of a raw HTTP/1.1 response with a chunked text/event-stream body."""
    head, _, rest = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    body = bytearray()
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2 :]
    out = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":")
        )
        if fields:
            out.append(Event(int(fields["id"]), fields["event"], json.loads(fields["data"])))
    return out


async def test_a_client_that_stops_reading_does_not_hold_up_others_and_misses_nothing(
    api: httpx.AsyncClient, upstream: FakeUpstream, service: Service
) -> None:
    """A raw socket client stops reading its stream while the run writes far more than its
    buffers hold; another stream meanwhile runs to its end. Read again, the stalled stream has
    every event once, in order, through its terminal one."""
    stalled_sid = (await new_session(api))["id"]
    other_sid = (await new_session(api))["id"]
    words = [f"{i:04d}" + "x" * 2000 + " " for i in range(400)]  # ~800 KB, many ticks
    upstream.script(*(Text(w) for w in words), token_delay=0.001)
    key = api.headers["Authorization"].removeprefix("Bearer ")
    sock = _raw_ask(service.url, key, stalled_sid)
    try:
        for _ in range(600):  # its run took the long answer (a failure bound, not a measure)
            if upstream.pending == 0:
                break
            await asyncio.sleep(0.05)
        upstream.script(Text("meanwhile"))
        other = await collect(api, "POST", f"/v1/sessions/{other_sid}/ask", json={"input": "q"})
        assert other[-1].type == "run.completed"
        said = "".join(e.data["text"] for e in other if e.type == "message.delta")
        assert said == "meanwhile"
        for _ in range(600):  # the stalled run ends too, unread
            if (await api.get(f"/v1/sessions/{stalled_sid}")).json()["status"] != "active":
                break
            await asyncio.sleep(0.1)
        events = _sse_events(await asyncio.to_thread(_read_all, sock))
    finally:
        sock.close()
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events].count("run.completed") == 1
    assert events[-1].type == "run.completed"
    text = "".join(e.data["text"] for e in events if e.type == "message.delta")
    assert text == "".join(words)


@settings(max_examples=300, deadline=None)
@given(
    seq=st.integers(min_value=1, max_value=event_store.MAX_EVENT_SEQ),
    kind=st.sampled_from([str(t) for t in EventType]),
    data=st.dictionaries(st.text(), st.recursive(JSON_LEAVES, json_nested), max_size=5),
)
def test_a_frame_is_the_bytes_sse_starlette_would_send(
    seq: int, kind: str, data: dict[str, Any]
) -> None:
    """Event streams encode their frames themselves (once per event, several in one write):
    byte for byte what ServerSentEvent encodes, whatever the payload holds (newlines, line
    and paragraph separators, NULs, any Unicode)."""
    row = {"run_id": str(uuid.uuid4()), "seq": seq, "type": kind, "data": data}
    expected = ServerSentEvent(
        data=json.dumps(data, separators=(",", ":")), event=kind, id=str(seq)
    ).encode()
    assert frame(row) == expected
