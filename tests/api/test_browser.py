"""The README's plain-EventSource example, run as written in a real headless Chromium: a page
on another origin opens a run's stream with a stream token and renders the answer. CORS as the
browser enforces it: real preflights, and pages on origins that are not allowed get nothing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Browser, Page
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.config import Settings
from app.main import create_app
from testkit.browser import WAIT_MS, chromium_binary, launched_chromium
from testkit.proxy import CuttingProxy
from testkit.server import serve_in_thread, stop_thread_server
from testkit.upstream import FakeUpstream, Hold, Text
from tests.conftest import issue_key
from tests.e2e import create_database, e2e_env

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def js_block_after(heading: str) -> str:
    """The first JavaScript block after a heading, as written."""
    section = README[README.index(heading) :]
    start = section.index("```js\n") + len("```js\n")
    return section[start : section.index("```\n", start)]


# What the README leaves to the page around its snippet: `API`, `streamUrl` (from the page's
# query here, as a backend would render them) and the `answer` element.
AROUND = """
const params = new URLSearchParams(location.search);
const API = params.get("api");
const streamUrl = params.get("stream");
const answer = document.getElementById("answer");
"""

# Before the snippet: EventSource as the page's, recording what it gets (each event its
# listeners were given, with its id; the run's first two events; errors) for the test to read.
WATCH = """
window.sources = [];
window.seen = [];
window.EventSource = class extends EventSource {
  constructor(...args) {
    super(...args);
    window.sources.push(this);
    this.onerror = () => window.seen.push(["error", "", this.readyState]);
    for (const type of ["run.created", "run.started"]) {  // not the snippet's: the test's
      EventTarget.prototype.addEventListener.call(this, type, (e) => {
        window.seen.push([type, e.lastEventId]);
      });
    }
  }
  addEventListener(type, listener, options) {
    super.addEventListener(type, (e) => {
      window.seen.push([type, e.lastEventId]);
      listener.call(this, e);
    }, options);
  }
};
"""


def page_html() -> str:
    snippet = js_block_after("### From a browser")
    return (
        '<!doctype html><html><body><p id="answer"></p>'
        f"<script>{WATCH}</script><script>{AROUND}{snippet}</script></body></html>"
    )


async def the_page(request: Request) -> HTMLResponse:
    return HTMLResponse(page_html())


async def blank(request: Request) -> HTMLResponse:
    return HTMLResponse("<!doctype html><html><body></body></html>")


PAGES = Starlette(routes=[Route("/", the_page), Route("/blank", blank)])


class RequestLog:
    """The API's requests as they reach it: method, path and headers (lowercase names)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests: list[tuple[str, str, dict[str, str]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            self.requests.append((scope["method"], scope["path"], headers))
        await self.app(scope, receive, send)

    def to(self, path: str) -> list[tuple[str, dict[str, str]]]:
        return [(method, headers) for method, at, headers in self.requests if at == path]


@dataclass
class Browsed:
    api: str  # the API's URL
    key: str  # the backend's key, never given to a page except to test a preflight
    page: str  # a page origin listed in THREADLINE_CORS_ORIGINS
    elsewhere: str  # a page origin that is not
    log: RequestLog


@pytest.fixture(scope="module")
def served(database_url: str, upstream: FakeUpstream) -> Iterator[Browsed]:
    """The pages on two origins of their own, and the API with workers (and a database of its
    own) allowing the first of them."""
    page_server, page_thread, page = serve_in_thread(PAGES)
    other_server, other_thread, elsewhere = serve_in_thread(PAGES)
    settings = Settings(
        database_url=create_database(database_url, "browser"),
        db_pool_size=10,
        cors_origins=[page],
        **e2e_env(upstream),
    )
    log = RequestLog(create_app(settings, workers=2))
    api_server, api_thread, api = serve_in_thread(log)
    try:
        yield Browsed(api, issue_key(settings, f"browser-{uuid.uuid4()}"), page, elsewhere, log)
    finally:
        stop_thread_server(api_server, api_thread)
        stop_thread_server(other_server, other_thread)
        stop_thread_server(page_server, page_thread)


@pytest.fixture(scope="module")
def browser(served: Browsed) -> Iterator[Browser]:
    """A real headless Chromium: the system's (Playwright's own downloads are never used).
    After `served`: Playwright's sync API runs an event loop in this thread, and the
    servers' setup calls asyncio.run."""
    binary = chromium_binary()
    if binary is None:
        pytest.skip("no Chromium binary (make test installs Debian's chromium)")
    with launched_chromium(binary) as launched:
        yield launched


def stream_url(served: Browsed) -> tuple[str, str]:
    """The backend's part, with the key: a session, an ask that runs on its own, and a token
    for its run's stream. Returns the run id and the stream URL."""
    auth = {"Authorization": f"Bearer {served.key}"}
    with httpx.Client(base_url=served.api, headers=auth, timeout=60) as backend:
        session = backend.post("/v1/sessions", json={})
        assert session.status_code == 201, session.text
        run = backend.post(
            f"/v1/sessions/{session.json()['id']}/ask",
            json={"input": "Hello!", "stream": False, "max_output_tokens": 32},
        )
        assert run.status_code == 202, run.text
        run_id: str = run.json()["id"]
        token = backend.post("/v1/stream_tokens", json={"run_id": run_id})
        assert token.status_code == 201, token.text
        url: str = token.json()["stream_url"]
        return run_id, url


# The page's EventSource, closed (by the snippet, on the terminal event; or by a failure).
CLOSED = "window.sources.length === 1 && window.sources[0].readyState === 2"


def new_page(browser: Browser) -> Page:
    page = browser.new_page()
    page.set_default_timeout(WAIT_MS)  # loading, evaluating: slow on a loaded machine
    return page


