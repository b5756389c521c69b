"""The Responses API's `mcp` tools, driven by the official openai SDK against a served API, the
fake LLM upstream and a real MCP server: calls are mcp_call items, a call that needs approval
ends the response with an mcp_approval_request item, and an mcp_approval_response in the next
response rules on it (the model reads a rejection's reason). Headers are never stored plain."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseOutputItemDoneEvent,
)
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.tables import runs
from testkit.mcp_server import McpTestServer
from testkit.upstream import FakeUpstream, Text, ToolCall

T = TypeVar("T")
MORE: Any = {"role": "user", "content": "and more"}
TOKEN = "facade-mcp-token-4242"
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[McpTestServer]:
    with McpTestServer(token=TOKEN) as server:
        yield server


def of_type(response: Response, kind: type[T]) -> list[T]:
    return [item for item in response.output if isinstance(item, kind)]


def calc(server: McpTestServer, **fields: Any) -> Any:
    return {
        "type": "mcp",
        "server_label": "calc",
        "server_url": server.url,
        "headers": {"Authorization": f"Bearer {TOKEN}"},
        **fields,
    }


def approve(request_id: str) -> Any:
    return {"type": "mcp_approval_response", "approval_request_id": request_id, "approve": True}


def offered(request_body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request_body.get("tools", [])]


def tool_messages(request_body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request_body["messages"] if m["role"] == "tool"]


async def stored_params(engine: AsyncEngine) -> str:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(runs.c.params))).scalars().all()
    return json.dumps(rows)


async def test_calls_of_a_server_that_needs_no_approval_are_mcp_call_items(
    client: AsyncOpenAI,
    upstream: FakeUpstream,
    mcp_server: McpTestServer,
    e2e_engine: AsyncEngine,
) -> None:
    upstream.script(
        ToolCall("c1", "calc__add", json.dumps({"a": 2, "b": 3})),
        ToolCall("c2", "calc__fail", json.dumps({"reason": "on purpose"})),
    )
    upstream.script(Text("2 + 3 = 5"))
    tool = calc(mcp_server, require_approval="never", allowed_tools=["add", "fail"])

    response = await client.responses.create(model=MODEL, input="2 + 3?", tools=[tool])

    assert response.status == "completed"
    assert offered(upstream.requests[0].body) == ["calc__add", "calc__fail"]
    assert [i.type for i in response.output] == ["mcp_call", "mcp_call", "message"]
    added, failed = sorted(of_type(response, McpCall), key=lambda c: c.name)  # as they returned
    assert (added.server_label, added.name, json.loads(added.arguments)) == (
        "calc",
        "add",
        {"a": 2, "b": 3},
    )
    assert added.status == "completed" and added.error is None and added.output is not None
    assert json.loads(added.output)["structured_content"] == {"result": 5}
    assert added.approval_request_id is None
    assert failed.status == "failed" and failed.output is None
    assert failed.error is not None and failed.error.type == "mcp_tool_execution_error"
    assert response.output_text == "2 + 3 = 5"
    # The response shows its tool without the headers; the database holds them sealed.
    (shown,) = response.tools
    assert shown.type == "mcp" and shown.headers is None and shown.server_label == "calc"
    assert TOKEN not in await stored_params(e2e_engine)
    # Read back, the response is what was answered.
    again = await client.responses.retrieve(response.id)
    assert [i.model_dump() for i in again.output] == [i.model_dump() for i in response.output]


async def test_an_approval_round_trip_approves_one_call_and_rejects_another(
    client: AsyncOpenAI, upstream: FakeUpstream, mcp_server: McpTestServer
) -> None:
    upstream.script(
        ToolCall("c1", "calc__add", json.dumps({"a": 2, "b": 3})),
        ToolCall("c2", "calc__add", json.dumps({"a": 9, "b": 9})),
    )
    upstream.script(Text("5; the other sum was refused."))
    tool = calc(mcp_server)  # require_approval not given: every call asks, as at OpenAI

    asked = await client.responses.create(model=MODEL, input="two sums", tools=[tool])

    assert asked.status == "completed"
    assert [i.type for i in asked.output] == ["mcp_approval_request"] * 2
    first, second = of_type(asked, McpApprovalRequest)
    assert (first.server_label, first.name) == ("calc", "add")
    assert json.loads(second.arguments) == {"a": 9, "b": 9}
    assert len(upstream.requests) == 1  # nothing ran

    # One ruling is kept, and the response still waits for the other.
    partial = await client.responses.create(
        model=MODEL,
        previous_response_id=asked.id,
        input=[approve(first.id)],
    )
    assert partial.id == asked.id and len(upstream.requests) == 1
    answered = await client.responses.create(
        model=MODEL,
        previous_response_id=asked.id,
        input=[
            {
                "type": "mcp_approval_response",
                "approval_request_id": second.id,
                "approve": False,
                "reason": "Too big.",
            }
        ],
    )

    assert answered.status == "completed" and answered.id != asked.id
    assert [i.type for i in answered.output] == ["mcp_call", "mcp_call", "message"]
    ran, refused = sorted(of_type(answered, McpCall), key=lambda c: str(c.status))
    assert ran.approval_request_id == first.id and ran.status == "completed"
    assert refused.approval_request_id == second.id and refused.status == "failed"
    assert answered.output_text == "5; the other sum was refused."
    seen = tool_messages(upstream.requests[-1].body)
    assert "5" in seen[0] and "Too big." in seen[1] and "18" not in seen[1]
    # The first response reads back as it ended: the approval requests.
    first_again = await client.responses.retrieve(asked.id)
    assert [i.type for i in first_again.output] == ["mcp_approval_request"] * 2
    assert first_again.status == "completed"


async def test_a_streamed_approval_round_trip(
    client: AsyncOpenAI, upstream: FakeUpstream, mcp_server: McpTestServer
) -> None:
    upstream.script(Text("Let me add. "), ToolCall("c1", "calc__add", json.dumps({"a": 1, "b": 1})))
    upstream.script(Text("Two."))
    tool = calc(mcp_server, require_approval={"always": {"tool_names": ["add"]}})

    stream = await client.responses.create(model=MODEL, input="1 + 1?", tools=[tool], stream=True)
    events = [event async for event in stream]

    assert isinstance(events[-1], ResponseCompletedEvent)
    done = [e.item for e in events if isinstance(e, ResponseOutputItemDoneEvent)]
    assert [i.type for i in done] == ["message", "mcp_approval_request"]
    (request,) = [i for i in done if isinstance(i, McpApprovalRequest)]

    stream = await client.responses.create(
        model=MODEL,
        previous_response_id=events[-1].response.id,
        input=[approve(request.id)],
        stream=True,
    )
    events = [event async for event in stream]

    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.mcp_call.completed" in kinds
    assert isinstance(events[-1], ResponseCompletedEvent)
    answered = events[-1].response
    assert [i.type for i in answered.output] == ["mcp_call", "message"]
    (call,) = of_type(answered, McpCall)
    assert call.approval_request_id == request.id
    read_back = await client.responses.retrieve(answered.id)
    assert [i.id for i in read_back.output] == [i.id for i in answered.output]


async def test_a_registered_server_is_named_by_its_label(
    api: httpx.AsyncClient,
    client: AsyncOpenAI,
    upstream: FakeUpstream,
    mcp_server: McpTestServer,
) -> None:
    registered = await api.post(
        "/v1/mcp_servers", json={"name": "ledger", "url": mcp_server.url, "bearer_token": TOKEN}
    )
    assert registered.status_code == 201, registered.text
    upstream.script(ToolCall("c1", "ledger__add", json.dumps({"a": 4, "b": 4})))
    upstream.script(Text("8"))
    tool: Any = {"type": "mcp", "server_label": "ledger", "require_approval": "never"}
    tool["allowed_tools"] = {"tool_names": ["add"]}

    response = await client.responses.create(model=MODEL, input="4 + 4?", tools=[tool])

    assert offered(upstream.requests[0].body) == ["ledger__add"]
    assert [i.type for i in response.output] == ["mcp_call", "message"]
    (call,) = of_type(response, McpCall)
    assert '"result":8' in (call.output or "").replace(" ", "")


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"server_url": "http://169.254.169.254/mcp"}, "tools[0].server_url"),
        ({"server_url": "ftp://example.com/mcp"}, "tools[0].server_url"),
        ({"require_approval": "sometimes"}, "tools[0].require_approval"),
        (
            {"require_approval": {"never": {"tool_names": "add"}}},
            "tools[0].require_approval.never.tool_names",
        ),
        ({"server_label": "two__parts"}, "tools[0].server_label"),
        ({"headers": {"X-Key": 7}}, "tools[0].headers"),
        ({"connector_id": "connector_gmail"}, "tools[0].connector_id"),
    ],
)
async def test_a_tool_that_cannot_be_used_is_a_400_naming_it(
    client: AsyncOpenAI, mcp_server: McpTestServer, tool: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=MODEL, input="hi", tools=[calc(mcp_server, **tool)])
    assert refused.value.param == param


async def test_approval_responses_that_answer_nothing_are_refused(
    client: AsyncOpenAI, upstream: FakeUpstream, mcp_server: McpTestServer
) -> None:
    ruling = approve("mcpr_x")
    with pytest.raises(openai.BadRequestError) as alone:
        await client.responses.create(model=MODEL, input=[ruling])
    assert alone.value.param == "previous_response_id"

    upstream.script(ToolCall("c1", "calc__add", json.dumps({"a": 1, "b": 2})))
    asked = await client.responses.create(model=MODEL, input="1 + 2?", tools=[calc(mcp_server)])
    with pytest.raises(openai.BadRequestError) as unknown:
        await client.responses.create(model=MODEL, previous_response_id=asked.id, input=[ruling])
    assert unknown.value.param == "input[0].approval_request_id"
    with pytest.raises(openai.BadRequestError) as mixed:
        await client.responses.create(
            model=MODEL,
            previous_response_id=asked.id,
            input=[approve(of_type(asked, McpApprovalRequest)[0].id), MORE],
        )
    assert mixed.value.status_code == 400
