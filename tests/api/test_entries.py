"""Appending entries over HTTP: content a provider would refuse is refused at the door, with
the offending path and the rule, at append, ask and dry-run projection; nothing is written."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from testkit.api import append, history, new_session
from tests.images import PNG_URL, data_url, jpeg

IMAGE = {"type": "image_url", "url": PNG_URL}


def _message(role: str, content: Any) -> dict[str, Any]:
    return {"kind": "message", "payload": {"role": role, "content": content}}


@pytest.mark.parametrize(
    ("entry", "loc", "rule"),
    [
        (_message("user", []), [], "empty_content"),
        (_message("system", [IMAGE]), [0, "type"], "image_not_allowed_in_role"),
        (
            _message("assistant", [{"type": "text", "text": "see"}, IMAGE]),
            [1, "type"],
            "image_not_allowed_in_role",
        ),
        (
            _message("user", [{"type": "image_url", "url": "data:application/pdf;base64,JVBE"}]),
            [0, "url"],
            "unsupported_image_type",
        ),
        (
            _message("user", [{"type": "image_url", "url": data_url("image/svg+xml", b"<svg/>")}]),
            [0, "url"],
            "unsupported_image_type",
        ),
        (
            _message("user", [{"type": "image_url", "url": "data:image/png;base64,%%%"}]),
            [0, "url"],
            "invalid_base64",
        ),
        (
            _message("user", [{"type": "image_url", "url": data_url("image/png", jpeg())}]),
            [0, "url"],
            "image_type_mismatch",
        ),
        (_message("user", [{"type": "text", "text": ""}]), [0, "text"], "blank_text"),
    ],
)
async def test_append_refuses_content_a_provider_would_refuse(
    client: httpx.AsyncClient, entry: dict[str, Any], loc: list[Any], rule: str
) -> None:
    sid = (await new_session(client))["id"]
    fine = _message("user", [{"type": "text", "text": "look"}, IMAGE])
    response = await append(client, sid, fine, entry)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_content"
    assert error["details"]["errors"] == [
        {
            "loc": ["entries", 1, "payload", "content", *loc],
            "msg": error["details"]["errors"][0]["msg"],
            "type": rule,
        }
    ]
    assert "entries.1.payload.content" in error["message"]
    assert await history(client, sid) == []


async def test_ask_and_projection_refuse_it_too_and_write_nothing(
    client: httpx.AsyncClient,
) -> None:
    sid = (await new_session(client))["id"]
    svg = {"type": "image_url", "url": data_url("image/svg+xml", b"<svg/>")}
    for stream in (False, True):  # a refused ask streams nothing
        asked = await client.post(
            f"/v1/sessions/{sid}/ask",
            json={"input": [{"type": "text", "text": "hi"}, svg], "stream": stream},
        )
        assert asked.status_code == 422, asked.text
        error = asked.json()["error"]
        assert error["code"] == "invalid_content"
        assert [(e["loc"], e["type"]) for e in error["details"]["errors"]] == [
            (["input", 1, "url"], "unsupported_image_type")
        ]
    dry = await client.post(
        f"/v1/sessions/{sid}/projection", json={"pending": [_message("system", [IMAGE])]}
    )
    assert dry.status_code == 422, dry.text
    assert [(e["loc"], e["type"]) for e in dry.json()["error"]["details"]["errors"]] == [
        (["pending", 0, "payload", "content", 0, "type"], "image_not_allowed_in_role")
    ]
    assert await history(client, sid) == []
    assert (await client.get(f"/v1/sessions/{sid}")).json()["rev"] == 0
