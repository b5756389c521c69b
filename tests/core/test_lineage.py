"""Fork lineage arithmetic against a naive model that copies whole threads."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.lineage import (
    Ancestor,
    Lineage,
    Segment,
    fork_lineage,
    inherited_range,
    is_direct_heir,
    lineage_from_json,
    lineage_to_json,
    segments,
    without,
)


def test_segments_skip_empty_ranges() -> None:
    lineage = (Ancestor("a", 3), Ancestor("b", 3), Ancestor("c", 7))
    assert segments("d", lineage) == [Segment("a", 0, 3), Segment("c", 3, 7), Segment("d", 7, None)]


def test_an_empty_own_range_is_left_out_when_rev_is_known() -> None:
    lineage = (Ancestor("a", 3),)
    assert segments("d", lineage, rev=3) == [Segment("a", 0, 3)]
    assert segments("d", lineage, rev=4) == [Segment("a", 0, 3), Segment("d", 3, None)]
    assert segments("d", (), rev=0) == []


def test_fork_lineage_truncates_at_the_fork_point() -> None:
    parent = (Ancestor("a", 3), Ancestor("b", 7))
    assert fork_lineage("p", parent, 5) == (Ancestor("a", 3), Ancestor("b", 5))
    assert fork_lineage("p", parent, 9) == (Ancestor("a", 3), Ancestor("b", 7), Ancestor("p", 9))
    assert fork_lineage("p", parent, 0) == ()


def test_json_round_trip() -> None:
    lineage = (Ancestor("a", 3), Ancestor("b", 7))
    assert lineage_from_json(lineage_to_json(lineage)) == lineage


@dataclass
class World:
    """Sessions stored the way Threadline stores them, next to a model of full copies."""

    lineage: dict[str, Lineage] = field(default_factory=dict)
    stored: dict[str, dict[int, str]] = field(default_factory=dict)  # session -> own seqs
    model: dict[str, list[str]] = field(default_factory=dict)  # session -> whole thread
    counter: int = 0
    sessions_made: int = 0

    def new_name(self) -> str:
        self.sessions_made += 1
        return f"s{self.sessions_made}"

    def create(self) -> None:
        name = self.new_name()
        self.lineage[name], self.stored[name], self.model[name] = (), {}, []

    def append(self, sid: str) -> None:
        self.counter += 1
        text = f"e{self.counter}"
        self.model[sid].append(text)
        self.stored[sid][len(self.model[sid])] = text

    def fork(self, sid: str, at: int) -> None:
        child = self.new_name()
        self.lineage[child] = fork_lineage(sid, self.lineage[sid], at)
        self.stored[child] = {}
        self.model[child] = self.model[sid][:at]

    def delete(self, sid: str) -> None:
        for other, lineage in list(self.lineage.items()):
            if other == sid:
                continue
            if is_direct_heir(lineage, sid):
                shared = inherited_range(lineage, sid)
                assert shared is not None
                after, upto = shared
                for seq in range(after + 1, upto + 1):
                    self.stored[other][seq] = self.stored[sid][seq]
            self.lineage[other] = without(lineage, sid)
        del self.lineage[sid], self.stored[sid], self.model[sid]

    def read(self, sid: str) -> list[str]:
        out = []
        for segment in segments(sid, self.lineage[sid]):
            own = self.stored[segment.session_id]
            out += [own[s] for s in sorted(own) if segment.contains(s)]
        return out


operations = st.lists(
    st.tuples(
        st.sampled_from(["create", "append", "fork", "delete"]),
        st.integers(0, 50),
        st.integers(0, 50),
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(operations)
def test_threads_read_like_full_copies_through_forks_and_deletes(
    ops: list[tuple[str, int, int]],
) -> None:
    world = World()
    world.create()
    for op, pick, at in ops:
        names = sorted(world.lineage)
        if not names:
            world.create()
            continue
        sid = names[pick % len(names)]
        if op == "create":
            world.create()
        elif op == "append":
            world.append(sid)
        elif op == "fork":
            world.fork(sid, at % (len(world.model[sid]) + 1))
        elif op == "delete":
            world.delete(sid)
        for name in world.lineage:
            assert world.read(name) == world.model[name]
            # Nobody ever reads from a session that no longer exists.
            assert all(a.session_id in world.lineage for a in world.lineage[name])
