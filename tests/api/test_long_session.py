"""A 1,000-turn session through the real service and the real OpenAI SDK, under a 4,000-token
window, with tool calls and ~100 KB tool outputs: the context stays within budget and valid on
every request, summaries become checkpoints, old facts stay searchable, and the journal keeps
every entry byte for byte (DESIGN invariants 1, 4 and 5 at length)."""

from __future__ import annotations

import time

import httpx
import pytest

from app.core.formats import openai_request_tokens
from app.core.projection import SUMMARY_PREFIX
from app.llm.tokenizers import encoding_counter
from testkit import long_session as scenario
from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream
from tests.core.format_oracles import validate_openai

TURNS = 1_000


@pytest.mark.slow
async def test_a_thousand_turns_stay_within_budget_and_lose_nothing(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=scenario.SESSION_CONFIG))["id"]
    upstream.respond_with(scenario.respond)
    started = time.monotonic()
    with scenario.installed_tools():
        for turn in range(TURNS):
            events = await collect(
                api, "POST", f"/v1/sessions/{sid}/ask", json={"input": scenario.user_text(turn)}
            )
            assert events[-1].type == "run.completed", (turn, events[-1].data)
    print(f"{TURNS} turns in {time.monotonic() - started:.1f} s")

    # Every request the model received: valid, and within budget by the real tokenizer.
    counter = encoding_counter("o200k_base")
    requests = [r.body for r in upstream.requests]
    summarizations = [b for b in requests if scenario.is_summarization(b)]
    asks = [b for b in requests if not scenario.is_summarization(b)]
    for body in requests:
        assert validate_openai(body) == []
        assert openai_request_tokens(body, counter) <= scenario.BUDGET
    tool_turns = sum(
        1
        for t in range(TURNS)
        if t % scenario.BIG_EVERY == scenario.BIG_OFFSET
        or t % scenario.TOOL_EVERY == scenario.TOOL_OFFSET
    )
    assert len(asks) == TURNS + tool_turns  # one model call per turn, two with a tool

    # Summaries are checkpoints: each folds the previous one in, and asks start from them.
    journal = await history(api, sid)
    summaries = [e for e in journal if e["kind"] == "summary"]
    assert len(summaries) >= TURNS // 60
    assert len(summarizations) >= len(summaries)  # a long range takes several calls
    assert all(s["payload"]["from_seq"] == 1 for s in summaries)
    to_seqs = [s["payload"]["to_seq"] for s in summaries]
    assert to_seqs == sorted(set(to_seqs))
    last_ask = asks[-1]["messages"]
    # The checkpoint goes as one system text: the prefix, then the summary exactly.
    assert last_ask[1]["content"] == SUMMARY_PREFIX + summaries[-1]["payload"]["content"]
    assert summaries[-1]["payload"]["content"].startswith(
        "The user and the assistant went through turns 0 to"
    )
    assert scenario.SECRET not in str(last_ask)  # long gone from the window…

    # …but still found by search, in turn 3's own entry.
    found = (await api.get(f"/v1/sessions/{sid}/search", params={"q": scenario.SECRET})).json()
    secret_entry = next(
        e
        for e in journal
        if e["payload"].get("content") == scenario.user_text(scenario.SECRET_TURN)
    )
    assert [hit["seq"] for hit in found["data"]] == [secret_entry["seq"]]

    # The journal holds every entry as written: each user turn, each full tool output.
    users = [e["payload"]["content"] for e in journal if e["payload"].get("role") == "user"]
    assert users == [scenario.user_text(t) for t in range(TURNS)]
    big = [
        e["payload"]["content"]
        for e in journal
        if e["kind"] == "tool_result" and e["payload"]["name"] == "big_report"
    ]
    regions = [t for t in range(TURNS) if t % scenario.BIG_EVERY == scenario.BIG_OFFSET]
    assert big == [scenario.big_report(r) for r in regions]
    assert all(len(b.encode()) > 100_000 for b in big)
