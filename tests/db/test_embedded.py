"""The embedded cluster: system binaries first, pgserver's as the fallback, clear errors."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import asyncpg
import pytest

from app.db.embedded import EmbeddedPostgres, EmbeddedPostgresError, _pgserver_bindir, find_bindir


def test_system_binaries_are_preferred() -> None:
    bindir = find_bindir()
    if shutil.which("pg_ctl") or list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        assert "pgserver" not in str(bindir)
    assert (bindir / "postgres").exists()


@pytest.mark.slow
def test_pgserver_binaries_run_a_cluster_that_stops_cleanly(workdir: Path) -> None:
    cluster = EmbeddedPostgres(workdir / "data", bindir=next(_pgserver_bindir()))
    try:
        url = cluster.start()
        assert cluster.started_here and cluster.running()

        async def version() -> str:
            conn = await asyncpg.connect(
                host=str(cluster.socket_dir), user="postgres", database="threadline"
            )
            try:
                return str(await conn.fetchval("SHOW server_version"))
            finally:
                await conn.close()

        assert asyncio.run(version())
        assert url.endswith(f"?host={cluster.socket_dir}")
    finally:
        cluster.stop()
    assert not cluster.running()
    assert not (workdir / "data" / "pg" / "postmaster.pid").exists()


def test_unreachable_data_dir_is_a_clear_error(workdir: Path) -> None:
    # Checked before starting as root: the postgres user could not walk down to the data.
    locked = workdir / "locked"
    locked.mkdir(mode=0o700)
    with pytest.raises(EmbeddedPostgresError, match=f"cannot enter {locked}"):
        EmbeddedPostgres._check_reachable(locked / "data")
    EmbeddedPostgres._check_reachable(workdir / "data")  # a 0755 path is fine


def test_long_paths_get_a_short_socket_dir(workdir: Path) -> None:
    deep = workdir / ("x" * 120) / "data"
    cluster = EmbeddedPostgres(deep)
    assert len(str(cluster.socket_dir)) < 90
    assert cluster.socket_dir == EmbeddedPostgres(deep).socket_dir  # stable across restarts
