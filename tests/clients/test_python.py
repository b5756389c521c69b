"""The generated Python client (`make client-python`: openapi-python-client, plus the streaming
helper) drives a whole conversation against a live `threadline serve`: create, ask and stream,
disconnect and resume, fork, compact, history, search."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from testkit.api import new_session
from testkit.proxy import CuttingProxy
from testkit.upstream import FakeUpstream, Hold, Text
from tests.e2e import Service

ROOT = Path(__file__).resolve().parents[2]
GENERATE = ROOT / "clients" / "python" / "generate.py"


@pytest.fixture(scope="module")
def threadline_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The client as `make client-python` generates it, importable as `threadline_client`."""
    root = tmp_path_factory.mktemp("python-client")
    spec = importlib.util.spec_from_file_location("generate_client", GENERATE)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    generator.generate(root / "threadline_client")
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module("threadline_client")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.split(".")[0] == "threadline_client"]:
            del sys.modules[name]


def types(events: list[Any]) -> list[str]:
    return [e.event for e in events]


def conversation(tc: ModuleType, url: str, key: str, upstream: FakeUpstream) -> None:
    def load(name: str) -> Any:
        return importlib.import_module(f"threadline_client.{name}")

    m, streaming = load("models"), load("streaming")
    create_session = load("api.sessions.create_session")
    fork_session = load("api.sessions.fork_session")
    list_entries = load("api.entries.list_entries")
    search_history = load("api.entries.search_history")
    compact_session = load("api.context.compact_session")
    get_run = load("api.runs.get_run")

    client = tc.AuthenticatedClient(base_url=url, token=key, raise_on_unexpected_status=True)

    # create
    session = create_session.sync(client=client, body=m.SessionCreate(title="generated client"))
    assert isinstance(session, m.Session) and session.title == "generated client"
    sid = session.id

    # ask and stream: typed events, to the terminal one
    upstream.script(Text("Oslo is "), Text("rainy."))
    events = list(streaming.ask(client, sid, {"input": "Weather in Oslo?"}))
    assert isinstance(events[0], m.RunCreatedEvent)
    assert isinstance(events[-1], m.RunCompletedEvent)
    assert events[-1].data.text == "Oslo is rainy."
    deltas = [e for e in events if isinstance(e, m.MessageDeltaEvent)]
    assert "".join(d.data.text for d in deltas) == "Oslo is rainy."

    # disconnect mid-answer (leave the loop), then resume after the last event seen
    release = threading.Event()
    upstream.script(Text("Bring "), Hold(release), Text("an umbrella."))
    seen = []
    for event in streaming.ask(client, sid, {"input": "And tomorrow?"}):
        seen.append(event)
        if isinstance(event, m.MessageDeltaEvent):
            break  # the connection closes; the run goes on
    run_id = seen[0].data.run_id
    release.set()
    rest = list(streaming.run_events(client, run_id, after=int(seen[-1].id)))
    assert [int(e.id) for e in seen + rest] == list(range(1, len(seen) + len(rest) + 1))
    assert isinstance(rest[-1], m.RunCompletedEvent)
    assert rest[-1].data.text == "Bring an umbrella."
    # read again from the start: the same run, event for event
    again = list(streaming.run_events(client, run_id))
    assert [e.to_dict() for e in again] == [e.to_dict() for e in seen + rest]

    # fork at the first answer
    fork = fork_session.sync(sid, client=client, body=m.ForkRequest(at_seq=2))
    assert isinstance(fork, m.Session) and fork.parent_id == sid and fork.fork_seq == 2

    # compact without streaming: 202 with its run, then wait for it
    upstream.script(Text("The user asked about Oslo's weather."))
    queued = compact_session.sync(
        sid, client=client, body=m.CompactRequest(stream=False, keep_last_turns=1)
    )
    assert isinstance(queued, m.Run) and queued.kind == m.RunKind.COMPACTION
    done = get_run.sync(queued.id, client=client, wait=True)
    assert isinstance(done, m.Run) and done.status == m.RunStatus.COMPLETED, done

    # history
    page = list_entries.sync(sid, client=client, limit=100)
    assert isinstance(page, m.EntryPage)
    kinds = [e.kind for e in page.data]
    assert m.EntryKind.SUMMARY in kinds and kinds.count(m.EntryKind.MESSAGE) == 4

    # search
    found = search_history.sync(sid, client=client, q="umbrella")
    assert isinstance(found, m.SearchResults)
    assert any("umbrella" in hit.excerpt for hit in found.data)


async def test_a_conversation_with_the_generated_python_client(
    threadline_client: ModuleType,
    api: httpx.AsyncClient,
    service: Service,
    upstream: FakeUpstream,
) -> None:
    key = api.headers["Authorization"].removeprefix("Bearer ")
    await asyncio.to_thread(conversation, threadline_client, service.url, key, upstream)


