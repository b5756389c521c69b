"""The journal as the AI SDK's UI messages: a chat's history as `useChat` is given it.

The same shapes as the UI message stream (app/api/ui_stream.py) renders a run into, so a
history loaded later looks like the answer streamed: one assistant message per run (its id is
the run's), a `step-start` part per model turn, reasoning before the text it led to, tool calls
as `tool-<name>` parts with their outputs. User messages keep their attachments as file parts.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from app.core.content import is_reasoning, is_redacted, reasoning_text
from app.core.entries import EntryKind, JournalEntry

# A redacted reasoning part (the provider encrypted it: no text) says so in its
# providerMetadata, which the AI SDK keeps on the part.
REDACTED = {"threadline": {"redacted": True}}
KINDS = (EntryKind.MESSAGE, EntryKind.TOOL_CALL, EntryKind.TOOL_RESULT)

UIMessage = dict[str, Any]
UIPart = dict[str, Any]


def ui_messages(
    entries: Sequence[JournalEntry],
    *,
    steering_parts: bool = True,
    waiting: Collection[str] = (),
) -> list[UIMessage]:
    """The UI messages of a chat's live entries (no rollback took them out), oldest first;
    entries of other kinds than KINDS are left out. A message steered into a run is a
    `steering-message` part of its answer, where it landed (`steering_parts`, as `ai` 7
    streams it; else it splits the answer). `waiting`: the ids of calls that wait for a
    person's approval, whose parts ask for it (as streamed, with the call's id as approval id)."""
    messages: list[UIMessage] = []
    answer: UIMessage | None = None  # the assistant message being put together
    calls: dict[str, UIPart] = {}  # the answer's tool parts by call id
    for entry in entries:
        role = entry.payload.get("role")
        steer_id = entry.refs.get("steer_id")
        if (
            steering_parts
            and steer_id is not None
            and answer is not None
            and answer["run"] == entry.refs.get("run_id")
        ):
            parts = _user_parts(entry.payload["content"])
            answer["parts"].append({"type": "steering-message", "id": steer_id, "parts": parts})
            continue
        if entry.kind == EntryKind.MESSAGE and role == "user":
            answer = None
            parts = _user_parts(entry.payload["content"])
            messages.append({"id": entry.id, "role": "user", "parts": parts})
            continue
        if entry.kind not in KINDS or (entry.kind == EntryKind.MESSAGE and role != "assistant"):
            continue
        run_id = entry.refs.get("run_id") or entry.id
        if answer is None or answer["run"] != run_id:
            # A message steered into a run splits its answer: the part after it gets an id
            # of its own (ids are unique in a chat).
            ids = {m["id"] for m in messages}
            answer_id = run_id if run_id not in ids else f"{run_id}:{entry.seq}"
            answer = {"id": answer_id, "role": "assistant", "parts": [], "run": run_id}
            calls = {}
            messages.append(answer)
        if entry.kind == EntryKind.MESSAGE:
            answer["parts"] += [{"type": "step-start"}, *_answer_parts(entry.payload["content"])]
        elif entry.kind == EntryKind.TOOL_CALL:
            call_id = str(entry.refs.get("tool_call_id", entry.id))
            calls[call_id] = {
                "type": f"tool-{entry.payload['name']}",
                "toolCallId": call_id,
                "state": "input-available",
                "input": entry.payload.get("arguments"),
            }
            if call_id in waiting:
                calls[call_id] |= {"state": "approval-requested", "approval": {"id": call_id}}
            answer["parts"].append(calls[call_id])
        elif (call := calls.get(str(entry.refs.get("tool_call_id")))) is not None:
            output = entry.payload.get("content")
            if entry.payload.get("is_error"):
                text = output if isinstance(output, str) else str(output)
                call.update(state="output-error", errorText=text)
            else:
                call.update(state="output-available", output=output)
    for message in messages:
        message.pop("run", None)
    return messages


def _user_parts(content: str | list[dict[str, Any]]) -> list[UIPart]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[UIPart] = []
    for part in content:
        if part["type"] == "text":
            parts.append({"type": "text", "text": part["text"]})
        elif part["type"] in ("document", "image_url"):
            url = part["url"]
            media_type = url[5 : url.find(";")] if url.startswith("data:") else "image/*"
            file: UIPart = {"type": "file", "mediaType": media_type, "url": url}
            if isinstance(part.get("filename"), str):
                file["filename"] = part["filename"]
            parts.append(file)
    return parts


def _answer_parts(content: str | list[dict[str, Any]]) -> list[UIPart]:
    if isinstance(content, str):
        return [{"type": "text", "text": content, "state": "done"}] if content else []
    parts: list[UIPart] = []
    for part in content:
        if is_reasoning(part):
            reasoning: UIPart = {"type": "reasoning", "text": reasoning_text(part), "state": "done"}
            if is_redacted(part):
                reasoning["providerMetadata"] = REDACTED
            parts.append(reasoning)
        elif part["type"] == "text" and part["text"]:
            parts.append({"type": "text", "text": part["text"], "state": "done"})
    return parts
