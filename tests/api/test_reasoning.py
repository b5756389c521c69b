"""The reasoning setting at the door: per session and per ask, refused with a clear 422 for a
model that cannot reason (as the catalog knows), and nothing written; thinking parts appended
by a client are checked like any content."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.core.reasoning import DEFAULT_ANSWER_TOKENS
from testkit.api import append_texts, history, new_session
from testkit.upstream import FakeUpstream, Text

THINKING = "anthropic:claude-sonnet-4-5"
PLAIN = "openai:gpt-4o-mini"


def refused(response: httpx.Response, code: str, loc: list[str]) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["details"]["loc"] == loc, error
    return error


async def sessions(api: httpx.AsyncClient) -> int:
    return len((await api.get("/v1/sessions", params={"limit": 100})).json()["data"])


async def test_an_ask_with_reasoning_for_a_model_that_cannot_reason_is_refused_and_nothing_written(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": PLAIN}))["id"]
    before = await history(api, sid)

    response = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "Think!", "reasoning": {"effort": "high"}}
    )

    error = refused(response, "reasoning_not_supported", ["body", "reasoning"])
    assert PLAIN in error["message"] and error["details"]["model"] == PLAIN
    assert await history(api, sid) == before == []
    assert upstream.requests == []
    assert (await api.get(f"/v1/sessions/{sid}")).json()["rev"] == 0
    # An ask's model over the session's reasoning is refused alike; turning it off is fine.
    thinking = (await new_session(api, config={"model": THINKING, "reasoning": {"effort": "low"}}))[
        "id"
    ]
    other_model = await api.post(
        f"/v1/sessions/{thinking}/ask", json={"input": "hi", "model": PLAIN, "stream": False}
    )
    refused(other_model, "reasoning_not_supported", ["config", "reasoning"])
    off = await api.post(
        f"/v1/sessions/{thinking}/ask",
        json={"input": "hi", "model": PLAIN, "stream": False, "reasoning": {"effort": "none"}},
    )
    assert off.status_code == 202, off.text


async def test_a_session_config_with_reasoning_its_model_cannot_do_is_refused(
    api: httpx.AsyncClient,
) -> None:
    count = await sessions(api)

    created = await api.post(
        "/v1/sessions", json={"config": {"model": PLAIN, "reasoning": {"budget_tokens": 2048}}}
    )
    default_model = await api.post(
        "/v1/sessions", json={"config": {"reasoning": {"effort": "low"}}}
    )  # the default model here is openai:gpt-4o-mini

    refused(created, "reasoning_not_supported", ["body", "config", "reasoning"])
    refused(default_model, "reasoning_not_supported", ["body", "config", "reasoning"])
    assert await sessions(api) == count
    session = await new_session(api, config={"model": THINKING, "reasoning": {"effort": "high"}})
    patched = await api.patch(f"/v1/sessions/{session['id']}", json={"config": {"model": PLAIN}})
    refused(patched, "reasoning_not_supported", ["body", "config", "reasoning"])
    assert (await api.get(f"/v1/sessions/{session['id']}")).json()["config"] == session["config"]


@pytest.mark.parametrize(
    "reasoning",
    [{}, {"effort": "extreme"}, {"budget_tokens": 100}, {"effort": "low", "budget_tokens": 2048}],
)
async def test_malformed_reasoning_is_a_422(
    api: httpx.AsyncClient, reasoning: dict[str, Any]
) -> None:
    sid = (await new_session(api, config={"model": THINKING}))["id"]

    response = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "x", "reasoning": reasoning}
    )

    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"]["errors"][0]["loc"][:2] == ["body", "reasoning"]
    assert await history(api, sid) == []


async def test_thinking_cannot_force_a_tool_call_on_anthropic(api: httpx.AsyncClient) -> None:
    sid = (await new_session(api, config={"model": THINKING}))["id"]
    tool = {"name": "now", "kind": "client"}

    response = await api.post(
        f"/v1/sessions/{sid}/ask",
        json={
            "input": "x",
            "tools": [tool],
            "tool_choice": "required",
            "reasoning": {"effort": "low"},
        },
    )

    refused(response, "invalid_tool_choice", ["body", "tool_choice"])
    assert await history(api, sid) == []


async def test_appended_thinking_parts_are_checked_at_the_door(api: httpx.AsyncClient) -> None:
    sid = (await new_session(api))["id"]
    thought = {"type": "thinking", "thinking": "hm", "signature": "c2ln"}

    as_user = await api.post(
        f"/v1/sessions/{sid}/entries",
        json={"entries": [{"kind": "message", "payload": {"role": "user", "content": [thought]}}]},
    )
    unsigned = await api.post(
        f"/v1/sessions/{sid}/entries",
        json={
            "entries": [
                {
                    "kind": "message",
                    "payload": {"role": "assistant", "content": [{**thought, "signature": ""}]},
                }
            ]
        },
    )
    kept = await api.post(
        f"/v1/sessions/{sid}/entries",
        json={
            "entries": [{"kind": "message", "payload": {"role": "assistant", "content": [thought]}}]
        },
    )

    assert as_user.status_code == 422 and as_user.json()["error"]["code"] == "invalid_content"
    assert (
        as_user.json()["error"]["details"]["errors"][0]["type"] == "reasoning_not_allowed_in_role"
    )
    assert unsigned.status_code == 422, unsigned.text
    assert kept.status_code == 201, kept.text
    assert [e["payload"]["content"] for e in await history(api, sid)] == [[thought]]
    as_input = await api.post(f"/v1/sessions/{sid}/ask", json={"input": [thought]})
    assert as_input.status_code == 422  # an ask's input is what a person says: no reasoning


BIG_BUDGET = 100_000  # of a 200k window: more than the default reserve (32k) by far


async def test_a_large_thinking_budget_keeps_room_for_the_thinking_and_the_answer(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Anthropic refuses a request whose prompt and max_tokens (the thinking budget and the
    answer's cap) exceed the window: the projection keeps that much of it free."""
    policy = {"max_input_tokens": 120_000}
    config = {
        "model": THINKING,
        "reasoning": {"budget_tokens": BIG_BUDGET},
        "context_policy": policy,
    }
    sid = (await new_session(api, config=config))["id"]
    # About 36k tokens of history: within the default budget (90k), not beside 104k of output.
    long = [f"note {i}: " + "lorem ipsum dolor sit amet " * 300 for i in range(24)]
    await append_texts(api, sid, *long)

    room = BIG_BUDGET + DEFAULT_ANSWER_TOKENS
    context = (await api.get(f"/v1/sessions/{sid}/context")).json()
    assert context["reserve_output_tokens"] == room
    assert context["budget"] == 120_000 - room
    dry = (await api.post(f"/v1/sessions/{sid}/projection", json={})).json()
    assert dry["meta"]["truncated"] is True
    assert dry["meta"]["estimated_tokens"] <= 120_000 - room

    upstream.script(Text("Done."))
    answered = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "Sum up.", "stream": False})
    assert answered.status_code == 202, answered.text
    run = (await api.get(f"/v1/runs/{answered.json()['id']}", params={"wait": "true"})).json()
    assert run["status"] == "completed", run
    body = upstream.requests[-1].body
    assert body["thinking"]["budget_tokens"] == BIG_BUDGET and body["max_tokens"] == room
    sent = json.dumps(body["messages"])
    assert "note 23:" in sent and "note 0:" not in sent  # the oldest notes left out

    # An ask's own cap counts too; one that leaves no room for the prompt is refused.
    before = await history(api, sid)
    no_room = await api.post(
        f"/v1/sessions/{sid}/ask",
        json={"input": "More", "max_output_tokens": 20_000, "stream": False},
    )
    assert no_room.status_code == 422, no_room.text
    assert no_room.json()["error"]["code"] == "context_overflow"
    assert await history(api, sid) == before
