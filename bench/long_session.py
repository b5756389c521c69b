"""Long-session benchmark: the input tokens Threadline sends over a scripted 1,000-turn session,
against sending the whole history on every model call.

Prints figures only. Run with `python -m bench.long_session [turns]`.

The session is testkit/long_session.py's: numbered turns of 15-60 words, a small tool call
every 10 turns and a ~100 KB tool output every 50, under a 4,000-token window (3,500 of prompt)
with summarization `auto`. `threadline serve` runs in this process (API and 2 workers, the
scenario's tools as built-ins) on bench.journal's database; the fake OpenAI upstream answers
each request as the scenario's model would. Tokens are counted with tiktoken (o200k_base, the
encoding of the gpt-4o-mini the session uses) on the requests the upstream received.

"Full history" is what each model call would have cost with nothing left out: the projection of
the journal up to that call with an unlimited window, no summary and no eviction, counted the
same way. Threadline's side includes the summarization calls compaction made.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import httpx

from app.config import Settings
from app.core.entries import EntryKind, JournalEntry
from app.core.formats import openai_request_tokens
from app.core.policy import ContextPolicy
from app.core.projection import ProjectionInput, project
from app.core.tokens import REPLY_PRIMING, TokenCounter
from app.db.engine import create_engine
from app.llm.tokenizers import encoding_counter
from app.main import create_app
from app.services.keys import create_key
from app.services.projection import tool_specs
from bench.journal import database, report
from testkit import long_session as scenario
from testkit.api import history
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream

TURNS = 1_000
UNLIMITED = ContextPolicy(
    max_input_tokens=10_000_000,
    reserve_output_tokens=0,
    summarization="none",
    tool_output_eviction_tokens=10_000_000,
)


def call_points(journal: list[JournalEntry]) -> list[int]:
    """The last seq the model had seen at each of its calls for an ask: a user's message (with
    its run_start), and the results closing each tool turn."""
    points = []
    for index, entry in enumerate(journal):
        following = journal[index + 1] if index + 1 < len(journal) else None
        asked = entry.kind == EntryKind.RUN_START and entry.payload.get("kind") != "compaction"
        tools_answered = entry.kind == EntryKind.TOOL_RESULT and (
            following is None or following.kind != EntryKind.TOOL_RESULT
        )
        if asked or tools_answered:
            points.append(entry.seq)
    return points


def full_history_tokens(journal: list[JournalEntry], points: list[int]) -> list[int]:
    counter = encoding_counter("o200k_base")
    tools = tool_specs(scenario.TOOLS)
    sizes = []
    for point in points:
        prefix = [e for e in journal if e.seq <= point and e.kind != EntryKind.SUMMARY]
        source = ProjectionInput(
            entries=prefix,
            complete=True,
            rev=point,
            policy=UNLIMITED,
            counter=counter,
            exact=True,
            system_prompt=str(scenario.SESSION_CONFIG["system_prompt"]),
            tools=tools,
        )
        sizes.append(project(source).meta.estimated_tokens)
    return sizes


async def run_session(url: str, source: str, upstream: FakeUpstream, turns: int) -> None:
    settings = Settings(
        database_url=url,
        openai_api_key="sk-bench",
        openai_base_url=upstream.openai_base_url,
        default_model="openai:gpt-4o-mini",
        event_tick_seconds=0.02,
    )
    engine = create_engine(settings)
    key = await create_key(engine, "bench-long-session")
    await engine.dispose()
    server, thread, base_url = serve_in_thread(create_app(settings, workers=2))
    upstream.respond_with(scenario.respond)
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as api:
            created = await api.post("/v1/sessions", json={"config": scenario.SESSION_CONFIG})
            sid = created.json()["id"]
            started = time.monotonic()
            for turn in range(turns):
                body = {"input": scenario.user_text(turn)}
                events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body)
                assert events[-1].type == "run.completed", events[-1].data
            elapsed = time.monotonic() - started
            rows = await history(api, sid)
    finally:
        stop_thread_server(server, thread)
    report_figures(source, turns, elapsed, upstream, rows)


def report_figures(
    source: str, turns: int, elapsed: float, upstream: FakeUpstream, rows: list[dict[str, Any]]
) -> None:
    counter = encoding_counter("o200k_base")
    journal = [
        JournalEntry(r["seq"], r["kind"], r["payload"], r["refs"], r["token_count"], r["id"])
        for r in rows
    ]
    bodies = [r.body for r in upstream.requests]
    summarizing = [
        openai_request_tokens(b, counter) for b in bodies if scenario.is_summarization(b)
    ]
    answering = [
        openai_request_tokens(b, counter) for b in bodies if not scenario.is_summarization(b)
    ]
    points = call_points(journal)
    assert len(points) == len(answering), (len(points), len(answering))
    full = full_history_tokens(journal, points)
    sent = sum(answering) + sum(summarizing)
    compactions = sum(1 for e in journal if e.kind == EntryKind.SUMMARY)
    print(f"# {turns} turns, {len(journal):,} entries ({source}); {elapsed:.0f} s to run")
    report("session", "model calls for asks", f"{len(answering):,}")
    report("session", "compactions (summary checkpoints)", f"{compactions}")
    report("session", "summarization calls", f"{len(summarizing)}")
    report(
        "session",
        "largest request sent",
        f"{max(answering + summarizing):,} tokens (budget {scenario.BUDGET:,})",
    )
    report("tokens", "sent by Threadline (asks)", f"{sum(answering):,}")
    report("tokens", "sent by Threadline (summarizing)", f"{sum(summarizing):,}")
    report("tokens", "full history every call", f"{sum(full):,}")
    report("tokens", "largest full-history request", f"{max(full):,}")
    report("ratio", "full history / Threadline (all calls)", f"{sum(full) / sent:.1f}x")
    report("ratio", "Threadline / full history", f"{sent / sum(full):.4f}")
    report_prefix([b for b in bodies if not scenario.is_summarization(b)], counter)


KEEP_SHARE = 0.9


def report_prefix(bodies: list[dict[str, Any]], counter: TokenCounter) -> None:
    """How much of each model call for an ask repeats the one before it byte for byte (what a
    provider's prompt cache can serve), compactions and window jumps included."""
    kept = shared_total = 0
    sizes = [openai_request_tokens(b, counter) for b in bodies]
    for previous, current, previous_size in zip(bodies, bodies[1:], sizes, strict=False):
        shared = shared_prefix_tokens(previous, current, counter)
        shared_total += shared
        kept += shared >= KEEP_SHARE * previous_size
    pairs = max(1, len(bodies) - 1)
    report("prefix", f"calls keeping >= {KEEP_SHARE:.0%} as prefix", f"{kept / pairs:.1%}")
    report(
        "prefix",
        "input in the previous call's prefix",
        f"{shared_total / max(1, sum(sizes[1:])):.1%} of input tokens",
    )


def shared_prefix_tokens(
    previous: dict[str, Any], current: dict[str, Any], counter: TokenCounter
) -> int:
    """The tokens of the tools and leading messages `current` sends exactly as `previous` did."""
    if previous.get("tools") != current.get("tools"):
        return 0
    same = 0
    for old, new in zip(previous["messages"], current["messages"], strict=False):
        if old != new:
            break
        same += 1
    prefix = {"messages": current["messages"][:same], "tools": current.get("tools", [])}
    return openai_request_tokens(prefix, counter) - REPLY_PRIMING


def main() -> None:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else TURNS
    # The cluster starts outside the event loop: it runs its own setup with asyncio.run.
    with database() as (url, source), FakeUpstream() as upstream, scenario.installed_tools():
        asyncio.run(run_session(url, source, upstream, turns))


if __name__ == "__main__":
    main()
