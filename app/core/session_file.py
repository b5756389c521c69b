"""The session file (JSON Lines): its lines, their order, and what a file must hold to import.

A file is a header line, then every entry of the thread in seq order (a fork's inherited prefix
included), then the memory namespaces it uses if asked for, then an end line counting the
entries. Each line is one JSON object with a `type`. A file cut short (no end line, or a count
that does not match) is refused, as is anything that is not exactly this shape; the entries'
payloads and ranges are then checked by the journal's append validation, not here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from app.core.entries import MAX_ENTRY_SEQ, EntryKind

FORMAT = "threadline.session"
VERSION = 1
# A line holds one entry: an inline image or a thinking block is up to 2 MB of text, and JSON
# escapes can double it; no entry an append accepts comes near this.
MAX_LINE_BYTES = 16 * 1024 * 1024


class FileProblem(ValueError):
    """Why a session file cannot be imported; `line` is 1-based (0: the file as a whole)."""

    def __init__(self, code: str, message: str, line: int, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.line = line
        self.details = {"line": line, **details}


class LineTooLong(FileProblem):
    """A line longer than MAX_LINE_BYTES: refused before the rest of it is read."""


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ForkOrigin(_Line):
    session_id: str
    fork_seq: Annotated[int, Field(ge=0, le=MAX_ENTRY_SEQ)]


class SessionFields(BaseModel):
    """The session's own fields; `config` is checked as a create request's config is."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    title: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    # The agent version the session was pinned to, for the record: `config` is the resolved
    # config, so an import needs no agent (it makes a session of its own config).
    agent: str | None = None
    agent_version: int | None = None
    fork_origin: ForkOrigin | None = None
    # Written by earlier versions (the coordinate their windowing used); read and ignored.
    token_total: Annotated[int, Field(ge=0)] | None = None


class Header(_Line):
    type: Literal["header"]
    format: str
    version: int
    session: SessionFields


class EntryLine(_Line):
    type: Literal["entry"]
    seq: Annotated[int, Field(ge=1, le=MAX_ENTRY_SEQ)]
    id: Annotated[str, Field(min_length=1, max_length=255)]
    kind: Annotated[EntryKind, Field(strict=False)]
    payload: dict[str, Any]
    refs: dict[str, Any] = Field(default_factory=dict)
    # Informational on import: the journal counts every entry it stores itself.
    token_count: Annotated[int, Field(ge=0)] | None = None
    created_at: Annotated[AwareDatetime, Field(strict=False)]


class MemoryLine(_Line):
    type: Literal["memory"]
    namespace: str
    content: str


class EndLine(_Line):
    type: Literal["end"]
    entries: Annotated[int, Field(ge=0)]


def header_line(session: dict[str, Any]) -> dict[str, Any]:
    return {"type": "header", "format": FORMAT, "version": VERSION, "session": session}


def entry_line(
    seq: int,
    id: str,
    kind: str,
    payload: Any,
    refs: Any,
    token_count: int,
    created_at: datetime,
) -> dict[str, Any]:
    return {
        "type": "entry",
        "seq": seq,
        "id": id,
        "kind": kind,
        "payload": payload,
        "refs": refs,
        "token_count": token_count,
        "created_at": created_at.isoformat(),
    }


def encode(line: dict[str, Any]) -> bytes:
    """One line of the file: compact UTF-8 JSON and its newline."""
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


@dataclass
class LineSplitter:
    """Cuts a byte stream into lines without ever holding more than one line (and one chunk):
    a line past MAX_LINE_BYTES is refused as soon as that many bytes arrive without a newline."""

    max_line: int = MAX_LINE_BYTES
    _buffer: bytearray = field(default_factory=bytearray)
    line_no: int = 0

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        self._buffer += chunk
        start = 0
        while (end := self._buffer.find(b"\n", start)) >= 0:
            self.line_no += 1
            if end - start > self.max_line:
                raise self._too_long()
            yield bytes(self._buffer[start:end])
            start = end + 1
        del self._buffer[:start]
        if len(self._buffer) > self.max_line:
            self.line_no += 1
            raise self._too_long()

    def rest(self) -> Iterator[bytes]:
        """The last line, when the file does not end with a newline."""
        if self._buffer:
            self.line_no += 1
            yield bytes(self._buffer)
            self._buffer.clear()

    def _too_long(self) -> LineTooLong:
        return LineTooLong(
            "line_too_long",
            f"line {self.line_no} is longer than {self.max_line} bytes",
            self.line_no,
            max_bytes=self.max_line,
        )


_LINE_TYPES: dict[str, type[_Line]] = {
    "header": Header,
    "entry": EntryLine,
    "memory": MemoryLine,
    "end": EndLine,
}


