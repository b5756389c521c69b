"""Fork lineage arithmetic: which session holds which seq range of a thread.

A session's thread is its ancestors' entries up to the fork points followed by its own. The
lineage lists the ancestors oldest first as (session_id, upto_seq); ancestor i owns the seqs in
(upto_{i-1}, upto_i], the session itself owns everything after the last upto. Forking copies this
short list (O(depth)), never entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Ancestor:
    session_id: str
    upto_seq: int


@dataclass(frozen=True, slots=True)
class Segment:
    """The seqs in (after_seq, upto_seq] of a thread are stored under session_id."""

    session_id: str
    after_seq: int
    upto_seq: int | None  # None: open-ended (the session's own, growing range)

    def contains(self, seq: int) -> bool:
        return seq > self.after_seq and (self.upto_seq is None or seq <= self.upto_seq)


Lineage = tuple[Ancestor, ...]


def lineage_from_json(raw: list[dict[str, Any]]) -> Lineage:
    return tuple(Ancestor(str(a["session_id"]), int(a["upto_seq"])) for a in raw)


def lineage_to_json(lineage: Lineage) -> list[dict[str, Any]]:
    return [{"session_id": a.session_id, "upto_seq": a.upto_seq} for a in lineage]


def segments(session_id: str, lineage: Lineage, rev: int | None = None) -> list[Segment]:
    """The thread's storage ranges, oldest first, empty ranges left out.

    With the session's `rev`, its own range is left out too while it holds nothing yet (a fresh
    fork), which spares a query.
    """
    out: list[Segment] = []
    after = 0
    for ancestor in lineage:
        if ancestor.upto_seq > after:
            out.append(Segment(ancestor.session_id, after, ancestor.upto_seq))
            after = ancestor.upto_seq
    if rev is None or rev > after:
        out.append(Segment(session_id, after, None))
    return out


def fork_lineage(parent_id: str, parent_lineage: Lineage, at_seq: int) -> Lineage:
    """The lineage of a child forked from `parent_id` at `at_seq` (entries 1..at_seq shared)."""
    out: list[Ancestor] = []
    after = 0
    for ancestor in (*parent_lineage, Ancestor(parent_id, at_seq)):
        upto = min(ancestor.upto_seq, at_seq)
        if upto > after:  # a range the child can see; empty ones are dropped
            out.append(Ancestor(ancestor.session_id, upto))
            after = upto
    return tuple(out)


def inherited_range(lineage: Lineage, ancestor_id: str) -> tuple[int, int] | None:
    """The (after, upto] seq range this lineage reads from `ancestor_id`, if any."""
    after = 0
    for ancestor in lineage:
        if ancestor.session_id == ancestor_id:
            return (after, ancestor.upto_seq)
        after = ancestor.upto_seq
    return None


def is_direct_heir(lineage: Lineage, deleted_id: str) -> bool:
    """When `deleted_id` goes away, must this session take over its entries?

    Only a session whose nearest non-empty ancestor is the deleted one: a deeper descendant reads
    the same range through that heir, which receives the copies.
    """
    return bool(lineage) and lineage[-1].session_id == deleted_id


def without(lineage: Lineage, deleted_id: str) -> Lineage:
    """The lineage once `deleted_id`'s range has been copied into its heir."""
    return tuple(a for a in lineage if a.session_id != deleted_id)
