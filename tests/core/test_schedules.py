"""Due times of schedules: cron in a zone's wall clock across DST, misfires, title templates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.core.schedules import cron_problem, firing, next_due, render_title, title_problem

BERLIN = ZoneInfo("Europe/Berlin")
DAILY_0230 = "30 2 * * *"


def dues(expression: str, start: datetime, count: int) -> list[datetime]:
    found, after = [], start
    for _ in range(count):
        after = next_due(expression, BERLIN, after)
        found.append(after)
    return found


def test_a_daily_0230_in_berlin_fires_once_on_the_spring_forward_day() -> None:
    # 2026-03-29: clocks jump from 02:00 to 03:00; 02:30 does not exist that day.
    got = dues(DAILY_0230, datetime(2026, 3, 27, 12, tzinfo=UTC), 4)
    assert got == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # the jump: 03:00 CEST
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2026, 3, 31, 0, 30, tzinfo=UTC),
    ]
    assert [d.astimezone(BERLIN).date().day for d in got] == [28, 29, 30, 31]


def test_a_daily_0230_in_berlin_fires_once_on_the_fall_back_day() -> None:
    # 2026-10-25: clocks go back from 03:00 to 02:00; 02:30 happens twice, fired at the first.
    got = dues(DAILY_0230, datetime(2026, 10, 23, 12, tzinfo=UTC), 4)
    assert got == [
        datetime(2026, 10, 24, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # the first 02:30 (CEST)
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 10, 27, 1, 30, tzinfo=UTC),
    ]
    # Asked from within the repeated hour (after the first 02:30), the next is the next day's.
    second_0215 = datetime(2026, 10, 25, 1, 15, tzinfo=UTC)  # 02:15 CET, the second 02:15
    assert next_due(DAILY_0230, BERLIN, second_0215) == got[2]


def test_half_hourly_dues_across_the_jump_are_increasing_and_distinct() -> None:
    got = dues("*/30 * * * *", datetime(2026, 3, 29, 0, 0, tzinfo=UTC), 4)
    # 01:00 UTC (the jump: wall 02:00 and 02:30 do not exist) once, then 03:30 CEST.
    assert got == [
        datetime(2026, 3, 29, 0, 30, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
        datetime(2026, 3, 29, 2, 0, tzinfo=UTC),
    ]


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("61 * * * *", "61"),
        ("* * * *", "5 fields"),
        ("* * * * * *", "5 fields"),
        ("", "empty"),
        ("every day", "5 fields"),
        ("0 0 30 2 *", "no date"),
        ("0 8 * * 8", "out of range"),
        ("*/0 * * * *", "step"),
        ("H * * * *", "hash"),
    ],
)
def test_invalid_cron_expressions_say_why(expression: str, reason: str) -> None:
    problem = cron_problem(expression)
    assert problem is not None
    assert reason in problem


def test_valid_cron_expressions_pass() -> None:
    assert cron_problem("0 8 * * 1-5") is None
    assert cron_problem("@daily") is None


HOURLY = "0 * * * *"
NOW = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
GRACE = timedelta(seconds=60)


def test_a_due_time_reached_in_time_fires_at_it() -> None:
    due = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    got = firing(HOURLY, BERLIN, "skip", due, NOW, GRACE)
    assert got is not None
    assert (got.due_at, got.fire, got.misfired) == (due, True, False)
    assert got.next_due_at == datetime(2026, 6, 1, 13, 0, tzinfo=UTC)


def test_not_due_yet_is_no_firing() -> None:
    assert firing(HOURLY, BERLIN, "run_once", NOW + timedelta(hours=1), NOW, GRACE) is None


@pytest.mark.parametrize(("misfire", "fires"), [("run_once", True), ("skip", False)])
def test_a_jump_over_several_due_times_is_one_firing(misfire: str, fires: bool) -> None:
    missed_since = datetime(2026, 6, 1, 7, 0, tzinfo=UTC)  # 5 hourly due times passed
    got = firing(HOURLY, BERLIN, misfire, missed_since, NOW, GRACE)  # type: ignore[arg-type]
    assert got is not None
    assert got.due_at == datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # the latest one only
    assert (got.fire, got.misfired) == (fires, True)
    assert got.next_due_at == datetime(2026, 6, 1, 13, 0, tzinfo=UTC)


def test_one_due_time_missed_past_the_grace_is_a_misfire() -> None:
    due = datetime(2026, 6, 1, 11, 0, tzinfo=UTC)
    late = datetime(2026, 6, 1, 11, 30, tzinfo=UTC)
    got = firing(HOURLY, BERLIN, "skip", due, late, GRACE)
    assert got is not None
    assert (got.due_at, got.fire, got.misfired) == (due, False, True)


def test_title_templates() -> None:
    due = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    title = render_title("Tickets {date} {time} {{x}} {schedule}", due, BERLIN, "nightly")
    assert title == "Tickets 2026-03-29 03:00 {x} nightly"
    assert title_problem("Tickets {date}") is None
    unknown = title_problem("Tickets {day}")
    assert unknown is not None
    assert "{day}" in unknown
    assert title_problem("{date.__class__}") is not None
    assert title_problem("{date!r}") is not None
    assert title_problem("{date") is not None


def test_a_long_downtime_is_one_firing_at_the_latest_minute() -> None:
    since = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)  # a year of every-minute due times missed
    got = firing("* * * * *", BERLIN, "run_once", since, NOW, GRACE)
    assert got is not None
    assert (got.due_at, got.fire, got.misfired) == (
        datetime(2026, 6, 1, 12, 0, tzinfo=UTC),
        True,
        True,
    )


def test_the_latest_due_time_in_a_repeated_hour_is_its_first_occurrence() -> None:
    # 02:45 CET, the second 02:45 of 2026-10-25: the 02:50 due time passed in the first hour.
    now = datetime(2026, 10, 25, 1, 45, tzinfo=UTC)
    since = datetime(2026, 10, 24, 0, 0, tzinfo=UTC)
    got = firing("50 2 * * *", BERLIN, "run_once", since, now, GRACE)
    assert got is not None
    assert got.due_at == datetime(2026, 10, 25, 0, 50, tzinfo=UTC)  # 02:50 CEST
    assert got.next_due_at == datetime(2026, 10, 26, 1, 50, tzinfo=UTC)
