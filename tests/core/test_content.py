"""Content rules: what no provider a session may use would refuse, checked where entries are
written; hostile generated entries are either refused with a path or format cleanly for both."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core import content as rules
from app.core.content import content_problems, image_of, sendable_parts, sniff_image
from app.core.entries import EntryKind, PayloadError, normalize_entry
from app.core.formats import to_anthropic, to_openai
from app.core.messages import Message
from tests.core.format_oracles import validate_anthropic, validate_openai
from tests.documents import PDF_PART, TEXT_PART, document, encrypted_pdf, pdf
from tests.images import PNG_URL, data_url, gif, jpeg, png, webp

Json = dict[str, Any]


def _refusal(role: str, content: Any) -> list[tuple[list[Any], str]]:
    with pytest.raises(PayloadError) as caught:
        normalize_entry(EntryKind.MESSAGE, {"role": role, "content": content}, {})
    return [(e["loc"], e["type"]) for e in caught.value.errors]


def _image(url: str) -> Json:
    return {"type": "image_url", "url": url}


@pytest.mark.parametrize(
    ("role", "content", "loc", "rule"),
    [
        ("user", [], [], rules.EMPTY_CONTENT),
        ("system", [_image(PNG_URL)], [0, "type"], rules.IMAGE_ROLE),
        (
            "assistant",
            [{"type": "text", "text": "x"}, _image(PNG_URL)],
            [1, "type"],
            rules.IMAGE_ROLE,
        ),
        (
            "user",
            [_image("data:application/pdf;base64,JVBERi0=")],
            [0, "url"],
            rules.IMAGE_MEDIA_TYPE,
        ),
        (
            "user",
            [_image(data_url("image/svg+xml", b"<svg/>"))],
            [0, "url"],
            rules.IMAGE_MEDIA_TYPE,
        ),
        ("user", [_image("data:image/png;base64,iVBO!!")], [0, "url"], rules.IMAGE_BASE64),
        ("user", [_image("data:image/png;base64,iVBORw0KGgo")], [0, "url"], rules.IMAGE_BASE64),
        ("user", [_image("data:image/png;base64,")], [0, "url"], rules.IMAGE_BASE64),
        ("user", [_image(data_url("image/png", jpeg()))], [0, "url"], rules.IMAGE_BYTES),
        ("user", [_image(data_url("image/gif", b"hello world"))], [0, "url"], rules.IMAGE_BYTES),
        ("user", [_image("data:image/png;base64,iVBORw0KGgo=")], [0, "url"], rules.IMAGE_BYTES),
        ("user", [_image(data_url("image/png", png(9000, 10)))], [0, "url"], rules.IMAGE_SIDE),
        ("user", [_image("https://exa mple.com/a.png")], [0, "url"], rules.IMAGE_URL),
        ("user", [{"type": "text", "text": " \n"}], [0, "text"], rules.BLANK_TEXT),
    ],
)
def test_refused_with_path_and_rule(role: str, content: Any, loc: list[Any], rule: str) -> None:
    assert _refusal(role, content) == [(["payload", "content", *loc], rule)]


@pytest.mark.parametrize(
    ("raw", "media_type", "size"),
    [
        (png(640, 480), "image/png", (640, 480)),
        (gif(3, 5), "image/gif", (3, 5)),
        (jpeg(1024, 768), "image/jpeg", (1024, 768)),
        (webp(2000, 1), "image/webp", (2000, 1)),
    ],
)
def test_accepted_images_and_their_sizes(
    raw: bytes, media_type: str, size: tuple[int, int]
) -> None:
    url = data_url(media_type, raw)
    assert content_problems("user", [_image(url)]) == []
    found = image_of(url)
    assert (found.media_type, found.width, found.height) == (media_type, *size)
    assert sniff_image(raw) == found
    assert image_of("https://example.com/a.png") == rules.Image(None)


def test_text_content_is_never_refused_and_web_urls_are_accepted() -> None:
    assert content_problems("system", "") == []
    assert content_problems("user", [_image("https://example.com/a b")]) != []
    assert content_problems("user", [_image("https://example.com/a.png?x=1#y")]) == []


# --- hostile generated entries --------------------------------------------------------------

hostile_urls = st.one_of(
    st.sampled_from(
        [
            PNG_URL,
            data_url("image/jpeg", jpeg(30, 20)),
            data_url("image/gif", gif()),
            data_url("image/webp", webp(8, 8)),
            data_url("image/png", png(8001, 1)),
            data_url("image/svg+xml", b"<svg/>"),
            data_url("application/pdf", b"%PDF-1.4"),
            data_url("image/jpeg", png()),
            "data:image/png;base64,",
            "data:image/png,rawbytes",
            "data:;base64,AAAA",
            "https://example.com/cat.png",
            "http://x",
            "https://",
            "ftp://example.com/a.png",
            "javascript:alert(1)",
        ]
    ),
    st.builds(lambda t, b: f"data:{t};base64,{b}", st.text(max_size=12), st.text(max_size=24)),
    st.builds(lambda tail: "https://" + tail, st.text(max_size=16)),
    st.text(max_size=30),
)
hostile_parts = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=8)),
    st.builds(
        lambda url, detail: (
            {"type": "image_url", "url": url} | ({} if detail is None else {"detail": detail})
        ),
        hostile_urls,
        st.sampled_from([None, "low", "high", "auto", "medium"]),
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["file", "audio", "image", "", "input_text"])}),
    st.dictionaries(st.sampled_from(["type", "text", "url"]), st.text(max_size=4), max_size=3),
)
hostile_payloads = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "developer"]),
        "content": st.text(max_size=8) | st.lists(hostile_parts, max_size=4),
    }
)


def _located(error: Json) -> bool:
    return error["loc"][:1] == ["payload"] and isinstance(error["type"], str) and error["msg"]


@given(st.lists(hostile_payloads, min_size=1, max_size=4))
# A list of suppressed checks replaces the profile's: keep those, and allow the large payloads
# this strategy is built to make.
@settings(
    max_examples=400,
    suppress_health_check=[*settings().suppress_health_check, HealthCheck.data_too_large],
)
def test_hostile_entries_are_refused_with_a_path_or_sent_as_they_are(
    payloads: list[Json],
) -> None:
    conversation: list[Message] = []
    for payload in payloads:
        try:
            canonical, _ = normalize_entry(EntryKind.MESSAGE, payload, {})
        except PayloadError as refused:
            assert refused.errors and all(_located(e) for e in refused.errors)
            continue
        content = canonical["content"]
        parts = content if isinstance(content, str) else tuple(content)
        if not isinstance(parts, str):
            # Accepted means sent as it is: no part needs converting for any provider.
            assert sendable_parts(canonical["role"], parts) == list(parts)
        conversation.append(Message(canonical["role"], parts))
    conversation.append(Message("user", "and now?"))
    assert validate_openai(to_openai(conversation, [])) == []
    assert validate_anthropic(to_anthropic(conversation, [])) == []


@pytest.mark.parametrize(
    ("part", "text", "opaque"),
    [
        ({"type": "thinking", "thinking": " a\tb\n", "signature": "sig"}, " a\tb\n", "sig"),
        ({"type": "redacted_thinking", "data": "enc"}, "", "enc"),
        # A summarized reasoning part (OpenAI's shape): its summaries' texts, one paragraph each.
        (
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "One."}, {"text": "Two."}],
                "encrypted_content": "gAAA",
            },
            "One.\n\nTwo.",
            "gAAA",
        ),
        ({"type": "reasoning", "text": "plain"}, "plain", None),
    ],
)
def test_a_reasoning_parts_text_and_opaque_content_whatever_its_type(
    part: Json, text: str, opaque: str | None
) -> None:
    assert rules.reasoning_text(part) == text
    assert rules.reasoning_opaque(part) == opaque


def _document(media_type: str, raw: bytes, **extra: Any) -> Json:
    return {**document(media_type, raw), **extra}


@pytest.mark.parametrize(
    ("role", "part", "loc", "rule"),
    [
        ("assistant", PDF_PART, [0, "type"], rules.DOCUMENT_ROLE),
        ("system", TEXT_PART, [0, "type"], rules.DOCUMENT_ROLE),
        (
            "user",
            _document("application/pdf", b"hello, not a pdf"),
            [0, "url"],
            rules.DOCUMENT_BYTES,
        ),
        (
            "user",
            _document("application/pdf", b"%PDF-1.7 garbage"),
            [0, "url"],
            rules.DOCUMENT_BYTES,
        ),
        ("user", _document("application/pdf", encrypted_pdf()), [0, "url"], rules.DOCUMENT_BYTES),
        ("user", _document("application/pdf", png()), [0, "url"], rules.DOCUMENT_BYTES),
        ("user", _document("text/plain", b"\xff\xfe\x00bad"), [0, "url"], rules.DOCUMENT_BYTES),
        ("user", _document("text/plain", b"  \n"), [0, "url"], rules.DOCUMENT_BYTES),
        ("user", _document("application/msword", pdf()), [0, "url"], rules.DOCUMENT_MEDIA_TYPE),
        ("user", _document("image/png", png()), [0, "url"], rules.DOCUMENT_MEDIA_TYPE),
        (
            "user",
            {"type": "document", "url": "data:application/pdf;base64,JVBE!!"},
            [0, "url"],
            rules.IMAGE_BASE64,
        ),
        ("user", {**PDF_PART, "filename": "a/b.pdf"}, [0, "filename"], rules.DOCUMENT_FILENAME),
        ("user", {**PDF_PART, "filename": "a\nb.pdf"}, [0, "filename"], rules.DOCUMENT_FILENAME),
    ],
)
def test_documents_refused_with_path_and_rule(
    role: str, part: Json, loc: list[Any], rule: str
) -> None:
    assert _refusal(role, [part]) == [(["payload", "content", *loc], rule)]


def test_documents_accepted_and_read() -> None:
    for part in (PDF_PART, TEXT_PART, _document("application/pdf", pdf())):
        assert content_problems("user", [{"type": "text", "text": "Summarize"}, part]) == []
    found = rules.document_of(PDF_PART)
    assert (found.media_type, found.filename, found.pages) == ("application/pdf", "report.pdf", 2)
    assert found.size == len(pdf(2))
    text = rules.document_of({**TEXT_PART, "filename": None})
    assert (text.filename, text.pages) == ("document.txt", None)
    assert text.text() == "Quarterly notes: revenue up 4%."
    # The size comes from the base64 length, whatever the padding.
    for raw in (b"a", b"ab", b"abc", b"abcd"):
        assert rules.document_of(_document("text/plain", raw)).size == len(raw)


def test_a_document_stored_in_a_role_that_cannot_carry_it_is_sent_as_a_note() -> None:
    (note,) = sendable_parts("assistant", [PDF_PART])
    assert note["type"] == "text" and note["text"].startswith("[document not sent:")
