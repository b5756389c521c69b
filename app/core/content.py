"""What every provider accepts as message content: the rules checked at the door, image sizes,
and the one visible conversion of stored content that breaks a rule.

A session may switch model per ask, per PATCH and by failover, so content must suit every
provider a session may use: the rules are what both OpenAI Chat Completions and Anthropic
Messages accept.
- Images only in user messages (OpenAI: image_url parts are user-only; Anthropic: the system
  parameter takes text blocks only, and an image is input, not something the assistant said).
- An image is an http(s) URL or a base64 data URL of image/jpeg, image/png, image/gif or
  image/webp (the four types both document), whose bytes are that type and at most 8000 px a
  side (Anthropic refuses larger).
- Documents only in user messages: a base64 data URL of application/pdf (bytes that open as
  an unencrypted PDF, as both providers require) or text/plain (UTF-8), with an optional
  filename (OpenAI needs one: a default is sent). Their size cap is the deployment's
  (`max_document_bytes`, checked with the model's abilities by app/services/content_checks.py).
- A list of parts is not empty, and a text part has non-whitespace text (Anthropic refuses
  empty text blocks; OpenAI refuses an empty content array).
- Reasoning parts (a model's thinking: Anthropic's `thinking` with its signature and
  `redacted_thinking` with its data; OpenAI Responses' `reasoning` item with its id,
  encrypted_content and summary; `reasoning_text`, the readable reasoning an OpenAI-compatible
  server streams) only in assistant messages, their opaque fields non-empty: the provider checks
  them, so they are kept byte for byte, and a projection decides per provider what is sent back.
  A part the model wrote after some of its turn's tool calls says how many
  (`tool_calls_before`, typed in app/core/entries.py): it goes back in its place among them.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
MAX_IMAGE_SIDE = 8000
IMAGE_ROLES = frozenset({"user"})
DOCUMENT_MEDIA_TYPES = frozenset({"application/pdf", "text/plain"})
DOCUMENT_ROLES = frozenset({"user"})
MAX_FILENAME_CHARS = 255
# What both providers take in one request (Anthropic: 32 MB a request; OpenAI: 32 MB of files
# a request): the default of the configurable cap.
MAX_DOCUMENT_BYTES = 32 * 1024 * 1024
ANTHROPIC_REASONING = frozenset({"thinking", "redacted_thinking"})
OPENAI_REASONING = frozenset({"reasoning"})  # a Responses API reasoning item
# Readable reasoning of an OpenAI-compatible server (reasoning_content): those APIs take none back.
TEXT_REASONING = frozenset({"reasoning_text"})
# On a reasoning part the model wrote after some of its turn's tool calls (interleaved thinking):
# how many, so that it goes back to the provider in its place among them.
TOOL_CALLS_BEFORE = "tool_calls_before"
REASONING_TYPES = ANTHROPIC_REASONING | OPENAI_REASONING | TEXT_REASONING
REASONING_ROLES = frozenset({"assistant"})
_DATA_URL = re.compile(r"data:([^;,]*);base64,(.*)", re.DOTALL)
# A host, then no whitespace or control characters anywhere (both providers fetch it).
_WEB_URL = re.compile(r"https?://[^\s/?#\x00-\x1f\x7f]+[^\s\x00-\x1f\x7f]*")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")

# Stable rule codes (the `type` of each error a refusal lists).
EMPTY_CONTENT = "empty_content"
BLANK_TEXT = "blank_text"
IMAGE_ROLE = "image_not_allowed_in_role"
IMAGE_URL = "invalid_image_url"
IMAGE_MEDIA_TYPE = "unsupported_image_type"
IMAGE_BASE64 = "invalid_base64"
IMAGE_BYTES = "image_type_mismatch"
IMAGE_SIDE = "image_too_large"
NOT_A_PART = "invalid_part"
UNKNOWN_PART = "unknown_part_type"
DOCUMENT_ROLE = "document_not_allowed_in_role"
DOCUMENT_URL = "invalid_document_url"
DOCUMENT_MEDIA_TYPE = "unsupported_document_type"
DOCUMENT_BYTES = "document_type_mismatch"
DOCUMENT_SIZE = "document_too_large"
DOCUMENT_FILENAME = "invalid_filename"
REASONING_ROLE = "reasoning_not_allowed_in_role"
REASONING_FIELDS = "invalid_reasoning"
RULES = frozenset(
    {EMPTY_CONTENT, BLANK_TEXT, IMAGE_ROLE, IMAGE_URL, IMAGE_MEDIA_TYPE, IMAGE_BASE64}
    | {IMAGE_BYTES, IMAGE_SIDE, NOT_A_PART, UNKNOWN_PART, REASONING_ROLE, REASONING_FIELDS}
    | {DOCUMENT_ROLE, DOCUMENT_URL, DOCUMENT_MEDIA_TYPE, DOCUMENT_BYTES, DOCUMENT_SIZE}
    | {DOCUMENT_FILENAME}
)


@dataclass(frozen=True, slots=True)
class ContentProblem:
    loc: tuple[str | int, ...]  # relative to the content: (1, "url") is content[1].url
    rule: str
    message: str

    def as_error(self, *prefix: str | int) -> dict[str, Any]:
        """The pydantic-style error dict the API lists in `details.errors`."""
        return {"loc": [*prefix, *self.loc], "msg": self.message, "type": self.rule}


@dataclass(frozen=True, slots=True)
class Image:
    """An image part as providers read it: inline bytes' type and size when known."""

    media_type: str | None  # None: a web URL, fetched by the provider
    width: int | None = None
    height: int | None = None


