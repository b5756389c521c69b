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


@pytest.mark.parametrize("bad", ["3", 0, -1, True, 1.5, 2**63])
def test_context_from_is_a_seq(bad: object) -> None:
    with pytest.raises(PayloadError) as caught:
        normalize_entry(
            EntryKind.MESSAGE, {"role": "assistant", "content": "x"}, {"context_from": bad}
        )
    assert caught.value.errors[0]["loc"] == ["refs", "context_from"]
    _, refs = normalize_entry(
        EntryKind.MESSAGE, {"role": "assistant", "content": "x"}, {"context_from": 3}
    )
    assert refs == {"context_from": 3}


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


THOUGHT = {"type": "thinking", "thinking": "Let me think.", "signature": "c2lnbmF0dXJl"}
REDACTED = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}


def test_reasoning_parts_are_kept_byte_for_byte_in_an_assistant_message() -> None:
    odd = {**THOUGHT, "thinking": "  spaces kept \n\u00e9\U0001f914 ", "signature": "a+b/c=="}
    content = [odd, REDACTED, {"type": "text", "text": "Done."}]

    payload, _ = normalize_entry(EntryKind.MESSAGE, {"role": "assistant", "content": content}, {})

    assert payload["content"] == content


@pytest.mark.parametrize(
    ("role", "part", "where", "rule"),
    [
        ("user", THOUGHT, ["payload", "content", 0, "type"], "reasoning_not_allowed_in_role"),
        ("system", REDACTED, ["payload", "content", 0, "type"], "reasoning_not_allowed_in_role"),
        ("assistant", {**THOUGHT, "signature": ""}, None, "string_too_short"),
        ("assistant", {"type": "thinking", "thinking": "x"}, None, "missing"),
        ("assistant", {**THOUGHT, "signature": 7}, None, "string_type"),
        ("assistant", {**THOUGHT, "extra": 1}, None, "extra_forbidden"),
        ("assistant", {"type": "redacted_thinking", "data": ""}, None, "string_too_short"),
        ("assistant", {**THOUGHT, "signature": "s" * 200_001}, None, "string_too_long"),
    ],
)
def test_hostile_reasoning_parts_are_refused_clearly(
    role: str, part: dict[str, object], where: list[object] | None, rule: str
) -> None:
    with pytest.raises(PayloadError) as refused:
        normalize_entry(EntryKind.MESSAGE, {"role": role, "content": [part]}, {})

    [error] = [e for e in refused.value.errors if e["type"] == rule and 0 in e["loc"]]
    assert error["loc"][:2] == ["payload", "content"]
    if where is not None:
        assert error["loc"] == where


def test_reasoning_is_not_in_an_entrys_stored_count() -> None:
    counter = HeuristicCounter()
    text = {"type": "text", "text": "Done."}
    with_reasoning = {"role": "assistant", "content": [THOUGHT, REDACTED, text]}
    without = {"role": "assistant", "content": [text]}

    assert entry_tokens(EntryKind.MESSAGE, with_reasoning, {}, counter) == entry_tokens(
        EntryKind.MESSAGE, without, {}, counter
    )
    alone = {"role": "assistant", "content": [THOUGHT]}
    assert entry_tokens(EntryKind.MESSAGE, alone, {}, counter) == 0
