"""The run event registry: one payload model per event type, strict about what it accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.config import Settings
from app.core.entries import EntryKind
from app.core.runs import ENDED
from app.eventlog import registry as events
from app.eventlog.registry import (
    PAYLOADS,
    TERMINAL_BY_STATUS,
    TERMINAL_EVENTS,
    EventData,
    EventType,
    UnknownEventType,
    encode,
    parse,
)
from app.main import create_app

APP = Path(__file__).resolve().parents[2] / "app"
REGISTRY = APP / "eventlog" / "registry.py"
# Also journal entry kinds (EntryKind): as strings they are the journal's, which no grep can
# tell from an event type, so only the registry's other names are looked for.
SHARED_WITH_ENTRY_KINDS = {"tool_call", "tool_result", "usage"}


def test_every_type_is_declared_once_with_its_model() -> None:
    assert list(PAYLOADS) == list(EventType)
    assert all(model.event_type is event_type for event_type, model in PAYLOADS.items())
    assert set(EventData.__subclasses__()) == set(PAYLOADS.values())
    assert set(TERMINAL_BY_STATUS.values()) == TERMINAL_EVENTS
    assert {t for t, m in PAYLOADS.items() if "status" in m.model_fields} == TERMINAL_EVENTS
    assert set(TERMINAL_BY_STATUS) == {status.value for status in ENDED}


def spelled_out(source: str) -> list[str]:
    """The registry's event type names that `source` spells as string literals."""
    names = [t.value for t in EventType if t.value not in SHARED_WITH_ENTRY_KINDS]
    quoted = "|".join(re.escape(name) for name in names)
    return [match.group(0) for match in re.finditer(rf"""(["'])(?:{quoted})\1""", source)]


