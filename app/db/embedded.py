"""The embedded Postgres cluster: zero-configuration storage under the working directory.

System binaries are preferred (Debian's /usr/lib/postgresql/N/bin or whatever is on PATH); the
`pgserver` package's bundled binaries are the fallback. Postgres refuses to run as root, so as
root every server command runs as the `postgres` user through runuser. That user must be able to
walk down to the binaries and the cluster: when a checkout lives in a directory only its owner
can enter (root's home, a `mktemp -d` folder), the cluster is kept in a per-data-dir directory
under /var/tmp instead (data_dir/pg links to it) and pgserver's binaries are copied there once.
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
# Where clusters and binaries go when the postgres user cannot reach them (kept across reboots).
RELOCATION_ROOT = Path("/var/tmp")
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
        self.as_root = os.geteuid() == 0
        # The directory holding pg/ and run/: data_dir itself unless the server user cannot
        # enter it (as root, in a private directory).
        self.cluster_dir = self._choose_cluster_dir()
        self.relocated = self.cluster_dir != self.data_dir
        self.pgdata = self.cluster_dir / "pg"
        self.logfile = self.pgdata / "server.log"
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
            if self.relocated:
                self._prepare_relocated()
            self._check_reachable(self.cluster_dir)
            if not server_user_can_enter(self.bindir):
                self.bindir = reachable_copy(self.bindir)
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

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; mode `immediate` is a crash (no checkpoint, clients cut off)."""
        if self.running():
            self._run("pg_ctl", "stop", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "60")

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

    def _choose_cluster_dir(self) -> Path:
        if not self.as_root or server_user_can_enter(self.data_dir):
            return self.data_dir
        digest = hashlib.sha1(str(self.data_dir).encode()).hexdigest()[:16]
        return RELOCATION_ROOT / f"threadline-{digest}"

    def _prepare_relocated(self) -> None:
        """The cluster's directory, owned by the server user and private to it, and a link to
        it from data_dir so the cluster can be found where it would otherwise be."""
        self.cluster_dir.mkdir(mode=0o700, exist_ok=True)
        info = self.cluster_dir.lstat()
        owner = pwd.getpwnam(SERVER_USER).pw_uid
        # A predictable name in a world-writable directory: refuse one someone else made.
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, owner):
            raise EmbeddedPostgresError(
                f"{self.cluster_dir} exists and is not ours: remove it or set THREADLINE_DATA_DIR"
            )
        self._own(self.cluster_dir)
        os.chmod(self.cluster_dir, 0o700)
        link = self.data_dir / "pg"
        if not link.exists() and not link.is_symlink():
            link.symlink_to(self.pgdata)

    def _choose_socket_dir(self) -> Path:
        preferred = self.cluster_dir / "run"
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
            if not _may_enter(parent, _server_ids()):
                raise EmbeddedPostgresError(
                    f"the {SERVER_USER} user cannot enter {parent}: run `chmod o+x {parent}` "
                    "or set THREADLINE_DATA_DIR to a directory it can reach"
                )


def _server_ids() -> tuple[int, set[int]]:
    """The server user's uid and groups; a user yet to be created is in none."""
    try:
        user = pwd.getpwnam(SERVER_USER)
    except KeyError:
        return -1, set()
    groups = set(os.getgrouplist(SERVER_USER, user.pw_gid))
    return user.pw_uid, groups


def _may_enter(directory: Path, ids: tuple[int, set[int]]) -> bool:
    uid, groups = ids
    info = directory.stat()
    if info.st_uid == uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid in groups:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def server_user_can_enter(path: Path) -> bool:
    """Whether the server user may walk down to `path` (its existing part; it may enter `path`
    itself too when it is a directory)."""
    ids = _server_ids()
    existing = path if path.exists() else next(p for p in path.parents if p.exists())
    directories = [existing, *existing.parents] if existing.is_dir() else list(existing.parents)
    return all(_may_enter(directory, ids) for directory in directories)


def reachable_copy(bindir: Path) -> Path:
    """Binaries the server user can run: a copy of `bindir`'s installation under /var/tmp.

    pgserver's binaries find their libraries relative to themselves (pginstall/lib and, for the
    client tools, ../../../pgserver.libs), so the copy keeps that layout. Made once per source
    and version, atomically: concurrent starts share it.
    """
    install = bindir.parent
    siblings = install.parent.parent  # site-packages, for pgserver's layout
    libs = siblings / "pgserver.libs"
    version = (bindir / "postgres").stat()
    source_key = f"{bindir}:{version.st_size}:{version.st_mtime_ns}"
    digest = hashlib.sha1(source_key.encode()).hexdigest()[:16]
    target = RELOCATION_ROOT / f"threadline-pgbin-{digest}"
    relative = install.relative_to(siblings)
    copied_bindir = target / relative / bindir.name
    if (copied_bindir / "postgres").exists():
        return copied_bindir
    staging = Path(tempfile.mkdtemp(prefix="threadline-pgbin-", dir=RELOCATION_ROOT))
    try:
        staging.chmod(0o755)
        shutil.copytree(install, staging / relative, symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        try:
            staging.rename(target)
        except OSError:
            if not (copied_bindir / "postgres").exists():  # not a concurrent copy that won
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return copied_bindir


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
