"""The `threadline export` and `threadline import` commands: session files, straight against the
database (for operators: any tenant's session; the API does the same per tenant over HTTP)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

from app.cli_admin import with_engine
from app.config import Settings

COMMANDS = ("export", "import")
READ_CHUNK = 1 << 20  # bytes of standard input read at a time


def add_commands(commands: Any) -> None:
    """The export and import commands, into `threadline`'s subparsers."""
    export = commands.add_parser(
        "export", help="print a session as a session file (JSON Lines) on standard output"
    )
    export.add_argument("session", metavar="SESSION", help="the session's id")
    export.add_argument(
        "--memory", action="store_true", help="include the memory namespace the session uses"
    )
    imported = commands.add_parser(
        "import", help="read a session file on standard input into a new session; print its id"
    )
    imported.add_argument(
        "--tenant", required=True, metavar="TENANT", help="the tenant the new session belongs to"
    )


def run(settings: Settings, args: argparse.Namespace) -> None:
    from app.services.errors import ServiceError

    try:
        if args.command == "export":
            _export(settings, args.session, args.memory, sys.stdout.buffer)
        else:
            print(_import(settings, args.tenant, sys.stdin.buffer), flush=True)
    except ServiceError as error:
        raise SystemExit(f"threadline {args.command}: {error.message}") from None


def _export(settings: Settings, session: str, memory: bool, out: BinaryIO) -> None:
    from app.db import sessions as sessions_db
    from app.services import session_files
    from app.services.errors import session_not_found

    try:
        session_id = str(uuid.UUID(session))
    except ValueError:
        raise SystemExit(f"threadline export: {session!r} is not a session id") from None

    async def export(engine: Any) -> None:
        async with engine.connect() as conn:
            tenant_id = await sessions_db.tenant_of(conn, session_id)
        if tenant_id is None:
            raise session_not_found(session_id)
        lines = session_files.export_lines(engine, tenant_id, session_id, memory=memory)
        async for line in lines:
            out.write(line)
        out.flush()

    with_engine(settings, export)


def _import(settings: Settings, tenant: str, source: BinaryIO) -> str:
    from app.api.session_files import session_fields
    from app.db import tenants as tenants_db
    from app.services import session_files

    async def chunks() -> AsyncIterator[bytes]:
        while chunk := await asyncio.to_thread(source.read, READ_CHUNK):
            yield chunk

    async def load(engine: Any) -> str:
        async with engine.connect() as conn:
            found = await tenants_db.tenant_by_name(conn, tenant)
        if found is None:
            raise SystemExit(f"threadline import: no tenant {tenant!r}")
        session = await session_files.import_session(
            engine, str(found["id"]), chunks(), settings=settings, check_fields=session_fields
        )
        return session.id

    return with_engine(settings, load)