def test_no_event_type_is_spelled_out_of_the_registry() -> None:
    """Everywhere else names event types by EventType (or the registry's sets), so a renamed
    or removed type is a failing import or attribute, never a silent mismatch."""
    assert {t.value for t in EventType} & {k.value for k in EntryKind} == SHARED_WITH_ENTRY_KINDS
    found = {
        str(path.relative_to(APP.parent)): spelled_out(path.read_text())
        for path in sorted(APP.rglob("*.py"))
        if path != REGISTRY
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_the_check_sees_each_way_of_spelling_a_type() -> None:
    sample = (
        'if kind == "run.completed": pass\n'
        "TYPES = ('message.delta', 'entry.committed')\n"
        'kind = "tool_call"  # an entry kind as well: not looked for\n'
        'ok = "run.completedness", EventType.RUN_FAILED\n'
    )
    assert spelled_out(sample) == [
        '"run.completed"',
        "'message.delta'",
        "'entry.committed'",
    ]
    assert spelled_out(REGISTRY.read_text())  # the registry itself spells them all


def test_every_payload_and_field_is_described_for_clients() -> None:
    for model in PAYLOADS.values():
        assert model.__doc__ and model.__doc__ != EventData.__doc__, model
        schema = model.model_json_schema(mode="serialization")
        for name, defs in [(model.__name__, schema), *schema.get("$defs", {}).items()]:
            for field, prop in defs.get("properties", {}).items():
                assert prop.get("description"), (name, field)


def test_encode_then_parse_gives_the_payload_back() -> None:
    calls = [events.PendingToolCall(tool_call_id="call_1_1_0", name="where", arguments={})]
    payload = events.RunRequiresActionData(
        tool_calls=calls, expires_at="2026-01-02T03:04:05.678901+00:00"
    )
    event_type, data = encode(payload)
    assert event_type == "run.requires_action"
    assert data == {
        "tool_calls": [{"tool_call_id": "call_1_1_0", "name": "where", "arguments": {}}],
        "expires_at": "2026-01-02T03:04:05.678901+00:00",
    }
    assert parse(event_type, data) == payload


def test_a_field_that_does_not_apply_is_left_out_never_null() -> None:
    first = events.ToolCallDeltaData(index=0, tool_call_id="call_1_1_0", arguments="")
    assert encode(first)[1] == {"index": 0, "tool_call_id": "call_1_1_0", "arguments": ""}
    assert encode(events.ToolCallDeltaData(index=0, arguments='{"a"'))[1] == {
        "index": 0,
        "arguments": '{"a"',
    }
    with pytest.raises(ValidationError, match="never null"):
        parse("tool_call.delta", {"index": 0, "arguments": "", "name": None})
    # ...and it is not nullable in the schema either.
    schema = events.ToolCallDeltaData.model_json_schema(mode="serialization")
    assert schema["properties"]["name"] == {
        "description": schema["properties"]["name"]["description"],
        "title": "Name",
        "type": "string",
    }
    assert schema["required"] == ["index", "arguments"]


def test_a_nullable_field_is_always_sent() -> None:
    usage = {"input_tokens": 1, "output_tokens": 2, "cached_tokens": 0, "estimated": False}
    assert parse("usage", {**usage, "cost_usd": None}).as_dict()["cost_usd"] is None
    with pytest.raises(ValidationError, match="cost_usd"):
        parse("usage", usage)


@pytest.mark.parametrize(
    ("event_type", "data"),
    [
        ("message.delta", {"text": "hi", "more": 1}),  # drift: an unknown field
        ("message.delta", {}),
        ("message.delta", {"text": 3}),
        ("run.started", {"attempt": "1"}),  # strict: no coercion
        ("tool_result", {"tool_call_id": "c", "name": "t", "is_error": 0, "preview": ""}),
        ("context.warning", {"level": "full", "tokens": 1, "budget": 1, "percent": 1.0}),
        ("run.failed", {"run_id": "r", "status": "failed", "model": "m", "partial_text": ""}),
        ("run.cancelled", {"run_id": "r", "status": "failed", "model": "m", "partial_text": ""}),
        ("run.requires_action", {"tool_calls": [], "expires_at": "2026-01-01T00:00:00Z"}),
        ("entry.committed", {"seq": 1, "kind": "note", "id": "e"}),
    ],
)
def test_payloads_that_drift_from_their_model_are_refused(
    event_type: str, data: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError):
        parse(event_type, data)


def test_compaction_pending_names_either_its_span_or_its_job() -> None:
    base = {"waited_seconds": 10.0, "fallback": "windowing"}
    parse("context.compaction_pending", {**base, "from_seq": 1, "to_seq": 9})
    parse("context.compaction_pending", {**base, "run_id": "r"})
    for wrong in ({}, {"from_seq": 1}, {"from_seq": 1, "to_seq": 9, "run_id": "r"}):
        with pytest.raises(ValidationError, match="either"):
            parse("context.compaction_pending", {**base, **wrong})


def test_an_unknown_type_is_refused() -> None:
    with pytest.raises(UnknownEventType, match=r"run\.paused"):
        parse("run.paused", {})


# --- The OpenAPI document describes every event with its payload's schema ----------------

REF = "#/components/schemas/{model}"
STREAMING_OPERATIONS = {"ask", "joinSessionStream", "streamRunEvents", "compactSession"}
# The AI SDK's chat routes stream its UI message chunks, not run events (tests/api/test_openapi.py).
UI_STREAMING_OPERATIONS = {"uiChat", "resumeUiChat"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    openapi: dict[str, Any] = create_app(Settings()).openapi()
    return openapi


def _resolve(document: dict[str, Any], ref: str) -> dict[str, Any]:
    prefix = "#/components/schemas/"
    assert ref.startswith(prefix), ref
    schema: dict[str, Any] = document["components"]["schemas"][ref.removeprefix(prefix)]
    return schema


def test_every_event_type_is_in_the_document_with_its_payload_schema(
    document: dict[str, Any],
) -> None:
    schemas = document["components"]["schemas"]
    union = schemas["RunEvent"]
    mapping = union["discriminator"]["mapping"]
    assert union["discriminator"]["propertyName"] == "event"
    assert list(mapping) == [t.value for t in EventType]
    assert [member["$ref"] for member in union["oneOf"]] == list(mapping.values())
    for event_type, model in PAYLOADS.items():
        event = _resolve(document, mapping[event_type])
        assert event["required"] == ["id", "event", "data"]
        assert event["properties"]["event"] == {"type": "string", "const": event_type.value}
        assert event["description"] == model.model_json_schema()["description"]
        expected = model.model_json_schema(mode="serialization", ref_template=REF)
        used = expected.pop("$defs", {})
        assert _resolve(document, event["properties"]["data"]["$ref"]) == expected, event_type
        for name, schema in used.items():  # the types it uses (EventError, TokenUsage, ...)
            assert schemas[name] == schema, (event_type, name)


def _event_names(node: Any) -> set[str]:
    """Every event type the document names: the const or enum of any `event` property."""
    found: set[str] = set()
    if isinstance(node, dict):
        event = node.get("properties", {}).get("event")
        if isinstance(event, dict):
            found |= {event["const"]} if "const" in event else set(event.get("enum", []))
        for value in node.values():
            found |= _event_names(value)
    elif isinstance(node, list):
        for value in node:
            found |= _event_names(value)
    return found


def test_the_document_names_no_event_type_the_registry_lacks(document: dict[str, Any]) -> None:
    assert _event_names(document) == set(EventType)
    schemas = document["components"]["schemas"]
    events_described = {n for n, s in schemas.items() if "event" in s.get("properties", {})}
    mapped = set(schemas["RunEvent"]["discriminator"]["mapping"].values())
    assert {REF.format(model=n) for n in events_described} == mapped


def test_every_stream_is_described_as_run_events(document: dict[str, Any]) -> None:
    streams = {}
    for operations in document["paths"].values():
        for operation in operations.values():
            for response in operation["responses"].values():
                if "text/event-stream" in response.get("content", {}):
                    streams[operation["operationId"]] = response["content"]["text/event-stream"]
    for operation in UI_STREAMING_OPERATIONS:
        assert streams.pop(operation) != {"schema": {"$ref": REF.format(model="RunEvent")}}
    assert set(streams) == STREAMING_OPERATIONS
    for stream in streams.values():
        assert stream == {"schema": {"$ref": REF.format(model="RunEvent")}}
