"""The chat page: built assets (web/ builds them into app/web/static) served at /ui, and / sends
browsers there. The page is a client of the public API: it holds no key (the user signs in
with one) and is served without authentication."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.gzip import GZipMiddleware

UI_URL = "/ui"
ASSETS = Path(__file__).resolve().parents[1] / "web" / "static"


def install_web(app: FastAPI) -> None:
    # Compressed for browsers that take it: the bundle is ~740 KB as built, ~190 KB gzipped.
    # Only here: the API's own responses (SSE among them) are left as they are.
    assets = GZipMiddleware(StaticFiles(directory=ASSETS, html=True))
    app.mount(UI_URL, assets, name="web")

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        # Relative, as the page's calls to the API are: behind a reverse proxy that serves
        # Threadline under a path, /chat/ leads to /chat/ui/.
        return RedirectResponse(f".{UI_URL}/", status_code=307)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        # Where browsers look when a page names no icon (the docs pages, a bare URL); the
        # chat page names its own, relative, so that it also comes through a proxy's path.
        return FileResponse(ASSETS / "favicon.svg", media_type="image/svg+xml")
