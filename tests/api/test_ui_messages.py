"""The AI SDK's chat protocol, driven by the AI SDK itself: its DefaultChatTransport (what
`useChat` sends) and readUIMessageStream (what it renders), in Node, against the served app."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.api import history, new_session
from testkit.upstream import (
    FailMidStream,
    FakeUpstream,
    Hold,
    RedactedThinking,
    Text,
    Thinking,
    ToolCall,
    Usage,
)
from tests.documents import pdf

JS = Path(__file__).parent / "ui_chat_js"  # the current major of `ai`, and chat.mjs
JS_V5 = Path(__file__).parent / "ui_chat_js_v5"  # `ai` 5, for the clients still on it
HANG_SECONDS = 300
CALCULATOR = {
    "name": "calculator",
    "kind": "builtin",
    "description": "Arithmetic",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}
THINKING = "anthropic:claude-sonnet-4-5"  # a model that reasons (the fake signs its thinking)


def install_ai_sdk() -> None:
    """The pinned `ai` packages (package-lock.json), installed once (`make test` does it too)."""
    for sdk in (JS, JS_V5):
        if not (sdk / "node_modules" / "ai").is_dir():
            npm = shutil.which("npm")
            assert npm is not None, "Node and npm are needed (Node 20 or later)"
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=sdk, check=True)


def ai_major(sdk: Path) -> int:
    version = json.loads((sdk / "node_modules" / "ai" / "package.json").read_text())["version"]
    return int(version.split(".")[0])


@pytest.fixture(scope="module")
def ai_sdk() -> None:
    install_ai_sdk()


def user(text: str, message_id: str | None = None) -> dict[str, Any]:
    return {
        "id": message_id or str(uuid.uuid4()),
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }


class Node:
    """`node chat.mjs` running one scenario with the `ai` package installed in `sdk`; its JSON
    lines are read as they come."""

    def __init__(
        self, api: httpx.AsyncClient, scenario: str, chat_id: str, sdk: Path = JS, **args: Any
    ) -> None:
        self.sdk = sdk  # where node runs: the `ai` package it loads
        self.args = {
            "api": str(api.base_url.join("/v1/ui/chat")),
            "key": api.headers["Authorization"].removeprefix("Bearer "),
            "chatId": chat_id,
            "scenario": scenario,
            **args,
        }
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Node:
        node = shutil.which("node")
        assert node is not None
        self.process = await asyncio.create_subprocess_exec(
            node,
            str(JS / "chat.mjs"),
            json.dumps(self.args),
            cwd=self.sdk,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return self

    async def line(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        # A guard against a hang, not a speed check: every scenario ends far sooner.
        raw = await asyncio.wait_for(self.process.stdout.readline(), HANG_SECONDS)
        if not raw:
            assert self.process.stderr is not None
            error = (await self.process.stderr.read()).decode()
            raise AssertionError(f"node ended without output: {error}")
        result: dict[str, Any] = json.loads(raw)
        return result

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        if self.process.returncode is None:
            if exc[0] is not None:
                self.process.kill()
            await self.process.wait()
        if exc[0] is None:
            assert self.process.returncode == 0


async def run_node(
    api: httpx.AsyncClient, scenario: str, chat_id: str, sdk: Path = JS, **args: Any
) -> Any:
    async with Node(api, scenario, chat_id, sdk, **args) as node:
        return await node.line()


def texts_of(message: dict[str, Any]) -> list[str]:
    return [p["text"] for p in message["parts"] if p["type"] == "text"]


def run_id_of(chunks: list[dict[str, Any]]) -> str:
    run: str = next(c for c in chunks if c["type"] == "data-threadline-run")["data"]["runId"]
    return run


# The `ai` majors a test runs with: the current one and 5 (for what 5 supports).
BOTH_MAJORS = pytest.mark.parametrize("sdk", [JS, JS_V5], ids=["ai-current", "ai-5"])


def test_the_ai_sdk_projects_hold_the_current_major_and_5(ai_sdk: None) -> None:
    assert (ai_major(JS), ai_major(JS_V5)) == (7, 5)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """An upstream Hold's release, set at the end whatever happens (the fake must not hang)."""
    event = threading.Event()
    yield event
    event.set()