def content_problems(role: str, content: str | Sequence[Any]) -> list[ContentProblem]:
    """Everything in a message's content that some provider would refuse; [] when none."""
    if isinstance(content, str):
        return []
    if not content:
        return [ContentProblem((), EMPTY_CONTENT, "content needs at least one part")]
    problems: list[ContentProblem] = []
    for at, part in enumerate(content):
        problems += [
            ContentProblem((at, *p.loc), p.rule, p.message) for p in part_problems(role, part)
        ]
    return problems


def part_problems(role: str, part: Any) -> list[ContentProblem]:
    if not isinstance(part, dict):
        return [ContentProblem((), NOT_A_PART, "a part must be an object")]
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str) or not text.strip():
            return [ContentProblem(("text",), BLANK_TEXT, "a text part needs non-blank text")]
        return []
    if kind == "image_url":
        if role not in IMAGE_ROLES:
            return [
                ContentProblem(
                    ("type",), IMAGE_ROLE, f"{role} messages cannot carry images (only user)"
                )
            ]
        return [ContentProblem(("url",), r, m) for r, m in _url_problems(part.get("url"))]
    if kind == "document":
        return _document_problems(role, part)
    if kind in REASONING_TYPES:
        return _reasoning_problems(role, part)
    return [ContentProblem(("type",), UNKNOWN_PART, f"unknown part type {kind!r}")]


@dataclass(frozen=True, slots=True)
class Document:
    """A (valid) document part as providers read it."""

    media_type: str
    data: str  # the base64 payload
    filename: str

    @property
    def size(self) -> int:
        """Its bytes, from the base64's length (no decoding)."""
        return len(self.data) * 3 // 4 - len(self.data) + len(self.data.rstrip("="))

    @property
    def pages(self) -> int | None:
        """A PDF's page count (None for text)."""
        return pdf_pages(self.data) if self.media_type == "application/pdf" else None

    def text(self) -> str:
        """A text document's text."""
        return (decode_base64(self.data) or b"").decode("utf-8", "replace")

    def as_text(self) -> str:
        """A text document where it travels as text (OpenAI, compat and local models): its
        name, then its text."""
        return f"{self.filename}:\n\n{self.text()}"


DEFAULT_FILENAMES = {"application/pdf": "document.pdf", "text/plain": "document.txt"}


