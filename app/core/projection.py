"""project(input) -> result: the journal's tail, through a policy, into a model's context.

Pure and deterministic. Segments: system ⊕ summary ⊕ history ⊕ pending. History is cut into
atomic groups (a user message; an assistant turn's tool calls with all their results) that are
kept or dropped whole, newest first, within the token budget. When older history must go, the
window keeps the start the newest answer's context had (its `refs.context_from`) while that still
fits, so consecutive prompts share a byte-identical prefix until the next jump; a jump leaves up
to a chunk (`window_chunk_tokens`) of the room unused, so that the next one comes late.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.core.content import is_reasoning, without_reasoning
from app.core.entries import EntryKind, JournalEntry, PendingEntry
from app.core.eviction import READ_TOOL_OUTPUT, output_ref, oversized_page, preview, sizes
from app.core.formats import MAX_CACHE_BREAKPOINTS
from app.core.memory import MEMORY_LINES, memory_block
from app.core.messages import Message, ToolCall, ToolSpec, result_text
from app.core.policy import ContextPolicy, largest_budget_with_chunk
from app.core.tokens import (
    REPLY_PRIMING,
    STORED_ENCODING,
    STORED_IMAGES,
    TokenCounter,
    entry_tokens,
    has_images,
    images_of,
    message_overhead,
    reasoning_tokens,
    tools_tokens,
)

# The most of the budget the injected memory may take; beyond, fewer of its lines are shown.
MEMORY_SHARE = 0.25
SUMMARY_PREFIX = "Summary of the earlier conversation:\n"
# Ends a summary cut to the room left in the context (one too large for the reading model's
# budget: appended by a client, or written for a model with a larger window).
SUMMARY_CUT_MARK = "\n[… the rest of this summary was cut to fit the context window]"
INTERRUPTED_RESULT = "Tool call interrupted: no result was recorded."
# How much more than the budget a loader reads when entries must be recounted (another
# encoding, or the heuristic), since stored counts then only approximate the real ones.
RECOUNT_SLACK = 1.25
MODEL_KINDS = frozenset(
    {EntryKind.MESSAGE, EntryKind.TOOL_CALL, EntryKind.TOOL_RESULT, EntryKind.SUMMARY}
)


@dataclass(frozen=True)
class ProjectionInput:
    entries: Sequence[JournalEntry]  # the tail the loader read, ascending seq, ending at rev
    complete: bool  # the tail reaches the thread's start (the projector sees a checkpoint itself)
    rev: int
    policy: ContextPolicy
    counter: TokenCounter
    exact: bool  # counter is the model's own tokenizer (else the policy's margin applies)
    pending: Sequence[PendingEntry] = ()
    system_prompt: str | None = None
    memory: str | None = None  # the session's memory: its first MEMORY_LINES join the system
    memory_namespace: str | None = None  # named in the memory block's header
    tools: Sequence[ToolSpec] = ()
    run_id: str | None = None  # projecting for this run: later asks are not its business
    # The reasoning part types the model takes back (Anthropic's thinking, OpenAI Responses'
    # reasoning items): the newest turn's tool loop's are sent and counted (a loop left
    # unfinished before it included). Older turns' never are (both APIs drop them there, and
    # count them not); no other reasoning is sent to any provider.
    reasoning_sent: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ProjectionMeta:
    basis_rev: int
    basis_last_seq: int
    pending_count: int
    truncated: bool
    estimated_tokens: int
    budget: int
    summary_used: bool
    summary_seq: int | None
    # The checkpoint did not fit next to the newest turn: it was cut to the room left (with
    # SUMMARY_CUT_MARK) or, with no room even for that, left out (summary_used false).
    summary_truncated: bool
    entries_included: int
    entries_total: int
    needs_summary: bool
    window_start_seq: int | None  # the oldest history entry sent
    # Where the tokens go (before any estimate margin); REPLY_PRIMING makes up the rest.
    system_tokens: int
    memory_tokens: int  # the memory block in the system message (its overhead if it is alone)
    summary_tokens: int
    tools_tokens: int
    history_tokens: int
    pending_tokens: int
    evicted_outputs: int  # tool results in the window sent as a preview (read_tool_output)
    # Indices in the messages that end a prefix a provider should cache (at most
    # MAX_CACHE_BREAKPOINTS, ascending): the system message (with the tools before it), the
    # summary checkpoint, the last message before the newest turn, and the last message.
    cache_breakpoints: tuple[int, ...] = ()


@dataclass(frozen=True)
class Projection:
    messages: tuple[Message, ...]
    tool_spec: tuple[ToolSpec, ...]
    meta: ProjectionMeta


class ContextOverflow(ValueError):
    """Even the newest turn cannot fit: the ask must be refused, not truncated.

    `details`: tokens (the newest turn's), budget, required_tokens (= tokens) and fixed_tokens
    (system prompt, memory and tools: what the turn must share the budget with; a summary is
    not among them, since it is cut to make room rather than refusing the ask)."""

    def __init__(self, details: dict[str, int]) -> None:
        super().__init__(
            f"the newest turn needs {details['tokens']} tokens, and with the "
            f"{details['fixed_tokens']} tokens of system prompt, memory and tools it exceeds "
            f"the budget of {details['budget']} tokens"
        )
        self.details = details


@dataclass
class _Group:
    messages: list[Message]
    tokens: int
    entries: int  # journal entries it represents
    first_seq: int
    starts_turn: bool  # a user message: windows start only at turn starts
    pending: bool = False
    evicted: int = 0  # tool results shown as a preview


def project(source: ProjectionInput) -> Projection:
    policy, counter = source.policy, source.counter
    tokens_of = _entry_counter(counter)
    # Pending entries are projected as the journal will hold them once appended (at rev+1..,
    # counted as the append counts them), through the same path as history: a dry run shows
    # exactly what the ask that commits them sends.
    pending = [
        JournalEntry(
            source.rev + 1 + i,
            p.kind,
            p.payload,
            p.refs,
            entry_tokens(EntryKind(p.kind), p.payload, p.refs, counter),
        )
        for i, p in enumerate(source.pending)
    ]
    entries = [*source.entries, *pending]
    kept = without_rolled_back(entries)
    summary = _checkpoint(kept, policy)
    # History older than the checkpoint's coverage never matters: reaching it is reaching the
    # start (else every projection after a compaction would count as truncated).
    complete = source.complete or (
        summary is not None and entries[0].seq <= covered_to(summary) + 1
    )
    history = in_run_order(
        [
            e
            for e in kept
            if e.kind in MODEL_KINDS
            and e.kind != EntryKind.SUMMARY
            and e.kind in policy.include_kinds
            and (summary is None or e.seq > covered_to(summary))
        ],
        source.run_id,
    )
    groups = _groups(history, tokens_of, counter, policy.eviction_tokens)
    for group in groups:
        group.pending = group.first_seq > source.rev

    head = _head(source, summary, tokens_of)
    tools = _with_output_reader(source.tools, groups)
    tool_tokens = tools_tokens(tools, counter)
    older, required = _split_at_newest_turn(groups)
    unfinished = _unfinished_loop_start(older)
    for at, group in enumerate(older):
        _settle_reasoning(group, source.reasoning_sent if at >= unfinished else NONE, counter)
    for group in required:
        _settle_reasoning(group, source.reasoning_sent, counter)
    required_tokens = sum(g.tokens for g in required)
    margin = 0.0 if source.exact else policy.estimate_margin
    budget = math.floor(policy.budget / (1 + margin))
    base = REPLY_PRIMING + tool_tokens + head.system_tokens + head.memory_tokens
    if base + required_tokens > budget:
        raise ContextOverflow(
            {
                "tokens": required_tokens,
                "budget": budget,
                "fixed_tokens": base,
                "required_tokens": required_tokens,
            }
        )
    summary_truncated = False
    if summary is not None and base + head.summary_tokens + required_tokens > budget:
        # Degrade rather than refuse: a checkpoint too large for this model's budget would
        # otherwise fail every ask from now on.
        head = _head(source, summary, tokens_of, room=budget - base - required_tokens)
        summary_truncated = True
    fixed = base + head.summary_tokens

    def room_at(any_budget: int) -> int:
        return math.floor(any_budget / (1 + margin)) - fixed - required_tokens

    start = _window_start(older, required, room_at, complete, policy, _context_from(kept))
    window = older[start:] + required
    raw = fixed + sum(g.tokens for g in window)
    estimated = math.ceil(raw * (1 + margin))
    truncated = start > 0 or not complete or summary_truncated
    summary_sent = summary is not None and head.summary_tokens > 0
    history_in_window = [g for g in window if not g.pending]
    meta = ProjectionMeta(
        basis_rev=source.rev,
        basis_last_seq=source.entries[-1].seq if source.entries else 0,
        pending_count=len(source.pending),
        truncated=truncated,
        estimated_tokens=estimated,
        budget=policy.budget,
        summary_used=summary_sent,
        summary_seq=summary.seq if summary else None,
        summary_truncated=summary_truncated,
        entries_included=sum(g.entries for g in history_in_window) + summary_sent,
        entries_total=source.rev,
        needs_summary=truncated or estimated >= policy.compress_threshold * policy.budget,
        window_start_seq=history_in_window[0].first_seq if history_in_window else None,
        system_tokens=head.system_tokens,
        memory_tokens=head.memory_tokens,
        summary_tokens=head.summary_tokens,
        tools_tokens=tool_tokens,
        history_tokens=sum(g.tokens for g in history_in_window),
        pending_tokens=sum(g.tokens for g in window if g.pending),
        evicted_outputs=sum(g.evicted for g in history_in_window),
        cache_breakpoints=cache_breakpoints(
            head, summary_sent, sum(len(g.messages) for g in older[start:]), window
        ),
    )
    messages = head.messages + tuple(m for g in window for m in g.messages)
    return Projection(messages, tools, meta)


def cache_breakpoints(
    head: _Head, summary_sent: bool, older_messages: int, window: Sequence[_Group]
) -> tuple[int, ...]:
    """Where the prompt's stable prefixes end, as message indices.

    Each is a prefix the next ask repeats byte for byte unless the window jumps: the system
    message (tools and system prompt change only when configured), the summary checkpoint
    (until the next compaction), the end of the history before the newest turn (which the
    model calls of that turn's tool loop repeat), and the last message (the next ask repeats
    all of it, up to its own newest turn).
    """
    points: set[int] = set()
    system = 1 if head.messages and head.messages[0].role == "system" else 0
    if system:
        points.add(0)
    if summary_sent:
        points.add(len(head.messages) - 1)
    if older_messages:
        points.add(len(head.messages) + older_messages - 1)
    total = len(head.messages) + sum(len(g.messages) for g in window)
    if total:
        points.add(total - 1)
    return tuple(sorted(points))[-MAX_CACHE_BREAKPOINTS:]


def _split_at_newest_turn(groups: list[_Group]) -> tuple[list[_Group], list[_Group]]:
    """(older, required): from the newest user message on, and all that is pending, must be
    sent; older history is what the budget may drop."""
    turn_starts = [i for i, g in enumerate(groups) if g.starts_turn]
    first_pending = next((i for i, g in enumerate(groups) if g.pending), len(groups))
    newest = min(turn_starts[-1] if turn_starts else len(groups), first_pending)
    return groups[:newest], groups[newest:]


def _unfinished_loop_start(older: list[_Group]) -> int:
    """Where the tool loop the newest turn continues starts in `older` (len: none). A loop
    without a final answer (a fork inside it, a run stopped in it) goes on in the newest user
    message: Anthropic reads that message, which opens with the loop's tool results, as part
    of the loop, and wants the loop's thinking back."""
    start = len(older)
    while start and older[start - 1].messages[-1].role == "tool":
        start -= 1
    return start


NONE: frozenset[str] = frozenset()


def _settle_reasoning(group: _Group, sent: frozenset[str], counter: TokenCounter) -> None:
    """The group's reasoning parts of the `sent` types sent and counted (entries' stored counts
    leave them out), the others taken out of its messages."""
    for at, message in enumerate(group.messages):
        content = message.content
        if isinstance(content, str) or not any(is_reasoning(p) for p in content):
            continue
        kept = tuple(without_reasoning(content, sent))
        group.tokens += sum(reasoning_tokens(p, counter) for p in kept if is_reasoning(p))
        if len(kept) != len(content):
            group.messages[at] = replace(message, content=kept or "")


def _with_output_reader(tools: Sequence[ToolSpec], history: list[_Group]) -> tuple[ToolSpec, ...]:
    """The tools, plus read_tool_output once an output was evicted (unless one is declared).

    Decided on the history considered, before the window is, since the tool's definition is part
    of the fixed budget the window is fitted to: an evicted output the window then leaves out
    still keeps it offered (a stable tool list is a stable prompt prefix, too).
    """
    declared = any(t.name == READ_TOOL_OUTPUT.name for t in tools)
    if declared or not any(g.evicted for g in history):
        return tuple(tools)
    return (*tools, READ_TOOL_OUTPUT)


def tail_suffices(entries: Sequence[JournalEntry], policy: ContextPolicy, recount: bool) -> bool:
    """Whether a tail read newest-first already holds all a projection could use.

    True once it contains the checkpoint and everything after it, or once what it holds would
    overflow the budget (with slack when counts are only approximations), so that nothing older
    could be sent anyway.
    """
    kept = without_rolled_back(entries)
    summary = _checkpoint(kept, policy)
    if summary is not None and entries and entries[0].seq <= covered_to(summary) + 1:
        return True
    model_entries = [e for e in kept if e.kind in MODEL_KINDS and e.kind in policy.include_kinds]
    tokens = sum(_loader_tokens(e, policy, recount) for e in model_entries)
    if tokens > policy.budget * (RECOUNT_SLACK if recount else 1):
        return True
    messages = sum(1 for e in model_entries if e.kind == EntryKind.MESSAGE)
    return policy.max_messages > 0 and messages > 2 * policy.max_messages


# An output the projection would evict counts as its preview: one token per this many characters
# of it, fewer than real text costs (3 to 5 characters a token in the encodings we count).
PREVIEW_CHARS_PER_TOKEN = 6


def _loader_tokens(entry: JournalEntry, policy: ContextPolicy, recount: bool) -> int:
    """An entry's share of the budget as the loader reckons it: its stored count, except that
    an evicted output counts as its preview.

    A 100 KB output stores about 25,000 tokens but projects as a few hundred: counted whole, it
    would stop the loader while history that fits is still unread (even the newest user message,
    behind a run's many large outputs). The preview's estimate errs low, so the loader reads a
    little more rather than too little; a preview is bounded (2 x PART_CHARS and a marker), so
    the read still ends once the budget is full. With recounting, stored counts only approximate
    the model's, so anything that might cross the threshold counts as evicted.
    """
    threshold = policy.eviction_tokens / (RECOUNT_SLACK if recount else 1)
    if entry.kind != EntryKind.TOOL_RESULT or entry.token_count <= threshold:
        return entry.token_count
    part_chars, page_chars = sizes(policy.eviction_tokens)
    text = result_text(entry.payload.get("content"))
    shown = preview(text, output_ref(entry.seq), part_chars=part_chars, page_chars=page_chars)
    return min(entry.token_count, len(shown) // PREVIEW_CHARS_PER_TOKEN)


def _entry_counter(counter: TokenCounter) -> Any:
    def recount(e: JournalEntry) -> int:
        return entry_tokens(EntryKind(e.kind), e.payload, e.refs, counter)

    if counter.name != STORED_ENCODING:
        return recount
    if images_of(counter) == STORED_IMAGES:
        return lambda e: e.token_count  # counted once, at append: read, not recomputed
    # Same encoding, another image rule (e.g. gpt-4o-mini): only entries with images differ.
    return lambda e: recount(e) if has_images(e.kind, e.payload) else e.token_count


def in_run_order(entries: list[JournalEntry], run_id: str | None) -> list[JournalEntry]:
    """Each run's entries right after the user message that started it; with `run_id`, without
    the asks that came after that run's.

    Asks queued behind a running run are committed when they arrive, so seqs interleave: the
    user's second message can precede the answer to the first. A model must see each answer
    after its question, and a run must not answer a question asked after it.
    """
    # A run's input is its user message; messages steered into it later (refs.steer_id) are
    # among its entries, not where it starts.
    inputs = {
        str(e.refs["run_id"]): e.seq
        for e in entries
        if e.kind == EntryKind.MESSAGE
        and e.payload.get("role") == "user"
        and "run_id" in e.refs
        and "steer_id" not in e.refs
    }

    def anchor(entry: JournalEntry) -> int:
        return inputs.get(str(entry.refs.get("run_id")), entry.seq)

    limit = inputs.get(run_id) if run_id is not None else None
    ordered = [e for e in entries if limit is None or anchor(e) <= limit]
    return sorted(ordered, key=lambda e: (anchor(e), e.seq))


def without_rolled_back(entries: Sequence[JournalEntry]) -> list[JournalEntry]:
    """Drop what rollback entries took back; a rollback inside a newer one's range is void."""
    removed = rolled_back(entries)
    return [e for e in entries if e.kind != EntryKind.ROLLBACK and e.seq not in removed]


@dataclass(frozen=True)
class RolledBack:
    """The seq ranges rollbacks took out of the conversation: `seq in rolled_back(...)`."""

    ranges: tuple[tuple[int, int], ...]

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and _within(seq, self.ranges)


def rolled_back(entries: Sequence[JournalEntry]) -> RolledBack:
    """What the rollbacks among `entries` (in seq order; other kinds are passed over) take out;
    a rollback inside a newer one's range is void."""
    removed: list[tuple[int, int]] = []
    for entry in reversed(entries):
        if entry.kind != EntryKind.ROLLBACK or _within(entry.seq, removed):
            continue
        removed.append((int(entry.payload["from_seq"]), covered_to(entry)))
    return RolledBack(tuple(removed))


def covered_to(entry: JournalEntry) -> int:
    """The last seq a summary or rollback covers: its to_seq, but never itself or later.

    Appends refuse ranges past the entry (app.core.entries.range_errors); journals written
    before that may hold one, and it must not hide every later question from the model.
    """
    return min(int(entry.payload["to_seq"]), entry.seq - 1)


def _within(seq: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any(low <= seq <= high for low, high in ranges)


def _checkpoint(kept: Sequence[JournalEntry], policy: ContextPolicy) -> JournalEntry | None:
    if policy.summarization == "none" or "summary" not in policy.include_kinds:
        return None
    return next((e for e in reversed(kept) if e.kind == EntryKind.SUMMARY), None)


def _context_from(entries: Sequence[JournalEntry]) -> int | None:
    """Where the newest answer's context started (the `context_from` its run recorded): the
    window start to keep while it fits."""
    for entry in reversed(entries):
        seq = entry.refs.get("context_from")
        if isinstance(seq, int) and not isinstance(seq, bool):
            return seq
    return None


@dataclass(frozen=True)
class _Head:
    """The fixed segments: system prompt and memory (one message), then the summary."""

    messages: tuple[Message, ...]
    system_tokens: int
    memory_tokens: int
    summary_tokens: int


def _memory_block(source: ProjectionInput) -> str:
    """The memory's first MEMORY_LINES lines, or fewer when those would take more than
    MEMORY_SHARE of the budget (a 256 KiB memory could otherwise crowd every prompt out).
    Deterministic: the same memory and policy give the same block."""
    assert source.memory is not None
    limit = int(source.policy.budget * MEMORY_SHARE)
    block = memory_block(source.memory, source.memory_namespace)
    if source.counter.count(block) <= limit:
        return block
    low, high = 0, MEMORY_LINES  # the most lines that fit, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        shorter = memory_block(source.memory, source.memory_namespace, lines=middle)
        if source.counter.count(shorter) <= limit:
            low = middle
        else:
            high = middle - 1
    return memory_block(source.memory, source.memory_namespace, lines=low)


def _head(
    source: ProjectionInput,
    summary: JournalEntry | None,
    tokens_of: Any,
    room: int | None = None,
) -> _Head:
    """The fixed segments; with `room`, the summary message takes at most that many tokens
    (cut with SUMMARY_CUT_MARK, or left out when not even the mark fits)."""
    counter, policy = source.counter, source.policy
    messages: list[Message] = []
    system_tokens = memory_tokens = summary_tokens = 0
    prompt = policy.system_prompt if policy.system_prompt is not None else source.system_prompt
    if prompt:
        system_tokens = message_overhead("system", counter) + counter.count(prompt)
    # Memory joins the one system message (whichever prompt applies), after the prompt: a
    # function of the memory's content only, so the prompt prefix holds while it is unchanged.
    # Its tokens are what it adds to the message, so system + memory is the message's count.
    block = _memory_block(source) if source.memory else None
    if block is not None and prompt:
        system = f"{prompt}\n\n{block}"
        memory_tokens = counter.count(system) - counter.count(prompt)
    elif block is not None:
        system = block
        memory_tokens = message_overhead("system", counter) + counter.count(block)
    else:
        system = prompt or ""
    if system:
        messages.append(Message("system", system))
    if summary is not None:
        text = str(summary.payload["content"])
        wrapping = message_overhead(policy.summary_role, counter) + counter.count(SUMMARY_PREFIX)
        text_tokens: int | None = tokens_of(summary)
        if room is not None:
            cut = cut_to_tokens(text, counter, room - wrapping, SUMMARY_CUT_MARK)
            text, text_tokens = (cut, counter.count(cut)) if cut is not None else ("", None)
        if text_tokens is not None:
            content = (
                {"type": "text", "text": SUMMARY_PREFIX},
                {"type": "text", "text": text},
            )
            messages.append(Message(policy.summary_role, content))
            summary_tokens = wrapping + text_tokens
    return _Head(tuple(messages), system_tokens, memory_tokens, summary_tokens)


# How many characters per token a cut may assume at most: it bounds the prefix searched, so
# cutting a huge text costs a few counts of a bounded prefix, not of the whole text.
MAX_CHARS_PER_TOKEN = 16


def cut_to_tokens(text: str, counter: TokenCounter, limit: int, mark: str) -> str | None:
    """The longest prefix of `text` that, followed by `mark`, counts at most `limit` tokens
    (found by bisection: deterministic); None when not even the mark fits."""
    if counter.count(mark) > limit:
        return None
    low, high = 0, min(len(text), max(limit, 0) * MAX_CHARS_PER_TOKEN)
    while low < high:
        middle = (low + high + 1) // 2
        if counter.count(text[:middle] + mark) <= limit:
            low = middle
        else:
            high = middle - 1
    return text[:low] + mark


def _groups(
    entries: Sequence[JournalEntry],
    tokens_of: Any,
    counter: TokenCounter,
    evict_above: int | None = None,
) -> list[_Group]:
    """Atomic groups in order; tool calls gather their results, wherever those were written.

    Results over `evict_above` tokens are shown as previews (None: never).
    """
    answers = _pair_results(entries)
    wire_ids = _distinct_call_ids(entries)
    groups: list[_Group] = []
    index = 0
    while index < len(entries):
        entry = entries[index]
        if entry.kind == EntryKind.TOOL_RESULT:
            index += 1  # attached to its call's group, or an orphan: dropped either way
            continue
        text: JournalEntry | None = None
        if entry.kind == EntryKind.MESSAGE and not _opens_tool_turn(entries, index):
            groups.append(_message_group(entry, tokens_of, counter))
            index += 1
            continue
        if entry.kind == EntryKind.MESSAGE:
            text, index = entry, index + 1
        calls: list[_Call] = []
        turn = entries[index].refs.get("call_id")
        while (
            index < len(entries)
            and entries[index].kind == EntryKind.TOOL_CALL
            and entries[index].refs.get("call_id") == turn
        ):
            calls.append(_Call(entries[index], wire_ids[index], answers.get(index)))
            index += 1
        if calls:
            groups.append(_tool_group(text, calls, tokens_of, counter, evict_above))
        elif text is not None:
            groups.append(_message_group(text, tokens_of, counter))
    return groups


@dataclass(frozen=True)
class _Call:
    entry: JournalEntry
    wire_id: str  # its tool_call_id, unless an earlier call in the history has that one
    result: JournalEntry | None


def _pair_results(entries: Sequence[JournalEntry]) -> dict[int, JournalEntry]:
    """Each call's result (by the call's index in `entries`), wherever it was written.

    Ids need not be unique in a thread (imports, journals written before the service named its
    calls), and an imported journal may hold a result before its call. A result answers, in
    turn: an unanswered call with its id of its own model turn (before or after it); else an
    earlier unanswered call with its id (the oldest); else the first later one. A second result
    for a call is ignored; a recorded result is never left out while its call waits.
    """
    calls: dict[str, list[int]] = {}
    results: list[int] = []
    for index, entry in enumerate(entries):
        if entry.kind == EntryKind.TOOL_CALL:
            calls.setdefault(str(entry.refs.get("tool_call_id")), []).append(index)
        elif entry.kind == EntryKind.TOOL_RESULT:
            results.append(index)
    answers: dict[int, JournalEntry] = {}
    unpaired: list[int] = []
    for index in results:  # its own turn's call, wherever that was written
        entry = entries[index]
        turn = entry.refs.get("call_id")
        same_turn = [
            i
            for i in calls.get(str(entry.refs.get("tool_call_id")), [])
            if i not in answers and turn is not None and entries[i].refs.get("call_id") == turn
        ]
        if same_turn:
            answers[same_turn[0]] = entry
        else:
            unpaired.append(index)
    for index in unpaired:
        waiting = [
            i
            for i in calls.get(str(entries[index].refs.get("tool_call_id")), [])
            if i not in answers
        ]
        earlier = [i for i in waiting if i < index]
        chosen = earlier or waiting
        if chosen:
            answers[chosen[0]] = entries[index]
    return answers


def _distinct_call_ids(entries: Sequence[JournalEntry]) -> dict[int, str]:
    """The id each call is sent under (by its index in `entries`): its own, or, where an earlier
    call already has it, one made distinct with the call's seq (a provider refuses a request
    that repeats a call id, and a repeated id would make results ambiguous)."""
    used: set[str] = set()
    wire: dict[int, str] = {}
    for index, entry in enumerate(entries):
        if entry.kind != EntryKind.TOOL_CALL:
            continue
        call_id = str(entry.refs.get("tool_call_id"))
        candidate, attempt = call_id, 0
        while candidate in used:
            attempt += 1
            suffix = f"_{entry.seq}" + (f"_{attempt}" if attempt > 1 else "")
            candidate = call_id[: 128 - len(suffix)] + suffix
        used.add(candidate)
        wire[index] = candidate
    return wire


def _opens_tool_turn(entries: Sequence[JournalEntry], index: int) -> bool:
    """An assistant message immediately followed by tool calls of the same model turn."""
    entry = entries[index]
    if entry.payload.get("role") != "assistant" or index + 1 >= len(entries):
        return False
    following = entries[index + 1]
    return following.kind == EntryKind.TOOL_CALL and following.refs.get(
        "call_id"
    ) == entry.refs.get("call_id")


def _message_group(entry: JournalEntry, tokens_of: Any, counter: TokenCounter) -> _Group:
    payload = entry.payload
    content = (
        payload["content"] if isinstance(payload["content"], str) else tuple(payload["content"])
    )
    message = Message(payload["role"], content, name=payload.get("name"))
    return _Group(
        messages=[message],
        tokens=message_overhead(message.role, counter) + tokens_of(entry),
        entries=1,
        first_seq=entry.seq,
        starts_turn=message.role == "user",
    )


def _tool_group(
    text: JournalEntry | None,
    calls: list[_Call],
    tokens_of: Any,
    counter: TokenCounter,
    evict_above: int | None = None,
) -> _Group:
    first = text or calls[0].entry
    content = "" if text is None else text.payload["content"]
    assistant = Message(
        "assistant",
        content if isinstance(content, str) else tuple(content),
        name=None if text is None else text.payload.get("name"),
        tool_calls=tuple(
            ToolCall(c.wire_id, c.entry.payload["name"], c.entry.payload["arguments"])
            for c in calls
        ),
    )
    tokens = message_overhead("assistant", counter) + sum(tokens_of(c.entry) for c in calls)
    tokens += tokens_of(text) if text is not None else 0
    messages = [assistant]
    entries = len(calls) + (text is not None)
    evicted = 0
    for call, paired in zip(assistant.tool_calls, calls, strict=True):
        found = paired.result
        # Counts were stored with the journaled id: a call sent under another one (a repeated
        # id, made distinct) costs the difference, in the call and in its result.
        journaled = str(paired.entry.refs.get("tool_call_id"))
        renamed = counter.count(call.id) - counter.count(journaled)
        tokens += message_overhead("tool", counter) + renamed
        if found is None:  # never answered (a crash, a cancel): say so rather than omit it
            messages.append(
                Message("tool", INTERRUPTED_RESULT, tool_call_id=call.id, is_error=True)
            )
            tokens += counter.count(INTERRUPTED_RESULT) + counter.count(call.id)
            continue
        output, output_tokens = result_text(found.payload.get("content")), tokens_of(found)
        previewed = False
        # Too large: a preview with a reference; the journal keeps the output for
        # read_tool_output. A page it returned that is too large is not previewed (the model
        # asked for that text) but refused with the page size that fits.
        if evict_above is not None and output_tokens > evict_above:
            part_chars, page_chars = sizes(evict_above)
            if call.name == READ_TOOL_OUTPUT.name:
                shown = oversized_page(output_tokens, evict_above, page_chars)
            else:
                ref = output_ref(found.seq)
                shown = preview(output, ref, part_chars=part_chars, page_chars=page_chars)
            if shown != output:
                evicted, previewed = evicted + 1, True
                output, output_tokens = shown, counter.count(shown) + counter.count(call.id)
        if not previewed:  # the stored count has the journaled id
            output_tokens += renamed
        messages.append(
            Message(
                "tool",
                output,
                tool_call_id=call.id,
                is_error=bool(found.payload.get("is_error", False)),
            )
        )
        tokens += output_tokens
        entries += 1
    return _Group(messages, tokens, entries, first.seq, False, evicted=evicted)


def _window_start(
    older: list[_Group],
    required: list[_Group],
    room_at: Callable[[int], int],
    complete: bool,
    policy: ContextPolicy,
    context_from: int | None,
) -> int:
    """Index of the oldest group to send. `room_at(budget)`: the room older history has when
    the policy's budget is `budget`; `context_from`: where the newest answer's context started.

    A window keeps that start from ask to ask while it fits, so that consecutive prompts share
    their prefix; when it no longer fits, it starts anew at the newest turn start that leaves at
    most the chunk of the room unused (the emptiest allowed window runs the longest before the
    next jump). What holds whatever the history and `context_from`: the window never leaves
    more than a chunk of the room unused when older history was dropped, unless no turn start
    uses more; it keeps the policy's last turns while they fit; and a larger budget never sends
    less (the least a window holds, `_least_window`, grows with the budget).
    """
    plan = _WindowPlan(older, required, complete, policy)
    room = room_at(policy.budget)
    fill = plan.fill_start(room)
    if fill == 0 and complete:
        return 0  # everything fits
    starts = [i for i in plan.turn_starts if i >= fill]
    if not starts:
        return len(older)
    least = _least_window(room, room_at, policy)
    kept = next((i for i in starts if older[i].first_seq == context_from), None)
    if kept is not None and plan.suffix[kept] >= least:
        chosen = kept
    else:
        # Starts are oldest first and hold less and less: the last that holds `least`.
        roomy = [i for i in starts if plan.suffix[i] >= least]
        chosen = roomy[-1] if roomy else starts[0]
    if plan.protected is not None and plan.protected >= fill:
        chosen = min(chosen, plan.protected)  # never drop the turns the policy keeps
    return chosen


def _least_window(room: int, room_at: Callable[[int], int], policy: ContextPolicy) -> int:
    """The least older history a truncated window holds: the room less the chunk. The default
    chunk doubles where the budget crosses a power of two, and the room less it would then
    shrink; so it is also at least what the largest budget of each lower level holds, which
    keeps a larger budget from ever sending less."""
    least = room - policy.chunk_tokens
    if policy.window_chunk_tokens is not None:
        return least
    level = policy.chunk_tokens  # a power of two
    while level > 1:
        level //= 2
        below = room_at(largest_budget_with_chunk(level))
        if below < 0:
            break
        least = max(least, below - level)
    return least


class _WindowPlan:
    """Where windows over `older` may start, and what each sends."""

    def __init__(
        self, older: list[_Group], required: list[_Group], complete: bool, policy: ContextPolicy
    ) -> None:
        self.older, self.policy = older, policy
        self.required_messages = sum(len(g.messages) for g in required)
        # suffix[i]: the tokens older[i:] adds.
        self.suffix = [0] * (len(older) + 1)
        for index in range(len(older) - 1, -1, -1):
            self.suffix[index] = self.suffix[index + 1] + older[index].tokens
        # Windows start at turn starts; the tail's first group only when it is the thread's.
        self.turn_starts = [i for i, g in enumerate(older) if g.starts_turn and (i > 0 or complete)]
        self.protected = _protected_start(self.turn_starts, policy.keep_last_turns)

    def fill_start(self, room: int) -> int:
        """The oldest group a newest-first fill reaches within `room` and the message cap."""
        cap = self.policy.max_messages
        start, messages = len(self.older), self.required_messages
        for index in range(len(self.older) - 1, -1, -1):
            messages += len(self.older[index].messages)
            if self.suffix[index] > room or (cap and messages > cap):
                break
            start = index
        return start


def _protected_start(turn_starts: list[int], keep_last_turns: int) -> int | None:
    """The oldest turn start of the protected turns among older history (the newest turn, which
    is always sent, counts as one of them)."""
    keep = keep_last_turns - 1
    if keep <= 0 or not turn_starts:
        return None
    return turn_starts[-min(keep, len(turn_starts))]
