"""`threadline serve` with zero configuration: embedded Postgres, dev key, data kept across
restarts, and no Postgres left behind after a stop."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import DEFAULT_LOCAL_MODEL
from app.db.migrate import head_revision
from testkit.server import free_port

THREADLINE = str(Path(sys.executable).parent / "threadline")


class Served:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
        self.process = subprocess.Popen(
            [THREADLINE, "serve", "--port", str(self.port)],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        try:
            self.key = self._read_key()
            # Keep draining the log so a full pipe never blocks the server.
            self.drain = threading.Thread(target=self._drain, daemon=True)
            self.drain.start()
            self.url = f"http://127.0.0.1:{self.port}"
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    def _read_key(self) -> str:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if line.startswith("Development API key: "):
                return line.split(": ", 1)[1].strip()
        raise AssertionError("serve exited without printing a key:\n" + "".join(self.output))

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("serve never became ready")

    def wait_for(self, text: str) -> None:
        """Until a line of the output holds `text` (a background step's report)."""
        deadline = time.monotonic() + 300
        while not any(text in line for line in self.output):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"serve never said {text!r}:\n" + "".join(self.output))
            time.sleep(0.1)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        if hasattr(self, "drain"):
            self.drain.join(timeout=10)  # the output's last lines
        return code


def postgres_processes(data_dir: Path) -> list[str]:
    """Command lines of running postgres processes serving a cluster under `data_dir`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended while we looked
        if "postgres" in args and str(data_dir) in args:
            found.append(args)
    return found


@pytest.mark.slow
def test_serve_with_zero_configuration(workdir: Path) -> None:
    data_dir = workdir / ".threadline"
    first = Served(workdir)
    try:
        auth = {"Authorization": f"Bearer {first.key}"}
        created = httpx.post(f"{first.url}/v1/sessions", json={"title": "kept"}, headers=auth)
        assert created.status_code == 201
        assert postgres_processes(data_dir), "the embedded cluster should run under the workdir"
        # The chat page, and the call its sign-in form makes with the printed key.
        page = httpx.get(f"{first.url}/", follow_redirects=True)
        assert page.status_code == 200 and page.url.path == "/ui/"
        models = httpx.get(f"{first.url}/v1/models", headers=auth).json()
        assert models["default_model"] == DEFAULT_LOCAL_MODEL
        first.wait_for("the local model is ready")
    finally:
        assert first.stop() == 0
    assert postgres_processes(data_dir) == []
    assert not (data_dir / "pg" / "postmaster.pid").exists()
    check_startup_output(first.output, migrated=True)

    second = Served(workdir)
    try:
        assert second.key == first.key  # the same dev key is printed again
        again = httpx.get(f"{second.url}/v1/sessions/{created.json()['id']}", headers=auth)
        assert again.status_code == 200 and again.json()["title"] == "kept"
        second.wait_for("the local model is ready")
    finally:
        assert second.stop() == 0
    assert postgres_processes(data_dir) == []
    check_startup_output(second.output, migrated=False)


def check_startup_output(output: list[str], migrated: bool) -> None:
    """What serve says as it starts: one line about migrations (a first start wrote alembic's
    19), a number of runs a person can act on, that the local model loads and when it is
    ready, and nothing but JSON in the log (llama.cpp wrote raw lines into it)."""
    head = head_revision()
    printed = [line.strip() for line in output if not line.startswith("{")]
    logged = [json.loads(line) for line in output if line.startswith("{")]
    messages = [entry["message"] for entry in logged]
    assert not any(
        "Running upgrade" in m or "alembic" in e["logger"]
        for e, m in zip(logged, messages, strict=True)
    )
    about_migrations = [m for m in messages if m.startswith(("migrated to", "database at"))]
    if migrated:
        assert len(about_migrations) == 1 and about_migrations[0].startswith(
            f"migrated to {head} ("
        )
    else:
        assert about_migrations == [f"database at {head}: no migration to apply"]
    assert not [line for line in printed if not line.startswith(KNOWN_LINES)], printed
    runs = next(line for line in printed if line.startswith("Runs at once"))
    assert "memory and open files allow" in runs and "THREADLINE_WORKER_CONCURRENCY" in runs
    assert any(line.startswith(f"Local model: {DEFAULT_LOCAL_MODEL}, loading") for line in printed)
    assert "loading the local model (local:smollm2-135m-instruct)…" in messages
    assert any(m.startswith("the local model is ready") for m in messages), messages


# What serve prints on stdout (the rest of its output is its JSON log).
KNOWN_LINES = (
    "Development API key: ",
    "Threadline serving on ",
    "Chat in the browser: ",
    "Runs at once",
    "Local model: ",
)


@pytest.mark.slow
def test_keys_create_prints_a_working_key(workdir: Path) -> None:
    served = Served(workdir)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
        result = subprocess.run(
            [THREADLINE, "keys", "create", "--tenant", "acme"],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        key = result.stdout.strip().splitlines()[-1]
        assert key.startswith("tl_")
        response = httpx.get(
            f"{served.url}/v1/sessions", headers={"Authorization": f"Bearer {key}"}
        )
        assert response.status_code == 200 and response.json()["data"] == []  # a new tenant
    finally:
        served.stop()
    assert postgres_processes(workdir / ".threadline") == []


def test_events_prints_the_tables_or_writes_them_between_the_markers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import main
    from app.eventlog.registry import markdown_table
    from app.runs.machine import transition_table

    main(["events"])
    assert capsys.readouterr().out == f"{transition_table()}\n\n{markdown_table()}"
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Doc\n<!-- run-states:start -->\nold\n<!-- run-states:end -->\n"
        "<!-- events:start -->\nstale\n<!-- events:end -->\nmore\n"
    )
    main(["events", "--update", str(readme)])
    expected = (
        f"# Doc\n<!-- run-states:start -->\n{transition_table()}\n<!-- run-states:end -->\n"
        f"<!-- events:start -->\n{markdown_table()}<!-- events:end -->\nmore\n"
    )
    assert readme.read_text() == expected
    main(["events", "--update", str(readme)])  # again: nothing changes
    assert readme.read_text() == expected
    readme.write_text("# Doc without markers\n")
    with pytest.raises(SystemExit, match="run-states:start"):
        main(["events", "--update", str(readme)])


def test_serve_takes_a_worker_count_of_zero_or_more() -> None:
    from app.cli import parser

    assert parser().parse_args(["serve", "--workers", "0"]).workers == 0
    assert parser().parse_args(["serve"]).workers is None  # THREADLINE_WORKER_CONCURRENCY
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--workers", "-1"])


def test_the_cli_modules_import_each_other_one_way() -> None:
    """app.cli imports the admin commands and the database they share; neither imports the
    CLI back (cli_admin took `database` from app.cli: an import circle)."""
    root = Path(__file__).resolve().parents[1] / "app"
    for module in ("cli_admin.py", "cli_database.py"):
        tree = ast.parse((root / module).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {
            alias.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "app"
            for alias in n.names
        }
        assert "app.cli" not in imported and "cli" not in imported, module


def threadline(
    database_url: str, *args: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`threadline ARGS` from this checkout, against the test database (`stdin`: its input)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env["THREADLINE_DATABASE_URL"] = database_url
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
        input=stdin,
    )


async def test_keys_create_list_rotate_revoke(database_url: str, engine: Any) -> None:
    from app.services.keys import authenticate

    tenant = f"cli-{uuid.uuid4()}"
    key = threadline(database_url, "keys", "create", tenant, "--name", "ci", "--read-only").stdout
    key = key.strip()
    caller = await authenticate(engine, key, None)
    assert caller is not None and caller.read_only
    listed = threadline(database_url, "keys", "list", tenant).stdout
    assert key[:12] in listed and "read-only" in listed and "'ci'" in listed and "active" in listed
    assert key not in listed
    (shown,) = [
        json.loads(line)
        for line in threadline(database_url, "keys", "list", tenant, "--json").stdout.splitlines()
    ]
    assert (shown["prefix"], shown["scope"], shown["revoked_at"]) == (key[:12], "read-only", None)

    rotated = threadline(database_url, "keys", "rotate", key[:12]).stdout.strip()
    assert rotated.startswith("tl_") and rotated != key
    assert await authenticate(engine, key, None) is None
    new = await authenticate(engine, rotated, None)
    assert new is not None and new.read_only  # same scope

    graced = threadline(database_url, "keys", "rotate", rotated, "--grace", "600").stdout.strip()
    assert await authenticate(engine, rotated, None) is not None  # still, for 10 minutes
    assert "active until 20" in threadline(database_url, "keys", "list", tenant).stdout
    new_id = json.loads(
        threadline(database_url, "keys", "list", tenant, "--json").stdout.splitlines()[-1]
    )["id"]
    revoked = threadline(database_url, "keys", "revoke", new_id).stdout
    assert revoked.startswith("revoked: ") and "revoked 20" in revoked
    assert await authenticate(engine, graced, None) is None

    missing = threadline(database_url, "keys", "revoke", "tl_nothing", check=False)
    assert missing.returncode != 0 and "no API key tl_nothing" in missing.stderr
    legacy = threadline(database_url, "keys", "create", "--tenant", tenant).stdout.strip()
    assert await authenticate(engine, legacy, None) is not None


def test_tenants_limits_show_and_set(database_url: str) -> None:
    tenant = f"cli-{uuid.uuid4()}"
    threadline(database_url, "keys", "create", tenant)
    shown = threadline(database_url, "tenants", "limits", tenant).stdout
    assert "requests_per_minute: unlimited  (default)" in shown
    set_ = threadline(
        database_url, "tenants", "limits", tenant, "--rpm", "10", "--max-sessions", "3"
    ).stdout
    assert "requests_per_minute: 10\n" in set_ and "max_sessions: 3\n" in set_
    assert "concurrent_runs: unlimited  (default)" in set_
    back = threadline(database_url, "tenants", "limits", tenant, "--rpm", "default").stdout
    assert "requests_per_minute: unlimited  (default)" in back and "max_sessions: 3\n" in back
    bad = threadline(database_url, "tenants", "limits", tenant, "--rpm", "-1", check=False)
    assert bad.returncode == 2 and "negative" in bad.stderr
    missing = threadline(database_url, "tenants", "limits", f"nobody-{uuid.uuid4()}", check=False)
    assert missing.returncode != 0 and "no tenant" in missing.stderr


async def test_usage_prints_the_report(database_url: str, engine: Any) -> None:
    from app.db import tenants as tenants_db

    tenant = f"cli-{uuid.uuid4()}"
    threadline(database_url, "keys", "create", tenant)
    async with engine.begin() as conn:
        row = await tenants_db.tenant_by_name(conn, tenant)
        assert row is not None
        tenant_id = row["id"]
        await conn.execute(
            tenants_db.USAGE_ADDED,
            tenants_db.usage_added(
                str(tenant_id),
                "openai:gpt-4o-mini",
                input_tokens=1000,
                output_tokens=200,
                cached_tokens=100,
                cache_write_tokens=0,
                cost_usd=Decimal("0.00027"),
            ),
        )
        await conn.execute(
            tenants_db.USAGE_ADDED,
            tenants_db.usage_added(
                str(tenant_id),
                "compat:mystery",
                input_tokens=5,
                output_tokens=1,
                cached_tokens=0,
                cache_write_tokens=0,
                cost_usd=None,
            ),
        )
    report = json.loads(threadline(database_url, "usage", tenant, "--json").stdout)
    assert report["totals"] == {
        "runs": 2,
        "input_tokens": 1005,
        "output_tokens": 201,
        "cached_tokens": 100,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
        "unpriced_runs": 1,
        "cost_usd": 0.00027,
    }
    assert {r["model"] for r in report["data"]} == {"openai:gpt-4o-mini", "compat:mystery"}
    table = threadline(database_url, "usage", tenant).stdout
    assert "openai:gpt-4o-mini" in table and "0.000270" in table and "1 runs of models" in table
    old = json.loads(
        threadline(
            database_url, "usage", tenant, "--from", "2020-01-01", "--to", "2020-01-02", "--json"
        ).stdout
    )
    assert old["data"] == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("15m", 900),
        ("12h", 43200),
        ("30D", 2592000),
        ("2w", 1209600),
        ("none", None),
        (" None ", None),
    ],
)
def test_tenants_ttl_reads_durations(text: str, seconds: int | None) -> None:
    from app.cli import parser

    args = parser().parse_args(["tenants", "ttl", "acme", text])
    assert (args.tenant, args.duration) == ("acme", seconds)


@pytest.mark.parametrize("text", ["0", "0d", "-5", "1.5h", "h", "", "12x", "²", "1y", "5000000w"])
def test_tenants_ttl_refuses_what_is_no_duration(text: str) -> None:
    from app.cli import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["tenants", "ttl", "acme", text])


def test_tenants_ttl_sets_the_default_of_new_sessions(database_url: str) -> None:
    import asyncio

    import asyncpg

    from app.db.engine import libpq_url
    from tests.e2e import create_database

    url = create_database(database_url, "cli_ttl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env["THREADLINE_DATABASE_URL"] = url

    def ttl(duration: str) -> int | None:
        result = subprocess.run(
            [THREADLINE, "tenants", "ttl", "acme", duration],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert "tenant acme" in result.stdout

        async def read() -> int | None:
            conn = await asyncpg.connect(libpq_url(url))
            try:
                value = await conn.fetchval(
                    "SELECT session_ttl_seconds FROM tenants WHERE name = 'acme'"
                )
                return None if value is None else int(value)
            finally:
                await conn.close()

        return asyncio.run(read())

    assert ttl("12h") == 43200
    assert ttl("none") is None
    refused = subprocess.run(
        [THREADLINE, "tenants", "ttl", "acme", "soon"], env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "not a duration" in refused.stderr


async def test_export_then_import_round_trips_a_session(database_url: str, engine: Any) -> None:
    """`threadline export SESSION > file` then `threadline import --tenant T < file`: a new
    session of T with the same entries; a missing session or tenant is a clear error."""
    from app.core.entries import EntryKind, NewEntry
    from app.services.journal import append_entries
    from app.services.keys import create_key
    from app.services.sessions import create_session

    tenant = f"cli-{uuid.uuid4()}"
    await create_key(engine, tenant)
    async with engine.connect() as conn:
        from app.db.tenants import tenant_by_name

        found = await tenant_by_name(conn, tenant)
    assert found is not None
    tenant_id = str(found["id"])
    sid = (await create_session(engine, tenant_id, title="cli", metadata={}, config={})).id
    said = [NewEntry(EntryKind.MESSAGE, {"role": "user", "content": "hello"}, {}, id="m1")]
    await append_entries(engine, tenant_id, sid, said, expected_rev=None)

    exported = threadline(database_url, "export", sid).stdout
    imported = threadline(database_url, "import", "--tenant", tenant, stdin=exported).stdout.strip()
    assert imported != sid
    again = threadline(database_url, "export", imported).stdout
    assert exported.split("\n", 1)[1] == again.split("\n", 1)[1]
    assert json.loads(again.splitlines()[1])["id"] == "m1"

    missing = threadline(database_url, "export", str(uuid.uuid4()), check=False)
    assert missing.returncode != 0 and "no session" in missing.stderr
    nobody = f"nobody-{uuid.uuid4()}"
    refused = threadline(database_url, "import", "--tenant", nobody, stdin=exported, check=False)
    assert refused.returncode != 0 and "no tenant" in refused.stderr
    cut = exported.rsplit("\n", 2)[0] + "\n"  # without its end line
    bad = threadline(database_url, "import", "--tenant", tenant, stdin=cut, check=False)
    assert bad.returncode != 0 and "cut short" in bad.stderr