def document_of(part: dict[str, Any]) -> Document:
    """What a (valid) document part holds."""
    data = _DATA_URL.fullmatch(str(part.get("url", "")))
    media_type, encoded = (data.group(1), data.group(2)) if data else ("text/plain", "")
    filename = part.get("filename")
    if not isinstance(filename, str) or not filename:
        filename = DEFAULT_FILENAMES.get(media_type, "document")
    return Document(media_type, encoded, filename)


def _document_problems(role: str, part: dict[str, Any]) -> list[ContentProblem]:
    if role not in DOCUMENT_ROLES:
        message = f"{role} messages cannot carry documents (only user)"
        return [ContentProblem(("type",), DOCUMENT_ROLE, message)]
    filename = part.get("filename")
    if filename is not None and (
        not isinstance(filename, str)
        or not filename.strip()
        or len(filename) > MAX_FILENAME_CHARS
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in filename)
        or "/" in filename
    ):
        message = f"a filename is a non-blank name of at most {MAX_FILENAME_CHARS} characters, "
        message += "without slashes or control characters"
        return [ContentProblem(("filename",), DOCUMENT_FILENAME, message)]
    url = part.get("url")
    data = _DATA_URL.fullmatch(url) if isinstance(url, str) else None
    if data is None:
        message = "a document url must be data:<type>;base64,... (application/pdf or text/plain)"
        return [ContentProblem(("url",), DOCUMENT_URL, message)]
    media_type, encoded = data.group(1), data.group(2)
    if media_type not in DOCUMENT_MEDIA_TYPES:
        allowed = ", ".join(sorted(DOCUMENT_MEDIA_TYPES))
        message = f"document type {media_type[:64]!r} is not one of {allowed}"
        return [ContentProblem(("url",), DOCUMENT_MEDIA_TYPE, message)]
    raw = decode_base64(encoded)
    if raw is None:
        message = "the data URL's payload is not valid, non-empty base64"
        return [ContentProblem(("url",), IMAGE_BASE64, message)]
    problem = _pdf_problem(raw) if media_type == "application/pdf" else _text_problem(raw)
    return [] if problem is None else [ContentProblem(("url",), DOCUMENT_BYTES, problem)]


def _text_problem(raw: bytes) -> str | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "the data is not UTF-8 text, not text/plain"
    if not text.strip():
        return "a text document needs non-blank text"
    return None


def _pdf_problem(raw: bytes) -> str | None:
    if not raw.lstrip(b"\x00\t\n\r ").startswith(b"%PDF-"):
        return "the data is not a PDF (no %PDF- header)"
    reader = _pdf_reader(raw)
    if reader is None:
        return "the data is not a readable PDF"
    if reader.is_encrypted:
        return "the PDF is encrypted (providers read unencrypted PDFs only)"
    try:
        if len(reader.pages) == 0:
            return "the PDF has no pages"
    except Exception:  # pypdf raises many kinds on a damaged page tree
        return "the data is not a readable PDF (its page tree is damaged)"
    return None


def _pdf_reader(raw: bytes) -> Any:
    from pypdf import PdfReader  # parsing bytes in memory: no I/O

    try:
        return PdfReader(io.BytesIO(raw), strict=False)
    except Exception:  # pypdf raises many kinds (PdfReadError, ValueError, KeyError...)
        return None


@lru_cache(maxsize=64)
def pdf_pages(encoded: str) -> int | None:
    """The page count of a base64 PDF (None: unreadable); kept, as projections count often."""
    raw = decode_base64(encoded)
    reader = _pdf_reader(raw) if raw is not None else None
    try:
        return len(reader.pages) if reader is not None else None
    except Exception:  # a damaged page tree
        return None


