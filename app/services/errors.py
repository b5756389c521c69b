"""Domain errors the use cases raise; the API maps each family to an HTTP status."""

from __future__ import annotations

from typing import Any

from app.core.content import RULES as CONTENT_RULES


class ServiceError(Exception):
    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}


class NotFound(ServiceError):
    """The thing does not exist, or belongs to another tenant (indistinguishable on purpose)."""


class Conflict(ServiceError):
    """The request is well-formed but the current state refuses it (stale rev, reused id)."""


class Invalid(ServiceError):
    """The request is well-formed JSON but its values do not make sense here."""


class Malformed(ServiceError):
    """The request cannot be read at all (a line of an uploaded file that is not JSON)."""


class TooLarge(ServiceError):
    """Part of the request is larger than the service accepts (a line of an uploaded file)."""


class PreconditionFailed(ServiceError):
    """A condition the client set (If-Match, If-None-Match) does not hold for the current state."""


class LimitExceeded(ServiceError):
    """A quota of the tenant refuses the request for now: retry after `retry_after` seconds."""

    def __init__(self, code: str, message: str, details: dict[str, Any], retry_after: int) -> None:
        super().__init__(code, message, details)
        self.retry_after = retry_after


class Forbidden(ServiceError):
    """The caller is known but may not do this (a read-only key writing)."""


def session_not_found(session_id: str) -> NotFound:
    return NotFound("session_not_found", f"no session {session_id}", {"session_id": session_id})


def entries_refused(errors: list[dict[str, Any]]) -> Invalid:
    """422 naming the first offending path; `invalid_content` when every error is content a
    provider would refuse (the rule is each error's `type`)."""
    where = ".".join(str(p) for p in errors[0]["loc"])
    if all(e["type"] in CONTENT_RULES for e in errors):
        message = f"content a provider would refuse at {where}: {errors[0]['msg']}"
        return Invalid("invalid_content", message, {"errors": errors})
    return Invalid("invalid_entries", "some entries do not fit their kind", {"errors": errors})
