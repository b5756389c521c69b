"""Run events as the AI SDK's UI message stream (`x-vercel-ai-ui-message-stream: v1`).

The AI SDK (`ai`, `@ai-sdk/react`'s `useChat`) reads a stream of JSON chunks, one per SSE
`data:` line, ending with `data: [DONE]`. `UIStream` turns a run's events, in seq order, into
those chunks. It holds the few facts the protocol needs that a single event does not carry:
which text part and step are open, and which tool call a streamed piece belongs to.

A run is one assistant message (its id is the run's); each model turn is a step (`start-step`
.. `finish-step`), its reasoning blocks (`reasoning.delta`) reasoning parts in their order among
its text and tool calls. `message.reset` (the turn starts over: a retried model call, a restarted
run) cannot retract what a client has rendered: the protocol has no chunk that removes a part,
and useChat's Chat keeps every part it was sent, whatever message id comes later. So the
voided attempt's text and step are closed, and a `data-threadline-reset` part marks where the
retry begins: the answer is what follows the last marker (the journal keeps only that one).
Ids derive from the run id and the events alone, so a replay (a resumed stream) yields the
same chunks. Chunk types a client's `ai` major refuses are not sent to it (the client says its
major with a header; `ai` 6 added approval parts, `ai` 7 steering-message).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core.ui_messages import REDACTED
from app.eventlog.registry import APPROACHING_LIMIT_SHARE, AT_LIMIT_SHARE, EventType

HEADER = "x-vercel-ai-ui-message-stream"
CURRENT_MAJOR = 7  # the `ai` major whose chunks are all sent
VERSION = "v1"
DONE = "[DONE]"

# Threadline's finish reasons, in the protocol's words.
_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool-calls",
    "content_filter": "content-filter",
    "other": "other",
}

Chunk = dict[str, Any]


def context_meter(tokens: int, budget: int, level: str | None = None) -> Chunk:
    """The context meter: how full the model's context is, as a data part with a fixed id (a
    later one replaces it). `level`: `ok`, `approaching_limit` or `at_limit`."""
    share = tokens / budget if budget else 0.0
    if level is None:
        level = (
            "at_limit"
            if share >= AT_LIMIT_SHARE
            else "approaching_limit"
            if share >= APPROACHING_LIMIT_SHARE
            else "ok"
        )
    meter = {"tokens": tokens, "budget": budget, "percent": round(100 * share, 1), "level": level}
    return {"type": "data-threadline-context", "id": "context", "data": meter}


class UIStream:
    """Translate one run's events, from its first (`run.created`), in order."""

    def __init__(self, run_id: str, major: int = CURRENT_MAJOR) -> None:
        self.run_id = run_id
        # The `ai` major the client runs: chunks it would refuse are not sent. Tool approvals
        # as approval parts came with `ai` 6 (`ai` 5 clients see the calls and approve through
        # the REST API); steering-message with `ai` 7 (older ones get a data part instead).
        self.approval_parts = major >= 6
        self.steering_parts = major >= 7
        self._denied: set[str] = set()  # calls a person rejected: no output follows
        self._shown: set[str] = set()  # calls whose input was sent (tool-input-available)
        self._resets = 0  # message.reset events so far: the marker parts' ids
        self._step_open = False
        self._after_tools = False  # a tool ran: the model's next output is a new step
        self._text_id: str | None = None
        self._parts = 0  # text parts opened: their ids
        self._thoughts = 0  # reasoning parts opened: their ids
        self._reasoning: dict[int, str] = {}  # the turn's open reasoning blocks: index -> id
        self._calls: dict[int, str] = {}  # the turn's tool call index -> its id
        self._announced: set[str] = set()  # calls with a tool-input-start sent
        self.waiting = False  # the last event was run.requires_action

    def translate(self, event_type: str, data: Mapping[str, Any]) -> list[Chunk]:
        """The chunks for one run event (none for events the protocol has no use for).
        `waiting` tells whether the run now waits for client-side tool outputs."""
        self.waiting = False
        match event_type:
            case EventType.RUN_CREATED:
                return [
                    {"type": "start", "messageId": self.run_id},
                    {
                        "type": "data-threadline-run",
                        "id": "run",
                        "data": {"runId": data["run_id"], "sessionId": data["session_id"]},
                    },
                ]
            case EventType.MESSAGE_DELTA:
                out = self._open_step()
                if self._text_id is None:
                    self._parts += 1
                    self._text_id = f"text-{self._parts}"
                    out.append({"type": "text-start", "id": self._text_id})
                out.append({"type": "text-delta", "id": self._text_id, "delta": data["text"]})
                return out
            case EventType.REASONING_DELTA:
                return self._reasoning_piece(data)
            case EventType.TOOL_CALL_DELTA:
                return self._tool_call_piece(data)
            case EventType.TOOL_CALL if data["tool_call_id"] in self._shown:
                return []  # an approved call, resumed: the client has it, its output follows
            case EventType.TOOL_CALL:
                self._shown.add(data["tool_call_id"])
                out = self._open_step()
                out.append(
                    {
                        "type": "tool-input-available",
                        "toolCallId": data["tool_call_id"],
                        "toolName": data["name"],
                        "input": data["arguments"],
                        "providerExecuted": True,  # the service runs it, not the browser
                    }
                )
                return out
            case EventType.TOOL_APPROVAL_REQUESTED:
                # The call, whole, for the person to judge (it is journaled only once ruled
                # on: its tool_call event, which then adds nothing), and the request.
                call_id = data["tool_call_id"]  # the approval's id too: one ruling per call
                self._shown.add(call_id)
                out = self._open_step()
                shown = {"type": "tool-input-available", "toolCallId": call_id}
                shown |= {"toolName": data["name"], "input": data["arguments"]}
                out.append({**shown, "providerExecuted": True})
                if self.approval_parts:
                    out.append({"type": "tool-approval-request", "toolCallId": call_id})
                    out[-1]["approvalId"] = call_id
                return out
            case EventType.RUN_AWAITING_APPROVAL:
                # Like client tools: the stream ends; useChat sends the rulings with its next
                # request (addToolApprovalResponse), which streams the rest of the run.
                self.waiting = True
                return [*self._close_step(), {"type": "finish", "finishReason": "tool-calls"}]
            case EventType.TOOL_APPROVAL_ANSWERED if self.approval_parts:
                call_id, approved = data["tool_call_id"], data["decision"] == "approved"
                response: Chunk = {"type": "tool-approval-response", "approvalId": call_id}
                response["approved"] = approved
                if data.get("reason"):
                    response["reason"] = data["reason"]
                if approved:
                    return [response]
                self._denied.add(call_id)
                return [response, {"type": "tool-output-denied", "toolCallId": call_id}]
            case EventType.TOOL_RESULT if data["tool_call_id"] in self._denied:
                self._after_tools = True
                return []  # what the model reads of a rejection; the client shows it denied
            case EventType.TOOL_RESULT:
                self._after_tools = True
                call = {"toolCallId": data["tool_call_id"], "providerExecuted": True}
                if data["is_error"]:
                    return [{"type": "tool-output-error", **call, "errorText": data["preview"]}]
                return [{"type": "tool-output-available", **call, "output": data["preview"]}]
            case EventType.RUN_REQUIRES_ACTION:
                # The browser runs these (useChat's onToolCall). The stream ends here: useChat
                # sends the outputs with its next request, which streams the rest of the run.
                out = self._open_step()
                for call in data["tool_calls"]:
                    out.append(
                        {
                            "type": "tool-input-available",
                            "toolCallId": call["tool_call_id"],
                            "toolName": call["name"],
                            "input": call["arguments"],
                        }
                    )
                self.waiting = True
                return [*out, *self._close_step(), {"type": "finish", "finishReason": "tool-calls"}]
            case EventType.RUN_STEERED:
                return self._steered(data)
            case EventType.MESSAGE_RESET:
                self._resets += 1
                self._calls.clear()
                reset = {
                    "type": "data-threadline-reset",
                    "id": f"reset-{self._resets}",
                    "data": {"reason": data["reason"], "attempt": data["attempt"]},
                }
                return [*self._close_step(), reset]
            case EventType.CONTEXT_WARNING if data.get("tokens") is None:
                # not about the context's size (tools left out): a notice of its own
                return [{"type": "data-threadline-warning", "data": dict(data)}]
            case EventType.CONTEXT_WARNING:
                return [self._context(data)]
            case EventType.USAGE:
                return [{"type": "data-threadline-usage", "id": "usage", "data": dict(data)}]
            case EventType.RUN_COMPLETED:
                reason = _FINISH_REASONS.get(data.get("finish_reason") or "stop", "other")
                return [*self._close_step(), {"type": "finish", "finishReason": reason}]
            case EventType.RUN_FAILED:
                error = data["error"]
                return [
                    *self._close_step(),
                    {"type": "error", "errorText": f"{error['code']}: {error['message']}"},
                ]
            case EventType.RUN_CANCELLED:
                return [*self._close_step(), {"type": "abort"}]
        return []

    def answered(
        self, data: Mapping[str, Any], outputs: Mapping[str, tuple[Any, bool]]
    ) -> list[Chunk]:
        """Instead of translate, for a replayed `run.requires_action` whose outputs the client
        sent already (`outputs`: by call id, with whether each is an error): the calls with
        their outputs, marked `providerExecuted` so that useChat does not run them again."""
        out = self._open_step()
        for call in data["tool_calls"]:
            call_id = call["tool_call_id"]
            done = {"toolCallId": call_id, "providerExecuted": True}
            out.append(
                {
                    "type": "tool-input-available",
                    **done,
                    "toolName": call["name"],
                    "input": call["arguments"],
                }
            )
            output, is_error = outputs.get(call_id, (None, False))
            if is_error:
                out.append({"type": "tool-output-error", **done, "errorText": str(output)})
            else:
                out.append({"type": "tool-output-available", **done, "output": output})
        self._after_tools = True
        return out

    def _steered(self, data: Mapping[str, Any]) -> list[Chunk]:
        """A message sent during the run: where it landed in this run, a steering-message
        before the model turn that sees it (as the AI SDK's own steering streams it); else a
        data part (`nextRunId`: the run it started, which a client may stream)."""
        text = str(data.get("text", ""))
        if self.steering_parts and "iteration" in data:
            parts = [{"type": "text", "text": text}]
            return [
                *self._close_step(),
                {"type": "steering-message", "id": data["steer_id"], "parts": parts},
            ]
        steered: Chunk = {"steerId": data["steer_id"], "entrySeq": data["entry_seq"], "text": text}
        if "next_run_id" in data:
            steered["nextRunId"] = data["next_run_id"]
        return [
            {"type": "data-threadline-steered", "id": f"steer-{data['steer_id']}", "data": steered}
        ]

    def _context(self, data: Mapping[str, Any]) -> Chunk:
        return context_meter(data["tokens"], data["budget"], data["level"])

    def _reasoning_piece(self, data: Mapping[str, Any]) -> list[Chunk]:
        out = self._open_step()
        index = data["index"]
        part_id = self._reasoning.get(index)
        if part_id is None:
            out += self._close_text()  # the text after this block is a new part, in order
            self._thoughts += 1
            part_id = self._reasoning[index] = f"reasoning-{self._thoughts}"
            start: Chunk = {"type": "reasoning-start", "id": part_id}
            if data.get("redacted"):
                start["providerMetadata"] = REDACTED
            out.append(start)
        if data["text"]:
            out.append({"type": "reasoning-delta", "id": part_id, "delta": data["text"]})
        if data.get("end"):
            out.append({"type": "reasoning-end", "id": self._reasoning.pop(index)})
        return out

    def _close_text(self) -> list[Chunk]:
        if self._text_id is None:
            return []
        text_id, self._text_id = self._text_id, None
        return [{"type": "text-end", "id": text_id}]

    def _tool_call_piece(self, data: Mapping[str, Any]) -> list[Chunk]:
        out = self._open_step()
        index = data["index"]
        call_id = data.get("tool_call_id") or self._calls.get(index)
        if call_id is None:  # no id yet: nothing the protocol can attach it to
            return out
        self._calls[index] = call_id
        if call_id not in self._announced:
            if "name" not in data:
                return out
            self._announced.add(call_id)
            out.append(
                {"type": "tool-input-start", "toolCallId": call_id, "toolName": data["name"]}
            )
        if data["arguments"]:
            out.append(
                {
                    "type": "tool-input-delta",
                    "toolCallId": call_id,
                    "inputTextDelta": data["arguments"],
                }
            )
        return out

    def _open_step(self) -> list[Chunk]:
        out: list[Chunk] = []
        if self._step_open and self._after_tools:
            out = self._close_step()
        if not self._step_open:
            out.append({"type": "start-step"})
            self._step_open = True
            self._after_tools = False
            self._calls.clear()
        return out

    def _close_step(self) -> list[Chunk]:
        out = self._close_text()
        # A block the provider did not end (a voided attempt, a failed call) ends with its step.
        out += [{"type": "reasoning-end", "id": part} for part in self._reasoning.values()]
        self._reasoning.clear()
        if self._step_open:
            out.append({"type": "finish-step"})
            self._step_open = False
        return out
