"""The service's Prometheus metrics (all named threadline_*) and their exposition.

Each hook below is called from the one place its event happens (one line there). With
PROMETHEUS_MULTIPROC_DIR set in the environment of every process on a host (an API process and
`threadline worker` processes beside it), prometheus-client keeps each process's values in
files there and a scrape of any API process sums them all. The queue's depth and its oldest
job's age are read from the queue table at scrape time, not tracked in memory.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from datetime import datetime
from decimal import Decimal
from typing import Any, ParamSpec, Protocol, TypeVar

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class TokenCounts(Protocol):
    """A run's usage as the token counters read it (the provider layer's UsageReport)."""

    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def cache_write_tokens(self) -> int: ...


MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
# No `*_created` timestamp series beside each counter: they double the scrape for nothing here.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Latencies from a few milliseconds (journal appends) to minutes (long runs).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

ASKS = Counter(
    "threadline_asks_total",
    "Ask requests by outcome: created (a new run), replayed (an Idempotency-Key seen before), "
    "refused (4xx: invalid, busy, over a limit; nothing written).",
    ["outcome"],
)
RUNS_QUEUED = Counter("threadline_runs_queued_total", "Runs created (queued), by kind.", ["kind"])
RUNS_ENDED = Counter(
    "threadline_runs_total", "Runs ended, by kind and final status.", ["kind", "status"]
)
RUN_DURATION = Histogram(
    "threadline_run_duration_seconds",
    "From a run's creation (the ask) to its end, by kind and final status.",
    ["kind", "status"],
    buckets=LATENCY_BUCKETS,
)
FIRST_TOKEN = Histogram(
    "threadline_first_token_seconds",
    "From the ask to the first streamed output of its run's first attempt, by provider.",
    ["provider"],
    buckets=LATENCY_BUCKETS,
)
SSE_STREAMS = Gauge(
    "threadline_sse_streams_active",
    "Open SSE responses (run events, session streams, UI chat streams).",
    multiprocess_mode="livesum",
)
PROVIDER_CALLS = Counter(
    "threadline_provider_calls_total",
    "Model calls (each retry is a call), by provider, model and outcome (ok, error).",
    ["provider", "model", "outcome"],
)
PROVIDER_ERRORS = Counter(
    "threadline_provider_errors_total",
    "Failed model calls by provider, model and error code (rate_limited, overloaded, "
    "timeout, bad_request, ...: a run's error code is provider_<code>).",
    ["provider", "model", "code"],
)
PROVIDER_RETRIES = Counter(
    "threadline_provider_retries_total",
    "Model calls asked again after a transient failure.",
    ["provider", "model"],
)
BREAKER_TRIPS = Counter(
    "threadline_provider_breaker_trips_total",
    "Times a provider's circuit breaker opened (its calls skipped for the cooldown).",
    ["provider"],
)
BREAKER_OPEN = Gauge(
    "threadline_provider_breaker_open",
    "1 from a provider's breaker tripping until its next successful call, else 0.",
    ["provider"],
    multiprocess_mode="livemax",
)
TOKENS = Counter(
    "threadline_tokens_total",
    "Tokens of ended runs by provider, model and type: input (the whole prompt, cache reads "
    "and writes included), output, cached (read from the prompt cache), cache_write.",
    ["provider", "model", "type"],
)
COST = Counter(
    "threadline_cost_usd_total",
    "Cost of ended runs in US dollars (genai-prices), by provider and model.",
    ["provider", "model"],
)
COMPACTIONS = Counter(
    "threadline_compactions_total",
    "Summaries written (requested or automatic), by outcome: completed, failed.",
    ["outcome"],
)
COMPACTION_DURATION = Histogram(
    "threadline_compaction_duration_seconds",
    "Time to write a summary (all its summarizer calls).",
    buckets=LATENCY_BUCKETS,
)
JOURNAL_APPEND = Histogram(
    "threadline_journal_append_seconds",
    "Time to append a batch of journal entries (inside its transaction).",
    buckets=LATENCY_BUCKETS,
)

_enabled = True  # THREADLINE_METRICS_ENABLED: off, the hooks do nothing


def configure(enabled: bool) -> None:
    """Turn the hooks on or off for this process (the /metrics route checks the setting)."""
    global _enabled
    _enabled = enabled


# --- Hooks (one call at each site) ---------------------------------------------------------

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def counted_ask(
    refusals: type[Exception],
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Count an ask service call by outcome (its result's `created`, or a refusal: one of
    `refusals`, the services' errors; named by the caller, as telemetry imports no service)."""

    def decorate(ask: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(ask)
        async def counted(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                result = await ask(*args, **kwargs)
            except refusals:
                if _enabled:
                    ASKS.labels("refused").inc()
                raise
            if _enabled:
                ASKS.labels("created" if getattr(result, "created", True) else "replayed").inc()
            return result

        return counted

    return decorate


def run_created(kind: str) -> None:
    if _enabled:
        RUNS_QUEUED.labels(kind).inc()


def run_ended(
    kind: str,
    status: str,
    created_at: datetime | None,
    ended_at: datetime | None,
    labels: tuple[str, str],
    usage: TokenCounts | None,
    cost: Decimal | None,
) -> None:
    """A run's end (once: a run ends once): its status, duration, tokens, cost. `labels`: its
    model's provider and model labels (app.llm.catalog.model_labels: few, whatever clients
    send)."""
    if not _enabled:
        return
    RUNS_ENDED.labels(kind, status).inc()
    if created_at is not None and ended_at is not None:
        RUN_DURATION.labels(kind, status).observe(max(0.0, (ended_at - created_at).total_seconds()))
    provider, name = labels
    if usage is not None:
        for kind_of, count in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cached", usage.cached_tokens),
            ("cache_write", usage.cache_write_tokens),
        ):
            if count:
                TOKENS.labels(provider, name, kind_of).inc(count)
    if cost:
        COST.labels(provider, name).inc(float(cost))


def first_token(created_at: datetime, provider: str) -> bool:
    """The first output of a run's first attempt; returns True (the caller's "seen" flag).
    `provider`: its model's provider label (app.llm.catalog.model_labels)."""
    if _enabled:
        waited = (datetime.now(created_at.tzinfo) - created_at).total_seconds()
        FIRST_TOKEN.labels(provider).observe(max(0.0, waited))
    return True


async def counted_stream(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """An SSE response's events, counted as an open stream from the first until it ends
    (the client left, or the run did); closing it closes `events`."""
    if not _enabled:
        async with aclosing(events):  # type: ignore[type-var]
            async for event in events:
                yield event
        return
    SSE_STREAMS.inc()
    try:
        async with aclosing(events):  # type: ignore[type-var]
            async for event in events:
                yield event
    finally:
        SSE_STREAMS.dec()


def provider_call(key: str, name: str, error: Any | None) -> None:
    """One model call's end; `error` a ProviderError or None. `key` is the route's provider,
    `name` the catalog's name of its model (app.llm.catalog.catalog_model)."""
    if not _enabled:
        return
    PROVIDER_CALLS.labels(key, name, "error" if error is not None else "ok").inc()
    if error is not None:
        PROVIDER_ERRORS.labels(key, name, error.kind).inc()
    else:
        BREAKER_OPEN.labels(key).set(0)


def provider_retry(key: str, name: str) -> None:
    if _enabled:
        PROVIDER_RETRIES.labels(key, name).inc()


def breaker_tripped(key: str) -> None:
    if _enabled:
        BREAKER_TRIPS.labels(key).inc()
        BREAKER_OPEN.labels(key).set(1)


def timed_compaction(summarize: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Count a summary's writing by outcome, and time it."""

    @functools.wraps(summarize)
    async def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.perf_counter()
        outcome = "failed"
        try:
            result = await summarize(*args, **kwargs)
            outcome = "completed"
            return result
        finally:
            if _enabled:
                COMPACTIONS.labels(outcome).inc()
                COMPACTION_DURATION.observe(time.perf_counter() - started)

    return timed


def timed_append(append: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Time a journal append."""

    @functools.wraps(append)
    async def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        if not _enabled:
            return await append(*args, **kwargs)
        started = time.perf_counter()
        try:
            return await append(*args, **kwargs)
        finally:
            JOURNAL_APPEND.observe(time.perf_counter() - started)

    return timed


# --- Exposition -----------------------------------------------------------------------------


class _QueueSnapshot(Collector):
    """The queue as read at this scrape: jobs waiting, and how long the oldest has waited."""

    def __init__(self, queues: dict[str, tuple[int, float]]) -> None:
        self._queues = queues

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "threadline_queue_depth",
            "Run jobs waiting in the queue (not yet taken by a worker), by queue.",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "threadline_queue_oldest_job_age_seconds",
            "How long the oldest waiting job has waited (0 when none waits), by queue.",
            labels=["queue"],
        )
        for queue, (count, age) in sorted(self._queues.items()):
            depth.add_metric([queue], count)
            oldest.add_metric([queue], age)
        yield depth
        yield oldest


def exposition(queues: dict[str, tuple[int, float]] | None) -> bytes:
    """The metrics of this process (with a multiprocess directory: of every process on the
    host), then the queue's as read by the caller (None: a worker's, without them)."""
    if MULTIPROC_DIR:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        base = generate_latest(registry)
    else:
        base = generate_latest(REGISTRY)
    if queues is None:
        return base
    snapshot = CollectorRegistry()
    snapshot.register(_QueueSnapshot(queues))
    return base + generate_latest(snapshot)


_PID_FILE = re.compile(r"_(\d+)\.db$")


def forget_dead_processes() -> None:
    """At start: drop the live gauges of processes that are gone (a crash skips
    process_stopped); their counters and histograms stay in the sums."""
    if not MULTIPROC_DIR:
        return
    for path in glob.glob(os.path.join(MULTIPROC_DIR, "gauge_live*.db")):
        match = _PID_FILE.search(path)
        if match and not _alive(int(match.group(1))):
            multiprocess.mark_process_dead(int(match.group(1)), MULTIPROC_DIR)  # type: ignore[no-untyped-call]


def process_stopped() -> None:
    if MULTIPROC_DIR:
        multiprocess.mark_process_dead(os.getpid(), MULTIPROC_DIR)  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
