"""Structured output per ask, end to end through the served app and the real SDKs to the fake
upstream (which checks the format arrives in each API's own shape): an answer that follows its
schema completes, marked; one that does not fails the run with structured_output_invalid, its
text kept; a schema strict mode refuses is a 422 naming where, with nothing written."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.output_schema import fingerprint
from testkit.api import history, new_session
from testkit.sse_client import streamed_ask
from testkit.upstream import FakeUpstream, JsonAnswer, Text, ToolCall

OPENAI = "openai:gpt-4o-mini"
ANTHROPIC = "anthropic:claude-sonnet-4-5"
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "celsius": {"type": "number", "minimum": -90, "maximum": 60},
        "sky": {"enum": ["clear", "cloudy", "rain"]},
    },
    "required": ["city", "celsius", "sky"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
MARK = {"name": "weather", "schema_sha256": fingerprint(WEATHER)}
CALCULATOR = {
    "name": "calculator",
    "kind": "builtin",
    "description": "Arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


def format_sent(model: str, body: dict[str, Any]) -> Any:
    """The structured output format in a provider request, in that API's shape."""
    if model.startswith("openai:"):
        return body["response_format"]
    return body["output_config"]["format"]


def answers(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in journal if e["kind"] == "message" and e["payload"]["role"] == "assistant"]


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_an_answer_that_follows_its_schema_completes_marked_structured(
    api: httpx.AsyncClient, upstream: FakeUpstream, model: str
) -> None:
    sid = (await new_session(api, config={"model": model}))["id"]
    weather = {"city": "Oslo", "celsius": -3.5, "sky": "clear"}
    upstream.script(JsonAnswer(weather))

    events = await streamed_ask(api, sid, "Weather in Oslo?", response_format=FORMAT)

    assert events[-1].type == "run.completed", events[-1].data
    assert json.loads(events[-1].data["text"]) == weather
    answer = answers(await history(api, sid))[-1]["payload"]
    assert json.loads(answer["content"]) == weather
    assert answer["structured"] == MARK and "status" not in answer
    (request,) = upstream.requests
    if model == OPENAI:
        assert request.body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "weather", "schema": WEATHER, "strict": True},
        }
    else:  # the SDK's transform: the bounds Anthropic does not enforce move to a description
        sent = request.body["output_config"]["format"]
        assert sent["type"] == "json_schema"
        assert set(sent["schema"]["properties"]) == {"city", "celsius", "sky"}
        assert sent["schema"]["additionalProperties"] is False
        assert "minimum" not in sent["schema"]["properties"]["celsius"]


@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
@pytest.mark.parametrize(
    ("said", "why"),
    [
        (json.dumps({"city": "Oslo", "celsius": 99, "sky": "clear"}), "at /celsius"),
        (json.dumps({"city": "Oslo", "sky": "snow", "celsius": 1}), "at /sky"),
        ('{"city": "Oslo", "cel', "not JSON"),
        ("It is cold in Oslo.", "not JSON"),
    ],
)
async def test_an_answer_that_does_not_follow_its_schema_fails_the_run_its_text_kept(
    api: httpx.AsyncClient, upstream: FakeUpstream, model: str, said: str, why: str
) -> None:
    sid = (await new_session(api, config={"model": model}))["id"]
    upstream.script(Text(said[:7]), Text(said[7:]))

    events = await streamed_ask(api, sid, "Weather in Oslo?", response_format=FORMAT)

    failed = events[-1]
    assert failed.type == "run.failed", failed.data
    assert failed.data["error"]["code"] == "structured_output_invalid"
    assert why in failed.data["error"]["message"] and "weather" in failed.data["error"]["message"]
    assert failed.data["partial_text"] == said
    journal = await history(api, sid)
    answer = answers(journal)[-1]["payload"]
    assert answer["content"] == said and answer["status"] == "incomplete"
    assert answer["structured"] == MARK
    end = [e for e in journal if e["kind"] == "run_end"][-1]["payload"]
    assert end["status"] == "failed" and end["error"]["code"] == "structured_output_invalid"
    run = (await api.get(f"/v1/runs/{failed.data['run_id']}")).json()
    assert run["status"] == "failed" and run["error"]["code"] == "structured_output_invalid"


