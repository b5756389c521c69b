"""`threadline chat` under a pseudo-terminal (pexpect) against a live service: what a user
types and sees. The model is the fake upstream (testkit/upstream.py), scripted per test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pexpect
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.keys import create_key
from testkit.proxy import CuttingProxy
from testkit.server import free_port
from testkit.upstream import FakeUpstream, Hold, Text, Thinking, ToolCall
from tests.e2e import Service
from tests.test_cli import Served

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "›"  # noqa: RUF001 (the chat's prompt)
# Generous: the machine may be loaded; expectations wait for what they expect, never sleep.
TIMEOUT = 120


@pytest.fixture
async def key(e2e_engine: AsyncEngine, upstream: FakeUpstream) -> str:
    """A fresh tenant's key; the upstream starts each test clean."""
    upstream.clear()
    return await create_key(e2e_engine, f"chat-{uuid.uuid4()}")


@pytest.fixture
async def api(service: Service, key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=service.url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as client:
        yield client


def chat_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}
    env.update(
        PYTHONPATH=str(ROOT),
        XDG_STATE_HOME=str(tmp_path / "state"),  # the prompt history
        TERM="xterm-256color",
        # pexpect is a terminal that does not answer cursor position requests.
        PROMPT_TOOLKIT_NO_CPR="1",
    )
    return env


