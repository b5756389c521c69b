"""Run events as Responses stream events: what a stream ends with is what the journal reads
back, sequence numbers count from 0 and a replay is the same stream."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.core.entries import JournalEntry
from app.eventlog.registry import EventType
from app.openai_api.events import ResponseStream
from app.openai_api.items import RunTools, output_items, segments

CLIENT = frozenset({"get_weather", "ask_user"})
SERVICE = ("calculator", "current_time", "docs__search", "docs__fetch")  # docs: an MCP server
TOOLS = RunTools(CLIENT, frozenset({"docs"}))
RUN_ID = str(uuid.UUID(int=7))
BASE = {"id": "resp_x", "object": "response"}


@dataclass(frozen=True)
class Turn:
    pieces: tuple[str, ...]  # the text the model streams, in pieces
    calls: tuple[tuple[str, dict[str, Any]], ...]  # (tool name, arguments)
    client: bool  # the calls are client-side tools (else the service runs them)
    gated: frozenset[int] = frozenset()  # which of the calls wait for a person's approval


pieces = st.lists(st.text(min_size=1, max_size=8), max_size=3).map(tuple)
arguments = st.dictionaries(st.sampled_from("abc"), st.integers(), max_size=2)


@st.composite
def turns(draw: st.DrawFn) -> list[Turn]:
    middle = draw(
        st.lists(
            st.builds(
                lambda p, client, names: Turn(p, names, client),
                pieces,
                st.booleans(),
                st.just(()),
            ),
            max_size=3,
        )
    )
    out = []
    for turn in middle:
        pool = sorted(CLIENT) if turn.client else list(SERVICE)
        names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2))
        gated = frozenset(i for i, n in enumerate(names) if not turn.client and draw(st.booleans()))
        calls = tuple((n, draw(arguments)) for n in names)
        out.append(Turn(turn.pieces, calls, turn.client, gated))
    return [*out, Turn(draw(pieces), (), False)]


def run_of(plan: list[Turn]) -> tuple[list[tuple[str, dict[str, Any]]], list[JournalEntry]]:
    """The run's events and the entries its worker (and client) commit, for a plan."""
    events: list[tuple[str, dict[str, Any]]] = [
        (EventType.RUN_CREATED, {"run_id": RUN_ID}),
        (EventType.RUN_STARTED, {"attempt": 1}),
    ]
    entries = [JournalEntry(1, "message", {"role": "user", "content": "hi"}, {"run_id": RUN_ID})]

    def commit(kind: str, payload: dict[str, Any], refs: dict[str, Any] | None = None) -> None:
        entries.append(JournalEntry(len(entries) + 1, kind, payload, refs or {"run_id": RUN_ID}))

    for number, turn in enumerate(plan, 1):
        events += [(EventType.MESSAGE_DELTA, {"text": p}) for p in turn.pieces]
        text = "".join(turn.pieces)
        calls = [(f"call_1_{number}_{i}", name, args) for i, (name, args) in enumerate(turn.calls)]
        for i, (call_id, name, args) in enumerate(calls):
            events.append(
                (
                    EventType.TOOL_CALL_DELTA,
                    {
                        "index": i,
                        "tool_call_id": call_id,
                        "name": name,
                        "arguments": json.dumps(args),
                    },
                )
            )
        last = number == len(plan)
        if text and not last:
            commit("message", {"role": "assistant", "content": text})
        for call_id, name, args in calls:
            commit("tool_call", {"name": name, "arguments": args}, {"tool_call_id": call_id})
        if turn.client:
            pending = [{"tool_call_id": c, "name": n, "arguments": a} for c, n, a in calls]
            events.append((EventType.RUN_REQUIRES_ACTION, {"tool_calls": pending}))
            for call_id, name, _ in calls:
                commit("tool_result", {"name": name, "content": "r"}, {"tool_call_id": call_id})
        else:
            # As the worker runs them: the calls nobody needs to approve at once, then the
            # others once ruled on (a rejection's result is an error).
            ready = [c for i, c in enumerate(calls) if i not in turn.gated]
            waiting = [c for i, c in enumerate(calls) if i in turn.gated]
            run_service_calls(ready, events, commit)
            if waiting:
                for call_id, name, args in waiting:
                    asked = {"tool_call_id": call_id, "name": name, "arguments": args}
                    events.append((EventType.TOOL_APPROVAL_REQUESTED, asked))
                ids = [c for c, _, _ in waiting]
                events.append((EventType.RUN_AWAITING_APPROVAL, {"tool_call_ids": ids}))
                run_service_calls(waiting, events, commit)
        if last:
            commit("message", {"role": "assistant", "content": text})
    events.append((EventType.USAGE, {"input_tokens": 9, "output_tokens": 2, "cached_tokens": 0}))
    events.append((EventType.RUN_COMPLETED, {"finish_reason": "stop"}))
    return events, entries


def run_service_calls(
    calls: list[tuple[str, str, dict[str, Any]]],
    events: list[tuple[str, dict[str, Any]]],
    commit: Any,
) -> None:
    for call_id, _, args in calls:
        events.append((EventType.TOOL_CALL, {"tool_call_id": call_id, "arguments": args}))
    for n, (call_id, name, _) in enumerate(calls):
        failed = n % 2 == 1
        result = {"tool_call_id": call_id, "name": name, "is_error": failed, "preview": "r"}
        events.append((EventType.TOOL_RESULT, result))
        payload = {"name": name, "content": "r", "is_error": failed}
        commit("tool_result", payload, {"tool_call_id": call_id})


