"""JSON logs: a request's X-Request-ID is echoed, and the lines of the API that took an ask
and of the worker process that ran it carry the same request id and the run id."""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given as examples
from hypothesis import strategies as st

from app.telemetry.logging import JsonFormatter, request_id_of
from tests.telemetry.conftest import Deployment


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of the log, each of which must be a JSON object."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_line(path: Path, **fields: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        for line in json_lines(path):
            if all(line.get(k) == v for k, v in fields.items()):
                return line
        assert time.monotonic() < deadline, f"no line with {fields} in\n{path.read_text()}"
        time.sleep(0.1)


def test_the_request_id_reaches_the_worker_process(deployment: Deployment) -> None:
    request_id = f"abc-{uuid.uuid4().hex[:8]}"
    with deployment.client() as client:
        sid = client.post("/v1/sessions", json={}).json()["id"]
        asked = client.post(
            f"/v1/sessions/{sid}/ask",
            json={"input": "hi", "stream": False},
            headers={"X-Request-ID": request_id},
        )
        assert asked.status_code == 202, asked.text
        assert asked.headers["x-request-id"] == request_id
        run_id = asked.json()["id"]
        ended = client.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 60})
        assert ended.json()["status"] == "completed", ended.text

    access = wait_for_line(deployment.api_log, request_id=request_id, logger="uvicorn.access")
    assert access["run_id"] == run_id and access["session_id"] == sid
    assert access["method"] == "POST" and access["status"] == 202
    assert access["path"] == f"/v1/sessions/{sid}/ask" and access["tenant_id"]
    worker = wait_for_line(deployment.worker_log, request_id=request_id, run_id=run_id)
    assert worker["session_id"] == sid and worker["tenant_id"] == access["tenant_id"]
    ended_line = wait_for_line(
        deployment.worker_log, run_id=run_id, message=f"run {run_id}: completed"
    )
    assert ended_line["request_id"] == request_id
    # every line either process wrote is JSON (startup steps included)
    assert json_lines(deployment.api_log) and json_lines(deployment.worker_log)


def test_a_new_request_id_when_none_or_an_insane_one_is_given(deployment: Deployment) -> None:
    for given in (None, "", "a b", "x" * 129, "ünïcode", "line\nbreak"):
        headers = {b"x-request-id": given.encode()} if given is not None else {}
        try:
            response = httpx.get(f"{deployment.url}/healthz", headers=headers, timeout=30)
        except httpx.LocalProtocolError:
            continue  # a header the client itself will not send
        echoed = response.headers["x-request-id"]
        assert echoed != given and len(echoed) == 32
        int(echoed, 16)
    # errors echo it too
    response = httpx.get(f"{deployment.url}/v1/sessions", headers={"X-Request-ID": "keep.me-1"})
    assert response.status_code == 401 and response.headers["x-request-id"] == "keep.me-1"


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("abc", True),
        ("a" * 128, True),
        ("req:1/2+3=@x_y.z-", True),
        ("a" * 129, False),
        ("", False),
        ("a b", False),
        ("é", False),
        ("a\tb", False),
        (None, False),
    ],
)
def test_which_request_ids_are_kept(given: str | None, kept: bool) -> None:
    assert (request_id_of(given) == given) is kept


def test_a_json_line_carries_exceptions_and_unicode() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "ünï %s", ("ok",), sys.exc_info()
        )
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "ünï ok" and line["level"] == "error"
    assert "ValueError: bad" in line["exception"]


@examples(st.text(max_size=200))
def test_a_request_id_is_always_safe_to_log_and_echo(sent: str) -> None:
    chosen = request_id_of(sent)
    assert chosen == sent or (len(chosen) == 32 and int(chosen, 16) >= 0)
    assert 1 <= len(chosen) <= 128 and chosen.isascii() and chosen.isprintable()
    assert " " not in chosen
