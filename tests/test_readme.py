"""The README stays true to the code: every setting and command is documented, the commands
come first, and the walk-through runs as written against a live service with no configuration."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from asyncio.subprocess import PIPE
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest

from app.config import Settings
from app.main import create_app
from testkit.database import create_database
from testkit.mcp_server import McpTestServer
from testkit.server import serve_in_thread, stop_thread_server
from testkit.upstream import FakeUpstream, JsonAnswer, Text, Thinking, ToolCall
from tests.conftest import issue_key
from tests.e2e import Service, e2e_env
from tests.test_cli import Served as ServedCli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [n for n in Settings.model_fields if f"`THREADLINE_{n.upper()}`" not in README]
    assert missing == []


def test_the_two_commands_come_first_and_ci_runs_the_test_one() -> None:
    head = README.splitlines()[:6]
    assert any(line.startswith("make run") for line in head)
    assert any(line.startswith("make test") for line in head)
    assert "make test" in (ROOT / ".ci" / "run").read_text().splitlines()[-1]


def walk_through() -> str:
    """The shell block of the README's walk-through, as written."""
    section = README[README.index("## Walk-through") :]
    start = section.index("```sh\n") + len("```sh\n")
    return section[start : section.index("```\n", start)]


def clean_env() -> dict[str, str]:
    """This process's environment without Threadline's settings (a reader's shell has none)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("THREADLINE_")}


async def run_sh_block(
    heading: str, cwd: Path | None = None, **variables: str
) -> subprocess.CompletedProcess[str]:
    """The sh block after `heading`, run by bash as written with these variables set (API, KEY,
    ...); it must succeed."""
    result = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-euo", "pipefail", "-c", sh_block_after(heading)],
        cwd=cwd,
        env={**clean_env(), **variables},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    return result


def sh_block_after(heading: str) -> str:
    """The first shell block after a heading, as written."""
    section = README[README.index(heading) :]
    start = section.index("```sh\n") + len("```sh\n")
    return section[start : section.index("```\n", start)]


async def test_the_browser_example_runs_as_written(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    """The backend issues a stream token; the stream opens with it alone."""
    upstream.script(Text("Hello from the model."))
    key = api.headers["Authorization"].removeprefix("Bearer ")
    result = await run_sh_block("### From a browser", API=service.url, KEY=key)
    assert "event: run.created" in result.stdout
    assert "event: run.completed" in result.stdout
    assert "Hello from the model." in result.stdout


async def test_the_tool_approval_round_trip_runs_as_written(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    """The call waits for approval, the approval is posted, the run answers."""
    upstream.script(ToolCall("c1", "calculator", '{"expression": "6*7"}'))
    upstream.script(Text("It is 42."))
    key = api.headers["Authorization"].removeprefix("Bearer ")
    result = await run_sh_block("### Tool approval", API=service.url, KEY=key)
    assert result.stdout.splitlines()[-2:] == ["queued", "It is 42."]
    sent = upstream.requests[-1].body["messages"]
    assert [m["content"] for m in sent if m["role"] == "tool"] == ["42"]


async def test_the_session_file_example_runs_as_written(
    api: httpx.AsyncClient, service: Service, tmp_path: Path
) -> None:
    """Export a session to a file and import the file: a new session with the same entries."""
    sid = (await api.post("/v1/sessions", json={"title": "Trip"})).json()["id"]
    body = {"entries": [{"kind": "message", "payload": {"role": "user", "content": "Hi"}}]}
    assert (await api.post(f"/v1/sessions/{sid}/entries", json=body)).status_code == 201
    key = api.headers["Authorization"].removeprefix("Bearer ")
    result = await run_sh_block("### Session files", cwd=tmp_path, API=service.url, KEY=key, S=sid)
    new = json.loads(result.stdout)
    assert new["id"] != sid and new["rev"] == 1 and new["title"] == "Trip"
    assert (tmp_path / "session.jsonl").read_bytes().startswith(b'{"type":"header"')


def test_the_readme_links_nothing_outside_the_repository() -> None:
    assert "../shared" not in README and "DESIGN.md" not in README
    assert "milestone" not in README.lower()


def test_the_commands_section_lists_every_cli_command() -> None:
    from app.cli import command_names

    commands = README[README.index("## Commands") :]
    commands = commands[: commands.index("\n## ")]
    for name in command_names():
        assert f"`threadline {name}" in commands, name


@pytest.mark.slow
def test_the_walk_through_runs_as_written_with_no_configuration(workdir: Path) -> None:
    """Zero configuration: the embedded database and the local model answer every step."""
    served = ServedCli(workdir)  # `threadline serve` with no THREADLINE_* variables
    try:
        env = clean_env()
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", walk_through()],
            cwd=workdir,
            env={**env, "API": served.url},
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert result.returncode == 0, result.stderr + result.stdout[-3000:]
        out = result.stdout
        assert "event: run.completed" in out  # the streamed ask
        assert out.count('"status":"completed"') >= 1  # the followed ask
        at = out.find('"kind":"compaction"')
        # The local model's summary is committed, or refused as the README says (nothing
        # committed): a tiny model often echoes the transcript rather than summarize it.
        compacted = '"kind":"compaction","status":"completed"' in out
        refused = re.search(
            r'"kind":"compaction","status":"failed".*?"code":"(summary_not_shorter|'
            r'summary_echoes_prompt)"',
            out,
        )
        assert compacted or refused, out[at - 100 : at + 1500]

        auth = {"Authorization": f"Bearer {served.key}"}
        sessions = httpx.get(f"{served.url}/v1/sessions", headers=auth).json()["data"]
        (fork,) = [s for s in sessions if s["parent_id"] is not None]
        (original,) = [s for s in sessions if s["parent_id"] is None]
        assert fork["parent_id"] == original["id"] and fork["fork_seq"] == 1
        entries = httpx.get(
            f"{served.url}/v1/sessions/{original['id']}/entries",
            params=[("kinds", "summary"), ("kinds", "message"), ("limit", "100")],
            headers=auth,
        ).json()["data"]
        assert any(e["kind"] == "summary" for e in entries) == compacted
        answers = [e for e in entries if e["payload"].get("role") == "assistant"]
        assert len(answers) == 3 and all(a["payload"]["content"].strip() for a in answers[1:])
        assert httpx.get(f"{served.url}/v1/memory/user:42", headers=auth).json()["version"] == 1
    finally:
        served.stop()


def test_the_run_reference_tables_are_the_ones_the_code_generates() -> None:
    """The run's transitions (app/runs/machine.py) and events (app/eventlog/registry.py)."""
    from app.cli import run_reference

    for (start, end), table in run_reference().items():
        section = README[README.index(start) + len(start) : README.index(end)]
        assert section == f"\n{table}", "run `make readme` and commit README.md"


