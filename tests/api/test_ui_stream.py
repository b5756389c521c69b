"""Run events as UI message stream chunks: the mapping itself (the AI SDK's reading of them is
tested in test_ui_messages.py, with the AI SDK)."""

from __future__ import annotations

from typing import Any

from app.api.ui_stream import UIStream, context_meter
from app.eventlog.registry import (
    ContextWarningData,
    EventData,
    MessageDeltaData,
    MessageResetData,
    PendingToolCall,
    RunCancelledData,
    RunCompletedData,
    RunCreatedData,
    RunFailedData,
    RunRequiresActionData,
    ToolCallData,
    ToolCallDeltaData,
    ToolResultData,
    encode,
)
from app.eventlog.registry import EventError as Error

RUN = "3f0c5a4e-1111-4222-8333-944455556666"
CREATED = RunCreatedData(
    run_id=RUN, session_id="s", kind="ask", user_entry_seq=1, model="openai:gpt-4o-mini"
)


def chunks(*payloads: EventData) -> list[dict[str, Any]]:
    stream = UIStream(RUN)
    out: list[dict[str, Any]] = []
    for payload in payloads:
        event_type, data = encode(payload)
        out += stream.translate(event_type, data)
    return out


def completed(finish_reason: str | None = "stop") -> RunCompletedData:
    return RunCompletedData(
        run_id=RUN,
        status="completed",
        model="m",
        text="",
        usage=None,
        finish_reason=finish_reason,  # type: ignore[arg-type]
    )


