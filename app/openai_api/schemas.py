"""Request bodies of /openai/v1: the parameters Threadline serves. Any other parameter is
refused (400 `unsupported_parameter`, naming it), never ignored."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

OpenAIMetadata = Annotated[
    dict[
        Annotated[str, StringConstraints(min_length=1, max_length=64)],
        Annotated[str, StringConstraints(max_length=512)],
    ],
    Field(max_length=16, description="Up to 16 string pairs (keys up to 64 chars)."),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ConversationRef(_Body):
    id: str


ENCRYPTED_REASONING = "reasoning.encrypted_content"


class ReasoningParam(_Body):
    """`reasoning`: how much the model thinks before it answers."""

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        default=None,
        description="Threadline's reasoning effort (`minimal` is `low`, the least it has; "
        "`none`: no reasoning for this response). Default: the conversation's setting.",
    )
    summary: Literal["auto", "concise", "detailed"] | None = Field(
        default=None,
        description="Any value: the reasoning as the provider gives it is each reasoning "
        "item's summary.",
    )


class PromptRef(_Body):
    """A reusable prompt: a Threadline agent, by name."""

    id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] = Field(
        description="The agent's name."
    )
    version: Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]{0,8}$")] | None = Field(
        default=None, description="The agent's version; default: its latest."
    )
    variables: (
        dict[
            Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")],
            Annotated[str, StringConstraints(max_length=100_000)],
        ]
        | None
    ) = Field(
        default=None,
        description="Values for the `{{name}}` placeholders of the agent's instructions.",
    )


class ResponseCreate(_Body):
    """`POST /openai/v1/responses`."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(
        default=None,
        description="Any Threadline model (`anthropic:claude-haiku-4-5`, `local:...`); an "
        "OpenAI name (`gpt-4o-mini`) is `openai:<name>`, a `claude-*` name `anthropic:<name>`. "
        "Default: the conversation's model.",
    )
    input: str | list[dict[str, Any]] = Field(
        description="The user's message as text, or items: messages (text, input_image and "
        "input_file parts: file_data a base64 data URL of a PDF or text, with a filename), "
        "function_call, and function_call_output (answers to the previous response's "
        "function calls, sent alone)."
    )
    instructions: Annotated[str, StringConstraints(max_length=200_000)] | None = Field(
        default=None,
        description="The conversation's system prompt from this response on.",
    )
    prompt: PromptRef | None = Field(
        default=None,
        description="An agent (`id`: its name; `version`; `variables` for its instructions' "
        "`{{name}}` placeholders). A new conversation is created from it (pinned to the "
        "version); a continued one takes its instructions.",
    )
    tools: Annotated[list[dict[str, Any]], Field(max_length=128)] | None = Field(
        default=None,
        description="`{type: function, name, description, parameters}` (the client runs them), "
        "`{type: mcp, server_label, server_url, headers, allowed_tools, require_approval}` (a "
        "remote MCP server's tools) or `{type: builtin, name}` (a Threadline built-in tool, "
        "e.g. calculator).",
    )
    tool_choice: str | dict[str, Any] | None = Field(
        default=None,
        description="`auto` (default), `none`, `required` or `{type: function, name}`; "
        "`required` and a named function hold for the response's first model turn only.",
    )
    parallel_tool_calls: bool | None = Field(
        default=None, description="`false`: at most one function call per model turn."
    )
    previous_response_id: str | None = Field(
        default=None,
        description="Continue from this response: its conversation when it is the latest "
        "there, else a fork of the conversation at that response.",
    )
    conversation: str | ConversationRef | None = Field(
        default=None, description="Continue this conversation (a Threadline session)."
    )
    store: bool | None = Field(default=None, description="`true` only: every response is kept.")
    stream: bool | None = None
    background: bool | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    metadata: OpenAIMetadata | None = None
    text: dict[str, Any] | None = Field(
        default=None,
        description="`{format: {type: json_schema, name, schema, strict: true}}`: structured "
        "output, the answer JSON that follows the schema (OpenAI's strict-mode rules); "
        "`{format: {type: text}}` (the default): free text.",
    )
    reasoning: ReasoningParam | None = None
    multitask_strategy: Literal["reject", "enqueue", "interrupt", "rollback", "steer"] | None = (
        Field(
            default=None,
            description="Threadline's own (the SDKs' `extra_body`): what a response in a "
            "conversation whose response is still in progress does: `reject` (the default, "
            "409), `enqueue`, `interrupt`, `rollback`, or `steer`: the message goes to the "
            "response in progress, whose next model turn sees it (after its current tool "
            "calls), and that response is the one returned.",
        )
    )
    include: Annotated[list[Literal["reasoning.encrypted_content"]], Field(max_length=8)] | None = (
        Field(
            default=None,
            description="`reasoning.encrypted_content`: reasoning items carry the provider's "
            "opaque content (a signature, encrypted reasoning) in the response.",
        )
    )


class ConversationCreate(_Body):
    """`POST /openai/v1/conversations`."""

    items: Annotated[list[dict[str, Any]], Field(max_length=1000)] | None = None
    metadata: OpenAIMetadata | None = None


class ItemsCreate(_Body):
    """`POST /openai/v1/conversations/{id}/items`."""

    items: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=1000)]


class ConversationUpdate(_Body):
    """`POST /openai/v1/conversations/{id}`."""

    metadata: OpenAIMetadata
