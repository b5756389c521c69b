"""The Docker image's entry command starts as its non-root user with the environment the
Dockerfile sets, even though that user's login home is not writable (no Docker engine here: the
command runs on this machine as `nobody`). Also: the build context stays small."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.db.embedded import throwaway_cluster
from testkit.server import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
RUN_AS = "nobody"  # a non-root user whose home (/nonexistent) cannot be written


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            logical.append(pending + line)
            pending = ""
    pairs = []
    for entry in logical:
        keyword, _, rest = entry.strip().partition(" ")
        pairs.append((keyword.upper(), rest.strip()))
    return pairs


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in instructions():
        if keyword == "ENV":
            for assignment in shlex.split(rest):
                name, _, value = assignment.partition("=")
                env[name] = value
    return env


def image_command() -> list[str]:
    (command,) = [json.loads(rest) for keyword, rest in instructions() if keyword == "CMD"]
    assert isinstance(command, list)
    return [str(part) for part in command]


def test_the_image_runs_as_a_non_root_user() -> None:
    users = [rest for keyword, rest in instructions() if keyword == "USER"]
    assert users and users[-1] not in ("root", "0")


def test_the_build_context_keeps_only_what_the_image_copies() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored  # everything is excluded unless listed
    allowed = {line[1:].rstrip("/") for line in ignored if line.startswith("!")}
    copied = set()
    for keyword, rest in instructions():
        if keyword == "COPY":
            copied |= {part.rstrip("/") for part in rest.split()[:-1]}
    assert copied and copied <= allowed, copied - allowed


def test_what_the_image_copies_builds_a_wheel_with_the_migrations(tmp_path: Path) -> None:
    """The image installs the wheel built from what its COPY instructions bring in: that is
    enough to build it, and the wheel holds the top-level migrations/ inside the package."""
    context = tmp_path / "context"
    for keyword, rest in instructions():
        if keyword == "COPY":
            *sources, target = rest.split()
            for source in sources:
                into = context / target / (Path(source).name if target.endswith("/") else "")
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, into, ignore=shutil.ignore_patterns("__py*"))
                else:
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(ROOT / source, into)
    out = tmp_path / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(context)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("threadline-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    revisions = sorted((ROOT / "migrations" / "versions").glob("*.py"))
    assert revisions
    for revision in revisions:
        assert f"app/db/migrations/versions/{revision.name}" in names
    assert {"app/db/migrations/env.py", "app/db/migrations/script.py.mako"} <= names


@pytest.fixture
def open_cluster() -> Iterator[str]:
    """A migrated cluster whose socket other users may connect to (the image's user is not
    the postgres user, as with a real database server)."""
    with throwaway_cluster("threadline-docker-", {"unix_socket_permissions": "0777"}) as url:
        yield url


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_the_entry_command_serves_as_a_user_whose_home_is_not_writable(
    open_cluster: str,
) -> None:
    user = pwd.getpwnam(RUN_AS)
    assert not os.access(user.pw_dir, os.W_OK) or not Path(user.pw_dir).exists()
    env = image_env()
    image_home = env.get("HOME")
    with tempfile.TemporaryDirectory(prefix="threadline-image-") as root:
        Path(root).chmod(0o755)
        # The image's state directory (its HOME, which the Dockerfile makes the user's own),
        # mapped to a fresh directory of the same owner. A Dockerfile that sets no HOME gets
        # what Docker gives: the user's passwd home, which nothing made writable.
        state = Path(root, "state")
        state.mkdir()
        if image_home:
            os.chown(state, user.pw_uid, user.pw_gid)
            env = {k: v.replace(image_home, str(state)) for k, v in env.items()}
        else:
            env["HOME"] = str(state)  # root's, like a home created by useradd --system
        # This checkout's code, readable by everyone as the image's installed package is
        # (alembic checks the migrations with access(2), which ignores capabilities).
        code = Path(root, "site")
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / "app", code / "app", ignore=ignore)
        # where the wheel's build maps them (pyproject.toml's package-dir)
        shutil.copytree(ROOT / "migrations", code / "app" / "db" / "migrations", ignore=ignore)
        port = free_port()
        env.update(
            PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin",  # where `threadline` is
            PYTHONPATH=str(code),
            THREADLINE_DATABASE_URL=open_cluster,
            THREADLINE_HOST="127.0.0.1",
            THREADLINE_PORT=str(port),
            THREADLINE_WORKER_CONCURRENCY="1",
        )
        # Reading the venv anywhere (a checkout in a private directory) is not what is tested:
        # CAP_DAC_READ_SEARCH lets the user read and traverse, never write.
        command = [
            "setpriv",
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--clear-groups",
            "--inh-caps=+dac_read_search",
            "--ambient-caps=+dac_read_search",
            *image_command(),
        ]
        log = Path(root, "log")
        with log.open("wb") as output:
            server = subprocess.Popen(
                command, cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT
            )
            try:
                ready = wait_ready(f"http://127.0.0.1:{port}", server, log)
                assert ready.json()["status"] == "ready"
            finally:
                server.terminate()
                server.wait(timeout=60)
        # The tokenizer's vocabulary went where the image's environment says.
        tiktoken_cache = Path(env.get("TIKTOKEN_CACHE_DIR") or Path(env["HOME"], ".cache"))
        assert tiktoken_cache.is_relative_to(state)
        assert any(tiktoken_cache.rglob("*")), "the vocabulary should be cached"
