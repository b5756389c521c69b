"""The keys an API process has seen: key hash -> tenant, scope and limits, so that a request
needs no statement to authenticate (one, to count it, where the tenant has a requests-per-minute
limit).

Kept true by the database's word: a trigger NOTIFYs `threadline_keys` with the tenant's id when
one of its keys is revoked, rescoped or deleted, or its limits change (migration c1e7a4b2d956),
and the event hub's LISTEN connection hands that here (the `Listener` protocol). A key is then
refused on every process as soon as the notification arrives, not at the next expiry. The cache
is trusted only while that connection listens: before it connects, after it is lost, and for a
read that began before a notification, a request goes to the database. An entry also lapses
after MAX_AGE, when its read touches the key's last_used_at again, and when a rotated key's
grace period ends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from app.services.quotas import Limits

CHANNEL = "threadline_keys"
MAX_AGE = 60.0  # seconds; last_used_at is written at most once a minute anyway
MAX_KEYS = 10_000


@dataclass(frozen=True)
class KnownKey:
    """A key as the database last said, at `read_at` (time.monotonic())."""

    tenant_id: str
    read_only: bool
    rpm_limit: int | None  # the tenant's, else the server's default; None: not counted
    limits: Limits
    revoked_at: datetime | None  # in the future: a rotated key's grace period
    read_at: float


class KeyCache:
    channel = CHANNEL

    def __init__(self, max_age: float = MAX_AGE) -> None:
        self._max_age = max_age
        self._keys: dict[str, KnownKey] = {}
        self._listening = False
        # Bumped by every invalidation: a read that began before one must not be kept.
        self.generation = 0

    @property
    def listening(self) -> bool:
        return self._listening

    def get(self, key_hash: str) -> KnownKey | None:
        if not self._listening:
            return None
        known = self._keys.get(key_hash)
        if known is None:
            return None
        if time.monotonic() - known.read_at >= self._max_age or (
            known.revoked_at is not None and known.revoked_at <= datetime.now(UTC)
        ):
            del self._keys[key_hash]
            return None
        return known

    def put(self, key_hash: str, known: KnownKey, generation: int) -> None:
        """Keep what a read that began at `generation` found, unless something changed since."""
        if not self._listening or generation != self.generation:
            return
        if len(self._keys) >= MAX_KEYS:
            self._keys.clear()  # crude, and rare: as many live keys in one process
        self._keys[key_hash] = known

    # The event hub's Listener protocol.

    def connected(self) -> None:
        """LISTEN is (again) in place: whatever changed before is unknown, so forget it all."""
        self.forget_all()
        self._listening = True

    def disconnected(self) -> None:
        self._listening = False
        self.forget_all()

    def notified(self, tenant_id: str) -> None:
        self.generation += 1
        for key_hash in [h for h, k in self._keys.items() if k.tenant_id == tenant_id]:
            del self._keys[key_hash]

    def forget_all(self) -> None:
        """Also for a change this process made: its own notification may come after the
        next request."""
        self.generation += 1
        self._keys.clear()
