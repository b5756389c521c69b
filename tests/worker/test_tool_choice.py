"""tool_choice and parallel_tool_calls through a whole run: from the ask, over the run's tool
loop, to what each provider's SDK sends the (fake) upstream."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text, ToolCall, Usage

OPENAI, ANTHROPIC = "openai:gpt-4o-mini", "anthropic:claude-haiku-4-5"
CALCULATOR = {"name": "calculator", "kind": "builtin"}
WEATHER = {
    "name": "get_weather",
    "kind": "client",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def ask(api: httpx.AsyncClient, sid: str, **body: Any) -> list[Any]:
    return await collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body)


async def test_a_named_tool_is_forced_on_the_first_turn_only_and_serial_calls_on_every_turn(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": OPENAI, "tools": [CALCULATOR, WEATHER]}))["id"]
    upstream.clear()
    upstream.script(ToolCall("c1", "calculator", '{"expression": "6 * 7"}'), Usage(20, 5))
    upstream.script(Text("42"), Usage(30, 2))

    events = await ask(
        api,
        sid,
        input="Six times seven?",
        tool_choice={"type": "function", "name": "calculator"},
        parallel_tool_calls=False,
    )

    assert events[-1].type == "run.completed" and events[-1].data["text"] == "42"
    first, second = (r.body for r in upstream.requests)
    assert first["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}
    # The loop's next turn is the model's to decide: forced again, it would never answer.
    assert "tool_choice" not in second
    assert first["parallel_tool_calls"] is False and second["parallel_tool_calls"] is False


async def test_anthropic_gets_any_then_auto_with_parallel_use_disabled(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": ANTHROPIC, "tools": [CALCULATOR]}))["id"]
    upstream.clear()
    upstream.script(ToolCall("toolu_1", "calculator", '{"expression": "2 + 2"}'), Usage(20, 5))
    upstream.script(Text("4"), Usage(30, 2))

    events = await ask(
        api, sid, input="Two plus two?", tool_choice="required", parallel_tool_calls=False
    )

    assert events[-1].type == "run.completed" and events[-1].data["text"] == "4"
    first, second = (r.body for r in upstream.requests)
    assert first["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert second["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_tool_choice_none_answers_in_one_turn_without_tool_calls(
    api: httpx.AsyncClient, upstream: FakeUpstream, model: str
) -> None:
    sid = (await new_session(api, config={"model": model, "tools": [CALCULATOR, WEATHER]}))["id"]
    upstream.clear()
    upstream.script(Text("I will not compute that."), Usage(20, 5))

    events = await ask(api, sid, input="Six times seven?", tool_choice="none")

    assert events[-1].type == "run.completed"
    assert not [e for e in events if e.type.startswith("tool_call")]
    [request] = upstream.requests
    sent = request.body["tool_choice"]
    assert sent == ("none" if model == OPENAI else {"type": "none"})
    # The tools are still described to the model (it may mention them), only not callable.
    assert len(request.body["tools"]) == 2
    kinds = [e["kind"] for e in await history(api, sid)]
    assert "tool_call" not in kinds and "tool_result" not in kinds


async def test_a_client_tool_forced_first_leaves_the_turn_after_its_outputs_free(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": OPENAI, "tools": [WEATHER]}))["id"]
    upstream.clear()
    upstream.script(ToolCall("c1", "get_weather", '{"city": "Oslo"}'), Usage(20, 5))
    upstream.script(Text("Cold."), Usage(30, 2))

    run = (
        await api.post(
            f"/v1/sessions/{sid}/ask",
            json={
                "input": "Weather in Oslo?",
                "tool_choice": {"type": "function", "name": "get_weather"},
                "stream": False,
            },
        )
    ).json()
    events = await collect(api, "GET", f"/v1/runs/{run['id']}/events", until="run.requires_action")
    call_id = events[-1].data["tool_calls"][0]["tool_call_id"]
    answered = await api.post(
        f"/v1/runs/{run['id']}/tool_outputs",
        json={"tool_outputs": [{"tool_call_id": call_id, "output": "-3C"}]},
    )
    assert answered.status_code == 200, answered.text
    done = (await api.get(f"/v1/runs/{run['id']}", params={"wait": "true", "timeout": 30})).json()

    assert done["status"] == "completed" and done["result"] == "Cold."
    first, second = (r.body for r in upstream.requests)
    assert first["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "tool_choice" not in second and "parallel_tool_calls" not in second
