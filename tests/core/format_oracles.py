"""Test oracles for app/core/formats.py: validators that encode each provider's pairing,
ordering and content rules independently of the formatters.

Each returns the problems it finds in a wire request (empty: none found). The service never
validates its own output at run time, so these live with the tests, not in app/core.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Any

from testkit.upstream import anthropic_document_problem, openai_file_problem

Json = dict[str, Any]

OPENAI_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_ANTHROPIC_TOOL_ID = re.compile(r"[A-Za-z0-9_-]+")


# --- OpenAI validation -------------------------------------------------------------------


@dataclass
class _OpenCalls:
    """The calls of the last assistant message, while its tool messages are being read."""

    at: int
    ids: list[str]
    answered: set[str] = field(default_factory=set)

    def unanswered(self) -> list[str]:
        return [
            f"messages[{self.at}]: tool call {i!r} has no tool message answering it"
            for i in self.ids
            if i not in self.answered
        ]


def validate_openai(request: Json) -> list[str]:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return ["messages must be a non-empty list"]
    problems: list[str] = []
    file_problem = openai_file_problem(request)  # documents: the fake upstream's rules
    if file_problem is not None:
        problems.append(file_problem)
    seen_ids: set[str] = set()
    open_calls: _OpenCalls | None = None
    for at, message in enumerate(messages):
        role = message.get("role")
        if role not in OPENAI_ROLES:
            problems.append(f"messages[{at}]: unknown role {role!r}")
        if role == "tool":
            problems += _openai_tool_problems(at, message, open_calls)
            continue
        if open_calls is not None:
            problems += open_calls.unanswered()
        open_calls = None
        problems += _openai_content_problems(at, message)
        if role == "assistant" and message.get("tool_calls"):
            problems += _openai_call_problems(at, message["tool_calls"], seen_ids)
            open_calls = _OpenCalls(at, [str(c.get("id")) for c in message["tool_calls"]])
    if open_calls is not None:
        problems += open_calls.unanswered()
    return problems


def _openai_tool_problems(at: int, message: Json, open_calls: _OpenCalls | None) -> list[str]:
    call_id = message.get("tool_call_id")
    problems = (
        []
        if isinstance(message.get("content"), str | list)
        else [f"messages[{at}]: tool message without content"]
    )
    if open_calls is None:
        return [*problems, f"messages[{at}]: tool message {call_id!r} follows no tool call"]
    if call_id not in open_calls.ids:
        problems.append(
            f"messages[{at}]: tool message answers {call_id!r}, not a call of messages"
            f"[{open_calls.at}]"
        )
    elif call_id in open_calls.answered:
        problems.append(f"messages[{at}]: tool call {call_id!r} answered twice")
    open_calls.answered.add(str(call_id))
    return problems


def _openai_content_problems(at: int, message: Json) -> list[str]:
    content = message.get("content")
    if content is None and not (message.get("role") == "assistant" and message.get("tool_calls")):
        return [f"messages[{at}]: content is missing"]
    if content is not None and not isinstance(content, str | list):
        return [f"messages[{at}]: content must be a string or a list of parts"]
    if isinstance(content, list) and not content:
        return [f"messages[{at}]: content is an empty array"]
    problems: list[str] = []
    for part in content if isinstance(content, list) else []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and not isinstance(part.get("text"), str):
            problems.append(f"messages[{at}]: text part without text")
        elif kind == "image_url":
            if message.get("role") != "user":
                problems.append(f"messages[{at}]: image_url parts are for user messages only")
            url = (part.get("image_url") or {}).get("url")
            if not (_is_web_url(url) or _is_image_data(url)):
                problems.append(f"messages[{at}]: image url {str(url)[:40]!r} is not supported")
        elif kind not in ("text", "file"):
            problems.append(f"messages[{at}]: unknown content part type {kind!r}")
    return problems


_WIRE_IMAGE_DATA = re.compile(r"data:(image/(?:jpeg|png|gif|webp));base64,(.+)", re.DOTALL)


def _is_web_url(url: Any) -> bool:
    return isinstance(url, str) and re.fullmatch(r"https?://[^\s/]+\S*", url) is not None


def _is_image_data(url: Any) -> bool:
    data = _WIRE_IMAGE_DATA.fullmatch(url) if isinstance(url, str) else None
    return data is not None and _is_base64(data.group(2))


def _is_base64(text: Any) -> bool:
    try:
        return isinstance(text, str) and bool(base64.b64decode(text, validate=True))
    except ValueError:
        return False


def _openai_call_problems(at: int, calls: Any, seen_ids: set[str]) -> list[str]:
    if not isinstance(calls, list):
        return [f"messages[{at}]: tool_calls must be a list"]
    problems: list[str] = []
    for call in calls:
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            problems.append(f"messages[{at}]: tool call without an id")
        elif call_id in seen_ids:
            problems.append(f"messages[{at}]: duplicate tool call id {call_id!r}")
        seen_ids.add(str(call_id))
        if call.get("type") != "function":
            problems.append(f"messages[{at}]: tool call {call_id!r} is not of type function")
        problems += _openai_function_problems(at, call_id, call.get("function"))
    return problems


def _openai_function_problems(at: int, call_id: Any, function: Any) -> list[str]:
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return [f"messages[{at}]: tool call {call_id!r} has no function name"]
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return [f"messages[{at}]: tool call {call_id!r} arguments must be a JSON string"]
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return [f"messages[{at}]: tool call {call_id!r} arguments are not valid JSON"]
    if not isinstance(parsed, dict):
        return [f"messages[{at}]: tool call {call_id!r} arguments are not a JSON object"]
    return []


# --- Anthropic validation ----------------------------------------------------------------


def validate_anthropic(request: Json) -> list[str]:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return ["messages must be a non-empty list"]
    problems: list[str] = []
    if messages[0].get("role") != "user":
        problems.append("messages[0]: the first message must have role 'user'")
    system = request.get("system", [])
    if not isinstance(system, str) and any(b.get("type") != "text" for b in system):
        problems.append("system: only text blocks are allowed")
    document_problem = anthropic_document_problem(request)
    if document_problem is not None:
        problems.append(document_problem)
    seen_ids: set[str] = set()
    for at, message in enumerate(messages):
        problems += _anthropic_role_problems(at, message, messages[at - 1] if at else None)
        blocks = _blocks_of(message.get("content"))
        problems += _anthropic_content_problems(at, blocks)
        problems += _anthropic_image_problems(at, message.get("role"), blocks)
        problems += _anthropic_thinking_problems(at, message.get("role"), blocks)
        problems += _tool_use_problems(at, message, blocks, seen_ids)
        problems += _tool_result_problems(at, message, blocks, messages[at - 1] if at else None)
        following = messages[at + 1] if at + 1 < len(messages) else None
        problems += _unanswered_uses(at, blocks, following)
    problems += _cache_control_problems(request)
    return problems


def _cache_control_problems(request: Json) -> list[str]:
    """At most 4 blocks (tools, system and messages together) may carry cache_control."""
    system = request.get("system", [])
    blocks = [*request.get("tools", []), *([] if isinstance(system, str) else system)]
    for message in request["messages"]:
        blocks += _blocks_of(message.get("content"))
    marks = [b["cache_control"] for b in blocks if "cache_control" in b]
    problems = [
        f"cache_control: {m!r} is not a cache breakpoint"
        for m in marks
        if m != {"type": "ephemeral"}
    ]
    if len(marks) > 4:
        problems.append(f"cache_control: {len(marks)} breakpoints, at most 4 are allowed")
    return problems


def _anthropic_role_problems(at: int, message: Json, previous: Json | None) -> list[str]:
    role = message.get("role")
    if role == "system":
        return [f"messages[{at}]: role 'system' is not allowed in messages (use the system param)"]
    if role not in ("user", "assistant"):
        return [f"messages[{at}]: unknown role {role!r}"]
    if previous is not None and previous.get("role") == role:
        return [f"messages[{at}]: two consecutive {role!r} messages (roles must alternate)"]
    return []


def _blocks_of(content: Any) -> list[Json]:
    if isinstance(content, str):
        return [_text_block(content)]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _text_block(text: str) -> Json:
    return {"type": "text", "text": text}


def _anthropic_content_problems(at: int, blocks: list[Json]) -> list[str]:
    if not blocks:
        return [f"messages[{at}]: content is empty"]
    problems: list[str] = []
    for block in blocks:
        if block.get("type") == "text" and not str(block.get("text", "")).strip():
            problems.append(f"messages[{at}]: text block without non-whitespace text")
        is_error_result = block.get("type") == "tool_result" and block.get("is_error")
        if is_error_result and not _blocks_text(block.get("content")).strip():
            problems.append(f"messages[{at}]: error tool_result without content")
    return problems


REASONING_BLOCKS = ("thinking", "redacted_thinking")


def _anthropic_thinking_problems(at: int, role: Any, blocks: list[Json]) -> list[str]:
    """Thinking blocks: assistant only, whole (thinking with its signature, redacted with its
    data), never cache_control, and before the message's text and tool_use blocks."""
    kinds = [b.get("type") for b in blocks]
    thinking = [b for b in blocks if b.get("type") in REASONING_BLOCKS]
    if not thinking:
        return []
    if role != "assistant":
        return [f"messages[{at}]: thinking outside an assistant message"]
    problems: list[str] = []
    for block in thinking:
        fields = {"thinking", "signature"} if block["type"] == "thinking" else {"data"}
        if set(block) != {"type", *fields} or not all(isinstance(block[f], str) for f in fields):
            problems.append(f"messages[{at}]: a {block['type']} block is not whole: {block!r}")
    first_other = next((i for i, k in enumerate(kinds) if k not in REASONING_BLOCKS), len(kinds))
    if any(k in REASONING_BLOCKS for k in kinds[first_other:]):
        problems.append(f"messages[{at}]: thinking after text or tool_use")
    return problems


