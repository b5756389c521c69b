"""The embedded cluster: system binaries first, pgserver's as the fallback, clear errors."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
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
    bindir = next(_pgserver_bindir())
    cluster = EmbeddedPostgres(workdir / "data", bindir=bindir)
    try:
        url = cluster.start()
        assert cluster.started_here and cluster.running()
        assert _server_version(cluster)
        assert url.endswith(f"?host={cluster.socket_dir}")
    finally:
        cluster.stop()
        if cluster.bindir != bindir:  # copied for the postgres user (a private checkout)
            shutil.rmtree(cluster.bindir.parents[2], ignore_errors=True)
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


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A directory only its owner can enter, like root's home or a `mktemp -d` folder."""
    path = Path(tempfile.mkdtemp(prefix="threadline-private-"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _server_version(cluster: EmbeddedPostgres) -> str:
    async def version() -> str:
        conn = await asyncpg.connect(
            host=str(cluster.socket_dir), user="postgres", database="threadline"
        )
        try:
            return str(await conn.fetchval("SHOW server_version"))
        finally:
            await conn.close()

    return asyncio.run(version())


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the cluster to postgres")


@pytest.mark.slow
@as_root
def test_a_data_dir_inside_a_private_directory_works_as_root(private_dir: Path) -> None:
    data_dir = private_dir / "checkout" / ".threadline"
    cluster = EmbeddedPostgres(data_dir)
    try:
        cluster.start()
        assert cluster.relocated and _server_version(cluster)
        # Found where it would be, and the same cluster again on the next start.
        assert (data_dir / "pg").resolve() == cluster.pgdata
        assert EmbeddedPostgres(data_dir).pgdata == cluster.pgdata
    finally:
        cluster.stop()
        shutil.rmtree(cluster.cluster_dir, ignore_errors=True)
    assert not cluster.running()


@pytest.mark.slow
@as_root
def test_pgserver_binaries_inside_a_private_directory_work_as_root(
    private_dir: Path, workdir: Path
) -> None:
    # A checkout's own venv in a private directory: pgserver's files keep their layout.
    installed = next(_pgserver_bindir()).parents[2]
    site_packages = private_dir / "site-packages"
    shutil.copytree(installed / "pgserver" / "pginstall", site_packages / "pgserver" / "pginstall")
    shutil.copytree(installed / "pgserver.libs", site_packages / "pgserver.libs")
    bindir = site_packages / "pgserver" / "pginstall" / "bin"
    cluster = EmbeddedPostgres(workdir / "data", bindir=bindir)
    try:
        cluster.start()
        assert _server_version(cluster)
        assert cluster.bindir != bindir  # ran from a copy the postgres user can reach
    finally:
        cluster.stop()
        if cluster.bindir != bindir:
            shutil.rmtree(cluster.bindir.parents[2], ignore_errors=True)
    assert not cluster.running()
