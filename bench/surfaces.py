"""Ask overhead through each surface: the native ask, the AI SDK chat and the OpenAI Responses.

Prints figures only. Run with `python -m bench.surfaces` (`make bench`); BENCH_QUICK=1 (or
`--quick`) runs fewer asks. Every surface is the same ask use case and the same stream path
with its own wire mapping, so each should cost about what the native ask costs.

`threadline serve` at its default settings (as bench/streams.py starts it) on a throwaway
embedded cluster, against the instant fake upstream. Asks go one at a time, each in a fresh
session, the surfaces taking turns (so that the machine's load drifts alike for all three).
The overhead of an ask is the time from sending it to its first text delta at the client, less
the fake upstream's own time from the request to its first chunk (as bench/streams.py has it).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from app.db.embedded import throwaway_cluster
from app.openai_api.items import conversation_id
from bench.journal import report
from bench.streams import (
    BURST,
    MODEL,
    OVERHEAD_TEXTS,
    SETTLE_SECONDS,
    STREAM_TIMEOUT,
    Pids,
    Row,
    Stream,
    TimedUpstream,
    Trace,
    ask,
    client_for,
    create_sessions,
    new_tag,
    percentile,
    pin_load_generator,
    print_header,
    print_table,
    run_loop,
    served,
    spread,
    tenant_key,
    tree_cpu,
)

QUICK = "--quick" in sys.argv[1:] or os.environ.get("BENCH_QUICK", "") not in ("", "0")
ASKS, WARMUP = (30, 5) if QUICK else (100, 10)  # per surface
TARGET = 1.15  # each surface within 15 % of the native ask


@dataclass
class Asked:
    """What the client saw of one ask: when it was sent, its first text delta, its end."""

    started: float
    first: float | None = None
    text: str = ""
    error: str | None = None


async def native(client: httpx.AsyncClient, session_id: str, tag: str) -> Asked:
    stream: Stream = await ask(client, session_id, tag)
    first = stream.deltas[0][0] if stream.deltas else None
    return Asked(stream.started, first, stream.text, stream.error)


async def ai_sdk(client: httpx.AsyncClient, session_id: str, tag: str) -> Asked:
    """What useChat's DefaultChatTransport posts (the chat's id is the session's)."""
    message = {"id": tag, "role": "user", "parts": [{"type": "text", "text": f"Answer {tag}"}]}
    body = {"id": session_id, "messages": [message], "trigger": "submit-message"}
    asked = Asked(time.perf_counter())
    try:
        async with (
            asyncio.timeout(STREAM_TIMEOUT),
            client.stream("POST", "/v1/ui/chat", json=body) as response,
        ):
            if response.status_code != 200:
                asked.error = (await response.aread()).decode()[:200]
                return asked
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    return asked
                chunk = json.loads(data)
                if chunk["type"] == "text-delta":
                    asked.first = asked.first or time.perf_counter()
                    asked.text += chunk["delta"]
                elif chunk["type"] == "error":
                    asked.error = data[:200]
        asked.error = asked.error or "the stream ended without [DONE]"
    except (TimeoutError, httpx.HTTPError) as exc:
        asked.error = f"{type(exc).__name__}: {exc}"
    return asked


async def openai_responses(client: httpx.AsyncClient, session_id: str, tag: str) -> Asked:
    """What the openai SDK's `responses.create(..., stream=True)` posts."""
    body = {
        "model": MODEL,
        "input": f"Answer {tag}",
        "conversation": conversation_id(session_id),
        "stream": True,
    }
    asked = Asked(time.perf_counter())
    try:
        async with (
            asyncio.timeout(STREAM_TIMEOUT),
            client.stream("POST", "/openai/v1/responses", json=body) as response,
        ):
            if response.status_code != 200:
                asked.error = (await response.aread()).decode()[:200]
                return asked
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line.removeprefix("data: "))
                if event["type"] == "response.output_text.delta":
                    asked.first = asked.first or time.perf_counter()
                    asked.text += event["delta"]
                elif event["type"] in ("response.completed", "response.failed"):
                    if event["type"] == "response.failed":
                        asked.error = line[:200]
                    return asked
        asked.error = "the stream ended without response.completed"
    except (TimeoutError, httpx.HTTPError) as exc:
        asked.error = f"{type(exc).__name__}: {exc}"
    return asked


Surface = Callable[[httpx.AsyncClient, str, str], Awaitable[Asked]]
NATIVE = "native POST /v1/sessions/{id}/ask"
SURFACES: dict[str, Surface] = {
    NATIVE: native,
    "AI SDK POST /v1/ui/chat": ai_sdk,
    "OpenAI POST /openai/v1/responses": openai_responses,
}


def overhead_ms(asked: Asked, trace: Trace) -> float | None:
    if asked.first is None or not trace.sent or asked.error:
        return None
    return ((asked.first - asked.started) - (trace.sent[0] - trace.received)) * 1000


async def timed(
    client: httpx.AsyncClient, upstream: TimedUpstream, surface: Surface, session_id: str
) -> tuple[Asked, Trace]:
    tag = new_tag()
    trace = upstream.plan(tag, OVERHEAD_TEXTS, 0.0)
    return await surface(client, session_id, tag), trace


