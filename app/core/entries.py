"""Journal entries: their kinds and payload types, and the entry values that carry them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from app.core.content import content_problems


class EntryKind(StrEnum):
    MESSAGE = "message"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    SUMMARY = "summary"
    RUN_START = "run_start"
    RUN_END = "run_end"
    USAGE = "usage"
    ERROR = "error"
    POLICY_VIOLATION = "policy_violation"
    ROLLBACK = "rollback"
    AGENT_VERSION = "agent_version"  # the session was moved to another version of its agent


RUN_ENTRY_PREFIX = "run:"  # ids of the entries runs write (run:<run_id>:<part>): not clients'
# The largest entry seq (and session rev) a client may name: anything larger is a mistake, not
# a seq. 2**53 - 1: the largest integer every JSON client (and validator) reads exactly.
MAX_ENTRY_SEQ = 2**53 - 1


@dataclass(frozen=True)
class NewEntry:
    """An entry to append: the journal gives it its seq; `id` is the client's (an append that
    sends it again is a replay), None for none."""

    kind: EntryKind
    payload: dict[str, Any]
    refs: dict[str, Any]
    id: str | None = None
    # When it was written, if not now: an imported entry keeps its original time.
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A committed entry, as the projector reads it."""

    seq: int
    kind: str
    payload: dict[str, Any]
    refs: dict[str, Any] = field(default_factory=dict)
    token_count: int = 0
    id: str = ""


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """Not yet committed (a dry run's ask): counted in a projection, not read from the journal."""

    kind: str
    payload: dict[str, Any]
    refs: dict[str, Any] = field(default_factory=dict)


class _Strict(BaseModel):
    # strict: false is not a seq, 1 is not a boolean (what the JSON schema of these types says).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class _Open(BaseModel):
    """Service-written records: known fields are typed, extra detail is kept."""

    model_config = ConfigDict(extra="allow", frozen=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImagePart(_Strict):
    type: Literal["image_url"]
    # What every provider accepts: a web URL, or the image inline as a base64 data URL.
    url: Annotated[str, Field(max_length=2_000_000, pattern=r"^(https?://\S|data:[^;,]+;base64,)")]
    detail: Literal["auto", "low", "high"] | None = None


class DocumentPart(_Strict):
    """A document a person gives (a PDF or plain text), inline as a base64 data URL; its size
    cap is the deployment's (max_document_bytes), its bytes checked at the door."""

    type: Literal["document"]
    url: Annotated[str, Field(pattern=r"^data:[^;,]+;base64,")]
    filename: Annotated[str, Field(min_length=1, max_length=255)] | None = None


class _ReasoningPart(_Strict):
    # Interleaved thinking: how many of the turn's tool calls the model made before this part
    # (absent: none), so that it goes back to the provider in its place among them.
    tool_calls_before: Annotated[int, Field(ge=1, le=10_000)] | None = None


class ThinkingPart(_ReasoningPart):
    """A model's thinking (Anthropic extended thinking): only in assistant messages, kept byte
    for byte with the signature the provider checks when it is sent back."""

    type: Literal["thinking"]
    thinking: Annotated[str, Field(max_length=2_000_000)]
    signature: Annotated[str, Field(min_length=1, max_length=200_000)]


class RedactedThinkingPart(_ReasoningPart):
    """Thinking the provider encrypted (Anthropic redacted_thinking): `data` is sent back
    unchanged."""

    type: Literal["redacted_thinking"]
    data: Annotated[str, Field(min_length=1, max_length=2_000_000)]


class SummaryText(_Strict):
    type: Literal["summary_text"]
    text: Annotated[str, Field(max_length=2_000_000)]


class ReasoningItemPart(_ReasoningPart):
    """A reasoning item of OpenAI's Responses API: only in assistant messages, kept byte for
    byte; `encrypted_content` is what the API decrypts when it is sent back, `summary` what
    the model let be read of it."""

    type: Literal["reasoning"]
    id: Annotated[str, Field(min_length=1, max_length=256)]
    encrypted_content: Annotated[str, Field(min_length=1, max_length=2_000_000)]
    summary: Annotated[list[SummaryText], Field(max_length=1000)]


class ReasoningTextPart(_Strict):
    """Readable reasoning an OpenAI-compatible server streamed (reasoning_content): only in
    assistant messages; kept for the record, never sent back."""

    type: Literal["reasoning_text"]
    text: Annotated[str, Field(min_length=1, max_length=2_000_000)]


# What a person may say (an ask's input); message content may also hold a model's reasoning.
InputPart = Annotated[TextPart | ImagePart | DocumentPart, Field(discriminator="type")]
ContentPart = Annotated[
    TextPart
    | ImagePart
    | DocumentPart
    | ThinkingPart
    | RedactedThinkingPart
    | ReasoningItemPart
    | ReasoningTextPart,
    Field(discriminator="type"),
]


# Why a model turn ended, whichever provider said it: stop (a complete answer), length (cut off
# by the output limit), tool_calls, content_filter (withheld or refused), other.
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "other"]


