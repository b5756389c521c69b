"""Server-sent events read from a provider's streamed body, lean.

The SDKs decode a stream line by line through several generators per event; that, more than the
network, was the CPU of a streamed answer. Here each block of bytes read is split into events at
once (one split for the blank lines, one for the fields), as the SSE spec reads them: lines end
in LF, CRLF or CR; a line starting with ":" is a comment; "data" lines join with LF; an event is
dispatched at a blank line when it named an event or carried data; an unfinished event at the
end of the body is dropped. The SDKs still build the request, authenticate, and raise their
errors for a refused one; the providers read what this yields.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from app.llm.base import ProviderError

# (event name, "" when the event named none; data)
Event = tuple[str, str]


class ByteStream(Protocol):
    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


class EventDecoder:
    """Bytes in, whole events out; what is left of an unfinished event waits for the next."""

    def __init__(self) -> None:
        self._pending = b""
        self._started = False

    def feed(self, data: bytes) -> list[Event]:
        if not self._started and data:
            self._started = True
            if data.startswith(b"\xef\xbb\xbf"):  # a byte order mark opens the stream at most
                data = data[3:]
        return self._events(self._pending + data if self._pending else data, final=False)

    def finish(self) -> list[Event]:
        """The events the end of the body completes: a CR held back from the last read was a
        line end after all. An event still unfinished is dropped."""
        pending, self._pending = self._pending, b""
        return self._events(pending, final=True)

    def _events(self, pending: bytes, final: bool) -> list[Event]:
        held = b""
        if b"\r" in pending:
            if pending.endswith(b"\r") and not final:
                # Maybe the first half of a CRLF: the next byte says.
                pending, held = pending[:-1], b"\r"
            pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        blocks = pending.split(b"\n\n")
        self._pending = blocks.pop() + held
        events: list[Event] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                events.append(("", _text(block[6:])))  # the usual event: one data line
            elif block:
                event = _event(block)
                if event is not None:
                    events.append(event)
        return events


def _event(block: bytes) -> Event | None:
    name: str | None = None
    data: list[str] = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        field, colon, value = line.partition(b":")
        if colon and value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data.append(_text(value))
        elif field == b"event":
            name = _text(value)
    if name is None and not data:
        return None
    return name or "", "\n".join(data)


def _text(value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError as error:
        raise ProviderError(
            "bad_response", f"the provider streamed bytes that are not UTF-8: {error}"
        ) from error


async def server_events(body: ByteStream) -> AsyncIterator[Event]:
    """The events of a streamed response body, read to its end."""
    decoder = EventDecoder()
    async for data in body.aiter_bytes():
        for event in decoder.feed(data):
            yield event
    for event in decoder.finish():
        yield event
