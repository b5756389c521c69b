"""A settled process: its long-lived objects frozen, the price table among them, and young
collections spaced out."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from app import heap


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_settle_freezes_what_is_loaded_and_spaces_young_collections() -> None:
    from genai_prices import data_snapshot

    gc.unfreeze()
    heap.settle()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == heap.YOUNG_THRESHOLD
    # The price table, loaded on first use otherwise, is out of every collection.
    assert not any(o is data_snapshot.get_snapshot() for o in gc.get_objects())
