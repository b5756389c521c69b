"""Schedules' due times: cron in a time zone's wall clock (DST included), misfires, titles.

Cron fields are read in the schedule's local wall time. A wall time that does not exist (the
hour skipped when clocks go forward) is due at the instant the clocks jump (02:30 → 03:00 in
Europe/Berlin); one that exists twice (the hour repeated when clocks go back) is due at its
first occurrence only. So a daily schedule fires once on every day, DST days included. The
time zone is given as a tzinfo: resolving its name (reading the tz database) is the caller's.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Literal

from croniter import CroniterError, croniter

Misfire = Literal["run_once", "skip"]
# More than any time zone's clocks ever move at once.
MAX_CLOCK_CHANGE = timedelta(hours=3)

# The placeholders a title template may use, and what each becomes (the due time, in the
# schedule's time zone).
TITLE_PLACEHOLDERS = {
    "date": "the due date, YYYY-MM-DD",
    "time": "the due time, HH:MM",
    "datetime": "the due date and time, YYYY-MM-DDTHH:MM",
    "weekday": "the due day's English name (Monday…)",
    "schedule": "the schedule's name",
}


def cron_problem(expression: str) -> str | None:
    """Why `expression` is no five-field cron expression (minute hour day month weekday, or a
    croniter alias such as @daily), or None."""
    fields = expression.split()
    if not fields:
        return "the expression is empty"
    if not fields[0].startswith("@") and len(fields) != 5:
        return f"a cron expression has 5 fields (minute hour day month weekday), not {len(fields)}"
    try:
        times = croniter(expression, datetime(2000, 1, 1))
    except (CroniterError, ValueError, KeyError) as exc:
        return str(exc) or type(exc).__name__
    if not croniter.is_valid(expression):
        return "not a valid cron expression"
    try:
        times.get_next(datetime)
    except CroniterError:
        return "it matches no date (such as 30 February)"
    return None


def title_problem(template: str) -> str | None:
    """Why `template` is no title template (only {placeholder}s of TITLE_PLACEHOLDERS, no
    format specs; {{ and }} are braces), or None."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        return str(exc)
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in TITLE_PLACEHOLDERS:
            known = ", ".join("{" + p + "}" for p in TITLE_PLACEHOLDERS)
            return f"unknown placeholder {{{name}}} (known: {known})"
        if spec or conversion:
            return f"placeholder {{{name}}} takes no format"
    return None


def render_title(template: str, due_at: datetime, zone: tzinfo, schedule_name: str) -> str:
    local = due_at.astimezone(zone)
    return template.format(
        date=local.strftime("%Y-%m-%d"),
        time=local.strftime("%H:%M"),
        datetime=local.strftime("%Y-%m-%dT%H:%M"),
        weekday=local.strftime("%A"),
        schedule=schedule_name,
    )


def _instant(wall: datetime, zone: tzinfo) -> datetime:
    """The UTC instant of naive wall time `wall` in `zone`: its first occurrence, or, when the
    clocks skip it, the instant they jump."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # Skipped: fold=1 reads it with the offset after the jump, an instant before it; fold=0
    # with the one before, an instant after it. The jump lies between: find its second.
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    high = first
    before = low.astimezone(zone).utcoffset()
    while high - low > timedelta(seconds=1):
        middle = (low + (high - low) / 2).replace(microsecond=0)
        if middle.astimezone(zone).utcoffset() == before:
            low = middle
        else:
            high = middle
    return high


def next_due(expression: str, zone: tzinfo, after: datetime) -> datetime:
    """The schedule's first due time strictly after `after` (aware), in UTC.

    _instant is monotonic in wall time, so walking the cron's wall times from `after`'s own
    finds it; those in a repeated hour already past are walked over."""
    wall = after.astimezone(zone).replace(tzinfo=None)
    times = croniter(expression, wall)
    while True:
        due = _instant(times.get_next(datetime), zone)
        if due > after:
            return due


def last_due(expression: str, zone: tzinfo, since: datetime, now: datetime) -> datetime:
    """The latest due time in [since, now] (`since` itself counting as one), in UTC.

    Walked back from a little after `now`'s wall time (by more than any clock change): wall
    times past it may still be due before `now` (a repeated hour), and _instant is monotonic,
    so the first found at or before `now` is the latest. A downtime of months costs no more."""
    wall = now.astimezone(zone).replace(tzinfo=None) + MAX_CLOCK_CHANGE
    times = croniter(expression, wall)
    while True:
        due = _instant(times.get_prev(datetime), zone)
        if due <= now:
            return max(due, since)


@dataclass(frozen=True)
class Firing:
    """What a tick does with a schedule that is due: fire (or skip) at `due_at`, then wait for
    `next_due_at`. `misfired`: the due time was missed (downtime) rather than reached."""

    due_at: datetime
    fire: bool
    misfired: bool
    next_due_at: datetime


def firing(
    expression: str,
    zone: tzinfo,
    misfire: Misfire,
    due_at: datetime,
    now: datetime,
    grace: timedelta,
) -> Firing | None:
    """What a tick at `now` does with a schedule next due at `due_at`; None when not due yet.

    Reached in time (later than due by at most `grace`, no later due time passed too): fired at
    `due_at`. Missed (downtime, a clock jump): one firing at the latest due time passed, fired
    under run_once, skipped under skip — never one per missed time."""
    if due_at > now:
        return None
    latest = last_due(expression, zone, due_at, now)
    following = next_due(expression, zone, now)
    if latest == due_at and now - due_at <= grace:
        return Firing(due_at, fire=True, misfired=False, next_due_at=following)
    return Firing(latest, fire=misfire == "run_once", misfired=True, next_due_at=following)
