"""Whatever a client sends to /openai/v1, the answer is a response or an error in OpenAI's
shape, never a 500; the rest of the API keeps its own error shape."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from testkit.upstream import FakeUpstream

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
KEYS = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "previous_response_id",
    "conversation",
    "store",
    "background",
    "max_output_tokens",
    "temperature",
    "metadata",
    "top_p",
]
# The profile's (a slow example on a loaded machine is no bug), and one live service for all
# examples: the fixtures are function-scoped on purpose.
SUPPRESSED = [
    *(settings.default.suppress_health_check if settings.default else ()),
    HealthCheck.function_scoped_fixture,
]
bodies = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=5) | json_values
ITEMS = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool"]), "content": json_values}
    ),
    st.fixed_dictionaries(
        {"type": st.text(max_size=20), "call_id": json_values, "output": json_values}
    ),
    json_values,
)


def assert_openai_error(response: httpx.Response) -> None:
    assert response.status_code in (400, 401, 404, 409, 413), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]


@given(body=bodies)
@settings(max_examples=60, suppress_health_check=SUPPRESSED)
async def test_any_body_is_answered_or_refused_in_openai_s_shape(
    api: httpx.AsyncClient, upstream: FakeUpstream, body: Any
) -> None:
    response = await api.post("/openai/v1/responses", content=json.dumps(body))
    if response.status_code == 200:
        assert response.json()["object"] == "response"
    else:
        assert_openai_error(response)


@given(items=st.lists(ITEMS, max_size=3), metadata=json_values)
@settings(max_examples=40, suppress_health_check=SUPPRESSED)
async def test_any_conversation_items_are_taken_or_refused_in_openai_s_shape(
    api: httpx.AsyncClient, items: list[Any], metadata: Any
) -> None:
    before = (await api.get("/v1/sessions", params={"limit": 100})).json()["data"]
    response = await api.post(
        "/openai/v1/conversations", json={"items": items, "metadata": metadata}
    )
    if response.status_code == 200:
        created = response.json()
        listed = await api.get(f"/openai/v1/conversations/{created['id']}/items")
        assert listed.status_code == 200 and len(listed.json()["data"]) == len(items)
    else:
        assert_openai_error(response)
        # Nothing half-made: no conversation (no session) is left over.
        after = (await api.get("/v1/sessions", params={"limit": 100})).json()["data"]
        assert after == before


async def test_malformed_json_and_bad_keys(api: httpx.AsyncClient) -> None:
    broken = await api.post(
        "/openai/v1/responses", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_openai_error(broken)
    assert broken.json()["error"]["code"] == "invalid_json"
    missing = await api.post("/openai/v1/responses", json={"model": "gpt-4o-mini"})
    assert_openai_error(missing)
    assert missing.json()["error"]["param"] == "input"
    stranger = await api.get(
        "/openai/v1/conversations/conv_" + "0" * 32, headers={"Authorization": "Bearer nope"}
    )
    assert stranger.status_code == 401
    assert stranger.json()["error"]["type"] == "authentication_error"
    # Elsewhere, Threadline's own shape.
    native = await api.get("/v1/sessions/" + "0" * 8 + "-0000-0000-0000-" + "0" * 12)
    assert set(native.json()["error"]) == {"code", "message", "details"}


async def test_another_tenant_s_responses_and_conversations_are_not_found(
    api: httpx.AsyncClient, upstream: FakeUpstream, service: Any, e2e_engine: Any
) -> None:
    from app.services.keys import create_key, tenant_for_key

    made = await api.post("/openai/v1/responses", json={"model": "gpt-4o-mini", "input": "Hi"})
    assert made.status_code == 200
    response_id, conversation = made.json()["id"], made.json()["conversation"]["id"]
    other = await create_key(e2e_engine, "another tenant")
    headers = {"Authorization": f"Bearer {other}"}
    for path in (
        f"/openai/v1/responses/{response_id}",
        f"/openai/v1/responses/{response_id}/input_items",
        f"/openai/v1/conversations/{conversation}",
        f"/openai/v1/conversations/{conversation}/items",
    ):
        answer = await api.get(path, headers=headers)
        assert answer.status_code == 404, path
        assert_openai_error(answer)
    # Nor can a response be asked in it (the ask finds no such session of that tenant's), nor
    # in a conversation id that names none; nothing is written either way.
    for named in (conversation, "conv_" + "0" * 32, "conv_not-an-id"):
        body = {"model": "gpt-4o-mini", "input": "Hi", "conversation": named}
        asked = await api.post("/openai/v1/responses", json=body, headers=headers)
        assert asked.status_code == 404, named
        assert_openai_error(asked)
        assert asked.json()["error"]["param"] == "conversation"
        assert asked.json()["error"]["message"] == f"No conversation found with id '{named}'."
    stranger = await tenant_for_key(e2e_engine, other)
    async with e2e_engine.connect() as conn:
        query = text("SELECT count(*) FROM runs WHERE tenant_id = CAST(:t AS uuid)")
        assert (await conn.execute(query, {"t": stranger})).scalar_one() == 0