async def test_a_streamed_answer_renders_and_only_the_new_message_is_journaled(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None
) -> None:
    chat = f"chat-{uuid.uuid4()}"
    upstream.script(Text("Hello"), Text(", world"), Usage(5, 2))
    result = await run_node(api, "send", chat, messages=[user("Hi")])
    final = result["messages"][-1]
    assert final["role"] == "assistant" and texts_of(final) == ["Hello, world"]
    assert [p["type"] for p in final["parts"]] == [
        "data-threadline-run",
        "data-threadline-context",
        "step-start",
        "text",
        "data-threadline-usage",
    ]
    meter = final["parts"][1]["data"]
    assert meter["level"] == "ok" and 0 < meter["tokens"] < meter["budget"]
    assert meter["percent"] == round(100 * meter["tokens"] / meter["budget"], 1)
    types = [c["type"] for c in result["chunks"]]
    assert types[:4] == ["start", "data-threadline-run", "data-threadline-context", "start-step"]
    assert types[-3:] == ["text-end", "finish-step", "finish"]
    assert result["chunks"][-1]["finishReason"] == "stop" and result["errors"] == []

    # The frontend's copy of the history is not the journal's: only its last message counts.
    upstream.script(Text("Fine"))
    session = (await api.get("/v1/sessions", params={"metadata": f"ai_sdk_chat_id:{chat}"})).json()
    sid = session["data"][0]["id"]
    pending = [{"kind": "message", "payload": {"role": "user", "content": "How are you?"}}]
    dry = (await api.post(f"/v1/sessions/{sid}/projection", json={"pending": pending})).json()
    stale = [user("something else"), {**final, "parts": [{"type": "text", "text": "edited"}]}]
    body = {"id": chat, "messages": [*stale, user("How are you?")], "trigger": "submit-message"}
    async with api.stream("POST", "/v1/ui/chat", json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    # The meter shows what the run's first model call is sent: the ask's dry run.
    meters = [json.loads(x[6:]) for x in lines if "data-threadline-context" in x]
    assert meters[0]["data"]["tokens"] == dry["meta"]["estimated_tokens"]
    assert meters[0]["data"]["budget"] == dry["meta"]["budget"]
    sent = upstream.requests[-1].body["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("user", "Hi"),
        ("assistant", "Hello, world"),
        ("user", "How are you?"),
    ]
    journal = await history(api, sid)
    assert [e["payload"]["content"] for e in journal if e["kind"] == "message"] == [
        "Hi",
        "Hello, world",
        "How are you?",
        "Fine",
    ]


@BOTH_MAJORS
async def test_a_tool_call_renders_as_a_tool_part_and_a_second_step(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, sdk: Path
) -> None:
    # A chat id that is a session's id is that session (here, one with a tool).
    sid = (await new_session(api, config={"tools": [CALCULATOR]}))["id"]
    upstream.script(
        Text("Let me compute."),
        ToolCall("call_1", "calculator", '{"expression": "4 * 3"}'),
        Usage(30, 10),
    )
    upstream.script(Text("The result is 12"), Usage(50, 5))
    result = await run_node(api, "send", sid, sdk, messages=[user("Multiply 4 by 3")])
    parts = result["messages"][-1]["parts"]
    assert [p["type"] for p in parts if not p["type"].startswith("data-")] == [
        "step-start",
        "text",
        "tool-calculator",
        "step-start",
        "text",
    ]
    tool = next(p for p in parts if p["type"] == "tool-calculator")
    assert tool["toolCallId"] == "call_1_1_0" and tool["state"] == "output-available"
    assert tool["input"] == {"expression": "4 * 3"} and tool["output"] == "12"
    assert tool["providerExecuted"] is True
    assert texts_of(result["messages"][-1]) == ["Let me compute.", "The result is 12"]
    assert result["chunks"][-1] == {"type": "finish", "finishReason": "stop"}


@BOTH_MAJORS
async def test_reasoning_renders_as_reasoning_parts_before_each_turns_text(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, sdk: Path
) -> None:
    """Thinking streams as reasoning parts (useChat shows them apart from the answer), in
    their order among each model turn's text and tool calls; a redacted block is an empty
    part that says so."""
    config = {"model": THINKING, "tools": [CALCULATOR], "reasoning": {"effort": "medium"}}
    sid = (await new_session(api, config=config))["id"]
    upstream.script(
        Thinking("Four times three."),
        RedactedThinking(),
        Text("Computing."),
        ToolCall("toolu_1", "calculator", '{"expression": "4 * 3"}'),
    )
    upstream.script(Thinking("It is twelve."), Text("12"), Usage(40, 9))
    result = await run_node(api, "send", sid, sdk, messages=[user("Multiply 4 by 3")])
    assert result["errors"] == []
    parts = [p for p in result["messages"][-1]["parts"] if not p["type"].startswith("data-")]
    assert [(p["type"], p.get("text")) for p in parts] == [
        ("step-start", None),
        ("reasoning", "Four times three."),
        ("reasoning", ""),
        ("text", "Computing."),
        ("tool-calculator", None),
        ("step-start", None),
        ("reasoning", "It is twelve."),
        ("text", "12"),
    ]
    assert all(p["state"] == "done" for p in parts if p["type"] in ("reasoning", "text"))
    assert parts[2]["providerMetadata"] == {"threadline": {"redacted": True}}
    assert "providerMetadata" not in parts[1] and "providerMetadata" not in parts[6]
    assert parts[4]["state"] == "output-available" and parts[4]["output"] == "12"
    # Each block is opened, written and closed before the turn's text starts.
    bounds = [
        (c["type"], c["id"])
        for c in result["chunks"]
        if c["type"] in ("reasoning-start", "reasoning-end", "text-start", "text-end")
    ]
    assert bounds == [
        ("reasoning-start", "reasoning-1"),
        ("reasoning-end", "reasoning-1"),
        ("reasoning-start", "reasoning-2"),
        ("reasoning-end", "reasoning-2"),
        ("text-start", "text-1"),
        ("text-end", "text-1"),
        ("reasoning-start", "reasoning-3"),
        ("reasoning-end", "reasoning-3"),
        ("text-start", "text-2"),
        ("text-end", "text-2"),
    ]
    # The answer is the text alone: the journal's last answer, and what the model was sent.
    assert texts_of(result["messages"][-1]) == ["Computing.", "12"]


def shown(part: dict[str, Any]) -> dict[str, Any]:
    """What a page shows of a part (not how it came: streamed chunks' provider flags)."""
    keys = ("type", "text", "state", "toolCallId", "input", "output", "errorText")
    return {k: part[k] for k in (*keys, "providerMetadata") if k in part}


@BOTH_MAJORS
async def test_the_stored_messages_are_what_was_streamed_and_useChat_takes_them(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, sdk: Path
) -> None:
    """GET .../messages: the chat's history as UI messages, reasoning and tools included, in
    the shapes the stream rendered; the AI SDK validates them and a Chat continues from them."""
    config = {"model": THINKING, "tools": [CALCULATOR], "reasoning": {"effort": "medium"}}
    sid = (await new_session(api, config=config))["id"]
    upstream.script(
        Thinking("Four times three."),
        RedactedThinking(),
        Text("Computing."),
        ToolCall("toolu_1", "calculator", '{"expression": "4 * 3"}'),
    )
    upstream.script(Thinking("It is twelve."), Text("12"), Usage(40, 9))
    streamed = await run_node(api, "send", sid, sdk, messages=[user("Multiply 4 by 3", "u1")])
    upstream.script(Thinking("Easy."), Text("You are welcome."))
    result = await run_node(api, "history", sid, sdk, send="Thanks")
    assert result["errors"] == []
    stored = result["stored"]
    assert [(m["role"], m["id"]) for m in stored] == [
        ("user", stored[0]["id"]),
        ("assistant", run_id_of(streamed["chunks"])),
    ]
    assert stored[0]["parts"] == [{"type": "text", "text": "Multiply 4 by 3"}]
    answer = streamed["messages"][-1]["parts"]
    # The same parts; a tool's output as the journal has it (the stream sends its preview).
    assert [shown(p) for p in stored[1]["parts"]] == [
        {**shown(p), "output": 12} if p["type"] == "tool-calculator" else shown(p)
        for p in answer
        if not p["type"].startswith("data-")
    ]
    # The Chat went on from the stored history: the new answer, its reasoning first.
    assert [m["role"] for m in result["messages"]] == ["user", "assistant", "user", "assistant"]
    last = [p for p in result["messages"][-1]["parts"] if not p["type"].startswith("data-")]
    assert [(p["type"], p.get("text")) for p in last] == [
        ("step-start", None),
        ("reasoning", "Easy."),
        ("text", "You are welcome."),
    ]
    new_chat = await api.get(f"/v1/ui/chat/chat-{uuid.uuid4()}/messages")
    assert new_chat.status_code == 200 and new_chat.json() == {"messages": []}


@BOTH_MAJORS
async def test_an_attached_pdf_is_journaled_as_a_document_and_sent_to_the_model(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, sdk: Path
) -> None:
    """useChat's sendMessage({text, files}): the PDF file part becomes the user message's
    document part (in the parts' order), which the provider gets in its own shape; the stored
    messages give it back as a file part."""
    chat = f"chat-{uuid.uuid4()}"
    url = "data:application/pdf;base64," + base64.b64encode(pdf(2)).decode()
    attached = {"type": "file", "mediaType": "application/pdf", "filename": "plan.pdf", "url": url}
    upstream.script(Text("Two blank pages."))
    actions = [{"send": "What is in it?", "files": [attached]}]
    result = await run_node(api, "chat", chat, sdk, actions=actions)
    assert result["errors"] == [] and texts_of(result["messages"][-1]) == ["Two blank pages."]
    sid = (await api.get("/v1/sessions", params={"metadata": f"ai_sdk_chat_id:{chat}"})).json()
    journal = await history(api, sid["data"][0]["id"])
    assert journal[0]["payload"]["content"] == [
        {"type": "document", "url": url, "filename": "plan.pdf"},
        {"type": "text", "text": "What is in it?"},
    ]
    sent = upstream.requests[-1].body["messages"][-1]["content"]
    assert sent[0] == {"type": "file", "file": {"filename": "plan.pdf", "file_data": url}}
    stored = (await api.get(f"/v1/ui/chat/{chat}/messages")).json()["messages"]
    assert stored[0]["parts"] == [attached, {"type": "text", "text": "What is in it?"}]


@BOTH_MAJORS
async def test_a_client_side_tool_runs_in_the_browser_and_the_run_goes_on(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, sdk: Path
) -> None:
    locate = {"name": "get_location", "kind": "client", "description": "Where the user is"}
    sid = (await new_session(api, config={"tools": [locate]}))["id"]
    upstream.script(Text("Let me look."), ToolCall("call_loc", "get_location", "{}"))
    upstream.script(Text("You are in Oslo."))
    actions = [{"send": "Where am I?", "until": "You are in Oslo."}]
    outputs = {"get_location": {"city": "Oslo"}}
    result = await run_node(api, "chat", sid, sdk, actions=actions, toolOutputs=outputs)
    assert result["errors"] == [] and result["status"] == "ready"
    assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
    parts = [p for p in result["messages"][-1]["parts"] if not p["type"].startswith("data-")]
    assert [p["type"] for p in parts] == [
        "step-start",
        "text",
        "tool-get_location",
        "step-start",
        "text",
    ]
    tool = parts[2]
    assert tool["state"] == "output-available" and tool["output"] == {"city": "Oslo"}
    assert texts_of(result["messages"][-1]) == ["Let me look.", "You are in Oslo."]
    sent = upstream.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[-1]["content"] == '{"city":"Oslo"}'


async def test_a_resume_replays_past_a_client_tool_call_already_answered(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, release: threading.Event
) -> None:
    locate = {"name": "get_location", "kind": "client", "description": "Where the user is"}
    sid = (await new_session(api, config={"tools": [locate]}))["id"]
    upstream.script(ToolCall("call_loc", "get_location", "{}"))
    upstream.script(Text("Oslo"), Hold(release), Text("!"))
    body = {"id": sid, "messages": [user("Where am I?")], "on_disconnect": "continue"}
    async with api.stream("POST", "/v1/ui/chat", json=body) as response:
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-2:] == ['data: {"type":"finish","finishReason":"tool-calls"}', "data: [DONE]"]
    run_id = json.loads(lines[1].removeprefix("data: "))["data"]["runId"]
    outputs = {"tool_outputs": [{"tool_call_id": "call_1_1_0", "output": {"city": "Oslo"}}]}
    assert (await api.post(f"/v1/runs/{run_id}/tool_outputs", json=outputs)).status_code == 200
    # The page is reloaded while the answer is held: the replay goes past the answered wait.
    async with Node(api, "resume", sid) as node:
        assert await node.line() == {"connected": True}
        release.set()
        result = await node.line()
    assert result["errors"] == [] and result["chunks"][-1]["type"] == "finish"
    final = result["messages"][-1]
    assert texts_of(final) == ["Oslo!"]
    tool = next(p for p in final["parts"] if p["type"] == "tool-get_location")
    assert tool["state"] == "output-available" and tool["output"] == {"city": "Oslo"}
    assert tool["providerExecuted"] is True  # answered: useChat's onToolCall must not rerun it


