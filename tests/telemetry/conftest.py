"""A deployment of two processes on one host: `threadline serve --workers 0` (the API) and a
`threadline worker`, sharing a PROMETHEUS_MULTIPROC_DIR, each logging JSON to a file."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.config import Settings
from testkit.server import free_port, stop_process, wait_ready
from tests.conftest import issue_key
from tests.e2e import THREADLINE, create_database, process_env

METRICS_TOKEN = "telemetry-metrics-token"


@dataclass(frozen=True)
class Deployment:
    url: str
    key: str
    worker_metrics_url: str
    api_log: Path
    worker_log: Path
    metrics_dir: Path

    def client(self) -> httpx.Client:
        """A client of the API with the deployment's key."""
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=60
        )


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The command with its log (stderr) in `log`; stdout carries what it prints for people."""
    with log.open("wb") as err:
        return subprocess.Popen([THREADLINE, *args], env=env, stdout=subprocess.DEVNULL, stderr=err)


@pytest.fixture(scope="session")
def deployment(
    database_url: str, e2e_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    settings = e2e_settings.model_copy(
        update={"database_url": create_database(database_url, "telemetry")}
    )
    logs = tmp_path_factory.mktemp("telemetry-logs")
    metrics_dir = tmp_path_factory.mktemp("prometheus-multiproc")
    port, worker_port = free_port(), free_port()
    env = process_env(
        settings,
        port=port,
        log_format="json",
        metrics_token=METRICS_TOKEN,
        worker_metrics_port=worker_port,
    )
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    url = f"http://127.0.0.1:{port}"
    api = _start(["serve", "--workers", "0"], env, logs / "api.log")
    worker: subprocess.Popen[bytes] | None = None
    try:
        wait_ready(url, api, logs / "api.log")
        worker = _start(["worker", "--concurrency", "2"], env, logs / "worker.log")
        key = issue_key(settings, "telemetry")
        worker_url = f"http://127.0.0.1:{worker_port}"
        yield Deployment(url, key, worker_url, logs / "api.log", logs / "worker.log", metrics_dir)
    finally:
        if worker is not None:
            stop_process(worker)
        stop_process(api)
