"""The embedded Postgres cluster: zero-configuration storage under the working directory.

System binaries are preferred (Debian's /usr/lib/postgresql/N/bin or whatever is on PATH); the
`pgserver` package's bundled binaries are the fallback. Postgres refuses to run as root, so as
root every server command runs as the `postgres` user through runuser.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import asyncpg

DATABASE = "threadline"
SERVER_USER = "postgres"
# A Unix socket path may not exceed 107 bytes; ".s.PGSQL.5432" takes 14 of them.
_MAX_SOCKET_DIR = 90


class EmbeddedPostgresError(RuntimeError):
    pass


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres: the system's, else pgserver's."""
    on_path = shutil.which("pg_ctl")
    system = [Path(on_path).resolve().parent] if on_path else []
    system += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for bindir in chain(system, _pgserver_bindir()):
        if all((bindir / name).exists() for name in ("initdb", "pg_ctl", "postgres")):
            return bindir
    raise EmbeddedPostgresError(
        "no PostgreSQL binaries found: install them (apt-get install -y postgresql) "
        "or the pgserver package, or set THREADLINE_DATABASE_URL"
    )


def _pgserver_bindir() -> Iterator[Path]:
    """Lazily: importing pgserver is only worth it when the system has no binaries."""
    try:
        import pgserver
    except ImportError:
        return
    yield Path(pgserver.__file__).parent / "pginstall" / "bin"


@dataclass
class EmbeddedPostgres:
    data_dir: Path
    bindir: Path = field(default_factory=find_bindir)
    # Extra `-c name=value` server settings (tests turn durability off for speed).
    server_settings: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data_dir = self.data_dir.resolve()
        self.pgdata = self.data_dir / "pg"
        self.logfile = self.pgdata / "server.log"
        self.as_root = os.geteuid() == 0
        self.socket_dir = self._choose_socket_dir()
        self.started_here = False  # False when start() found the cluster already running

    @property
    def url(self) -> str:
        return f"postgresql://{SERVER_USER}@/{DATABASE}?host={self.socket_dir}"

    def start(self) -> str:
        """Create the cluster if needed, start it, make sure the database exists; return its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.as_root:
            self._ensure_server_user()
            self._check_reachable(self.data_dir)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self._own(self.socket_dir)
        if not (self.pgdata / "PG_VERSION").exists():
            self.pgdata.mkdir(exist_ok=True)
            self._own(self.pgdata)
            os.chmod(self.pgdata, 0o700)
            self._run(
                "initdb",
                "-D",
                str(self.pgdata),
                "-U",
                SERVER_USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            )
        if not self.running():
            options = f"-c listen_addresses='' -k {self.socket_dir} -c unix_socket_permissions=0700"
            options += "".join(f" -c {k}={v}" for k, v in self.server_settings.items())
            self._run(
                "pg_ctl",
                "start",
                "-D",
                str(self.pgdata),
                "-l",
                str(self.logfile),
                "-w",
                "-t",
                "60",
                "-o",
                options,
            )
            self.started_here = True
        asyncio.run(self._ensure_database())
        return self.url

    def stop(self) -> None:
        if self.running():
            self._run("pg_ctl", "stop", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "60")

    def running(self) -> bool:
        if not (self.pgdata / "postmaster.pid").exists():
            return False
        status = subprocess.run(
            self._command("pg_ctl", "status", "-D", str(self.pgdata)),
            capture_output=True,
            text=True,
            check=False,
        )
        return status.returncode == 0

    async def _ensure_database(self) -> None:
        conn = await asyncpg.connect(
            host=str(self.socket_dir), user=SERVER_USER, database="postgres"
        )
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
            if not exists:
                await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await conn.close()

    def _choose_socket_dir(self) -> Path:
        preferred = self.data_dir / "run"
        if len(str(preferred)) <= _MAX_SOCKET_DIR:
            return preferred
        digest = hashlib.sha1(str(self.data_dir).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"threadline-{digest}"

    def _command(self, program: str, *args: str) -> list[str]:
        argv = [str(self.bindir / program), *args]
        return ["runuser", "-u", SERVER_USER, "--", *argv] if self.as_root else argv

    def _run(self, program: str, *args: str) -> None:
        result = subprocess.run(
            self._command(program, *args), capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            log = self.logfile.read_text()[-2000:] if self.logfile.exists() else ""
            raise EmbeddedPostgresError(
                f"{program} failed ({result.returncode}): {result.stderr.strip()}\n{log}".strip()
            )

    def _own(self, path: Path) -> None:
        if self.as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(path, user.pw_uid, user.pw_gid)

    @staticmethod
    def _ensure_server_user() -> None:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    SERVER_USER,
                ],
                check=True,
            )

    @staticmethod
    def _check_reachable(path: Path) -> None:
        """The postgres user must be able to walk down to the data directory."""
        for parent in path.parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                raise EmbeddedPostgresError(
                    f"the {SERVER_USER} user cannot enter {parent}: run `chmod o+x {parent}` "
                    "or set THREADLINE_DATA_DIR to a directory it can reach"
                )


@contextmanager
def throwaway_cluster(prefix: str, server_settings: dict[str, str] | None = None) -> Iterator[str]:
    """A migrated cluster in a fresh temporary directory, removed on exit; yields its URL.

    For tests and benchmarks, which must never touch a real data directory.
    """
    from app.db.migrate import upgrade_to_head

    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)  # the postgres user must be able to enter it when we run as root
    cluster = EmbeddedPostgres(root / "data", server_settings=server_settings or {})
    try:
        url = cluster.start()
        upgrade_to_head(url)
        yield url
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