class StructuredMark(_Strict):
    """What an answer asked for in a JSON Schema format carries: the format's name and the
    sha256 of its schema's canonical JSON (app.core.output_schema)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    schema_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class MessagePayload(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")] | None = (
        None
    )
    # "incomplete" marks assistant text committed when a run was cancelled mid-stream.
    status: Literal["complete", "incomplete"] | None = None
    # Why the model stopped writing it (runs set it): "length" marks an answer cut off.
    finish_reason: FinishReason | None = None
    # An answer asked for as structured output (runs set it; checked against the schema at
    # the end of the run: a mismatch fails the run, the text kept).
    structured: StructuredMark | None = None


class ToolCallPayload(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=128)]
    arguments: dict[str, Any]


class ToolResultPayload(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    # Any JSON, null included; canonical forms leave null out, so absent means null too.
    content: Any = None
    is_error: bool = False


def _ordered_range(to_seq: int, info: ValidationInfo) -> int:
    """A range's to_seq is not before its from_seq (reported at to_seq, the field to fix)."""
    from_seq = info.data.get("from_seq")
    if from_seq is not None and to_seq < from_seq:
        raise ValueError(f"to_seq must be >= from_seq ({from_seq})")
    return to_seq


class SummaryPayload(_Strict):
    # Seqs start at 1: a range names entries that exist (see range_errors for its upper end).
    from_seq: Annotated[int, Field(ge=1)]
    to_seq: Annotated[int, Field(ge=1)]
    content: str
    model: str | None = None
    focus: str | None = None

    @field_validator("to_seq")
    @classmethod
    def _ordered(cls, to_seq: int, info: ValidationInfo) -> int:
        return _ordered_range(to_seq, info)


class RollbackPayload(_Strict):
    from_seq: Annotated[int, Field(ge=1)]
    to_seq: Annotated[int, Field(ge=1)]
    reason: str | None = None

    @field_validator("to_seq")
    @classmethod
    def _ordered(cls, to_seq: int, info: ValidationInfo) -> int:
        return _ordered_range(to_seq, info)


class RunStartPayload(_Open):
    run_id: str


class AgentVersionPayload(_Strict):
    agent_id: Annotated[str, Field(max_length=128)]
    agent_name: Annotated[str, Field(max_length=128)]
    from_version: Annotated[int, Field(ge=1)]
    to_version: Annotated[int, Field(ge=1)]


class RunEndPayload(_Open):
    run_id: str
    status: str


class UsagePayload(_Open):
    input_tokens: Annotated[int, Field(ge=0)] = 0
    output_tokens: Annotated[int, Field(ge=0)] = 0


class ErrorPayload(_Open):
    code: str
    message: str


class PolicyViolationPayload(_Open):
    rule: str
    message: str


PAYLOAD_TYPES: dict[EntryKind, type[BaseModel]] = {
    EntryKind.MESSAGE: MessagePayload,
    EntryKind.TOOL_CALL: ToolCallPayload,
    EntryKind.TOOL_RESULT: ToolResultPayload,
    EntryKind.SUMMARY: SummaryPayload,
    EntryKind.ROLLBACK: RollbackPayload,
    EntryKind.RUN_START: RunStartPayload,
    EntryKind.RUN_END: RunEndPayload,
    EntryKind.USAGE: UsagePayload,
    EntryKind.ERROR: ErrorPayload,
    EntryKind.POLICY_VIOLATION: PolicyViolationPayload,
    EntryKind.AGENT_VERSION: AgentVersionPayload,
}


