"""The official `openai` package for Node drives /openai/v1 unchanged (as the Python SDK does
in test_routes.py): a chain, a stream, a function tool round trip, a conversation, a refusal;
reasoning streamed and returned."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from testkit.upstream import FakeUpstream, Text, Thinking, ToolCall
from tests.e2e import Service

NODE_SDK = Path(__file__).parent / "node_sdk"
HANG_SECONDS = 300  # a guard against a hang, never a speed check


def install_openai_for_node() -> None:
    """The pinned `openai` package (package-lock.json), installed once (`make test` does it)."""
    if not (NODE_SDK / "node_modules" / "openai").is_dir():
        npm = shutil.which("npm")
        assert npm is not None, "Node and npm are needed (Node 20 or later)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_SDK, check=True)


@pytest.mark.parametrize("model", ["gpt-4o-mini", "claude-haiku-4-5"])
async def test_the_node_sdk_drives_responses_and_conversations(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream, model: str
) -> None:
    install_openai_for_node()
    upstream.script(Text("Hello."))
    upstream.script(Text("Then"), Text(" rain."))
    upstream.script(ToolCall("up_1", "get_weather", '{"city": "Oslo"}'))
    upstream.script(Text("3 °C."))
    upstream.script(Text("Ada."))
    args = {
        "baseURL": f"{service.url}/openai/v1",
        "apiKey": api.headers["Authorization"].removeprefix("Bearer "),
        "model": model,
    }
    node = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_SDK / "responses.mjs"),
        json.dumps(args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), HANG_SECONDS)
    assert node.returncode == 0, err.decode()
    result = json.loads(out)
    assert result["first"] == "Hello."
    assert result["types"][0] == "response.created" and result["types"][-1] == "response.completed"
    assert result["sequence"] == list(range(len(result["types"])))
    assert result["streamed"] == result["completed"] == "Then rain."
    assert result["call"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert result["answered"] == "3 °C." and result["answeredOutput"] == ["message"]
    assert result["conversation"] is True
    assert result["items"] == [
        ["user", "My name is Ada."],
        ["user", "Who am I?"],
        ["assistant", "Ada."],
    ]
    assert result["refused"] == {"status": 400, "param": "top_p", "code": "unsupported_parameter"}
    wire = "/messages" if model.startswith("claude") else "/chat/completions"
    assert all(r.path.endswith(wire) for r in upstream.requests)


async def test_the_node_sdk_streams_reasoning(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    install_openai_for_node()
    upstream.script(Thinking("Try primes up to 31.", fragments=3), Text("Yes."))
    args = {
        "baseURL": f"{service.url}/openai/v1",
        "apiKey": api.headers["Authorization"].removeprefix("Bearer "),
        "model": "claude-sonnet-4-5",
    }
    node = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_SDK / "reasoning.mjs"),
        json.dumps(args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), HANG_SECONDS)
    assert node.returncode == 0, err.decode()
    result = json.loads(out)
    assert result["summary"] == "Try primes up to 31." and result["answer"] == "Yes."
    assert result["output"] == ["reasoning", "message"]
    assert result["reasoning"] == ["Try primes up to 31."]
    assert result["encrypted"] == "string"  # included: the stream's last response has it
    assert result["readBack"] == [["reasoning", None], ["message", None]]  # not included
    for event in (
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ):
        assert result["types"].count(event) == 1
    assert upstream.requests[-1].body["thinking"]["budget_tokens"] == 1024
