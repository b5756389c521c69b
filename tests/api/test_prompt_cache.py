"""Prompt caching end to end: what goes out on the wire (Anthropic cache_control marks at the
projection's cache breakpoints, OpenAI's prompt_cache_key per session), and cached tokens read
from usage into the run, its usage entry, the session's totals and its cost."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest

from app.llm.catalog import cost_usd
from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, Usage

CLAUDE = "anthropic:claude-haiku-4-5"
EPHEMERAL = {"type": "ephemeral"}


async def ask(api: httpx.AsyncClient, sid: str, text: str) -> str:
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": text})
    assert events[-1].type == "run.completed", events[-1].data
    return str(events[-1].data["run_id"])


def marked(body: dict[str, object]) -> list[str]:
    """The texts of the blocks that carry a cache_control mark, in request order."""
    blocks = [*body.get("system", [])]  # type: ignore[misc]
    for turn in body["messages"]:  # type: ignore[attr-defined]
        blocks += turn["content"]
    return [b.get("text", b["type"]) for b in blocks if b.get("cache_control") == EPHEMERAL]


async def test_anthropic_requests_mark_the_stable_prefixes_and_count_cache_use(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": CLAUDE, "system_prompt": "Be brief."}))["id"]
    upstream.script(Text("Paris."), Usage(1_200, 10, cached=0, written=1_000))
    await ask(api, sid, "Capital of France?")
    upstream.script(Text("Rome."), Usage(1_500, 20, cached=1_000, written=400))
    second = await ask(api, sid, "And of Italy?")

    one, two = (r.body for r in upstream.requests)
    # The system prompt (after the tools) and the newest message; then also the history
    # before the newest turn: the whole first request is a prefix of the second.
    assert marked(one) == ["Be brief.", "Capital of France?"]
    assert marked(two) == ["Be brief.", "Paris.", "And of Italy?"]
    projection = (
        await api.post(f"/v1/sessions/{sid}/projection", json={"format": "anthropic"})
    ).json()
    assert projection["meta"]["cache_breakpoints"] == [0, 2, 4]
    assert marked(projection["request"]) == ["Be brief.", "Paris.", "Rome."]

    usage_entries = [e["payload"] for e in await history(api, sid) if e["kind"] == "usage"]
    assert [(u["cached_tokens"], u["cache_write_tokens"]) for u in usage_entries] == [
        (0, 1_000),
        (1_000, 400),
    ]
    run = (await api.get(f"/v1/runs/{second}")).json()
    assert run["usage"]["cached_tokens"] == 1_000 and run["usage"]["cache_write_tokens"] == 400
    priced = [cost_usd(CLAUDE, 1_200, 10, 0, 1_000), cost_usd(CLAUDE, 1_500, 20, 1_000, 400)]
    expected = [p for p in priced if p is not None]
    assert len(expected) == 2
    assert [Decimal(str(u["cost_usd"])) for u in usage_entries] == pytest.approx(expected)
    # Priced as Anthropic prices the cache: writes above the input price, reads far below.
    uncached = cost_usd(CLAUDE, 1_200, 10, 0)
    assert uncached is not None and expected[0] > uncached
    session = (await api.get(f"/v1/sessions/{sid}")).json()
    assert session["usage"] | {"cost_usd": None} == {
        "input_tokens": 2_700,
        "output_tokens": 30,
        "cached_tokens": 1_000,
        "cache_write_tokens": 1_400,
        "reasoning_tokens": 0,
        "cost_usd": None,
    }
    assert Decimal(str(session["usage"]["cost_usd"])) == pytest.approx(sum(expected))


async def test_openai_requests_carry_the_sessions_prompt_cache_key(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": "openai:gpt-4o-mini"}))["id"]
    other = (await new_session(api, config={"model": "openai:gpt-4o-mini"}))["id"]
    upstream.script(Text("Paris."), Usage(1_200, 10))
    await ask(api, sid, "Capital of France?")
    upstream.script(Text("Rome."), Usage(1_300, 10, cached=1_152))
    run_id = await ask(api, sid, "And of Italy?")
    await ask(api, other, "Hello")

    keys = [r.body.get("prompt_cache_key") for r in upstream.requests]
    assert keys == [f"threadline-{sid}", f"threadline-{sid}", f"threadline-{other}"]
    run = (await api.get(f"/v1/runs/{run_id}")).json()
    assert run["usage"]["cached_tokens"] == 1_152 and run["usage"]["cache_write_tokens"] == 0
    session = (await api.get(f"/v1/sessions/{sid}")).json()
    assert session["usage"]["cached_tokens"] == 1_152
    cost = cost_usd("openai:gpt-4o-mini", 1_300, 10, 1_152)
    full = cost_usd("openai:gpt-4o-mini", 1_300, 10, 0)
    assert cost is not None and full is not None and cost < full  # reads cost less