def stream(
    segment: int, events: list[tuple[str, dict[str, Any]]], tools: RunTools = TOOLS
) -> list[dict[str, Any]]:
    translator = ResponseStream(RUN_ID, segment, BASE, tools)
    return [out for kind, data in events for out in translator.translate(kind, data)]


@given(turns())
def test_each_response_ends_with_what_the_journal_reads_back(plan: list[Turn]) -> None:
    events, entries = run_of(plan)
    # What the service knows once the run waited: which calls waited for approval.
    gated = frozenset(
        e["tool_call_id"] for k, e in events if k == EventType.TOOL_APPROVAL_REQUESTED
    )
    tools = RunTools(CLIENT, TOOLS.mcp_servers, gated)
    parts = segments(entries, tools)
    assert len(parts) == 1 + sum(1 for t in plan if t.client or t.gated)
    for segment, part in enumerate(parts):
        # A live stream starts before any approval: it learns of them from the events.
        sent = stream(segment, events, TOOLS if segment == 0 else tools)
        assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
        assert sent[0]["type"] == "response.created"
        assert sent[-1]["type"] == "response.completed"
        assert sum(1 for e in sent if e["type"].startswith("response.completed")) == 1
        streamed = sent[-1]["response"]["output"]
        read_back = output_items(RUN_ID, segment, part, tools)
        assert [_comparable(i) for i in streamed] == [_comparable(i) for i in read_back]
        # What the deltas said is what the items hold.
        deltas = "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta")
        assert deltas == "".join(
            p["text"] for i in streamed if i["type"] == "message" for p in i["content"]
        )


def _comparable(item: dict[str, Any]) -> tuple[Any, ...]:
    if item["type"] == "message":
        return ("message", item["id"], item["status"], [p["text"] for p in item["content"]])
    if item["type"] in ("mcp_call", "mcp_approval_request"):
        return tuple(sorted((k, json.dumps(v)) for k, v in item.items()))
    return (
        "function_call",
        item["id"],
        item["call_id"],
        item["name"],
        json.loads(item["arguments"]),
        item["status"],
    )


@given(turns(), st.integers(min_value=-1, max_value=60))
def test_a_replay_is_the_same_stream_and_resumes_exactly(plan: list[Turn], after: int) -> None:
    events, _ = run_of(plan)
    first, again = stream(0, events), stream(0, events)
    assert first == again
    assert [e for e in again if e["sequence_number"] > after] == first[after + 1 :]


def test_a_reset_turn_is_dropped_and_its_place_used_again() -> None:
    events: list[tuple[str, dict[str, Any]]] = [
        (EventType.RUN_CREATED, {}),
        (EventType.MESSAGE_DELTA, {"text": "voided"}),
        (EventType.MESSAGE_RESET, {"reason": "provider_retry", "attempt": 1}),
        (EventType.MESSAGE_DELTA, {"text": "kept"}),
        (EventType.RUN_COMPLETED, {"finish_reason": "stop"}),
    ]
    sent = stream(0, events)
    output = sent[-1]["response"]["output"]
    assert [[p["text"] for p in i["content"]] for i in output] == [["kept"]]
    added = [e["item"]["id"] for e in sent if e["type"] == "response.output_item.added"]
    assert added[0] == added[1] == output[0]["id"]


def test_endings() -> None:
    cut = stream(
        0, [(EventType.RUN_CREATED, {}), (EventType.RUN_COMPLETED, {"finish_reason": "length"})]
    )
    assert cut[-1]["type"] == "response.incomplete"
    assert cut[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    failed = stream(
        0,
        [
            (EventType.RUN_CREATED, {}),
            (EventType.MESSAGE_DELTA, {"text": "par"}),
            (EventType.RUN_FAILED, {"error": {"code": "provider_server", "message": "boom"}}),
        ],
    )
    assert failed[-1]["type"] == "response.failed"
    assert failed[-1]["response"]["error"] == {
        "code": "server_error",
        "message": "provider_server: boom",
    }
    assert failed[-1]["response"]["output"][0]["status"] == "incomplete"
    cancelled = stream(
        0, [(EventType.RUN_CREATED, {}), (EventType.RUN_CANCELLED, {"reason": "cancel"})]
    )
    assert cancelled[-1]["response"]["status"] == "cancelled"
    queued = ResponseStream(RUN_ID, 0, BASE, TOOLS, queued=True).translate(
        EventType.RUN_CREATED, {}
    )
    assert queued[0]["response"]["status"] == "queued"


def test_a_wait_ruled_on_ends_its_response_before_any_result_is_written() -> None:
    """Once every call it waited on is ruled on, the next response exists (the approvals'
    answer names it), though the worker has not written a result yet."""
    call = JournalEntry(
        2, "tool_call", {"name": "docs__search", "arguments": {}}, {"tool_call_id": "c1"}
    )
    entries = [JournalEntry(1, "message", {"role": "user", "content": "hi"}, {}), call]
    waiting = RunTools(CLIENT, TOOLS.mcp_servers, frozenset({"c1"}))
    ruled = RunTools(CLIENT, TOOLS.mcp_servers, frozenset({"c1"}), frozenset({"c1"}))

    assert len(segments(entries, waiting)) == 1
    asked, after = segments(entries, ruled)
    assert asked.answered and after.outputs == ()
    (item,) = output_items(RUN_ID, 0, asked, ruled)
    assert item == {
        "type": "mcp_approval_request",
        "id": "mcpr_c1",
        "server_label": "docs",
        "name": "search",
        "arguments": "{}",
    }
