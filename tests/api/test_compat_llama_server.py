"""The compat provider against a real OpenAI-compatible server: llama-cpp-python's
`python -m llama_cpp.server` serving the bundled SmolLM2, as the upstream of `threadline serve`
(API and workers in this process). Plain and streamed asks, an ask after tool calls, a fork and
a compaction. One server for the module, tiny answers."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.db.engine import create_engine
from app.llm.local_provider import bundled_model_path
from app.main import create_app
from app.services.keys import create_key
from testkit.api import append, history, message, new_session
from testkit.server import free_port, serve_in_thread, stop_thread_server
from testkit.sse_client import collect
from tests.e2e import create_database

pytestmark = pytest.mark.slow
WINDOW = 2048  # the n_ctx the server runs with, configured for its endpoint (it does not say)
ANSWER_TOKENS = 12  # what asks ask for
SUMMARY_TOKENS = 96  # the endpoint's output limit: what a summary may use


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m llama_cpp.server` on a free port; its OpenAI base URL."""
    port = free_port()
    # The real server, loading its model as the service does (llama.cpp's extra CPU buffer types
    # off: a native build crashes in its AMX kernels on CPUs that have them).
    launch = (
        "import runpy; from app.llm.local_provider import without_extra_buffers\n"
        "with without_extra_buffers(): runpy.run_module('llama_cpp.server', run_name='__main__')"
    )
    command = [
        sys.executable,
        "-c",
        launch,
        "--model",
        str(bundled_model_path()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(WINDOW),
        "--verbose",
        "False",
    ]
    # Its log goes to a file: a pipe nobody reads would fill and block the server.
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited: {log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def compat_service(database_url: str, llama_server: str) -> Iterator[tuple[str, Settings]]:
    settings = Settings(
        _env_file=None,
        database_url=create_database(database_url, "compat"),
        db_pool_size=5,
        default_model="compat:llama",
        compat_endpoints={
            "llama": {
                "url": llama_server,
                "context_window": WINDOW,
                "max_output_tokens": SUMMARY_TOKENS,
            }
        },
        llm_retry_base_seconds=0.01,
        worker_heartbeat_seconds=0.5,
        event_tick_seconds=0.02,
        sse_heartbeat_seconds=1.0,
        worker_shutdown_seconds=1.0,
    )
    server, thread, url = serve_in_thread(create_app(settings, workers=2))
    yield url, settings
    stop_thread_server(server, thread)


@pytest.fixture
async def api(compat_service: tuple[str, Settings]) -> AsyncIterator[httpx.AsyncClient]:
    url, settings = compat_service
    engine = create_engine(settings)
    try:
        key = await create_key(engine, f"compat-{uuid.uuid4()}")
    finally:
        await engine.dispose()
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120
    ) as client:
        yield client


async def finished(api: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    while True:
        response = await api.get(f"/v1/runs/{run_id}", params={"wait": "true", "timeout": 30})
        run: dict[str, Any] = response.json()
        if run["status"] not in ("queued", "running"):
            return run


def body(text: str, **more: Any) -> dict[str, Any]:
    return {"input": text, "max_output_tokens": ANSWER_TOKENS, **more}


async def ask(api: httpx.AsyncClient, sid: str, text: str) -> dict[str, Any]:
    response = await api.post(f"/v1/sessions/{sid}/ask", json=body(text, stream=False))
    assert response.status_code == 202, response.text
    return await finished(api, response.json()["id"])


def assert_answered(run: dict[str, Any]) -> None:
    assert run["status"] == "completed", run.get("error")
    assert run["result"] and run["result"].strip()
    usage = run["usage"]
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= ANSWER_TOKENS


async def test_a_plain_ask(api: httpx.AsyncClient) -> None:
    sid = (await new_session(api, config={"system_prompt": "You answer briefly."}))["id"]

    run = await ask(api, sid, "What is the capital of France?")

    assert_answered(run)
    assert run["model"] == "compat:llama"
    context = (await api.get(f"/v1/sessions/{sid}/context")).json()
    assert context["context_window"] == WINDOW  # the endpoint's, not a 200k guess


async def test_a_streamed_ask(api: httpx.AsyncClient) -> None:
    sid = (await new_session(api))["id"]

    events = await collect(api, "POST", f"/v1/sessions/{sid}/ask", json=body("Say hello to Ada."))

    assert events[-1].type == "run.completed", events[-1]
    deltas = "".join(e.data["text"] for e in events if e.type == "message.delta")
    assert deltas.strip() and deltas == events[-1].data["text"]
    assert 0 < events[-1].data["usage"]["output_tokens"] <= ANSWER_TOKENS


async def test_an_ask_after_tool_calls(api: httpx.AsyncClient) -> None:
    """The assistant turn that only called a tool goes out with "" content: the server renders
    the chat template, and a null content there was a 500."""
    sid = (await new_session(api))["id"]
    tool_turn = [
        message("What is the weather in Oslo?"),
        {
            "kind": "tool_call",
            "payload": {"name": "weather", "arguments": {"city": "Oslo"}},
            "refs": {"tool_call_id": "t1", "call_id": "c1"},
        },
        {
            "kind": "tool_result",
            "payload": {"content": "3 C, snow"},
            "refs": {"tool_call_id": "t1"},
        },
        message("It is 3 C with snow in Oslo.", role="assistant"),
    ]
    assert (await append(api, sid, *tool_turn)).status_code == 201
    sent = (await api.post(f"/v1/sessions/{sid}/projection", json={})).json()["request"]
    assert any(m.get("tool_calls") and m["content"] == "" for m in sent["messages"])

    run = await ask(api, sid, "Should I wear a coat?")

    assert_answered(run)


async def test_a_forked_session(api: httpx.AsyncClient) -> None:
    sid = (await new_session(api))["id"]
    assert_answered(await ask(api, sid, "My name is Ada."))
    child = (await api.post(f"/v1/sessions/{sid}/fork", json={})).json()["id"]

    run = await ask(api, child, "What is my name?")

    assert_answered(run)
    assert len(await history(api, child)) > len(await history(api, sid))


async def test_a_compaction(api: httpx.AsyncClient) -> None:
    sid = (await new_session(api))["id"]
    for question in ("I like tea.", "I live in Oslo.", "I have a cat."):
        assert_answered(await ask(api, sid, question))

    response = await api.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1})
    assert response.status_code == 202, response.text
    run = await finished(api, response.json()["id"])

    # A small model may run past the cap (its summary is then kept cut), or write one no shorter
    # than the history or echoing the prompt: refused then, nothing committed.
    journal = await history(api, sid)
    summaries = [e for e in journal if e["kind"] == "summary"]
    if run["status"] == "completed":
        [summary] = summaries
        content = summary["payload"]["content"]
        assert content.strip() and run["usage"]["input_tokens"] > 0
    else:
        assert run["error"]["code"] in ("summary_not_shorter", "summary_echoes_prompt"), run
        assert summaries == []
        # A checkpoint a client appends stands in for the refused one.
        last_user = max(e["seq"] for e in journal if e["payload"].get("role") == "user")
        content = "The user likes tea, lives in Oslo and has a cat."
        checkpoint = {"from_seq": 1, "to_seq": last_user - 1, "content": content}
        appended = await append(api, sid, {"kind": "summary", "payload": checkpoint})
        assert appended.status_code == 201, appended.text
    # The session answers on: its summary goes to the server as the system turn's text (a list
    # of text parts there was answered with a 500).
    dry = (await api.post(f"/v1/sessions/{sid}/projection", json={"format": "openai"})).json()
    system = dry["request"]["messages"][0]
    assert system["role"] == "system" and content in system["content"]
    assert_answered(await ask(api, sid, "What do I drink?"))
