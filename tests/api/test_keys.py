"""API keys at the API: a read-only key reads (and asks for stream tokens, and dry-runs a
projection) but every route that writes refuses it with 403 read_only_key, writing nothing."""

from __future__ import annotations

import uuid

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.services.keys import create_key
from testkit.api import append_texts, history, new_session
from tests.conftest import ClientFactory

# Routes that only read, whatever their method.
READING_POSTS = {
    ("POST", "/v1/sessions/{session_id}/projection"),
    ("POST", "/v1/stream_tokens"),
}


async def test_a_read_only_key_reads_and_writes_nothing(
    app: FastAPI, engine: AsyncEngine, make_client: ClientFactory
) -> None:
    tenant = f"ro-{uuid.uuid4()}"
    writer = make_client(await create_key(engine, tenant))
    reader = make_client(await create_key(engine, tenant, "dashboard", read_only=True))
    session = await new_session(writer, title="shared")
    await append_texts(writer, session["id"], "hello")
    entries = await history(writer, session["id"])

    assert (await reader.get(f"/v1/sessions/{session['id']}")).json()["title"] == "shared"
    assert await history(reader, session["id"]) == entries
    assert (await reader.get("/v1/usage")).status_code == 200
    projection = await reader.post(f"/v1/sessions/{session['id']}/projection", json={})
    assert projection.status_code == 200, projection.text
    token = await reader.post("/v1/stream_tokens", json={"session_id": session["id"]})
    assert token.status_code == 201, token.text

    ask = await reader.post(f"/v1/sessions/{session['id']}/ask", json={"input": "hi"})
    assert ask.status_code == 403
    assert ask.json()["error"]["code"] == "read_only_key"

    # Every other route that is not a GET refuses it, before looking at the request.
    document = app.openapi()
    checked = 0
    for path, operations in document["paths"].items():
        if not path.startswith("/v1/") or path.startswith("/v1/admin/"):
            continue
        for method in operations:
            if method == "get" or (method.upper(), path) in READING_POSTS:
                continue
            url = path.format(
                session_id=session["id"],
                run_id=uuid.uuid4(),
                namespace="notes",
                chat_id="c",
                webhook_id=uuid.uuid4(),
                name="helper",
                server_id=uuid.uuid4(),
                schedule_id=uuid.uuid4(),
            )
            response = await reader.request(method.upper(), url, json={})
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["error"]["code"] == "read_only_key"
            assert "403" in operations[method]["responses"], (method, path)
            checked += 1
    assert checked >= 10
    assert await history(writer, session["id"]) == entries
    listed = (await writer.get("/v1/sessions")).json()["data"]
    assert [s["id"] for s in listed] == [session["id"]]
