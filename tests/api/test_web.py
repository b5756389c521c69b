"""The chat page (app/api/web.py, built from web/): the shipped assets are what the sources
build to, the service serves them at /ui without a key in them, and in a real headless
Chromium against a live service and the fake upstream a user signs in, chats (streamed, with
a stop button), rejoins an answer after a reload, branches, compacts and searches.

Screenshots of the main states go to test-output/screenshots/."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, FilePayload, Page, expect

from app.api.web import ASSETS
from app.config import Settings
from app.main import create_app
from testkit.browser import WAIT_MS, chromium_binary, launched_chromium
from testkit.path_proxy import path_proxy
from testkit.server import serve_in_thread, stop_thread_server
from testkit.upstream import (
    FailMidStream,
    FakeUpstream,
    Hold,
    RedactedThinking,
    Text,
    Thinking,
    ToolCall,
)
from tests.conftest import issue_key
from tests.documents import pdf
from tests.e2e import create_database, e2e_env

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "web"
SHOTS = ROOT / "test-output" / "screenshots"


def npm_installed() -> None:
    """`npm ci` in web/ unless done since its package-lock.json last changed (as `make test`)."""
    stamp = WEB / "node_modules" / ".installed"
    lock = WEB / "package-lock.json"
    if stamp.exists() and stamp.stat().st_mtime >= lock.stat().st_mtime:
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not installed: Node.js 20+ is needed to build the page")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=WEB, check=True)
    stamp.touch()


def test_the_shipped_assets_are_what_the_sources_build_to(tmp_path: Path) -> None:
    """`make web` wrote app/web/static from web/src with the locked packages: a change to the
    sources that was not rebuilt (or a hand edit of the assets) fails here."""
    npm_installed()
    node = shutil.which("node")
    assert node is not None, "node is not installed"
    built = subprocess.run(
        [node, str(WEB / "build.mjs"), str(tmp_path)], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr
    shipped = sorted(p.name for p in ASSETS.iterdir())
    assert (
        shipped
        == sorted(p.name for p in tmp_path.iterdir())
        == [
            "app.css",
            "app.js",
            "favicon.svg",
            "index.html",
        ]
    )
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (ASSETS / name).read_bytes(), (
            f"app/web/static/{name} is not what web/ builds: run `make web`"
        )


async def test_the_page_is_served_at_ui_and_the_root_sends_browsers_there(
    make_client: Any,
) -> None:
    anonymous: httpx.AsyncClient = make_client(None)
    root = await anonymous.get("/", follow_redirects=False)
    # Relative, so that it also leads to the page behind a proxy that adds a path.
    assert root.status_code == 307 and root.headers["location"] == "./ui/"
    page = await anonymous.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="app.js">' in page.text and 'href="app.css"' in page.text
    script = await anonymous.get("/ui/app.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert (await anonymous.get("/ui/app.css")).status_code == 200
    assert (await anonymous.get("/ui/missing.js")).status_code == 404
    # The page's icon, and the one browsers look for at the root when a page names none.
    assert 'rel="icon" href="favicon.svg"' in page.text
    for path in ("/ui/favicon.svg", "/favicon.ico"):
        icon = await anonymous.get(path)
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert icon.content == (ASSETS / "favicon.svg").read_bytes()
    # Nothing from elsewhere (no CDN): the page's own assets only.
    assert "//" not in page.text.replace("<!doctype html>", "")
    assert "Bearer ${" in script.text  # the key the user typed, sent as a Bearer token
    assert "/v1/ui/chat" in script.text  # the AI SDK endpoint the chat streams from


async def test_the_assets_are_sent_compressed_to_browsers_that_take_gzip(
    make_client: Any,
) -> None:
    """The bundle is ~740 KB as built, ~190 KB gzipped; a client that does not say it takes
    gzip gets the bytes as built."""
    anonymous: httpx.AsyncClient = make_client(None)
    built = (ASSETS / "app.js").read_bytes()
    async with anonymous.stream("GET", "/ui/app.js", headers={"Accept-Encoding": "gzip"}) as sent:
        assert sent.status_code == 200 and sent.headers["content-encoding"] == "gzip"
        wire = b"".join([chunk async for chunk in sent.aiter_raw()])
    assert len(wire) < len(built) / 3
    assert gzip.decompress(wire) == built
    plain = await anonymous.get("/ui/app.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.content == built


# --- In a real browser ------------------------------------------------------------------------


@dataclass
class Served:
    url: str
    key: str


@pytest.fixture(scope="module")
def served(database_url: str, upstream: FakeUpstream) -> Iterator[Served]:
    """The service with workers and a database of its own."""
    settings = Settings(
        database_url=create_database(database_url, "web"), db_pool_size=10, **e2e_env(upstream)
    )
    server, thread, url = serve_in_thread(create_app(settings, workers=2))
    try:
        yield Served(url, issue_key(settings, f"web-{uuid.uuid4()}"))
    finally:
        stop_thread_server(server, thread)


@pytest.fixture(scope="module")
def browser(served: Served) -> Iterator[Browser]:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no Chromium binary (make test installs Debian's chromium)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with launched_chromium(binary) as launched:
        yield launched


def api(served: Served) -> httpx.Client:
    return httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=60
    )


def signed_in(browser: Browser, served: Served, width: int = 1280, height: int = 800) -> Page:
    """A new page (its own storage), signed in through the form, keyboard only."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(WAIT_MS)
    expect.set_options(timeout=WAIT_MS)
    page.goto(served.url)
    page.get_by_label("API key").focus()
    page.keyboard.type(served.key)
    page.keyboard.press("Enter")
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    return page


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def open_session(page: Page, served: Served, session_id: str) -> None:
    page.goto(f"{served.url}/ui/#session={session_id}")
    expect(page.get_by_role("list", name="Conversation")).to_be_visible()


