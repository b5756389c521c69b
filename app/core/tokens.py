"""Token counting rules: per entry (stored once, at append), per message, per request.

Counting itself is delegated to a `TokenCounter` (tiktoken's encodings live in the shell,
app.llm.tokenizers, because loading them reads files). The chat-format arithmetic follows
OpenAI's published recipe: 3 tokens per message plus its role, 1 more with a name, 3 to prime
the reply. Tool calls, tool definitions, images and documents have no published rule; the
constants below are our documented estimates, applied identically wherever a request is counted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.core.content import (
    document_of,
    image_of,
    is_reasoning,
    sendable_parts,
    without_reasoning,
)
from app.core.entries import EntryKind
from app.core.messages import Content, Message, ToolCall, ToolSpec, canonical_json, result_text

STORED_ENCODING = "o200k_base"  # entries' token_count is counted in this encoding
PER_MESSAGE = 3
PER_NAME = 1
REPLY_PRIMING = 3
PER_TOOL_CALL = 3
PER_TOOL_DEFINITION = 8
# A PDF page: both providers read each page's text and an image of it; Anthropic documents
# 1,500-3,000 text tokens a page plus the image, OpenAI publishes no rule. The top of that
# range is our estimate, so a budget refuses rather than a provider.
PDF_PAGE_TOKENS = 3000


class TokenCounter(Protocol):
    @property
    def name(self) -> str:
        """The encoding ("o200k_base", "cl100k_base") or "heuristic"."""
        ...

    def count(self, text: str) -> int: ...


# Text is cut into the pieces tiktoken-style BPE pre-tokenizers make (a word with its leading
# space, up to 3 digits, a run of symbols, a run of whitespace); each piece is at least one token.
_PIECE = re.compile(r" ?[^\W\d]+| ?\d{1,3}| ?[^\s\w]+|\s+")
# Tokens per character inside a piece, by script class. Calibrated against the larger of
# tiktoken's o200k_base and cl100k_base counts on prose, code, CJK and emoji samples
# (tests/core/token_samples.py): never under, at most ~1.3x over (~1.5x for CJK, where cl100k
# spends up to 3 tokens on a rarer character: never under comes first) (tests/core/test_tokens.py).
# Other vendors' tokenizers are not public; the margin over the larger of two OpenAI encodings
# and the +3 per text are the allowance for them.
_ASCII_LETTER = 0.18  # common words are one token; rare ones split at ~3-5 letters
_ASCII_SYMBOL = 0.3  # operators and brackets pair up: "()", "==", "->"
_TWO_BYTE = 1.0  # accented Latin, Greek, Cyrillic, Hebrew, Arabic
_HANGUL = 2.0  # cl100k spends its 3 bytes on a rarer syllable
_CJK = 1.5  # Han, kana: about one a character; cl100k up to 3 on rarer ones
_THREE_BYTE_SYMBOL = 1.5  # e.g. ☺, ❤, variation selectors, ZWJ
_FOUR_BYTE = 3.0  # emoji and other astral characters: 4 UTF-8 bytes, 2-4 tokens
_PER_TEXT = 3


def _char_tokens(char: str) -> float:
    size = len(char.encode())
    if size == 1:
        return _ASCII_LETTER if char.isalpha() or char == "_" else _ASCII_SYMBOL
    if size == 2:
        return _TWO_BYTE
    if size == 4:
        return _FOUR_BYTE
    if "\uac00" <= char <= "\ud7a3":
        return _HANGUL
    return _CJK if char.isalpha() else _THREE_BYTE_SYMBOL


_WHITESPACE_RUNS = re.compile(r"\n+|[^\n]+")


def _piece_tokens(piece: str) -> int:
    if piece.isspace():  # newlines and the indentation after them are separate tokens
        return len(_WHITESPACE_RUNS.findall(piece))
    if piece.lstrip(" ").isdigit():
        return 1
    return max(1, math.ceil(sum(_char_tokens(c) for c in piece.lstrip(" "))))


@dataclass(frozen=True)
class HeuristicCounter:
    """An estimate without a vocabulary, calibrated by script class so it is never under and
    at most ~1.3x over a real BPE count for prose, code and emoji (~1.5x for CJK)."""

    name: str = "heuristic"

    def count(self, text: str) -> int:
        if not text:
            return 0
        return _PER_TEXT + sum(_piece_tokens(p) for p in _PIECE.findall(text))


# --- Images -------------------------------------------------------------------------------
# Each model family's documented rule. OpenAI ("Images and vision" guide, "Calculating costs",
# platform.openai.com/docs/guides/images-vision#calculating-costs):
# - tiles: fit in 2048x2048, then shortest side down to 768, count 512 px tiles; tokens =
#   base + per_tile * tiles (detail "low": base only). gpt-4o/4.1/4.5/4-turbo 85+170,
#   gpt-4o-mini 2833+5667, gpt-5 70+140, o1/o3 75+150.
# - patches (gpt-4.1-mini/nano, gpt-5-mini/nano, o4-mini): 32 px patches, scaled down to fit
#   1536 of them, times a model multiplier (1.62, 2.46, 1.62, 2.46, 1.72).
# Anthropic ("Vision", "Evaluate image size", docs.anthropic.com/en/docs/build-with-claude/
# vision): tokens = width * height / 750 after scaling to a long edge of at most 1568 px and
# about 1.15-1.19 megapixels (1092x1092 for 1:1 in its table; so at most ~1600 tokens).
# An image of unknown size (a web URL) counts as the largest its rule allows: conservative.


@dataclass(frozen=True)
class ImageRule:
    family: str
    kind: Literal["tiles", "patches", "pixels"]
    base: int = 0
    per_tile: int = 0
    multiplier: float = 1.0


TILES_GPT_4O = ImageRule("gpt-4o", "tiles", 85, 170)
ANTHROPIC_IMAGES = ImageRule("anthropic", "pixels")
_OPENAI_IMAGES: tuple[tuple[str, ImageRule], ...] = (  # most specific prefix first
    ("gpt-4o-mini", ImageRule("gpt-4o-mini", "tiles", 2833, 5667)),
    ("gpt-4.1-mini", ImageRule("gpt-4.1-mini", "patches", multiplier=1.62)),
    ("gpt-4.1-nano", ImageRule("gpt-4.1-nano", "patches", multiplier=2.46)),
    ("gpt-5-mini", ImageRule("gpt-5-mini", "patches", multiplier=1.62)),
    ("gpt-5-nano", ImageRule("gpt-5-nano", "patches", multiplier=2.46)),
    ("o4-mini", ImageRule("o4-mini", "patches", multiplier=1.72)),
    ("gpt-5", ImageRule("gpt-5", "tiles", 70, 140)),
    ("o1", ImageRule("o1", "tiles", 75, 150)),
    ("o3", ImageRule("o3", "tiles", 75, 150)),
)
# Entries' stored token_count counts images by this rule; projections for models of another
# rule recount the entries that hold images.
STORED_IMAGES = TILES_GPT_4O
_MAX_PATCHES = 1536
_ANTHROPIC_LONG_EDGE = 1568
_ANTHROPIC_MAX_PIXELS = 1092 * 1092  # the docs' largest unresized 1:1 size
_ANTHROPIC_MAX_TOKENS = 1600


def image_rule_for(model: str) -> ImageRule:
    """The image rule of a "provider:name" model; the gpt-4o tiles for anything else."""
    provider, _, name = model.partition(":")
    if provider == "anthropic":
        return ANTHROPIC_IMAGES
    if provider == "openai":
        for prefix, rule in _OPENAI_IMAGES:
            if name.startswith(prefix):
                return rule
    return TILES_GPT_4O


def image_tokens(rule: ImageRule, width: int | None, height: int | None, detail: Any) -> int:
    if rule.kind == "tiles":
        if detail == "low":
            return rule.base
        if not width or not height:
            return rule.base + rule.per_tile * 8  # the most tiles a resized image can need
        return rule.base + rule.per_tile * _tiles(width, height)
    if rule.kind == "patches":
        if not width or not height:
            return math.ceil(_MAX_PATCHES * rule.multiplier)
        return math.ceil(_patches(width, height) * rule.multiplier)
    if not width or not height:
        return _ANTHROPIC_MAX_TOKENS
    scale = min(
        1.0,
        _ANTHROPIC_LONG_EDGE / max(width, height),
        math.sqrt(_ANTHROPIC_MAX_PIXELS / (width * height)),
    )
    return math.ceil(int(width * scale) * int(height * scale) / 750)


def _tiles(width: int, height: int) -> int:
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    return math.ceil(w * scale / 512) * math.ceil(h * scale / 512)


def _patches(width: int, height: int) -> int:
    patches = math.ceil(width / 32) * math.ceil(height / 32)
    if patches <= _MAX_PATCHES:
        return patches
    shrink = math.sqrt(32 * 32 * _MAX_PATCHES / (width * height))
    w, h = width * shrink / 32, height * shrink / 32
    shrink *= min(math.floor(w) / w, math.floor(h) / h)  # whole patches along each side
    return min(
        _MAX_PATCHES, math.ceil(int(width * shrink) / 32) * math.ceil(int(height * shrink) / 32)
    )


def images_of(counter: TokenCounter) -> ImageRule:
    """The image rule a counter counts by (a model's counter carries one; others the stored)."""
    rule = getattr(counter, "images", STORED_IMAGES)
    return rule if isinstance(rule, ImageRule) else STORED_IMAGES


def part_image_tokens(url: str, detail: Any, counter: TokenCounter) -> int:
    image = image_of(url)
    return image_tokens(images_of(counter), image.width, image.height, detail)


def has_images(kind: str, payload: dict[str, Any]) -> bool:
    content = payload.get("content") if kind == EntryKind.MESSAGE else None
    return isinstance(content, list) and any(p.get("type") == "image_url" for p in content)


# Roles whose content is sent as one string on the OpenAI wire, text parts joined (only text is
# sendable there, and OpenAI-compatible servers refuse lists of parts): counted joined too.
JOINED_ROLES = frozenset({"system", "assistant"})


def content_tokens(content: Content, counter: TokenCounter, role: str | None = None) -> int:
    """Content as sent, reasoning parts included (a projection leaves out those it does not
    send)."""
    if isinstance(content, str):
        return counter.count(content)
    thought = sum(reasoning_tokens(p, counter) for p in content if is_reasoning(p))
    content = tuple(without_reasoning(content))
    if role in JOINED_ROLES:
        # Reasoning alone: nothing else is sent (a projection that leaves it out sends "").
        sent = sendable_parts(role, content) if content or not thought else []
        return thought + counter.count("".join(str(p.get("text", "")) for p in sent))
    total = thought
    for part in content:
        if part.get("type") == "text":
            total += counter.count(str(part.get("text", "")))
        elif part.get("type") == "document":
            total += document_tokens(part, counter)
        else:
            total += part_image_tokens(str(part.get("url", "")), part.get("detail"), counter)
    return total


def document_tokens(part: dict[str, Any], counter: TokenCounter) -> int:
    """A document's tokens: PDF_PAGE_TOKENS a page of a PDF (one page when unreadable); a text
    document as the text it is sent as, by the counter."""
    document = document_of(part)
    if document.media_type == "application/pdf":
        return PDF_PAGE_TOKENS * max(1, document.pages or 1)
    return counter.count(document.as_text())


def _unreasoned(content: Sequence[dict[str, Any]]) -> Content:
    """Content without its reasoning, as a projection that leaves the reasoning out sends it:
    "" when nothing else was said."""
    rest = tuple(without_reasoning(content))
    return rest if rest or not any(is_reasoning(p) for p in content) else ""


def reasoning_tokens(part: dict[str, Any], counter: TokenCounter) -> int:
    """A reasoning part's tokens: its thinking text; a redacted block's or a Responses reasoning
    item's encrypted data counts as the text it stands for (base64 of about as many bytes, four
    to a token)."""
    kind = part.get("type")
    if kind == "thinking":
        return counter.count(str(part.get("thinking", "")))
    if kind == "reasoning_text":
        return counter.count(str(part.get("text", "")))
    # Encrypted: a Responses reasoning item's encrypted_content, a redacted block's data.
    sealed = part.get("encrypted_content") if kind == "reasoning" else part.get("data")
    return math.ceil(len(str(sealed or "")) * 3 / 4 / 4)


def call_tokens(call: ToolCall, counter: TokenCounter) -> int:
    return (
        PER_TOOL_CALL
        + counter.count(call.id)
        + counter.count(call.name)
        + counter.count(canonical_json(call.arguments))
    )


_ROLE_TOKENS: dict[tuple[str, str], int] = {}


def message_overhead(role: str, counter: TokenCounter) -> int:
    """What wrapping content into one message costs, beyond the content itself."""
    key = (counter.name, role)
    if key not in _ROLE_TOKENS:  # a handful of roles per encoding: tokenize each once
        _ROLE_TOKENS[key] = counter.count(role)
    return PER_MESSAGE + _ROLE_TOKENS[key]


def name_tokens(name: str | None, counter: TokenCounter) -> int:
    return PER_NAME + counter.count(name) if name else 0


def message_tokens(message: Message, counter: TokenCounter) -> int:
    total = message_overhead(message.role, counter)
    total += content_tokens(message.content, counter, message.role)
    total += name_tokens(message.name, counter)
    total += sum(call_tokens(c, counter) for c in message.tool_calls)
    if message.tool_call_id is not None:
        total += counter.count(message.tool_call_id)
    return total


def tools_tokens(tools: Iterable[ToolSpec], counter: TokenCounter) -> int:
    return sum(
        PER_TOOL_DEFINITION
        + counter.count(
            canonical_json(
                {"name": t.name, "description": t.description, "parameters": t.parameters}
            )
        )
        for t in tools
    )


def request_tokens(
    messages: Sequence[Message], tools: Sequence[ToolSpec], counter: TokenCounter
) -> int:
    """The whole request, counted from its messages: the reference the projector must match."""
    return (
        REPLY_PRIMING
        + sum(message_tokens(m, counter) for m in messages)
        + tools_tokens(tools, counter)
    )


def entry_tokens(
    kind: EntryKind, payload: dict[str, Any], refs: dict[str, Any], counter: TokenCounter
) -> int:
    """An entry's share of any request it appears in, without the per-message overhead.

    Stored as the entry's token_count when it is appended, so a projection adds counts instead
    of re-tokenizing history.
    """
    if kind == EntryKind.MESSAGE:
        # Reasoning is not counted here: a projection sends it only within the tool loop it
        # belongs to, and counts it there (app.core.projection).
        content = payload["content"]
        parts = content if isinstance(content, str) else _unreasoned(content)
        role = str(payload.get("role"))
        return content_tokens(parts, counter, role) + name_tokens(payload.get("name"), counter)
    if kind == EntryKind.TOOL_CALL:
        call = ToolCall(str(refs.get("tool_call_id", "")), payload["name"], payload["arguments"])
        return call_tokens(call, counter)
    if kind == EntryKind.TOOL_RESULT:
        return counter.count(result_text(payload.get("content"))) + counter.count(
            str(refs.get("tool_call_id", ""))
        )
    if kind == EntryKind.SUMMARY:
        return counter.count(str(payload["content"]))
    return 0  # run records, usage, errors, rollbacks: never sent to a model
