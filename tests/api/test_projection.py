"""Inspector endpoints: the exact projection an ask would send, and the context usage."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.api import append, append_texts, history, message, new_session
from testkit.upstream import FakeUpstream, Text
from tests.core.format_oracles import validate_anthropic, validate_openai

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
    # The projection's cache breakpoints, marked: the system prompt, the history before the
    # newest turn (the answer "3 °C."), the ask.
    ephemeral = {"type": "ephemeral"}
    assert anthropic["request"]["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": ephemeral}
    ]
    assert neutral["meta"]["cache_breakpoints"] == [0, 4, 5]
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
    # The segments add up to the total: the reply's priming is a segment of its own (gpt-4o
    # is counted exactly: no estimate margin).
    assert breakdown["overhead"] == 3 and usage["tokens"] == sum(breakdown.values())
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


# --- the dry run is what the ask sends (issue 12, point 1) ------------------------------------


@st.composite
def journal_steps(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """Appends (batches of entries, summaries and rollbacks with ranges that may reach past the
    end) and forks, in order; the last step's session is the one asked."""
    steps: list[tuple[str, Any]] = []
    calls = 0
    for turn in range(draw(st.integers(1, 7))):
        batch: list[dict[str, Any]] = [message(f"q{turn} " + "word " * draw(st.integers(0, 60)))]
        for round_ in range(draw(st.integers(0, 2))):
            group = f"g{turn}.{round_}"
            if draw(st.booleans()):
                batch.append(
                    {
                        "kind": "message",
                        "payload": {"role": "assistant", "content": "let me check"},
                        "refs": {"call_id": group},
                    }
                )
            ids = []
            for _ in range(draw(st.integers(1, 2))):
                calls += 1
                ids.append(f"call_{calls}")
                batch.append(
                    {
                        "kind": "tool_call",
                        "payload": {"name": "lookup", "arguments": {"n": calls}},
                        "refs": {"tool_call_id": ids[-1], "call_id": group},
                    }
                )
            for call_id in ids:
                if draw(st.integers(0, 4)):  # sometimes never answered
                    size = draw(st.sampled_from([1, 1, 300]))
                    batch.append(
                        {
                            "kind": "tool_result",
                            "payload": {"content": "result " * size},
                            "refs": {"tool_call_id": call_id, "call_id": group},
                        }
                    )
        if draw(st.booleans()):
            batch.append(message(f"a{turn} " + "text " * draw(st.integers(0, 40)), "assistant"))
        steps.append(("append", batch))
        ranged_kind = draw(st.sampled_from([None, None, "summary", "rollback"]))
        if ranged_kind is not None:
            # A range relative to the rev at append time: within it, or past its end.
            back = draw(st.integers(-3, 6))
            span = draw(st.integers(0, 4))
            steps.append(("range", (ranged_kind, back, span)))
        if draw(st.integers(0, 5)) == 0:
            steps.append(("fork", draw(st.integers(0, 8))))
    return steps


LOOKUP = {
    "name": "lookup",
    "description": "Look a number up.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
}


@dataclass
class Built:
    sid: str
    # Each range appended: whether it named entries that exist, and the answer it got.
    ranges: list[tuple[bool, httpx.Response]] = field(default_factory=list)


async def _build(api: httpx.AsyncClient, sid: str, steps: list[tuple[str, Any]]) -> Built:
    built = Built(sid)
    for step, arg in steps:
        rev = int((await api.get(f"/v1/sessions/{built.sid}")).json()["rev"])
        if step == "append":
            response = await append(api, built.sid, *arg)
            assert response.status_code == 201, response.text
        elif step == "fork":
            at_seq = max(0, rev - arg)
            forked = await api.post(f"/v1/sessions/{built.sid}/fork", json={"at_seq": at_seq})
            assert forked.status_code == 201, forked.text
            built.sid = forked.json()["id"]
        else:
            kind, back, span = arg
            to_seq = rev - back
            payload: dict[str, Any] = {"from_seq": max(1, to_seq - span), "to_seq": to_seq}
            if kind == "summary":
                payload["content"] = f"summary up to {to_seq}"
            response = await append(api, built.sid, {"kind": kind, "payload": payload})
            built.ranges.append((1 <= payload["from_seq"] <= to_seq <= rev, response))
    return built


@settings(
    max_examples=12,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
@given(
    steps=journal_steps(),
    budget=st.integers(1200, 6000),
    chunk=st.sampled_from([None, 0, 400]),
    system=st.booleans(),
    ask_tools=st.sampled_from([None, [LOOKUP]]),
    override=st.sampled_from([None, {"keep_last_turns": 3}, {"max_input_tokens": 3000}]),
)
async def test_the_dry_run_is_byte_identical_to_what_the_ask_sends(
    api: httpx.AsyncClient,
    upstream: FakeUpstream,
    steps: list[tuple[str, Any]],
    budget: int,
    chunk: int | None,
    system: bool,
    ask_tools: list[dict[str, Any]] | None,
    override: dict[str, Any] | None,
) -> None:
    """Any journal (tool groups, interrupted calls, summaries, rollbacks, forks): POST
    /projection with the ask's input as pending shows exactly the messages the ask then sends,
    as the fake upstream receives them from the real OpenAI SDK."""
    policy: dict[str, Any] = {
        "max_input_tokens": budget,
        "reserve_output_tokens": 200,
        "summarization": "use_existing",  # an automatic compaction would change the history
        "window_chunk_tokens": chunk,
    }
    config: dict[str, Any] = {"context_policy": policy}
    if system:
        config["system_prompt"] = "Be brief."
    built = await _build(api, (await new_session(api, config=config))["id"], steps)
    sid = built.sid
    question = "the question " * 5
    # The ask's own tools and policy overrides, as the dry run takes them.
    dry = await projection(
        api,
        sid,
        pending=[message(question)],
        format="openai",
        tools=ask_tools,
        policy=override,
    )
    upstream.clear()
    upstream.script(Text("fine"))
    ask_body = {"input": question, "stream": False, "tools": ask_tools, "context_policy": override}
    asked = await api.post(f"/v1/sessions/{sid}/ask", json=ask_body)
    if dry.status_code == 422:  # nothing fits: the ask is refused the same way
        assert dry.json()["error"]["code"] == "context_overflow"
        assert asked.status_code == 422 and asked.json()["error"]["code"] == "context_overflow"
    else:
        assert dry.status_code == 200 and asked.status_code == 202, (dry.text, asked.text)
        done = await api.get(
            f"/v1/runs/{asked.json()['id']}", params={"wait": "true", "timeout": 30}
        )
        assert done.json()["status"] == "completed", done.text
        sent = upstream.requests[-1].body
        expected = dry.json()["request"]
        assert json.dumps(sent["messages"]) == json.dumps(expected["messages"])
        assert sent.get("tools") == expected.get("tools")
        assert expected["messages"][-1] == {"role": "user", "content": question}
    # Ranges that name entries that exist were taken; the others refused, naming the field.
    for exists, response in built.ranges:
        assert response.status_code == (201 if exists else 422), response.text
        if not exists:
            errors = response.json()["error"]["details"]["errors"]
            assert errors[0]["loc"][-1] in ("from_seq", "to_seq")
