"""A worker killed mid-stream loses nothing: another worker resumes the run from the journal
and nothing is written twice (DESIGN invariant 8, the worker half)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI, Request

from app.core.tool_loop import thread_call_id
from testkit.api import history, new_session
from testkit.server import serve_in_thread, stop_thread_server
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall, Usage
from tests.worker.conftest import Workers


@pytest.mark.slow
async def test_a_killed_worker_is_replaced_and_nothing_is_duplicated(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers
) -> None:
    sid = (await new_session(api_only))["id"]
    upstream.script(*[Text(f"a{i} ") for i in range(200)], token_delay=0.03)  # killed midway
    upstream.script(Text("the retried "), Text("answer"), Usage(7, 3))
    run = (
        await api_only.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})
    ).json()
    seen = await collect(api_only, "GET", f"/v1/runs/{run['id']}/events", stop_after=6)
    assert [e.type for e in seen].count("message.delta") >= 2
    workers.kill_and_replace()
    done = (
        await api_only.get(f"/v1/runs/{run['id']}", params={"wait": "true", "timeout": 60})
    ).json()
    assert done["status"] == "completed", done
    assert done["result"] == "the retried answer" and done["attempts"] == 2
    events = await collect(api_only, "GET", f"/v1/runs/{run['id']}/events")
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert "message.reset" in [e.type for e in events]
    after_reset = events[[e.type for e in events].index("message.reset") :]
    assert (
        "".join(e.data["text"] for e in after_reset if e.type == "message.delta")
        == "the retried answer"
    )
    kinds = Counter(e["kind"] for e in await history(api_only, sid))
    assert kinds == {"message": 2, "run_start": 1, "usage": 1, "run_end": 1}
    assert len(upstream.requests) == 2


@pytest.mark.slow
async def test_a_worker_killed_mid_tick_loses_renumbers_and_repeats_no_event(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers
) -> None:
    """Two runs streaming in one worker, whose ticks commit both runs' events together, when
    it is killed (SIGKILL) between ticks or in one; another worker process resumes both. The
    event ids every client got mean the same events afterwards, and the logs stay dense."""
    for _ in range(2):  # killed midway
        upstream.script(*[Text(f"a{i} ") for i in range(300)], token_delay=0.02)
    for _ in range(2):
        upstream.script(Text("the retried "), Text("answer"), Usage(7, 3))
    runs = []
    for _ in range(2):
        sid = (await new_session(api_only))["id"]
        ask = {"input": "q", "stream": False}
        runs.append((await api_only.post(f"/v1/sessions/{sid}/ask", json=ask)).json()["id"])
    # A client following the first run live, through the kill and the other worker's retry.
    live = asyncio.create_task(collect(api_only, "GET", f"/v1/runs/{runs[0]}/events"))
    before = [
        await collect(api_only, "GET", f"/v1/runs/{run_id}/events", stop_after=8) for run_id in runs
    ]
    workers.kill_and_replace()
    for run_id in runs:
        done = (
            await api_only.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 90})
        ).json()
        assert done["status"] == "completed" and done["attempts"] == 2, done
    followed = await asyncio.wait_for(live, 90)
    for run_id, seen in zip(runs, before, strict=True):
        events = await collect(api_only, "GET", f"/v1/runs/{run_id}/events")
        assert [e.id for e in events] == list(range(1, len(events) + 1))  # dense, in order
        by_id = {e.id: (e.type, e.data) for e in events}
        assert [(e.type, e.data) for e in seen] == [by_id[e.id] for e in seen]
        assert [e.type for e in events].count("run.completed") == 1
        assert events[-1].type == "run.completed"
        after_reset = events[[e.type for e in events].index("message.reset") :]
        texts = [e.data["text"] for e in after_reset if e.type == "message.delta"]
        assert "".join(texts) == "the retried answer"
    # The live client got every event once, as stored: nothing lost or repeated in the handover.
    final = await collect(api_only, "GET", f"/v1/runs/{runs[0]}/events")
    assert [(e.id, e.type, e.data) for e in followed] == [(e.id, e.type, e.data) for e in final]


class Receiver:
    """A webhook tool server: `fast` answers at once, `slow` takes seconds; deliveries counted
    per tool call (by the Idempotency-Key the worker sends)."""

    def __init__(self) -> None:
        self.deliveries: Counter[str] = Counter()
        app = FastAPI()

        @app.post("/{tool}")
        async def hook(tool: str, request: Request) -> dict[str, str]:
            self.deliveries[request.headers["idempotency-key"]] += 1
            if tool == "slow":
                await asyncio.sleep(4)
            return {"done": tool}

        self.server, self.thread, self.url = serve_in_thread(app)

    def stop(self) -> None:
        stop_thread_server(self.server, self.thread)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    tools = Receiver()
    yield tools
    tools.stop()


def webhook(name: str, url: str) -> dict[str, object]:
    return {"name": name, "kind": "webhook", "url": f"{url}/{name}", "timeout_seconds": 20}


async def wait_for(predicate: object, seconds: float = 180) -> None:
    """Until `predicate` holds: generous, as a loaded machine (a parallel suite) is slow."""
    assert callable(predicate)
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition never held")


@pytest.mark.slow
async def test_a_worker_killed_during_tool_execution(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, receiver: Receiver
) -> None:
    tools = [webhook("fast", receiver.url), webhook("slow", receiver.url)]
    sid = (await new_session(api_only, config={"tools": tools}))["id"]
    upstream.script(ToolCall("c_fast", "fast", "{}"), ToolCall("c_slow", "slow", "{}"))
    upstream.script(Text("both done"))
    run = (
        await api_only.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})
    ).json()
    # Webhook idempotency keys are <run>:<tool_call_id>, the ids the service gave the calls.
    fast_key, slow_key = (
        f"{run['id']}:{thread_call_id(run['user_entry_seq'], 1, i)}" for i in (0, 1)
    )
    await wait_for(
        lambda: receiver.deliveries[slow_key] == 1 and receiver.deliveries[fast_key] == 1
    )
    await asyncio.sleep(0.3)  # the fast result is committed while the slow call runs
    workers.kill_and_replace()
    done = (
        await api_only.get(f"/v1/runs/{run['id']}", params={"wait": "true", "timeout": 60})
    ).json()
    assert done["status"] == "completed" and done["result"] == "both done"
    # The finished call was never executed again; the interrupted one was, once more.
    assert receiver.deliveries[fast_key] == 1 and receiver.deliveries[slow_key] == 2
    kinds = Counter(e["kind"] for e in await history(api_only, sid))
    assert kinds["tool_call"] == 2 and kinds["tool_result"] == 2 and kinds["run_end"] == 1


@pytest.mark.slow
async def test_a_worker_killed_during_the_second_model_call(
    api_only: httpx.AsyncClient, upstream: FakeUpstream, workers: Workers, receiver: Receiver
) -> None:
    sid = (await new_session(api_only, config={"tools": [webhook("fast", receiver.url)]}))["id"]
    upstream.script(ToolCall("c1", "fast", "{}"))
    upstream.script(*[Text("w ") for _ in range(200)], token_delay=0.03)  # killed midway
    upstream.script(Text("final answer"))
    run = (
        await api_only.post(f"/v1/sessions/{sid}/ask", json={"input": "q", "stream": False})
    ).json()
    seen = await collect(api_only, "GET", f"/v1/runs/{run['id']}/events", until="message.delta")
    assert seen[-1].type == "message.delta"
    workers.kill_and_replace()
    done = (
        await api_only.get(f"/v1/runs/{run['id']}", params={"wait": "true", "timeout": 60})
    ).json()
    assert done["status"] == "completed" and done["result"] == "final answer"
    key = f"{run['id']}:{thread_call_id(run['user_entry_seq'], 1, 0)}"
    assert receiver.deliveries[key] == 1  # its result was committed: not re-run
    assert len(upstream.requests) == 3  # the unanswered model call was made again
    kinds = Counter(e["kind"] for e in await history(api_only, sid))
    assert kinds["message"] == 2  # the question and the one final answer
    assert kinds["tool_call"] == 1 and kinds["tool_result"] == 1 and kinds["run_end"] == 1
