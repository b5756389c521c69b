"""Responses and conversations as Threadline's own objects: a conversation is a session, a
response is a run (or the part of a run after a wait for client-side tool outputs), items are
entries. Nothing is stored twice: every answer here is read from the runs and the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.api.schemas import Metadata
from app.config import Settings
from app.core import tool_choice as tool_choices
from app.core.agents import AgentPin, with_variables
from app.core.entries import EntryKind, JournalEntry, NewEntry, PendingEntry
from app.core.output_schema import ResponseFormat
from app.core.projection import without_rolled_back
from app.core.runs import Run, RunKind, RunStatus, entry_id
from app.core.sessions import Session
from app.core.tool_choice import ToolChoice
from app.db import approvals as approvals_db
from app.db import journal as journal_db
from app.db import runs as runs_db
from app.db import sessions as sessions_db
from app.db.engine import autocommit
from app.db.journal import journal_entry
from app.eventlog import store as event_store
from app.eventlog.hub import EventHub
from app.llm.base import ProviderError
from app.llm.router import Router
from app.openai_api import items as mapping
from app.openai_api.errors import OpenAIError, unsupported
from app.openai_api.events import ResponseStream
from app.openai_api.mcp import MAX_SERVERS, parse_mcp_tool
from app.openai_api.objects import (
    Json,
    response_base,
    response_object,
    run_error,
    run_status,
    run_usage,
)
from app.openai_api.schemas import ENCRYPTED_REASONING, ReasoningParam, ResponseCreate
from app.outbound import OutboundRefused, check_url
from app.services import agents, approvals, asks, journal, runs, sessions
from app.services.errors import NotFound
from app.services.handoff import RunHandoff
from app.services.mcp_servers import seal_headers
from app.services.quotas import Limits
from app.tools.registry import BUILTINS

ITEM_KINDS = [str(EntryKind.MESSAGE), str(EntryKind.TOOL_CALL), str(EntryKind.TOOL_RESULT)]
DELETED_PART = "deleted"  # the part of the id of the rollback that deletes a response
CANCEL_WAIT_SECONDS = 30.0


def not_found(kind: str, given: str) -> OpenAIError:
    return OpenAIError(404, f"No {kind} found with id '{given}'.", code="not_found")


# --- Models and tools --------------------------------------------------------------------


def threadline_model(name: str) -> str:
    """A model name as Threadline routes it: `provider:model` passes through, `claude-*` is
    Anthropic's, any other name OpenAI's."""
    if ":" in name:
        return name
    return f"anthropic:{name}" if name.startswith("claude") else f"openai:{name}"


def requested_tool_choice(value: str | Mapping[str, Any] | None) -> ToolChoice:
    """A request's tool_choice as Threadline's: the modes, and a function by name."""
    if value is None:
        return "auto"
    try:
        return tool_choices.parse(value)
    except ValueError:
        raise OpenAIError(
            400,
            f"Invalid value for 'tool_choice': {value!r}. Threadline serves 'auto', 'none', "
            "'required' and {'type': 'function', 'name': <one of the tools>}.",
            param="tool_choice",
            code="invalid_value",
        ) from None


def requested_format(text: Mapping[str, Any] | None) -> ResponseFormat | None:
    """A request's `text.format` as the ask's structured output: `{type: json_schema, name,
    schema, strict, description}` is one; `{type: text}` (or none) is free text."""
    given = (text or {}).get("format")
    unknown = sorted(set(text or {}) - {"format"})
    if unknown:
        raise unsupported(f"text.{unknown[0]}")
    if given is None or given == {"type": "text"}:
        return None
    kind = given.get("type") if isinstance(given, dict) else None
    if kind != "json_schema":
        raise OpenAIError(
            400,
            f"Invalid value for 'text.format.type': {kind!r}. Threadline serves 'text' and "
            "'json_schema' (strict).",
            param="text.format.type",
            code="invalid_value",
        )
    spec = {k: v for k, v in given.items() if k != "type"}
    try:
        return ResponseFormat.model_validate({"type": "json_schema", "json_schema": spec})
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:])
        param = f"text.format.{where}" if where else "text.format"
        raise OpenAIError(
            400, f"Invalid value for '{param}': {first['msg']}", param=param, code="invalid_value"
        ) from None


def native_reasoning(given: ReasoningParam | None) -> dict[str, Any] | None:
    """A request's `reasoning` as Threadline's setting (None: the conversation's): OpenAI's
    efforts are Threadline's, `minimal` its least (`low`)."""
    if given is None or given.effort is None:
        return None
    return {"effort": "low" if given.effort == "minimal" else given.effort}


def encrypted_included(include: Sequence[str] | None) -> bool:
    """Whether reasoning items carry their opaque content; any other `include` is refused."""
    for i, value in enumerate(include or []):
        if value != ENCRYPTED_REASONING:
            raise OpenAIError(
                400,
                f"Invalid value for 'include[{i}]': {value!r}. Threadline includes "
                f"'{ENCRYPTED_REASONING}' only.",
                param=f"include[{i}]",
                code="invalid_value",
            )
    return bool(include)


def checked_model(settings: Settings, name: str) -> str:
    model = threadline_model(name)
    router = Router(settings)
    try:
        router.route(model)
    except ProviderError as error:
        configured = ", ".join(router.configured_providers())
        raise OpenAIError(
            400,
            f"The model '{name}' ({model}) is not served here: {error.message}; configured "
            f"providers: {configured}.",
            param="model",
            code="model_not_found",
        ) from error
    return model


def tool_definitions(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Request tools as Threadline tool definitions: function tools run on the client, a
    `builtin` one is Threadline's own tool of that name."""
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if tool.get("type") == "mcp":
            continue  # a server's tools: mcp_servers()
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise OpenAIError(400, "A tool needs a name.", param=f"{param}.name")
        if tool.get("type") == "function":
            unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
            if unknown:
                raise unsupported(f"{param}.{sorted(unknown)[0]}")
            parameters = tool.get("parameters") or {"type": "object", "properties": {}}
            out.append(
                {
                    "name": name,
                    "kind": "client",
                    "description": tool.get("description") or "",
                    "parameters": parameters,
                }
            )
        elif tool.get("type") == "builtin":
            if name not in BUILTINS:
                raise OpenAIError(
                    400,
                    f"Threadline has no built-in tool '{name}'; it has: "
                    f"{', '.join(sorted(BUILTINS))}.",
                    param=f"{param}.name",
                )
            out.append({"name": name, "kind": "builtin"})
        else:
            raise OpenAIError(
                400,
                f"Tool type '{tool.get('type')}' is not supported: use 'function' tools, "
                "'mcp' for a remote MCP server's, or 'builtin' for Threadline's own tools.",
                param=f"{param}.type",
                code="unsupported_parameter",
            )
    return out


async def mcp_servers(settings: Settings, tools: Sequence[Mapping[str, Any]]) -> list[Json]:
    """The request's `mcp` tools as the servers its run uses (`RunParams.mcp_inline`): each
    URL one tool calls may reach (outbound_allowed), checked now, and headers sealed."""
    out: list[Json] = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "mcp":
            continue
        param = f"tools[{i}]"
        server = parse_mcp_tool(tool, param)
        if any(s["name"] == server.label for s in out):
            raise OpenAIError(
                400,
                f"Two mcp tools have the server_label '{server.label}'.",
                param=f"{param}.server_label",
                code="invalid_value",
            )
        if server.url is not None:
            try:
                await check_url(server.url, settings.outbound_allowed)
            except OutboundRefused as exc:
                raise OpenAIError(
                    400, str(exc), param=f"{param}.server_url", code="url_not_allowed"
                ) from exc
        out.append(server.inline(seal_headers(settings, server.headers)))
    if len(out) > MAX_SERVERS:
        raise OpenAIError(400, f"At most {MAX_SERVERS} mcp tools.", param="tools")
    return out


def client_tools(run: Run, session: Session) -> list[dict[str, Any]]:
    """The client-side tools a run offered: its own and its session's."""
    own = {t["name"]: t for t in session.config.tools or []}
    own |= {t["name"]: t for t in run.params.tools}
    return [t for t in own.values() if t.get("kind", "client") == "client"]


# --- Reading a response ------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    run: Run
    segment: int
    parts: list[mapping.Segment]
    tools: list[dict[str, Any]]  # the client's
    instructions: str | None
    run_tools: mapping.RunTools
    steered: bool = False  # a request's input went to it while in progress (a steer)

    @property
    def latest(self) -> bool:
        return self.segment == len(self.parts) - 1

    @property
    def id(self) -> str:
        return mapping.response_id(self.run.id, self.segment)


async def load(engine: AsyncEngine, tenant_id: str, given: str, param: str | None = None) -> Loaded:
    parsed = mapping.parse_response_id(given)
    missing = not_found("response", given)
    missing.param = param
    if parsed is None:
        raise missing
    run_id, segment = parsed
    # One connection for the reads (a response is loaded after every ask).
    async with autocommit(engine) as conn:
        run = await runs_db.get_run(conn, run_id, tenant_id=tenant_id)
        if run is None or run.kind is not RunKind.ASK:
            raise missing
        session = await sessions_db.get_session(conn, tenant_id, run.session_id)
        if session is None:
            raise missing
        entries = await journal_db.run_entries(
            conn, run.session_id, run.input_seq, run.id, tenant_id=tenant_id
        )
        rulings = await approvals_db.of_run(conn, run.id)
    loaded = _loaded(run, segment, session, entries, rulings)
    if loaded is None:
        raise missing
    return loaded


def _loaded(
    run: Run,
    segment: int,
    session: Session,
    entries: list[JournalEntry],
    rulings: Sequence[approvals_db.Approval],
) -> Loaded | None:
    """Response `segment` of `run` from what the run wrote, its session and the rulings on
    its calls; None: no such response (deleted, or not so many segments)."""
    if any(e.id == entry_id(run.id, DELETED_PART) for e in entries):
        return None
    # What the run took back (a model turn that started over) was never its answer.
    entries = without_rolled_back(entries)
    tools = client_tools(run, session)
    servers = run.params.mcp_server_names(session.config.mcp_servers)
    run_tools = mapping.RunTools(
        frozenset(t["name"] for t in tools),
        frozenset(servers),
        frozenset(a.tool_call_id for a in rulings),
        frozenset(a.tool_call_id for a in rulings if a.decision is not None),
    )
    parts = mapping.segments(entries, run_tools)
    if segment >= len(parts):
        return None
    instructions = session.config.system_prompt
    return Loaded(run, segment, parts, tools, instructions, run_tools)


def base_of(loaded: Loaded, previous_response_id: str | None = None) -> Json:
    """A background response's run goes on without its client (on_disconnect: continue); any
    other's stream stops it when the client leaves: that is how a replay knows which it was."""
    background = loaded.run.params.on_disconnect == "continue"
    if previous_response_id is None and loaded.segment > 0:
        # The part of the run before this one: the response whose calls this one answers.
        previous_response_id = mapping.response_id(loaded.run.id, loaded.segment - 1)
    return response_base(
        loaded.id,
        loaded.run,
        mapping.conversation_id(loaded.run.session_id),
        instructions=loaded.instructions,
        previous_response_id=previous_response_id,
        background=background,
        client_tools=loaded.tools,
    )


def response_of(
    loaded: Loaded,
    base: Json | None = None,
    live: list[Json] | None = None,
    *,
    encrypted: bool = False,
) -> Json:
    """The response as the journal and the run have it now (`live`: the output streamed so
    far, for a response still in progress; `encrypted`: reasoning items with their opaque
    content)."""
    run = loaded.run
    part = loaded.parts[loaded.segment]
    output = mapping.output_items(
        run.id, loaded.segment, part, loaded.run_tools, encrypted=encrypted
    )
    status, reason = run_status(run, part.answered)
    if live is not None and status in ("queued", "in_progress"):
        output = live
    ended = status not in ("queued", "in_progress")
    return response_object(
        base or base_of(loaded),
        status,
        output,
        usage=run_usage(run) if ended else None,
        error=run_error(run) if status == "failed" else None,
        incomplete_reason=reason,
    )


async def with_encrypted_reasoning(
    engine: AsyncEngine, tenant_id: str, response_id: str, output: list[Json]
) -> list[Json]:
    """A streamed output's reasoning items as read back with their opaque content (by id:
    streamed and read back, an item has the same)."""
    loaded = await load(engine, tenant_id, response_id)
    part = loaded.parts[loaded.segment]
    stored = mapping.output_items(
        loaded.run.id, loaded.segment, part, loaded.run_tools, encrypted=True
    )
    reasoning = {item["id"]: item for item in stored if item["type"] == "reasoning"}
    return [
        reasoning.get(item["id"], item) if item["type"] == "reasoning" else item for item in output
    ]


def stream_of(loaded: Loaded, base: Json) -> ResponseStream:
    queued = bool(base.get("background"))  # a background response is created queued
    return ResponseStream(loaded.run.id, loaded.segment, base, loaded.run_tools, queued=queued)


async def current(
    engine: AsyncEngine, loaded: Loaded, base: Json | None = None, *, encrypted: bool = False
) -> Json:
    """The response now: for one in progress, with what its run has streamed so far (the
    journal has only what it committed)."""
    if not loaded.run.active or not loaded.latest:
        return response_of(loaded, base, encrypted=encrypted)
    stream = stream_of(loaded, {})
    after = 0
    while not stream.done:
        async with engine.connect() as conn:
            rows = await event_store.read_events(
                conn, loaded.run.id, after, tenant_id=loaded.run.tenant_id
            )
        if not rows:
            break
        for row in rows:
            stream.translate(row["type"], row["data"])
        after = int(rows[-1]["seq"])
    return response_of(loaded, base, stream.output, encrypted=encrypted)


async def until_done(hub: EventHub, loaded: Loaded) -> None:
    """Until the response has ended: the run ended, or it waits for client tool outputs."""
    stream = stream_of(loaded, {})
    async for row in hub.follow(loaded.run.id, 0):
        stream.translate(row["type"], row["data"])
        if stream.done:
            return


# --- Creating a response -----------------------------------------------------------------


@dataclass(frozen=True)
class Created:
    loaded: Loaded
    base: Json
    encrypted: bool  # reasoning items with their opaque content (include)


async def create_response(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    body: ResponseCreate,
    handoff: RunHandoff | None,
    own_limits: Limits | None = None,
) -> Created:
    if body.store is False:
        raise unsupported(
            "store",
            "Threadline keeps every response in its conversation's journal; "
            "send store: true or leave it out",
        )
    if body.previous_response_id is not None and body.conversation is not None:
        raise OpenAIError(
            400,
            "Send previous_response_id or conversation, not both.",
            param="conversation",
            code="invalid_value",
        )
    given = mapping.parse_input(body.input)
    encrypted = encrypted_included(body.include)
    tools = tool_definitions(body.tools or [])
    choice = requested_tool_choice(body.tool_choice)
    output = requested_format(body.text)
    model = checked_model(settings, body.model) if body.model is not None else None
    if given.approvals:  # mcp_approval_response items: the run waiting on them goes on
        loaded = await _answer_approvals(engine, tenant_id, body, given)
    elif given.content is None:  # function_call_output items: the waiting run goes on
        if body.previous_response_id is None:
            raise OpenAIError(
                400,
                "function_call_output items answer a response's function calls: send them "
                "with that response's id as previous_response_id.",
                param="previous_response_id",
                code="missing_required_parameter",
            )
        loaded = await _answer_calls(engine, tenant_id, body, given, model, tools, choice, output)
    else:
        servers = await mcp_servers(settings, body.tools or [])
        loaded = await _ask(
            engine,
            settings,
            tenant_id,
            body,
            given,
            model,
            tools,
            servers,
            choice,
            output,
            handoff,
            own_limits,
        )
    return Created(loaded, base_of(loaded, body.previous_response_id), encrypted)


async def _answer_approvals(
    engine: AsyncEngine, tenant_id: str, body: ResponseCreate, given: mapping.Input
) -> Loaded:
    """Rulings on the previous response's approval requests: the run goes on as the next
    response once every call it waits on is ruled on (partial rulings are kept)."""
    if body.previous_response_id is None:
        raise OpenAIError(
            400,
            "mcp_approval_response items answer a response's approval requests: send them "
            "with that response's id as previous_response_id.",
            param="previous_response_id",
            code="missing_required_parameter",
        )
    previous = await load(engine, tenant_id, body.previous_response_id, "previous_response_id")
    run = previous.run
    waiting = {
        item["id"]: item
        for item in mapping.output_items(
            run.id, previous.segment, previous.parts[previous.segment], previous.run_tools
        )
        if item["type"] == "mcp_approval_request"
    }
    if run.status is not RunStatus.AWAITING_APPROVAL or not previous.latest or not waiting:
        raise OpenAIError(
            400,
            f"Response '{previous.id}' has no approval requests waiting for a response.",
            param="input",
            code="invalid_value",
        )
    answers = []
    for i, approval in enumerate(given.approvals):
        call_id = mapping.approved_call_id(approval.approval_request_id)
        if approval.approval_request_id not in waiting or call_id is None:
            raise OpenAIError(
                400,
                f"Response '{previous.id}' has no approval request "
                f"'{approval.approval_request_id}'; it waits on: {', '.join(sorted(waiting))}.",
                param=f"input[{i}].approval_request_id",
                code="invalid_value",
            )
        answers.append(approvals.Answer(call_id, approval.approve, reason=approval.reason))
    ruled = await approvals.answer(engine, tenant_id, run.id, answers)
    if ruled.run.status is RunStatus.AWAITING_APPROVAL:  # some calls are still to rule on
        return previous
    return await load(engine, tenant_id, mapping.response_id(run.id, previous.segment + 1))


async def _answer_calls(
    engine: AsyncEngine,
    tenant_id: str,
    body: ResponseCreate,
    given: mapping.Input,
    model: str | None,
    tools: list[dict[str, Any]],
    choice: ToolChoice,
    output: ResponseFormat | None,
) -> Loaded:
    assert body.previous_response_id is not None
    previous = await load(engine, tenant_id, body.previous_response_id, "previous_response_id")
    run = previous.run
    if run.status is not RunStatus.REQUIRES_ACTION or not previous.latest:
        raise OpenAIError(
            400,
            f"Response '{previous.id}' has no function calls waiting for outputs.",
            param="input",
            code="invalid_value",
        )
    if model is not None and model != run.model:
        raise OpenAIError(
            400,
            f"Function call outputs continue response '{previous.id}' with its model "
            f"({run.model}); leave model out or send that one.",
            param="model",
        )
    offered = {t["name"] for t in previous.tools}
    changed = {t["name"] for t in tools if t["kind"] == "client"} - offered
    if changed:
        raise OpenAIError(
            400,
            f"Function call outputs continue response '{previous.id}' with its tools; "
            f"'{sorted(changed)[0]}' was not among them.",
            param="tools",
        )
    params = run.params
    kept = {
        "tool_choice": (
            tool_choices.as_json(choice) if body.tool_choice is not None else None,
            tool_choices.as_json(params.tool_choice),
        ),
        "parallel_tool_calls": (body.parallel_tool_calls, params.parallel_tool_calls),
        "max_output_tokens": (body.max_output_tokens, params.max_output_tokens),
        "temperature": (body.temperature, params.temperature),
        "metadata": (body.metadata, params.metadata),
        "background": (body.background, params.on_disconnect == "continue"),
        "text": (
            output.as_json() if body.text is not None and output else None,
            params.response_format,
        ),
        "reasoning": (native_reasoning(body.reasoning), params.reasoning),
    }
    for name, (sent, own) in kept.items():
        if sent is not None and sent != own:
            raise OpenAIError(
                400,
                f"Function call outputs continue response '{previous.id}' with its {name} "
                f"({own!r}); leave {name} out or send that value.",
                param=name,
            )
    if body.instructions is not None and body.instructions != previous.instructions:
        await sessions.update_session(
            engine, tenant_id, run.session_id, {"config": {"system_prompt": body.instructions}}
        )
    outputs = [runs.ToolOutput(o.call_id, o.output) for o in given.tool_outputs]
    await runs.submit_tool_outputs(engine, tenant_id, run.id, outputs)
    return await load(engine, tenant_id, mapping.response_id(run.id, previous.segment + 1))


async def _ask(
    engine: AsyncEngine,
    settings: Settings,
    tenant_id: str,
    body: ResponseCreate,
    given: mapping.Input,
    model: str | None,
    tools: list[dict[str, Any]],
    servers: list[Json],
    choice: ToolChoice,
    output: ResponseFormat | None,
    handoff: RunHandoff | None,
    own_limits: Limits | None,
) -> Loaded:
    """The response's ask. The session made for it (a new conversation, or a fork at the
    previous response) and its instructions are committed with the ask (asks.ask): a refused
    response leaves neither."""
    assert given.content is not None
    steps: list[asks.Prepare] = []
    pin, instructions = await _prompted(engine, tenant_id, body)
    if body.previous_response_id is not None:
        session_id, fork_at = await _continuing(engine, tenant_id, body.previous_response_id)
        if fork_at is not None:
            parent_id, session_id = session_id, str(uuid.uuid4())
            steps.append(_forking(tenant_id, parent_id, fork_at, session_id))
    elif body.conversation is not None:
        given_id = body.conversation if isinstance(body.conversation, str) else body.conversation.id
        conversation = mapping.parse_conversation_id(given_id)
        if conversation is None:
            raise _no_conversation(given_id, "conversation")
        session_id = conversation  # the ask finds it, or says there is none
    else:
        session_id = str(uuid.uuid4())
        config = {"system_prompt": instructions} if instructions is not None else {}
        steps.append(_making(tenant_id, session_id, config, pin))
    if instructions is not None:
        steps.append(_instructing(tenant_id, session_id, instructions))

    async def prepare(conn: AsyncConnection) -> None:
        for step in steps:
            await step(conn)

    params = asks.AskParams(
        content=given.content,
        model=model,
        max_output_tokens=body.max_output_tokens,
        temperature=body.temperature,
        metadata=dict(body.metadata or {}),
        tools=tools,
        mcp_inline=servers,
        tool_choice=choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        on_disconnect="continue" if body.background else "cancel",
        multitask_strategy=body.multitask_strategy or "reject",
        response_format=output,
        response_format_at=("text", "format", "schema"),
        before=tuple(PendingEntry(str(e.kind), e.payload, e.refs) for e in given.before),
        reasoning=native_reasoning(body.reasoning),
    )
    try:
        result = await asks.ask(
            engine,
            settings,
            tenant_id,
            session_id,
            params,
            own_limits,
            handoff=handoff,
            prepare=prepare if steps else None,
            # Its stream, or the wait for its end, follows the run (all but a background one).
            followed=bool(body.stream) or not body.background,
        )
    except NotFound as exc:
        if body.conversation is None or exc.code != "session_not_found":
            raise
        raise _no_conversation(given_id, "conversation") from None
    if result.steer_id is not None:  # the run in progress takes it: its latest response
        first = await load(engine, tenant_id, mapping.response_id(result.run.id))
        return replace(first, segment=len(first.parts) - 1, steered=True)
    if result.session is not None:  # a run just made: what it is, the ask has at hand
        made = _loaded(result.run, 0, result.session, list(result.entries), [])
        assert made is not None  # its user entry and run_start: one response, not deleted
        return made
    return await load(engine, tenant_id, mapping.response_id(result.run.id))


async def _prompted(
    engine: AsyncEngine, tenant_id: str, body: ResponseCreate
) -> tuple[AgentPin | None, str | None]:
    """The agent version `prompt` names, and the instructions the response sets: `instructions`
    if given, else the agent's with the prompt's variables filled in (when it has some)."""
    prompt = body.prompt
    if prompt is None:
        return None, body.instructions
    reference = prompt.id if prompt.version is None else f"{prompt.id}@{prompt.version}"
    pin = await agents.pin_for(engine, tenant_id, reference)
    if body.instructions is not None:
        return pin, body.instructions
    template = pin.config.get("system_prompt")
    if prompt.variables and template:
        return pin, with_variables(template, prompt.variables)
    # A continued conversation takes the agent's instructions; a new one has them by its pin.
    continued = body.previous_response_id is not None or body.conversation is not None
    return pin, template if continued else None


def _making(
    tenant_id: str, session_id: str, config: dict[str, Any], agent: AgentPin | None
) -> asks.Prepare:
    """A new conversation for the response (pinned to the prompt's agent version, if any)."""

    async def make(conn: AsyncConnection) -> None:
        await sessions_db.insert_session(
            conn,
            id=session_id,
            tenant_id=tenant_id,
            title=None,
            metadata={},
            config=config,
            **sessions.pinned(agent),
            expires_at=sessions_db.tenant_default_expiry(tenant_id),
        )

    return make


def _forking(tenant_id: str, parent_id: str, at_seq: int, fork_id: str) -> asks.Prepare:
    """The fork of the previous response's conversation at that response's end."""

    async def fork(conn: AsyncConnection) -> None:
        await sessions.fork_in(
            conn, tenant_id, parent_id, at_seq=at_seq, title=None, metadata=None, fork_id=fork_id
        )

    return fork


def _instructing(tenant_id: str, session_id: str, instructions: str) -> asks.Prepare:
    """The response's instructions as its conversation's system prompt from now on."""

    async def instruct(conn: AsyncConnection) -> None:
        session = await sessions_db.get_session(conn, tenant_id, session_id, lock=True)
        if session is None:
            raise not_found("conversation", mapping.conversation_id(session_id))
        if session.config.system_prompt != instructions:
            config = {**session.given_config.as_json(), "system_prompt": instructions}
            await sessions_db.update_session(conn, session_id, {"config": config})

    return instruct


async def _continuing(engine: AsyncEngine, tenant_id: str, given: str) -> tuple[str, int | None]:
    """The session a new message after response `given` goes to: its own when that response
    is the latest there, else a fork of it at the response's end (nothing is copied; the ask
    makes it): the session and that seq."""
    previous = await load(engine, tenant_id, given, "previous_response_id")
    run = previous.run
    if run.status is RunStatus.REQUIRES_ACTION:
        raise OpenAIError(
            400,
            f"Response '{previous.id}' waits for the outputs of its function calls: send "
            "function_call_output items.",
            param="input",
            code="invalid_value",
        )
    if run.active:
        raise OpenAIError(
            409,
            f"Response '{previous.id}' is still in progress.",
            param="previous_response_id",
            code="response_in_progress",
        )
    if not previous.latest:
        raise OpenAIError(
            400,
            f"Response '{previous.id}' ended with function calls that were answered: continue "
            f"from '{mapping.response_id(run.id, len(previous.parts) - 1)}'.",
            param="previous_response_id",
        )
    end = run.end_entry_seq
    assert end is not None
    later = await journal.read_history(
        engine,
        tenant_id,
        run.session_id,
        after_seq=end,
        before_seq=None,
        limit=1,
        kinds=[str(EntryKind.MESSAGE)],
        order="asc",
    )
    if not later.entries:
        return run.session_id, None
    return run.session_id, end


async def _conversation(engine: AsyncEngine, tenant_id: str, given: str, param: str) -> str:
    session_id = mapping.parse_conversation_id(given)
    if session_id is None:
        raise _no_conversation(given, param)
    try:
        await sessions.get_session(engine, tenant_id, session_id)
    except NotFound:
        raise _no_conversation(given, param) from None
    return session_id


def _no_conversation(given: str, param: str) -> OpenAIError:
    missing = not_found("conversation", given)
    missing.param = param
    return missing


# --- Cancel, delete, input items ---------------------------------------------------------


async def cancel_response(engine: AsyncEngine, hub: EventHub, tenant_id: str, given: str) -> Json:
    loaded = await load(engine, tenant_id, given)
    await runs.cancel_run(engine, tenant_id, loaded.run.id)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(until_done(hub, loaded), CANCEL_WAIT_SECONDS)
    return response_of(await load(engine, tenant_id, given))


async def delete_response(engine: AsyncEngine, tenant_id: str, given: str) -> None:
    """Take the response's run out of its conversation: a rollback of its entries (the
    journal keeps them, as it keeps everything); the response is not found after."""
    loaded = await load(engine, tenant_id, given)
    run = loaded.run
    if run.active:
        raise OpenAIError(
            409,
            f"Response '{loaded.id}' is in progress: cancel it before deleting it.",
            code="response_in_progress",
        )
    first = min(e.seq for e in loaded.parts[0].inputs) if loaded.parts[0].inputs else run.input_seq
    before = await _inputs_before(engine, tenant_id, run)
    first = min([first, *(e.seq for e in before)])
    assert run.end_entry_seq is not None
    rollback = NewEntry(
        EntryKind.ROLLBACK,
        {"from_seq": first, "to_seq": run.end_entry_seq, "reason": "response deleted"},
        {"run_id": run.id},
        entry_id(run.id, DELETED_PART),
    )
    await journal.append_entries(engine, tenant_id, run.session_id, [rollback], expected_rev=None)


async def _inputs_before(engine: AsyncEngine, tenant_id: str, run: Run) -> list[JournalEntry]:
    """The items a run's request sent before its user message (committed with the ask)."""
    page = await journal.read_history(
        engine,
        tenant_id,
        run.session_id,
        after_seq=max(0, run.input_seq - mapping.MAX_INPUT_ITEMS - 1),
        before_seq=run.input_seq,
        limit=mapping.MAX_INPUT_ITEMS,
        kinds=ITEM_KINDS,
        order="asc",
    )
    return [journal_entry(r) for r in page.entries if (r["refs"] or {}).get("request_id") == run.id]


async def input_items(engine: AsyncEngine, tenant_id: str, given: str) -> list[Json]:
    loaded = await load(engine, tenant_id, given)
    run = loaded.run
    entries = list(loaded.parts[loaded.segment].inputs)
    if loaded.segment == 0:
        entries = [*await _inputs_before(engine, tenant_id, run), *entries]
    return mapping.conversation_items(run.session_id, entries)


# --- Conversations -----------------------------------------------------------------------

_METADATA = TypeAdapter(Metadata)


def _checked_metadata(metadata: Any) -> dict[str, str]:
    """Metadata as sessions keep it (Threadline's rules for keys and values)."""
    try:
        checked: dict[str, str] = _METADATA.validate_python(metadata)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise OpenAIError(
            400, f"Invalid metadata: {first['msg']}", param="metadata", code="invalid_value"
        ) from exc
    return checked


def conversation_object(session: Session) -> Json:
    return {
        "id": mapping.conversation_id(session.id),
        "object": "conversation",
        "created_at": int(session.created_at.timestamp()),
        "metadata": dict(session.metadata),
    }


def _entries(items: list[dict[str, Any]], param: str) -> list[NewEntry]:
    out = []
    for i, item in enumerate(mapping.parse_items(items, param)):
        if isinstance(item, mapping.ApprovalItem):
            raise mapping.ItemError(
                f"{param}[{i}].type",
                "mcp_approval_response items answer a response: send them to POST /responses "
                "with its id as previous_response_id",
            )
        if isinstance(item, mapping.ToolOutputItem):
            out.append(
                NewEntry(
                    EntryKind.TOOL_RESULT, {"content": item.output}, {"tool_call_id": item.call_id}
                )
            )
        else:
            out.append(NewEntry(item.kind, item.payload, item.refs))
    return out


async def create_conversation(
    engine: AsyncEngine,
    tenant_id: str,
    items: list[dict[str, Any]] | None,
    metadata: dict[str, str] | None,
) -> Json:
    checked = _checked_metadata(metadata or {})
    entries = _entries(items, "items") if items else []
    # One transaction: refused items leave no conversation behind.
    async with engine.begin() as conn:
        session = await sessions_db.insert_session(
            conn,
            tenant_id=tenant_id,
            title=None,
            metadata=checked,
            config={},
            expires_at=sessions_db.tenant_default_expiry(tenant_id),
        )
        if entries:
            await journal.append_in(conn, tenant_id, session.id, entries, expected_rev=0)
    return conversation_object(session)


async def get_conversation(engine: AsyncEngine, tenant_id: str, given: str) -> Json:
    session_id = await _conversation(engine, tenant_id, given, "conversation_id")
    return conversation_object(await sessions.get_session(engine, tenant_id, session_id))


async def update_conversation(
    engine: AsyncEngine, tenant_id: str, given: str, metadata: dict[str, str]
) -> Json:
    """Replace the conversation's metadata (the session's), as OpenAI's update does."""
    session_id = await _conversation(engine, tenant_id, given, "conversation_id")
    checked = _checked_metadata(metadata)
    session = await sessions.get_session(engine, tenant_id, session_id)
    patch: dict[str, str | None] = {k: None for k in session.metadata if k not in checked}
    patch |= checked
    updated = await sessions.update_session(engine, tenant_id, session_id, {"metadata": patch})
    return conversation_object(updated)


async def get_item(engine: AsyncEngine, tenant_id: str, given: str, item_id: str) -> Json:
    session_id = await _conversation(engine, tenant_id, given, "conversation_id")
    seq = _item_seq(item_id, "item_id")
    page = await journal.read_history(
        engine,
        tenant_id,
        session_id,
        after_seq=seq - 1,
        before_seq=seq + 1,
        limit=1,
        kinds=ITEM_KINDS,
        order="asc",
    )
    found = mapping.conversation_items(session_id, [journal_entry(r) for r in page.entries])
    if not found or found[0]["id"] != item_id:
        raise not_found("item", item_id)
    return found[0]


async def delete_conversation(engine: AsyncEngine, tenant_id: str, given: str) -> Json:
    session_id = await _conversation(engine, tenant_id, given, "conversation_id")
    await sessions.delete_session(engine, tenant_id, session_id)
    return {
        "id": mapping.conversation_id(session_id),
        "object": "conversation.deleted",
        "deleted": True,
    }


@dataclass(frozen=True)
class ItemPage:
    data: list[Json]
    has_more: bool


async def list_items(
    engine: AsyncEngine, tenant_id: str, given: str, *, after: str | None, limit: int, order: str
) -> ItemPage:
    session_id = await _conversation(engine, tenant_id, given, "conversation_id")
    cursor = _item_seq(after) if after is not None else None
    page = await journal.read_history(
        engine,
        tenant_id,
        session_id,
        after_seq=cursor if order == "asc" else None,
        before_seq=cursor if order == "desc" else None,
        limit=limit,
        kinds=ITEM_KINDS,
        order="asc" if order == "asc" else "desc",
    )
    entries = await _in_context(
        engine, tenant_id, session_id, [journal_entry(r) for r in page.entries]
    )
    return ItemPage(mapping.conversation_items(session_id, entries), page.has_more)


async def _in_context(
    engine: AsyncEngine, tenant_id: str, session_id: str, entries: list[JournalEntry]
) -> list[JournalEntry]:
    """The entries no rollback took out of the conversation (a deleted response, a model turn
    that started over), in their order."""
    removed = await journal.rolled_back_in(engine, tenant_id, session_id)
    return [e for e in entries if e.seq not in removed]


def _item_seq(item_id: str, param: str = "after") -> int:
    tail = item_id.rsplit("_", 1)[-1]
    if not tail.isdigit() or len(tail) > 18:
        raise OpenAIError(400, f"'{item_id}' is not an item id of this API.", param=param)
    return int(tail)


async def add_items(
    engine: AsyncEngine, tenant_id: str, given: str, items: list[dict[str, Any]]
) -> list[Json]:
    session_id = await _conversation(engine, tenant_id, given, "conversation_id")
    entries = _entries(items, "items")
    appended = await journal.append_entries(
        engine, tenant_id, session_id, entries, expected_rev=None
    )
    return mapping.conversation_items(session_id, [journal_entry(r) for r in appended.entries])
