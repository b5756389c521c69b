"""Responses items and journal entries, each way; response and conversation ids."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.entries import EntryKind, JournalEntry
from app.openai_api.items import (
    ItemError,
    NewItem,
    ToolOutputItem,
    conversation_id,
    entry_item,
    parse_conversation_id,
    parse_input,
    parse_response_id,
    response_id,
)
from tests.documents import PDF_PART

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.uuids(), st.integers(min_value=0, max_value=10**8))
def test_response_ids_round_trip(run: uuid.UUID, segment: int) -> None:
    assert parse_response_id(response_id(str(run), segment)) == (str(run), segment)


@given(st.uuids())
def test_conversation_ids_round_trip(session: uuid.UUID) -> None:
    assert parse_conversation_id(conversation_id(str(session))) == str(session)
    assert parse_conversation_id(str(session)) == str(session)  # a session id is one too


@given(st.text(max_size=50))
def test_other_ids_are_no_ids(text: str) -> None:
    parsed = parse_response_id(text)
    assert parsed is None or response_id(*parsed) == text
    session = parse_conversation_id(text)
    assert session is None or uuid.UUID(session)


@given(json_values)
def test_any_input_is_taken_or_refused_with_the_place_named(value: Any) -> None:
    try:
        parse_input(value)
    except ItemError as error:
        assert error.param.startswith("input") and error.message


@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "assistant", "system"]), st.text(max_size=20)),
        min_size=1,
        max_size=5,
    ),
    st.text(min_size=1, max_size=20),
)
def test_messages_become_entries_and_read_back_as_the_same_items(
    history: list[tuple[str, str]], question: str
) -> None:
    items = [{"type": "message", "role": r, "content": t} for r, t in history]
    given_input = parse_input([*items, {"role": "user", "content": question}])
    assert given_input.content == question
    for item, entry in zip(items, given_input.before, strict=True):
        read = entry_item(JournalEntry(1, entry.kind, entry.payload, entry.refs), "msg_1")
        assert read is not None
        assert read["role"] == item["role"]
        assert read["content"][0]["text"] == item["content"]


def test_function_calls_and_outputs() -> None:
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'}
    parsed = parse_input([call, {"role": "user", "content": "go on"}])
    assert parsed.before == (
        NewItem(EntryKind.TOOL_CALL, {"name": "f", "arguments": {"a": 1}}, {"tool_call_id": "c1"}),
    )
    outputs = parse_input([{"type": "function_call_output", "call_id": "c1", "output": "3"}])
    assert outputs.content is None and outputs.tool_outputs == (ToolOutputItem("c1", "3"),)
    read = entry_item(
        JournalEntry(4, "tool_call", {"name": "f", "arguments": {"a": 1}}, {"tool_call_id": "c1"}),
        "fc_4",
    )
    assert (
        read is not None and json.loads(read["arguments"]) == {"a": 1} and read["call_id"] == "c1"
    )


def test_an_input_file_is_a_document_part_and_reads_back_as_one() -> None:
    pdf_data = PDF_PART["url"]
    bare = pdf_data.partition(",")[2]
    parsed = parse_input(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Summarize"},
                    {"type": "input_file", "file_data": pdf_data, "filename": "report.pdf"},
                    {"type": "input_file", "file_data": bare, "filename": "Scan.PDF"},
                ],
            }
        ]
    )
    assert parsed.content == [
        {"type": "text", "text": "Summarize"},
        {"type": "document", "url": pdf_data, "filename": "report.pdf"},
        {"type": "document", "url": pdf_data, "filename": "Scan.PDF"},
    ]
    payload = {"role": "user", "content": parsed.content}
    entry = JournalEntry(seq=1, kind=EntryKind.MESSAGE, payload=payload)
    read = entry_item(entry, "msg_1")
    assert read is not None and read["content"][1] == {
        "type": "input_file",
        "file_data": pdf_data,
        "filename": "report.pdf",
    }


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ([], "input"),
        ([{"role": "assistant", "content": "hi"}], "input[0]"),
        (
            [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
            "input[0].content[0].file_data",
        ),
        (
            [{"role": "user", "content": [{"type": "input_file", "file_data": "JVBERi0="}]}],
            "input[0].content[0].file_data",
        ),
        (
            [{"role": "user", "content": [{"type": "input_video", "url": "x"}]}],
            "input[0].content[0].type",
        ),
        (
            [
                {"type": "function_call_output", "call_id": "c", "output": "y"},
                {"role": "user", "content": "x"},
            ],
            "input",
        ),
        (
            [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"},
                {"role": "user", "content": "x"},
            ],
            "input[0].arguments",
        ),
        ([{"role": "tool", "content": "x"}], "input[0].role"),
        (["text"], "input[0]"),
    ],
)
def test_refused_input_names_its_place(value: Any, param: str) -> None:
    with pytest.raises(ItemError) as refused:
        parse_input(value)
    assert refused.value.param == param


def test_an_assistant_message_with_thinking_reads_as_its_text() -> None:
    """Reasoning parts (Anthropic's thinking) are no message content in OpenAI's shape: listing
    such a session's items raised KeyError (a 500) before they were left out."""
    payload = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Let me see.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Four."},
        ],
    }
    read = entry_item(JournalEntry(2, EntryKind.MESSAGE, payload, {}), "msg_2")
    assert read is not None
    assert read["content"] == [
        {"type": "output_text", "text": "Four.", "annotations": [], "logprobs": []}
    ]
