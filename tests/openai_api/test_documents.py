"""The facade's input_file through the official openai SDK: a PDF (file_data, a base64 data
URL, with its filename) becomes a document part the provider gets in its own shape; a file
that is not what it says, or a model that cannot read it, is refused and nothing written."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from testkit.upstream import FakeUpstream, Text
from tests.documents import PDF_PART, document_url
from tests.images import PNG_URL, png


def asked(*parts: dict[str, Any]) -> Any:
    return [
        {"role": "user", "content": [{"type": "input_text", "text": "Summarize this."}, *parts]}
    ]


async def test_an_input_file_reaches_openai_as_a_file_and_anthropic_as_a_document(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    pdf_file = {"type": "input_file", "filename": "report.pdf", "file_data": PDF_PART["url"]}
    upstream.script(Text("Two blank pages."))

    answer = await client.responses.create(model="gpt-4o-mini", input=asked(pdf_file))

    assert answer.output_text == "Two blank pages."
    sent = upstream.requests[-1].body["messages"][-1]["content"]
    assert sent[1] == {
        "type": "file",
        "file": {"filename": "report.pdf", "file_data": PDF_PART["url"]},
    }
    items = await client.responses.input_items.list(answer.id)
    (question,) = [i for i in items.data if getattr(i, "role", None) == "user"]
    assert question.model_dump(exclude_none=True)["content"][1] == pdf_file
    # The same file, bare base64 named .pdf, to an Anthropic model: a document block.
    upstream.script(Text("Still two pages."))
    bare = {**pdf_file, "file_data": PDF_PART["url"].partition(",")[2]}
    again = await client.responses.create(
        model="claude-haiku-4-5", previous_response_id=answer.id, input=asked(bare)
    )
    assert again.output_text == "Still two pages."
    block = upstream.requests[-1].body["messages"][-1]["content"][1]
    assert block["type"] == "document" and block["title"] == "report.pdf"
    assert block["source"]["data"] == bare["file_data"]


@pytest.mark.parametrize(
    ("file", "code"),
    [
        (
            {"filename": "a.pdf", "file_data": document_url("application/pdf", png())},
            "invalid_content",
        ),
        ({"filename": "a.pdf", "file_data": "data:application/pdf;base64,%%%"}, "invalid_content"),
        ({"filename": "a.doc", "file_data": "JVBERi0xLjcK"}, "invalid_value"),
        ({"file_id": "file-abc"}, "invalid_value"),
    ],
)
async def test_a_hostile_input_file_is_refused_and_nothing_written(
    client: AsyncOpenAI,
    upstream: FakeUpstream,
    api: httpx.AsyncClient,
    file: dict[str, Any],
    code: str,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(
            model="gpt-4o-mini", input=asked({"type": "input_file", **file})
        )
    assert caught.value.code == code, caught.value.body
    assert (await api.get("/v1/sessions")).json()["data"] == []
    assert upstream.requests == []


async def test_an_image_for_a_model_without_vision_is_refused(
    client: AsyncOpenAI, upstream: FakeUpstream, api: httpx.AsyncClient
) -> None:
    image = {"type": "input_image", "image_url": PNG_URL, "detail": "auto"}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="gpt-4", input=asked(image))
    assert caught.value.code == "images_not_supported"
    assert "openai:gpt-4 cannot read images" in caught.value.message
    assert (await api.get("/v1/sessions")).json()["data"] == []
    assert upstream.requests == []