async def test_a_reload_resumes_the_active_run_and_204_when_there_is_none(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, release: threading.Event
) -> None:
    chat = f"chat-{uuid.uuid4()}"
    assert (await run_node(api, "resume", chat)) == {"resumed": False}  # a new chat
    upstream.script(Text("Hello "), Hold(release), Text("world"))
    # The page that asked is reloaded mid-answer (it asked to keep the run on leaving).
    body = {"id": chat, "messages": [user("Hi")], "on_disconnect": "continue"}
    async with api.stream("POST", "/v1/ui/chat", json=body) as response:
        async for line in response.aiter_lines():
            if '"text-delta"' in line:
                break
    # The reloaded page: useChat({resume: true}) calls the Chat's resumeStream() on load.
    async with Node(api, "chat", chat, actions=[{"resume": True}]) as node:
        assert await node.line() == {"connected": True}
        release.set()
        result = await node.line()
    assert result["errors"] == [] and result["status"] == "ready"
    assert [(m["role"], texts_of(m)) for m in result["messages"]] == [
        ("assistant", ["Hello world"])
    ]
    assert (await run_node(api, "resume", chat)) == {"resumed": False}
    response = await api.get(f"/v1/ui/chat/{chat}/stream")
    assert response.status_code == 204


async def test_regenerate_rolls_back_the_last_answer_and_asks_again(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None
) -> None:
    chat = f"chat-{uuid.uuid4()}"
    upstream.script(Text("A first joke"))
    upstream.script(Text("A second joke"))
    upstream.script(Text("A better joke"))
    # useChat's regenerate(): it drops the answer, sends the rest and names the answer.
    actions = [{"send": "Tell me a joke"}, {"regenerate": True}, {"regenerate": True}]
    result = await run_node(api, "chat", chat, actions=actions)
    assert result["errors"] == [] and result["status"] == "ready"
    assert [(m["role"], texts_of(m)) for m in result["messages"]] == [
        ("user", ["Tell me a joke"]),
        ("assistant", ["A better joke"]),
    ]
    sent = upstream.requests[-1].body["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [("user", "Tell me a joke")]
    sid = (await api.get("/v1/sessions", params={"metadata": f"ai_sdk_chat_id:{chat}"})).json()
    journal = await history(api, sid["data"][0]["id"])
    rollbacks = [e["payload"] for e in journal if e["kind"] == "rollback"]
    asked = [e["seq"] for e in journal if e["payload"].get("role") == "user"]
    assert [(r["from_seq"], r["reason"]) for r in rollbacks] == [
        (asked[0], "regenerate"),
        (asked[1], "regenerate"),
    ]


async def test_an_edited_message_rolls_back_from_it_and_asks_the_new_text(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None
) -> None:
    chat = f"chat-{uuid.uuid4()}"
    for answer_text in ("Paris", "Berlin", "Rome"):
        upstream.script(Text(answer_text))
    actions = [
        {"send": "Capital of France?"},
        {"send": "Capital of Germany?"},
        {"edit": "Capital of Italy?", "userIndex": 0},
    ]
    result = await run_node(api, "chat", chat, actions=actions)
    assert result["errors"] == []
    assert [(m["role"], texts_of(m)) for m in result["messages"]] == [
        ("user", ["Capital of Italy?"]),
        ("assistant", ["Rome"]),
    ]
    sent = upstream.requests[-1].body["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [("user", "Capital of Italy?")]
    sid = (await api.get("/v1/sessions", params={"metadata": f"ai_sdk_chat_id:{chat}"})).json()
    journal = await history(api, sid["data"][0]["id"])
    (rollback,) = [e["payload"] for e in journal if e["kind"] == "rollback"]
    assert rollback["from_seq"] == journal[0]["seq"] and rollback["reason"] == "edit"


async def test_a_refused_regenerate_or_edit_leaves_no_rollback(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """The rollback is committed with the ask or not at all: an ask the session's run policy
    refuses (its one turn is spent) leaves the journal as it was."""
    session = await new_session(api, config={"run_policy": {"max_turns": 1}})
    upstream.script(Text("A joke"))
    first = {"id": session["id"], "messages": [user("Tell me a joke")]}
    async with api.stream("POST", "/v1/ui/chat", json=first) as response:
        assert response.status_code == 200
        assert (await response.aread()).decode().rstrip().endswith("data: [DONE]")
    before = await history(api, session["id"])
    answered = {**first, "messages": [user("Tell me a joke", "m1")]}
    for body in (
        {**answered, "trigger": "regenerate-message"},
        {**answered, "messageId": "m1"},  # an edit of the first message
    ):
        refused = await api.post("/v1/ui/chat", json=body)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "policy_violation"
    after = await history(api, session["id"])
    assert after == before and "rollback" not in [e["kind"] for e in after]


async def test_stop_cancels_the_run(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, release: threading.Event
) -> None:
    chat = f"chat-{uuid.uuid4()}"
    upstream.script(Text("A long "), Hold(release), Text("answer"))
    result = await run_node(api, "stop", chat, messages=[user("Write an essay")])
    assert result["aborted"] is True
    run_id = run_id_of(result["chunks"])
    run = (await api.get(f"/v1/runs/{run_id}", params={"wait": "true"})).json()
    assert run["status"] == "cancelled"


async def test_stop_in_the_chat_cancels_the_run(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, release: threading.Event
) -> None:
    chat = f"chat-{uuid.uuid4()}"
    upstream.script(Text("A long "), Hold(release), Text("answer"))
    actions = [{"send": "Write an essay", "stopOnText": True}]
    result = await run_node(api, "chat", chat, actions=actions)
    assert result["status"] == "ready" and result["errors"] == []
    assert texts_of(result["messages"][-1]) == ["A long "]
    run_id = next(p for p in result["messages"][-1]["parts"] if p["type"] == "data-threadline-run")
    run = (await api.get(f"/v1/runs/{run_id['data']['runId']}", params={"wait": "true"})).json()
    assert run["status"] == "cancelled"


def answer(message: dict[str, Any]) -> list[str]:
    """The text parts after the last reset marker: what the run answers."""
    parts = message["parts"]
    resets = [i for i, p in enumerate(parts) if p["type"] == "data-threadline-reset"]
    after = parts[resets[-1] + 1 :] if resets else parts
    return [p["text"] for p in after if p["type"] == "text"]


async def test_a_retried_model_call_renders_as_a_marked_new_step(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None
) -> None:
    """The protocol cannot take back rendered text: the voided attempt stays a closed step,
    a marker part follows, and the answer is what comes after it, in one message."""
    for scenario in ("send", "chat"):
        chat = f"chat-{uuid.uuid4()}"
        upstream.script(Text("half "), Text("an answer"), FailMidStream("overloaded", "Over"))
        upstream.script(Text("the whole "), Text("answer"), Usage(12, 3))
        if scenario == "send":  # readUIMessageStream
            result = await run_node(api, "send", chat, messages=[user("Hi")])
            assert result["chunks"][-1] == {"type": "finish", "finishReason": "stop"}
        else:  # useChat's Chat
            result = await run_node(api, "chat", chat, actions=[{"send": "Hi"}])
            assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
        assert result["errors"] == []
        final = result["messages"][-1]
        assert texts_of(final) == ["half an answer", "the whole answer"]
        assert answer(final) == ["the whole answer"]
        types = [p["type"] for p in final["parts"] if p["type"] != "data-threadline-usage"]
        assert types == [
            "data-threadline-run",
            "data-threadline-context",
            "step-start",
            "text",
            "data-threadline-reset",
            "step-start",
            "text",
        ]
        assert all(p["state"] == "done" for p in final["parts"] if p["type"] == "text")


async def test_bad_requests_get_json_errors(api: httpx.AsyncClient) -> None:
    chat = f"chat-{uuid.uuid4()}"
    no_user = {"id": chat, "messages": [], "trigger": "submit-message"}
    response = await api.post("/v1/ui/chat", json=no_user)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "no_user_message"
    empty = {"id": chat, "messages": [{"id": "m", "role": "user", "parts": []}]}
    response = await api.post("/v1/ui/chat", json=empty)
    assert response.json()["error"]["code"] == "empty_message"
    regenerate = {"id": chat, "messages": [], "trigger": "regenerate-message"}
    response = await api.post("/v1/ui/chat", json=regenerate)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "nothing_to_regenerate"
    for file, field in (
        ({"mediaType": "application/zip", "url": "data:application/zip;base64,UEs="}, "mediaType"),
        ({"mediaType": "application/pdf", "url": "https://example.com/a.pdf"}, "url"),
    ):
        parts = [{"type": "text", "text": "Read this"}, {"type": "file", **file}]
        message = {"id": "m", "role": "user", "parts": parts}
        response = await api.post("/v1/ui/chat", json={"id": chat, "messages": [message]})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported_file"
        assert error["details"]["loc"] == ["body", "messages", 0, "parts", 1, field]
    bad_image = {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"}
    message = {"id": "m", "role": "user", "parts": [bad_image, {"type": "text", "text": "See"}]}
    response = await api.post("/v1/ui/chat", json={"id": chat, "messages": [message]})
    assert response.status_code == 422 and response.json()["error"]["code"] != "unsupported_file"
    # Nothing refused made the chat's session.
    found = await api.get("/v1/sessions", params={"metadata": f"ai_sdk_chat_id:{chat}"})
    assert found.json()["data"] == []
    response = await api.post("/v1/ui/chat", json={"id": chat, "messages": [], "trigger": "x"})
    assert response.status_code == 422 and "error" in response.json()
    anonymous = await httpx.AsyncClient(base_url=api.base_url).post("/v1/ui/chat", json=no_user)
    assert anonymous.status_code == 401


async def test_any_chat_id_the_ai_sdk_may_send_is_a_chat_or_a_json_error(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    upstream.script(Text("Hi"))
    odd = f"team/{uuid.uuid4()}?#%"
    body = {"id": odd, "messages": [user("Hi")]}
    async with api.stream("POST", "/v1/ui/chat", json=body) as response:
        assert response.status_code == 200
        lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    escaped = urllib.parse.quote(odd, safe="")  # as the AI SDK's encodeURIComponent
    assert (await api.get(f"/v1/ui/chat/{escaped}/stream")).status_code == 204
    for bad in ("nul\u0000", "x" * 513, ""):
        response = await api.post("/v1/ui/chat", json={"id": bad, "messages": [user("Hi")]})
        assert response.status_code == 422 and "error" in response.json(), bad


async def test_tool_approvals_are_asked_and_answered_through_use_chat(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None
) -> None:
    """`ai` 7: a call that needs approval arrives as a tool-approval-request part; the person's
    rulings (addToolApprovalResponse) go back with useChat's next request, which streams the
    rest of the same run: the approved call ran, the rejected one did not and the model read
    why."""
    policy = {"tool_approval": {"default": "ask"}}
    clock = {"name": "current_time", "kind": "builtin"}
    sid = (await new_session(api, config={"tools": [CALCULATOR, clock], "run_policy": policy}))[
        "id"
    ]
    upstream.script(
        ToolCall("call_sum", "calculator", '{"expression": "6*7"}'),
        ToolCall("call_now", "current_time", "{}"),
    )
    upstream.script(Text("It is 42; the time I may not say."))
    approvals = {
        "calculator": {"approved": True},
        "current_time": {"approved": False, "reason": "Not now."},
    }
    actions = [{"send": "6*7, and the time?", "until": "It is 42; the time I may not say."}]
    result = await run_node(api, "chat", sid, JS, actions=actions, approvals=approvals)
    assert result["errors"] == [] and result["status"] == "ready"
    assert [m["role"] for m in result["messages"]] == ["user", "assistant"]
    tools = {p["type"]: p for p in result["messages"][-1]["parts"] if p["type"].startswith("tool-")}
    calc, now = tools["tool-calculator"], tools["tool-current_time"]
    assert calc["state"] == "output-available" and calc["output"] == "42"
    assert calc["approval"]["approved"] is True
    assert now["state"] == "output-denied"
    assert now["approval"] == {"id": now["toolCallId"], "approved": False, "reason": "Not now."}
    assert texts_of(result["messages"][-1]) == ["It is 42; the time I may not say."]
    # One run, and what the model read: the result, and the person's reason.
    run = (await api.get(f"/v1/runs/{result['messages'][-1]['id']}")).json()
    assert run["status"] == "completed"  # the message is the run's, continued
    assert len([r for r in upstream.requests if r.body.get("messages")]) == 2
    results = [m for m in upstream.requests[-1].body["messages"] if m["role"] == "tool"]
    assert results[0]["content"] == "42" and "Not now." in results[1]["content"]


async def test_an_ai_5_client_sees_the_calls_and_the_run_is_approved_through_the_api(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None
) -> None:
    """`ai` 5 refuses approval parts: with `Threadline-AI-SDK: 5` its stream shows the call and
    ends while the run waits; a ruling through the REST API finishes the run."""
    policy = {"tool_approval": {"default": "ask"}}
    sid = (await new_session(api, config={"tools": [CALCULATOR], "run_policy": policy}))["id"]
    upstream.script(ToolCall("call_sum", "calculator", '{"expression": "6*7"}'))
    upstream.script(Text("It is 42."))
    message = user("6*7?")
    result = await run_node(
        api, "send", sid, JS_V5, messages=[message], headers={"Threadline-AI-SDK": "5"}
    )
    assert result["errors"] == []
    types = [c["type"] for c in result["chunks"]]
    assert "tool-approval-request" not in types and types[-1] == "finish"
    run_id = run_id_of(result["chunks"])
    assert (await api.get(f"/v1/runs/{run_id}")).json()["status"] == "awaiting_approval"
    call = (await api.get(f"/v1/runs/{run_id}/approvals")).json()["approvals"][0]
    ruled = await api.post(
        f"/v1/runs/{run_id}/approvals",
        json={"approvals": [{"tool_call_id": call["tool_call_id"], "decision": "approve"}]},
    )
    assert ruled.status_code == 200, ruled.text
    ended = await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 120})
    assert ended.json()["status"] == "completed" and ended.json()["result"] == "It is 42."


@BOTH_MAJORS
async def test_a_message_sent_while_the_answer_streams_steers_the_run(
    api: httpx.AsyncClient, upstream: FakeUpstream, ai_sdk: None, sdk: Path
) -> None:
    """POST {chat}/steer while the stream runs: the run's next model turn sees the message,
    after its current tool call; the stream shows where it landed (a steering-message part for
    `ai` 7, a data part for `ai` 5, which would refuse it), and so does the stored history."""
    release = threading.Event()
    sid = (await new_session(api, config={"tools": [CALCULATOR]}))["id"]
    upstream.script(ToolCall("call_1", "calculator", '{"expression": "1+1"}'))
    upstream.script(Hold(release), ToolCall("call_2", "calculator", '{"expression": "2+2"}'))
    upstream.script(Text("2 and 4, in French: deux et quatre."))
    headers = {} if sdk == JS else {"Threadline-AI-SDK": "5"}
    async with Node(
        api, "steer", sid, sdk, messages=[user("add")], steer="In French.", headers=headers
    ) as node:
        steered = (await node.line())["steered"]
        release.set()
        result = await node.line()
    release.set()
    assert steered["status"] == 202, steered
    assert result["errors"] == []
    run_id = run_id_of(result["chunks"])
    assert steered["body"]["run_id"] == run_id and steered["body"]["steer_id"]
    # The model's third turn read the message after the second turn's tool result.
    sent = [m for m in upstream.requests[-1].body["messages"] if m["role"] != "system"]
    assert [m["role"] for m in sent][-3:] == ["assistant", "tool", "user"]
    assert sent[-1]["content"] == "In French."
    answer = result["messages"][-1]
    stored = result["stored"][-1]
    if sdk == JS:
        (chunk,) = [c for c in result["chunks"] if c["type"] == "steering-message"]
        assert chunk == {
            "type": "steering-message",
            "id": steered["body"]["steer_id"],
            "parts": [{"type": "text", "text": "In French."}],
        }
        kinds = [p["type"] for p in answer["parts"] if not p["type"].startswith("data-")]
        # Where it landed: between the second turn's tool call and the third turn.
        assert kinds == [
            "step-start",
            "tool-calculator",
            "step-start",
            "tool-calculator",
            "steering-message",
            "step-start",
            "text",
        ]
        assert [p["type"] for p in stored["parts"] if p["type"] != "step-start"] == [
            k for k in kinds if k != "step-start"
        ]
        assert [m["role"] for m in result["stored"]] == ["user", "assistant"]
    else:
        (chunk,) = [c for c in result["chunks"] if c["type"] == "data-threadline-steered"]
        assert chunk["data"]["text"] == "In French."
        assert "steering-message" not in json.dumps(result["stored"])
    assert texts_of(answer) == ["2 and 4, in French: deux et quatre."]


async def test_a_reloaded_chat_shows_the_calls_that_wait_for_approval(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """The stored messages of a chat whose run awaits approval ask for it, as the stream did
    (`ai` 6 on), so that a reloaded page can still approve; an `ai` 5 client sees the call."""
    policy = {"tool_approval": {"default": "ask"}}
    sid = (await new_session(api, config={"tools": [CALCULATOR], "run_policy": policy}))["id"]
    upstream.script(ToolCall("call_sum", "calculator", '{"expression": "6*7"}'))
    asked = await api.post(f"/v1/sessions/{sid}/ask", json={"input": "6*7?", "stream": False})
    run_id = asked.json()["id"]
    for _ in range(10_000):  # until it waits (a condition; the bound only stops a hang)
        if (await api.get(f"/v1/runs/{run_id}")).json()["status"] == "awaiting_approval":
            break
        await asyncio.sleep(0.05)

    stored = (await api.get(f"/v1/ui/chat/{sid}/messages")).json()["messages"]
    (part,) = [p for p in stored[-1]["parts"] if p["type"] == "tool-calculator"]
    assert part["state"] == "approval-requested"
    assert part["approval"] == {"id": part["toolCallId"]}
    old = await api.get(f"/v1/ui/chat/{sid}/messages", headers={"Threadline-AI-SDK": "5"})
    (part,) = [p for p in old.json()["messages"][-1]["parts"] if p["type"] == "tool-calculator"]
    assert part["state"] == "input-available" and "approval" not in part


async def test_a_chat_whose_id_is_a_uuid_naming_no_session_keeps_the_session_it_made(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """Its first message makes its session (the chat's id names none); the next ones go to
    that session, not to a new one."""
    chat = str(uuid.uuid4())
    for text, answer in (("Hi", "Hello"), ("Again", "Hello again")):
        upstream.script(Text(answer))
        body = {"id": chat, "messages": [user(text)], "trigger": "submit-message"}
        async with api.stream("POST", "/v1/ui/chat", json=body) as response:
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
    listed = await api.get("/v1/sessions", params={"metadata": f"ai_sdk_chat_id:{chat}"})
    sessions = listed.json()["data"]
    assert len(sessions) == 1 and sessions[0]["id"] != chat
    history = (await api.get(f"/v1/ui/chat/{chat}/messages")).json()["messages"]
    assert [texts_of(m) for m in history] == [["Hi"], ["Hello"], ["Again"], ["Hello again"]]
