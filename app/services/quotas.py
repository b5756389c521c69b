"""Tenant quotas: the limits in force (the tenant's, else the server's defaults), the checks an
ask or a new session passes, and the usage report.

Checks that must hold under concurrency (runs in progress, sessions) run in the transaction
that commits the run or the session, under a lock of the tenant's row: of two requests at the
limit one waits for the other's commit and then counts it. Tokens per day are checked against
what ended runs used: a run in flight is not counted yet, so a day may end a little over.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.db import tenants as tenants_db
from app.db.tables import LIMIT_COLUMNS, USAGE_COUNTS
from app.services.errors import Invalid, LimitExceeded, NotFound

# A client refused for runs in progress should come back soon: runs end at any moment.
CONCURRENT_RUNS_RETRY_SECONDS = 1
# Sessions do not free themselves: the client must delete some; ask again in a minute.
SESSION_LIMIT_RETRY_SECONDS = 60
# The longest range one usage report covers.
MAX_REPORT_DAYS = 366


@dataclass(frozen=True)
class Limits:
    """None: unlimited."""

    requests_per_minute: int | None = None
    concurrent_runs: int | None = None
    input_tokens_per_day: int | None = None
    output_tokens_per_day: int | None = None
    max_sessions: int | None = None


def defaults(settings: Settings) -> Limits:
    return Limits(
        requests_per_minute=settings.default_rpm,
        concurrent_runs=settings.default_concurrent_runs,
        input_tokens_per_day=settings.default_input_tokens_per_day,
        output_tokens_per_day=settings.default_output_tokens_per_day,
        max_sessions=settings.default_max_sessions,
    )


@dataclass(frozen=True)
class TenantLimits:
    tenant: str
    own: Limits  # what is set for the tenant (None: the default)
    effective: Limits  # what applies


async def limits_in(
    conn: AsyncConnection, settings: Settings, tenant_id: str
) -> tuple[Limits, Limits]:
    """The tenant's own limits, and the effective ones (the defaults filled in)."""
    row = await tenants_db.get_limits(conn, tenant_id)
    own = Limits(**{c: row[c] for c in LIMIT_COLUMNS}) if row is not None else Limits()
    return own, effective_limits(settings, own)


def effective_limits(settings: Settings, own: Limits) -> Limits:
    """The limits that apply: the tenant's own, the server's defaults for those it has not set."""
    fallback = defaults(settings)
    return Limits(
        **{c: v if v is not None else getattr(fallback, c) for c, v in asdict(own).items()}
    )


async def tenant_named(conn: AsyncConnection, name: str) -> RowMapping:
    row = await tenants_db.tenant_by_name(conn, name)
    if row is None:
        raise NotFound("tenant_not_found", f"no tenant {name}", {"tenant": name})
    return row


async def get_limits(engine: AsyncEngine, settings: Settings, tenant: str) -> TenantLimits:
    async with engine.connect() as conn:
        row = await tenant_named(conn, tenant)
        own, effective = await limits_in(conn, settings, str(row["id"]))
    return TenantLimits(tenant, own, effective)


async def set_limits(
    engine: AsyncEngine, settings: Settings, tenant: str, changes: dict[str, int | None]
) -> TenantLimits:
    """Set some of a tenant's limits (None: back to the server's default)."""
    unknown = set(changes) - set(LIMIT_COLUMNS)
    if unknown:
        raise Invalid("unknown_limit", f"no limit named {sorted(unknown)[0]}", {})
    negative = [name for name, value in changes.items() if value is not None and value < 0]
    if negative:
        raise Invalid("invalid_limit", f"{negative[0]} must be 0 or more", {"limit": negative[0]})
    async with engine.begin() as conn:
        row = await tenant_named(conn, tenant)
        if changes:
            await tenants_db.set_limits(conn, str(row["id"]), changes)
        own, effective = await limits_in(conn, settings, str(row["id"]))
    return TenantLimits(tenant, own, effective)


def _tomorrow(now: datetime) -> datetime:
    return datetime.combine(now.date() + timedelta(days=1), time(), UTC)


def ask_locks_tenant(settings: Settings, own: Limits | None) -> bool:
    """Whether check_ask locks the tenant's row (a limit on runs at once counts them), or may
    (`own` not read yet): such an ask commits under its session's lock."""
    return own is None or effective_limits(settings, own).concurrent_runs is not None


