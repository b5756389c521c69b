"""The OpenAPI document as this deployment serves it: FastAPI's, plus its configured limits and
the schemas of the run events its SSE responses carry."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from app.api.errors import error_description
from app.api.sse import event_schemas
from app.config import Settings

# Operations whose `limit` is capped by settings.max_page_size (refused above it, 422).
PAGED_OPERATIONS = ("listSessions", "listEntries", "listMemory")


def install_document(app: FastAPI, settings: Settings) -> None:
    """Serve a document whose page-size maxima are the ones this server enforces."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = FastAPI.openapi(app)  # builds and caches app.openapi_schema
        for operations in document["paths"].values():
            for operation in operations.values():
                if operation.get("operationId") in PAGED_OPERATIONS:
                    _cap_limit(operation, settings.max_page_size)
        _document_read_only_refusals(document)
        _add_schemas(document, event_schemas())
        _config_as_component(document["components"]["schemas"])
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def _cap_limit(operation: dict[str, Any], max_page_size: int) -> None:
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "query" and parameter["name"] == "limit":
            parameter["schema"]["maximum"] = max_page_size
            parameter["description"] = (
                f"Items per page, at most {max_page_size} (THREADLINE_MAX_PAGE_SIZE)."
            )


def _document_read_only_refusals(document: dict[str, Any]) -> None:
    """A read-only API key is refused (403 read_only_key) wherever a route writes: every
    method but GET of a route taking an API key."""
    forbidden = {
        "description": error_description(403),
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    for path, operations in document["paths"].items():
        if path.startswith("/v1/admin/"):
            continue  # the admin key is not a tenant's
        for method, operation in operations.items():
            responses = operation.get("responses", {})
            if method != "get" and "401" in responses and "403" not in responses:
                responses["403"] = forbidden
                operation["responses"] = dict(sorted(responses.items()))


def _config_as_component(schemas: dict[str, Any]) -> None:
    """A session's config is the SessionConfig fields it was given (Session keeps it as the
    stored dict, so absent fields stay absent): documented as that component, not as an inline
    object whose generated name collides with SessionConfig's (openapi-python-client then
    dropped Session, SessionList, SessionConfig and the operations using them)."""
    schemas["Session"]["properties"]["config"] = {"$ref": "#/components/schemas/SessionConfig"}


def _add_schemas(document: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> None:
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in schemas.items():
        if components.setdefault(name, schema) != schema:  # e.g. EntryKind: the same enum
            raise RuntimeError(f"two different schemas are named {name}")
