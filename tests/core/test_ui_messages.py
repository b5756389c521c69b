"""The journal as UI messages (app/core/ui_messages.py): per run one assistant message, parts
in their order, attachments as file parts, a failed tool as an error part."""

from __future__ import annotations

from typing import Any

from app.core.entries import JournalEntry
from app.core.ui_messages import REDACTED, ui_messages

PDF_URL = "data:application/pdf;base64,JVBERi0="
PNG_URL = "data:image/png;base64,iVBORw0KGgo="


def entry(seq: int, kind: str, payload: dict[str, Any], **refs: str) -> JournalEntry:
    return JournalEntry(seq, kind, payload, refs, id=f"e{seq}")


def test_runs_turns_reasoning_tools_and_attachments() -> None:
    question = [
        {"type": "document", "url": PDF_URL, "filename": "plan.pdf"},
        {"type": "text", "text": "Summarize"},
        {"type": "image_url", "url": PNG_URL},
    ]
    thinking = [
        {"type": "thinking", "thinking": "Look it up.", "signature": "s"},
        {"type": "redacted_thinking", "data": "d"},
        {"type": "text", "text": "Checking."},
    ]
    entries = [
        entry(1, "message", {"role": "user", "content": question}),
        entry(2, "run_start", {"run_id": "r1"}, run_id="r1"),
        entry(3, "message", {"role": "assistant", "content": thinking}, run_id="r1"),
        entry(
            4,
            "tool_call",
            {"name": "search", "arguments": {"q": "x"}},
            run_id="r1",
            tool_call_id="t1",
        ),
        entry(
            5,
            "tool_result",
            {"name": "search", "content": "down", "is_error": True},
            run_id="r1",
            tool_call_id="t1",
        ),
        entry(6, "message", {"role": "assistant", "content": "A plan."}, run_id="r1"),
        entry(7, "message", {"role": "user", "content": "Thanks"}),
        entry(8, "message", {"role": "assistant", "content": "Welcome."}, run_id="r2"),
    ]
    messages = ui_messages(entries)
    assert [(m["id"], m["role"]) for m in messages] == [
        ("e1", "user"),
        ("r1", "assistant"),
        ("e7", "user"),
        ("r2", "assistant"),
    ]
    assert messages[0]["parts"] == [
        {"type": "file", "mediaType": "application/pdf", "url": PDF_URL, "filename": "plan.pdf"},
        {"type": "text", "text": "Summarize"},
        {"type": "file", "mediaType": "image/png", "url": PNG_URL},
    ]
    assert messages[1]["parts"] == [
        {"type": "step-start"},
        {"type": "reasoning", "text": "Look it up.", "state": "done"},
        {"type": "reasoning", "text": "", "state": "done", "providerMetadata": REDACTED},
        {"type": "text", "text": "Checking.", "state": "done"},
        {
            "type": "tool-search",
            "toolCallId": "t1",
            "state": "output-error",
            "input": {"q": "x"},
            "errorText": "down",
        },
        {"type": "step-start"},
        {"type": "text", "text": "A plan.", "state": "done"},
    ]
    assert messages[3]["parts"] == [
        {"type": "step-start"},
        {"type": "text", "text": "Welcome.", "state": "done"},
    ]


def test_a_message_steered_into_a_run_splits_its_answer_with_unique_ids() -> None:
    entries = [
        entry(1, "message", {"role": "user", "content": "Count"}),
        entry(2, "message", {"role": "assistant", "content": "One."}, run_id="r1"),
        entry(3, "message", {"role": "user", "content": "Faster"}),
        entry(4, "message", {"role": "assistant", "content": "Two, three."}, run_id="r1"),
    ]
    messages = ui_messages(entries)
    assert [(m["id"], m["role"]) for m in messages] == [
        ("e1", "user"),
        ("r1", "assistant"),
        ("e3", "user"),
        ("r1:4", "assistant"),
    ]


def test_reasoning_of_every_provider_shows_its_readable_text() -> None:
    item = {
        "type": "reasoning",
        "id": "rs_1",
        "encrypted_content": "opaque",
        "summary": [
            {"type": "summary_text", "text": "Plan."},
            {"type": "summary_text", "text": "Go."},
        ],
    }
    compat = {"type": "reasoning_text", "text": "Hmm."}
    content = [item, compat, {"type": "text", "text": "Done."}]
    entries = [
        entry(1, "message", {"role": "user", "content": "Go"}),
        entry(2, "message", {"role": "assistant", "content": content}, run_id="r1"),
    ]
    assert ui_messages(entries)[1]["parts"] == [
        {"type": "step-start"},
        {"type": "reasoning", "text": "Plan.\n\nGo.", "state": "done"},
        {"type": "reasoning", "text": "Hmm.", "state": "done"},
        {"type": "text", "text": "Done.", "state": "done"},
    ]
