"""A worker killed mid-thinking: another worker resumes the run from the journal, and no half
thinking block is ever journaled (DESIGN invariant 8, with reasoning)."""

from __future__ import annotations

import threading

import httpx
import pytest

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import Chunk, FakeUpstream, Hold, Text, Thinking, Usage, signature
from tests.worker.conftest import Workers

MODEL = "anthropic:claude-sonnet-4-5"


@pytest.mark.slow
async def test_a_worker_killed_mid_thinking_is_replaced_and_no_half_block_is_journaled(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers
) -> None:
    config = {"model": MODEL, "reasoning": {"effort": "low"}}
    sid = (await new_session(api_only, config=config))["id"]
    start = {"type": "thinking", "thinking": "", "signature": ""}
    half = {"type": "thinking_delta", "thinking": "Half a thou"}
    release = threading.Event()
    upstream.script(
        Chunk({"type": "content_block_start", "index": 0, "content_block": start}),
        Chunk({"type": "content_block_delta", "index": 0, "delta": half}),
        Hold(release),  # mid-thinking until the worker is killed
    )
    upstream.script(Thinking("A whole thought."), Text("The answer."), Usage(9, 4))
    try:
        run = (
            await api_only.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})
        ).json()
        seen = await collect(
            api_only, "GET", f"/v1/runs/{run['id']}/events", until="reasoning.delta"
        )
        assert seen[-1].type == "reasoning.delta" and seen[-1].data["start"] is True
        workers.kill_and_replace()
        done = (
            await api_only.get(f"/v1/runs/{run['id']}", params={"wait": "true", "timeout": 60})
        ).json()
    finally:
        release.set()

    assert done["status"] == "completed", done
    assert done["result"] == "The answer." and done["attempts"] == 2
    journal = await history(api_only, sid)
    assert "Half a thou" not in repr([e["payload"] for e in journal])
    [answer] = [
        e for e in journal if e["kind"] == "message" and e["payload"]["role"] == "assistant"
    ]
    whole = {
        "type": "thinking",
        "thinking": "A whole thought.",
        "signature": signature("A whole thought.", 0, 1),
    }
    assert answer["payload"]["content"] == [whole, {"type": "text", "text": "The answer."}]
    events = await collect(api_only, "GET", f"/v1/runs/{run['id']}/events")
    types = [e.type for e in events]
    after_reset = events[types.index("message.reset") :]
    streamed = "".join(e.data["text"] for e in after_reset if e.type == "reasoning.delta")
    assert streamed == "A whole thought."
    assert len(upstream.requests) == 2 and upstream.requests[0].body == upstream.requests[1].body
