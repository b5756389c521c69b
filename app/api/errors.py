"""One JSON error shape for every failure: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.bodies import InvalidUnicode
from app.db.outage import database_unavailable
from app.services.errors import (
    Conflict,
    Forbidden,
    Invalid,
    LimitExceeded,
    Malformed,
    NotFound,
    PreconditionFailed,
    ServiceError,
    TooLarge,
)

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    code: str = Field(description="Stable, machine-readable error code.")
    message: str = Field(description="What went wrong, for people.")
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    error: ErrorBody


_DESCRIPTIONS = {
    400: "Malformed request (e.g. the body is not valid JSON).",
    401: "Missing or unknown API key.",
    403: "The credentials are valid but do not open this (a stream token for another session "
    "or run: `stream_token_scope`; a read-only API key on a route that writes: "
    "`read_only_key`).",
    404: "No such resource for this tenant.",
    409: "Conflicts with the current state (e.g. a stale expected_rev).",
    412: "A precondition (If-Match, If-None-Match) does not hold; details give the current ETag.",
    413: "The request body is larger than the configured limit.",
    415: "The body's Content-Type is not one this route reads (see its request body).",
    422: "Well-formed, but a value is invalid; details name the offending path.",
    429: "A quota of the tenant refuses the request for now: `rate_limited` (requests per "
    "minute), `concurrent_runs_limit`, `token_quota_exceeded` (tokens per UTC day), "
    "`session_limit`; details give the limit, the current count and when it resets. Retry "
    "after the Retry-After header's seconds. Nothing was written.",
    503: "The database cannot be reached now (`database_unavailable`): retry after the "
    "Retry-After header's seconds. /readyz also says `migrations_pending`.",
}


_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "The scheme to authenticate with: Bearer.",
            "schema": {"type": "string"},
        }
    },
    429: {
        "Retry-After": {
            "description": "Seconds to wait before trying again.",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
    503: {
        "Retry-After": {
            "description": "Seconds to wait before trying again.",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
}


class Refusal(StarletteHTTPException):
    """An HTTP error with a code of its own (rather than the status's generic one)."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status, message, headers)
        self.code = code


# Seconds a client should wait when the database is unreachable: about a restart's length.
RETRY_AFTER_SECONDS = 5


def error_description(status: int) -> str:
    return _DESCRIPTIONS[status]


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI documentation of the error responses a route can give (and headers they send).
    Every route documenting its errors needs the database: 503 is always among them; a route
    taking an API key (401) may meet the tenant's requests-per-minute limit: 429."""
    quota = {429} if 401 in statuses else set()
    return {
        s: {"model": ErrorResponse, "description": _DESCRIPTIONS[s]}
        | ({"headers": _HEADERS[s]} if s in _HEADERS else {})
        for s in sorted({*statuses, *quota, 503})
    }


def unavailable(message: str = "the database cannot be reached now") -> JSONResponse:
    """503 database_unavailable, with when to try again."""
    return error_json(
        503,
        "database_unavailable",
        f"{message}: retry after {RETRY_AFTER_SECONDS} s",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


_STATUS_OF: list[tuple[type[ServiceError], int]] = [
    (NotFound, 404),
    (Forbidden, 403),
    (LimitExceeded, 429),
    (Conflict, 409),
    (Invalid, 422),
    (PreconditionFailed, 412),
    (Malformed, 400),
    (TooLarge, 413),
]

_HTTP_CODES = {
    # FastAPI raises a bare 400 only when it cannot read the body at all (e.g. invalid UTF-8):
    # to a client that is the same mistake as a JSON syntax error, so it gets the same code.
    400: "invalid_json",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}


def error_json(
    status: int,
    code: str,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return JSONResponse(body, status_code=status, headers=headers)


_INVALID_JSON = "the request body is not valid JSON"


async def _service_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    status = next(s for cls, s in _STATUS_OF if isinstance(exc, cls))
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, LimitExceeded) else None
    return error_json(status, exc.code, exc.message, exc.details, headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
        for e in exc.errors()
    ]
    if any(e["type"] == "json_invalid" for e in errors):
        return error_json(400, "invalid_json", _INVALID_JSON, {"errors": errors})
    where = ".".join(str(p) for p in errors[0]["loc"]) if errors else "request"
    message = f"invalid request at {where}: {errors[0]['msg']}" if errors else "invalid request"
    return error_json(422, "validation_error", message, {"errors": errors})


async def _invalid_unicode(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidUnicode)
    error = {"loc": exc.loc, "msg": exc.reason, "type": "invalid_unicode"}
    return error_json(422, "invalid_unicode", str(exc.detail), {"errors": [error]})


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = (
        exc.code
        if isinstance(exc, Refusal)
        else _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    )
    headers = dict(exc.headers) if exc.headers else {}
    message = _INVALID_JSON if exc.status_code == 400 else str(exc.detail)
    if exc.status_code == 405 and (allowed := allowed_methods(request)):
        # Starlette names only the methods of the first route that matched the path.
        headers["Allow"] = ", ".join(allowed)
    return error_json(exc.status_code, code, message, headers=headers or None)


def allowed_methods(request: Request) -> list[str]:
    """Every method the OpenAPI document lists at the request's path (RFC 9110's Allow), HEAD
    with GET; [] for a path the document does not describe."""
    methods: set[str] = set()
    for template, operations in request.app.openapi()["paths"].items():
        if _template_pattern(template).fullmatch(request.url.path):
            methods |= {m.upper() for m in operations if m.upper() in _HTTP_METHODS}
    if "GET" in methods:
        methods.add("HEAD")  # Starlette answers HEAD wherever GET is served
    return sorted(methods)


_HTTP_METHODS = {"GET", "PUT", "POST", "DELETE", "OPTIONS", "HEAD", "PATCH", "TRACE"}


@functools.cache
def _template_pattern(template: str) -> re.Pattern[str]:
    """/v1/sessions/{session_id} -> a pattern where each parameter is one path segment."""
    parts = re.split(r"(\{[^}/]+\})", template)
    return re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts))


