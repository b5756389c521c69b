"""The rules of persistent memory as text: names, size, lines, find/replace, the prompt block.

Pure: the service, the tools and the projector all apply these, so a memory is counted,
edited and shown the same way everywhere.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

# Letters, digits and _ . : - (e.g. "agent:support", "user.42"); not starting with a dot, so
# that "." and ".." (which URL clients resolve away as path segments) are never names.
NAMESPACE_PATTERN = r"^[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,127}$"
MAX_MEMORY_BYTES = 256 * 1024  # of UTF-8
# How much of a memory every projection carries in its system segment; the rest is a
# read_memory call away.
MEMORY_LINES = 200


# The built-ins a session naming a memory_namespace is offered (app/tools/memory.py runs them).
MEMORY_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "read_memory",
        "description": (
            "Read your whole persistent memory: notes that outlive this conversation. Its "
            f"first {MEMORY_LINES} lines are already in your instructions; read it when it is "
            "longer, or before rewriting it."
        ),
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        "kind": "builtin",
    },
    {
        "name": "write_memory",
        "description": (
            "Replace your whole persistent memory with `content` (Markdown; at most "
            f"{MAX_MEMORY_BYTES // 1024} KiB). Keep what matters across conversations: facts "
            "about the user, decisions, preferences. To change part of it, use update_memory."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "content": {"type": "string", "description": "The new memory, in full."}
            },
            "required": ["content"],
            "additionalProperties": False,
        },
        "kind": "builtin",
    },
    {
        "name": "update_memory",
        "description": (
            "Find and replace in your persistent memory: `old_string` must occur exactly once "
            "(add surrounding text to make it unique) unless replace_all is true. An empty "
            "new_string deletes it."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "old_string": {"type": "string", "minLength": 1, "description": "Text to find."},
                "new_string": {"type": "string", "description": "Its replacement."},
                "replace_all": {
                    "type": "boolean",
                    "default": False,
                    "description": "Replace every occurrence.",
                },
            },
            "required": ["old_string", "new_string"],
            "additionalProperties": False,
        },
        "kind": "builtin",
    },
)


def memory_lines(content: str) -> list[str]:
    """The lines of a memory: split at "\\n" only (never at other Unicode breaks), a final
    newline ending the last line rather than starting an empty one."""
    if not content:
        return []
    lines = content.split("\n")
    return lines[:-1] if content.endswith("\n") else lines


def memory_fence(text: str) -> str:
    """A Markdown code fence that no line of `text` can close: more backticks than its longest
    run, counted also after NFKC normalization (which folds lookalikes such as U+FF40 into "`"),
    so a reader that normalizes sees the same block."""
    runs = re.findall(r"`+", text) + re.findall(r"`+", unicodedata.normalize("NFKC", text))
    return "`" * max(3, 1 + max(map(len, runs), default=0))


def memory_block(content: str, namespace: str | None = None, lines: int = MEMORY_LINES) -> str:
    """What a projection adds to the system segment: a header, the first `lines` lines fenced,
    and how many more lines there are.

    The memory is data the model wrote, so it is quoted verbatim inside a code fence it cannot
    close (memory_fence): no memory text can end the block and continue as the system. A
    function of the content alone, so an unchanged memory gives byte-identical prompts.
    """
    all_lines = memory_lines(content)
    header = f"# Memory ({namespace})" if namespace else "# Memory"
    shown = "".join(f"{line}\n" for line in all_lines[:lines])
    fence = memory_fence(shown)
    block = f"{header}\n{fence}\n{shown}{fence}"
    hidden = len(all_lines) - lines
    if hidden > 0:
        block += f"\n[{hidden} more lines not shown: read_memory returns the whole memory.]"
    return block


@dataclass(frozen=True)
class Replacement:
    content: str
    count: int  # occurrences replaced


class NoMatch(ValueError):
    """old_string does not occur in the memory."""


class AmbiguousMatch(ValueError):
    """old_string occurs several times and replace_all was not asked for."""

    def __init__(self, count: int) -> None:
        super().__init__(
            f"old_string occurs {count} times: make it unique with more context, or set replace_all"
        )
        self.count = count


class ReplacementTooLarge(ValueError):
    """The replaced text would be over the size limit (`size`: its bytes of UTF-8)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the memory would hold {size} bytes of UTF-8")
        self.size = size


def find_replace(
    content: str, old: str, new: str, *, replace_all: bool = False, max_bytes: int | None = None
) -> Replacement:
    """Replace `old` by `new`: exactly one (non-overlapping) occurrence, or all with
    `replace_all`; raises NoMatch or AmbiguousMatch rather than guess, and ReplacementTooLarge
    when the result would be over `max_bytes` of UTF-8: computed from the sizes before the
    text is built (each of a quarter million occurrences replaced by a megabyte would be
    hundreds of gigabytes)."""
    if not old:
        raise ValueError("old_string must not be empty")
    count = content.count(old)
    if count == 0:
        raise NoMatch("old_string was not found in the memory")
    if count > 1 and not replace_all:
        raise AmbiguousMatch(count)
    if max_bytes is not None:
        size = _utf8_size(content) + count * (_utf8_size(new) - _utf8_size(old))
        if size > max_bytes:
            raise ReplacementTooLarge(size)
    return Replacement(content.replace(old, new), count)


def _utf8_size(text: str) -> int:
    # surrogatepass: a lone surrogate is counted (3 bytes), not raised here; storing it is
    # refused where the text is checked for storage.
    return len(text.encode("utf-8", "surrogatepass"))