def _anthropic_image_problems(at: int, role: Any, blocks: list[Json]) -> list[str]:
    problems: list[str] = []
    for block in blocks:
        if block.get("type") != "image":
            continue
        if role != "user":
            problems.append(f"messages[{at}]: image blocks are for user messages only")
        source = block.get("source") or {}
        if source.get("type") == "url":
            ok = _is_web_url(source.get("url"))
        else:
            media_type, data = source.get("media_type"), source.get("data")
            ok = source.get("type") == "base64" and _is_image_data(
                f"data:{media_type};base64,{data}"
            )
        if not ok:
            problems.append(f"messages[{at}]: image source is not supported")
    return problems


def _blocks_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(b.get("text", "")) for b in _blocks_of(content))


def _ids_of(blocks: list[Json], kind: str, key: str) -> list[Any]:
    return [b.get(key) for b in blocks if b.get("type") == kind]


def _tool_use_problems(at: int, message: Json, blocks: list[Json], seen: set[str]) -> list[str]:
    uses = [b for b in blocks if b.get("type") == "tool_use"]
    problems: list[str] = []
    if uses and message.get("role") != "assistant":
        problems.append(f"messages[{at}]: tool_use outside an assistant message")
    for use in uses:
        use_id = use.get("id")
        if not isinstance(use_id, str) or not _ANTHROPIC_TOOL_ID.fullmatch(use_id):
            problems.append(f"messages[{at}]: tool_use id {use_id!r} is not [A-Za-z0-9_-]+")
        elif use_id in seen:
            problems.append(f"messages[{at}]: duplicate tool_use id {use_id!r}")
        seen.add(str(use_id))
        if not isinstance(use.get("input"), dict):
            problems.append(f"messages[{at}]: tool_use {use_id!r} input must be an object")
    return problems