async def _database_error(request: Request, exc: Exception) -> JSONResponse:
    """SQLAlchemy's errors, and OSErrors (the driver lets a failed connect's through)."""
    if database_unavailable(exc):
        # An outage, not a fault of the request nor a bug: a warning without the traceback
        # (during an outage every request has one).
        log.warning("database unavailable: %s", _first_line(exc))
        return unavailable()
    # SQLSTATE class 22 ("data exception"): a value the schema let through but Postgres cannot
    # store, e.g. a NUL character in text. The transaction was rolled back: nothing was written.
    sqlstate = str(getattr(getattr(exc, "orig", None), "sqlstate", "") or "")
    if isinstance(exc, DBAPIError) and sqlstate.startswith("22"):
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        return error_json(422, "invalid_value", f"a value cannot be stored: {reason}")
    return await _unexpected(request, exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    if database_unavailable(exc):  # e.g. in an ExceptionGroup, or raised from by a service
        log.warning("database unavailable: %s", _first_line(exc))
        return unavailable()
    log.exception("unhandled error", exc_info=exc)
    return error_json(500, "internal_error", "an internal error occurred")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(InvalidUnicode, _invalid_unicode)
    # Handled here rather than by the catch-all: Starlette re-raises what reaches that one, so
    # every request of an outage would also be logged as an ASGI application crash.
    app.add_exception_handler(SQLAlchemyError, _database_error)
    app.add_exception_handler(OSError, _database_error)
    app.add_exception_handler(asyncpg.PostgresError, _database_error)
    app.add_exception_handler(asyncpg.InterfaceError, _database_error)
    app.add_exception_handler(Exception, _unexpected)
