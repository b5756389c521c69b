"""ContextPolicy: what a resolved policy refuses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.core.policy import ContextPolicy, resolve


def test_a_policy_without_messages_is_refused() -> None:
    # Its runs would send the model an empty history: the question itself filtered out.
    with pytest.raises(ValidationError, match="include_kinds must include message"):
        resolve({"include_kinds": ["summary", "tool_call", "tool_result"]})
    assert resolve({"include_kinds": ["message"]}).include_kinds == ("message",)


def test_the_compaction_wait_defaults_to_ten_seconds_and_is_bounded() -> None:
    assert ContextPolicy().compaction_wait_seconds == 10.0
    assert resolve({"compaction_wait_seconds": 0}).compaction_wait_seconds == 0
    with pytest.raises(ValidationError):
        resolve({"compaction_wait_seconds": -1})
