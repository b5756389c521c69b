"""Errors on /openai/v1 in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

The OpenAI SDKs read that shape (and the status) to raise their own exceptions. Every route
of the prefix uses `OpenAIRoute`, which turns what the rest of Threadline raises (service
errors, validation errors, HTTP errors) into it; the rest of the API keeps its own shape.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.api.bodies import JSONRoute
from app.openai_api.items import ItemError
from app.services.errors import Conflict, Invalid, NotFound, PreconditionFailed, ServiceError


class OpenAIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type


def unsupported(param: str, why: str = "") -> OpenAIError:
    message = f"Unsupported parameter: '{param}'. Threadline's Responses API does not support it"
    return OpenAIError(
        400, f"{message}{': ' + why if why else '.'}", param=param, code="unsupported_parameter"
    )


def error_json(error: OpenAIError, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": error.param,
            "code": error.code,
        }
    }
    return JSONResponse(body, status_code=error.status, headers=headers)


_SERVICE_STATUS: list[tuple[type[ServiceError], int]] = [
    (NotFound, 404),
    (Conflict, 409),
    (Invalid, 400),  # OpenAI answers a value it cannot use with 400
    (PreconditionFailed, 412),
]


def as_openai(exc: Exception) -> OpenAIError | None:
    """The OpenAI-shaped error for what a route raised (None: not one of ours to shape)."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, ItemError):
        return OpenAIError(400, exc.message, param=exc.param, code="invalid_value")
    if isinstance(exc, ServiceError):
        status = next(s for cls, s in _SERVICE_STATUS if isinstance(exc, cls))
        loc = exc.details.get("loc")
        param = ".".join(str(p) for p in loc[1:]) if isinstance(loc, list) and loc else None
        return OpenAIError(status, exc.message, param=param, code=exc.code)
    if isinstance(exc, RequestValidationError):
        return _validation(exc)
    if isinstance(exc, HTTPException):
        if exc.status_code == 401:
            return OpenAIError(
                401, str(exc.detail), code="invalid_api_key", error_type="authentication_error"
            )
        status = 400 if exc.status_code == 422 else exc.status_code
        return OpenAIError(status, str(exc.detail), code=f"http_{exc.status_code}")
    return None


def _validation(exc: RequestValidationError) -> OpenAIError:
    errors = exc.errors()
    if not errors:
        return OpenAIError(400, "invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return OpenAIError(400, "The request body is not valid JSON.", code="invalid_json")
    loc = [str(p) for p in first.get("loc", ())]
    param = _param(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    if first.get("type") == "extra_forbidden":
        return unsupported(param)
    if first.get("type") == "missing":
        return OpenAIError(
            400,
            f"Missing required parameter: '{param}'.",
            param=param,
            code="missing_required_parameter",
        )
    return OpenAIError(
        400, f"Invalid value for '{param}': {first.get('msg')}", param=param, code="invalid_value"
    )


def _param(loc: list[str]) -> str:
    out = ""
    for part in loc:
        if part.isdigit():
            out += f"[{part}]"
        elif part in ("str", "list[dict[str,any]]") or "[" in part or part.startswith("function-"):
            continue  # pydantic's union branch names are not part of the path
        else:
            out += f".{part}" if out else part
    return out


class OpenAIRoute(JSONRoute):
    """A route of the OpenAI prefix: its errors in OpenAI's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def shaped(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                error = as_openai(exc)
                if error is None:
                    raise
                headers = getattr(exc, "headers", None)
                return error_json(error, dict(headers) if headers else None)

        return shaped
