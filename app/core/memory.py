"""The rules of persistent memory as text: names, size, lines, find/replace, the prompt block.

Pure: the service, the tools and the projector all apply these, so a memory is counted,
edited and shown the same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

# Letters, digits and _ . : - (e.g. "agent:support", "user.42"); not starting with a dot, so
# that "." and ".." (which URL clients resolve away as path segments) are never names.
NAMESPACE_PATTERN = r"^[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,127}$"
MAX_MEMORY_BYTES = 256 * 1024  # of UTF-8
# How much of a memory every projection carries in its system segment; the rest is a
# read_memory call away.
MEMORY_LINES = 200


def memory_lines(content: str) -> list[str]:
    """The lines of a memory: split at "\\n" only (never at other Unicode breaks), a final
    newline ending the last line rather than starting an empty one."""
    if not content:
        return []
    lines = content.split("\n")
    return lines[:-1] if content.endswith("\n") else lines


def memory_block(content: str, namespace: str | None = None) -> str:
    """What a projection adds to the system segment: a header and the first MEMORY_LINES lines.

    A function of the content alone, so an unchanged memory gives byte-identical prompts.
    """
    lines = memory_lines(content)
    header = f"# Memory ({namespace})" if namespace else "# Memory"
    shown = "\n".join(lines[:MEMORY_LINES])
    block = f"{header}\n{shown}"
    hidden = len(lines) - MEMORY_LINES
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


def find_replace(content: str, old: str, new: str, *, replace_all: bool = False) -> Replacement:
    """Replace `old` by `new`: exactly one (non-overlapping) occurrence, or all with
    `replace_all`; raises NoMatch or AmbiguousMatch rather than guess."""
    if not old:
        raise ValueError("old_string must not be empty")
    count = content.count(old)
    if count == 0:
        raise NoMatch("old_string was not found in the memory")
    if count > 1 and not replace_all:
        raise AmbiguousMatch(count)
    return Replacement(content.replace(old, new), count)
