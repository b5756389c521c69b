"""Eviction of large tool outputs: previews are small and deterministic, pages give back the
output exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.eviction import (
    MAX_PAGE_CHARS,
    PAGE_CHARS,
    PART_CHARS,
    READ_TOOL_OUTPUT,
    READ_TOOL_OUTPUT_DEFINITION,
    output_ref,
    oversized_page,
    page,
    parse_ref,
    preview,
    sizes,
)

REF = "tool_output:57"


def numbered(lines: int, end: str = "\n") -> str:
    return "".join(f"line {i}{end}" for i in range(1, lines + 1))


def big_output() -> str:
    """About 100 KB (in characters) of mixed text: emoji, CJK, CRLF, a trailing newline."""
    row = "résumé 🗾 東京の天気は晴れ — {i}\r\nplain ascii {i}\n"
    text = "".join(row.format(i=i) for i in range(2_500))
    assert len(text) > 100_000
    return text


def read_all(text: str, limit: int) -> tuple[str, list[dict[str, object]]]:
    pages, offset = [], 0
    while True:
        got = page(text, REF, offset, limit)
        pages.append(got)
        if got["next_offset"] is None:
            return "".join(str(p["content"]) for p in pages), pages
        assert isinstance(got["next_offset"], int)
        offset = got["next_offset"]


def test_refs_round_trip_and_reject_anything_else() -> None:
    assert output_ref(57) == REF
    assert parse_ref(REF) == 57 and parse_ref(f"  {REF} ") == 57
    for bad in ("", "57", "tool_output:", "tool_output:0", "tool_output:-3", "tool_output:5x",
                "tool_output:012", "other:5", "tool_output:" + "9" * 19):  # fmt: skip
        assert parse_ref(bad) is None, bad


def test_preview_keeps_first_and_last_five_lines_around_a_marker() -> None:
    text = numbered(100)
    shown = preview(text, REF)
    lines = shown.split("\n")
    assert lines[:5] == [f"line {i}" for i in range(1, 6)]
    assert lines[-6:] == [f"line {i}" for i in range(96, 101)] + [""]
    marker = lines[5]
    head = "".join(f"line {i}\n" for i in range(1, 6))[:-1]
    omitted = len(text) - len(head) - len("".join(f"line {i}\n" for i in range(96, 101)))
    assert marker == (
        f"[… 90 lines ({omitted} characters) omitted. The full output is {REF} "
        f'({len(text)} characters): call read_tool_output(ref="{REF}", offset={len(head)}, '
        f"limit={PAGE_CHARS}) to read on from here.]"
    )
    assert len(lines) == 12
    # The marker's offset starts exactly where the preview's head stops.
    assert text[: len(head)] == head and text[len(head)] == "\n"


def test_one_line_gets_the_singular() -> None:
    assert "[… 1 line (" in preview(numbered(11), REF)


def test_crlf_lines_keep_their_carriage_returns() -> None:
    text = numbered(30, end="\r\n")
    shown = preview(text, REF)
    assert shown.startswith("line 1\r\nline 2\r\n") and shown.endswith("line 30\r\n")
    assert "[… 20 lines (" in shown


def test_a_huge_single_line_is_capped_at_both_ends() -> None:
    text = '{"data": "' + "0123456789" * 10_000 + '"}'
    shown = preview(text, REF)
    head, marker, tail = shown.split("\n")
    assert head == text[:PART_CHARS] and tail == text[-PART_CHARS:]
    assert marker.startswith(f"[… {len(text) - 2 * PART_CHARS:,} characters omitted.")
    assert f"offset={PART_CHARS}," in marker
    assert len(shown) < 2 * PART_CHARS + 300


def test_huge_lines_inside_the_head_and_tail_are_capped_too() -> None:
    text = "short\n" + "h" * 50_000 + "\nmiddle\n" * 20 + "t" * 50_000 + "\nend"
    shown = preview(text, REF)
    assert len(shown) < 2 * PART_CHARS + 300
    assert shown.startswith("short\nhhh") and shown.endswith("ttt\nend")


@pytest.mark.parametrize(
    "text", ["", "one line", numbered(10), numbered(10, end="\r\n"), "x" * (2 * PART_CHARS)]
)
def test_short_outputs_come_back_unchanged(text: str) -> None:
    assert preview(text, REF) == text


def test_preview_is_deterministic_and_small() -> None:
    text = big_output()
    first = preview(text, REF)
    assert first == preview(text, REF) and first.encode() == preview(text, REF).encode()
    assert len(first) < 2 * PART_CHARS + 300
    assert first.startswith(text[: text.index("\n")])


@pytest.mark.parametrize("limit", [1, 7, 999, PAGE_CHARS, MAX_PAGE_CHARS])
def test_pages_join_to_the_exact_original(limit: int) -> None:
    text = big_output()
    joined, pages = read_all(text, limit)
    assert joined == text and joined.encode("utf-8") == text.encode("utf-8")
    assert all(p["total_chars"] == len(text) and p["ref"] == REF for p in pages)
    assert all(len(str(p["content"])) == limit for p in pages[:-1])
    assert pages[-1]["next_offset"] is None


@given(st.text(min_size=0, max_size=300), st.integers(1, 50))
def test_any_text_pages_back_exactly(text: str, limit: int) -> None:
    assert read_all(text, limit)[0] == text


def test_page_bounds() -> None:
    text = "abc"
    assert page(text, REF, 0, 2) == {
        "ref": REF,
        "offset": 0,
        "limit": 2,
        "total_chars": 3,
        "next_offset": 2,
        "content": "ab",
    }
    assert page(text, REF, 2, 2)["next_offset"] is None
    past = page(text, REF, 10, 5)
    assert past["content"] == "" and past["next_offset"] is None
    assert page("", REF)["content"] == "" and page("", REF)["next_offset"] is None
    for offset, limit in ((-1, 5), (0, 0), (0, MAX_PAGE_CHARS + 1), (True, 5), (0, False)):
        with pytest.raises(ValueError):
            page(text, REF, offset, limit)


def test_the_tool_definition() -> None:
    schema = READ_TOOL_OUTPUT.parameters
    assert READ_TOOL_OUTPUT.name == "read_tool_output" and "tool_output:" in (
        READ_TOOL_OUTPUT.description
    )
    assert schema["required"] == ["ref"]
    assert schema["properties"]["offset"] == {
        "type": "integer",
        "minimum": 0,
        "default": 0,
        "description": schema["properties"]["offset"]["description"],
    }
    limit = schema["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (1, MAX_PAGE_CHARS, PAGE_CHARS)
    assert {
        "name": READ_TOOL_OUTPUT.name,
        "description": READ_TOOL_OUTPUT.description,
        "parameters": schema,
        "kind": "builtin",
    } == READ_TOOL_OUTPUT_DEFINITION


def test_sizes_follow_the_threshold() -> None:
    assert sizes(20_000) == (PART_CHARS, PAGE_CHARS)
    assert sizes(875) == (437, 875)  # a 4,000-token window's default threshold
    assert sizes(10) == (200, 500)
    assert "limit=875 or less" in oversized_page(9000, 875, 875)
