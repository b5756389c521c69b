"""What a run carries from the request that created it to the worker that executes it (in
its params, the `telemetry` field): the request id, for its log lines, and the trace context,
for its spans. A worker in another process reads them from the run's row."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from app.telemetry import logging, tracing

if TYPE_CHECKING:
    from app.core.runs import Run, RunParams


def into(params: RunParams, **ids: str) -> RunParams:
    """`params` carrying the current request id and trace context; the request's own log
    lines name the run from here on."""
    logging.bind(**ids)
    carried = {
        "request_id": logging.current_ids().get("request_id"),
        tracing.TRACEPARENT: tracing.traceparent(),
    }
    kept = {k: v for k, v in carried.items() if v}
    return replace(params, telemetry=kept) if kept else params


@contextmanager
def run_scope(run: Run) -> Iterator[None]:
    """A worker executing `run`: its log lines carry the run's ids and its ask's request id,
    and its spans continue the ask's trace."""
    telemetry = run.params.telemetry
    with (
        logging.scope(
            request_id=telemetry.get("request_id"),
            tenant_id=run.tenant_id,
            session_id=run.session_id,
            run_id=run.id,
        ),
        tracing.span(
            f"run {run.kind.value}",
            parent=telemetry.get(tracing.TRACEPARENT),
            **{"threadline.run_id": run.id, "threadline.attempt": run.attempts},
        ),
    ):
        yield
