"""Documents as input: a PDF ask reaches each provider in its own shape through the real SDKs
(the fake upstream refuses any other), hostile documents are refused at the door with the rule
and nothing written, and what a model cannot read (an image, a PDF) is refused with a 422 on
the ask and on entry appends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from app.config import Settings
from testkit.api import ended_run, history, message, new_session
from testkit.upstream import FakeUpstream, Text
from tests.conftest import api_with
from tests.documents import PDF_PART, TEXT_PART, document, pdf
from tests.images import PNG_URL, png

OPENAI = "openai:gpt-4o-mini"
ANTHROPIC = "anthropic:claude-haiku-4-5"
ASKED = [{"type": "text", "text": "Summarize both."}, PDF_PART, TEXT_PART]


async def asked(api: httpx.AsyncClient, sid: str, content: Any, **body: Any) -> dict[str, Any]:
    response = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": content, "stream": False, **body}
    )
    assert response.status_code == 202, response.text
    return await ended_run(api, response.json()["id"])


def refused(response: httpx.Response, code: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    return error


async def test_a_pdf_ask_on_openai_sends_a_file_part_and_text_as_text(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": OPENAI}))["id"]
    upstream.script(Text("Two pages, one note."))

    run = await asked(api, sid, ASKED)

    assert run["status"] == "completed", run
    sent = upstream.requests[-1].body["messages"][-1]
    assert sent["role"] == "user"
    assert sent["content"] == [
        {"type": "text", "text": "Summarize both."},
        {"type": "file", "file": {"filename": "report.pdf", "file_data": PDF_PART["url"]}},
        {"type": "text", "text": "notes.txt:\n\nQuarterly notes: revenue up 4%."},
    ]
    journal = await history(api, sid)
    assert journal[0]["payload"]["content"] == ASKED  # stored as given
    # The budget counted the PDF by its rule: 3000 tokens a page, two pages.
    assert journal[0]["token_count"] >= 6000


async def test_a_pdf_ask_on_anthropic_sends_document_blocks(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": ANTHROPIC}))["id"]
    upstream.script(Text("Two pages, one note."))

    run = await asked(api, sid, ASKED)

    assert run["status"] == "completed", run
    sent = upstream.requests[-1].body["messages"][-1]
    # (The prompt cache's mark on the last block is no part of the document.)
    assert [{k: v for k, v in b.items() if k != "cache_control"} for b in sent["content"]] == [
        {"type": "text", "text": "Summarize both."},
        {
            "type": "document",
            "source": {
                "type": "base64",
                "media_type": "application/pdf",
                "data": PDF_PART["url"].partition(",")[2],
            },
            "title": "report.pdf",
        },
        {
            "type": "document",
            "source": {
                "type": "text",
                "media_type": "text/plain",
                "data": "Quarterly notes: revenue up 4%.",
            },
            "title": "notes.txt",
        },
    ]


HOSTILE = [
    (document("application/pdf", b"MZ\x90\x00 an executable"), "document_type_mismatch"),
    (document("application/pdf", png()), "document_type_mismatch"),
    (document("application/vnd.ms-excel", pdf()), "unsupported_document_type"),
    (document("text/html", b"<p>hi</p>"), "unsupported_document_type"),
    ({"type": "document", "url": "data:application/pdf;base64,JVBERi0x!!"}, "invalid_base64"),
    ({"type": "document", "url": "https://example.com/a.pdf"}, None),  # the schema's 422
]


@pytest.mark.parametrize(("part", "rule"), HOSTILE)
async def test_hostile_documents_are_refused_with_the_rule_and_nothing_written(
    api: httpx.AsyncClient, upstream: FakeUpstream, part: dict[str, Any], rule: str | None
) -> None:
    sid = (await new_session(api, config={"model": ANTHROPIC}))["id"]
    content = [{"type": "text", "text": "Read this"}, part]

    ask = await api.post(f"/v1/sessions/{sid}/ask", json={"input": content, "stream": False})
    appended = await api.post(
        f"/v1/sessions/{sid}/entries",
        json={"entries": [{"kind": "message", "payload": {"role": "user", "content": content}}]},
    )

    for response in (ask, appended):
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        if rule is not None:
            assert error["code"] == "invalid_content", error
            assert [e["type"] for e in error["details"]["errors"]] == [rule]
            assert error["details"]["errors"][0]["loc"][-2:] == [1, "url"]
    assert await history(api, sid) == []
    assert (await api.get(f"/v1/sessions/{sid}")).json()["rev"] == 0
    assert upstream.requests == []


async def test_a_40_mb_document_is_refused_with_the_cap(
    settings: Settings, new_key: Callable[[], Awaitable[str]]
) -> None:
    # A body limit that lets the document in: the document's own cap (32 MB) refuses it.
    big = document("application/pdf", b"%PDF-1.7\n" + b"0" * (40 * 1024 * 1024))
    async with api_with(
        settings, new_key, max_request_bytes=64 * 1024 * 1024, openai_api_key="sk-unused"
    ) as api:
        sid = (await new_session(api, config={"model": OPENAI}))["id"]
        for response in (
            await api.post(f"/v1/sessions/{sid}/ask", json={"input": [big], "stream": False}),
            await api.post(
                f"/v1/sessions/{sid}/entries",
                json={"entries": [message("x") | {"payload": {"role": "user", "content": [big]}}]},
            ),
        ):
            error = refused(response, "invalid_content")
            (problem,) = error["details"]["errors"]
            assert problem["type"] == "document_too_large"
            assert str(32 * 1024 * 1024) in problem["msg"], problem
        assert await history(api, sid) == []


async def test_an_image_for_a_model_without_vision_is_refused(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": "openai:gpt-4"}))["id"]
    image = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "url": PNG_URL}]

    ask = await api.post(f"/v1/sessions/{sid}/ask", json={"input": image, "stream": False})
    error = refused(ask, "images_not_supported")
    assert error["details"] == {"loc": ["body", "input", 1], "model": "openai:gpt-4"}
    assert "openai:gpt-4 cannot read images" in error["message"]
    appended = await api.post(
        f"/v1/sessions/{sid}/entries",
        json={"entries": [{"kind": "message", "payload": {"role": "user", "content": image}}]},
    )
    error = refused(appended, "images_not_supported")
    assert error["details"]["loc"] == ["body", "entries", 0, "payload", "content", 1]
    assert await history(api, sid) == []
    # The same image asked of a model that sees is sent.
    upstream.script(Text("A pixel."))
    run = await asked(api, sid, image, model=OPENAI)
    assert run["status"] == "completed", run
    # A history holding an image is refused to a model without vision, named where it is.
    later = await api.post(
        f"/v1/sessions/{sid}/ask", json={"input": "And now?", "model": "openai:gpt-4"}
    )
    error = refused(later, "images_not_supported")
    assert error["details"]["loc"][0] == "context"
    assert len(upstream.requests) == 1


async def test_a_pdf_for_a_model_that_reads_none_is_refused_text_is_not(
    api: httpx.AsyncClient, upstream: FakeUpstream
) -> None:
    sid = (await new_session(api, config={"model": "anthropic:claude-3-haiku-20240307"}))["id"]
    ask = await api.post(f"/v1/sessions/{sid}/ask", json={"input": [PDF_PART], "stream": False})
    error = refused(ask, "documents_not_supported")
    assert error["details"]["loc"] == ["body", "input", 0]
    local = await api.post(
        f"/v1/sessions/{sid}/ask",
        json={"input": [PDF_PART], "model": "local:smollm2-135m-instruct", "stream": False},
    )
    refused(local, "documents_not_supported")
    assert await history(api, sid) == []
    upstream.script(Text("Revenue rose."))
    run = await asked(api, sid, [TEXT_PART])
    assert run["status"] == "completed", run
    sent = upstream.requests[-1].body["messages"][-1]["content"]
    assert sent[0]["source"]["type"] == "text"
