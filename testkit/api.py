"""Requests to a Threadline API that tests and benchmarks make alike: sessions, appends, the
history page by page."""

from __future__ import annotations

import time
from typing import Any

import httpx


def message(text: str, role: str = "user", entry_id: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"kind": "message", "payload": {"role": role, "content": text}}
    if entry_id is not None:
        entry["id"] = entry_id
    return entry


async def new_session(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    return session


async def append(
    client: httpx.AsyncClient,
    session_id: str,
    *entries: dict[str, Any],
    expected_rev: int | None = None,
) -> httpx.Response:
    body: dict[str, Any] = {"entries": list(entries)}
    if expected_rev is not None:
        body["expected_rev"] = expected_rev
    return await client.post(f"/v1/sessions/{session_id}/entries", json=body)


async def append_texts(client: httpx.AsyncClient, session_id: str, *texts: str) -> list[int]:
    response = await append(client, session_id, *(message(t) for t in texts))
    assert response.status_code == 201, response.text
    return [e["seq"] for e in response.json()["entries"]]


async def history(
    client: httpx.AsyncClient, session_id: str, **params: Any
) -> list[dict[str, Any]]:
    """Every entry of the thread, following pages."""
    out: list[dict[str, Any]] = []
    after = params.pop("after_seq", None)
    while True:
        query = {**params, "limit": 200}
        if after is not None:
            query["after_seq"] = after
        response = await client.get(f"/v1/sessions/{session_id}/entries", params=query)
        assert response.status_code == 200, response.text
        page = response.json()
        out += page["data"]
        if not page["has_more"]:
            return out
        after = page["data"][-1]["seq"]


def texts(entries: list[dict[str, Any]]) -> list[str]:
    return [e["payload"]["content"] for e in entries]


TERMINAL_STATUSES = ("completed", "failed", "cancelled")


async def ended_run(client: httpx.AsyncClient, run_id: str, within: float = 300) -> dict[str, Any]:
    """The run once it has ended, long-polling its `wait` for as long as `within` seconds (a
    loaded machine may take a while)."""
    deadline = time.monotonic() + within
    while True:
        response = await client.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 60})
        assert response.status_code == 200, response.text
        run: dict[str, Any] = response.json()
        if run["status"] in TERMINAL_STATUSES:
            return run
        assert time.monotonic() < deadline, f"run {run_id} did not end: {run}"
