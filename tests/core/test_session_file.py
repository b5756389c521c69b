"""The session file format: line splitting within a bound, line parsing, the thread's checks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.session_file import (
    EndLine,
    EntryLine,
    FileProblem,
    LineSplitter,
    LineTooLong,
    ThreadCheck,
    check_header,
    encode,
    entry_line,
    header_line,
    parse_line,
)

WHEN = datetime(2026, 11, 28, 12, tzinfo=UTC)


@given(
    lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=8),
    cuts=st.lists(st.integers(1, 30), max_size=20),
)
def test_lines_come_back_whatever_the_chunking(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    chunks, start = [], 0
    for cut in cuts:
        chunks.append(data[start : start + cut])
        start += cut
    chunks.append(data[start:])
    splitter = LineSplitter(max_line=64)
    got = [line for chunk in chunks for line in splitter.feed(chunk)]
    assert [*got, *splitter.rest()] == lines


def test_a_long_line_is_refused_before_its_end_arrives() -> None:
    splitter = LineSplitter(max_line=10)
    assert list(splitter.feed(b"short\n")) == [b"short"]
    with pytest.raises(LineTooLong) as refused:
        list(splitter.feed(b"x" * 11))  # no newline yet: the rest is never needed
    assert refused.value.line == 2 and refused.value.code == "line_too_long"
    whole = LineSplitter(max_line=10)
    with pytest.raises(LineTooLong):
        list(whole.feed(b"y" * 11 + b"\n"))


def test_a_line_of_the_maximum_length_is_read() -> None:
    splitter = LineSplitter(max_line=10)
    assert list(splitter.feed(b"z" * 10)) == []
    assert list(splitter.feed(b"\n")) == [b"z" * 10]


def entry(seq: int, kind: str = "message", **refs: str) -> EntryLine:
    line = entry_line(seq, f"e{seq}", kind, {}, refs, 0, WHEN)
    parsed = parse_line(encode(line), seq + 1)
    assert isinstance(parsed, EntryLine)
    return parsed


def test_encoded_lines_parse_back() -> None:
    head = parse_line(encode(header_line({"title": "t", "config": {}})), 1)
    assert check_header(head).session.title == "t"
    assert entry(3).created_at == WHEN and entry(3).seq == 3


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", "blank_line"),
        (b"   \t", "blank_line"),
        (b"{", "invalid_json"),
        (b"[1]", "unknown_line"),
        (b'{"type": "note"}', "unknown_line"),
        (b'{"type": "end", "entries": -1}', "invalid_end_line"),
        (b'{"type": "end", "entries": "1"}', "invalid_end_line"),
        (b'{"type": "end", "entries": 1, "more": 2}', "invalid_end_line"),
        (b'{"type": "memory", "namespace": "\\udc00", "content": ""}', "invalid_unicode"),
        (b'{"type": "\xff"}', "invalid_unicode"),
    ],
)
def test_unreadable_lines_say_why(raw: bytes, code: str) -> None:
    with pytest.raises(FileProblem) as refused:
        parse_line(raw, 7)
    assert refused.value.code == code and refused.value.details["line"] == 7


def test_the_header_must_be_this_format_and_version() -> None:
    other = header_line({}) | {"version": 2}
    with pytest.raises(FileProblem) as refused:
        check_header(parse_line(encode(other), 1))
    assert refused.value.code == "unsupported_version"
    assert refused.value.details["supported"] == [1]
    with pytest.raises(FileProblem) as not_one:
        check_header(entry(1))
    assert not_one.value.code == "not_a_session_file"


def test_seqs_run_densely_from_one() -> None:
    check = ThreadCheck()
    check.accept(entry(1), 2)
    check.accept(entry(2), 3)
    for seq in (2, 1, 4):
        with pytest.raises(FileProblem) as refused:
            check.accept(entry(seq), 4)
        assert refused.value.code == "seq_not_dense"
        assert refused.value.details["expected"] == 3


def test_a_tool_result_answers_an_earlier_call() -> None:
    check = ThreadCheck()
    with pytest.raises(FileProblem) as refused:
        check.accept(entry(1, "tool_result", tool_call_id="t1"), 2)
    assert refused.value.code == "tool_result_without_call"
    check.accept(entry(1, "tool_call", tool_call_id="t1"), 2)
    check.accept(entry(2, "tool_result", tool_call_id="t1"), 3)


def test_the_end_line_counts_entries_and_comes_last() -> None:
    check = ThreadCheck()
    check.accept(entry(1), 2)
    with pytest.raises(FileProblem) as cut:
        check.finish(2)
    assert cut.value.code == "truncated"
    with pytest.raises(FileProblem) as lying:
        check.accept(EndLine(type="end", entries=2), 3)
    assert lying.value.code == "entry_count_mismatch"
    check.accept(EndLine(type="end", entries=1), 3)
    check.finish(3)
    with pytest.raises(FileProblem) as after:
        check.accept(entry(2), 4)
    assert after.value.code == "misplaced_line"


def test_memory_comes_after_the_entries() -> None:
    check = ThreadCheck()
    memory = parse_line(b'{"type": "memory", "namespace": "n", "content": "c"}', 2)
    check.accept(memory, 2)
    with pytest.raises(FileProblem) as refused:
        check.accept(entry(1), 3)
    assert refused.value.code == "misplaced_line"
    with pytest.raises(FileProblem) as second:
        check.accept(parse_line(encode(header_line({})), 4), 4)
    assert second.value.code == "misplaced_line"