async def test_the_use_chat_example_runs_as_written(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    """The README's Node example of the AI SDK's transport, against the served app."""
    from tests.api.test_ui_messages import JS, install_ai_sdk

    section = README[README.index("### The AI SDK's `useChat`") :]
    start = section.index("```js\n") + len("```js\n")
    example = section[start : section.index("```\n", start)]
    install_ai_sdk()
    upstream.script(Text("Hello"), Text(" from Threadline"))
    script = JS / f"readme-{uuid.uuid4().hex}.mjs"  # beside node_modules, where `ai` resolves
    script.write_text(example)
    try:
        env = {
            **os.environ,
            "API": str(api.base_url).rstrip("/"),
            "KEY": api.headers["Authorization"].removeprefix("Bearer "),
        }
        node = await asyncio.create_subprocess_exec(
            "node", str(script), env=env, stdout=PIPE, stderr=PIPE
        )
        out, err = await node.communicate()
    finally:
        script.unlink()
    assert node.returncode == 0, err.decode()
    assert out.decode() == "Hello from Threadline\n"


def python_blocks_after(heading: str) -> list[str]:
    """The Python blocks of a section, as written."""
    section = README[README.index(heading) :]
    section = section[: section.index("\n### ", 1)]
    return [part.split("```\n", 1)[0] for part in section.split("```python\n")[1:]]


@dataclass
class Served:
    url: str
    key: str


@pytest.fixture(scope="module")
def keyless(database_url: str, upstream: FakeUpstream) -> Iterator[Served]:
    """A service as `make run` leaves it without a provider key: no OpenAI or Anthropic, its
    default model served elsewhere (here an OpenAI-compatible endpoint: the fake upstream,
    standing in for the local model)."""
    settings = Settings(
        _env_file=None,
        database_url=create_database(database_url, "readme-keyless"),
        db_pool_size=5,
        **{
            **e2e_env(upstream),
            "openai_api_key": None,
            "anthropic_api_key": None,
            "compat_endpoints": {
                "local": {"url": upstream.openai_base_url, "context_window": 8192}
            },
            "default_model": "compat:local/smollm2",
        },
    )
    server, thread, url = serve_in_thread(create_app(settings, workers=1))
    try:
        yield Served(url, issue_key(settings, f"readme-{uuid.uuid4()}"))
    finally:
        stop_thread_server(server, thread)


def run_python(example: str, served: Served, **more_env: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    return subprocess.run(
        [sys.executable, "-c", example],
        env={**env, "API": served.url, "KEY": served.key, **more_env},
        capture_output=True,
        text=True,
        timeout=300,
    )


async def test_the_openai_sdk_examples_run_as_written(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream, keyless: Served
) -> None:
    """The README's Python examples of the OpenAI SDK, against served apps: the first with no
    provider key (no model named), the second with OpenAI configured (a model named)."""
    without_key, with_key = python_blocks_after("### Use it from the OpenAI SDK")
    upstream.clear()
    upstream.script(Text("Cold and clear."))
    upstream.script(Text("Snow"), Text(" later."))
    result = await asyncio.to_thread(run_python, without_key, keyless)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Cold and clear.\nSnow later.\n"
    assert [m["content"] for m in upstream.requests[-1].body["messages"][1:]] == [
        "Weather in Oslo?",
        "Cold and clear.",
        "And tomorrow?",
    ]
    # Naming an OpenAI model is what a keyless service cannot serve: hence the first form.
    refused = await asyncio.to_thread(run_python, with_key, keyless)
    assert refused.returncode != 0 and "not served here" in refused.stderr

    upstream.script(Text("Cold and clear."))
    key = api.headers["Authorization"].removeprefix("Bearer ")
    result = await asyncio.to_thread(run_python, with_key, Served(service.url, key))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Cold and clear.\n"
    assert upstream.requests[-1].body["model"] == "gpt-4o-mini"


async def test_the_reasoning_examples_run_as_written(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    """The README's reasoning examples, with Anthropic configured: curl's native ask streams
    the thinking as reasoning.delta; the OpenAI SDK gets it as reasoning items."""
    served = Served(service.url, api.headers["Authorization"].removeprefix("Bearer "))
    upstream.clear()
    upstream.script(Thinking("Try the primes up to 31."), Text("Yes, 1021 is prime."))
    result = await run_sh_block("### Reasoning", API=served.url, KEY=served.key)
    assert "event: reasoning.delta" in result.stdout
    assert "Try the primes" in result.stdout and "event: run.completed" in result.stdout
    assert upstream.requests[-1].body["thinking"] == {"type": "enabled", "budget_tokens": 1024}

    (example,) = python_blocks_after("### Reasoning")
    upstream.script(Thinking("Try the primes up to 31."), Text("Yes, 1021 is prime."))
    ran = await asyncio.to_thread(run_python, example, served)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "thinking: Try the primes up to 31.\nYes, 1021 is prime.\n"
    assert upstream.requests[-1].body["thinking"]["budget_tokens"] == 1024


async def test_the_structured_output_examples_run_as_written(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    """The README's structured output examples: curl's native ask sends the schema and gets the
    JSON answer; the OpenAI SDK's responses.parse reads it into its pydantic model."""
    served = Served(service.url, api.headers["Authorization"].removeprefix("Bearer "))
    upstream.clear()
    upstream.script(JsonAnswer({"city": "Oslo", "celsius": -3}))
    result = await run_sh_block("### Structured output", API=served.url, KEY=served.key)
    assert "event: run.completed" in result.stdout and '\\"celsius\\": -3' in result.stdout
    sent = upstream.requests[-1].body["response_format"]["json_schema"]
    assert sent["name"] == "weather" and sent["strict"] is True

    (example,) = python_blocks_after("### Structured output")
    upstream.script(JsonAnswer({"city": "Oslo", "celsius": -3.5}))
    ran = await asyncio.to_thread(run_python, example, served)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "city='Oslo' celsius=-3.5\n"
    assert upstream.requests[-1].body["response_format"]["json_schema"]["name"] == "Weather"


async def test_the_mcp_approval_example_runs_as_written(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream
) -> None:
    """The README's MCP example from the OpenAI SDK, against a real MCP server that requires its
    token: the call waits for approval, is approved, runs, and the model answers."""
    served = Served(service.url, api.headers["Authorization"].removeprefix("Bearer "))
    (example,) = python_blocks_after("### MCP tool servers")
    upstream.clear()
    upstream.script(ToolCall("c1", "calc__add", json.dumps({"a": 2, "b": 3})))
    upstream.script(Text("2 + 3 = 5."))
    with McpTestServer(token="readme-token") as server:
        ran = await asyncio.to_thread(
            run_python, example, served, MCP_URL=server.url, MCP_TOKEN="readme-token"
        )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == 'approve? calc add {"a":2,"b":3}\n2 + 3 = 5.\n'
    seen = [m["content"] for m in upstream.requests[-1].body["messages"] if m["role"] == "tool"]
    assert len(seen) == 1 and '"result":5' in seen[0].replace(" ", "")


def test_the_compaction_result_shown_is_what_the_api_returns() -> None:
    """A compaction run's `result` is the summary itself (a string), as the walk-through shows."""
    shown = walk_through().split('# -> {"id": "C", ', 1)[1].split("\n", 1)[0]
    result = json.loads("{" + shown.replace(", ...}", "}"))["result"]
    assert isinstance(result, str)
    document = json.loads((ROOT / "openapi" / "openapi.json").read_text())
    run_result = document["components"]["schemas"]["Run"]["properties"]["result"]
    assert {"type": "string"} in run_result["anyOf"]
    assert not any(option.get("type") == "object" for option in run_result["anyOf"])


def fresh_shell_env(workdir: Path) -> dict[str, str]:
    """A new shell in a checkout where `make run` made `.venv`: no THREADLINE_* variables, and
    the venv not on PATH (the venv running these tests stands in for the checkout's)."""
    venv_bin = Path(sys.executable).parent
    (workdir / ".venv").symlink_to(venv_bin.parent)
    env = clean_env()
    env.pop("VIRTUAL_ENV", None)
    path = [p for p in env["PATH"].split(os.pathsep) if Path(p) != venv_bin]
    env["PATH"] = os.pathsep.join(path)
    env["PYTHONPATH"] = str(ROOT)  # `threadline` runs this checkout's code
    return env


def more_keys_command() -> str:
    """The walk-through's command for another tenant's key, as written."""
    found = re.search(r"More keys, one tenant per name: `([^`]+)`", README)
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize("heading", ["### API keys", "### Quotas and limits", "### Retention"])
def test_the_operating_examples_run_as_written(
    database_url: str, heading: str, tmp_path: Path
) -> None:
    """The keys, limits and retention commands of "Operating Threadline", and the
    walk-through's "more keys" command, from a fresh shell in the checkout (the venv not on
    PATH: `make run` does not put it there), on a database of their own."""
    env = fresh_shell_env(tmp_path)
    env["THREADLINE_DATABASE_URL"] = create_database(database_url, "readme-ops")
    assert subprocess.run(["bash", "-c", "command -v threadline"], env=env).returncode != 0
    made = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", more_keys_command()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("tl_")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", sh_block_after(heading)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    if heading == "### API keys":
        assert result.stdout.count("read-only") == 2  # listed twice
        assert "revoked: acme" in result.stdout
    elif heading == "### Quotas and limits":
        assert "requests_per_minute: unlimited  (default)" in result.stdout  # the last command
        assert "max_sessions: 10000\n" in result.stdout
    else:
        assert result.stdout.count("tenant acme:") == 2, result.stdout


async def test_the_document_examples_run_as_written(
    api: httpx.AsyncClient, service: Service, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The Documents section's curl block (Anthropic) and openai SDK block (the facade, OpenAI),
    with a report.pdf beside them: each provider gets the PDF in its own shape."""
    from tests.documents import pdf

    (tmp_path / "report.pdf").write_bytes(pdf(2))
    heading = "### Documents: PDFs and text"
    key = api.headers["Authorization"].removeprefix("Bearer ")
    env = {**clean_env(), "API": service.url, "KEY": key}
    upstream.script(Text("A two-page report."))
    result = await run_sh_block(heading, cwd=tmp_path, API=service.url, KEY=key)
    assert result.stdout == "completed\n"
    block = upstream.requests[-1].body["messages"][-1]["content"][1]
    assert block["type"] == "document" and block["source"]["media_type"] == "application/pdf"

    (example,) = python_blocks_after(heading)
    upstream.script(Text("Two blank pages."))
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", example],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "Two blank pages.\n"
    part = upstream.requests[-1].body["messages"][-1]["content"][1]
    assert part["type"] == "file" and part["file"]["filename"] == "report.pdf"


async def test_the_schedules_example_runs_as_written(
    api: httpx.AsyncClient, service: Service
) -> None:
    """An agent's schedule created, its next due time shown, disabled, its runs listed; an
    invalid expression refused with the reason."""
    key = api.headers["Authorization"].removeprefix("Bearer ")
    result = await run_sh_block("### Schedules", API=service.url, KEY=key)
    lines = result.stdout.splitlines()
    due = datetime.fromisoformat(lines[0])
    assert due.astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M") == "08:00"
    assert due.astimezone(ZoneInfo("Europe/Berlin")).weekday() < 5
    assert lines[1] == "False"
    assert lines[2] == "[]"
    refused = json.loads(lines[3])["error"]
    assert refused["code"] == "invalid_cron"
    assert "0 25 * * *" in refused["message"]
    (schedule,) = (await api.get("/v1/schedules")).json()["data"]
    assert (schedule["agent"], schedule["title_template"]) == ("triage", "Tickets {date}")