def open_page(browser: Browser, origin: str, api: str, url: str) -> Page:
    page = new_page(browser)
    page.goto(f"{origin}/?{urlencode({'api': api, 'stream': url})}")
    return page


def test_the_readme_eventsource_example_renders_the_answer(
    browser: Browser, served: Browsed, upstream: FakeUpstream
) -> None:
    upstream.clear()
    upstream.script(Text("Hello "), Text("from "), Text("the model."))
    _, url = stream_url(served)
    page = open_page(browser, served.page, served.api, url)
    try:
        # The snippet closes its EventSource on the terminal event.
        page.wait_for_function(CLOSED, timeout=WAIT_MS)
        assert page.text_content("#answer") == "Hello from the model."
        seen = page.evaluate("window.seen")
        assert page.evaluate("window.sources.length") == 1
    finally:
        page.close()
    types = [event[0] for event in seen]
    assert types[-1] == "run.completed" and "error" not in types, seen
    assert "message.delta" in types
    ids = [int(event[1]) for event in seen]
    assert ids == sorted(set(ids))  # each event once, in order


def test_a_page_on_another_origin_gets_nothing(
    browser: Browser, served: Browsed, upstream: FakeUpstream
) -> None:
    """A valid token, from a page whose origin is not allowed: the browser withholds the
    stream from the page (no CORS headers for that origin)."""
    upstream.clear()
    upstream.script(Text("Not for you."))
    _, url = stream_url(served)
    page = open_page(browser, served.elsewhere, served.api, url)
    try:
        page.wait_for_function("window.seen.length > 0", timeout=WAIT_MS)
        assert page.text_content("#answer") == ""
        seen = page.evaluate("window.seen")
    finally:
        page.close()
    assert seen == [["error", "", 2]]  # refused: closed, never retried, no event given


FETCH_A_SESSION = """async ([api, key]) => {
  try {
    const response = await fetch(`${api}/v1/sessions`, {
      method: "POST",
      headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
      body: JSON.stringify({ metadata: { from: "a page" } }),
    });
    return { status: response.status, body: await response.json() };
  } catch (error) {
    return { error: String(error) };
  }
}"""


def test_a_preflighted_fetch_works_from_the_allowed_origin_only(
    browser: Browser, served: Browsed
) -> None:
    """Authorization and a JSON body make the browser ask first (OPTIONS): the allowed
    origin's preflight passes and its POST goes through; the other origin's stops there."""
    outcomes: dict[str, Any] = {}
    for origin in (served.page, served.elsewhere):
        page = new_page(browser)
        try:
            page.goto(f"{origin}/blank")
            outcomes[origin] = page.evaluate(FETCH_A_SESSION, [served.api, served.key])
        finally:
            page.close()

    allowed = outcomes[served.page]
    assert allowed.get("status") == 201, allowed
    assert allowed["body"]["metadata"] == {"from": "a page"}
    refused = outcomes[served.elsewhere]
    assert "error" in refused and "TypeError" in refused["error"], refused

    def reached(origin: str) -> list[tuple[str, str]]:
        return [
            (method, headers.get("access-control-request-headers", "").lower())
            for method, headers in served.log.to("/v1/sessions")
            if headers.get("origin") == origin
        ]

    preflight, post = reached(served.page)
    assert preflight[0] == "OPTIONS" and "authorization" in preflight[1]
    assert post[0] == "POST"
    # The other origin's preflight was refused: its POST never left the browser.
    [(method, asked)] = reached(served.elsewhere)
    assert method == "OPTIONS" and "authorization" in asked


def test_the_page_resumes_a_dropped_stream_with_last_event_id(
    browser: Browser, served: Browsed, upstream: FakeUpstream
) -> None:
    """The connection is cut after the first delta: the page's EventSource reconnects by
    itself with Last-Event-ID, and renders every later event once."""
    upstream.clear()
    start, release = threading.Event(), threading.Event()
    upstream.script(Hold(start), Text("Bring "), Hold(release), Text("an umbrella."))
    proxy = CuttingProxy(served.api, b"event: message.delta", on_cut=release.set)
    try:
        run_id, url = stream_url(served)
        page = open_page(browser, served.page, proxy.url, url)
        try:
            # The page has its first events before the model answers, then the cut comes.
            page.wait_for_function(
                "window.seen.some(([type]) => type === 'run.started')", timeout=WAIT_MS
            )
            start.set()
            page.wait_for_function(CLOSED, timeout=WAIT_MS)
            assert page.text_content("#answer") == "Bring an umbrella."
            seen = page.evaluate("window.seen")
        finally:
            page.close()
    finally:
        start.set()
        release.set()
        proxy.close()
    assert proxy.cut.is_set() and proxy.connections >= 2, seen
    types = [event[0] for event in seen]
    assert "error" in types and types[-1] == "run.completed", seen  # dropped, then resumed
    cut_at = types.index("error")
    # The reconnection told the server the last event the page got (run.started, or the
    # delta if it arrived before the cut), and got only the later ones.
    resumed = [
        headers.get("last-event-id")
        for method, headers in served.log.to(f"/v1/runs/{run_id}/events")
        if method == "GET"
    ]
    assert len(resumed) >= 2 and resumed[0] is None, resumed
    assert resumed[1] is not None, resumed
    last_id = int(resumed[1])  # the page records some events only: at least the last of those
    assert last_id >= max(int(event[1]) for event in seen[:cut_at]) >= 2, (seen, resumed)
    assert all(int(event[1]) > last_id for event in seen[cut_at + 1 :]), (seen, resumed)
    ids = [int(event[1]) for event in seen if event[0] != "error"]
    assert ids == sorted(set(ids)), seen  # nothing twice