@dataclass
class SurfaceFigures:
    overheads: list[float]  # ms, one at a time
    wrong: int  # asks without the whole answer
    first_error: str | None
    cpu_seconds: float = 0.0  # the server's, over this surface's one-at-a-time asks
    burst_p99: float = float("nan")  # first token, all included, BURST at once
    burst_wrong: int = 0


async def one_at_a_time(
    client: httpx.AsyncClient, upstream: TimedUpstream, pids: Pids
) -> dict[str, SurfaceFigures]:
    """Every surface's overhead and CPU per ask, the surfaces taking turns. An ask's CPU is
    the server's from its start to the next ask's start (what it leaves running is counted)."""
    done: dict[str, list[tuple[Asked, Trace]]] = {name: [] for name in SURFACES}
    cpu = dict.fromkeys(SURFACES, 0.0)
    sessions = await create_sessions(client, (WARMUP + ASKS) * len(SURFACES))
    measured: str | None = None
    mark = tree_cpu(pids.server)
    for round_ in range(WARMUP + ASKS):
        for name, surface in SURFACES.items():
            now = tree_cpu(pids.server)
            if measured is not None:
                cpu[measured] += now - mark
            mark, measured = now, (name if round_ >= WARMUP else None)
            result = await timed(client, upstream, surface, sessions.pop())
            if round_ >= WARMUP:
                done[name].append(result)
    await asyncio.sleep(SETTLE_SECONDS)
    if measured is not None:
        cpu[measured] += tree_cpu(pids.server) - mark
    expected = "".join(OVERHEAD_TEXTS)
    return {
        name: SurfaceFigures(
            [o for a, t in results if (o := overhead_ms(a, t)) is not None],
            sum(a.text != expected for a, _ in results),
            next((a.error for a, _ in results if a.error), None),
            cpu[name],
        )
        for name, results in done.items()
    }


async def burst(
    client: httpx.AsyncClient, upstream: TimedUpstream, surface: Surface
) -> tuple[float, int]:
    """BURST asks at once through `surface`: first token p99 (ms) and the asks without the
    whole answer."""
    sessions = await create_sessions(client, BURST)
    results = await asyncio.gather(*(timed(client, upstream, surface, s) for s in sessions))
    upstream.clear()
    firsts = [(a.first - a.started) * 1000 for a, _ in results if a.first is not None]
    expected = "".join(OVERHEAD_TEXTS)
    return percentile(firsts, 99), sum(a.text != expected for a, _ in results)


async def run(database_url: str, upstream: TimedUpstream) -> None:
    postmaster = await print_header(database_url, "Threadline ask overhead by surface", relay=False)
    key = await tenant_key(database_url)
    with served(database_url, upstream) as server:
        pids = Pids(server.name, server.pid, postmaster)
        async with client_for(server, key, BURST) as client:
            figures = await one_at_a_time(client, upstream, pids)
            await burst(client, upstream, native)  # warm-up: the pools fill
            for name, surface in SURFACES.items():
                figures[name].burst_p99, figures[name].burst_wrong = await burst(
                    client, upstream, surface
                )
    area = "surface"
    report(area, "asks per surface (one at a time, taking turns)", str(ASKS))
    for name, got in figures.items():
        report(area, name, f"{spread(got.overheads)} over {len(got.overheads)}")
        report(area, "  server cpu per ask", f"{got.cpu_seconds / ASKS * 1000:.2f} ms")
        report(area, f"  {BURST} at once, first token p99", f"{got.burst_p99:.1f} ms")
        if got.wrong or got.burst_wrong:
            report(
                area,
                "  asks without the whole answer",
                f"{got.wrong} one at a time, {got.burst_wrong} at once;"
                f" first error: {got.first_error}",
            )
    base = figures[NATIVE]
    rows = []
    for name, got in figures.items():
        if name == NATIVE:
            continue
        short = name.split(" POST")[0]
        complete = not (got.wrong or got.burst_wrong)
        rows += [
            Row(
                f"7. {short}: overhead p50",
                percentile(got.overheads, 50),
                percentile(base.overheads, 50),
                TARGET,
                also=complete,
            ),
            Row(
                f"7. {short}: overhead p99",
                percentile(got.overheads, 99),
                percentile(base.overheads, 99),
                TARGET,
                also=complete,
            ),
            Row(
                f"7. {short}: burst first token p99",
                got.burst_p99,
                base.burst_p99,
                TARGET,
                also=complete,
            ),
            Row(
                f"7. {short}: server cpu per ask",
                got.cpu_seconds / ASKS * 1000,
                base.cpu_seconds / ASKS * 1000,
                TARGET,
                also=complete,
            ),
        ]
    print_table("Each surface beside the native ask, same run", rows, ("surface", "native"))


def main() -> None:
    pin_load_generator()
    with throwaway_cluster("threadline-bench-") as database_url, TimedUpstream() as upstream:
        run_loop(run(database_url, upstream))


if __name__ == "__main__":
    main()
