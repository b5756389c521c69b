"""The wheel is complete: installed outside the checkout, `threadline migrate` and `serve` work."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit.server import free_port, wait_ready
from tests.e2e import create_database

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv outside the checkout holding only the built wheel; its dependencies are those of
    the test venv (a .pth line adds that site-packages without running its editable finder)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("threadline-*.whl")
    venv = out / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=_without_checkout(),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        capture_output=True,
        env=_without_checkout(),  # else pip finds the checkout's egg-info: "already installed"
    )
    # After the install: pip must not see the checkout's editable install as already there.
    Path(site, "test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield wheel


def _without_checkout() -> dict[str, str]:
    """The environment, minus the PYTHONPATH that makes the checkout importable."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _env(venv: Path, database_url: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in _without_checkout().items() if not k.startswith("THREADLINE_")}
    env["THREADLINE_DATABASE_URL"] = database_url
    env["THREADLINE_PROCESSES"] = "1"  # one process to watch and stop
    env.update({f"THREADLINE_{k.upper()}": v for k, v in settings.items()})
    return env


def test_the_wheel_ships_the_migrations(installed: Path) -> None:
    """The checkout's top-level migrations/, mapped into the package by the build."""
    names = zipfile.ZipFile(installed).namelist()
    revisions = sorted((ROOT / "migrations" / "versions").glob("*.py"))
    assert revisions
    for revision in revisions:
        assert f"app/db/migrations/versions/{revision.name}" in names
    assert "app/db/migrations/env.py" in names
    assert "app/db/migrations/script.py.mako" in names


def test_the_wheel_ships_the_chat_page(installed: Path) -> None:
    """The page's built assets, byte for byte: an installed service serves it without Node."""
    wheel = zipfile.ZipFile(installed)
    static = ROOT / "app" / "web" / "static"
    shipped = sorted(static.iterdir())
    assert [p.name for p in shipped] == ["app.css", "app.js", "favicon.svg", "index.html"]
    for asset in shipped:
        assert wheel.read(f"app/web/static/{asset.name}") == asset.read_bytes()


def test_the_wheel_ships_the_service_alone(installed: Path) -> None:
    """testkit/, tests/ and bench/ run from the checkout: none of them is installed."""
    tops = {name.split("/")[0] for name in zipfile.ZipFile(installed).namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"app"}


@pytest.mark.slow
def test_installed_wheel_migrates_and_serves_outside_the_checkout(
    installed: Path, database_url: str
) -> None:
    venv = installed.parent / "venv"
    threadline = str(venv / "bin" / "threadline")
    fresh = create_database(
        database_url, "wheel", migrate=False
    )  # `threadline migrate` must create the schema
    with tempfile.TemporaryDirectory() as elsewhere:
        where = subprocess.run(
            [venv / "bin" / "python", "-c", "import app; print(app.__file__)"],
            cwd=elsewhere,
            env=_env(venv, fresh),
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert where.startswith(str(venv)), where
        migrated = subprocess.run(
            [threadline, "migrate"],
            cwd=elsewhere,
            env=_env(venv, fresh),
            capture_output=True,
            text=True,
        )
        assert migrated.returncode == 0, migrated.stderr
        port = free_port()
        server = subprocess.Popen(
            [threadline, "serve", "--port", str(port)],
            cwd=elsewhere,
            env=_env(venv, fresh, worker_concurrency="0"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ready = wait_ready(f"http://127.0.0.1:{port}", server)
            assert ready.json()["status"] == "ready"
            assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
            assert httpx.get(f"http://127.0.0.1:{port}/docs").status_code == 200
            page = httpx.get(f"http://127.0.0.1:{port}/", follow_redirects=True)
            assert page.status_code == 200 and '<script src="app.js">' in page.text
            assert httpx.get(f"http://127.0.0.1:{port}/ui/app.js").status_code == 200
        finally:
            server.terminate()
            server.wait(timeout=60)