def piped_chat(
    tmp_path: Path, typed: str, *args: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    """`threadline chat` with `typed` on its stdin (a pipe, not a terminal), run in tmp_path."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "chat", *args],
        input=typed,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**chat_env(tmp_path), **variables},
        timeout=TIMEOUT,
    )


# Control sequences (colours, cursor moves, modes) and carriage returns: what is left is the
# text a user reads, in the order it was written.
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]|[\x08\r]")


class Terminal:
    """A `threadline chat` in a pseudo-terminal; `expect` finds a pattern in the text shown
    since the last match (control sequences removed)."""

    def __init__(self, child: pexpect.spawn[str]) -> None:
        self.child = child
        self.raw = ""
        self.text = ""
        self.pos = 0

    def _read(self) -> bool:
        """Read what came; False at the end of output."""
        try:
            self.raw += self.child.read_nonblocking(65536, timeout=1)
        except pexpect.TIMEOUT:
            return True
        except pexpect.EOF:
            return False
        self.text = CONTROL.sub("", self.raw)
        return True

    def expect(self, pattern: str) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + TIMEOUT
        while True:
            found = regex.search(self.text, self.pos)
            if found is not None:
                self.pos = found.end()
                return found
            if not self._read() or time.monotonic() > deadline:
                raise AssertionError(
                    f"{pattern!r} not shown; after the last match:\n{self.text[self.pos :]}"
                )

    def expect_text(self, text: str) -> None:
        self.expect(re.escape(text))

    def say(self, line: str) -> None:
        """Type a line at the next prompt."""
        self.expect_text(PROMPT)
        self.child.send(line + "\r")

    def exit_status(self) -> int | None:
        deadline = time.monotonic() + TIMEOUT
        while self._read():
            assert time.monotonic() < deadline, "the chat did not end"
        self.child.close()
        status: int | None = self.child.exitstatus
        return status

    def session_id(self) -> str:
        return self.expect(r"session ([0-9a-f-]{36})").group(1)


Spawn = Callable[..., Terminal]
SpawnIn = Callable[..., Terminal]  # (directory, variables, *arguments)


@pytest.fixture
def spawn_in(tmp_path: Path) -> Iterator[SpawnIn]:
    """`threadline chat` with these arguments, in a directory, with these variables."""
    children: list[pexpect.spawn[str]] = []

    def start(where: Path, variables: dict[str, str], *args: str) -> Terminal:
        child = pexpect.spawn(
            sys.executable,
            ["-m", "app.cli", "chat", *args],
            cwd=str(where),
            env={**chat_env(tmp_path), **variables},
            encoding="utf-8",
            dimensions=(40, 120),
        )
        children.append(child)
        return Terminal(child)

    yield start
    for child in children:
        child.close(force=True)


@pytest.fixture
def spawn(tmp_path: Path, spawn_in: SpawnIn) -> Spawn:
    """`threadline chat` with these arguments."""

    def start(*args: str) -> Terminal:
        return spawn_in(tmp_path, {}, *args)

    return start


async def test_a_message_streams_its_answer_and_commands_show_the_session(
    service: Service, key: str, api: httpx.AsyncClient, upstream: FakeUpstream, spawn: Spawn
) -> None:
    upstream.script(Text("Pack an "), Text("**umbrella**: rain all week."))
    child = spawn("--url", service.url, "--key", key)
    session_id = child.session_id()
    child.expect_text("model openai:gpt-4o-mini")

    child.say("Weather in Oslo?")
    child.expect_text("Pack an umbrella: rain all week.")  # Markdown: the ** are rendered
    child.expect_text("openai:gpt-4o-mini")  # how the answer ended, under it
    child.say("/stop")
    child.expect_text("the last run is over (completed)")

    child.say("/history")
    child.expect(r"#1 +user: Weather in Oslo\?")
    child.expect(r"assistant: Pack an \*\*umbrella\*\*: rain all week\.")

    child.say("/search umbrella")
    child.expect(r"#\d+ +message: .*umbrella")

    child.say("/context")
    for segment in ("system", "history", "total"):
        child.expect(segment)
    child.expect(r"budget [\d,]+ \(")

    child.say("/model anthropic:claude-haiku-4-5")
    child.expect_text("model: anthropic:claude-haiku-4-5")
    session = (await api.get(f"/v1/sessions/{session_id}")).json()
    assert session["config"]["model"] == "anthropic:claude-haiku-4-5"

    child.say("/model nope")
    child.expect_text("error:")

    child.say("/fork 2")
    fork_id = child.expect(r"forked at seq 2: now in ([0-9a-f-]{36})").group(1)
    assert fork_id != session_id
    upstream.script(Text("Still rainy in the fork."))
    child.say("And tomorrow?")
    child.expect_text("Still rainy in the fork.")
    child.expect_text("claude-haiku-4-5")  # the fork kept the parent's config

    child.say("/bogus")
    child.expect_text("unknown command /bogus")
    child.say("/quit")
    assert child.exit_status() == 0

    fork = (await api.get(f"/v1/sessions/{fork_id}")).json()
    assert fork["parent_id"] == session_id and fork["fork_seq"] == 2
    asked = (await api.get(f"/v1/sessions/{fork_id}/entries", params={"kinds": "message"})).json()
    assert [e["payload"]["content"] for e in asked["data"]][-2:] == [
        "And tomorrow?",
        "Still rainy in the fork.",
    ]


async def test_ctrl_c_stops_the_answer_and_a_second_one_leaves(
    service: Service, key: str, api: httpx.AsyncClient, upstream: FakeUpstream, spawn: Spawn
) -> None:
    release = threading.Event()
    upstream.script(Text("The first words "), Hold(release), Text("never sent"))
    try:
        child = spawn("--url", service.url, "--key", key)
        session_id = child.session_id()
        child.say("Tell me a long story")
        child.expect_text("The first words")
        child.child.sendintr()
        child.expect_text("stopped: the partial answer is kept")
        child.expect_text(PROMPT)  # the chat goes on
        child.child.sendintr()  # at the prompt: leave
        assert child.exit_status() == 0
    finally:
        release.set()
    ends = await api.get(f"/v1/sessions/{session_id}/entries", params={"kinds": "run_end"})
    (end,) = ends.json()["data"]
    run = (await api.get(f"/v1/runs/{end['payload']['run_id']}")).json()
    assert run["status"] == "cancelled" and run["result"] == "The first words "


async def test_a_dropped_stream_is_resumed_where_it_dropped(
    service: Service, key: str, upstream: FakeUpstream, spawn: Spawn
) -> None:
    release = threading.Event()
    upstream.script(Text("First half, "), Hold(release), Text("second half."))
    proxy = CuttingProxy(service.url, b"First half", on_cut=release.set)
    try:
        child = spawn("--url", proxy.url, "--key", key)
        child.say("Both halves, please")
        child.expect_text("First half, second half.")
        child.expect_text("openai:gpt-4o-mini")
        child.say("/quit")
        assert child.exit_status() == 0
        assert proxy.cut.is_set()
    finally:
        release.set()
        proxy.close()


async def test_a_client_side_tool_call_stops_the_answer(
    service: Service, key: str, api: httpx.AsyncClient, upstream: FakeUpstream, spawn: Spawn
) -> None:
    """The terminal cannot run a client's tools: the run would wait for outputs for nothing."""
    tool = {"name": "pick_color", "kind": "client"}
    created = await api.post("/v1/sessions", json={"config": {"tools": [tool]}})
    session_id = created.json()["id"]
    upstream.script(ToolCall("c1", "pick_color", "{}"))
    child = spawn("--url", service.url, "--key", key, "--resume", session_id)
    child.say("Pick a color")
    child.expect_text("the model called client-side tools (pick_color)")
    child.expect_text("stopped: the partial answer is kept")
    child.say("/quit")
    assert child.exit_status() == 0


THINKING_CONFIG = {"model": "anthropic:claude-sonnet-4-5", "reasoning": {"effort": "low"}}
DIM = "\x1b[2;3m"  # dim italic, as the terminal gets it


async def test_reasoning_shows_dimmed_above_the_answer_and_can_be_hidden(
    service: Service, key: str, api: httpx.AsyncClient, upstream: FakeUpstream, spawn: Spawn
) -> None:
    created = await api.post("/v1/sessions", json={"config": THINKING_CONFIG})
    session_id = created.json()["id"]
    upstream.script(Thinking("Oslo lies far north in winter."), Text("Pack a warm coat."))
    child = spawn("--url", service.url, "--key", key, "--resume", session_id)
    child.say("Weather in Oslo?")
    child.expect_text("Oslo lies far north in winter.")
    child.expect_text("Pack a warm coat.")
    thought = child.raw.rindex("Oslo lies far north")
    assert DIM in child.raw[max(0, thought - 40) : thought]

    child.say("/reasoning")
    child.expect_text("the model's reasoning is hidden")
    upstream.script(Thinking("A secret plan, hidden."), Text("Take gloves too."))
    child.say("And my hands?")
    child.expect_text("Take gloves too.")
    child.say("/history")  # the journal's reasoning is not what the model said either
    child.expect(r"assistant: Take gloves too\.")
    child.say("/quit")
    assert child.exit_status() == 0
    assert "A secret plan" not in child.text

    upstream.script(Thinking("Hidden from the start."), Text("Bring a hat."))
    child = spawn("--url", service.url, "--key", key, "--resume", session_id, "--hide-reasoning")
    child.say("And my head?")
    child.expect_text("Bring a hat.")
    child.say("/reasoning")
    child.expect_text("the model's reasoning is shown")
    child.say("/quit")
    assert child.exit_status() == 0
    assert "Hidden from the start." not in child.text


async def test_a_tool_call_needing_approval_is_prompted_for(
    service: Service, key: str, api: httpx.AsyncClient, upstream: FakeUpstream, spawn: Spawn
) -> None:
    """Approve with edited arguments (a bad edit is refused and asked again), then reject."""
    config = {
        "tools": [{"name": "calculator", "kind": "builtin"}],
        "run_policy": {"tool_approval": {"default": "ask"}},
    }
    session_id = (await api.post("/v1/sessions", json={"config": config})).json()["id"]
    upstream.script(ToolCall("c1", "calculator", '{"expression": "2+2"}'))
    upstream.script(Text("It is nine."))
    child = spawn("--url", service.url, "--key", key, "--resume", session_id)
    child.say("Compute")
    child.expect_text('approve? calculator({"expression": "2+2"})')
    child.expect_text("y approve · e edit · n reject:")
    child.child.send("e\r")
    child.expect_text("arguments (JSON):")
    child.child.send('{"expression": 5}\r')
    child.expect(r"error: [\s\S]*?invalid_arguments")  # the terminal may wrap it
    child.expect_text("y approve · e edit · n reject:")
    child.child.send("e\r")
    child.expect_text("arguments (JSON):")
    child.child.send('{"expression": "3*3"}\r')
    child.expect_text("approved")
    child.expect_text("It is nine.")
    assert "3*3" in upstream.requests[-1].body["messages"][-1]["content"]

    upstream.script(ToolCall("c2", "calculator", '{"expression": "1/0"}'))
    upstream.script(Text("Understood."))
    child.say("Again")
    child.expect_text("y approve · e edit · n reject:")
    child.child.send("n\r")
    child.expect_text("reason (optional):")
    child.child.send("no division by zero\r")
    child.expect_text("rejected")
    child.expect_text("Understood.")
    assert "no division by zero" in upstream.requests[-1].body["messages"][-1]["content"]
    child.say("/quit")
    assert child.exit_status() == 0


async def test_a_line_typed_during_an_answer_steers_it(
    service: Service, key: str, api: httpx.AsyncClient, upstream: FakeUpstream, spawn: Spawn
) -> None:
    """Enter during a tool loop sends the line to the run: the model's next turn reads it
    after the current tool result, and the chat says where it landed."""
    config = {"tools": [{"name": "calculator", "kind": "builtin"}]}
    session_id = (await api.post("/v1/sessions", json={"config": config})).json()["id"]
    release = threading.Event()
    upstream.script(ToolCall("c1", "calculator", '{"expression": "1+1"}'))
    upstream.script(Hold(release), ToolCall("c2", "calculator", '{"expression": "2+2"}'))
    upstream.script(Text("Deux et quatre."))
    child = spawn("--url", service.url, "--key", key, "--resume", session_id)
    try:
        child.say("Add, please.")
        child.expect_text("↳ 2")  # the first tool result: the second model turn is held
        child.child.send("In French.\r")
        child.expect_text("sent to the running answer: In French.")
        release.set()
        child.expect(r"your message reached the model \(turn \d\)")
        child.expect_text("Deux et quatre.")
    finally:
        release.set()
    sent = [m for m in upstream.requests[-1].body["messages"] if m["role"] != "system"]
    assert [m["role"] for m in sent][-2:] == ["tool", "user"]
    assert sent[-1]["content"] == "In French."
    child.say("/quit")
    assert child.exit_status() == 0


async def test_resume_shows_the_last_turns_and_compact_summarizes(
    service: Service, key: str, api: httpx.AsyncClient, upstream: FakeUpstream, spawn: Spawn
) -> None:
    session_id = (await api.post("/v1/sessions", json={})).json()["id"]
    turns = [
        {"kind": "message", "payload": {"role": role, "content": f"{role} line {n}"}}
        for n in range(1, 6)
        for role in ("user", "assistant")
    ]
    assert (
        await api.post(f"/v1/sessions/{session_id}/entries", json={"entries": turns})
    ).is_success
    upstream.script(Text("The user counted lines."))  # the summarizer's answer

    child = spawn("--url", service.url, "--key", key, "--resume", session_id)
    child.expect_text(f"session {session_id}\nresumed · model openai:gpt-4o-mini")
    child.expect(r"#5 +user: user line 3")  # the last 6 messages
    child.expect(r"#10 +assistant: assistant line 5")
    child.say("/compact counting")
    child.expect(r"compacting entries 1-\d+ with openai:gpt-4o-mini, focus: counting")
    child.expect(r"compacted entries 1-\d+ into a summary of \d+ tokens")
    child.expect_text("The user counted lines.")  # the summary itself
    child.say("/history")
    child.expect(r"summary of 1-\d+: The user counted lines\.")
    child.say("/quit")
    assert child.exit_status() == 0

    context = (await api.get(f"/v1/sessions/{session_id}/context")).json()
    assert context["summaries"] == 1 and context["compactions"][0]["focus"] == "counting"


async def test_fork_at_start_chats_in_a_child(
    service: Service, key: str, api: httpx.AsyncClient, spawn: Spawn
) -> None:
    session_id = (await api.post("/v1/sessions", json={})).json()["id"]
    entries = [{"kind": "message", "payload": {"role": "user", "content": "first"}}] * 3
    await api.post(f"/v1/sessions/{session_id}/entries", json={"entries": entries})
    child = spawn("--url", service.url, "--key", key, "--fork", f"{session_id}@2")
    fork_id = child.session_id()
    child.expect_text(f"forked from {session_id} at seq 2")
    child.say("/quit")
    assert child.exit_status() == 0
    fork = (await api.get(f"/v1/sessions/{fork_id}")).json()
    assert fork["parent_id"] == session_id and fork["rev"] == 2


async def test_agent_starts_a_session_from_an_agent(
    service: Service, key: str, api: httpx.AsyncClient, upstream: FakeUpstream, spawn: Spawn
) -> None:
    config = {"model": "openai:gpt-4o-mini", "system_prompt": "You are the travel agent."}
    await api.post("/v1/agents", json={"name": "travel", "config": config})
    upstream.script(Text("Lisbon."))
    child = spawn("--url", service.url, "--key", key, "--agent", "travel@1")
    session_id = child.session_id()
    child.expect_text("new session · agent travel v1")
    child.say("Where to?")
    child.expect_text("Lisbon.")
    child.say("/quit")
    assert child.exit_status() == 0
    assert upstream.requests[-1].body["messages"][0]["content"] == "You are the travel agent."
    session = (await api.get(f"/v1/sessions/{session_id}")).json()
    assert session["agent"]["name"] == "travel"


async def test_a_refused_key_or_a_missing_service_is_a_clear_error(
    service: Service, spawn: Spawn
) -> None:
    child = spawn("--url", service.url, "--key", "tl_not-a-key")
    child.expect_text("the API key was refused")
    assert child.exit_status() == 1
    assert "Traceback" not in child.text

    child = spawn("--url", f"http://127.0.0.1:{free_port()}", "--key", "tl_x")
    child.expect_text("cannot reach Threadline at http://127.0.0.1:")
    assert child.exit_status() == 1

    child = spawn("--url", service.url, "--resume", str(uuid.uuid4()), "--key", "tl_x")
    child.expect_text("the API key was refused")
    assert child.exit_status() == 1


async def test_unknown_session_to_resume_is_a_clear_error(
    service: Service, key: str, spawn: Spawn
) -> None:
    child = spawn("--url", service.url, "--key", key, "--resume", str(uuid.uuid4()))
    child.expect(r"error: .*\(404 session_not_found\)")
    assert child.exit_status() == 1


def test_the_key_and_url_come_from_the_environment_or_the_dev_key_file(
    service: Service, key: str, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Without a terminal the answer is plain text: no control sequences in a pipe."""
    upstream.script(Text("Plain **text** here."))
    (tmp_path / ".threadline").mkdir()
    (tmp_path / ".threadline" / "dev-key").write_text(key + "\n")
    result = piped_chat(tmp_path, "Hello?\n/history\n", THREADLINE_URL=service.url)
    assert result.returncode == 0, result.stderr
    assert "Plain **text** here.\n" in result.stdout  # as the model wrote it, unrendered
    assert "user: Hello?" in result.stdout
    assert "\x1b" not in result.stdout

    refused = piped_chat(tmp_path, "", THREADLINE_API_KEY="tl_wrong", THREADLINE_URL=service.url)
    assert refused.returncode == 1 and "the API key was refused" in refused.stderr + refused.stdout


@pytest.mark.slow
def test_chat_needs_nothing_beyond_serve(workdir: Path, spawn_in: SpawnIn) -> None:
    """`threadline serve` with no configuration, then `threadline chat` with none either, from
    the same directory: the dev key file and serve's address; the local model answers."""
    served = Served(workdir)
    try:
        # serve listens where THREADLINE_PORT says (as it would for the user, with another port)
        child = spawn_in(workdir, {"THREADLINE_PORT": str(served.port)})
        child.expect_text("new session · model local:smollm2-135m-instruct")
        child.say("Say hello.")
        child.expect(r"local:smollm2-135m-instruct · \d+ in / \d+ out tokens")
        child.say("/quit")
        assert child.exit_status() == 0
    finally:
        served.stop()


async def test_the_prompt_recalls_lines_of_earlier_chats(
    service: Service, key: str, spawn: Spawn
) -> None:
    child = spawn("--url", service.url, "--key", key)
    child.say("/help")
    child.expect_text("/compact [focus]")
    child.say("/quit")
    assert child.exit_status() == 0

    child = spawn("--url", service.url, "--key", key)
    child.say("\x1b[A\x1b[A")  # up twice: /quit, then /help (Enter runs it)
    child.expect_text("/compact [focus]")
    child.say("/quit")
    assert child.exit_status() == 0


def test_the_piped_header_keeps_the_session_id_whole(
    service: Service, key: str, tmp_path: Path
) -> None:
    """Piped, nothing is wrapped at a width no one set: the resume command can be copied."""
    result = piped_chat(tmp_path, "/context\n", "--url", service.url, "--key", key)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    sid = lines[0].rpartition(" ")[2]
    assert lines[0] == f"Threadline chat · session {sid}" and len(sid) == 36
    assert lines[2] == f"/help for commands · later: threadline chat --resume {sid}"
    # /context says what it counts: the segments add up to the total, and nothing to compact.
    assert "overhead" in result.stdout
    assert result.stdout.rstrip().endswith("nothing before them is left to summarize.")


def test_refused_commands_say_why_and_the_chat_goes_on(
    service: Service, key: str, tmp_path: Path
) -> None:
    lines = [
        "/fork 999999",  # past the session's rev
        "/model gpt-4",  # not provider:model
        "/search " + "x" * 1001,  # longer than a query may be
        '/search "unbalanced -',
        "/compact",  # nothing to compact yet
        "/stop",
        "/history",
    ]
    result = piped_chat(tmp_path, "\n".join(lines) + "\n", "--url", service.url, "--key", key)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    out = result.stdout
    assert "error: at_seq 999999 is beyond the session's rev 0 (422 fork_seq_out_of_range)" in out
    assert "error: invalid request at body.config.model" in out
    assert "error: invalid request at query.q" in out
    assert """nothing matches '"unbalanced -'""" in out
    # Said plainly, as the service words it for a person: not an error, no jargon.
    assert (
        "\nNothing to compact yet: the newest 3 turns always stay as written, and nothing "
        "before them is left to summarize.\n"
    ) in out
    assert "nothing_to_compact" not in out and "keep_last_turns" not in out
    assert "no answer to stop" in out
    assert "no entries yet" in out
