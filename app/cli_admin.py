"""The `threadline keys`, `threadline tenants` and `threadline usage` commands: a tenant's API
keys, limits, session TTL and usage, straight against the database (the admin API does the
same over HTTP)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime
from typing import Any, TypeVar

from app.cli_database import database
from app.config import Settings
from app.credentials import vault_for

T = TypeVar("T")

LIMIT_FLAGS = {
    "rpm": "requests_per_minute",
    "concurrent_runs": "concurrent_runs",
    "input_tokens_per_day": "input_tokens_per_day",
    "output_tokens_per_day": "output_tokens_per_day",
    "max_sessions": "max_sessions",
}


def limit_value(value: str) -> int | None:
    """A limit: a count (0 or more), or `default` (the server's THREADLINE_DEFAULT_*)."""
    if value == "default":
        return None
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a count nor 'default'") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return count


MAX_TTL_SECONDS = 3_153_600_000  # 100 years, as the API's ttl_seconds
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(value: str) -> int | None:
    """`none`, or a whole number of seconds with an optional unit: 90, 90s, 15m, 12h, 30d, 2w."""
    text = value.strip().lower()
    if text == "none":
        return None
    unit = DURATION_UNITS.get(text[-1:])
    number = text[:-1] if unit is not None else text
    seconds = int(number) * (unit or 1) if number.isascii() and number.isdigit() else 0
    if not 0 < seconds <= MAX_TTL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration: a positive whole number with s, m, h, d or w (up to "
            "100 years), or none"
        )
    return seconds


def add_commands(commands: Any) -> None:
    """The keys, tenants and usage commands, into `threadline`'s subparsers."""
    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(
        dest="keys_command", required=True
    )
    create = keys.add_parser("create", help="print a new API key for a tenant (made if new)")
    create.add_argument("tenant", nargs="?", metavar="TENANT")
    create.add_argument("--tenant", dest="tenant_flag", metavar="TENANT", help="as TENANT")
    create.add_argument("--name", help="a label to tell the key apart")
    create.add_argument("--read-only", action="store_true", help="a key that may only read")
    listing = keys.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("tenant", nargs="?", metavar="TENANT", help="one tenant's (default: all)")
    listing.add_argument("--json", action="store_true", help="JSON lines")
    revoke = keys.add_parser("revoke", help="revoke a key at once, in every process")
    revoke.add_argument("key", metavar="PREFIX|ID", help="the key's prefix, id, or the key")
    rotate = keys.add_parser("rotate", help="print a new key with the same tenant, name, scope")
    rotate.add_argument("key", metavar="PREFIX|ID", help="the key's prefix, id, or the key")
    rotate.add_argument(
        "--grace",
        type=float,
        default=0,
        metavar="SECONDS",
        help="the old key keeps working this long (default 0: revoked at once)",
    )

    tenants = commands.add_parser("tenants", help="manage tenants").add_subparsers(
        dest="tenants_command", required=True
    )
    limits = tenants.add_parser("limits", help="show a tenant's limits, or set some")
    limits.add_argument("tenant", metavar="TENANT")
    for flag in LIMIT_FLAGS:
        limits.add_argument(
            f"--{flag.replace('_', '-')}",
            dest=flag,
            type=limit_value,
            default=argparse.SUPPRESS,
            metavar="N|default",
        )
    ttl = tenants.add_parser("ttl", help="set the default TTL of a tenant's new sessions")
    ttl.add_argument("tenant", metavar="TENANT")
    ttl.add_argument("duration", type=duration, help="e.g. 3600, 90m, 12h, 30d, 2w, or none")

    secrets = commands.add_parser(
        "secrets", help="stored credentials (MCP servers)"
    ).add_subparsers(dest="secrets_command", required=True)
    secrets.add_parser(
        "reencrypt", help="encrypt every stored credential again under the newest secret key"
    )

    usage = commands.add_parser("usage", help="tokens and cost per UTC day and model")
    usage.add_argument("tenant", nargs="?", metavar="TENANT", help="one tenant's (default: all)")
    usage.add_argument("--from", dest="start", type=date.fromisoformat, metavar="YYYY-MM-DD")
    usage.add_argument("--to", dest="end", type=date.fromisoformat, metavar="YYYY-MM-DD")
    usage.add_argument("--json", action="store_true", help="the report as JSON")


COMMANDS = ("keys", "tenants", "usage", "secrets")


def run(settings: Settings, args: argparse.Namespace) -> None:
    from app.services.errors import ServiceError

    try:
        if args.command == "keys":
            _keys(settings, args)
        elif args.command == "tenants" and args.tenants_command == "ttl":
            _session_ttl(settings, args.tenant, args.duration)
        elif args.command == "tenants":
            _limits(settings, args)
        elif args.command == "usage":
            _usage(settings, args)
        elif args.command == "secrets":
            _reencrypt(settings)
    except ServiceError as error:
        raise SystemExit(f"threadline {args.command}: {error.message}") from None


def with_engine(settings: Settings, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(engine)` against the database (the embedded one if no URL is set), migrated."""
    from app.db.engine import create_engine
    from app.db.migrate import upgrade_to_head

    with database(settings, own_cluster=False) as ready:
        assert ready.database_url is not None
        upgrade_to_head(ready.direct_url, vault_for(settings))

        async def go() -> T:
            engine = create_engine(ready)
            try:
                return await work(engine)
            finally:
                await engine.dispose()

        return asyncio.run(go())


def _keys(settings: Settings, args: argparse.Namespace) -> None:
    from app.services import keys

    if args.keys_command == "create":
        tenant = args.tenant or args.tenant_flag
        if not tenant or (args.tenant and args.tenant_flag and args.tenant != args.tenant_flag):
            raise SystemExit("threadline keys create: name one TENANT")
        issued = with_engine(
            settings, lambda e: keys.create_key(e, tenant, args.name, read_only=args.read_only)
        )
        print(issued, flush=True)
    elif args.keys_command == "list":
        found = with_engine(settings, lambda e: keys.list_keys(e, args.tenant))
        for key in found:
            if args.json:
                print(json.dumps(_key_json(key)), flush=True)
            else:
                print(_key_line(key), flush=True)
    elif args.keys_command == "revoke":

        async def revoke(engine: Any) -> keys.ApiKey:
            found = await keys.find_key(engine, args.key)
            return await keys.revoke_key(engine, found.id)

        print(f"revoked: {_key_line(with_engine(settings, revoke))}", flush=True)
    elif args.keys_command == "rotate":

        async def rotate(engine: Any) -> keys.IssuedKey:
            found = await keys.find_key(engine, args.key)
            return await keys.rotate_key(engine, found.id, grace_seconds=args.grace)

        print(with_engine(settings, rotate).key, flush=True)


def _reencrypt(settings: Settings) -> None:
    from app.services import mcp_servers, webhooks

    async def reencrypt(engine: Any) -> int:
        servers = await mcp_servers.reencrypt(engine, settings)
        return servers + await webhooks.reencrypt(engine, vault_for(settings))

    count = with_engine(settings, reencrypt)
    print(f"re-encrypted {count} credentials under the newest key", flush=True)


def _key_json(key: Any) -> dict[str, Any]:
    return {
        "id": key.id,
        "tenant": key.tenant,
        "prefix": key.prefix,
        "name": key.name,
        "scope": "read-only" if key.read_only else "full",
        "created_at": key.created_at.isoformat(),
        "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def _key_line(key: Any) -> str:
    """One key: tenant, prefix, id, scope, name, created, last used, revoked."""
    shown = _key_json(key)

    def when(value: str | None) -> str:
        return value[:19].replace("T", " ") if value else "-"

    return "  ".join(
        [
            shown["tenant"],
            shown["prefix"],
            shown["id"],
            shown["scope"],
            repr(shown["name"]) if shown["name"] else "-",
            f"created {when(shown['created_at'])}",
            f"used {when(shown['last_used_at'])}",
            _state(key.revoked_at, when(shown["revoked_at"])),
        ]
    )


def _state(revoked_at: datetime | None, shown: str) -> str:
    if revoked_at is None:
        return "active"
    if revoked_at > datetime.now(UTC):  # a rotated key's grace period
        return f"active until {shown}"
    return f"revoked {shown}"


def _limits(settings: Settings, args: argparse.Namespace) -> None:
    from app.services import quotas

    changes = {
        column: getattr(args, flag) for flag, column in LIMIT_FLAGS.items() if hasattr(args, flag)
    }
    found = with_engine(settings, lambda e: quotas.set_limits(e, settings, args.tenant, changes))
    for column in LIMIT_FLAGS.values():
        own, effective = getattr(found.own, column), getattr(found.effective, column)
        source = "" if own is not None else "  (default)"
        print(f"{column}: {'unlimited' if effective is None else effective}{source}", flush=True)


def _session_ttl(settings: Settings, tenant: str, ttl_seconds: int | None) -> None:
    """The default TTL of the tenant's new sessions (those already made keep their expiry)."""
    from app.services.retention import set_session_ttl

    with_engine(settings, lambda engine: set_session_ttl(engine, tenant, ttl_seconds))
    shown = "none" if ttl_seconds is None else f"{ttl_seconds} seconds"
    print(f"tenant {tenant}: new sessions expire after {shown}", flush=True)


def _usage(settings: Settings, args: argparse.Namespace) -> None:
    from app.services import quotas

    report = with_engine(
        settings,
        lambda e: quotas.usage_report(e, tenant=args.tenant, start=args.start, end=args.end),
    )
    if args.json:
        rows = [{**r.__dict__, "day": r.day.isoformat()} for r in report.rows]
        body = {
            "from": report.start.isoformat(),
            "to": report.end.isoformat(),
            "data": rows,
            "totals": report.totals(),
        }
        print(json.dumps(body, indent=2), flush=True)
        return
    header = (
        "day",
        "tenant",
        "model",
        "runs",
        "input",
        "output",
        "cached",
        "cache_write",
        "cost_usd",
    )
    lines = [header] + [
        (
            r.day.isoformat(),
            r.tenant,
            r.model,
            str(r.runs),
            str(r.input_tokens),
            str(r.output_tokens),
            str(r.cached_tokens),
            str(r.cache_write_tokens),
            f"{r.cost_usd:.6f}" + ("*" if r.unpriced_runs else ""),
        )
        for r in report.rows
    ]
    totals = report.totals()
    lines.append(
        (
            "total",
            "",
            "",
            str(totals["runs"]),
            str(totals["input_tokens"]),
            str(totals["output_tokens"]),
            str(totals["cached_tokens"]),
            str(totals["cache_write_tokens"]),
            f"{totals['cost_usd']:.6f}",
        )
    )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    if totals["unpriced_runs"]:
        print(
            f"* {totals['unpriced_runs']} runs of models without a known price are not in the cost"
        )