def _tool_result_problems(
    at: int, message: Json, blocks: list[Json], previous: Json | None
) -> list[str]:
    results = _ids_of(blocks, "tool_result", "tool_use_id")
    if not results:
        return []
    if message.get("role") != "user":
        return [f"messages[{at}]: tool_result outside a user message"]
    problems: list[str] = []
    kinds = [b.get("type") == "tool_result" for b in blocks]
    if kinds != sorted(kinds, reverse=True):
        problems.append(f"messages[{at}]: tool_result blocks must come before other blocks")
    issued = []
    if previous is not None and previous.get("role") == "assistant":
        issued = _ids_of(_blocks_of(previous.get("content")), "tool_use", "id")
    for result_id in results:
        if result_id not in issued:
            problems.append(
                f"messages[{at}]: tool_result {result_id!r} answers no tool_use of the "
                "previous assistant message"
            )
    problems += [
        f"messages[{at}]: tool_use {i!r} answered more than once"
        for i in sorted({str(i) for i in results if results.count(i) > 1})
    ]
    return problems


def _unanswered_uses(at: int, blocks: list[Json], following: Json | None) -> list[str]:
    answered: list[Any] = []
    if following is not None and following.get("role") == "user":
        answered = _ids_of(_blocks_of(following.get("content")), "tool_result", "tool_use_id")
    return [
        f"messages[{at}]: tool_use {i!r} has no tool_result in the next user message"
        for i in _ids_of(blocks, "tool_use", "id")
        if i not in answered
    ]
