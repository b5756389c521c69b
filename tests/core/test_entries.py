"""Entry payload validation and canonical forms."""

from __future__ import annotations

import pytest

from app.core.entries import EntryKind, PayloadError, normalize_entry
from app.core.tokens import HeuristicCounter, entry_tokens


def test_canonical_form_drops_unset_optionals() -> None:
    payload, refs = normalize_entry(
        EntryKind.MESSAGE, {"role": "user", "content": "hi", "name": None}, {"run_id": None}
    )
    assert (payload, refs) == ({"role": "user", "content": "hi"}, {})


def test_tool_entries_need_a_tool_call_id() -> None:
    with pytest.raises(PayloadError) as caught:
        normalize_entry(EntryKind.TOOL_RESULT, {"content": "ok"}, {})
    assert caught.value.errors[0]["loc"] == ["refs", "tool_call_id"]


def test_errors_are_located_in_payload_and_refs() -> None:
    with pytest.raises(PayloadError) as caught:
        normalize_entry(
            EntryKind.SUMMARY, {"from_seq": 5, "to_seq": 2, "content": "x"}, {"iteration": -1}
        )
    locs = [e["loc"][0] for e in caught.value.errors]
    assert locs == ["payload", "refs"]


def test_service_kinds_keep_extra_detail() -> None:
    payload, _ = normalize_entry(
        EntryKind.RUN_END, {"run_id": "r", "status": "completed", "ms": 5}, {}
    )
    assert payload == {"run_id": "r", "status": "completed", "ms": 5}


def test_token_count_heuristic() -> None:
    def count_entry_tokens(kind: EntryKind, payload: dict[str, object]) -> int:
        return entry_tokens(kind, payload, {}, HeuristicCounter())

    # 3 per text, then each word-like piece at least one token (app.core.tokens).
    assert count_entry_tokens(EntryKind.MESSAGE, {"role": "user", "content": "abcdefgh"}) == 5
    parts: dict[str, object] = {
        "role": "user",
        "content": [{"type": "text", "text": "abcd"}, {"type": "text", "text": "e"}],
    }
    assert count_entry_tokens(EntryKind.MESSAGE, parts) == 8
    assert count_entry_tokens(EntryKind.RUN_START, {"run_id": "r"}) == 0