async def test_a_tool_loop_keeps_the_format_on_every_turn_and_checks_the_final_answer(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": OPENAI, "tools": [CALCULATOR]}))["id"]
    upstream.script(ToolCall("call_1", "calculator", '{"expression": "2+2"}'))
    upstream.script(JsonAnswer({"city": "Four", "celsius": 4, "sky": "rain"}))

    events = await streamed_ask(api, sid, "Compute, then answer", response_format=FORMAT)

    assert events[-1].type == "run.completed", events[-1].data
    assert [format_sent(OPENAI, r.body)["json_schema"]["name"] for r in upstream.requests] == [
        "weather",
        "weather",
    ]
    turns = answers(await history(api, sid))
    assert turns[-1]["payload"]["structured"] == MARK  # the answer, not the tool-calling turn
    assert all("structured" not in t["payload"] for t in turns[:-1])


async def test_an_ask_without_a_format_sends_none_and_marks_nothing(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": ANTHROPIC}))["id"]
    upstream.script(Text("Not JSON, and fine."))

    events = await streamed_ask(api, sid, "Hi")

    assert events[-1].type == "run.completed"
    assert "output_config" not in upstream.requests[0].body
    assert "structured" not in answers(await history(api, sid))[-1]["payload"]


def refused(response: httpx.Response, location: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "invalid_output_schema", error
    assert error["details"]["location"] == location, error
    assert location in error["message"]
    return error


def with_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


HOSTILE: list[tuple[Any, str]] = [
    ({**WEATHER, "additionalProperties": True}, "/additionalProperties"),
    ({**WEATHER, "required": ["city"]}, "/required"),
    ({"type": "array", "items": WEATHER}, ""),
    (
        {
            **WEATHER,
            "properties": {**WEATHER["properties"], "x": {"not": {}}},
            "required": [*WEATHER["required"], "x"],
        },
        "/properties/x/not",
    ),
    (
        {**WEATHER, "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},
        "/$defs/a",
    ),
    (
        {
            **WEATHER,
            "properties": {**WEATHER["properties"], "r": {"$ref": "http://x/s.json"}},
            "required": [*WEATHER["required"], "r"],
        },
        "/properties/r/$ref",
    ),
]


@pytest.mark.parametrize(("schema", "where"), HOSTILE)
async def test_a_schema_strict_mode_refuses_is_a_422_with_its_location_and_nothing_written(
    api: httpx.AsyncClient, upstream: FakeUpstream, schema: Any, where: str
) -> None:
    sid = (await new_session(api, config={"model": OPENAI}))["id"]

    response = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "x", "response_format": with_schema(schema)}
    )

    refused(response, f"/response_format/json_schema/schema{where}")
    assert await history(api, sid) == []
    assert (await api.get(f"/v1/sessions/{sid}")).json()["rev"] == 0
    assert upstream.requests == []


async def test_deep_and_huge_schemas_are_refused_and_nothing_written(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": OPENAI}))["id"]
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"d": deep}, "required": ["d"]}
        deep["additionalProperties"] = False
    huge = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string"} for i in range(6000)},
        "required": [f"p{i}" for i in range(6000)],
        "additionalProperties": False,
    }

    too_deep = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "x", "response_format": with_schema(deep)}
    )
    too_big = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "x", "response_format": with_schema(huge)}
    )

    refused(too_deep, "/response_format/json_schema/schema" + "/properties/d" * 10)
    refused(too_big, "/response_format/json_schema/schema/properties")
    assert await history(api, sid) == []
    assert upstream.requests == []


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "json_schema", "json_schema": {"name": "bad name", "schema": WEATHER}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": WEATHER, "strict": False}},
    ],
)
async def test_a_malformed_format_is_a_422(
    api: httpx.AsyncClient, response_format: dict[str, Any]
) -> None:
    sid = (await new_session(api))["id"]

    response = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "x", "response_format": response_format}
    )

    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"]["errors"][0]["loc"][:2] == [
        "body",
        "response_format",
    ]
    assert await history(api, sid) == []


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
async def test_loosening_any_object_of_a_schema_is_refused_where_it_was_loosened(
    api: httpx.AsyncClient, upstream: FakeUpstream, data: st.DataObject
) -> None:
    schema = copy.deepcopy(WEATHER)
    schema["properties"]["where"] = {
        "type": "object",
        "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
        "required": ["lat", "lon"],
        "additionalProperties": False,
    }
    schema["required"].append("where")
    spot = data.draw(st.sampled_from(["", "/properties/where"]))
    target = schema if not spot else schema["properties"]["where"]
    rule = data.draw(st.sampled_from(["additionalProperties", "required"]))
    if rule == "additionalProperties":
        del target["additionalProperties"]
    else:
        target["required"] = target["required"][:-1]
    sid = (await new_session(api, config={"model": OPENAI}))["id"]

    response = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "x", "response_format": with_schema(schema)}
    )

    refused(response, f"/response_format/json_schema/schema{spot}/{rule}")
    assert await history(api, sid) == []
