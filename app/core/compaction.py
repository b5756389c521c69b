"""Compaction: which part of a thread a summary may replace, and what the summarizer is asked.

Pure. A compaction summarizes everything since the previous summary checkpoint, folding that
summary in (so the new one covers both), up to a boundary that keeps the newest turns raw. The
boundary is a user message at which nothing straddles: every model entry before it in run order
has a smaller seq than every entry after it, so `to_seq` cuts no tool group and no interleaved
run. History itself is never rewritten: the summary is a new entry the projector starts from.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from app.core.entries import EntryKind
from app.core.messages import Message, canonical_json, result_text, text_of
from app.core.projection import (
    MODEL_KINDS,
    JournalEntry,
    covered_to,
    cut_to_tokens,
    in_run_order,
    without_rolled_back,
)
from app.core.tokens import TokenCounter, entry_tokens

# A tool result longer than this is shown to the summarizer clipped (head and tail): its full
# text stays in the journal, where search_history and read_tool_output still find it.
RESULT_CHARS = 2_000
RESULT_TAIL_CHARS = 500
# The least room a transcript chunk needs; below it the summarizer's window is too small.
MIN_CHUNK_TOKENS = 64

INSTRUCTIONS = (
    "You compact a conversation between a user and an AI assistant so that it can go on "
    "without its earlier messages: the assistant will read your summary instead of them.\n"
    "Keep what the rest of the conversation may need: the user's goals, requests and "
    "preferences; decisions and their reasons; facts, names, numbers, identifiers, paths and "
    "URLs, exactly; what tools returned that still matters; and what is unfinished. Leave out "
    "pleasantries and whatever was superseded. Write short paragraphs or bullet points, with no "
    "preamble. Output only the summary."
)


@dataclass(frozen=True)
class CompactionPlan:
    from_seq: int  # the first seq the new summary covers (the previous summary's, folded in)
    to_seq: int  # the last seq it covers: the projector keeps what comes after raw
    previous: JournalEntry | None  # the checkpoint folded into the new summary
    entries: tuple[JournalEntry, ...]  # the model-visible entries summarized, in run order
    kept_turns: int  # turns left raw after the boundary


def reaches_checkpoint(entries: Sequence[JournalEntry]) -> bool:
    """Whether a tail read newest-first holds all a compaction needs: the latest summary and
    everything after what it covers (else the loader must keep reading, to the thread's start)."""
    summary = _latest_summary(without_rolled_back(entries))
    return summary is not None and entries[0].seq <= covered_to(summary) + 1


def plan_compaction(
    entries: Sequence[JournalEntry],
    keep_last_turns: int,
    run_id: str | None = None,
    open_runs: Collection[str] = (),
) -> CompactionPlan | None:
    """What to summarize so that the newest `keep_last_turns` turns stay raw; None when nothing
    before them can be summarized. `entries` is the thread from before its latest checkpoint (or
    its start) to now, ascending; with `run_id`, for that run: asks made after it stay out.
    The turns of `open_runs` (runs not ended: queued, paused for tool outputs) and all after
    them stay raw too, whatever `keep_last_turns` says: their answers are still to come."""
    kept = without_rolled_back(entries)
    previous = _latest_summary(kept)
    covered = covered_to(previous) if previous is not None else 0
    model = in_run_order(
        [e for e in kept if e.kind in MODEL_KINDS and e.kind != EntryKind.SUMMARY],
        run_id,
    )
    model = [e for e in model if e.seq > covered]
    if not model:
        return None
    turn_starts = [i for i, e in enumerate(model) if _is_user_message(e)]
    unanswered = [i for i in turn_starts if model[i].refs.get("run_id") in open_runs]
    boundary = _boundary(model, turn_starts, keep_last_turns, unanswered[0] if unanswered else None)
    if boundary is None:
        return None
    summarized = tuple(model[:boundary])
    return CompactionPlan(
        # max: a summary stored before appends checked ranges may start at 0, which no seq is.
        from_seq=max(1, int(previous.payload["from_seq"]))
        if previous is not None
        else summarized[0].seq,
        to_seq=max(e.seq for e in summarized),
        previous=previous,
        entries=summarized,
        kept_turns=sum(1 for i in turn_starts if i >= boundary),
    )


def _boundary(
    model: list[JournalEntry], turn_starts: list[int], keep: int, limit: int | None
) -> int | None:
    """The index of the first entry kept raw: the newest clean boundary leaving `keep` turns,
    and none past `limit`."""
    if keep == 0 and limit is None:
        return len(model)
    prefix_max: list[int] = []
    for entry in model:
        prefix_max.append(max(entry.seq, prefix_max[-1]) if prefix_max else entry.seq)
    suffix_min = [0] * len(model)
    lowest = None
    for index in range(len(model) - 1, -1, -1):
        lowest = model[index].seq if lowest is None else min(lowest, model[index].seq)
        suffix_min[index] = lowest
    eligible = turn_starts[: max(len(turn_starts) - keep + 1, 0)] if keep else turn_starts
    if limit is not None:
        eligible = [i for i in eligible if i <= limit]
    for index in reversed(eligible):
        if index > 0 and prefix_max[index - 1] < suffix_min[index]:
            return index
    return None


def nothing_to_compact(keep_last_turns: int | None) -> str:
    """Why a compaction keeping `keep_last_turns` turns (None: the policy's) found nothing to
    summarize, in words for the person who asked (the 409, GET /context, the chat surfaces)."""
    if keep_last_turns == 0:
        return "Nothing to compact: the conversation has nothing left to summarize."
    kept = (
        "the newest turns"
        if keep_last_turns is None
        else "the newest turn"
        if keep_last_turns == 1
        else f"the newest {keep_last_turns} turns"
    )
    return (
        f"Nothing to compact yet: {kept} always stay as written, and nothing before them is "
        "left to summarize."
    )


def _latest_summary(kept: Sequence[JournalEntry]) -> JournalEntry | None:
    return next((e for e in reversed(kept) if e.kind == EntryKind.SUMMARY), None)


def _is_user_message(entry: JournalEntry) -> bool:
    return entry.kind == EntryKind.MESSAGE and entry.payload.get("role") == "user"


def transcript_lines(entries: Sequence[JournalEntry]) -> list[str]:
    """The entries as a plain transcript, one line per entry, each tagged with its seq (so a
    summary can point back into the journal)."""
    return [f"[#{e.seq}] {_describe(e)}" for e in entries]


def _describe(entry: JournalEntry) -> str:
    payload = entry.payload
    if entry.kind == EntryKind.TOOL_CALL:
        return f"assistant called {payload['name']}({canonical_json(payload['arguments'])})"
    if entry.kind == EntryKind.TOOL_RESULT:
        verb = "failed" if payload.get("is_error") else "returned"
        return f"{payload.get('name') or 'tool'} {verb}: {_clip(result_text(payload['content']))}"
    content = payload["content"]
    text = content if isinstance(content, str) else _parts_text(content)
    return f"{payload['role']}: {text}"


def _parts_text(parts: Sequence[dict[str, object]]) -> str:
    images = sum(1 for p in parts if p.get("type") == "image_url")
    text = text_of(tuple(parts))
    return text + (f" [{images} image(s)]" if images else "")


def _clip(text: str) -> str:
    if len(text) <= RESULT_CHARS:
        return text
    head = text[: RESULT_CHARS - RESULT_TAIL_CHARS]
    omitted = len(text) - RESULT_CHARS
    return f"{head} [… {omitted} characters omitted …] {text[-RESULT_TAIL_CHARS:]}"


def summary_request(
    previous: str | None, lines: Sequence[str], focus: str | None, max_words: int
) -> tuple[Message, ...]:
    """The summarizer's prompt for one chunk of transcript, folding in the summary so far."""
    parts = []
    if previous:
        parts.append(f"The summary so far:\n{previous}")
        parts.append("The conversation since then:\n" + "\n".join(lines))
        parts.append(
            "Write the updated summary. It replaces the summary so far, so it must cover "
            "everything above."
        )
    else:
        parts.append("The conversation:\n" + "\n".join(lines))
        parts.append("Write the summary.")
    parts.append(f"Use at most {max_words} words.")
    if focus:
        parts.append(f"IMPORTANT: Focus the summary on: {focus}")
    return (Message("system", INSTRUCTIONS), Message("user", "\n\n".join(parts)))


# What a summary must not contain, because it is the prompt coming back rather than a summary
# (small models echo it): the chat markers of a prompt format, the transcript's role labels
# opening a line, a preamble announcing the summary, or the summarizer prompt's own sentences.
_TEMPLATE_MARKER = re.compile(
    r"<\|[A-Za-z_]+\|>|<(?:start|end)_of_turn>|\[/?INST\]|<</?SYS>>", re.IGNORECASE
)
_ROLE_LABEL = re.compile(
    r"^[ \t]*(?:\[#\d+\][ \t]*)?(?:system|user|assistant|tool)[ \t]*:", re.IGNORECASE | re.MULTILINE
)
_PREAMBLE = re.compile(
    r"^\W*(?:here(?:'s|\s+is)|below\s+is|sure\b)[^\n]*\bsummary\b", re.IGNORECASE
)
PROMPT_PHRASES = (
    "The summary so far:",
    "The conversation since then:",
    "The conversation:",
    "Write the updated summary",
    "Write the summary",
    "Use at most",
    "Focus the summary on",
    "Output only the summary",
    "You compact a conversation",
)


def summary_problem(text: str) -> str | None:
    """Why `text` is not a usable summary (it carries prompt text or role markers), or None."""
    if not text.strip():
        return "the summary is empty"
    if found := _TEMPLATE_MARKER.search(text):
        return f"the summary contains the chat marker {found[0]!r}"
    if found := _ROLE_LABEL.search(text):
        return f"the summary repeats the transcript's role label {found[0].strip()!r}"
    if found := _PREAMBLE.search(text):
        return f"the summary opens with a preamble ({found[0].strip()!r})"
    lowered = text.lower()
    for phrase in PROMPT_PHRASES:
        if phrase.lower() in lowered:
            return f"the summary repeats the summarizer's instructions ({phrase!r})"
    return None


def replaced_tokens(plan: CompactionPlan, counter: TokenCounter) -> int:
    """The tokens of what a summary for `plan` stands in for, by `counter`: the entries it
    covers and the previous summary it folds in."""
    tokens = sum(entry_tokens(EntryKind(e.kind), e.payload, e.refs, counter) for e in plan.entries)
    if plan.previous is not None:
        tokens += counter.count(str(plan.previous.payload["content"]))
    return tokens


def chunk_lines(lines: Sequence[str], counter: TokenCounter, limit: int) -> list[list[str]]:
    """The transcript in chunks of at most `limit` tokens each (a line is counted with its
    newline); a single line longer than that is cut to fit. Deterministic."""
    if limit < MIN_CHUNK_TOKENS:
        raise ValueError(f"a transcript chunk needs at least {MIN_CHUNK_TOKENS} tokens of room")
    chunks: list[list[str]] = []
    current: list[str] = []
    used = 0
    for line in lines:
        tokens = counter.count(line) + 1
        if tokens > limit:
            # limit >= MIN_CHUNK_TOKENS: the mark always fits.
            line = cut_to_tokens(line, counter, limit - 1, CUT_MARK) or CUT_MARK
            tokens = counter.count(line) + 1
        if current and used + tokens > limit:
            chunks.append(current)
            current, used = [], 0
        current.append(line)
        used += tokens
    if current:
        chunks.append(current)
    return chunks


CUT_MARK = " [… cut to fit the summarizer's window]"
