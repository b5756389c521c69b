"""The HTTP calls of the terminal chat: the public API, over httpx (SSE with httpx-sse)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource, connect_sse

from app.eventlog.registry import TERMINAL_EVENTS, EventType

# Heartbeats come every 15 s by default: a minute of silence is a dead connection.
READ_TIMEOUT_SECONDS = 60.0
# Reconnects in a row before a dropped stream is given up.
RECONNECTS = 5


class ChatError(Exception):
    """Something the user should read (never a traceback): the message says what to do."""


class ApiError(ChatError):
    """The service answered with its JSON error."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{message} ({status} {code})")
        self.status, self.code, self.message, self.details = status, code, message, details


class Unreachable(ChatError):
    pass


class KeyRefused(ChatError):
    pass


@dataclass(frozen=True)
class RunEvent:
    id: int
    event: str
    data: dict[str, Any]


class Client:
    """One service and one API key."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(30.0, read=READ_TIMEOUT_SECONDS),
        )

    def close(self) -> None:
        self._http.close()

    # -- plain JSON calls

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._respond(method, path, **kwargs)
        return response.json() if response.content else None

    def _respond(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        self._check(response)
        return response

    def _unreachable(self, exc: Exception) -> Unreachable:
        return Unreachable(
            f"cannot reach Threadline at {self.url} ({type(exc).__name__}: {exc or 'no answer'}). "
            "Is it running (`make run`, or `threadline serve`)? Another address: --url or "
            "THREADLINE_URL."
        )

    def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        if not response.is_closed:
            response.read()
        try:
            error = response.json()["error"]
            code, message, details = error["code"], error["message"], error.get("details")
        except (ValueError, KeyError, TypeError):
            code, message, details = "http_error", response.text[:200] or "no body", None
        if response.status_code == 401:
            raise KeyRefused(
                f"the API key was refused ({message}). Pass --key, set THREADLINE_API_KEY, "
                "or use the development key `threadline serve` prints."
            )
        raise ApiError(response.status_code, code, message, details)

    def create_session(self, agent: str | None = None) -> dict[str, Any]:
        body = {"agent": agent} if agent is not None else {}
        return dict(self._call("POST", "/v1/sessions", json=body))

    def session(self, session_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/sessions/{session_id}"))

    def fork(self, session_id: str, at_seq: int | None) -> dict[str, Any]:
        body = {} if at_seq is None else {"at_seq": at_seq}
        return dict(self._call("POST", f"/v1/sessions/{session_id}/fork", json=body))

    def set_model(self, session_id: str, model: str) -> dict[str, Any]:
        body = {"config": {"model": model}}
        return dict(self._call("PATCH", f"/v1/sessions/{session_id}", json=body))

    def latest_entries(
        self, session_id: str, limit: int, kinds: tuple[str, ...] = ()
    ) -> list[dict[str, Any]]:
        """The newest `limit` entries (of these kinds), oldest first."""
        params: dict[str, Any] = {"order": "desc", "limit": limit}
        if kinds:
            params["kinds"] = list(kinds)
        page = self._call("GET", f"/v1/sessions/{session_id}/entries", params=params)
        return list(reversed(page["data"]))

    def context(self, session_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/sessions/{session_id}/context"))

    def search(self, session_id: str, term: str, limit: int = 10) -> list[dict[str, Any]]:
        params = {"q": term, "limit": limit}
        return list(self._call("GET", f"/v1/sessions/{session_id}/search", params=params)["data"])

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/runs/{run_id}"))

    def cancel(self, run_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/runs/{run_id}/cancel"))

    def answer_approval(self, run_id: str, ruling: dict[str, Any]) -> dict[str, Any]:
        """One ruling ({tool_call_id, decision, arguments?, reason?}) on a waiting call."""
        body = {"approvals": [ruling]}
        return dict(self._call("POST", f"/v1/runs/{run_id}/approvals", json=body))

    def steer(self, session_id: str, text: str) -> tuple[str, str | None]:
        """A message for the session's run in progress, which its next model turn reads:
        (the run it went to, the steer's id); with no run in progress it is asked, and the
        steer id is None (the run is the one it started)."""
        body = {"input": text, "stream": False, "multitask_strategy": "steer"}
        key = {"Idempotency-Key": f"chat-{uuid.uuid4()}"}
        response = self._respond("POST", f"/v1/sessions/{session_id}/ask", json=body, headers=key)
        return str(response.json()["id"]), response.headers.get("Threadline-Steer-Id")

    # -- streams

    def ask(self, session_id: str, text: str, idempotency_key: str | None = None) -> Stream:
        """A streamed ask; repeating it with the same key joins the same run."""
        key = idempotency_key or f"chat-{uuid.uuid4()}"
        return Stream(self, f"/v1/sessions/{session_id}/ask", {"input": text}, key)

    def compact(self, session_id: str, focus: str | None) -> Stream:
        body: dict[str, Any] = {} if focus is None else {"focus": focus}
        return Stream(self, f"/v1/sessions/{session_id}/compact", body, f"chat-{uuid.uuid4()}")

    def run_events(self, run_id: str, after: int) -> Iterator[RunEvent]:
        """The run's events after event `after`, to its terminal event; a dropped connection is
        resumed with Last-Event-ID. Nothing when nothing is left to send (204)."""
        failures = 0
        while True:
            try:
                with connect_sse(
                    self._http,
                    "GET",
                    f"/v1/runs/{run_id}/events",
                    headers={"Last-Event-ID": str(after)},
                ) as source:
                    if source.response.status_code == 204:
                        return
                    self._check(source.response)
                    for event in _run_events(source):
                        after, failures = event.id, 0
                        yield event
                        if event.event in TERMINAL_EVENTS:
                            return
                return  # the server ended the stream: the run is over
            except httpx.TransportError as exc:
                failures += 1
                if failures > RECONNECTS:
                    raise self._unreachable(exc) from None


class Stream:
    """The events of an ask or compaction that starts a run, resumed where they dropped.

    `run_id` is known once `run.created` arrived. A connection that drops before it is asked
    again with the same Idempotency-Key (the same run); after it, the run's events are read
    again after the last one received."""

    def __init__(self, client: Client, path: str, body: dict[str, Any], key: str) -> None:
        self._client, self._path, self._body, self.key = client, path, body, key
        self.run_id: str | None = None
        self.last_id = 0
        self.ended: dict[str, Any] | None = None  # a run that was over already (202)
        self._saw_terminal = False

    def again(self) -> Stream:
        """The same request with the same Idempotency-Key, from its start: the same run."""
        return Stream(self._client, self._path, self._body, self.key)

    def __iter__(self) -> Iterator[RunEvent]:
        failures = 0
        while self.run_id is None:
            try:
                yield from self._post()
                if self.run_id is None:
                    return  # 202: the run of this key is over (see `ended`)
            except httpx.TransportError as exc:
                failures += 1
                if failures > RECONNECTS:
                    raise self._client._unreachable(exc) from None
            else:
                break
        if self.run_id is not None and not self._saw_terminal:
            for event in self._client.run_events(self.run_id, self.last_id):
                yield self._seen(event)

    def _seen(self, event: RunEvent) -> RunEvent:
        self.last_id = event.id
        if event.event == EventType.RUN_CREATED:
            self.run_id = str(event.data["run_id"])
        if event.event in TERMINAL_EVENTS:
            self._saw_terminal = True
        return event

    def _post(self) -> Iterator[RunEvent]:
        client = self._client
        with connect_sse(
            client._http,
            "POST",
            self._path,
            json={**self._body, "stream": True},
            headers={"Idempotency-Key": self.key},
        ) as source:
            if source.response.status_code == 202:
                source.response.read()
                self.ended = source.response.json()
                return
            client._check(source.response)
            for event in _run_events(source):
                if event.id <= self.last_id:
                    continue  # a repeated ask replays the run from its start
                yield self._seen(event)
                if event.event in TERMINAL_EVENTS:
                    return
        if self.run_id is not None and not self._saw_terminal:
            raise httpx.RemoteProtocolError("the stream ended before the run did")


def _run_events(source: EventSource) -> Iterator[RunEvent]:
    """The run events of a stream, passing over what is not one (httpx-sse yields an event
    without data for the blank line after a heartbeat comment)."""
    for sse in source.iter_sse():
        if sse.data:
            yield RunEvent(int(sse.id), sse.event, json.loads(sse.data))