def test_an_answer_is_one_message_with_one_step() -> None:
    out = chunks(CREATED, MessageDeltaData(text="Hel"), MessageDeltaData(text="lo"), completed())
    assert out == [
        {"type": "start", "messageId": RUN},
        {"type": "data-threadline-run", "id": "run", "data": {"runId": RUN, "sessionId": "s"}},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "Hel"},
        {"type": "text-delta", "id": "text-1", "delta": "lo"},
        {"type": "text-end", "id": "text-1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_a_replay_gives_the_same_chunks() -> None:
    events = (CREATED, MessageDeltaData(text="a"), completed("length"))
    assert chunks(*events) == chunks(*events)
    assert chunks(*events)[-1] == {"type": "finish", "finishReason": "length"}


def test_tool_call_pieces_follow_their_call_by_index_and_the_next_turn_is_a_new_step() -> None:
    args = {"expression": "1+1"}
    out = chunks(
        CREATED,
        ToolCallDeltaData(index=0, tool_call_id="c1", name="calculator", arguments=""),
        ToolCallDeltaData(index=0, arguments='{"expression"'),
        ToolCallDeltaData(index=0, arguments=': "1+1"}'),
        ToolCallData(tool_call_id="c1", name="calculator", arguments=args),
        ToolResultData(tool_call_id="c1", name="calculator", is_error=False, preview="2"),
        MessageDeltaData(text="2"),
        completed(),
    )
    assert out[2:] == [
        {"type": "start-step"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "calculator"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"expression"'},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": ': "1+1"}'},
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "calculator",
            "input": args,
            "providerExecuted": True,
        },
        {
            "type": "tool-output-available",
            "toolCallId": "c1",
            "providerExecuted": True,
            "output": "2",
        },
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "2"},
        {"type": "text-end", "id": "text-1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_a_failed_tool_is_an_output_error() -> None:
    out = chunks(
        CREATED,
        ToolCallData(tool_call_id="c1", name="t", arguments={}),
        ToolResultData(tool_call_id="c1", name="t", is_error=True, preview="boom"),
    )
    assert out[-1] == {
        "type": "tool-output-error",
        "toolCallId": "c1",
        "providerExecuted": True,
        "errorText": "boom",
    }


def test_a_reset_closes_the_voided_step_and_marks_the_retry() -> None:
    out = chunks(
        CREATED,
        MessageDeltaData(text="half"),
        MessageResetData(reason="provider_retry", attempt=1),
        MessageDeltaData(text="whole"),
        completed(),
    )
    assert out[2:] == [
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        {"type": "text-delta", "id": "text-1", "delta": "half"},
        {"type": "text-end", "id": "text-1"},
        {"type": "finish-step"},
        {
            "type": "data-threadline-reset",
            "id": "reset-1",
            "data": {"reason": "provider_retry", "attempt": 1},
        },
        {"type": "start-step"},
        {"type": "text-start", "id": "text-2"},
        {"type": "text-delta", "id": "text-2", "delta": "whole"},
        {"type": "text-end", "id": "text-2"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_failures_cancels_client_tools_and_the_context_meter() -> None:
    failed = RunFailedData(
        run_id=RUN,
        status="failed",
        model="m",
        partial_text="",
        error=Error(code="provider_overloaded", message="Overloaded"),
    )
    assert chunks(CREATED, failed)[-1] == {
        "type": "error",
        "errorText": "provider_overloaded: Overloaded",
    }
    cancelled = RunCancelledData(
        run_id=RUN, status="cancelled", model="m", partial_text="", reason="cancel"
    )
    assert chunks(CREATED, MessageDeltaData(text="a"), cancelled)[-3:] == [
        {"type": "text-end", "id": "text-1"},
        {"type": "finish-step"},
        {"type": "abort"},
    ]
    waiting = RunRequiresActionData(
        tool_calls=[PendingToolCall(tool_call_id="c1", name="pick", arguments={"n": 1})],
        expires_at="2026-01-01T00:00:00Z",
    )
    # A client-side tool: no providerExecuted, so useChat's onToolCall runs it; the stream
    # ends there (useChat sends the outputs with its next request).
    stream = UIStream(RUN)
    stream.translate(*encode(CREATED))
    assert stream.translate(*encode(waiting)) == [
        {"type": "start-step"},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "pick", "input": {"n": 1}},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "tool-calls"},
    ]
    assert stream.waiting
    assert stream.translate(*encode(MessageDeltaData(text="x")))[0] == {"type": "start-step"}
    assert not stream.waiting
    warning = ContextWarningData(
        level="approaching_limit", tokens=900, budget=1000, percent=90.0, history_dropped=False
    )
    assert chunks(CREATED, warning)[-1] == {
        "type": "data-threadline-context",
        "id": "context",
        "data": {"tokens": 900, "budget": 1000, "percent": 90.0, "level": "approaching_limit"},
    }


def test_the_meter_reads_ok_below_80_percent() -> None:
    assert context_meter(79, 100)["data"] == {
        "tokens": 79,
        "budget": 100,
        "percent": 79.0,
        "level": "ok",
    }
    assert context_meter(80, 100)["data"]["level"] == "approaching_limit"
    assert context_meter(100, 100)["data"]["level"] == "at_limit"
    assert context_meter(0, 0)["data"]["percent"] == 0.0


def test_a_replayed_wait_that_was_answered_carries_the_outputs() -> None:
    waiting = RunRequiresActionData(
        tool_calls=[
            PendingToolCall(tool_call_id="c1", name="pick", arguments={}),
            PendingToolCall(tool_call_id="c2", name="pick", arguments={}),
        ],
        expires_at="2026-01-01T00:00:00Z",
    )
    stream = UIStream(RUN)
    stream.translate(*encode(CREATED))
    _, data = encode(waiting)
    done = {"providerExecuted": True}
    assert stream.answered(data, {"c1": ({"n": 1}, False), "c2": ("no", True)}) == [
        {"type": "start-step"},
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            **done,
            "toolName": "pick",
            "input": {},
        },
        {"type": "tool-output-available", "toolCallId": "c1", **done, "output": {"n": 1}},
        {
            "type": "tool-input-available",
            "toolCallId": "c2",
            **done,
            "toolName": "pick",
            "input": {},
        },
        {"type": "tool-output-error", "toolCallId": "c2", **done, "errorText": "no"},
    ]
    assert not stream.waiting
    assert stream.translate(*encode(MessageDeltaData(text="x")))[:2] == [
        {"type": "finish-step"},
        {"type": "start-step"},
    ]
