"""Optional OpenTelemetry tracing of an ask end to end: the API request, the run's job, and
each model call, in one trace (the job carries the request's trace context in its run).

Off unless THREADLINE_OTEL_ENABLED or OTEL_EXPORTER_OTLP_ENDPOINT is set; needs the `otel`
extra. Off, every hook here is a no-op and opentelemetry is never imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Receive, Scope, Send

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from app.config import Settings

TRACEPARENT = "traceparent"
_tracer: Tracer | None = None


class TracingUnavailable(RuntimeError):
    """Tracing was asked for, but the `otel` extra is not installed."""


def wanted(settings: Settings) -> bool:
    return settings.otel_enabled or bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(settings: Settings) -> None:
    """At start: trace with an OTLP exporter when tracing is on (a clear error when the extra
    is missing)."""
    global _tracer
    if not wanted(settings) or _tracer is not None:
        return
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(
            "tracing is on (THREADLINE_OTEL_ENABLED or OTEL_EXPORTER_OTLP_ENDPOINT) but "
            f"OpenTelemetry is not installed ({exc.name}): pip install 'threadline[otel]'"
        ) from exc
    name = os.environ.get("OTEL_SERVICE_NAME", "threadline")
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    use(provider)


def use(provider: TracerProvider | None) -> None:
    """Trace with this provider (tests: one with an in-memory exporter); None: stop tracing."""
    global _tracer
    _tracer = provider.get_tracer("threadline") if provider is not None else None


def enabled() -> bool:
    return _tracer is not None


def _parent(traceparent: str | None) -> Any:
    if not traceparent:
        return None
    from opentelemetry.propagate import extract

    return extract({TRACEPARENT: traceparent})


@contextmanager
def span(name: str, *, parent: str | None = None, **attributes: Any) -> Iterator[Span | None]:
    """A span, current for the block: a child of the current one, or of `parent` (a W3C
    traceparent another process carried here)."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(
        name, context=_parent(parent), attributes=_clean(attributes)
    ) as current:
        yield current


def start(name: str, **attributes: Any) -> Span | None:
    """A span under the current one that the caller ends (a model call, whose events are
    yielded across await points: never made current)."""
    if _tracer is None:
        return None
    return _tracer.start_span(name, attributes=_clean(attributes))


def end(span_: Span | None, error: BaseException | None = None) -> None:
    if span_ is None:
        return
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span_.record_exception(error)
        span_.set_status(Status(StatusCode.ERROR, str(error)))
    span_.end()


def traceparent() -> str | None:
    """The current span's context as a W3C traceparent, to carry into a job."""
    if _tracer is None:
        return None
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get(TRACEPARENT)


def _clean(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}


class TraceRequests:
    """ASGI middleware: a server span per HTTP request, named by its route once routed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _tracer is None:
            await self.app(scope, receive, send)
            return
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        method = scope["method"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        with _tracer.start_as_current_span(
            f"{method} {scope['path']}",
            context=extract(headers),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        ) as current:

            async def send_status(message: Any) -> None:
                if message["type"] == "http.response.start":
                    current.set_attribute("http.response.status_code", message["status"])
                await send(message)

            try:
                await self.app(scope, receive, send_status)
            finally:
                route = scope.get("route")
                if route is not None and getattr(route, "path", None):
                    current.update_name(f"{method} {route.path}")
                    current.set_attribute("http.route", route.path)
