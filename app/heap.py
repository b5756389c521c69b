"""How a long-running process's heap is collected, so that the cyclic GC does not stall every
stream it serves.

Once started, a process holds a few hundred thousand long-lived objects (the SDKs' models,
SQLAlchemy, the price table): `gc.freeze()` takes them out of every collection. Past that, the
young generation is collected every YOUNG_THRESHOLD allocations instead of Python's 700: a
hundred streams allocate fast, and at 700 a collection comes every few hundred microseconds,
promoting objects that die a moment later into the old generation, whose full collections
(each over everything the streams hold) then pause the event loop for tens of milliseconds,
every few seconds. With the larger threshold most of them die first; full collections become
rare, and a young collection stays a millisecond or two.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Called once the process has started (its pools and workers up): load what is otherwise
    loaded on first use and kept for good, freeze it all, and set the collection thresholds."""
    from genai_prices import data_snapshot  # the price table: costs and context windows

    data_snapshot.get_snapshot()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