def parse_line(raw: bytes, line_no: int) -> Header | EntryLine | MemoryLine | EndLine:
    """One line as its typed value; FileProblem when it is not JSON or not a known line."""
    if not raw.strip():
        raise FileProblem("blank_line", f"line {line_no} is empty", line_no)
    try:
        value = json.loads(raw)
        # JSON may escape a lone surrogate, which no UTF-8 (so no Postgres text) can hold.
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeError as exc:
        raise FileProblem(
            "invalid_unicode", f"line {line_no} is not valid Unicode text", line_no
        ) from exc
    except ValueError as exc:
        raise FileProblem("invalid_json", f"line {line_no} is not JSON: {exc}", line_no) from exc
    kind = value.get("type") if isinstance(value, dict) else None
    model = _LINE_TYPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise FileProblem(
            "unknown_line",
            f"line {line_no} is not a header, entry, memory or end line",
            line_no,
        )
    try:
        parsed = model.model_validate(value)
    except ValidationError as exc:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        where = ".".join(str(p) for p in errors[0]["loc"])
        raise FileProblem(
            f"invalid_{kind}_line",
            f"line {line_no}: {where}: {errors[0]['msg']}",
            line_no,
            errors=errors,
        ) from exc
    assert isinstance(parsed, Header | EntryLine | MemoryLine | EndLine)
    return parsed


def check_header(line: Header | EntryLine | MemoryLine | EndLine) -> Header:
    """The first line: a header of this format and version."""
    if not isinstance(line, Header) or line.format != FORMAT:
        raise FileProblem("not_a_session_file", f"the first line must be a {FORMAT} header", 1)
    if line.version != VERSION:
        raise FileProblem(
            "unsupported_version",
            f"this is version {line.version} of {FORMAT}; this server reads version {VERSION}",
            1,
            version=line.version,
            supported=[VERSION],
        )
    return line


@dataclass
class ThreadCheck:
    """What an import checks across lines: seqs dense from 1, each tool result answering a
    call earlier in the thread, entries before memory before the end line, and an end line
    that counts them. Holds the thread's tool call ids, nothing else of its entries."""

    last_seq: int = 0
    ended: bool = False
    in_memory: bool = False
    calls: set[str] = field(default_factory=set)

    def accept(self, line: Header | EntryLine | MemoryLine | EndLine, line_no: int) -> None:
        """Check the line after the header at `line_no`."""
        if isinstance(line, EntryLine):
            self.entry(line, line_no)
        elif isinstance(line, MemoryLine):
            self.memory(line_no)
        elif isinstance(line, EndLine):
            self.end(line, line_no)
        else:
            raise FileProblem("misplaced_line", f"line {line_no}: a second header", line_no)

    def entry(self, line: EntryLine, line_no: int) -> None:
        self._open(line_no)
        if self.in_memory:
            raise FileProblem(
                "misplaced_line", f"line {line_no}: entries come before memory", line_no
            )
        if line.seq != self.last_seq + 1:
            raise FileProblem(
                "seq_not_dense",
                f"line {line_no}: seq {line.seq} where seq {self.last_seq + 1} is due; seqs run "
                "1, 2, 3… with none repeated or skipped",
                line_no,
                seq=line.seq,
                expected=self.last_seq + 1,
            )
        call_id = line.refs.get("tool_call_id")
        if line.kind == EntryKind.TOOL_RESULT and call_id not in self.calls:
            raise FileProblem(
                "tool_result_without_call",
                f"line {line_no}: the tool result for {call_id!r} answers no earlier tool call",
                line_no,
                tool_call_id=call_id,
            )
        if line.kind == EntryKind.TOOL_CALL and isinstance(call_id, str):
            self.calls.add(call_id)
        self.last_seq = line.seq

    def memory(self, line_no: int) -> None:
        self._open(line_no)
        self.in_memory = True

    def end(self, line: EndLine, line_no: int) -> None:
        self._open(line_no)
        if line.entries != self.last_seq:
            raise FileProblem(
                "entry_count_mismatch",
                f"the end line counts {line.entries} entries, the file holds {self.last_seq}",
                line_no,
                declared=line.entries,
                found=self.last_seq,
            )
        self.ended = True

    def finish(self, line_no: int) -> None:
        if not self.ended:
            raise FileProblem(
                "truncated",
                f"the file ends at line {line_no} without its end line: it was cut short",
                line_no,
            )

    def _open(self, line_no: int) -> None:
        if self.ended:
            raise FileProblem("misplaced_line", f"line {line_no} comes after the end line", line_no)