async def check_ask(
    conn: AsyncConnection,
    settings: Settings,
    tenant_id: str,
    *,
    replacing: int = 0,
    own: Limits | None = None,
) -> None:
    """Refuse (429) an ask the tenant's limits do not allow now; inside the ask's transaction,
    before anything is written. `replacing`: active runs this ask has just interrupted (they
    are ending, and do not count against it). `own`: the tenant's own limits when the caller
    has them already (the request's key lookup read them: not read again)."""
    limits = (
        effective_limits(settings, own)
        if own is not None
        else (await limits_in(conn, settings, tenant_id))[1]
    )
    if limits.input_tokens_per_day is not None or limits.output_tokens_per_day is not None:
        used_in, used_out = await tenants_db.tokens_today(conn, tenant_id)
        now = datetime.now(UTC)
        for kind, limit, used in (
            ("input", limits.input_tokens_per_day, used_in),
            ("output", limits.output_tokens_per_day, used_out),
        ):
            if limit is not None and used >= limit:
                reset = _tomorrow(now)
                raise LimitExceeded(
                    "token_quota_exceeded",
                    f"the tenant used {used} {kind} tokens today (UTC), its limit is {limit}",
                    {
                        "limit_name": f"{kind}_tokens_per_day",
                        "limit": limit,
                        "current": used,
                        "reset": reset.isoformat(),
                    },
                    max(1, int((reset - now).total_seconds()) + 1),
                )
    if limits.concurrent_runs is not None:
        await tenants_db.lock_tenant(conn, tenant_id)
        active = await tenants_db.count_active_runs(conn, tenant_id) - replacing
        if active >= limits.concurrent_runs:
            raise LimitExceeded(
                "concurrent_runs_limit",
                f"the tenant has {active} runs in progress, its limit is "
                f"{limits.concurrent_runs}: wait for one to end",
                {
                    "limit_name": "concurrent_runs",
                    "limit": limits.concurrent_runs,
                    "current": active,
                    "reset": None,
                },
                CONCURRENT_RUNS_RETRY_SECONDS,
            )


async def check_new_session(conn: AsyncConnection, settings: Settings, tenant_id: str) -> None:
    """Refuse (429) a new session (created, forked, or a chat's first) beyond max_sessions;
    inside the transaction that inserts it."""
    limit = (await limits_in(conn, settings, tenant_id))[1].max_sessions
    if limit is None:
        return
    await tenants_db.lock_tenant(conn, tenant_id)
    count = await tenants_db.count_sessions(conn, tenant_id)
    if count >= limit:
        raise LimitExceeded(
            "session_limit",
            f"the tenant has {count} sessions, its limit is {limit}: delete some first",
            {"limit_name": "max_sessions", "limit": limit, "current": count, "reset": None},
            SESSION_LIMIT_RETRY_SECONDS,
        )


def rate_limited(limit: int, count: int, window_start: datetime, retry_after: int) -> LimitExceeded:
    reset = window_start + timedelta(minutes=1)
    return LimitExceeded(
        "rate_limited",
        f"more than {limit} requests this minute: retry after {retry_after} s",
        {
            "limit_name": "requests_per_minute",
            "limit": limit,
            "current": count,
            "reset": reset.isoformat(),
        },
        retry_after,
    )


@dataclass(frozen=True)
class UsageRow:
    day: date
    tenant: str
    model: str
    runs: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    cost_usd: float
    unpriced_runs: int


@dataclass(frozen=True)
class UsageReport:
    start: date
    end: date
    rows: list[UsageRow]

    def totals(self) -> dict[str, Any]:
        sums: dict[str, Any] = {f: sum(getattr(r, f) for r in self.rows) for f in USAGE_COUNTS}
        sums["unpriced_runs"] = sum(r.unpriced_runs for r in self.rows)
        sums["cost_usd"] = round(sum(r.cost_usd for r in self.rows), 10)
        return sums


def report_range(start: date | None, end: date | None) -> tuple[date, date]:
    """Defaults: the last 30 days (UTC) up to today."""
    end = end or datetime.now(UTC).date()
    start = start or end - timedelta(days=29)
    if start > end:
        raise Invalid("invalid_range", "from is after to", {"from": str(start), "to": str(end)})
    if (end - start).days + 1 > MAX_REPORT_DAYS:
        raise Invalid(
            "range_too_long",
            f"a report covers at most {MAX_REPORT_DAYS} days",
            {"max_days": MAX_REPORT_DAYS},
        )
    return start, end


async def usage_report(
    engine: AsyncEngine,
    *,
    tenant_id: str | None = None,
    tenant: str | None = None,
    start: date | None = None,
    end: date | None = None,
) -> UsageReport:
    """Tokens and cost per UTC day and model, of one tenant (by id or name) or of all."""
    start, end = report_range(start, end)
    async with engine.connect() as conn:
        if tenant is not None:
            tenant_id = str((await tenant_named(conn, tenant))["id"])
        rows = await tenants_db.usage_rows(conn, tenant_id, start, end)
    return UsageReport(
        start,
        end,
        [
            UsageRow(
                day=r["day"],
                tenant=r["tenant"],
                model=r["model"],
                runs=int(r["runs"]),
                input_tokens=int(r["input_tokens"]),
                output_tokens=int(r["output_tokens"]),
                cached_tokens=int(r["cached_tokens"]),
                cache_write_tokens=int(r["cache_write_tokens"]),
                reasoning_tokens=int(r["reasoning_tokens"]),
                cost_usd=float(r["cost_usd"]),
                unpriced_runs=int(r["unpriced_runs"]),
            )
            for r in rows
        ],
    )