def is_document(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "document"


def _reasoning_problems(role: str, part: dict[str, Any]) -> list[ContentProblem]:
    if role not in REASONING_ROLES:
        message = f"{role} messages cannot carry reasoning (only assistant)"
        return [ContentProblem(("type",), REASONING_ROLE, message)]
    if part["type"] == "reasoning":
        return _reasoning_item_problems(part)
    # What the provider needs back unchanged: a thinking block's text and its signature, a
    # redacted block's encrypted data; a text-only reasoning part's text.
    required = _REQUIRED_FIELDS[part["type"]]
    for name in required:
        value = part.get(name)
        if not isinstance(value, str) or (name != "thinking" and not value):
            message = f"a {part['type']} part needs {name} (a non-empty string from the provider)"
            return [ContentProblem((name,), REASONING_FIELDS, message)]
    return []


_REQUIRED_FIELDS = {
    "thinking": ("thinking", "signature"),
    "redacted_thinking": ("data",),
    "reasoning_text": ("text",),
}


def _reasoning_item_problems(part: dict[str, Any]) -> list[ContentProblem]:
    """A Responses reasoning item: its id and encrypted content (what the API decrypts when it
    comes back), and its summary, a list of summary_text parts."""
    for name in ("id", "encrypted_content"):
        value = part.get(name)
        if not isinstance(value, str) or not value:
            message = f"a reasoning part needs {name} (a non-empty string from the provider)"
            return [ContentProblem((name,), REASONING_FIELDS, message)]
    summary = part.get("summary")
    if not isinstance(summary, list) or not all(
        isinstance(s, dict) and s.get("type") == "summary_text" and isinstance(s.get("text"), str)
        for s in summary
    ):
        message = 'a reasoning part\'s summary is a list of {"type": "summary_text", "text"}'
        return [ContentProblem(("summary",), REASONING_FIELDS, message)]
    return []


def is_reasoning(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in REASONING_TYPES


def reasoning_text(part: dict[str, Any]) -> str:
    """A reasoning part's text to show a person, whatever its provider's type: a thinking
    block's thinking, a summary's texts joined; "" for reasoning the provider encrypted (a
    redacted block). Every surface shows stored reasoning through this one function."""
    if part.get("type") == "thinking":
        return str(part.get("thinking") or "")
    summary = part.get("summary")
    if isinstance(summary, list):
        texts = [str(s.get("text", "")) for s in summary if isinstance(s, dict)]
        return "\n\n".join(t for t in texts if t)
    text = part.get("text")
    return text if isinstance(text, str) else ""


def is_redacted(part: dict[str, Any]) -> bool:
    """A reasoning part the provider encrypted whole: it has no text to show."""
    return part.get("type") == "redacted_thinking"


def reasoning_opaque(part: dict[str, Any]) -> str | None:
    """What the provider gave to check or decrypt a reasoning part (a thinking block's
    signature, a redacted block's data, encrypted content), byte for byte; None if none."""
    for name in ("signature", "data", "encrypted_content"):
        value = part.get(name)
        if isinstance(value, str) and value:
            return value
    return None


# What a JSON string in Postgres (jsonb) cannot hold: the NUL character, and a lone surrogate
# (not Unicode, so not UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable(value: Any) -> str | None:
    """Why the journal cannot keep `value` (JSON) byte for byte: the first character a text of
    it holds that Postgres stores no text with; None when it can."""
    if isinstance(value, str):
        found = _UNSTORABLE.search(value)
        if found is None:
            return None
        what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
        return f"it holds {what} (U+{ord(found.group()):04X}) at {found.start()}"
    if isinstance(value, dict):
        values: list[Any] = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        values = value
    else:
        return None
    return next((why for v in values if (why := unstorable(v)) is not None), None)


def without_reasoning(
    content: Sequence[dict[str, Any]], kept: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """The parts that are not reasoning, save reasoning of the `kept` types: what a provider
    that takes back only its own kind of reasoning (or none) gets."""
    return [p for p in content if not is_reasoning(p) or p["type"] in kept]


def _url_problems(url: Any) -> list[tuple[str, str]]:
    if not isinstance(url, str):
        return [(IMAGE_URL, "an image url must be a string")]
    if _WEB_URL.fullmatch(url):
        return []
    data = _DATA_URL.fullmatch(url)
    if data is None:
        return [(IMAGE_URL, "an image url must be http(s)://host... or data:<type>;base64,...")]
    media_type, encoded = data.group(1), data.group(2)
    if media_type not in IMAGE_MEDIA_TYPES:
        allowed = ", ".join(sorted(IMAGE_MEDIA_TYPES))
        return [(IMAGE_MEDIA_TYPE, f"image type {media_type[:64]!r} is not one of {allowed}")]
    raw = decode_base64(encoded)
    if raw is None:
        return [(IMAGE_BASE64, "the data URL's payload is not valid, non-empty base64")]
    found = sniff_image(raw)
    if found is None or found.media_type != media_type:
        what = found.media_type if found else "not a recognizable image"
        return [(IMAGE_BYTES, f"the data is {what}, not {media_type}")]
    if found.width is None or found.height is None:
        return [(IMAGE_BYTES, f"the data is a truncated {media_type} (no size in its header)")]
    if max(found.width, found.height) > MAX_IMAGE_SIDE:
        return [(IMAGE_SIDE, f"{found.width}x{found.height} px exceeds {MAX_IMAGE_SIDE} px a side")]
    return []


def decode_base64(encoded: str) -> bytes | None:
    """Strict standard base64 (no whitespace, correct padding); None if invalid or empty."""
    if not encoded or len(encoded) % 4 or not _BASE64.fullmatch(encoded):
        return None
    try:
        return base64.b64decode(encoded, validate=True) or None
    except (binascii.Error, ValueError):
        return None


def image_of(url: str) -> Image:
    """What a (valid) image url holds: a web image of unknown size, or inline bytes' size."""
    data = _DATA_URL.fullmatch(url)
    if data is None:
        return Image(None)
    raw = decode_base64(data.group(2))
    found = sniff_image(raw) if raw is not None else None
    return found or Image(data.group(1))


def sniff_image(raw: bytes) -> Image | None:
    """The type and pixel size an image's own header declares (PNG, GIF, WebP, JPEG)."""
    if raw.startswith(b"\x89PNG\r\n\x1a\n") and raw[12:16] == b"IHDR" and len(raw) >= 24:
        width, height = struct.unpack(">II", raw[16:24])
        return Image("image/png", width, height)
    if raw[:6] in (b"GIF87a", b"GIF89a") and len(raw) >= 10:
        width, height = struct.unpack("<HH", raw[6:10])
        return Image("image/gif", width, height)
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return _webp(raw)
    if raw[:3] == b"\xff\xd8\xff":
        return _jpeg(raw)
    return None


def _webp(raw: bytes) -> Image:
    chunk = raw[12:16]
    if chunk == b"VP8 " and len(raw) >= 30:
        width, height = struct.unpack("<HH", raw[26:30])
        return Image("image/webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(raw) >= 25:
        bits = int.from_bytes(raw[21:25], "little")
        return Image("image/webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(raw) >= 30:
        width = int.from_bytes(raw[24:27], "little") + 1
        height = int.from_bytes(raw[27:30], "little") + 1
        return Image("image/webp", width, height)
    return Image("image/webp")


_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg(raw: bytes) -> Image:
    at = 2
    while at + 4 <= len(raw):
        if raw[at] != 0xFF:
            break
        marker = raw[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            at += 2
            continue
        length = int.from_bytes(raw[at + 2 : at + 4], "big")
        if marker in _JPEG_FRAMES and at + 9 <= len(raw):
            height, width = struct.unpack(">HH", raw[at + 5 : at + 9])
            return Image("image/jpeg", width, height)
        at += 2 + length
    return Image("image/jpeg")


def sendable_parts(role: str, parts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parts as they may be sent: a part that breaks a rule (stored before the rules were
    checked at the door) becomes a text note saying what was not sent, never vanishes; an empty
    list becomes a placeholder."""
    sendable: list[dict[str, Any]] = []
    for part in parts:
        problems = part_problems(role, part)
        if not problems or problems[0].rule == BLANK_TEXT:
            sendable.append(dict(part))  # blank text is harmless; formats drop it where needed
        else:
            what = {"image_url": "image", "document": "document"}.get(str(part.get("type")), "part")
            sendable.append({"type": "text", "text": f"[{what} not sent: {problems[0].message}]"})
    return sendable or [{"type": "text", "text": EMPTY_NOTE}]


EMPTY_NOTE = "(empty)"
