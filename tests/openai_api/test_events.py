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
from app.openai_api.items import output_items, segments

CLIENT = frozenset({"get_weather", "ask_user"})
SERVICE = ("calculator", "current_time")
RUN_ID = str(uuid.UUID(int=7))
BASE = {"id": "resp_x", "object": "response"}


@dataclass(frozen=True)
class Turn:
    pieces: tuple[str, ...]  # the text the model streams, in pieces
    calls: tuple[tuple[str, dict[str, Any]], ...]  # (tool name, arguments)
    client: bool  # the calls are client-side tools (else the service runs them)


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
        out.append(Turn(turn.pieces, tuple((n, draw(arguments)) for n in names), turn.client))
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
            if not turn.client:
                events.append((EventType.TOOL_CALL, {"tool_call_id": call_id}))
                events.append((EventType.TOOL_RESULT, {"tool_call_id": call_id}))
            commit("tool_result", {"name": name, "content": "r"}, {"tool_call_id": call_id})
        if last:
            commit("message", {"role": "assistant", "content": text})
    events.append((EventType.USAGE, {"input_tokens": 9, "output_tokens": 2, "cached_tokens": 0}))
    events.append((EventType.RUN_COMPLETED, {"finish_reason": "stop"}))
    return events, entries


def stream(segment: int, events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    translator = ResponseStream(RUN_ID, segment, BASE, CLIENT)
    return [out for kind, data in events for out in translator.translate(kind, data)]


@given(turns())
def test_each_response_ends_with_what_the_journal_reads_back(plan: list[Turn]) -> None:
    events, entries = run_of(plan)
    parts = segments(entries, CLIENT)
    assert len(parts) == 1 + sum(1 for t in plan if t.client)
    for segment, part in enumerate(parts):
        sent = stream(segment, events)
        assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
        assert sent[0]["type"] == "response.created"
        assert sent[-1]["type"] == "response.completed"
        assert sum(1 for e in sent if e["type"].startswith("response.completed")) == 1
        streamed = sent[-1]["response"]["output"]
        read_back = output_items(RUN_ID, segment, part.outputs, CLIENT)
        assert [_comparable(i) for i in streamed] == [_comparable(i) for i in read_back]
        # What the deltas said is what the items hold.
        deltas = "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta")
        assert deltas == "".join(
            p["text"] for i in streamed if i["type"] == "message" for p in i["content"]
        )


def _comparable(item: dict[str, Any]) -> tuple[Any, ...]:
    if item["type"] == "message":
        return ("message", item["id"], item["status"], [p["text"] for p in item["content"]])
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
    queued = ResponseStream(RUN_ID, 0, BASE, CLIENT, queued=True).translate(
        EventType.RUN_CREATED, {}
    )
    assert queued[0]["response"]["status"] == "queued"
