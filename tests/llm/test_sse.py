"""The lean SSE reader (app/llm/sse.py): every event, however the bytes arrive, as the SSE spec
reads them, with the SDK's own line decoder as the oracle."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder

from app.llm.base import ProviderError
from app.llm.sse import EventDecoder, server_events

# Field values: any text without line ends (a value cannot hold one).
values = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"))
names = values


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[tuple[str, str]]]:
    """A stream of events (each with a data line, some named, with comments and ids between),
    every line ended by LF, CRLF or CR at random; and the events it holds."""
    end = st.sampled_from(["\n", "\r\n", "\r"])
    text, expected = "", []
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.none() | names)
        data = draw(st.lists(values, min_size=1, max_size=3))
        lines = [] if name is None else [f"event: {name}"]
        if draw(st.booleans()):
            lines.append(": a comment")
        if draw(st.booleans()):
            lines.append("id: 7")
        # "data:value" and "data: value" are the same field (one space after the colon is
        # dropped): a value that starts with a space needs the second form to keep it.
        lines += [
            f"data:{value}"
            if not value.startswith(" ") and draw(st.booleans())
            else f"data: {value}"
            for value in data
        ]
        for line in [*lines, ""]:
            ending = draw(end)
            if text.endswith("\r") and not line and ending == "\n":
                ending = "\r"  # CR then LF is one line end (CRLF), not a blank line
            text += line + ending
        expected.append((name or "", "\n".join(data)))
    return text.encode(), expected


def fed(decoder: EventDecoder, body: bytes, cuts: list[int]) -> list[tuple[str, str]]:
    """`body` fed in pieces cut at `cuts` (byte offsets, anywhere: inside a character too)."""
    events, start = [], 0
    for cut in [*sorted(set(cuts)), len(body)]:
        events += decoder.feed(body[start:cut])
        start = cut
    return events + decoder.finish()


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(stream=streams(), data=st.data())
def test_every_event_is_read_however_the_bytes_are_cut(
    stream: tuple[bytes, list[tuple[str, str]]], data: st.DataObject
) -> None:
    body, expected = stream
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=8))

    events = fed(EventDecoder(), body, cuts)

    assert events == expected
    sdk = [(e.event or "", e.data) for e in SSEDecoder().iter_bytes(iter([body]))]
    assert events == sdk


def test_the_usual_events_and_the_rarer_fields() -> None:
    body = (
        b'\xef\xbb\xbfdata: {"a": 1}\n\n'  # a byte order mark opens the stream
        b": keep-alive\n\n"  # a comment alone is no event
        b"event: ping\n\n"  # a name alone is one
        b"data\n\n"  # a field without a colon: empty data
        b"event: message_delta\ndata: x\ndata:  y\n\n"
        b"retry: 10\nid: 3\n\n"  # neither names nor carries: no event
        b"data: unfinished"  # dropped at the end of the body
    )

    assert EventDecoder().feed(body) == [
        ("", '{"a": 1}'),
        ("ping", ""),
        ("", ""),
        ("message_delta", "x\n y"),
    ]


def test_a_crlf_cut_between_its_two_bytes_is_one_line_end() -> None:
    decoder = EventDecoder()

    assert decoder.feed(b"data: a\r\n\r") == []
    assert decoder.feed(b"\ndata: b\r\n\r\n") == [("", "a"), ("", "b")]


def test_bytes_that_are_not_utf8_are_a_bad_response() -> None:
    with pytest.raises(ProviderError) as caught:
        EventDecoder().feed(b"data: \xff\xfe\n\n")

    assert caught.value.kind == "bad_response"


async def test_a_body_is_read_to_its_end() -> None:
    class Body:
        async def aiter_bytes(self):  # type: ignore[no-untyped-def]
            for piece in (b"data: 1\n", b"\ndata: 2\n\n", b"data: [DONE]\n\n"):
                yield piece

    assert [event async for event in server_events(Body())] == [
        ("", "1"),
        ("", "2"),
        ("", "[DONE]"),
    ]