class Refs(_Strict):
    run_id: Annotated[str, Field(max_length=128)] | None = None
    request_id: Annotated[str, Field(max_length=128)] | None = None
    call_id: Annotated[str, Field(max_length=128)] | None = None
    # Anthropic accepts only these characters in tool ids; OpenAI's ids fit too.
    tool_call_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")] | None = None
    # The id the model streamed for a call the service named itself (tracing only).
    upstream_tool_call_id: Annotated[str, Field(max_length=128)] | None = None
    iteration: Annotated[int, Field(ge=0)] | None = None
    parent_call_id: Annotated[str, Field(max_length=128)] | None = None
    # A user message sent while a run worked (multitask_strategy steer): steered into the run
    # `run_id` (steer_id), or the input of the run it started when that run ended first
    # (from_steer_id).
    steer_id: Annotated[str, Field(max_length=128)] | None = None
    from_steer_id: Annotated[str, Field(max_length=128)] | None = None
    # On a model's answer and tool calls: the seq of the oldest history entry in the context it
    # was sent. Later projections keep that window start while it fits (prompt caches).
    context_from: Annotated[int, Field(ge=1, le=2**63 - 1)] | None = None


_REFS = TypeAdapter(Refs)


class PayloadError(ValueError):
    """A payload or refs that do not fit their kind; `errors` are pydantic-style dicts."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("invalid entry")
        self.errors = errors


def normalize_entry(
    kind: EntryKind, payload: dict[str, Any], refs: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate payload and refs for `kind` and return their canonical JSON forms.

    Canonical means: defaults filled in, unset optionals left out, so equal entries compare equal
    (idempotent retries rely on that).
    """
    errors: list[dict[str, Any]] = []
    canonical_payload: dict[str, Any] = {}
    canonical_refs: dict[str, Any] = {}
    try:
        model = PAYLOAD_TYPES[kind].model_validate(payload)
        canonical_payload = model.model_dump(mode="json", exclude_none=True)
    except ValidationError as exc:
        errors += _located(exc, "payload")
    if kind == EntryKind.MESSAGE and canonical_payload:
        # What a provider would refuse: checked once, here, for every way an entry is written.
        errors += [
            p.as_error("payload", "content")
            for p in content_problems(canonical_payload["role"], canonical_payload["content"])
        ]
    try:
        canonical_refs = _REFS.validate_python(refs).model_dump(mode="json", exclude_none=True)
    except ValidationError as exc:
        errors += _located(exc, "refs")
    needs_call_id = kind in (EntryKind.TOOL_CALL, EntryKind.TOOL_RESULT)
    if not errors and needs_call_id and "tool_call_id" not in canonical_refs:
        errors.append(
            {
                "loc": ["refs", "tool_call_id"],
                "msg": f"{kind} entries need refs.tool_call_id",
                "type": "missing",
            }
        )
    if errors:
        raise PayloadError(errors)
    return canonical_payload, canonical_refs


RANGE_KINDS = frozenset({EntryKind.SUMMARY, EntryKind.ROLLBACK})


def range_errors(kind: str, payload: dict[str, Any], seq: int) -> list[dict[str, Any]]:
    """Why a summary's or rollback's range, in an entry appended at `seq`, names entries that do
    not exist; [] when it names only entries before it.

    Seqs are dense from 1, so "exists" is `to_seq < seq`: whatever precedes the entry in its
    thread, including earlier entries of the same batch and a fork's inherited prefix. A range
    reaching past it would hide entries appended later (every later question) from the model.
    Checked at append time, once the seq is known; `payload` is already validated.
    """
    if kind not in RANGE_KINDS or int(payload["to_seq"]) < seq:
        return []
    return [
        {
            "loc": ["payload", "to_seq"],
            "msg": f"to_seq must name an entry before this one (at most {seq - 1})",
            "type": "range_past_end",
        }
    ]


def _located(exc: ValidationError, prefix: str) -> list[dict[str, Any]]:
    return [{"loc": [prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
