"""What an ask needs of this process's workers: the protocol the worker's handoff implements.

`threadline serve` runs workers in the API process; an ask that finds room there commits its
job already taken by one of them and hands the run over at once (app/worker/handoff.py, wired
by app/main.py). An API-only process has none: its asks' jobs wait for the queue.
"""

from __future__ import annotations

from typing import Any, Protocol

from app.db.runs import FirstStart
from app.db.sessions import Newest


class RunHandoff(Protocol):
    @property
    def lease(self) -> int | None:
        """The lease of the reserved worker's attempts: an ask's run whose job is committed
        taken by that worker is committed started under it too (AskResult.started); None:
        such a run is committed queued, and the handoff starts it."""
        ...

    def reserve(self) -> int | None:
        """Room for one more run, held until `offer` or `release`: the worker id the ask's job
        may be committed taken by; None: no room (the job is queued as usual)."""
        ...

    def release(self) -> None:
        """Give back a reservation (the ask is committed, or failed): called before `offer`."""
        ...

    def offer(
        self,
        run_id: str,
        job_id: int | None,
        claimed: bool = False,
        followed: dict[str, Any] | None = None,
        newest: Newest | None = None,
        started: FirstStart | None = None,
    ) -> None:
        """Start the run now if there is room; never waits, never fails the ask. `claimed`: its
        job was committed taken by the reserved worker: the run must be started (or its job
        ended). `followed`: its first event, when a stream of this process is about to follow
        it from there (what the workers publish before it subscribes is kept for it).
        `newest`: the thread's newest entries as the ask read them, its own appended: the
        run's first step projects from them if the session is still at their last seq.
        `started`: the run, started by the ask's commit (claimed): it is executed as it is."""
        ...