def assistant_text(page: Page) -> Any:
    return page.locator(".message.assistant .body").last


def test_a_wrong_key_is_refused_and_the_page_says_where_the_dev_key_is(
    browser: Browser, served: Served
) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(WAIT_MS)
    try:
        page.goto(served.url)
        assert page.url.endswith("/ui/")
        expect(page.get_by_text(".threadline/dev-key")).to_be_visible()
        shot(page, "01-sign-in")
        page.get_by_label("API key").fill("not-a-key")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_have_text("That key was not accepted.")
        assert page.evaluate("sessionStorage.length + localStorage.length") == 0
    finally:
        page.close()


def test_send_stream_reload_rejoin_and_finish(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """A new session with the default model; the answer streams in; a reload mid-answer
    rejoins it (the run went on); it finishes and the journal's version replaces it."""
    upstream.clear()
    held, release = threading.Event(), threading.Event()
    upstream.script(Hold(held), Text("Pack "), Text("an umbrella"), Hold(release), Text(" today."))
    page = signed_in(browser, served)
    try:
        expect(page.get_by_label("Model")).to_have_value("openai:gpt-4o-mini")
        page.get_by_label("Title (optional)").fill("Weather in Oslo")
        page.get_by_role("button", name="Start session").click()
        box = page.get_by_label("Message", exact=True)
        box.fill("Should I pack an umbrella?")
        box.press("Enter")
        expect(page.locator(".message.user")).to_have_text(re.compile("pack an umbrella\\?"))
        held.set()
        expect(assistant_text(page)).to_have_text("Pack an umbrella")
        expect(page.get_by_role("button", name="Stop", exact=True)).to_be_visible()
        shot(page, "02-streaming")

        page.reload()  # the run goes on; the page rejoins it from its start
        expect(assistant_text(page)).to_have_text("Pack an umbrella")
        expect(page.get_by_role("button", name="Stop", exact=True)).to_be_visible()
        release.set()
        expect(assistant_text(page)).to_have_text("Pack an umbrella today.")
        # Finished: the journal's messages, with their seqs (so each can be branched from).
        expect(page.get_by_role("button", name="Branch from message #3")).to_be_visible()
        expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible()
        shot(page, "03-answered")
        session_id = page.evaluate("location.hash").split("=")[1]
    finally:
        held.set()
        release.set()
        page.close()
    with api(served) as client:
        entries = client.get(f"/v1/sessions/{session_id}/entries").json()["data"]
        texts = [e["payload"]["content"] for e in entries if e["kind"] == "message"]
        assert texts == ["Should I pack an umbrella?", "Pack an umbrella today."]
        assert client.get(f"/v1/sessions/{session_id}").json()["title"] == "Weather in Oslo"


def test_behind_a_proxy_that_serves_it_under_a_path_the_page_works(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    # The page called the API at /v1/... and the root sent browsers to /ui/: behind a proxy
    # serving Threadline at /chat/, the sign-in already failed (/v1/models was the proxy's).
    upstream.clear()
    upstream.script(Text("Under "), Text("a path."))
    server, thread, url = serve_in_thread(path_proxy(served.url, "/chat"))
    page = signed_in(browser, Served(f"{url}/chat/", served.key))
    try:
        assert page.url == f"{url}/chat/ui/"
        page.get_by_role("button", name="Start session").click()
        box = page.get_by_label("Message", exact=True)
        box.fill("Where are you?")
        box.press("Enter")
        expect(assistant_text(page)).to_have_text("Under a path.")
        expect(page.get_by_role("button", name="Branch from message #3")).to_be_visible()
    finally:
        page.close()
        stop_thread_server(server, thread)


def test_stop_cancels_the_run_and_keeps_what_it_said(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    upstream.clear()
    release = threading.Event()
    upstream.script(Text("The first part"), Hold(release), Text(" never sent."))
    with api(served) as client:
        session = client.post("/v1/sessions", json={"title": "Stopped"}).json()
    page = signed_in(browser, served)
    try:
        open_session(page, served, session["id"])
        box = page.get_by_label("Message", exact=True)
        box.fill("Tell me a long story")
        page.get_by_role("button", name="Send", exact=True).click()
        expect(assistant_text(page)).to_have_text("The first part")
        page.get_by_role("button", name="Stop", exact=True).click()
        expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible()
        expect(page.get_by_text("(stopped: the answer is incomplete)")).to_be_visible()
        expect(assistant_text(page)).to_contain_text("The first part")
        shot(page, "04-stopped")
    finally:
        release.set()
        page.close()
    with api(served) as client:
        entries = client.get(f"/v1/sessions/{session['id']}/entries").json()["data"]
        [answer] = [e["payload"] for e in entries if e["payload"].get("role") == "assistant"]
        assert answer["content"] == "The first part" and answer["status"] == "incomplete"


def test_regenerate_replaces_the_last_answer(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    upstream.clear()
    upstream.script(Text("A first answer."))
    upstream.script(Text("A better answer."))
    page = signed_in(browser, served)
    try:
        page.get_by_role("button", name="New session with the default model").click()
        box = page.get_by_label("Message", exact=True)
        box.fill("Answer me")
        box.press("Enter")
        expect(assistant_text(page)).to_have_text("A first answer.")
        expect(page.get_by_role("button", name="Branch from message #3")).to_be_visible()
        page.get_by_role("button", name="Regenerate").click()
        expect(assistant_text(page)).to_have_text("A better answer.")
        # Then from the journal: the rolled-back turn is left out, the question asked again.
        answer = page.locator(".message.assistant")
        expect(
            answer.get_by_role("button", name=re.compile("^Branch from message"))
        ).to_be_visible()
        expect(page.locator(".message")).to_have_count(2)
        expect(page.locator(".message.user")).to_have_text(re.compile("Answer me"))
        session_id = page.evaluate("location.hash").split("=")[1]
    finally:
        page.close()
    with api(served) as client:
        entries = client.get(f"/v1/sessions/{session_id}/entries").json()["data"]
    [rollback] = [e["payload"] for e in entries if e["kind"] == "rollback"]
    assert rollback["reason"] == "regenerate"
    texts = [e["payload"]["content"] for e in entries if e["kind"] == "message"]
    assert texts == ["Answer me", "A first answer.", "Answer me", "A better answer."]


def test_a_long_session_sends_the_new_message_alone(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """The journal holds the conversation: however much history the page shows, its request
    carries only the new message (useChat would send them all)."""
    upstream.clear()
    upstream.script(Text("Noted."))
    with api(served) as client:
        sid = client.post("/v1/sessions", json={"title": "Long history"}).json()["id"]
        turns = [
            {"kind": "message", "payload": {"role": role, "content": f"{role} {i} " * 200}}
            for i in range(20)
            for role in ("user", "assistant")
        ]
        assert client.post(f"/v1/sessions/{sid}/entries", json={"entries": turns}).is_success
    page = signed_in(browser, served)
    sent: list[Any] = []
    page.on(
        "request",
        lambda request: (
            sent.append(request.post_data_json) if request.url.endswith("/v1/ui/chat") else None
        ),
    )
    try:
        open_session(page, served, sid)
        expect(page.locator(".message")).to_have_count(40)
        box = page.get_by_label("Message", exact=True)
        box.fill("One more thing")
        box.press("Enter")
        expect(assistant_text(page)).to_have_text("Noted.")
    finally:
        page.close()
    [body] = sent
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert body["messages"][0]["parts"] == [{"type": "text", "text": "One more thing"}]
    assert (body["id"], body["trigger"], body["on_disconnect"]) == (
        sid,
        "submit-message",
        "continue",
    )


def test_a_retried_turn_shows_its_voided_attempt_apart(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """The model's stream fails midway and the turn is retried (message.reset): the voided
    text is folded away as superseded and the answer is the retry's alone."""
    upstream.clear()
    fail, release = threading.Event(), threading.Event()
    upstream.script(Text("A voided sta"), Hold(fail), FailMidStream())
    upstream.script(Text("The retried"), Hold(release), Text(" answer."))
    with api(served) as client:
        session = client.post("/v1/sessions", json={"title": "Retried"}).json()
    page = signed_in(browser, served)
    try:
        open_session(page, served, session["id"])
        box = page.get_by_label("Message", exact=True)
        box.fill("Try hard")
        box.press("Enter")
        expect(assistant_text(page)).to_have_text("A voided sta")
        fail.set()
        retried = page.locator("details.retried")
        expect(retried.locator("summary")).to_contain_text("Retried: an attempt was voided")
        expect(retried.get_by_text("A voided sta")).to_be_hidden()  # folded
        expect(assistant_text(page)).to_have_text("The retried")
        shot(page, "05-retried")
        release.set()
        expect(assistant_text(page)).to_have_text("The retried answer.")
        expect(page.locator("details.retried")).to_have_count(0)  # the journal keeps the retry
    finally:
        fail.set()
        release.set()
        page.close()


def test_reasoning_shows_folded_under_the_answer_while_streaming_and_after(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """A model that thinks: its reasoning streams in folded before the answer, and stays
    folded there once the journal's version replaces the streamed one; a block the provider
    redacted says so, with no text."""
    upstream.clear()
    release = threading.Event()
    upstream.script(
        Thinking("Rain is likely in Oslo today."),
        RedactedThinking(),
        Hold(release),
        Text("Pack an umbrella."),
    )
    config = {"model": "anthropic:claude-sonnet-4-5", "reasoning": {"effort": "low"}}
    with api(served) as client:
        sid = client.post("/v1/sessions", json={"title": "Think", "config": config}).json()["id"]
    page = signed_in(browser, served)
    try:
        open_session(page, served, sid)
        box = page.get_by_label("Message", exact=True)
        box.fill("Umbrella?")
        box.press("Enter")
        reasoning = page.locator(".message.assistant details.reasoning")
        expect(reasoning).to_have_count(2)
        expect(reasoning.first.locator("summary")).to_have_text("Reasoning")
        expect(reasoning.first.get_by_text("Rain is likely")).to_be_hidden()  # folded
        expect(reasoning.last.locator("summary")).to_have_text(
            "Reasoning (redacted by the provider)"
        )
        release.set()
        expect(page.get_by_role("button", name="Branch from message #3")).to_be_visible()
        # The journal's answer: its reasoning first, folded, then the text.
        body = assistant_text(page)
        expect(body.locator("details.reasoning")).to_have_count(2)
        expect(body.locator(".text").last).to_have_text("Pack an umbrella.")
        first = body.locator("details.reasoning").first
        expect(first.get_by_text("Rain is likely in Oslo today.")).to_be_hidden()
        first.locator("summary").click()
        expect(first.get_by_text("Rain is likely in Oslo today.")).to_be_visible()
        expect(body.locator("details.reasoning").last.locator(".text")).to_have_count(0)
        shot(page, "06-reasoning")
    finally:
        release.set()
        page.close()


def test_a_dropped_or_attached_file_is_shown_and_only_pdf_or_text_is_taken(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """Files dropped on the composer or picked with Attach are listed (and can be removed);
    a type the service does not read is refused on the page, saying why."""
    upstream.clear()
    page = signed_in(browser, served)
    try:
        page.get_by_role("button", name="Start session").click()
        expect(page.get_by_label("Message", exact=True)).to_be_visible()
        drop_file(page, "plan.pdf", "application/pdf", PDF)
        attachments = page.get_by_role("list", name="Attachments")
        expect(attachments).to_contain_text("plan.pdf")
        drop_file(page, "photo.zip", "application/zip", b"PK")
        expect(page.get_by_role("alert")).to_contain_text(
            "Only PDF and plain text files can be attached (not photo.zip)"
        )
        notes: FilePayload = {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"Milk."}
        page.locator("input[type=file]").set_input_files(files=[notes])
        expect(attachments.locator("li")).to_have_count(2)
        page.get_by_role("button", name="Remove notes.txt").click()
        expect(attachments.locator("li")).to_have_count(1)
        shot(page, "08-attachment")
    finally:
        page.close()


PDF = pdf()


def drop_file(page: Page, name: str, media_type: str, data: bytes) -> None:
    """A file dropped on the composer, as a browser's drag and drop delivers it."""
    page.evaluate(
        """([name, type, bytes]) => {
          const transfer = new DataTransfer();
          transfer.items.add(new File([new Uint8Array(bytes)], name, { type }));
          const composer = document.querySelector(".composer");
          const event = { dataTransfer: transfer, bubbles: true, cancelable: true };
          composer.dispatchEvent(new DragEvent("dragover", event));
          composer.dispatchEvent(new DragEvent("drop", event));
        }""",
        [name, media_type, list(data)],
    )


def test_tool_calls_fold_and_a_branch_switches_between_threads(
    browser: Browser, served: Served
) -> None:
    """A session with a tool call in its history: shown folded. Branching from the first
    answer opens the fork; each lists the other under Branches."""
    with api(served) as client:
        session = client.post("/v1/sessions", json={"title": "Trip"}).json()
        sid = session["id"]
        appended = client.post(
            f"/v1/sessions/{sid}/entries",
            json={
                "entries": [
                    {"kind": "message", "payload": {"role": "user", "content": "Weather?"}},
                    {
                        "kind": "tool_call",
                        "payload": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                        "refs": {"tool_call_id": "t1"},
                    },
                    {
                        "kind": "tool_result",
                        "payload": {"name": "get_weather", "content": {"temp_c": 3}},
                        "refs": {"tool_call_id": "t1"},
                    },
                    {"kind": "message", "payload": {"role": "assistant", "content": "3 °C."}},
                    {"kind": "message", "payload": {"role": "user", "content": "And Bergen?"}},
                    {"kind": "message", "payload": {"role": "assistant", "content": "Rain."}},
                ]
            },
        )
        assert appended.status_code == 201, appended.text
    page = signed_in(browser, served)
    try:
        open_session(page, served, sid)
        tool = page.locator("details.tool")
        expect(tool).to_have_count(1)
        expect(tool.locator("summary")).to_have_text("Tool get_weather returned")
        expect(tool.get_by_text('"temp_c": 3')).to_be_hidden()  # folded
        tool.locator("summary").click()
        expect(tool.get_by_text('"temp_c": 3')).to_be_visible()
        shot(page, "06-tool-call")

        page.get_by_role("button", name="Branch from message #4").click()
        expect(page.locator(".bar .title")).to_have_text("Trip (branch at 4)")
        expect(page.locator(".message")).to_have_count(2)  # the user's and the answer with its tool
        branches = page.get_by_role("region", name="Branches")
        expect(branches).to_contain_text("Branched at #4 from")
        shot(page, "07-branch")
        branches.get_by_role("button", name="Trip", exact=True).click()
        expect(page.locator(".bar .title")).to_have_text("Trip")
        expect(page.locator(".message")).to_have_count(4)
        expect(branches.get_by_role("button", name="Trip (branch at 4)")).to_be_visible()
        # A second branch, from the first question: from it, its sibling is one click away.
        page.get_by_role("button", name="Branch from message #1").click()
        expect(page.locator(".bar .title")).to_have_text("Trip (branch at 1)")
        expect(page.locator(".message")).to_have_count(1)
        branches.get_by_role("button", name="Trip (branch at 4)").click()
        expect(page.locator(".bar .title")).to_have_text("Trip (branch at 4)")
        expect(page.locator(".message")).to_have_count(2)
        expect(branches).to_contain_text("Other branches of it")
        shot(page, "07-branch-siblings")
    finally:
        page.close()


def test_compact_with_a_focus_and_the_context_meter(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    upstream.clear()
    with api(served) as client:
        sid = client.post("/v1/sessions", json={"title": "Long talk"}).json()["id"]
        turns = []
        for i in range(6):
            turns += [
                {"kind": "message", "payload": {"role": "user", "content": f"Question {i}"}},
                {"kind": "message", "payload": {"role": "assistant", "content": f"Answer {i}"}},
            ]
        assert client.post(f"/v1/sessions/{sid}/entries", json={"entries": turns}).is_success
    release = threading.Event()  # the summarizer writes once the page has shown its progress
    upstream.script(Hold(release), Text("The user asked six numbered questions."))
    page = signed_in(browser, served)
    try:
        open_session(page, served, sid)
        meter = page.get_by_role("region", name="Context")
        expect(meter).to_contain_text("The next prompt holds")
        expect(meter.get_by_role("img")).to_have_attribute("aria-label", re.compile("% of"))
        page.get_by_label("Focus (optional)").fill("the numbering")
        page.get_by_role("button", name="Compact").click()
        # The compaction's progress, from its run's events (a small local model takes tens of
        # seconds): the summarizer has been called.
        expect(page.get_by_role("status")).to_have_text("Writing the summary…")
        expect(page.get_by_role("button", name="Compact")).to_be_disabled()
        release.set()
        expect(page.get_by_role("status")).to_have_text(re.compile("^Compacted"))
        expect(meter).to_contain_text("a summary stands in for older history")
        summary = page.locator(".message.summary")
        expect(summary).to_contain_text("(focus: the numbering)")
        shot(page, "08-compacted")
    finally:
        release.set()
        page.close()
    focus = upstream.requests[-1].body
    assert "the numbering" in str(focus)


def test_a_short_chat_says_there_is_nothing_to_compact_and_the_meter_adds_up(
    browser: Browser, served: Served
) -> None:
    """The Compact button is off with the service's reason (no refusal banner); the meter's
    legend adds up to the tokens it states; the list names the untitled session by its first
    message and counts "1 entry"."""
    question = f"Weather in Oslo? ({uuid.uuid4().hex[:8]})"
    with api(served) as client:
        sid = client.post("/v1/sessions", json={}).json()["id"]
        first = {"kind": "message", "payload": {"role": "user", "content": question}}
        assert client.post(f"/v1/sessions/{sid}/entries", json={"entries": [first]}).is_success
        context = client.get(f"/v1/sessions/{sid}/context").json()
    assert context["compactable"] is False
    page = signed_in(browser, served)
    try:
        open_session(page, served, sid)
        listed = page.locator(".session", has_text=question)
        expect(listed).to_contain_text(re.compile(r"· 1 entry$"))
        compact = page.get_by_role("button", name="Compact")
        expect(compact).to_be_disabled()
        expect(compact).to_have_accessible_description(context["not_compactable_reason"])
        meter = page.get_by_role("region", name="Context")
        expect(meter).to_contain_text(f"holds {context['tokens']} of")
        expect(meter).to_contain_text("1 message from 1 of 1 entry ·")
        legend = page.locator(".legend dd").all_inner_texts()
        assert len(legend) == 6
        assert sum(int(v.replace(",", "")) for v in legend) == context["tokens"]
        assert context["breakdown"]["overhead"] > 0
        expect(page.locator(".banner")).to_have_count(0)
        icon = page.evaluate(
            "fetch(document.querySelector('link[rel=icon]').href).then((r) => r.status)"
        )
        assert icon == 200
        shot(page, "09-nothing-to-compact")
    finally:
        page.close()


def test_search_sessions_and_history(browser: Browser, served: Served) -> None:
    with api(served) as client:
        sid = client.post("/v1/sessions", json={"title": "Recipes: pancakes"}).json()["id"]
        client.post("/v1/sessions", json={"title": "Unrelated"})
        assert client.post(
            f"/v1/sessions/{sid}/entries",
            json={
                "entries": [
                    {"kind": "message", "payload": {"role": "user", "content": "Eggs or not?"}},
                    {
                        "kind": "message",
                        "payload": {"role": "assistant", "content": "Two eggs and buttermilk."},
                    },
                ]
            },
        ).is_success
    page = signed_in(browser, served)
    try:
        page.get_by_label("Search sessions").fill("PANCAKE")
        sessions = page.get_by_role("complementary", name="Sessions")
        expect(sessions.locator(".session")).to_have_count(1)
        sessions.get_by_role("button", name=re.compile("Recipes: pancakes")).click()
        page.get_by_label('Words, "a phrase", -not').fill("buttermilk")
        page.get_by_role("button", name="Search", exact=True).click()
        hit = page.locator(".hits .hit")
        expect(hit).to_have_count(1)
        expect(hit.locator("mark")).to_have_text("buttermilk")
        hit.click()
        expect(page.locator("#msg-2")).to_have_class(re.compile("found"))
        shot(page, "09-search")
    finally:
        page.close()


def test_memory_is_shown(browser: Browser, served: Served) -> None:
    with api(served) as client:
        put = client.put("/v1/memory/user:7", json={"content": "- prefers metric units\n"})
        assert put.status_code in (200, 201), put.text
        sid = client.post(
            "/v1/sessions", json={"title": "With memory", "config": {"memory_namespace": "user:7"}}
        ).json()["id"]
    page = signed_in(browser, served)
    try:
        open_session(page, served, sid)
        memory = page.get_by_role("region", name="Memory")
        expect(memory).to_contain_text("This session reads user:7")
        expect(memory.get_by_label("Memory user:7")).to_have_text("- prefers metric units\n")
    finally:
        page.close()


def test_at_phone_width_nothing_overflows_and_the_panels_open(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    upstream.clear()
    upstream.script(Text("Short answer."))
    page = signed_in(browser, served, width=375, height=740)
    try:
        page.get_by_role("button", name="Sessions").click()
        page.get_by_role("button", name="Start session").click()
        box = page.get_by_label("Message", exact=True)
        box.fill("Hi from a phone")
        box.press("Enter")
        expect(assistant_text(page)).to_have_text("Short answer.")
        expect(page.get_by_role("button", name="Branch from message #3")).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= 375
        shot(page, "10-phone")
        page.get_by_role("button", name="Details").click()
        expect(page.get_by_role("complementary", name="Session details")).to_be_visible()
        shot(page, "11-phone-details")
    finally:
        page.close()


UNLABELLED = """() => [...document.querySelectorAll("input, select, textarea, button")]
  .filter((el) => !(el.labels?.length || el.getAttribute("aria-label") || (
    el.tagName === "BUTTON" && el.textContent.trim())))
  .map((el) => el.outerHTML)"""


def test_the_keyboard_alone_works_and_every_control_is_labelled(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """Tab to a control, Enter to use it: a session is started and a message sent without a
    pointer; the focused control shows it is focused."""
    upstream.clear()
    upstream.script(Text("Typed, not clicked."))
    page = signed_in(browser, served)
    try:

        def tab_to(name: str) -> None:
            """Tab until the control with this label (or text) has the focus."""
            named = "((el) => el.labels?.[0]?.textContent.trim() || el.textContent.trim())"
            for _ in range(60):
                page.keyboard.press("Tab")
                if page.evaluate(f"{named}(document.activeElement)") == name:
                    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
                    assert outline != "none", name  # focus is visible
                    return
            raise AssertionError(f"Tab never reached {name!r}")

        tab_to("Start session")
        page.keyboard.press("Enter")
        expect(page.get_by_label("Message", exact=True)).to_be_visible()
        tab_to("Message")
        page.keyboard.type("Sent from the keyboard")
        page.keyboard.press("Enter")
        expect(assistant_text(page)).to_have_text("Typed, not clicked.")
        expect(page.locator(".message.assistant button.branch")).to_be_visible()
        assert page.evaluate(UNLABELLED) == []
        # The side panel is reachable too. A one-turn chat has nothing to compact: the button
        # is disabled (out of the Tab order) and says why beside it.
        tab_to("Focus (optional)")
        expect(page.get_by_role("button", name="Compact")).to_be_disabled()
        expect(page.locator("#compact-reason")).to_contain_text("Nothing to compact")
    finally:
        page.close()


def test_a_session_started_from_an_agent_runs_its_latest_version(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """The agent picker lists the tenant's agents; a session started from one is pinned to its
    latest version and its runs send that version's instructions."""
    name = f"helpdesk-{uuid.uuid4().hex[:8]}"
    with api(served) as client:
        created = client.post(
            "/v1/agents",
            json={"name": name, "config": {"system_prompt": "You are the helpdesk, v1."}},
        )
        assert created.status_code == 201, created.text
        moved = client.patch(
            f"/v1/agents/{name}", json={"config": {"system_prompt": "You are the helpdesk, v2."}}
        )
        assert moved.status_code == 200, moved.text
    upstream.clear()
    upstream.script(Text("How can I help?"))
    page = signed_in(browser, served)
    try:
        page.get_by_label("Agent").select_option(name)
        expect(page.get_by_label("Model")).to_be_disabled()  # the agent's model
        page.get_by_role("button", name="Start session").click()
        expect(page.get_by_text(f"agent {name}, version 2")).to_be_visible()
        box = page.get_by_label("Message", exact=True)
        box.fill("Hello?")
        box.press("Enter")
        expect(assistant_text(page)).to_have_text("How can I help?")
        session_id = page.evaluate("location.hash").split("=")[1]
    finally:
        page.close()
    with api(served) as client:
        session = client.get(f"/v1/sessions/{session_id}").json()
    assert (session["agent"]["name"], session["agent"]["version"]) == (name, 2)
    system = upstream.requests[-1].body["messages"][0]
    assert system == {"role": "system", "content": "You are the helpdesk, v2."}


def calculator_session(served: Served, policy: dict[str, Any] | None = None) -> str:
    """A session with the calculator (under `policy`: its run_policy): its id."""
    config: dict[str, Any] = {"tools": [{"name": "calculator", "kind": "builtin"}]}
    if policy is not None:
        config["run_policy"] = policy
    with api(served) as client:
        session_id: str = client.post("/v1/sessions", json={"config": config}).json()["id"]
    return session_id


def send_in(page: Page, served: Served, session_id: str, text: str) -> None:
    """Open the session and send a message (Enter in the message box)."""
    open_session(page, served, session_id)
    box = page.get_by_label("Message", exact=True)
    box.fill(text)
    box.press("Enter")


def test_a_call_waiting_for_approval_is_approved_edited_or_rejected_on_the_page(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """Calls under `ask` show their arguments with Approve, Edit arguments and Reject; the
    rulings go back and the same answer streams on: the edited call ran with the person's
    arguments, the rejected one never ran and the model read why."""
    session_id = calculator_session(served, {"tool_approval": {"default": "ask"}})
    upstream.clear()
    upstream.script(
        ToolCall("c1", "calculator", '{"expression": "6*7"}'),
        ToolCall("c2", "calculator", '{"expression": "2**10"}'),
    )
    upstream.script(Text("Done: one ran, one was refused."))
    page = signed_in(browser, served)
    try:
        send_in(page, served, session_id, "Two sums, please.")
        expect(page.locator("fieldset.approval")).to_have_count(2)
        first, second = (
            page.locator("fieldset.approval").first,
            page.locator("fieldset.approval").last,
        )
        expect(first).to_contain_text("6*7")
        shot(page, "13-approval")
        first.get_by_role("button", name="Edit arguments").click()
        first.get_by_label("Arguments (JSON)").fill('{"expression": "not json')
        first.get_by_role("button", name="Approve with these arguments").click()
        expect(first.get_by_role("alert")).to_have_text("The arguments are not JSON.")
        first.get_by_label("Arguments (JSON)").fill('{"expression": "6*6"}')
        first.get_by_role("button", name="Approve with these arguments").click()
        second.get_by_label("Reason to reject (optional)").fill("Too big.")
        second.get_by_role("button", name="Reject").click()
        expect(assistant_text(page)).to_contain_text("Done: one ran, one was refused.")
        shot(page, "14-approved")
    finally:
        page.close()
    with api(served) as client:
        entries = client.get(f"/v1/sessions/{session_id}/entries").json()["data"]
    results = [e["payload"] for e in entries if e["kind"] == "tool_result"]
    ran = [r for r in results if not r["is_error"]]
    assert len(results) == 2 and len(ran) == 1 and "36" in str(ran[0]["content"])
    assert any("Too big." in str(r["content"]) for r in results if r["is_error"])


def test_a_reload_while_a_call_waits_for_approval_still_asks_for_it(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """The page is reloaded while the run waits for a ruling: the call still asks for it,
    once, and approving it there finishes the answer."""
    session_id = calculator_session(served, {"tool_approval": {"default": "ask"}})
    upstream.clear()
    upstream.script(ToolCall("c1", "calculator", '{"expression": "6*7"}'))
    upstream.script(Text("It is 42."))
    page = signed_in(browser, served)
    try:
        send_in(page, served, session_id, "6*7?")
        expect(page.locator("fieldset.approval")).to_have_count(1)
        page.reload()
        expect(page.locator("fieldset.approval")).to_have_count(1)
        expect(page.locator(".message.assistant")).to_have_count(1)
        shot(page, "15-approval-after-reload")
        page.locator("fieldset.approval").get_by_role("button", name="Approve").click()
        expect(assistant_text(page)).to_contain_text("It is 42.")
        expect(page.locator("fieldset.approval")).to_have_count(0)
    finally:
        page.close()
    with api(served) as client:
        entries = client.get(f"/v1/sessions/{session_id}/entries").json()["data"]
    (result,) = [e["payload"] for e in entries if e["kind"] == "tool_result"]
    assert str(result["content"]) == "42" and not result["is_error"]


def test_a_message_sent_while_the_answer_streams_steers_it(
    browser: Browser, served: Served, upstream: FakeUpstream
) -> None:
    """While a tool loop runs, Enter sends the message to it: the model's next turn reads it
    after the current tool result, and the page shows it inside the answer, where it landed,
    while streaming and once the journal's version replaces the stream."""
    session_id = calculator_session(served)
    release = threading.Event()
    upstream.clear()
    upstream.script(ToolCall("c1", "calculator", '{"expression": "1+1"}'))
    upstream.script(Hold(release), ToolCall("c2", "calculator", '{"expression": "2+2"}'))
    upstream.script(Text("Deux et quatre."))
    page = signed_in(browser, served)
    try:
        send_in(page, served, session_id, "Add, please.")
        expect(page.locator("details.tool").first).to_contain_text("returned")
        box = page.get_by_label("Message", exact=True)
        box.fill("In French.")
        with page.expect_response(lambda r: r.url.endswith("/steer")) as steered:
            box.press("Enter")
        assert steered.value.status == 202  # committed: the held turn may go on
        steer = page.locator(".message.assistant .steer")
        release.set()
        expect(steer).to_contain_text("In French.")
        expect(assistant_text(page)).to_contain_text("Deux et quatre.")
        expect(page.get_by_role("button", name="Send", exact=True)).to_be_visible()
        # The journal's version, once the answer ended: the message still where it landed.
        expect(steer).to_have_count(1)
        expect(page.locator(".message.user")).to_have_count(1)
        shot(page, "16-steered")
    finally:
        release.set()
        page.close()
    sent = [m for m in upstream.requests[-1].body["messages"] if m["role"] != "system"]
    assert [m["role"] for m in sent][-2:] == ["tool", "user"]
    assert sent[-1]["content"] == "In French."
