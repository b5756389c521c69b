"""A run's status as a Responses API response's status."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.core.runs import Run, RunKind, RunParams, RunStatus
from app.openai_api.objects import run_status


def a_run(status: RunStatus) -> Run:
    return Run(
        id="r1",
        tenant_id="t1",
        session_id="s1",
        status=status,
        kind=RunKind.ASK,
        model="openai:gpt-4o-mini",
        params=RunParams(),
        attempts=1,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        user_entry_seq=1,
    )


@pytest.mark.parametrize(
    ("status", "shown"),
    [
        (RunStatus.QUEUED, "queued"),
        (RunStatus.RUNNING, "in_progress"),
        (RunStatus.AWAITING_APPROVAL, "completed"),  # it ended with mcp_approval_request items
        (RunStatus.REQUIRES_ACTION, "completed"),  # it ended with calls for the client
        (RunStatus.FAILED, "failed"),
        (RunStatus.CANCELLED, "cancelled"),
    ],
)
def test_each_status_maps_to_a_response_status(status: RunStatus, shown: str) -> None:
    assert run_status(a_run(status), answered=False) == (shown, None)
