"""/docs and /redoc work offline: every asset their pages reference is served by the app."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

from tests.conftest import ClientFactory

# Attributes naming something the browser loads, and URLs in the pages' inline scripts.
_URL_ATTRIBUTES = {"src", "href", "spec-url"}
_SCRIPT_URL = re.compile(r"""(?:url|oauth2RedirectUrl)\s*:\s*['"]([^'"]+)['"]""")
_ANY_URL = re.compile(r"""https?://[^\s'"<>)]+""")


class _References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_script = tag == "script"
        self.urls += [value for name, value in attrs if name in _URL_ATTRIBUTES and value]

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.urls += _SCRIPT_URL.findall(data)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_load_every_asset_from_the_service(
    make_client: ClientFactory, page: str
) -> None:
    client = make_client(None)  # the docs need no key
    response = await client.get(page)
    assert response.status_code == 200
    html = response.text
    assert _ANY_URL.findall(html) == []  # no CDN, no web fonts: nothing off this host

    parser = _References()
    parser.feed(html)
    scripts = [url for url in parser.urls if url.endswith(".js")]
    assert scripts, "the page should load its viewer"
    assert "/openapi.json" in parser.urls
    for url in parser.urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, url
        asset = await client.get(url)
        assert asset.status_code == 200, url
        assert asset.content, url
