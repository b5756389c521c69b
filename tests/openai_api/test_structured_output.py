"""Structured output through the Responses facade with the official `openai` SDK: `text.format`
json_schema (and `responses.parse` with a pydantic model) maps onto the native ask's format,
for OpenAI and Anthropic models alike."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from testkit.api import history
from testkit.upstream import FakeUpstream, JsonAnswer, Text

MODELS = ["gpt-4o-mini", "anthropic:claude-haiku-4-5"]
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "celsius": {"type": "number"},
        "sky": {"enum": ["clear", "cloudy", "rain"]},
    },
    "required": ["city", "celsius", "sky"],
    "additionalProperties": False,
}
FORMAT: Any = {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}


class Forecast(BaseModel):
    city: str
    celsius: float
    sky: Literal["clear", "cloudy", "rain"]


def format_sent(body: dict[str, Any]) -> dict[str, Any]:
    """The format in the provider request: OpenAI's response_format, Anthropic's."""
    if "response_format" in body:
        sent: dict[str, Any] = body["response_format"]["json_schema"]
        return {"name": sent["name"], "schema": sent["schema"]}
    return {"schema": body["output_config"]["format"]["schema"]}


@pytest.mark.parametrize("model", MODELS)
async def test_text_format_json_schema_answers_json_that_follows_it(
    client: AsyncOpenAI, api: httpx.AsyncClient, upstream: FakeUpstream, model: str
) -> None:
    weather = {"city": "Lima", "celsius": 19, "sky": "cloudy"}
    upstream.script(JsonAnswer(weather))

    response = await client.responses.create(
        model=model, input="Weather in Lima?", text={"format": FORMAT}
    )

    assert response.status == "completed", response.error
    assert json.loads(response.output_text) == weather
    assert response.text is not None and response.text.format is not None
    assert response.text.format.model_dump(exclude_none=True, by_alias=True) == FORMAT
    sent = format_sent(upstream.requests[0].body)
    assert sent["schema"]["required"] == ["city", "celsius", "sky"]
    if model == "gpt-4o-mini":
        assert sent == {"name": "weather", "schema": WEATHER}
    session = response.conversation
    assert session is not None
    journal = await history(api, str(uuid.UUID(session.id.removeprefix("conv_"))))
    answer = [e for e in journal if e["kind"] == "message"][-1]
    assert answer["payload"]["structured"]["name"] == "weather"


@pytest.mark.parametrize("model", MODELS)
async def test_responses_parse_with_a_pydantic_model(
    client: AsyncOpenAI, upstream: FakeUpstream, model: str
) -> None:
    upstream.script(JsonAnswer({"city": "Quito", "celsius": 14.5, "sky": "rain"}))

    parsed = await client.responses.parse(
        model=model, input="Weather in Quito?", text_format=Forecast
    )

    assert parsed.output_parsed == Forecast(city="Quito", celsius=14.5, sky="rain")
    sent = format_sent(upstream.requests[0].body)
    assert set(sent["schema"]["properties"]) == {"city", "celsius", "sky"}
    assert sent["schema"]["additionalProperties"] is False


async def test_an_answer_that_does_not_follow_the_format_fails_the_response(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    upstream.script(Text('{"city": "Lima", "sky": "fog", "celsius": 1}'))

    response = await client.responses.create(
        model="gpt-4o-mini", input="Weather?", text={"format": FORMAT}
    )

    assert response.status == "failed"
    assert response.error is not None
    assert response.error.message.startswith("structured_output_invalid: ")
    assert "at /sky" in response.error.message


@pytest.mark.parametrize(
    ("text", "param"),
    [
        (
            {"format": {**FORMAT, "schema": {**WEATHER, "additionalProperties": True}}},
            "text.format.schema",
        ),
        ({"format": {**FORMAT, "schema": {**WEATHER, "required": []}}}, "text.format.schema"),
        ({"format": {"type": "json_object"}}, "text.format.type"),
        ({"format": {"type": "json_schema", "name": "x"}}, "text.format.schema"),
        ({"format": {**FORMAT, "strict": False}}, "text.format.strict"),
    ],
)
async def test_a_format_that_cannot_be_held_to_is_a_400_and_nothing_written(
    client: AsyncOpenAI,
    api: httpx.AsyncClient,
    upstream: FakeUpstream,
    text: Any,
    param: str,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="gpt-4o-mini", input="x", text=text)

    assert refused.value.status_code == 400
    assert refused.value.param == param, refused.value.body
    assert (await api.get("/v1/sessions")).json()["data"] == []
    assert upstream.requests == []
