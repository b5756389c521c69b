"""Anthropic extended thinking end to end, through the served app and the real anthropic SDK to
the fake upstream (which refuses, as the API does, a tool loop whose thinking comes back
missing, reordered or altered): journaled byte for byte as parts of the assistant message it
belongs to, streamed as `reasoning.delta`, sent back within its tool loop only."""

from __future__ import annotations

from typing import Any

import httpx

from testkit.api import history, new_session
from testkit.sse_client import Event, streamed_ask
from testkit.upstream import (
    Chunk,
    FailMidStream,
    FakeUpstream,
    RedactedThinking,
    Text,
    Thinking,
    ToolCall,
    Usage,
    redacted_data,
    signature,
)

MODEL = "anthropic:claude-sonnet-4-5"
CALCULATOR = {
    "name": "calculator",
    "kind": "builtin",
    "description": "Arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}
CONFIG = {"model": MODEL, "tools": [CALCULATOR], "reasoning": {"effort": "medium"}}
ITERATIONS = 5
# Kept byte for byte: spaces at its ends, tabs, newlines, characters beyond ASCII.
ODD = "  \t\u00e9\u2603\U0001f914 \n"


def thought(text: str, place: int = 0, of: int = 1, after: int = 0) -> dict[str, Any]:
    """The part a Thinking step becomes, as the fake signs it (`after`: the tool calls the
    model made before it)."""
    sealed = signature(text, place, of, after)
    return {"type": "thinking", "thinking": text, "signature": sealed}


def hidden(text: str, place: int = 0, of: int = 1) -> dict[str, Any]:
    return {"type": "redacted_thinking", "data": redacted_data(text, place, of)}


def assistants(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in journal if e["kind"] == "message" and e["payload"]["role"] == "assistant"]


def reasoning_sent(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """Each assistant message's reasoning blocks in a Messages request."""
    return [
        [b for b in m["content"] if b["type"] in ("thinking", "redacted_thinking")]
        for m in body["messages"]
        if m["role"] == "assistant" and isinstance(m["content"], list)
    ]


def blocks_streamed(events: list[Event]) -> dict[tuple[int, int], dict[str, Any]]:
    """reasoning.delta events folded per (model turn, block index): text, start, end."""
    blocks: dict[tuple[int, int], dict[str, Any]] = {}
    turn = 0
    for event in events:
        if event.type == "tool_result":
            turn += 1
        if event.type != "reasoning.delta":
            continue
        block = blocks.setdefault((turn, event.data["index"]), {"text": "", "pieces": 0})
        block["text"] += event.data["text"]
        block["pieces"] += 1
        for flag in ("start", "end", "redacted"):
            if event.data.get(flag):
                block[flag] = block.get(flag, 0) + 1
    return blocks


async def test_a_five_iteration_tool_loop_with_thinking(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]
    for i in range(ITERATIONS):
        steps: list[Any] = [Thinking(f"Step {i}: add one more.{ODD}"), Text(f"Adding {i}.")]
        if i % 2:  # some turns think twice, one of them redacted
            steps.insert(1, RedactedThinking(f"flagged {i}"))
        upstream.script(*steps, ToolCall(f"toolu_{i}", "calculator", f'{{"expression": "{i}+1"}}'))
    upstream.script(Thinking("All done."), Text("The sums are done."), Usage(40, 9))

    events = await streamed_ask(api, sid, "Add one, five times.")

    assert events[-1].type == "run.completed", events[-1].data
    assert events[-1].data["text"] == "The sums are done."  # the answer: its text only
    assert [e.type for e in events].count("tool_result") == ITERATIONS
    # The journal: each model turn is one assistant message, its reasoning byte for byte
    # before its text, then its call; no entry of its own for any thinking.
    journal = await history(api, sid)
    turns = assistants(journal)
    assert len(turns) == ITERATIONS + 1
    expected: list[list[dict[str, Any]]] = []
    for i in range(ITERATIONS):
        parts = [thought(f"Step {i}: add one more.{ODD}", 0, 1 + i % 2)]
        if i % 2:
            parts.append(hidden(f"flagged {i}", 1, 2))
        expected.append(parts)
        assert turns[i]["payload"]["content"] == [*parts, {"type": "text", "text": f"Adding {i}."}]
        following = journal[journal.index(turns[i]) + 1]
        assert following["kind"] == "tool_call"
        assert following["refs"]["call_id"] == turns[i]["refs"]["call_id"]
    final = turns[-1]["payload"]
    assert final["content"] == [
        thought("All done."),
        {"type": "text", "text": "The sums are done."},
    ]
    kinds = [e["kind"] for e in journal]
    assert kinds.count("message") == ITERATIONS + 2  # the question and the model's turns
    # Every request of the loop asked for thinking, and carried every earlier turn of the loop
    # with its reasoning unchanged and first: the fake (as Anthropic) accepted each.
    bodies = [r.body for r in upstream.requests]
    assert len(bodies) == ITERATIONS + 1
    for n, body in enumerate(bodies):
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
        assert body["max_tokens"] > 4096
        assert reasoning_sent(body) == expected[:n]
        for message in body["messages"][1:]:
            if message["role"] == "assistant":
                assert message["content"][0]["type"] in ("thinking", "redacted_thinking")
    # Streamed as reasoning, apart from the answer: each block once started and ended.
    blocks = blocks_streamed(events)
    assert blocks[(0, 0)]["text"] == f"Step 0: add one more.{ODD}"
    assert blocks[(1, 1)] == {"text": "", "pieces": 1, "start": 1, "end": 1, "redacted": 1}
    assert all(b["start"] == 1 and b["end"] == 1 for b in blocks.values())
    assert len(blocks) == ITERATIONS + 1 + ITERATIONS // 2
    answer = "".join(e.data["text"] for e in events if e.type == "message.delta")
    assert "Step" not in answer and "done." in answer

    # The next ask ends the loop: the earlier turns' thinking is not sent back (nor counted).
    upstream.script(Text("You are welcome."))
    after = await streamed_ask(api, sid, "Thanks")
    assert after[-1].type == "run.completed", after[-1].data
    assert all(not blocks for blocks in reasoning_sent(upstream.requests[-1].body))


async def test_the_fakes_refusal_of_altered_thinking_fails_the_run_clearly(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """The check the service must pass is real: thinking sent back altered is refused."""
    sid = (await new_session(api, config=CONFIG))["id"]
    tampered = {**thought("I think."), "signature": signature("Something else.", 0, 1)}
    upstream.script(
        Chunk({"type": "content_block_start", "index": 0, "content_block": tampered}),
        Chunk({"type": "content_block_stop", "index": 0}),
        ToolCall("toolu_1", "calculator", '{"expression": "1+1"}'),
    )

    events = await streamed_ask(api, sid, "One plus one?")

    assert events[-1].type == "run.failed"
    assert events[-1].data["error"]["code"] == "provider_bad_request"
    assert "Invalid `signature`" in events[-1].data["error"]["message"]


async def test_a_fault_mid_thinking_is_retried_and_no_half_block_is_journaled(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]
    start = {"type": "thinking", "thinking": "", "signature": ""}
    half = {"type": "thinking_delta", "thinking": "Half a thou"}
    upstream.script(
        Chunk({"type": "content_block_start", "index": 0, "content_block": start}),
        Chunk({"type": "content_block_delta", "index": 0, "delta": half}),
        FailMidStream("overloaded", "Overloaded"),
    )
    upstream.script(
        Thinking("A whole thought."), ToolCall("toolu_1", "calculator", '{"expression": "1+1"}')
    )
    upstream.script(Thinking("Two."), Text("It is 2."))

    events = await streamed_ask(api, sid, "One plus one?")

    assert events[-1].type == "run.completed", events[-1].data
    types = [e.type for e in events]
    reset = types.index("message.reset")
    assert events[reset].data["reason"] == "provider_retry"
    assert "reasoning.delta" in types[:reset]  # the half thought was streamed, then voided
    journal = await history(api, sid)
    everything = repr([e["payload"] for e in journal])
    assert "Half a thou" not in everything  # nothing of the voided attempt: no half block
    turns = assistants(journal)
    assert turns[0]["payload"]["content"] == [thought("A whole thought.")]
    assert turns[1]["payload"]["content"] == [thought("Two."), {"type": "text", "text": "It is 2."}]
    # The retried call was sent what the first was; the loop's next, the whole thought.
    assert upstream.requests[0].body == upstream.requests[1].body
    assert reasoning_sent(upstream.requests[2].body) == [[thought("A whole thought.")]]


async def test_a_fork_inside_a_thinking_turn(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]
    upstream.script(
        Thinking("Compute it."),
        Text("Computing."),
        ToolCall("toolu_1", "calculator", '{"expression": "2*3"}'),
    )
    upstream.script(Thinking("Six."), Text("It is 6."))
    assert (await streamed_ask(api, sid, "Two times three?"))[-1].type == "run.completed"
    parent = await history(api, sid)
    result = next(e for e in parent if e["kind"] == "tool_result")

    # Forked within the turn (after its call's result, before its answer): the child holds
    # the thinking turn as the parent does, and its loop's next request carries it whole.
    response = await api.post(f"/v1/sessions/{sid}/fork", json={"at_seq": result["seq"]})
    assert response.status_code == 201, response.text
    child = response.json()["id"]
    inherited = await history(api, child)
    assert inherited == [e for e in parent if e["seq"] <= result["seq"]]
    projected = await api.post(
        f"/v1/sessions/{child}/projection", json={"format": "anthropic", "model": MODEL}
    )
    assert projected.status_code == 200, projected.text
    turn = projected.json()["request"]["messages"][1]["content"]
    assert turn[0] == thought("Compute it.")
    # A new ask in the child goes out with that loop's results (one user message): Anthropic
    # reads it as the loop going on, and gets the loop's thinking back (else it refuses).
    upstream.script(Thinking("Fresh."), Text("Hello from the fork."))
    events = await streamed_ask(api, child, "Now say hello.")
    assert events[-1].type == "run.completed", events[-1].data
    last = upstream.requests[-1].body["messages"]
    assert [b["type"] for b in last[-1]["content"]] == ["tool_result", "text"]
    assert reasoning_sent(upstream.requests[-1].body) == [[thought("Compute it.")]]
    # Once answered, the next ask ends the loop: its thinking stays behind.
    upstream.script(Text("Bye."))
    assert (await streamed_ask(api, child, "Bye"))[-1].type == "run.completed"
    assert reasoning_sent(upstream.requests[-1].body) == [[], []]
    answer = assistants(await history(api, child))[-2]["payload"]["content"]
    assert answer == [thought("Fresh."), {"type": "text", "text": "Hello from the fork."}]
    # The parent is untouched by the child's ask.
    assert await history(api, sid) == parent


async def test_reasoning_per_ask_over_the_session(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": MODEL}))["id"]

    await streamed_ask(api, sid, "Plain")
    await streamed_ask(api, sid, "Think hard", reasoning={"budget_tokens": 2048})
    await api.patch(f"/v1/sessions/{sid}", json={"config": {"reasoning": {"effort": "low"}}})
    await streamed_ask(api, sid, "Session's")
    await streamed_ask(api, sid, "Not now", reasoning={"effort": "none"})

    asked = [r.body.get("thinking") for r in upstream.requests]
    assert asked == [
        None,
        {"type": "enabled", "budget_tokens": 2048},
        {"type": "enabled", "budget_tokens": 1024},
        None,
    ]


async def test_usage_carries_reasoning_tokens_apart_where_the_provider_reports_them(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": "openai:o3-mini"}))["id"]
    upstream.script(Text("Done."), Usage(20, 50, reasoning=42))
    upstream.script(Text("Plain."), Usage(20, 5))

    reasoned = await streamed_ask(api, sid, "Think.")
    plain = await streamed_ask(api, sid, "Don't.")

    usage = next(e.data for e in reasoned if e.type == "usage")
    assert usage["reasoning_tokens"] == 42 and usage["output_tokens"] == 50
    assert reasoned[-1].data["usage"]["reasoning_tokens"] == 42
    assert "reasoning_tokens" not in next(e.data for e in plain if e.type == "usage")
    entries = [e["payload"] for e in await history(api, sid) if e["kind"] == "usage"]
    assert [e.get("reasoning_tokens") for e in entries] == [42, None]


async def test_compaction_over_thinking_turns_summarizes_what_was_said_not_the_thinking(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]
    upstream.script(
        Thinking("Secret plan: multiply."),
        ToolCall("toolu_1", "calculator", '{"expression": "2*3"}'),
    )
    upstream.script(Thinking("Six, clearly."), Text("It is 6."))
    assert (await streamed_ask(api, sid, "Two times three?"))[-1].type == "run.completed"
    upstream.script(Text("The user asked 2*3; the answer was 6."))

    started = await api.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 0})
    assert started.status_code in (200, 202), started.text
    done = (
        await api.get(f"/v1/runs/{started.json()['id']}", params={"wait": "true", "timeout": 60})
    ).json()

    assert done["status"] == "completed", done
    transcript = repr(upstream.requests[-1].body)
    assert "It is 6." in transcript and "Secret plan" not in transcript
    assert "Six, clearly" not in transcript and "thinking" not in upstream.requests[-1].body
    # The next ask goes out from the summary: no thinking of the summarized turns.
    upstream.script(Thinking("Fine."), Text("Yes."))
    assert (await streamed_ask(api, sid, "Right?"))[-1].type == "run.completed"
    assert all(not blocks for blocks in reasoning_sent(upstream.requests[-1].body))
    assert "Secret plan" not in repr(upstream.requests[-1].body)


async def test_thinking_the_journal_cannot_store_is_asked_again_never_half_written(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Postgres stores no NUL character and no lone surrogate: a thinking block holding one
    cannot be kept byte for byte, nor changed (its signature covers it). The model turn is
    asked again, and the run never writes the block, altered or not."""
    sid = (await new_session(api, config=CONFIG))["id"]
    upstream.script(Thinking("a NUL \x00 here"), Text("Lost."))
    upstream.script(Thinking("a lone \ud800 surrogate"), Text("Lost too."))
    upstream.script(Thinking("Clean."), Text("It is 2."))

    events = await streamed_ask(api, sid, "One plus one?")

    assert events[-1].type == "run.completed", events[-1].data
    assert [e.data["reason"] for e in events if e.type == "message.reset"] == [
        "provider_retry",
        "provider_retry",
    ]
    journal = await history(api, sid)
    everything = repr([e["payload"] for e in journal])
    assert "NUL" not in everything and "lone" not in everything and "Lost" not in everything
    assert assistants(journal)[0]["payload"]["content"] == [
        thought("Clean."),
        {"type": "text", "text": "It is 2."},
    ]


async def test_interleaved_thinking_between_tool_calls_is_kept_and_sent_back_in_order(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config=CONFIG))["id"]  # a Claude 4 model: it interleaves
    upstream.script(
        Thinking("First one sum."),
        ToolCall("toolu_1", "calculator", '{"expression": "1+1"}'),
        Thinking("Then another."),
        ToolCall("toolu_2", "calculator", '{"expression": "2+2"}'),
    )
    upstream.script(Thinking("Both known."), Text("2 and 4."))

    events = await streamed_ask(api, sid, "1+1 and 2+2?")

    assert events[-1].type == "run.completed", events[-1].data
    journal = await history(api, sid)
    first = assistants(journal)[0]
    # The second thought came after the first call: the journal says so, to send it back there.
    later = {**thought("Then another.", 1, 2, after=1), "tool_calls_before": 1}
    assert first["payload"]["content"] == [thought("First one sum.", 0, 2), later]
    calls = [e for e in journal if e["kind"] == "tool_call"]
    assert [c["payload"]["arguments"] for c in calls] == [
        {"expression": "1+1"},
        {"expression": "2+2"},
    ]
    # Both thoughts streamed as blocks of their own, and went back whole, in order (the fake
    # refuses a loop whose thinking is missing, altered or reordered).
    blocks = blocks_streamed(events)
    assert blocks[(0, 0)]["text"] == "First one sum." and blocks[(0, 2)]["text"] == "Then another."
    assert all(r.headers.get("anthropic-beta") for r in upstream.requests)
    (turn,) = [m for m in upstream.requests[1].body["messages"] if m["role"] == "assistant"]
    assert [(b["type"], b.get("thinking") or b.get("input")) for b in turn["content"]] == [
        ("thinking", "First one sum."),
        ("tool_use", {"expression": "1+1"}),
        ("thinking", "Then another."),
        ("tool_use", {"expression": "2+2"}),
    ]
    assert reasoning_sent(upstream.requests[1].body) == [
        [thought("First one sum.", 0, 2), thought("Then another.", 1, 2, after=1)]
    ]
