"""Eviction of large tool outputs: the preview a projection sends, the reference, the pages.

A tool result above the policy's `tool_output_eviction_tokens` is projected as a preview (its
first and last lines, each part capped in characters) with a one-line marker naming a reference;
the full output stays in the journal, and the built-in tool `read_tool_output` pages it back.
Offsets and limits count characters (Unicode code points) of the output's text, so the pages'
contents joined give back the original string exactly. Pure and deterministic.
"""

from __future__ import annotations

import re
from typing import Any

from app.core.messages import ToolSpec

REF_PREFIX = "tool_output:"
HEAD_LINES = 5
TAIL_LINES = 5
# Lines alone do not bound a preview: a 100 KB single-line JSON output would come back whole.
PART_CHARS = 2_000
PAGE_CHARS = 20_000
MAX_PAGE_CHARS = 100_000
_REF = re.compile(re.escape(REF_PREFIX) + r"([1-9][0-9]{0,17})")


def sizes(eviction_tokens: int) -> tuple[int, int]:
    """(part_chars, page_chars) under a threshold: a preview's head and tail parts, and the page
    its marker suggests, each about within the threshold even at one token a character (CJK), so
    neither a preview nor a page read back can crowd a small window out."""
    return min(PART_CHARS, max(200, eviction_tokens // 2)), min(
        PAGE_CHARS, max(500, eviction_tokens)
    )


def oversized_page(tokens: int, eviction_tokens: int, page_chars: int) -> str:
    """What a read_tool_output page over the threshold is projected as: a request to read less."""
    return (
        f"[This page is {tokens:,} tokens, more than the {eviction_tokens:,} a tool result may "
        f"take in this context: call read_tool_output again with limit={page_chars} or less.]"
    )


def output_ref(seq: int) -> str:
    """The reference of the tool_result entry at `seq` in a session's thread."""
    return f"{REF_PREFIX}{seq}"


def parse_ref(ref: str) -> int | None:
    """The seq a reference names, or None when `ref` is not one (surrounding spaces allowed)."""
    match = _REF.fullmatch(ref.strip())
    return int(match.group(1)) if match else None


def preview(
    text: str, ref: str, *, part_chars: int = PART_CHARS, page_chars: int = PAGE_CHARS
) -> str:
    """The first HEAD_LINES and last TAIL_LINES lines of `text`, each part at most `part_chars`
    characters, around a marker saying what was left out and how to read it.

    Lines end at "\\n" ("\\r\\n" keeps its "\\r" on the line). The head is cut at its end and
    the tail at its start, so both stay verbatim prefixes and suffixes of the output. A text
    with nothing to leave out comes back unchanged.
    """
    head_end = min(_end_of_line(text, HEAD_LINES), part_chars)
    tail_start = max(_start_of_last_lines(text, TAIL_LINES), len(text) - part_chars, head_end)
    if text[head_end:tail_start] in ("", "\n"):  # the preview's own line break stands for it
        return text
    omitted = tail_start - head_end
    # Newlines in the gap, less the one that ends the head's last (or cut) line: lines of which
    # nothing at all is shown.
    whole_lines = max(text.count("\n", head_end, tail_start) - 1, 0)
    left_out = (
        f"{whole_lines:,} line{'' if whole_lines == 1 else 's'} ({omitted:,} characters)"
        if whole_lines
        else f"{omitted:,} characters"
    )
    marker = (
        f"[… {left_out} omitted. The full output is {ref} ({len(text):,} characters): call "
        f'read_tool_output(ref="{ref}", offset={head_end}, limit={page_chars}) to read on '
        f"from here.]"
    )
    return f"{text[:head_end]}\n{marker}\n{text[tail_start:]}"


def _end_of_line(text: str, count: int) -> int:
    """Where the `count`th line ends (its newline excluded), or the text's end."""
    position = -1
    for _ in range(count):
        position = text.find("\n", position + 1)
        if position < 0:
            return len(text)
    return position


def _start_of_last_lines(text: str, count: int) -> int:
    """Where the last `count` lines start (a final newline ends the last line), or 0."""
    position = len(text) - 1 if text.endswith("\n") else len(text)
    for _ in range(count):
        position = text.rfind("\n", 0, position)
        if position < 0:
            return 0
    return position + 1


def page(text: str, ref: str, offset: int = 0, limit: int = PAGE_CHARS) -> dict[str, Any]:
    """`limit` characters (Unicode code points) of `text` from `offset`; next_offset is where
    the next page starts, None at the end. Raises ValueError for offsets or limits out of range."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0, not {offset!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_CHARS:
        raise ValueError(f"limit must be an integer from 1 to {MAX_PAGE_CHARS}, not {limit!r}")
    end = min(offset + limit, len(text))
    return {
        "ref": ref,
        "offset": offset,
        "limit": limit,
        "total_chars": len(text),
        "next_offset": end if end < len(text) else None,
        "content": text[offset:end],
    }


READ_TOOL_OUTPUT = ToolSpec(
    "read_tool_output",
    "Read a tool output that was too large for the context. Such an output is shown as a "
    "preview (its first and last lines) with a marker naming its reference, like "
    '"tool_output:57". This returns `limit` characters of the full output starting at '
    "`offset` (both count Unicode characters), with total_chars and next_offset: call again "
    "with offset=next_offset to read on; next_offset is null at the end. Read only the parts "
    "you need.",
    {
        "type": "object",
        "properties": {
            "ref": {
                "type": "string",
                "description": 'The reference from the preview\'s marker, e.g. "tool_output:57".',
            },
            "offset": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "The first character to return (0: the start).",
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_PAGE_CHARS,
                "default": PAGE_CHARS,
                "description": "How many characters to return at most.",
            },
        },
        "required": ["ref"],
        "additionalProperties": False,
    },
)

# The same, as a run's tool definition: the executor runs it as a built-in even when the run
# never declared it, since the projection offers it on its own once an output was evicted.
READ_TOOL_OUTPUT_DEFINITION: dict[str, Any] = {
    "name": READ_TOOL_OUTPUT.name,
    "description": READ_TOOL_OUTPUT.description,
    "parameters": READ_TOOL_OUTPUT.parameters,
    "kind": "builtin",
}
