"""Provider wire formats (pure): neutral messages -> OpenAI chat completions / OpenAI Responses
input / Anthropic Messages, and the token count of an OpenAI request as sent.

The validators of each provider's rules are test oracles: tests/core/format_oracles.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from app.core.content import (
    ANTHROPIC_REASONING,
    OPENAI_REASONING,
    TOOL_CALLS_BEFORE,
    document_of,
    is_reasoning,
    sendable_parts,
    without_reasoning,
)
from app.core.messages import Content, Message, ToolCall, ToolSpec, canonical_json, text_of
from app.core.tokens import (
    JOINED_ROLES,
    PER_MESSAGE,
    PER_NAME,
    PER_TOOL_CALL,
    PER_TOOL_DEFINITION,
    REPLY_PRIMING,
    TokenCounter,
    document_tokens,
    part_image_tokens,
)

Json = dict[str, Any]

EMPTY_PLACEHOLDER = "(empty)"
SYSTEM_NOTE_PREFIX = "System note: "
_DATA_URL = re.compile(r"data:([^;,]+);base64,(.*)", re.DOTALL)


# --- Neutral (JSON of the dataclasses) ---------------------------------------------------


def to_neutral(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Json:
    """The neutral messages as JSON: unset optional fields left out, "tools" only when any."""
    request: Json = {"messages": [_neutral_message(m) for m in messages]}
    if tools:
        request["tools"] = [
            {"name": t.name, "description": t.description, "parameters": _canonical(t.parameters)}
            for t in tools
        ]
    return request


def _neutral_message(message: Message) -> Json:
    content = message.content
    wire: Json = {
        "role": message.role,
        "content": content if isinstance(content, str) else [dict(p) for p in content],
    }
    if message.name is not None:
        wire["name"] = message.name
    if message.tool_calls:
        wire["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": _canonical(c.arguments)}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.is_error:
        wire["is_error"] = True
    return wire


# --- OpenAI Chat Completions -------------------------------------------------------------


def to_openai(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Json:
    request: Json = {"messages": [_openai_message(m) for m in messages]}
    if tools:
        request["tools"] = [_openai_tool(t) for t in tools]
    return request


def _openai_message(message: Message) -> Json:
    if message.role == "tool":
        # OpenAI tool messages carry no name; neutral tool content is already text.
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id or "",
            "content": text_of(message.content),
        }
    wire: Json = {
        "role": message.role,
        "content": _openai_content(message.role, message.content),
    }
    if message.name:
        wire["name"] = message.name
    if message.tool_calls:
        # "" rather than null: OpenAI takes either, but llama.cpp's server (and others that
        # render a chat template) answer a null content with a 500.
        wire["content"] = wire["content"] if text_of(message.content) else ""
        wire["tool_calls"] = [_openai_call(c) for c in message.tool_calls]
    return wire


def _openai_content(role: str, content: Content) -> str | list[Json]:
    if isinstance(content, str):
        return content
    # Chat Completions takes no reasoning back (its models' is not ours to send).
    parts = [_openai_part(p) for p in sendable_parts(role, without_reasoning(content))]
    if role in JOINED_ROLES:
        # Only text is sendable in these roles; it goes as one string: OpenAI reads text parts
        # joined as they are, and OpenAI-compatible servers (llama.cpp's among them) refuse a
        # list of parts there (a summary's system turn was answered with a 500).
        return "".join(str(p["text"]) for p in parts)
    return parts


def _openai_part(part: Json) -> Json:
    if part.get("type") == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if part.get("type") == "image_url":
        image: Json = {"url": part["url"]}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if part.get("type") == "document":
        # Chat Completions reads PDFs as `file` parts; text is sent as text (a file part takes
        # PDFs only), as OpenAI-compatible servers read it too.
        document = document_of(part)
        if document.media_type == "application/pdf":
            file = {"filename": document.filename, "file_data": str(part["url"])}
            return {"type": "file", "file": file}
        return {"type": "text", "text": document.as_text()}
    raise ValueError(f"unknown content part type: {part.get('type')!r}")


def responses_document(part: Json) -> Json:
    """A document part as OpenAI's Responses API takes it in a user message (for a Responses
    upstream): a PDF as an `input_file` with its file_data and filename, text as input_text
    (as Chat Completions gets it)."""
    document = document_of(part)
    if document.media_type == "application/pdf":
        return {"type": "input_file", "filename": document.filename, "file_data": part["url"]}
    return {"type": "input_text", "text": document.as_text()}


def _openai_call(call: ToolCall) -> Json:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": canonical_json(call.arguments)},
    }


def _openai_tool(tool: ToolSpec) -> Json:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": _canonical(tool.parameters),
        },
    }


# --- OpenAI Responses --------------------------------------------------------------------


def to_openai_responses(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> Json:
    """The Responses API's `input` items (and function `tools`): messages, an assistant turn's
    reasoning items and text in the order it wrote them, then its function_call items; tool
    results as function_call_output items."""
    items: list[Json] = []
    for message in messages:
        items += _responses_items(message)
    request: Json = {"input": items}
    if tools:
        request["tools"] = [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": _canonical(t.parameters),
                # Threadline's tool schemas are not written for strict mode's rules.
                "strict": False,
            }
            for t in tools
        ]
    return request


def _responses_items(message: Message) -> list[Json]:
    if message.role == "tool":
        output = text_of(message.content)
        return [
            {
                "type": "function_call_output",
                "call_id": message.tool_call_id or "",
                "output": output,
            }
        ]
    calls: list[Json] = [
        {
            "type": "function_call",
            "call_id": c.id,
            "name": c.name,
            "arguments": canonical_json(c.arguments),
        }
        for c in message.tool_calls
    ]
    items: list[Json] = []
    if isinstance(message.content, str):
        if message.content or not message.tool_calls:
            items.append(
                _responses_message(message.role, [_text_part(message.role, message.content)])
            )
        return items + calls
    own = without_reasoning(message.content, OPENAI_REASONING)
    made = 0  # the calls placed so far: a reasoning item made after some goes after them
    pending: list[Json] = []  # the message parts since the last reasoning item
    for part in sendable_parts(message.role, own) if own else []:
        if part.get("type") == "reasoning":
            if pending:
                items.append(_responses_message(message.role, pending))
                pending = []
            before = min(_tool_calls_before(part), len(calls))
            items += calls[made:before]
            made = max(made, before)
            # Back exactly as the model wrote it: the API decrypts and checks it.
            items.append(
                {
                    "type": "reasoning",
                    "id": part["id"],
                    "summary": part["summary"],
                    "encrypted_content": part["encrypted_content"],
                }
            )
        else:
            pending.append(_responses_part(message.role, part))
    pending = [p for p in pending if p.get("type") != _text_type(message.role) or p["text"]]
    if pending or not (items or message.tool_calls):
        items.append(_responses_message(message.role, pending or [_text_part(message.role, "")]))
    return items + calls[made:]


def _responses_message(role: str, parts: list[Json]) -> Json:
    if role in JOINED_ROLES:
        # One string, as for Chat Completions: only text is sendable in these roles.
        return {"role": role, "content": "".join(str(p["text"]) for p in parts)}
    return {"role": role, "content": parts}


def _text_type(role: str) -> str:
    return "output_text" if role == "assistant" else "input_text"


def _text_part(role: str, text: str) -> Json:
    return {"type": _text_type(role), "text": text}


def _responses_part(role: str, part: Json) -> Json:
    if part.get("type") == "text":
        return _text_part(role, str(part.get("text", "")))
    if part.get("type") == "image_url":
        return {
            "type": "input_image",
            "image_url": part["url"],
            "detail": part.get("detail") or "auto",
        }
    if part.get("type") == "document":
        return responses_document(part)
    raise ValueError(f"unknown content part type: {part.get('type')!r}")


# --- Anthropic Messages ------------------------------------------------------------------


CONTINUATION_NOTE = "(conversation continues)"
# Anthropic refuses a request with more cache_control marks than this.
MAX_CACHE_BREAKPOINTS = 4
CACHE_CONTROL: Json = {"type": "ephemeral"}


def to_anthropic(
    messages: Sequence[Message], tools: Sequence[ToolSpec], cache_breakpoints: Iterable[int] = ()
) -> Json:
    """The Messages request; each of `cache_breakpoints` (indices in `messages`) puts a
    cache_control mark on the last block of that message, so that Anthropic caches the prompt
    up to there (the newest MAX_CACHE_BREAKPOINTS of them; a message sending no block gets none).
    """
    marked = sorted({i for i in cache_breakpoints if 0 <= i < len(messages)})
    marked = marked[-MAX_CACHE_BREAKPOINTS:]
    leading = _leading_system_count(messages)
    request: Json = {}
    system = _nonblank(
        [
            _marked([_text_block(_sendable_text(m))], i in marked)[0]
            for i, m in enumerate(messages[:leading])
        ]
    )
    if system:
        request["system"] = system
    turns = [
        _marked_turn(_anthropic_turn(m), leading + i in marked)
        for i, m in enumerate(messages[leading:])
    ]
    if not turns or turns[0][0] == "assistant":
        # Anthropic requires a user turn first: a window or an import may start with the
        # assistant, or hold none at all (all history summarized or rolled back).
        turns.insert(0, ("user", [_text_block(CONTINUATION_NOTE)]))
    request["messages"] = [
        {"role": role, "content": _finish_blocks(blocks)} for role, blocks in _merge(turns)
    ]
    if tools:
        request["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": _canonical(t.parameters)}
            for t in tools
        ]
    return request


def _marked(blocks: list[Json], mark: bool) -> list[Json]:
    """`blocks` with a cache_control mark on the last one that will be sent (a blank text block
    is dropped), when `mark`."""
    if not mark:
        return blocks
    for index in range(len(blocks) - 1, -1, -1):
        # Anthropic refuses cache_control on thinking blocks.
        if _nonblank([blocks[index]]) and not is_reasoning(blocks[index]):
            blocks[index] = {**blocks[index], "cache_control": dict(CACHE_CONTROL)}
            break
    return blocks


def _marked_turn(turn: tuple[str, list[Json]], mark: bool) -> tuple[str, list[Json]]:
    role, blocks = turn
    return role, _marked(blocks, mark)


def _leading_system_count(messages: Sequence[Message]) -> int:
    count = 0
    while count < len(messages) and messages[count].role == "system":
        count += 1
    return count


def _anthropic_turn(message: Message) -> tuple[str, list[Json]]:
    if message.role == "system":
        # Anthropic has no system role mid-conversation: the note travels as user text.
        return "user", [_text_block(SYSTEM_NOTE_PREFIX + _sendable_text(message))]
    if message.role == "tool":
        return "user", [_tool_result_block(message)]
    calls = [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": _canonical(c.arguments)}
        for c in message.tool_calls
    ]
    if isinstance(message.content, str):
        return message.role, [_text_block(message.content), *calls]
    # Other providers' reasoning is not Anthropic's to read (a projection leaves it out).
    own = without_reasoning(message.content, ANTHROPIC_REASONING)
    parts = sendable_parts(message.role, own)
    return message.role, calls_in_place(parts, [_anthropic_part(p) for p in parts], calls)


def calls_in_place(parts: Sequence[Json], sent: list[Json], calls: list[Json]) -> list[Json]:
    """A model turn's content (`sent[i]` is `parts[i]` as the provider takes it) with its tool
    calls back where the model made them: a part that came after n of the turn's calls (a
    thought between tool calls: `tool_calls_before`, recorded as it streamed) goes after the
    first n calls, and so does every part after it; the calls left go last, as before."""
    placed: list[Json] = []
    made = 0
    for part, block in zip(parts, sent, strict=True):
        before = min(_tool_calls_before(part), len(calls))
        while made < before:
            placed.append(calls[made])
            made += 1
        placed.append(block)
    return placed + calls[made:]


def _tool_calls_before(part: Json) -> int:
    value = part.get(TOOL_CALLS_BEFORE, 0)
    return value if type(value) is int and value > 0 else 0


def _sendable_text(message: Message) -> str:
    """A system message as text: Anthropic's system parameter and notes take text only, so
    an image stored there becomes a visible note, never silently nothing."""
    content = message.content
    return (
        content if isinstance(content, str) else text_of(tuple(sendable_parts("system", content)))
    )


def _anthropic_part(part: Json) -> Json:
    if part.get("type") == "text":
        return _text_block(str(part.get("text", "")))
    # Reasoning goes back exactly as the model wrote it: Anthropic checks the signature.
    if part.get("type") == "thinking":
        return {"type": "thinking", "thinking": part["thinking"], "signature": part["signature"]}
    if part.get("type") == "redacted_thinking":
        return {"type": "redacted_thinking", "data": part["data"]}
    if part.get("type") == "image_url":
        return {"type": "image", "source": _image_source(str(part["url"]))}
    if part.get("type") == "document":
        document = document_of(part)
        source: Json = (
            {"type": "base64", "media_type": document.media_type, "data": document.data}
            if document.media_type == "application/pdf"
            else {"type": "text", "media_type": "text/plain", "data": document.text()}
        )
        return {"type": "document", "source": source, "title": document.filename}
    raise ValueError(f"unknown content part type: {part.get('type')!r}")


def _image_source(url: str) -> Json:
    data = _DATA_URL.fullmatch(url)
    if data:
        return {"type": "base64", "media_type": data.group(1), "data": data.group(2)}
    if url.startswith(("http://", "https://")):
        return {"type": "url", "url": url}
    raise ValueError(f"unsupported image url (need http(s) or base64 data:): {url[:40]!r}")


def _tool_result_block(message: Message) -> Json:
    text = text_of(message.content)
    if message.is_error and not text.strip():
        text = EMPTY_PLACEHOLDER  # Anthropic rejects an error result without content
    block: Json = {
        "type": "tool_result",
        "tool_use_id": message.tool_call_id or "",
        "content": text,
    }
    if message.is_error:
        block["is_error"] = True
    return block


def _canonical(value: Json) -> Json:
    """A sorted-key copy: the same bytes on every send (prompt caches match on exact prefixes,
    and stored JSON loses key order), and no aliasing of the frozen neutral message."""
    copy: Json = json.loads(canonical_json(value))
    return copy


def _text_block(text: str) -> Json:
    return {"type": "text", "text": text}


def _merge(turns: Iterable[tuple[str, list[Json]]]) -> list[tuple[str, list[Json]]]:
    """Consecutive same-role turns become one: Anthropic requires strict alternation."""
    merged: list[tuple[str, list[Json]]] = []
    for role, blocks in turns:
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(blocks)
        else:
            merged.append((role, list(blocks)))
    return merged


def _finish_blocks(blocks: list[Json]) -> list[Json]:
    kept = _nonblank(blocks)
    # Results must open the user message that answers the tool_use blocks.
    results = [b for b in kept if b["type"] == "tool_result"]
    others = [b for b in kept if b["type"] != "tool_result"]
    return results + others or [_text_block(EMPTY_PLACEHOLDER)]


def _nonblank(blocks: list[Json]) -> list[Json]:
    # Anthropic rejects text blocks without non-whitespace text, not only empty ones.
    return [b for b in blocks if b["type"] != "text" or str(b["text"]).strip()]


# --- Token counting from the OpenAI wire ------------------------------------------------


def openai_request_tokens(request: Json, counter: TokenCounter) -> int:
    """Count an OpenAI request as sent, with the same recipe app.core.tokens applies to
    neutral messages: an independent check that formatting changes nothing counted."""
    messages = sum(_wire_message_tokens(m, counter) for m in request["messages"])
    tools = sum(_wire_tool_tokens(t, counter) for t in request.get("tools", []))
    return REPLY_PRIMING + messages + tools


def _wire_message_tokens(message: Json, counter: TokenCounter) -> int:
    total = PER_MESSAGE + counter.count(message["role"])
    total += _wire_content_tokens(message.get("content"), counter)
    if message.get("name"):
        total += PER_NAME + counter.count(message["name"])
    for call in message.get("tool_calls", []):
        function = call["function"]
        total += PER_TOOL_CALL + counter.count(call["id"])
        total += counter.count(function["name"]) + counter.count(function["arguments"])
    if "tool_call_id" in message:
        total += counter.count(message["tool_call_id"])
    return total


def _wire_content_tokens(content: str | list[Json] | None, counter: TokenCounter) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return counter.count(content)
    return sum(_wire_part_tokens(p, counter) for p in content)


def _wire_part_tokens(part: Json, counter: TokenCounter) -> int:
    if part["type"] == "text":
        return counter.count(part["text"])
    if part["type"] == "file":
        file = part["file"]
        document = {"type": "document", "url": file["file_data"], "filename": file["filename"]}
        return document_tokens(document, counter)
    image = part.get("image_url", {})
    return part_image_tokens(str(image.get("url", "")), image.get("detail"), counter)


def _wire_tool_tokens(tool: Json, counter: TokenCounter) -> int:
    function = tool["function"]
    spec = {
        "name": function["name"],
        "description": function["description"],
        "parameters": function["parameters"],
    }
    return PER_TOOL_DEFINITION + counter.count(canonical_json(spec))
