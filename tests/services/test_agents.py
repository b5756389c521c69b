"""Agents end to end on `threadline serve`: versions, sessions pinned to one, the resolved config
that projections and runs use (seen at the fake upstream), moving a session, deletion."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.keys import create_key
from testkit.api import history, new_session
from testkit.sse_client import collect
from testkit.upstream import FakeUpstream, Text
from tests.e2e import Service

MODEL = "openai:gpt-4o-mini"


@pytest.fixture
async def other_api(service: Service, e2e_engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the same service as another tenant."""
    key = await create_key(e2e_engine, f"other-{uuid.uuid4()}")
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=service.url, headers=headers, timeout=30) as client:
        yield client


async def agent(api: httpx.AsyncClient, name: str = "helper", **config: Any) -> dict[str, Any]:
    body = {"name": name, "config": {"model": MODEL, "system_prompt": "You are v1.", **config}}
    response = await api.post("/v1/agents", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def system_prompt_sent(api: httpx.AsyncClient, upstream: FakeUpstream, sid: str) -> str:
    upstream.script(Text("ok"))
    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "hi"})
    assert events[-1].type == "run.completed", events[-1].data
    first = upstream.requests[-1].body["messages"][0]
    assert first["role"] in {"system", "developer"}
    return str(first["content"])


