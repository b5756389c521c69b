"""Runs with MCP servers attached, end to end: a served API with workers, the fake LLM upstream
through the real SDKs, and a real MCP server. The model is offered the servers' namespaced tools
(an invalid schema left out with a context.warning), its calls reach the server, and results,
errors and unreachable servers land in the journal as tool results, never as a failed run."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testkit.api import history, new_session
from testkit.mcp_server import McpTestServer
from testkit.sse_client import streamed_ask
from testkit.upstream import FakeUpstream, Text, ToolCall

TOKEN = "run-secret-token-31337"


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[McpTestServer]:
    with McpTestServer(token=TOKEN) as server:
        yield server


async def register(api: httpx.AsyncClient, name: str, url: str, **body: Any) -> None:
    response = await api.post("/v1/mcp_servers", json={"name": name, "url": url, **body})
    assert response.status_code == 201, response.text


def offered(request_body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request_body.get("tools", [])]


def tool_results(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["payload"] for e in journal if e["kind"] == "tool_result"]


async def test_a_session_uses_an_attached_servers_tools(
    api: httpx.AsyncClient, upstream: FakeUpstream, mcp_server: McpTestServer
) -> None:
    await register(api, "calc", mcp_server.url, bearer_token=TOKEN)
    sid = (await new_session(api, config={"mcp_servers": ["calc"]}))["id"]
    upstream.script(ToolCall("c1", "calc__add", json.dumps({"a": 2, "b": 3})))
    upstream.script(ToolCall("c2", "calc__fail", "{}"))
    upstream.script(Text("2 + 3 = 5"))

    events = await streamed_ask(api, sid, "what is 2 + 3?")

    assert events[-1].type == "run.completed", events[-1].data
    first = upstream.requests[0].body
    assert {"calc__add", "calc__fail", "calc__hang", "calc__big"} <= set(offered(first))
    assert "calc__weird" not in offered(first)
    warnings = [e.data for e in events if e.type == "context.warning"]
    assert warnings == [
        {
            "level": "tools_left_out",
            "message": "MCP tool weird of calc is left out: its input schema is not a valid "
            "JSON Schema",
        }
    ]
    add, fail = tool_results(await history(api, sid))
    assert add == {
        "name": "calc__add",
        "content": {"text": "5", "structured_content": {"result": 5}},
        "is_error": False,
    }
    assert fail["name"] == "calc__fail" and fail["is_error"] is True
    # The model saw both results, in the provider's format (the thread renames call ids).
    last = upstream.requests[-1].body["messages"]
    seen = [m["content"] for m in last if m["role"] == "tool"]
    assert len(seen) == 2 and "5" in seen[0] and "it failed" in seen[1]


async def test_an_ask_attaches_a_server_and_a_down_one_is_a_warning(
    api: httpx.AsyncClient, upstream: FakeUpstream, mcp_server: McpTestServer
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    await register(api, "calc", mcp_server.url, bearer_token=TOKEN, allowed_tools=["add"])
    await register(api, "down", f"http://127.0.0.1:{closed}/mcp")
    sid = (await new_session(api))["id"]
    upstream.script(ToolCall("c1", "calc__add", json.dumps({"a": 1, "b": 1})))
    upstream.script(Text("two"))

    events = await streamed_ask(api, sid, "1 + 1?", mcp_servers=["calc", "down", "nowhere"])

    assert events[-1].type == "run.completed", events[-1].data
    assert offered(upstream.requests[0].body) == ["calc__add"]
    messages = [e.data["message"] for e in events if e.type == "context.warning"]
    assert messages[0] == "no MCP server is named nowhere"
    assert messages[1].startswith("MCP server down offers no tools: ")
    (result,) = tool_results(await history(api, sid))
    assert result["content"]["structured_content"] == {"result": 2}


async def test_a_server_refusing_its_caller_is_a_warning_and_a_tool_error(
    api: httpx.AsyncClient, upstream: FakeUpstream, mcp_server: McpTestServer
) -> None:
    """Once its token is taken away the server answers 401: a cached list of the old
    credentials is not reused (the cache is keyed by them), the run says why the tools are
    missing, and a call of one of them is an error result the model reads."""
    await register(api, "calc", mcp_server.url, bearer_token=TOKEN)
    sid = (await new_session(api, config={"mcp_servers": ["calc"]}))["id"]
    upstream.script(Text("warm"))
    assert (await streamed_ask(api, sid, "warm up"))[-1].type == "run.completed"
    servers = (await api.get("/v1/mcp_servers")).json()["data"]
    patched = await api.patch(f"/v1/mcp_servers/{servers[0]['id']}", json={"bearer_token": ""})
    assert patched.status_code == 200
    upstream.script(ToolCall("c1", "calc__add", json.dumps({"a": 1, "b": 2})))
    upstream.script(Text("it failed"))

    events = await streamed_ask(api, sid, "1 + 2?")

    assert events[-1].type == "run.completed", events[-1].data
    messages = [e.data["message"] for e in events if e.type == "context.warning"]
    assert messages[0].startswith("MCP server calc offers no tools: ")
    assert "calc__add" not in offered(upstream.requests[-2].body)
    (result,) = tool_results(await history(api, sid))
    assert result["is_error"] is True
    assert "calc__add" in result["content"]


async def test_an_mcp_tool_under_ask_waits_for_a_person_and_runs_once(
    api: httpx.AsyncClient, upstream: FakeUpstream, mcp_server: McpTestServer
) -> None:
    """Approvals apply to MCP tools like any other: the run waits holding no worker, two
    approvals posted at once are one ruling, the call reaches the server once, and a rejected
    call never does (the model reads the reason)."""
    await register(api, "ledger", mcp_server.url, bearer_token=TOKEN)
    policy = {"tool_approval": {"default": "always", "tools": {"ledger__add": "ask"}}}
    sid = (await new_session(api, config={"mcp_servers": ["ledger"], "run_policy": policy}))["id"]
    upstream.script(
        ToolCall("c1", "ledger__add", json.dumps({"a": 2, "b": 3})),
        ToolCall("c2", "ledger__add", json.dumps({"a": 9, "b": 9})),
    )
    upstream.script(Text("5, and the other was refused."))
    asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "sums", "stream": False})
    run_id = asked.json()["id"]
    waiting = await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 20})
    assert waiting.json()["status"] == "awaiting_approval", waiting.text  # wait ends there
    calls = (await api.get(f"/v1/runs/{run_id}/approvals")).json()["approvals"]
    assert [c["name"] for c in calls] == ["ledger__add", "ledger__add"]
    first, second = (c["tool_call_id"] for c in calls)

    body = {
        "approvals": [
            {"tool_call_id": first, "decision": "approve"},
            {"tool_call_id": second, "decision": "reject", "reason": "Too big."},
        ]
    }
    posted = await asyncio.gather(
        *(api.post(f"/v1/runs/{run_id}/approvals", json=body) for _ in range(2))
    )
    assert sorted(p.status_code for p in posted) == [200, 409]

    ended = await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 20})
    assert ended.json()["status"] == "completed", ended.text
    results = tool_results(await history(api, sid))
    (rejected,) = [r for r in results if r["is_error"]]
    (ran,) = [r for r in results if not r["is_error"]]  # once
    assert ran["content"] == {"text": "5", "structured_content": {"result": 5}}
    assert "Too big." in rejected["content"]
    seen = [m["content"] for m in upstream.requests[-1].body["messages"] if m["role"] == "tool"]
    assert "5" in seen[0] and "Too big." in seen[1] and "18" not in seen[1]
