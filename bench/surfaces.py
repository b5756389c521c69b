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
    MODEL,
    OVERHEAD_TEXTS,
    STREAM_TIMEOUT,
    Stream,
    TimedUpstream,
    Trace,
    ask,
    client_for,
    create_sessions,
    new_tag,
    percentile,
    print_header,
    run_loop,
    served,
    spread,
    tenant_key,
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
SURFACES: dict[str, Surface] = {
    "native POST /v1/sessions/{id}/ask": native,
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


async def run(database_url: str, upstream: TimedUpstream) -> None:
    await print_header(database_url, "Threadline ask overhead by surface", relay=False)
    key = await tenant_key(database_url)
    results: dict[str, list[tuple[Asked, Trace]]] = {name: [] for name in SURFACES}
    with served(database_url, upstream) as server:
        async with client_for(server, key, 8) as client:
            sessions = await create_sessions(client, (WARMUP + ASKS) * len(SURFACES))
            for round_ in range(WARMUP + ASKS):
                for name, surface in SURFACES.items():
                    result = await timed(client, upstream, surface, sessions.pop())
                    if round_ >= WARMUP:
                        results[name].append(result)
    area = "ask overhead"
    report(area, "asks per surface (one at a time, taking turns)", str(ASKS))
    native_p50: float | None = None
    expected = "".join(OVERHEAD_TEXTS)
    for name, done in results.items():
        samples = [o for a, t in done if (o := overhead_ms(a, t)) is not None]
        wrong = sum(a.text != expected for a, _ in done)
        report(area, name, f"{spread(samples)} over {len(samples)}")
        firsts = [(a.first - a.started) * 1000 for a, _ in done if a.first is not None]
        report(area, "  first token, all included", spread(firsts))
        p50 = percentile(samples, 50)
        if native_p50 is None:
            native_p50 = p50
        else:
            ratio = p50 / native_p50
            verdict = "within" if ratio <= TARGET else "NOT within"
            report(
                area,
                "  p50 ratio to native",
                f"{ratio:.2f} ({verdict} {round((TARGET - 1) * 100)} %)",
            )
        if wrong:
            first_error = next((a.error for a, _ in done if a.error), None)
            report(area, "  asks without the whole answer", f"{wrong}; first error: {first_error}")


def main() -> None:
    with throwaway_cluster("threadline-bench-") as database_url, TimedUpstream() as upstream:
        run_loop(run(database_url, upstream))


if __name__ == "__main__":
    main()
