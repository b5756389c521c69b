"""A real PgBouncer in transaction mode in front of a Postgres reached by a Unix socket (the
embedded cluster's URLs), on a free port of 127.0.0.1.

    with PgBouncer(database_url) as bouncer:
        bouncer.url  # the same database, through the pooler

PgBouncer refuses to run as root: as root it runs as the `postgres` user, as the cluster does.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qs, urlsplit

from testkit.server import free_port, stop_process

SERVER_USER = "postgres"


def find_pgbouncer() -> str | None:
    """The pgbouncer binary (Debian installs it in /usr/sbin, often not on a user's PATH)."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    fallback = Path("/usr/sbin/pgbouncer")
    return str(fallback) if fallback.exists() else None


class PgBouncer:
    """PgBouncer in transaction mode for every database of the Postgres behind `database_url`."""

    def __init__(self, database_url: str, server_connections: int = 20) -> None:
        binary = find_pgbouncer()
        if binary is None:
            raise RuntimeError("pgbouncer not found: apt-get install -y pgbouncer")
        parts = urlsplit(database_url)
        socket_dir = parse_qs(parts.query).get("host", [parts.hostname or ""])[0]
        if not socket_dir.startswith("/"):
            raise ValueError(f"expected a Unix socket URL (host=/dir): {database_url!r}")
        self._user = parts.username or SERVER_USER
        self._database = parts.path.lstrip("/")
        self.port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="threadline-pgbouncer-"))
        self._dir.chmod(0o755)  # the server user reads its configuration here
        (self._dir / "users.txt").write_text(f'"{self._user}" ""\n')
        config = self._dir / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={socket_dir} port={parts.port or 5432}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self._dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {server_connections}\n"
            "max_client_conn = 2000\n"
            f"logfile = {self._dir / 'pgbouncer.log'}\n"
        )
        as_root = os.geteuid() == 0
        if as_root:
            server = pwd.getpwnam(SERVER_USER)
            os.chown(self._dir, server.pw_uid, server.pw_gid)
        self.process = subprocess.Popen(
            [binary, str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=SERVER_USER if as_root else None,
            group=SERVER_USER if as_root else None,
            extra_groups=[] if as_root else None,
        )
        self._wait_listening()

    @property
    def url(self) -> str:
        """The database of `database_url`, through the pooler."""
        return f"postgresql://{self._user}@127.0.0.1:{self.port}/{self._database}"

    def log(self) -> str:
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not start (exit {self.process.poll()}):\n{self.log()}")

    def stop(self) -> None:
        stop_process(self.process, timeout=10)  # SIGTERM: PgBouncer exits at once
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
