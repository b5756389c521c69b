"""Inspector endpoints: the exact projection an ask would send, and the context usage."""

from __future__ import annotations

from typing import Any

import httpx

from app.core.formats import validate_anthropic, validate_openai
from tests.helpers import append, append_texts, history, message, new_session

WEATHER = [
    message("Weather in Oslo?"),
    {
        "kind": "message",
        "payload": {"role": "assistant", "content": "Checking."},
        "refs": {"call_id": "c1"},
    },
    {
        "kind": "tool_call",
        "payload": {"name": "weather", "arguments": {"city": "Oslo"}},
        "refs": {"tool_call_id": "t1", "call_id": "c1"},
    },
    {"kind": "tool_result", "payload": {"content": {"temp_c": 3}}, "refs": {"tool_call_id": "t1"}},
    message("3 °C.", role="assistant"),
]


async def weather_session(client: httpx.AsyncClient, **config: Any) -> str:
    session = await new_session(
        client, config={"model": "openai:gpt-4o", "system_prompt": "Be brief.", **config}
    )
    assert (await append(client, session["id"], *WEATHER)).status_code == 201
    return str(session["id"])


async def projection(client: httpx.AsyncClient, sid: str, **body: Any) -> httpx.Response:
    return await client.post(f"/v1/sessions/{sid}/projection", json=body)


async def test_projection_in_every_format_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = await weather_session(client)
    before = await history(client, sid)
    pending = [message("And tomorrow?")]
    neutral = (await projection(client, sid, pending=pending)).json()
    assert [m["role"] for m in neutral["request"]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert neutral["request"]["messages"][2]["tool_calls"][0]["name"] == "weather"
    assert neutral["meta"]["pending_count"] == 1 and neutral["meta"]["basis_rev"] == 5
    assert neutral["model"] == "openai:gpt-4o" and neutral["context_window"] == 128_000
    openai = (await projection(client, sid, pending=pending, format="openai")).json()
    assert validate_openai(openai["request"]) == []
    assert openai["request"]["messages"][3] == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": '{"temp_c":3}',
    }
    anthropic = (await projection(client, sid, pending=pending, format="anthropic")).json()
    assert validate_anthropic(anthropic["request"]) == []
    assert anthropic["request"]["system"] == [{"type": "text", "text": "Be brief."}]
    assert openai["meta"] == neutral["meta"] == anthropic["meta"]
    assert await history(client, sid) == before  # a dry run


async def test_policy_resolution_and_invalid_policies(client: httpx.AsyncClient) -> None:
    sid = await weather_session(client, context_policy={"preset": "short_context"})
    resolved = (await projection(client, sid)).json()["policy"]
    assert resolved["max_input_tokens"] == 6000 and resolved["keep_last_turns"] == 2
    override = (await projection(client, sid, policy={"keep_last_turns": 7})).json()["policy"]
    assert (override["max_input_tokens"], override["keep_last_turns"]) == (6000, 7)
    bad_field = await projection(client, sid, policy={"max_input_tokens": 10})
    assert bad_field.status_code == 422
    assert bad_field.json()["error"]["details"]["errors"][0]["loc"][-1] == "max_input_tokens"
    crossed = await projection(client, sid, policy={"reserve_output_tokens": 7000})
    assert crossed.status_code == 422 and crossed.json()["error"]["code"] == "invalid_policy"
    unknown = await client.post(
        "/v1/sessions", json={"config": {"context_policy": {"max_tokens": 5}}}
    )
    assert unknown.status_code == 422
    assert unknown.json()["error"]["details"]["errors"][0]["loc"][-1] == "max_tokens"


async def test_context_overflow_names_the_sizes(client: httpx.AsyncClient) -> None:
    sid = await weather_session(client)
    response = await projection(
        client, sid, pending=[message("word " * 3000)], policy={"max_input_tokens": 1000}
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "context_overflow"
    assert error["details"]["budget"] == 750 and error["details"]["required_tokens"] > 750


async def test_context_usage(client: httpx.AsyncClient) -> None:
    sid = await weather_session(client)
    await append(
        client,
        sid,
        {"kind": "summary", "payload": {"from_seq": 1, "to_seq": 4, "content": "Oslo is cold."}},
    )
    await append_texts(client, sid, "thanks")
    usage = (await client.get(f"/v1/sessions/{sid}/context")).json()
    assert usage["model"] == "openai:gpt-4o" and usage["context_window"] == 128_000
    assert usage["budget"] == 128_000 - 32_000 and usage["reserve_output_tokens"] == 32_000
    assert usage["summaries"] == 1 and usage["summary_used"] is True
    assert usage["messages"] == 4  # system, summary, "3 °C.", "thanks"
    assert usage["entries_total"] == 7 and usage["entries_included"] == 3
    breakdown = usage["breakdown"]
    assert breakdown["system"] > 0 and breakdown["summary"] > 0 and breakdown["tools"] == 0
    assert usage["tokens"] == sum(breakdown.values()) + 3  # + reply priming
    assert 0 < usage["percent_of_window"] < 1
    assert usage["threshold_tokens"] == int(0.9 * usage["budget"])


async def test_a_fork_projects_its_parents_prefix(client: httpx.AsyncClient) -> None:
    sid = await weather_session(client)
    fork = (await client.post(f"/v1/sessions/{sid}/fork", json={"at_seq": 1})).json()
    await append_texts(client, fork["id"], "Actually, Bergen?")
    messages = (await projection(client, fork["id"])).json()["request"]["messages"]
    assert [m["content"] for m in messages[1:]] == ["Weather in Oslo?", "Actually, Bergen?"]


async def test_stored_token_counts_are_exact_o200k(client: httpx.AsyncClient) -> None:
    from app.llm.tokenizers import stored_counter

    sid = (await new_session(client))["id"]
    text = "Tokenizers split ünïcödé and 🚀 emoji differently."
    entry = (await append(client, sid, message(text))).json()["entries"][0]
    assert entry["token_count"] == stored_counter().count(text)
