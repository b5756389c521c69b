"""Telling ids from other references (key prefixes, AI SDK chat ids)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.services.ids import is_uuid


@given(st.uuids())
def test_every_uuid_in_its_usual_forms_is_one(value: uuid.UUID) -> None:
    assert is_uuid(str(value))
    assert is_uuid(str(value).upper())
    assert is_uuid(value.hex)


@pytest.mark.parametrize(
    "text",
    ["", "chat-1", "tl_live_abcd", "6f1c2a0e-5b7d-4c3e-9a8f-1d2e3f4a5b6", "g" * 32, "é" * 36],
)
def test_other_references_are_not(text: str) -> None:
    assert not is_uuid(text)


@given(st.text(alphabet=st.characters(blacklist_characters="0123456789abcdefABCDEF")))
def test_text_without_hex_digits_is_not(text: str) -> None:
    assert not is_uuid(text)
