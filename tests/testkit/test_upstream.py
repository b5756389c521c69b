"""The fake upstream itself: scripts in order, a default answer, recorded requests, quick stop."""

from __future__ import annotations

import json
import threading
import time

import httpx

from testkit.upstream import FakeUpstream, Hold, ReceivedRequest, Script, Stall, Text

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def chat_text(response: httpx.Response) -> str:
    text = ""
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


def test_scripts_answer_in_order_then_the_default() -> None:
    with FakeUpstream() as up:
        up.script(Text("first"))
        up.script(Text("sec"), Text("ond"))
        answers = [
            chat_text(httpx.post(f"{up.openai_base_url}/chat/completions", json=CHAT))
            for _ in range(3)
        ]

        assert answers == ["first", "second", "ok"]
        assert [r.body for r in up.requests] == [CHAT] * 3
        assert up.pending == 0


def test_a_responder_answers_what_no_script_covers() -> None:
    def echo(request: ReceivedRequest) -> Script:
        return Script((Text("echo: " + request.body["messages"][-1]["content"]),))

    with FakeUpstream() as up:
        up.script(Text("scripted"))
        up.respond_with(echo)
        url = f"{up.openai_base_url}/chat/completions"
        answers = [chat_text(httpx.post(url, json=CHAT)) for _ in range(2)]
        assert answers == ["scripted", "echo: hi"]
        up.clear()  # a test's responder does not outlive it
        assert chat_text(httpx.post(url, json=CHAT)) == "ok"


def test_instances_do_not_share_scripts() -> None:
    with FakeUpstream() as one, FakeUpstream() as two:
        one.script(Text("mine"))
        answer = chat_text(httpx.post(f"{two.openai_base_url}/chat/completions", json=CHAT))

        assert answer == "ok"
        assert one.pending == 1
        assert one.requests == []


def test_non_streaming_requests_are_refused_in_the_providers_words() -> None:
    plain = {**CHAT, "stream": False}
    with FakeUpstream() as up:
        openai = httpx.post(f"{up.openai_base_url}/chat/completions", json=plain)
        anthropic = httpx.post(f"{up.url}/v1/messages", json=plain)

    assert openai.status_code == 400
    assert openai.json()["error"]["type"] == "invalid_request_error"
    assert anthropic.status_code == 400
    assert anthropic.json()["type"] == "error"


def test_stop_does_not_wait_out_a_stall() -> None:
    up = FakeUpstream().start()
    up.script(Stall(30))
    worker = threading.Thread(
        target=lambda: httpx.post(f"{up.url}/v1/messages", json=CHAT, timeout=60), daemon=True
    )
    worker.start()
    while not up.requests:
        time.sleep(0.01)

    started = time.monotonic()
    up.stop()

    assert time.monotonic() - started < 5
    worker.join(timeout=5)
    assert not worker.is_alive()


def test_a_hold_answers_only_once_released() -> None:
    release = threading.Event()
    answers: list[str] = []
    with FakeUpstream() as up:
        up.script(Hold(release), Text("late"))
        url = f"{up.openai_base_url}/chat/completions"
        worker = threading.Thread(
            target=lambda: answers.append(chat_text(httpx.post(url, json=CHAT, timeout=60))),
            daemon=True,
        )
        worker.start()
        while not up.requests:
            time.sleep(0.01)
        assert answers == []  # received, and held
        release.set()
        worker.join(timeout=30)
    assert answers == ["late"]
