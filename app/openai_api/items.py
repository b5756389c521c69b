"""OpenAI Responses items and Threadline journal entries, each way; and the ids of responses
and conversations. Pure: no I/O.

A conversation is a session (`conv_<session id hex>`); a response is a run, or, once a run
waited for client-side tool outputs, the part of the run after one wait (`resp_<run id hex>`
for the first part, `resp_<run id hex>_<n>` for the part after the n-th wait). Ids round-trip
without a lookup table.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.content import is_reasoning, reasoning_opaque, reasoning_text
from app.core.entries import EntryKind, JournalEntry
from app.core.mcp import split_name
from app.core.messages import result_text

Item = dict[str, Any]
MAX_INPUT_ITEMS = 1000  # a request's input items; input_items reads this far back

_RESPONSE_ID = re.compile(r"^resp_([0-9a-f]{32})(?:_([1-9][0-9]{0,8}))?$")
_CONVERSATION_ID = re.compile(r"^conv_([0-9a-f]{32})$")
_APPROVAL_PREFIX = "mcpr_"


def response_id(run_id: str, segment: int = 0) -> str:
    hexed = uuid.UUID(run_id).hex
    return f"resp_{hexed}" if segment == 0 else f"resp_{hexed}_{segment}"


def parse_response_id(text: str) -> tuple[str, int] | None:
    """(run id, segment) of a response id, None for what no response id is."""
    match = _RESPONSE_ID.fullmatch(text)
    if match is None:
        return None
    return str(uuid.UUID(match.group(1))), int(match.group(2) or 0)


def conversation_id(session_id: str) -> str:
    return f"conv_{uuid.UUID(session_id).hex}"


def parse_conversation_id(text: str) -> str | None:
    """The session id of a conversation id (a session's own id is accepted too)."""
    match = _CONVERSATION_ID.fullmatch(text)
    if match is not None:
        return str(uuid.UUID(match.group(1)))
    try:
        return str(uuid.UUID(text)) if len(text) == 36 else None
    except ValueError:
        return None


def output_item_id(prefix: str, run_id: str, segment: int, index: int) -> str:
    """The id of a response's output item: the same whether it is streamed or read back."""
    return f"{prefix}_{uuid.UUID(run_id).hex}_{segment}_{index}"


def approval_request_id(tool_call_id: str) -> str:
    """An mcp_approval_request's id: the call's own."""
    return f"{_APPROVAL_PREFIX}{tool_call_id}"


def approved_call_id(approval_request_id: str) -> str | None:
    """The tool call an approval request id names (None: no approval request id)."""
    if not approval_request_id.startswith(_APPROVAL_PREFIX):
        return None
    return approval_request_id[len(_APPROVAL_PREFIX) :] or None


def entry_item_id(prefix: str, session_id: str, seq: int) -> str:
    """The id of a conversation item: its place in the session."""
    return f"{prefix}_{uuid.UUID(session_id).hex}_{seq}"


# --- Input items -> entries ---------------------------------------------------------------


class ItemError(ValueError):
    """An input item Threadline cannot take; `param` is where, as OpenAI names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


@dataclass(frozen=True)
class NewItem:
    """An input item as a journal entry to append: kind, payload, refs."""

    kind: EntryKind
    payload: dict[str, Any]
    refs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolOutputItem:
    call_id: str
    output: Any


@dataclass(frozen=True)
class ApprovalItem:
    """An mcp_approval_response: a person's ruling on a call the previous response asked
    about."""

    approval_request_id: str
    approve: bool
    reason: str | None


@dataclass(frozen=True)
class Input:
    """A request's input: entries before the new user message, the new user message's content
    (None: the input answers the previous response's function calls or approval requests),
    function call outputs, and approval responses."""

    before: tuple[NewItem, ...]
    content: str | list[dict[str, Any]] | None
    tool_outputs: tuple[ToolOutputItem, ...]
    approvals: tuple[ApprovalItem, ...] = ()


_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def parse_input(value: Any, param: str = "input") -> Input:
    """The request's `input` (a string, or a list of items). A list must end with a user
    message (the question), or be function_call_output items only (answers to the previous
    response's function calls), or mcp_approval_response items only (rulings on its
    approval requests)."""
    if isinstance(value, str):
        return Input((), value, ())
    items = parse_items(value, param)
    approvals = tuple(i for i in items if isinstance(i, ApprovalItem))
    outputs = tuple(i for i in items if isinstance(i, ToolOutputItem))
    for answers, what in (
        (approvals, "mcp_approval_response items answer the previous response's approval requests"),
        (outputs, "function_call_output items answer the previous response's function calls"),
    ):
        if answers and len(answers) != len(items):
            raise ItemError(param, f"{what}: send them alone, without other items")
    if approvals or outputs:
        return Input((), None, outputs, approvals)
    last = items[-1]
    assert isinstance(last, NewItem)
    if last.kind != EntryKind.MESSAGE or last.payload["role"] != "user":
        raise ItemError(
            f"{param}[{len(items) - 1}]",
            "the last input item must be a user message: Threadline answers a user's message",
        )
    before = tuple(i for i in items[:-1] if isinstance(i, NewItem))
    return Input(before, last.payload["content"], ())


def parse_items(value: Any, param: str) -> list[NewItem | ToolOutputItem | ApprovalItem]:
    """Items (messages, function calls and their outputs) as entries to append."""
    if not isinstance(value, list) or not value:
        raise ItemError(param, f"{param} must be a string or a non-empty list of items")
    if len(value) > MAX_INPUT_ITEMS:
        raise ItemError(param, f"at most {MAX_INPUT_ITEMS} items")
    return [_item(item, f"{param}[{i}]") for i, item in enumerate(value)]


def _item(item: Any, param: str) -> NewItem | ToolOutputItem | ApprovalItem:
    if not isinstance(item, Mapping):
        raise ItemError(param, "an item must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = _ROLES.get(str(item.get("role")))
        if role is None:
            raise ItemError(f"{param}.role", "role must be user, assistant, system or developer")
        return NewItem(EntryKind.MESSAGE, {"role": role, "content": _content(item, param)})
    if kind == "function_call":
        call_id = _text(item, "call_id", param)
        name = _text(item, "name", param)
        try:
            arguments = json.loads(_text(item, "arguments", param))
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ItemError(f"{param}.arguments", "arguments must be a JSON object, as text")
        payload = {"name": name, "arguments": arguments}
        return NewItem(EntryKind.TOOL_CALL, payload, {"tool_call_id": call_id})
    if kind == "function_call_output":
        call_id = _text(item, "call_id", param)
        if "output" not in item:
            raise ItemError(f"{param}.output", "output is required")
        output = item["output"]
        if isinstance(output, list):  # content parts: their text
            output = "".join(str(p.get("text", "")) for p in output if isinstance(p, Mapping))
        return ToolOutputItem(call_id, output)
    if kind == "mcp_approval_response":
        request_id = _text(item, "approval_request_id", param)
        approve = item.get("approve")
        if not isinstance(approve, bool):
            raise ItemError(f"{param}.approve", "approve must be true or false")
        reason = item.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ItemError(f"{param}.reason", "reason must be a string")
        return ApprovalItem(request_id, approve, reason or None)
    raise ItemError(
        f"{param}.type",
        f"item type {kind!r} is not supported: send message, function_call, "
        "function_call_output or mcp_approval_response items",
    )


def _text(item: Mapping[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ItemError(f"{param}.{key}", f"{key} must be a non-empty string")
    return value


def _content(item: Mapping[str, Any], param: str) -> str | list[dict[str, Any]]:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ItemError(f"{param}.content", "content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        where = f"{param}.content[{i}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"type": "image_url", "url": part["image_url"]}
            if part.get("detail") in ("auto", "low", "high"):
                image["detail"] = part["detail"]
            parts.append(image)
        elif kind == "input_image":
            raise ItemError(
                f"{where}.image_url", "images are given by image_url (file_id is not supported)"
            )
        elif kind == "input_file":
            parts.append(_document(part, where))
        else:
            raise ItemError(
                f"{where}.type",
                f"content part {kind!r} is not supported: input_text, output_text, input_image "
                "or input_file",
            )
    if all(p["type"] == "text" for p in parts) and len(parts) == 1:
        return str(parts[0]["text"])
    return parts


# A file's type, where file_data is bare base64: by its name's extension.
_FILE_TYPES = {".pdf": "application/pdf", ".txt": "text/plain", ".md": "text/plain"}


def _document(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An input_file part (file_data inline, with its filename) as a document part; its bytes
    are checked where every document is."""
    data = part.get("file_data")
    if not isinstance(data, str) or not data:
        raise ItemError(
            f"{where}.file_data",
            "files are given by file_data, a base64 data URL (file_id and file_url are not "
            "supported)",
        )
    filename = part.get("filename")
    if filename is not None and (not isinstance(filename, str) or not filename):
        raise ItemError(f"{where}.filename", "filename must be a non-empty string")
    if not data.startswith("data:"):
        extension = "." + str(filename or "").rpartition(".")[2].lower()
        media_type = _FILE_TYPES.get(extension)
        if media_type is None:
            raise ItemError(
                f"{where}.file_data",
                "file_data is a data URL (data:application/pdf;base64,...), or base64 with a "
                "filename ending .pdf, .txt or .md",
            )
        data = f"data:{media_type};base64,{data}"
    document: dict[str, Any] = {"type": "document", "url": data}
    return document if filename is None else {**document, "filename": filename}


# --- Entries -> items ---------------------------------------------------------------------


def entry_item(entry: JournalEntry, item_id: str) -> Item | None:
    """The item an entry is (None: the entry is no item, e.g. a run's bookkeeping)."""
    payload = entry.payload
    if entry.kind == EntryKind.MESSAGE:
        role = payload["role"]
        text_type = "output_text" if role == "assistant" else "input_text"
        content = payload["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        out_parts: list[Item] = []
        for part in parts:
            if is_reasoning(part):
                # Reasoning is not a message part in OpenAI's shape; the message keeps its text.
                continue
            if part["type"] == "text":
                text_part: Item = {"type": text_type, "text": part["text"]}
                if role == "assistant":
                    text_part |= {"annotations": [], "logprobs": []}
                out_parts.append(text_part)
            elif part["type"] == "document":
                document: Item = {"type": "input_file", "file_data": part["url"]}
                if part.get("filename"):
                    document["filename"] = part["filename"]
                out_parts.append(document)
            else:
                out_parts.append(
                    {
                        "type": "input_image",
                        "image_url": part["url"],
                        "detail": part.get("detail") or "auto",
                    }
                )
        status = "incomplete" if payload.get("status") == "incomplete" else "completed"
        return {
            "type": "message",
            "id": item_id,
            "role": role,
            "status": status,
            "content": out_parts,
        }
    if entry.kind == EntryKind.TOOL_CALL:
        return {
            "type": "function_call",
            "id": item_id,
            "call_id": entry.refs.get("tool_call_id", ""),
            "name": payload["name"],
            "arguments": json.dumps(payload.get("arguments") or {}, separators=(",", ":")),
            "status": "completed",
        }
    if entry.kind == EntryKind.TOOL_RESULT:
        content = payload.get("content")
        return {
            "type": "function_call_output",
            "id": item_id,
            "call_id": entry.refs.get("tool_call_id", ""),
            "output": content if isinstance(content, str) else json.dumps(content),
            "status": "completed",
        }
    return None


ITEM_PREFIX = {
    EntryKind.MESSAGE: "msg",
    EntryKind.TOOL_CALL: "fc",
    EntryKind.TOOL_RESULT: "fco",
}


def conversation_items(session_id: str, entries: Sequence[JournalEntry]) -> list[Item]:
    """A session's entries as conversation items (messages, function calls and outputs; an
    assistant message's reasoning blocks as reasoning items before it, their text as the
    summary, never their opaque content)."""
    out = []
    for entry in entries:
        prefix = ITEM_PREFIX.get(EntryKind(entry.kind))
        if prefix is None:
            continue
        content = entry.payload.get("content")
        if prefix == "msg" and isinstance(content, list):
            thoughts = [part for part in content if is_reasoning(part)]
            rs = entry_item_id("rs", session_id, entry.seq)
            out += [reasoning_item(f"{rs}_{n}", reasoning_text(t)) for n, t in enumerate(thoughts)]
        item = entry_item(entry, entry_item_id(prefix, session_id, entry.seq))
        if item is not None:
            out.append(item)
    return out


# --- A run as responses -------------------------------------------------------------------


@dataclass(frozen=True)
class RunTools:
    """What a run's tool calls are to the Responses API: calls of the client's tools are
    function_call items, calls of an MCP server's tools (`mcp_servers`: their labels) are
    mcp_call items, calls the service runs itself are no items. `gated`: the ids of the calls
    that waited for a person's approval (an mcp_approval_request item each)."""

    client: frozenset[str] = frozenset()
    mcp_servers: frozenset[str] = frozenset()
    gated: frozenset[str] = frozenset()
    ruled: frozenset[str] = frozenset()  # those of `gated` a person ruled on (or that expired)

    def mcp_call(self, name: str) -> tuple[str, str] | None:
        """(server label, tool) of a call of an MCP server's tool, else None."""
        return None if name in self.client else split_name(name, self.mcp_servers)


@dataclass(frozen=True)
class Segment:
    """One response of a run: the entries it took as input, and those it wrote."""

    inputs: tuple[JournalEntry, ...]
    outputs: tuple[JournalEntry, ...]
    answered: bool  # the calls it ended with were answered or ruled on (a later segment exists)
    calls: Mapping[str, JournalEntry] = field(default_factory=dict)  # the run's, by call id


def segments(run_entries: Sequence[JournalEntry], tools: RunTools) -> list[Segment]:
    """Split a run's entries (its user message first) where the run waited: at each batch
    of outputs of client-side tool calls (the n-th batch is the input of the response after
    the n-th wait), and before the first result of calls that waited for approval (the
    response after the wait writes them)."""
    calls = {
        str(e.refs.get("tool_call_id")): e for e in run_entries if e.kind == EntryKind.TOOL_CALL
    }

    def from_client(entry: JournalEntry) -> bool:
        call = calls.get(str(entry.refs.get("tool_call_id")))
        return (
            entry.kind == EntryKind.TOOL_RESULT
            and call is not None
            and call.payload.get("name") in tools.client
        )

    found: list[Segment] = []
    inputs: list[JournalEntry] = []
    outputs: list[JournalEntry] = []

    def waited(entry: JournalEntry) -> bool:
        """The result of a call this segment asked approval for: the wait ended here."""
        call_id = entry.refs.get("tool_call_id")
        return (
            entry.kind == EntryKind.TOOL_RESULT
            and call_id in tools.gated
            and any(
                o.kind == EntryKind.TOOL_CALL and o.refs.get("tool_call_id") == call_id
                for o in outputs
            )
        )

    for entry in run_entries:
        if from_client(entry):
            if outputs:  # the first output of a batch: the response before it has ended
                found.append(Segment(tuple(inputs), tuple(outputs), True, calls))
                inputs, outputs = [], []
            inputs.append(entry)
        elif waited(entry):
            found.append(Segment(tuple(inputs), tuple(outputs), True, calls))
            inputs, outputs = [], [entry]
        elif not found and not outputs and _is_user_message(entry):
            inputs.append(entry)  # the question the run answers
        else:
            outputs.append(entry)
    if _wait_ended(outputs, tools):  # ruled on, their results still to come: the next one
        found.append(Segment(tuple(inputs), tuple(outputs), True, calls))
        inputs, outputs = [], []
    found.append(Segment(tuple(inputs), tuple(outputs), False, calls))
    return found


def _wait_ended(outputs: Sequence[JournalEntry], tools: RunTools) -> bool:
    """The segment ends with calls that waited for approval, all ruled on."""
    answered = {e.refs.get("tool_call_id") for e in outputs if e.kind == EntryKind.TOOL_RESULT}
    waited = [
        e.refs.get("tool_call_id")
        for e in outputs
        if e.kind == EntryKind.TOOL_CALL
        and e.refs.get("tool_call_id") in tools.gated
        and e.refs.get("tool_call_id") not in answered
    ]
    return bool(waited) and all(call_id in tools.ruled for call_id in waited)


def _is_user_message(entry: JournalEntry) -> bool:
    return entry.kind == EntryKind.MESSAGE and entry.payload.get("role") == "user"


def output_items(
    run_id: str,
    segment: int,
    part: Segment,
    tools: RunTools,
    *,
    encrypted: bool = False,
) -> list[Item]:
    """What a response wrote, as its `output`: the model's reasoning (a reasoning item per
    block, before the message it belongs to, as streamed), assistant messages (not empty ones),
    the calls of client-side tools, an mcp_call item per call of an MCP server's tool (where
    its result is), and last, an mcp_approval_request item per call the response ended
    waiting on. Calls the service ran itself (built-in and webhook tools) and their results
    stay in the journal: the client has nothing to do with them. `encrypted`: reasoning items
    carry the provider's opaque content (`include` reasoning.encrypted_content)."""
    out: list[Item] = []
    answered = {e.refs.get("tool_call_id") for e in part.outputs if e.kind == EntryKind.TOOL_RESULT}
    asked: list[JournalEntry] = []
    for entry in part.outputs:
        if entry.kind == EntryKind.MESSAGE and entry.payload.get("role") == "assistant":
            out += _answer_items(entry, run_id, segment, len(out), encrypted)
            continue
        if entry.kind == EntryKind.TOOL_CALL:
            call_id = entry.refs.get("tool_call_id")
            if call_id in tools.gated and call_id not in answered:
                asked.append(entry)
            elif entry.payload.get("name") in tools.client:
                item = entry_item(entry, output_item_id("fc", run_id, segment, len(out)))
                assert item is not None
                out.append(item)
            continue
        if entry.kind == EntryKind.TOOL_RESULT:
            call = part.calls.get(str(entry.refs.get("tool_call_id")))
            named = tools.mcp_call(str(call.payload.get("name"))) if call is not None else None
            if call is not None and named is not None:
                call_id = str(entry.refs.get("tool_call_id"))
                item_id = output_item_id("mcp", run_id, segment, len(out))
                arguments = call.payload.get("arguments")
                item = mcp_call_item(item_id, call_id, named, arguments, call_id in tools.gated)
                payload = entry.payload
                out.append(
                    item | result_fields(payload.get("content"), bool(payload.get("is_error")))
                )
    out += [
        approval_request_item(
            str(e.refs.get("tool_call_id")),
            str(e.payload.get("name")),
            e.payload.get("arguments"),
            tools,
        )
        for e in asked
    ]
    return out


def mcp_call_item(
    item_id: str, call_id: str, named: tuple[str, str], arguments: Any, gated: bool
) -> Item:
    """An MCP tool's call as an mcp_call item, before its result (`result_fields`)."""
    return {
        "type": "mcp_call",
        "id": item_id,
        "server_label": named[0],
        "name": named[1],
        "arguments": json.dumps(arguments or {}, separators=(",", ":")),
        "approval_request_id": approval_request_id(call_id) if gated else None,
        "output": None,
        "error": None,
        "status": "in_progress",
    }


def result_fields(content: Any, is_error: bool) -> Item:
    """An mcp_call's ending: its output (the result as the model read it), or its error."""
    text = result_text(content)
    if is_error:
        error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": text}]}
        return {"output": None, "error": error, "status": "failed"}
    return {"output": text, "error": None, "status": "completed"}


def approval_request_item(call_id: str, name: str, arguments: Any, tools: RunTools) -> Item:
    """A call that waits for a person's ruling as an mcp_approval_request item (its id is the
    one an mcp_approval_response answers). A Threadline tool's call (a built-in or webhook
    tool the session's policy gates) is named as a tool of the server `threadline`."""
    server, tool = tools.mcp_call(name) or ("threadline", name)
    return {
        "type": "mcp_approval_request",
        "id": approval_request_id(call_id),
        "server_label": server,
        "name": tool,
        "arguments": json.dumps(arguments or {}, separators=(",", ":")),
    }


def reasoning_item(item_id: str, text: str, opaque: str | None = None) -> Item:
    """A reasoning block as the Responses API's reasoning item: its text as the summary (none
    for reasoning the provider encrypted); `opaque` as encrypted_content, when included."""
    item: Item = {"type": "reasoning", "id": item_id, "summary": []}
    if text:
        item["summary"] = [{"type": "summary_text", "text": text}]
    if opaque is not None:
        item["encrypted_content"] = opaque
    return item


def _answer_items(
    entry: JournalEntry, run_id: str, segment: int, at: int, encrypted: bool
) -> list[Item]:
    """An assistant message as items in the order the stream showed them: each reasoning block
    where it stands, the message (all its text) where its text begins; no message item
    without text."""
    content = entry.payload["content"]
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    out: list[Item] = []
    message_at: int | None = None
    for part in parts:
        if is_reasoning(part):
            item_id = output_item_id("rs", run_id, segment, at + len(out))
            opaque = reasoning_opaque(part) if encrypted else None
            out.append(reasoning_item(item_id, reasoning_text(part), opaque))
        elif message_at is None and part.get("type") == "text" and part.get("text"):
            message_at = len(out)
            out.append({})  # the message's place, filled below
    if message_at is not None:
        item = entry_item(entry, output_item_id("msg", run_id, segment, at + message_at))
        assert item is not None
        out[message_at] = item
    return out


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")


def output_text(items: Sequence[Item]) -> str:
    return "".join(
        part["text"]
        for item in items
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