def test_heartbeats_are_not_events(threadline_client: ModuleType) -> None:
    """httpx-sse reads the blank line after a `: ping` comment as an event without data (it
    keeps the last id): the helper skips it rather than failing to parse it (seen at random
    in the conversation above, whenever a heartbeat fell inside a stream)."""
    streaming = importlib.import_module("threadline_client.streaming")
    m = importlib.import_module("threadline_client.models")
    completed = (
        '{"run_id":"r","status":"completed","model":"openai:gpt-4o-mini","text":"Hi",'
        '"usage":null,"finish_reason":"stop"}'
    )
    body = (
        'id: 1\nevent: message.delta\ndata: {"text":"Hi"}\n\n'
        ": ping\n\n"
        f"id: 2\nevent: run.completed\ndata: {completed}\n\n"
    )

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.headers["last-event-id"] == "0"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    client = threadline_client.Client(base_url="http://threadline.test").set_httpx_client(
        httpx.Client(base_url="http://threadline.test", transport=httpx.MockTransport(answer))
    )
    events = list(streaming.run_events(client, "r"))
    assert [type(e) for e in events] == [m.MessageDeltaEvent, m.RunCompletedEvent]


async def test_the_readme_example_runs_as_written(
    threadline_client: ModuleType,
    api: httpx.AsyncClient,
    service: Service,
    upstream: FakeUpstream,
) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Python client") :]
    start = section.index("```python\n") + len("```python\n")
    example = section[start : section.index("```\n", start)]
    upstream.script(Text("Rain, "), Text("then sun."))
    package_root = Path(str(threadline_client.__file__)).parents[1]
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", example],
        env={
            **os.environ,
            "API": service.url,
            "KEY": api.headers["Authorization"].removeprefix("Bearer "),
            "PYTHONPATH": str(package_root),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["Rain, then sun.", "[stop]"], result.stdout
    assert lines[2].endswith(" events")


def dropped_and_resumed(tc: ModuleType, url: str, key: str, upstream: FakeUpstream) -> None:
    m = importlib.import_module("threadline_client.models")
    streaming = importlib.import_module("threadline_client.streaming")
    release = threading.Event()
    proxy = CuttingProxy(url, b"event: message.delta", on_cut=release.set)
    try:
        client = tc.AuthenticatedClient(base_url=proxy.url, token=key)
        sid = client.get_httpx_client().post("/v1/sessions", json={}).json()["id"]
        upstream.script(Text("Bring "), Hold(release), Text("an umbrella."))
        events = list(streaming.ask(client, sid, {"input": "Rain tomorrow?"}))
    finally:
        proxy.close()
    assert proxy.cut.is_set() and proxy.connections >= 2  # the cut one, and the resumption
    assert [int(e.id) for e in events] == list(range(1, len(events) + 1))  # each event once
    assert isinstance(events[-1], m.RunCompletedEvent)
    assert events[-1].data.text == "Bring an umbrella."


async def test_a_dropped_stream_is_resumed_by_the_helper(
    threadline_client: ModuleType,
    api: httpx.AsyncClient,
    service: Service,
    upstream: FakeUpstream,
) -> None:
    """The connection of an ask is cut after its first delta: the helper goes on with the
    run's events after the last one it got (Last-Event-ID), and the caller sees one stream."""
    key = api.headers["Authorization"].removeprefix("Bearer ")
    await asyncio.to_thread(dropped_and_resumed, threadline_client, service.url, key, upstream)


async def test_the_asyncio_helpers(
    threadline_client: ModuleType,
    api: httpx.AsyncClient,
    service: Service,
    upstream: FakeUpstream,
) -> None:
    """aask and arun_events: a stream left early and resumed; a refused ask raises."""
    m = importlib.import_module("threadline_client.models")
    streaming = importlib.import_module("threadline_client.streaming")
    key = api.headers["Authorization"].removeprefix("Bearer ")
    client = threadline_client.AuthenticatedClient(base_url=service.url, token=key)
    sid = (await new_session(api))["id"]
    release = threading.Event()
    upstream.script(Text("Bring "), Hold(release), Text("an umbrella."))
    seen = []
    try:
        async with contextlib.aclosing(streaming.aask(client, sid, {"input": "Rain?"})) as events:
            async for event in events:
                seen.append(event)
                if isinstance(event, m.MessageDeltaEvent):
                    break  # aclosing closes the connection now, not when collected
        # the run is still going: another ask is refused (409 session_busy) with its error
        with pytest.raises(streaming.StreamRefused) as refused:
            async for _ in streaming.aask(client, sid, {"input": "Hello?"}):
                pass
        assert refused.value.status_code == 409
        assert refused.value.error["code"] == "session_busy"
    finally:
        release.set()
    run_id = seen[0].data.run_id
    rest = [e async for e in streaming.arun_events(client, run_id, after=int(seen[-1].id))]
    assert [int(e.id) for e in seen + rest] == list(range(1, len(seen) + len(rest) + 1))
    assert isinstance(rest[-1], m.RunCompletedEvent)
    assert rest[-1].data.text == "Bring an umbrella."
    await client.get_async_httpx_client().aclose()