async def test_sessions_pinned_to_two_versions_send_each_versions_instructions(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    created = await agent(api, temperature=0.2)
    assert created["version"] == 1
    patch = {"config": {"model": MODEL, "system_prompt": "You are v2.", "temperature": 0.2}}
    updated = (await api.patch("/v1/agents/helper", json=patch)).json()
    assert updated["version"] == 2 and updated["id"] == created["id"]
    versions = (await api.get("/v1/agents/helper/versions")).json()["data"]
    assert [(v["version"], v["config"]["system_prompt"]) for v in versions] == [
        (1, "You are v1."),
        (2, "You are v2."),
    ]
    v1 = (await api.get("/v1/agents/helper/versions/1")).json()
    assert v1["config"] == {"model": MODEL, "system_prompt": "You are v1.", "temperature": 0.2}

    one = await new_session(api, agent="helper@1")
    two = await new_session(api, agent="helper", config={"max_output_tokens": 50})
    assert one["agent"] == {"id": created["id"], "name": "helper", "version": 1}
    assert two["agent"]["version"] == 2  # the latest at creation
    assert two["own_config"] == {"max_output_tokens": 50}
    assert two["config"] == {
        "model": MODEL,
        "system_prompt": "You are v2.",
        "temperature": 0.2,
        "max_output_tokens": 50,
    }
    projection = await api.post(f"/v1/sessions/{one['id']}/projection", json={"format": "openai"})
    assert "You are v1." in projection.text
    assert await system_prompt_sent(api, upstream, one["id"]) == "You are v1."
    assert await system_prompt_sent(api, upstream, two["id"]) == "You are v2."
    sent = upstream.requests[-1].body
    assert sent.get("max_completion_tokens", sent.get("max_tokens")) == 50  # its own field

    # A third version does not touch the pinned sessions.
    await api.patch("/v1/agents/helper", json={"config": {"system_prompt": "You are v3."}})
    assert await system_prompt_sent(api, upstream, one["id"]) == "You are v1."


async def test_moving_a_session_to_the_latest_version_is_journaled_and_used(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    await agent(api)
    session = await new_session(api, agent="helper")
    sid = session["id"]
    await api.patch("/v1/agents/helper", json={"config": {"system_prompt": "You are v2."}})
    moved = await api.post(f"/v1/sessions/{sid}/agent_version", json={})
    assert moved.status_code == 200, moved.text
    assert moved.json()["agent"]["version"] == 2
    assert moved.json()["config"] == {"system_prompt": "You are v2."}  # v2 names no model
    (entry,) = [e for e in await history(api, sid) if e["kind"] == "agent_version"]
    assert entry["payload"] == {
        "agent_id": session["agent"]["id"],
        "agent_name": "helper",
        "from_version": 1,
        "to_version": 2,
    }
    assert await system_prompt_sent(api, upstream, sid) == "You are v2."
    back = await api.post(f"/v1/sessions/{sid}/agent_version", json={"version": 1})
    assert back.json()["agent"]["version"] == 1
    missing = await api.post(f"/v1/sessions/{sid}/agent_version", json={"version": 9})
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "agent_version_not_found"
    plain = await new_session(api)
    refused = await api.post(f"/v1/sessions/{plain['id']}/agent_version", json={})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "no_agent"


async def test_a_fork_keeps_its_parents_pin_and_a_deleted_agent_keeps_its_sessions_working(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    await agent(api)
    sid = (await new_session(api, agent="helper"))["id"]
    fork = (await api.post(f"/v1/sessions/{sid}/fork", json={})).json()
    assert fork["agent"]["version"] == 1 and fork["config"]["system_prompt"] == "You are v1."
    assert (await api.delete("/v1/agents/helper")).status_code == 204
    assert (await api.get("/v1/agents/helper")).status_code == 404
    assert (await api.get("/v1/agents")).json()["data"] == []
    assert await system_prompt_sent(api, upstream, sid) == "You are v1."
    gone = await api.post("/v1/sessions", json={"agent": "helper"})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "agent_not_found"
    # The name is free again: a new agent, with versions of its own.
    assert (await agent(api))["version"] == 1


async def test_bad_agent_requests_are_refused_clearly(api: httpx.AsyncClient) -> None:
    await agent(api)
    duplicate = await api.post("/v1/agents", json={"name": "helper"})
    assert duplicate.status_code == 409 and duplicate.json()["error"]["code"] == "agent_exists"
    bad_name = await api.post("/v1/agents", json={"name": "no spaces"})
    assert bad_name.status_code == 422
    bad_model = await api.post(
        "/v1/agents", json={"name": "x", "config": {"model": "nowhere:model"}}
    )
    assert bad_model.status_code == 422
    bad_reference = await api.post("/v1/sessions", json={"agent": "helper@0"})
    assert bad_reference.status_code == 422
    unknown = await api.post("/v1/sessions", json={"agent": "nobody"})
    assert unknown.status_code == 404
    assert (await api.get("/v1/agents/helper/versions/2")).status_code == 404
    assert (await api.patch("/v1/agents/nobody", json={})).status_code == 404
    # Nulls change nothing (a 500 before): the new version keeps the latest's config.
    kept = await api.patch("/v1/agents/helper", json={"config": None, "metadata": None})
    assert kept.status_code == 200 and kept.json()["config"]["system_prompt"] == "You are v1."


async def test_tenants_never_see_each_others_agents(
    api: httpx.AsyncClient, other_api: httpx.AsyncClient
) -> None:
    await agent(api, name="private")
    assert (await other_api.get("/v1/agents/private")).status_code == 404
    assert (await other_api.post("/v1/sessions", json={"agent": "private"})).status_code == 404
    assert (await other_api.get("/v1/agents")).json()["data"] == []


async def test_the_facades_prompt_is_an_agent_with_its_variables_filled_in(
    api: httpx.AsyncClient, upstream: FakeUpstream, service: Service
) -> None:
    await agent(api, system_prompt="You help with trips to {{city}}.")
    key = api.headers["Authorization"].removeprefix("Bearer ")
    client = AsyncOpenAI(base_url=f"{service.url}/openai/v1", api_key=key, max_retries=0)
    upstream.script(Text("Bonjour"))
    response = await client.responses.create(
        input="Where to eat?",
        prompt={"id": "helper", "version": "1", "variables": {"city": "Paris"}},
    )
    assert response.output_text == "Bonjour"
    assert upstream.requests[-1].body["messages"][0]["content"] == "You help with trips to Paris."
    assert upstream.requests[-1].body["model"] == "gpt-4o-mini"  # the agent's model
    conversation = response.conversation.id if response.conversation else None
    sessions = (await api.get("/v1/sessions")).json()["data"]
    (session,) = [s for s in sessions if s["agent"] is not None]
    assert session["agent"]["version"] == 1 and conversation is not None
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(input="hi", prompt={"id": "nobody"})
    await client.close()


async def test_an_export_names_the_agent_version_and_carries_the_resolved_config(
    api: httpx.AsyncClient,
) -> None:
    await agent(api)
    sid = (await new_session(api, agent="helper", config={"temperature": 0.5}))["id"]
    exported = await api.get(f"/v1/sessions/{sid}/export")
    header = json.loads(exported.text.splitlines()[0])["session"]
    assert (header["agent"], header["agent_version"]) == ("helper", 1)
    assert header["config"] == {"model": MODEL, "system_prompt": "You are v1.", "temperature": 0.5}
    imported = await api.post(
        "/v1/sessions/import",
        content=exported.content,
        headers={"content-type": "application/x-ndjson"},
    )
    assert imported.status_code == 201, imported.text
    assert imported.json()["agent"] is None  # not pinned: the file's config is its own
    assert imported.json()["config"] == header["config"]
