"""Run events as the Responses API's streaming events. Pure: no I/O.

`ResponseStream` reads one run's events in seq order, from its first, and yields the events of
one of its responses (`segment`: the part of the run after its n-th wait for client-side tool
outputs), each with a `sequence_number` counted from that response's first event. A replay
translates the same run events the same way, so sequence numbers and item ids are stable and
`starting_after` resumes exactly.

Tool calls the service runs itself (built-in and webhook tools) are not output items: only
calls of client-side tools (`tools.client`), which the client answers with
function_call_output items, are. `message.reset` (the model turn starts over) cannot retract
what was sent: the voided turn's items are dropped from the response and their output indexes
are used again.

Reasoning (`reasoning.delta`) is a reasoning item per block, its text streamed as the item's
one summary part (reasoning_summary_part / reasoning_summary_text events); a redacted block is
an item without summary. The provider's opaque content is not in the run's events: a response
read back has it (`include`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from app.eventlog.registry import EventType
from app.openai_api.items import (
    Item,
    RunTools,
    approval_request_item,
    mcp_call_item,
    output_item_id,
    reasoning_item,
    result_fields,
)
from app.openai_api.objects import (
    INCOMPLETE_REASONS,
    Json,
    response_error,
    response_object,
    usage_object,
)


class ResponseStream:
    def __init__(
        self,
        run_id: str,
        segment: int,
        base: Json,
        tools: RunTools,
        *,
        queued: bool = False,
    ) -> None:
        self.run_id = run_id
        self.segment = segment
        self.base = base
        self.tools = tools
        self.queued = queued
        self.done = False  # the response's last event was sent
        self.output: list[Item] = []
        self._waits = 0  # waits seen (run.requires_action, run.awaiting_approval)
        self._gated = set(tools.gated)  # calls that waited for approval, as seen so far
        self._arguments: dict[str, Any] = {}  # each service-run call's arguments, by id
        self._active = segment == 0
        self._started = False
        self._sequence = -1
        self._text: int | None = None  # the output index of the open message item
        self._calls: dict[int, int | None] = {}  # the turn's call index -> output index
        self._thoughts: dict[int, int] = {}  # the turn's open reasoning blocks -> output index
        self._turn_start = 0
        self._usage: Json | None = None

    # -- the translation

    def translate(self, event_type: str, data: Mapping[str, Any]) -> list[Json]:
        if self.done:
            return []
        if event_type == EventType.TOOL_APPROVAL_REQUESTED:
            self._gated.add(str(data["tool_call_id"]))
        elif event_type == EventType.TOOL_CALL:
            self._arguments[str(data["tool_call_id"])] = data.get("arguments") or {}
        if not self._active:
            if event_type in (EventType.RUN_REQUIRES_ACTION, EventType.RUN_AWAITING_APPROVAL):
                self._waits += 1
                if self._waits == self.segment:
                    self._active = True
                    return self._created("in_progress")
            return []
        match event_type:
            case EventType.RUN_CREATED:
                return self._created("queued" if self.queued else "in_progress")
            case EventType.RUN_STARTED:
                if self._started or self.segment:
                    return []
                self._started = True
                return [self._event("response.in_progress", response=self._snapshot("in_progress"))]
            case EventType.REASONING_DELTA:
                return self._reasoning_delta(data)
            case EventType.MESSAGE_DELTA:
                return self._text_delta(str(data["text"]))
            case EventType.TOOL_CALL_DELTA:
                return self._call_delta(data)
            case EventType.TOOL_CALL:
                return self._close_text()
            case EventType.TOOL_RESULT:
                out = self._close_text()
                out += self._mcp_call(data)
                self._new_turn()
                return out
            case EventType.TOOL_APPROVAL_REQUESTED:
                return [*self._close_text(), *self._approval_request(data)]
            case EventType.RUN_AWAITING_APPROVAL:
                out = self._close_text()
                self.done = True
                return [*out, self._end("response.completed", "completed")]
            case EventType.MESSAGE_RESET:
                self.output = self.output[: self._turn_start]
                self._text = None
                self._calls.clear()
                self._thoughts.clear()
                return []
            case EventType.USAGE:
                self._usage = usage_object(
                    int(data["input_tokens"]),
                    int(data["output_tokens"]),
                    int(data["cached_tokens"]),
                )
                return []
            case EventType.RUN_REQUIRES_ACTION:
                out = self._close_text()
                out += self._close_calls(data["tool_calls"])
                self.done = True
                return [*out, self._end("response.completed", "completed")]
            case EventType.RUN_COMPLETED:
                out = self._close_text()
                reason = INCOMPLETE_REASONS.get(data.get("finish_reason") or "stop")
                self.done = True
                if reason is not None:
                    return [*out, self._end("response.incomplete", "incomplete", reason=reason)]
                return [*out, self._end("response.completed", "completed")]
            case EventType.RUN_FAILED:
                out = self._close_text("incomplete")
                self.done = True
                failed = response_error(data["error"])
                return [*out, self._end("response.failed", "failed", error=failed)]
            case EventType.RUN_CANCELLED:
                # The Responses API has no event for a cancelled response: it ends failed in
                # name, its status says cancelled.
                out = self._close_text("incomplete")
                self.done = True
                return [*out, self._end("response.failed", "cancelled")]
        return []

    # -- pieces

    def _event(self, event_type: str, **fields: Any) -> Json:
        # A copy: the items in the response go on changing after the event is sent.
        self._sequence += 1
        return {"type": event_type, "sequence_number": self._sequence, **copy.deepcopy(fields)}

    def _snapshot(self, status: str, **extra: Any) -> Json:
        return response_object(self.base, status, self.output, usage=self._usage, **extra)

    def _created(self, status: str) -> list[Json]:
        return [self._event("response.created", response=self._snapshot(status))]

    def _end(self, event_type: str, status: str, **extra: Any) -> Json:
        if "reason" in extra:
            extra = {"incomplete_reason": extra.pop("reason")}
        return self._event(event_type, response=self._snapshot(status, **extra))

    def _new_turn(self) -> None:
        self._calls.clear()
        self._thoughts.clear()
        self._turn_start = len(self.output)

    def _text_delta(self, text: str) -> list[Json]:
        out: list[Json] = []
        if self._text is None:
            index = len(self.output)
            item: Item = {
                "type": "message",
                "id": output_item_id("msg", self.run_id, self.segment, index),
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            self.output.append(item)
            self._text = index
            out.append(self._event("response.output_item.added", output_index=index, item=item))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item["content"] = [part]
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
        item = self.output[self._text]
        item["content"][0]["text"] += text
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=self._text,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def _close_text(self, status: str = "completed") -> list[Json]:
        out = [e for block in list(self._thoughts) for e in self._close_thought(block)]
        if self._text is None:
            return out
        index, self._text = self._text, None
        item = self.output[index]
        part = item["content"][0]
        item["status"] = status
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            *out,
            self._event("response.output_text.done", **where, text=part["text"], logprobs=[]),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _reasoning_delta(self, data: Mapping[str, Any]) -> list[Json]:
        block, text = int(data["index"]), str(data["text"])
        out: list[Json] = []
        if block not in self._thoughts:
            index = len(self.output)
            item = reasoning_item(output_item_id("rs", self.run_id, self.segment, index), "")
            self.output.append(item)
            self._thoughts[block] = index
            out.append(self._event("response.output_item.added", output_index=index, item=item))
        index = self._thoughts[block]
        item = self.output[index]
        where = {"item_id": item["id"], "output_index": index, "summary_index": 0}
        if text:
            if not item["summary"]:
                part = {"type": "summary_text", "text": ""}
                out.append(self._event("response.reasoning_summary_part.added", **where, part=part))
                item["summary"] = [part]
            item["summary"][0]["text"] += text
            out.append(self._event("response.reasoning_summary_text.delta", **where, delta=text))
        if data.get("end"):
            out += self._close_thought(block)
        return out

    def _close_thought(self, block: int) -> list[Json]:
        index = self._thoughts.pop(block)
        item = self.output[index]
        out: list[Json] = []
        if item["summary"]:
            part = item["summary"][0]
            where = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            out.append(
                self._event("response.reasoning_summary_text.done", **where, text=part["text"])
            )
            out.append(self._event("response.reasoning_summary_part.done", **where, part=part))
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def _call_delta(self, data: Mapping[str, Any]) -> list[Json]:
        out = self._close_text()
        place = int(data["index"])
        if place not in self._calls:
            name = data.get("name")
            if name is None:
                return out
            if name not in self.tools.client:
                self._calls[place] = None  # the service runs it: not an output item
                return out
            index = len(self.output)
            item: Item = {
                "type": "function_call",
                "id": output_item_id("fc", self.run_id, self.segment, index),
                "call_id": str(data.get("tool_call_id") or ""),
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
            self.output.append(item)
            self._calls[place] = index
            out.append(self._event("response.output_item.added", output_index=index, item=item))
        at = self._calls[place]
        if at is None or not data["arguments"]:
            return out
        item = self.output[at]
        item["arguments"] += data["arguments"]
        out.append(
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=at,
                delta=data["arguments"],
            )
        )
        return out

    def _close_calls(self, pending: list[Mapping[str, Any]]) -> list[Json]:
        """The calls the run waits on, as their final items (ids and arguments as the run
        parsed them; a call whose pieces were not streamed is added here)."""
        out: list[Json] = []
        streamed = [i for i in self._calls.values() if i is not None]
        for n, call in enumerate(pending):
            arguments = _json_text(call["arguments"])
            if n < len(streamed):
                index = streamed[n]
                item = self.output[index]
            else:
                index = len(self.output)
                item = {
                    "type": "function_call",
                    "id": output_item_id("fc", self.run_id, self.segment, index),
                    "call_id": call["tool_call_id"],
                    "name": call["name"],
                    "arguments": "",
                    "status": "in_progress",
                }
                self.output.append(item)
                out.append(self._event("response.output_item.added", output_index=index, item=item))
            item |= {"call_id": call["tool_call_id"], "arguments": arguments, "status": "completed"}
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=call["name"],
                    arguments=arguments,
                )
            )
            out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def _mcp_call(self, data: Mapping[str, Any]) -> list[Json]:
        """A call of an MCP server's tool returned: its mcp_call item, whole (its output is the
        result's preview; the response read back has it all)."""
        call_id = str(data["tool_call_id"])
        named = self.tools.mcp_call(str(data["name"]))
        if named is None:
            return []
        index = len(self.output)
        item_id = output_item_id("mcp", self.run_id, self.segment, index)
        arguments = self._arguments.get(call_id)
        item = mcp_call_item(item_id, call_id, named, arguments, call_id in self._gated)
        self.output.append(item)
        where = {"item_id": item_id, "output_index": index}
        out = [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event("response.mcp_call.in_progress", **where),
            self._event("response.mcp_call_arguments.done", **where, arguments=item["arguments"]),
        ]
        item |= result_fields(data.get("preview", ""), bool(data.get("is_error")))
        ended = "response.mcp_call.failed" if item["error"] else "response.mcp_call.completed"
        out.append(self._event(ended, **where))
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def _approval_request(self, data: Mapping[str, Any]) -> list[Json]:
        call_id, name = str(data["tool_call_id"]), str(data["name"])
        item = approval_request_item(call_id, name, data.get("arguments"), self.tools)
        index = len(self.output)
        self.output.append(item)
        return [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event("response.output_item.done", output_index=index, item=item),
        ]


def _json_text(arguments: Any) -> str:
    return json.dumps(arguments, separators=(",", ":"))


_ENDINGS = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.failed",
}


def ended_stream(response: Json) -> list[Json]:
    """The stream of an ended response whose run events are gone (kept only for the event
    retention period): its creation and its end, as the journal has it."""
    created = {**response, "status": "in_progress", "output": [], "usage": None, "error": None}
    created["incomplete_details"] = None
    return [
        {"type": "response.created", "sequence_number": 0, "response": created},
        {"type": _ENDINGS[response["status"]], "sequence_number": 1, "response": response},
    ]
