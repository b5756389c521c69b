"""The chat page: built assets (web/ builds them into app/web/static) served at /ui, and / sends
browsers there. The page is a client of the public API: it holds no key (the user signs in
with one) and is served without authentication."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

UI_URL = "/ui"
ASSETS = Path(__file__).resolve().parents[1] / "web" / "static"


def install_web(app: FastAPI) -> None:
    app.mount(UI_URL, StaticFiles(directory=ASSETS, html=True), name="web")

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse(f"{UI_URL}/", status_code=307)
