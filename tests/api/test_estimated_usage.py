"""A run whose upstream reports no usage: counted with the tokenizer and flagged estimated in the
run, its events, its usage entry and the session's totals (never left at 0)."""

from __future__ import annotations

import httpx

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, Usage


async def test_usage_a_server_does_not_report_is_estimated_and_flagged(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"system_prompt": "Be brief."}))["id"]
    upstream.script(Text("Paris is the capital of France."), report_usage=False)

    events = await collect(
        api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "Capital of France?"}
    )

    terminal = events[-1]
    assert terminal.type == "run.completed"
    usage = terminal.data["usage"]
    assert usage["estimated"] is True
    assert usage["input_tokens"] > 5 and usage["output_tokens"] >= 5
    [event] = [e.data for e in events if e.type == "usage"]
    assert event["estimated"] is True and event["input_tokens"] == usage["input_tokens"]
    run = (await api.get(f"/v1/runs/{terminal.data['run_id']}")).json()
    assert run["usage"]["estimated"] is True
    assert run["usage"]["output_tokens"] == usage["output_tokens"]
    [entry] = [e for e in await history(api, sid) if e["kind"] == "usage"]
    assert entry["payload"]["estimated"] is True
    session = (await api.get(f"/v1/sessions/{sid}")).json()
    assert session["usage"]["input_tokens"] == usage["input_tokens"]

    # A reported usage is taken as it is, and not flagged.
    upstream.script(Text("Rome."), Usage(40, 2))
    again = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "Italy?"})
    assert again[-1].data["usage"] == {
        "input_tokens": 40,
        "output_tokens": 2,
        "cached_tokens": 0,
        "cache_write_tokens": 0,
        "estimated": False,
    }
    reported = (await api.get(f"/v1/runs/{again[-1].data['run_id']}")).json()
    assert reported["usage"]["estimated"] is False
