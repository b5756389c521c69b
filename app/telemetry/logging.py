"""Logs: one JSON object a line (or plain text), each carrying the ids of the request or run
it belongs to: request_id, tenant_id, session_id, run_id.

The ids live in a context variable holding one dict per request (set by RequestIds, filled in
as the request learns its tenant, session and run) or per run (set by the worker from the ids
the run carries: its row's tenant, session and id, and the request id of the ask that created
it). uvicorn's access log goes through the same formatter.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

IDS = ("request_id", "tenant_id", "session_id", "run_id")
REQUEST_ID_HEADER = "x-request-id"
# A client's X-Request-ID is kept when it is this sane (it lands in every log line); else a
# new one is made.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")

_ids: ContextVar[dict[str, str] | None] = ContextVar("threadline_log_ids", default=None)
_json = False  # this process logs JSON (configure): its other stderr lines must be JSON too


def bind(**ids: str | None) -> None:
    """Add ids to the current request's or run's context (seen by every later log line of it,
    and by the middleware's, which shares the dict)."""
    current = _ids.get()
    if current is None:
        current = {}
        _ids.set(current)
    current.update({k: v for k, v in ids.items() if v})


def current_ids() -> dict[str, str]:
    return dict(_ids.get() or {})


@contextmanager
def scope(**ids: str | None) -> Iterator[dict[str, str]]:
    """A context of its own (a run in a worker), holding these ids."""
    fresh = {k: v for k, v in ids.items() if v}
    token = _ids.set(fresh)
    try:
        yield fresh
    finally:
        _ids.reset(token)


def request_id_of(given: str | None) -> str:
    """The client's X-Request-ID if it is sane, else a new one."""
    if given and _SANE_REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


class RequestIds:
    """ASGI middleware: each HTTP request gets a request id (the client's X-Request-ID if
    sane), echoed in the response's X-Request-ID, and a log context of its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope_: Scope, receive: Receive, send: Send) -> None:
        if scope_["type"] != "http":
            await self.app(scope_, receive, send)
            return
        given = None
        for name, value in scope_["headers"]:
            if name == b"x-request-id":
                given = value.decode("latin-1")
                break
        request_id = request_id_of(given)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-ID"] = request_id
            await send(message)

        with scope(request_id=request_id):
            await self.app(scope_, receive, send_with_id)


class ContextFilter(logging.Filter):
    """Puts the current ids on each record (as `ids`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.ids = current_ids()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, "ids", None) or current_ids())
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            client, method, path, _version, status = args
            line.update(client=client, method=method, path=path, status=status)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = getattr(record, "ids", None) or current_ids()
        if ids:
            text += " [" + " ".join(f"{k}={v}" for k, v in ids.items()) + "]"
        return text


def json_by_default(format_: str | None) -> bool:
    """The configured format, or json when stderr is not a terminal (a container, a unit)."""
    if format_ is not None:
        return format_ == "json"
    return not sys.stderr.isatty()


def log_config(level: str, format_: str | None) -> dict[str, Any]:
    """A logging.config.dictConfig for the process, uvicorn's loggers included (uvicorn.run's
    log_config)."""
    formatter = JsonFormatter if json_by_default(format_) else TextFormatter
    handler = {
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
        "formatter": "threadline",
        "filters": ["ids"],
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"ids": {"()": ContextFilter}},
        "formatters": {"threadline": {"()": formatter}},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {
            "uvicorn": {"handlers": [], "level": level.upper(), "propagate": True},
            "uvicorn.error": {"handlers": [], "level": level.upper(), "propagate": True},
            "uvicorn.access": {"handlers": [], "level": level.upper(), "propagate": True},
        },
    }


def configure(level: str, format_: str | None) -> None:
    """Configure this process's logging (`threadline worker`; serve passes log_config to
    uvicorn, which applies it)."""
    import logging.config

    global _json
    _json = json_by_default(format_)
    logging.config.dictConfig(log_config(level, format_))


def logs_json() -> bool:
    return _json
