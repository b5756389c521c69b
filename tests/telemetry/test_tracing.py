"""Tracing: one ask is one trace, API request → run job → model call; tracing asked for
without the `otel` extra fails at startup, clearly."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from app.config import Settings
from app.main import create_app
from app.telemetry import tracing
from testkit.api import new_session
from testkit.upstream import FakeUpstream, Text

ASK_ROUTE = "POST /v1/sessions/{session_id}/ask"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


def one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    [span] = [s for s in spans if s.name == name]
    return span


async def test_an_ask_is_one_trace_from_request_to_model_call(
    api: httpx.AsyncClient, upstream: FakeUpstream, exported: InMemorySpanExporter
) -> None:
    sid = (await new_session(api))["id"]
    upstream.script(Text("traced"))
    asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "hi", "stream": False})
    run_id = asked.json()["id"]
    ended = await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 60})
    assert ended.json()["status"] == "completed"
    deadline = time.monotonic() + 60
    while not any(s.name == "run ask" for s in exported.get_finished_spans()):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    spans = list(exported.get_finished_spans())
    request = one(spans, ASK_ROUTE)
    run = one(spans, "run ask")
    call = one(spans, "model call")
    assert request.attributes is not None and request.attributes["http.response.status_code"] == 202
    assert run.attributes is not None and run.attributes["threadline.run_id"] == run_id
    assert call.attributes is not None and call.attributes["provider"] == "openai"
    assert request.context is not None and run.context is not None and call.context is not None
    assert {request.context.trace_id, run.context.trace_id, call.context.trace_id} == {
        request.context.trace_id
    }
    assert run.parent is not None and run.parent.span_id == request.context.span_id
    assert call.parent is not None and call.parent.span_id == run.context.span_id


async def test_a_failed_model_call_is_an_error_span(
    api: httpx.AsyncClient, upstream: FakeUpstream, exported: InMemorySpanExporter
) -> None:
    from opentelemetry.trace import StatusCode

    from testkit.upstream import Fail

    sid = (await new_session(api))["id"]
    upstream.script(Fail(400, "bad_request", "nope"))
    asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "hi", "stream": False})
    run_id = asked.json()["id"]
    ended = await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 60})
    assert ended.json()["status"] == "failed"
    deadline = time.monotonic() + 60
    while not any(s.name == "run ask" for s in exported.get_finished_spans()):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    call = one(list(exported.get_finished_spans()), "model call")
    assert call.status.status_code is StatusCode.ERROR


def test_tracing_without_the_extra_is_a_clear_startup_error(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What an install without the `otel` extra looks like to an import.
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(tracing.TracingUnavailable, match=r"pip install 'threadline\[otel\]'"):
        create_app(settings.model_copy(update={"otel_enabled": True}))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    with pytest.raises(tracing.TracingUnavailable):
        create_app(settings)


def test_off_by_default(settings: Settings) -> None:
    create_app(settings)
    assert not tracing.enabled() and tracing.traceparent() is None
