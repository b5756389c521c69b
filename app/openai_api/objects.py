"""The Responses API's response object, from a run and its items. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.core import tool_choice as tool_choices
from app.core.runs import WAITING, Run, RunStatus

Json = dict[str, Any]

# Threadline's finish reasons that cut an answer short, as OpenAI's incomplete reasons.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def usage_object(input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> Json:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def run_usage(run: Run) -> Json | None:
    if run.input_tokens == 0 and run.output_tokens == 0:
        return None
    return usage_object(run.input_tokens, run.output_tokens, run.cached_tokens)


def response_base(
    response_id: str,
    run: Run,
    conversation_id: str,
    *,
    instructions: str | None,
    previous_response_id: str | None,
    background: bool,
    client_tools: Sequence[Mapping[str, Any]],
) -> Json:
    """The fields of a response that its status and output do not change."""
    params = run.params
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(run.created_at.timestamp()),
        "model": run.model,
        "instructions": instructions,
        "previous_response_id": previous_response_id,
        "conversation": {"id": conversation_id},
        "metadata": dict(params.metadata),
        "temperature": params.temperature,
        "top_p": None,
        "max_output_tokens": params.max_output_tokens,
        "tools": [
            *(tool_object(t) for t in client_tools),
            *(mcp_tool_object(server) for server in params.mcp_inline),
        ],
        "tool_choice": tool_choices.as_json(params.tool_choice),
        "parallel_tool_calls": params.parallel_tool_calls,
        "background": background,
        "store": True,
        "text": {"format": text_format(params.response_format)},
        "truncation": "auto",
        "reasoning": reasoning_object(params.reasoning),
        "user": None,
    }


def text_format(response_format: Mapping[str, Any] | None) -> Json:
    """A run's structured output format as the Responses API shows it (`text.format`)."""
    if not response_format:
        return {"type": "text"}
    spec = response_format["json_schema"]
    return {"type": "json_schema", **spec}


def reasoning_object(reasoning: Mapping[str, Any] | None) -> Json | None:
    """A run's reasoning setting as the response shows it (None: the run did not reason); a
    budget set natively has no effort. The summary is the provider's reasoning as given."""
    if not reasoning or reasoning.get("effort") == "none":
        return None
    return {"effort": reasoning.get("effort"), "summary": "auto"}


def tool_object(tool: Mapping[str, Any]) -> Json:
    """A Threadline tool definition as the Responses API shows it."""
    if tool.get("kind", "client") == "client":
        return {
            "type": "function",
            "name": tool["name"],
            "description": tool.get("description") or None,
            "parameters": tool.get("parameters"),
            "strict": False,
        }
    return {"type": "builtin", "name": tool["name"]}


def mcp_tool_object(server: Mapping[str, Any]) -> Json:
    """A request's `mcp` tool as the response shows it: never its headers."""
    allowed = server.get("allowed_tools")
    return {
        "type": "mcp",
        "server_label": server["name"],
        "server_url": server.get("url"),
        "headers": None,
        "allowed_tools": list(allowed) if allowed is not None else None,
        "require_approval": server.get("require_approval"),
    }


def response_object(
    base: Json,
    status: str,
    output: Sequence[Json],
    *,
    usage: Json | None = None,
    error: Json | None = None,
    incomplete_reason: str | None = None,
) -> Json:
    return {
        **base,
        "status": status,
        "output": list(output),
        "usage": usage,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
    }


def run_status(run: Run, answered: bool) -> tuple[str, str | None]:
    """The status of a run's response (and its incomplete reason): `answered` when the
    response ended with function calls the client has answered since."""
    if answered or run.status in WAITING:
        # it waits for the client's outputs or rulings: the next response goes on
        return "completed", None
    match run.status:
        case RunStatus.QUEUED:
            return "queued", None
        case RunStatus.RUNNING:
            return "in_progress", None
        case RunStatus.COMPLETED:
            reason = INCOMPLETE_REASONS.get(run.finish_reason or "stop")
            return ("incomplete", reason) if reason else ("completed", None)
        case RunStatus.FAILED:
            return "failed", None
    return "cancelled", None


def response_error(error: Mapping[str, Any]) -> Json:
    """A run's error as a response's: OpenAI's codes are a closed set (the SDKs type them), so
    Threadline's code leads the message."""
    code = str(error.get("code", "internal_error"))
    shown = "rate_limit_exceeded" if code == "provider_rate_limit" else "server_error"
    return {"code": shown, "message": f"{code}: {error.get('message', '')}"}


def run_error(run: Run) -> Json | None:
    if run.status is not RunStatus.FAILED or not run.error:
        return None
    return response_error(run.error)
