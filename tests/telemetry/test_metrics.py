"""Each metric moves when it should, scraped from a live service (real uvicorn, the real SDKs
against the fake upstream) and parsed with prometheus_client's parser.

The served app runs in this process, whose metrics other tests move too: each test compares
the scrapes before and after what it does."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from app.config import Settings
from app.db.engine import create_engine
from app.main import create_app
from app.services.keys import create_key
from testkit.api import new_session
from testkit.metrics import Samples, ascrape, scrape
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import events, streamed_ask
from testkit.upstream import Fail, FakeUpstream, Hold, Text, Usage
from tests.e2e import create_database
from tests.telemetry.conftest import METRICS_TOKEN, Deployment

MODEL = {"provider": "openai", "model": "gpt-4o-mini"}


async def eventually(
    client: httpx.AsyncClient, holds: Callable[[Samples], bool], url: str = ""
) -> Samples:
    """Scrape until `holds` (the worker counts a run's end just after its terminal event)."""
    deadline = time.monotonic() + 60
    while True:
        samples = await ascrape(client, url)
        if holds(samples):
            return samples
        assert time.monotonic() < deadline, samples.text
        await asyncio.sleep(0.05)


async def test_an_ask_moves_asks_runs_latencies_tokens_and_cost(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    before = await ascrape(api)
    upstream.script(Text("Hel"), Text("lo"), Usage(1000, 200, cached=400))
    got = await streamed_ask(api, sid, "hello")
    assert got[-1].type == "run.completed"

    def ended(s: Samples) -> bool:
        done = {"kind": "ask", "status": "completed"}
        return s.get("threadline_runs_total", done) > before.get("threadline_runs_total", done)

    after = await eventually(api, ended)

    def grew(name: str, labels: dict[str, str] | None = None) -> float:
        return after.get(name, labels) - before.get(name, labels)

    assert grew("threadline_asks_total", {"outcome": "created"}) >= 1
    assert grew("threadline_runs_queued_total", {"kind": "ask"}) >= 1
    done = {"kind": "ask", "status": "completed"}
    assert grew("threadline_run_duration_seconds_count", done) >= 1
    assert grew("threadline_first_token_seconds_count", {"provider": "openai"}) >= 1
    assert grew("threadline_provider_calls_total", {**MODEL, "outcome": "ok"}) >= 1
    assert grew("threadline_tokens_total", {**MODEL, "type": "input"}) >= 1000
    assert grew("threadline_tokens_total", {**MODEL, "type": "output"}) >= 200
    assert grew("threadline_tokens_total", {**MODEL, "type": "cached"}) >= 400
    assert grew("threadline_cost_usd_total", MODEL) > 0
    # the user entry and run_start, the answer, usage and run_end: appended in batches
    assert grew("threadline_journal_append_seconds_count") >= 2


async def test_the_model_label_is_the_catalogs_name_or_other(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Clients choose model strings; each label value is a time series of its own, so the
    label is the catalog's name of the model (a dated name is its model's), else "other"."""
    made_up = f"made-up-{uuid.uuid4().hex}"
    other = {"provider": "openai", "model": "other"}
    before = await ascrape(api)
    for model in (f"openai:{made_up}", "openai:gpt-4o-mini-2024-07-18"):
        sid = (await new_session(api, config={"model": model}))["id"]
        upstream.script(Text("hi"), Usage(10, 2))
        assert (await streamed_ask(api, sid, "hello"))[-1].type == "run.completed"

    def grew(s: Samples, name: str, labels: dict[str, str]) -> float:
        return s.get(name, labels) - before.get(name, labels)

    def ended(s: Samples) -> bool:
        input_tokens = "threadline_tokens_total"
        return (
            grew(s, input_tokens, {**other, "type": "input"}) >= 10
            and grew(s, input_tokens, {**MODEL, "type": "input"}) >= 10
        )

    after = await eventually(api, ended)
    assert made_up not in after.text
    assert grew(after, "threadline_provider_calls_total", {**other, "outcome": "ok"}) >= 1
    assert grew(after, "threadline_provider_calls_total", {**MODEL, "outcome": "ok"}) >= 1


async def test_a_replayed_and_a_refused_ask_are_counted_as_such(api: httpx.AsyncClient) -> None:
    sid = (await new_session(api))["id"]
    before = await ascrape(api)
    body = {"input": "once", "stream": False}
    headers = {"Idempotency-Key": "metrics-replay"}
    first = await api.post(f"/v1/sessions/{sid}/ask", json=body, headers=headers)
    again = await api.post(f"/v1/sessions/{sid}/ask", json=body, headers=headers)
    assert first.json()["id"] == again.json()["id"]
    unknown = "00000000-0000-4000-8000-000000000000"
    assert (await api.post(f"/v1/sessions/{unknown}/ask", json=body)).status_code == 404
    after = await ascrape(api)
    for outcome, count in (("created", 1), ("replayed", 1), ("refused", 1)):
        labels = {"outcome": outcome}
        grew = after.get("threadline_asks_total", labels) - before.get(
            "threadline_asks_total", labels
        )
        assert grew >= count, outcome


async def test_an_ai_sdk_chat_ask_counts_once_whichever_sessions_it_tried(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """A chat whose id is a UUID naming no session: its first message tries that session,
    then the one made for the chat, then makes it; its second finds it second. Two asks, each
    counted once, neither refused."""
    chat = str(uuid.uuid4())
    before = await ascrape(api)
    for text in ("Hi", "Again"):
        upstream.script(Text("Hello"))
        message = {
            "id": str(uuid.uuid4()),
            "role": "user",
            "parts": [{"type": "text", "text": text}],
        }
        body = {"id": chat, "messages": [message], "trigger": "submit-message"}
        async with api.stream("POST", "/v1/ui/chat", json=body) as response:
            assert response.status_code == 200
            await response.aread()
    after = await ascrape(api)

    def grew(outcome: str) -> float:
        labels = {"outcome": outcome}
        return after.get("threadline_asks_total", labels) - before.get(
            "threadline_asks_total", labels
        )

    assert grew("created") == 2 and grew("refused") == 0


async def test_provider_errors_and_retries_count_by_code(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    before = await ascrape(api)
    upstream.script(Fail(429, "rate_limit"))
    upstream.script(Text("made it"))
    assert (await streamed_ask(api, sid, "retry me"))[-1].type == "run.completed"
    upstream.script(Fail(400, "bad_request", "nope"))
    assert (await streamed_ask(api, sid, "refuse me"))[-1].type == "run.failed"

    def failed(s: Samples) -> bool:
        labels = {"kind": "ask", "status": "failed"}
        return s.get("threadline_runs_total", labels) > before.get("threadline_runs_total", labels)

    after = await eventually(api, failed)

    def grew(name: str, **labels: str) -> float:
        return after.get(name, labels) - before.get(name, labels)

    assert grew("threadline_provider_errors_total", **MODEL, code="rate_limited") >= 1
    assert grew("threadline_provider_errors_total", **MODEL, code="bad_request") >= 1
    assert grew("threadline_provider_calls_total", **MODEL, outcome="error") >= 2
    assert grew("threadline_provider_retries_total", **MODEL) >= 1


async def test_a_compaction_counts(api: httpx.AsyncClient, upstream: FakeUpstream) -> None:
    sid = (await new_session(api))["id"]
    for i in range(3):
        upstream.script(Text(f"answer {i}"))
        assert (await streamed_ask(api, sid, f"question {i}"))[-1].type == "run.completed"
    before = await ascrape(api)
    upstream.script(Text("the summary"))
    response = await api.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1})
    assert response.status_code == 202, response.text
    run = response.json()["id"]
    ended = await api.get(f"/v1/runs/{run}", params={"wait": "true", "timeout": 60})
    assert ended.json()["status"] == "completed", ended.text

    def counted(s: Samples) -> bool:
        labels = {"kind": "compaction", "status": "completed"}
        return s.get("threadline_runs_total", labels) > before.get("threadline_runs_total", labels)

    after = await eventually(api, counted)
    completed = {"outcome": "completed"}
    assert after.get("threadline_compactions_total", completed) > before.get(
        "threadline_compactions_total", completed
    )
    assert after.get("threadline_compaction_duration_seconds_count") > before.get(
        "threadline_compaction_duration_seconds_count"
    )


async def test_an_open_stream_shows_in_the_gauge_until_it_closes(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api))["id"]
    release = threading.Event()
    upstream.script(Hold(release), Text("late"))
    queued = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "wait", "stream": False})
    run = queued.json()["id"]
    baseline = (await ascrape(api)).get("threadline_sse_streams_active")
    try:
        async with api.stream("GET", f"/v1/runs/{run}/events") as response:
            stream = events(response)
            assert (await anext(stream)).type == "run.created"
            opened = await eventually(
                api, lambda s: s.get("threadline_sse_streams_active") >= baseline + 1
            )
            assert opened.get("threadline_sse_streams_active") >= 1
            release.set()
            async for event in stream:
                if event.type == "run.completed":
                    break
    finally:
        release.set()
    # the stream ended with its run: it leaves the gauge
    await eventually(api, lambda s: s.get("threadline_sse_streams_active") <= baseline)


@contextlib.asynccontextmanager
async def _own_service(
    settings: Settings, tenant: str, *, workers: int = 0
) -> AsyncIterator[httpx.AsyncClient]:
    """A service of its own (`workers` run-executing workers) in a thread, and a client with a
    key of a new `tenant`."""
    server, thread, base = serve_in_thread(create_app(settings, workers=workers))
    engine = create_engine(settings)
    try:
        key = await create_key(engine, tenant)
        async with httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as client:
            yield client
    finally:
        await engine.dispose()
        stop_thread_server(server, thread)


@pytest.fixture
def queue_database(database_url: str) -> str:
    return create_database(database_url, "metrics_queue")


@pytest.fixture
async def api_without_workers(
    queue_database: str, e2e_settings: Settings
) -> AsyncIterator[httpx.AsyncClient]:
    """An API process with no workers, on a database of its own: its asks stay queued."""
    settings = e2e_settings.model_copy(update={"database_url": queue_database})
    async with _own_service(settings, "queue-tenant") as client:
        yield client


async def test_queue_depth_and_oldest_age_reflect_queued_jobs(
    api_without_workers: httpx.AsyncClient,
) -> None:
    api = api_without_workers
    empty = await ascrape(api)
    assert empty.get("threadline_queue_depth", {"queue": "runs"}) == 0
    assert empty.get("threadline_queue_oldest_job_age_seconds", {"queue": "runs"}) == 0
    for _ in range(3):
        sid = (await new_session(api))["id"]
        queued = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "hi", "stream": False})
        assert queued.status_code == 202
    waiting = await eventually(
        api, lambda s: s.get("threadline_queue_oldest_job_age_seconds", {"queue": "runs"}) > 0
    )
    assert waiting.get("threadline_queue_depth", {"queue": "runs"}) == 3


@pytest.fixture
def breaker_database(database_url: str) -> str:
    return create_database(database_url, "metrics_breaker")


@pytest.fixture
async def api_with_a_quick_breaker(
    breaker_database: str, e2e_settings: Settings, upstream: FakeUpstream
) -> AsyncIterator[httpx.AsyncClient]:
    """`threadline serve` whose breaker opens after 2 failures, for no time (the next call is
    its trial), and which does not retry."""
    settings = e2e_settings.model_copy(
        update={
            "database_url": breaker_database,
            "breaker_failures": 2,
            "breaker_cooldown_seconds": 0,
            "llm_max_retries": 0,
        }
    )
    upstream.clear()
    async with _own_service(settings, "breaker-tenant", workers=2) as client:
        yield client


async def test_the_breaker_state_and_its_trips(
    api_with_a_quick_breaker: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    api = api_with_a_quick_breaker
    sid = (await new_session(api))["id"]
    before = await ascrape(api)
    for _ in range(2):
        upstream.script(Fail(500, "server"))
        assert (await streamed_ask(api, sid, "fail"))[-1].type == "run.failed"
    tripped = await ascrape(api)
    openai = {"provider": "openai"}
    assert (
        tripped.get("threadline_provider_breaker_trips_total", openai)
        == before.get("threadline_provider_breaker_trips_total", openai) + 1
    )
    assert tripped.get("threadline_provider_breaker_open", openai) == 1
    upstream.script(Text("back"))
    assert (await streamed_ask(api, sid, "trial"))[-1].type == "run.completed"
    closed = await ascrape(api)
    assert closed.get("threadline_provider_breaker_open", openai) == 0


def test_a_scrape_of_the_api_sums_the_worker_process(deployment: Deployment) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, the API process (no workers) reports the runs its
    neighbour `threadline worker` executed: the scrape sums both processes."""
    before = scrape(deployment.url, METRICS_TOKEN)
    with deployment.client() as client:
        sid = client.post("/v1/sessions", json={}).json()["id"]
        asked = client.post(f"/v1/sessions/{sid}/ask", json={"input": "hi", "stream": False})
        run_id = asked.json()["id"]
        ended = client.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 60})
        assert ended.json()["status"] == "completed", ended.text
    done = {"kind": "ask", "status": "completed"}
    deadline = time.monotonic() + 60
    while (after := scrape(deployment.url, METRICS_TOKEN)).get(
        "threadline_runs_total", done
    ) <= before.get("threadline_runs_total", done):
        assert time.monotonic() < deadline, after.text
        time.sleep(0.1)
    # counted by the API process
    assert after.get("threadline_asks_total", {"outcome": "created"}) > before.get(
        "threadline_asks_total", {"outcome": "created"}
    )
    # counted by the worker process, which serves no HTTP
    ok = {**MODEL, "outcome": "ok"}
    assert after.get("threadline_provider_calls_total", ok) > before.get(
        "threadline_provider_calls_total", ok
    )
    assert after.get("threadline_first_token_seconds_count", {"provider": "openai"}) > 0
    files = {p.name for p in deployment.metrics_dir.iterdir()}
    assert len({f.rsplit("_", 1)[1] for f in files if f.startswith("counter_")}) == 2, files


def test_a_worker_serves_its_own_metrics(deployment: Deployment) -> None:
    url = deployment.worker_metrics_url
    deadline = time.monotonic() + 60
    while True:  # the worker may still be starting
        try:
            refused = httpx.get(f"{url}/metrics", timeout=10)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "unauthorized"
    wrong = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401
    assert httpx.get(f"{url}/other", timeout=10).status_code == 404
    samples = scrape(url, METRICS_TOKEN)
    assert "threadline_runs_total" in samples.text
    assert "threadline_queue_depth" not in samples.names()  # the API's to report
