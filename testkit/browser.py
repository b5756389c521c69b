"""A real headless Chromium for browser tests: the system's binary, driven by Playwright
(Playwright's own browser downloads are never used)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Browser, sync_playwright

# Waits on page conditions, never on durations: generous, for a loaded machine.
WAIT_MS = 120_000


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if found := shutil.which(name):
            return found
    return None


@contextmanager
def launched_chromium(binary: str) -> Iterator[Browser]:
    with sync_playwright() as driver:
        # As root (CI containers) Chromium's sandbox cannot start.
        browser = driver.chromium.launch(
            executable_path=binary, args=["--no-sandbox"], timeout=WAIT_MS
        )
        try:
            yield browser
        finally:
            browser.close()
