"""Projection benchmark: read + project latency, token counting cost, prompt-prefix stability.

Prints figures only. Run with `python -m bench.projection`; it uses THREADLINE_DATABASE_URL when
set, else a throwaway embedded cluster left at Postgres's default (durable) settings.

1. project_session on a short and a long session under one explicit policy: the loader should
   read about a budget's worth of the tail, whatever the session's length.
2. tiktoken throughput over a mixed corpus, and what counting adds to a single-entry append.
3. Pure: how often consecutive asks of a scripted conversation (a tool-heavy research session
   and a plain chat) keep their prompt prefix, and the share of input tokens a provider's prompt
   cache can serve, at budgets of 4k to 32k, under chunked versus sliding windowing. Run only
   this part with `python -m bench.projection prefix`. Beside each, the most any windowing
   could keep (kept_at_most): a window may leave at most a chunk of its room unused, so the
   thread grows by at most a chunk and a turn between jumps, and with turns of g tokens about
   chunk / g asks keep the prefix for each that cannot. A 4k window's budget is 3,000 and its
   chunk 2,048: 200-token chat turns allow about 90 %, the research session's turns (about 440
   tokens as projected, its large outputs evicted to previews) about 80 %, and even a window
   that could leave all its room unused only about 81 %; at 8k (4,096 chunk, 650-token turns)
   about 85 %. Monotonic fill costs more: a budget just past a power of two must send at least
   what the largest budget below it sends, whose chunk is half as large. And anchors are placed
   by the journal's stored counts, which count an evicted output whole: at 4k the research
   session's turns store 745 tokens but send 437, so its anchors are closer in the prompt than
   the chunk, and its window jumps more often than the bound's.
"""

from __future__ import annotations

import ast
import asyncio
import itertools
import json
import os
import random
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any
from unittest.mock import patch

from sqlalchemy import RowMapping, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import Settings
from app.core.entries import EntryKind, JournalEntry, NewEntry
from app.core.formats import to_openai
from app.core.lineage import Segment
from app.core.messages import ToolSpec
from app.core.policy import ContextPolicy
from app.core.projection import Projection, ProjectionInput, project
from app.core.tokens import HeuristicCounter, TokenCounter, entry_tokens, message_tokens
from app.core.tokens import tools_tokens as count_tools
from app.db import journal as journal_db
from app.db.engine import create_engine
from app.llm.tokenizers import encoding_counter, stored_counter
from app.services.journal import append_entries
from app.services.keys import create_key, tenant_for_key
from app.services.projection import SessionProjection, project_session
from app.services.sessions import create_session
from bench.journal import LOAD_BATCH, database, median_ms, report

MODEL = "openai:gpt-4o"
POLICY: dict[str, Any] = {"max_input_tokens": 16_000}
SMALL, SATURATED, BIG = 100, 2_000, 100_000
SIZES = (SMALL, SATURATED, BIG)
CALLS = 30
CONTENT_CHARS = 200
TOOL_EVERY = 20  # every 20th turn of the loaded sessions calls a tool

ENCODINGS = ("o200k_base", "cl100k_base")
CORPUS_CHARS = {"prose": 800_000, "code": 600_000, "json": 400_000, "non-ASCII": 200_000}
PIECE_CHARS = (500, 8_000)  # the corpus is counted as messages of these sizes, not one string
COUNT_RUNS = 5
SHORT_APPENDS, LARGE_APPENDS = 50, 20
LARGE_CHARS = 100_000
COUNT_SAMPLES = 30
COUNT_REPEAT = 10  # entry_tokens calls per timing sample: one short count is a few µs

TURNS = 200
# From a tight window (a research turn is ~25% of the budget) to a roomy one (~3%).
PREFIX_WINDOWS = (4_000, 8_000, 16_000, 32_000)
# An ask keeps the prefix when it repeats at least this share of the previous ask's prompt.
KEEP_SHARE = 0.9
SEED = 20_261_122
SYSTEM_PROMPT = (
    "You are a careful research assistant. Answer concisely, cite the tool output you used, "
    "and say so when you do not know."
)
TOOLS = (
    ToolSpec(
        "search",
        "Full-text search over the team's documents.",
        {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    ),
    ToolSpec(
        "read_file",
        "Read a file from the repository.",
        {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    ),
)

_WORD_LIST = (
    "the of and to in is that for it as with was on be by this are from at or an have not "
    "which but all they we can their has more one will if about when would there so what "
    "some been other than these into its time only could new may after also should two "
    "first any because over such like most very between where well through each much "
    "system data request session model token budget window prompt cache journal entry "
    "answer question report result schedule release server client latency memory"
)
WORDS = _WORD_LIST.split()
NON_ASCII = (
    "Die Größe des Kontextfensters bestimmt, wie viel Verlauf das Modell sieht.",
    "Le résumé remplace les échanges antérieurs ; la fenêtre glisse par blocs.",
    "¿Dónde está la última respuesta del asistente? Está en el diario, señor.",
    "Журнал только дополняется: записи никогда не изменяются и не удаляются.",
    "Η προβολή είναι καθαρή συνάρτηση του ημερολογίου και της πολιτικής.",  # noqa: RUF001
    "上下文窗口决定了模型能看到多少历史记录，超出部分将被丢弃。",  # noqa: RUF001
    "プロンプトの先頭が一致していれば、キャッシュされたトークンは安くなります。",
    "세션은 부모의 기록을 복사하지 않고 공유합니다.",
    "يتم حساب الرموز مرة واحدة عند الإضافة ثم تُجمع لاحقًا.",
    "टोकन की गिनती एक बार होती है, जब प्रविष्टि जोड़ी जाती है।",
    "Deploy finished ✅ — 3 warnings ⚠️, 0 errors 🎉 (build #4521 → prod).",
)


# --- Text --------------------------------------------------------------------------------


def prose(rng: random.Random, chars: int) -> str:
    """Sentence-shaped filler of about `chars` characters."""
    sentences: list[str] = []
    size = 0
    while size < chars:
        words = rng.choices(WORDS, k=rng.randint(6, 18))
        sentence = " ".join(words).capitalize() + rng.choice(".?.!.")
        sentences.append(sentence)
        size += len(sentence) + 1
    return " ".join(sentences)[:chars]


def json_text(rng: random.Random, chars: int) -> str:
    """Tool-output-like JSON: records with ids, names, numbers, dates and tags."""
    records = []
    size = 0
    while size < chars:
        record = {
            "id": rng.randrange(10**9),
            "name": " ".join(rng.choices(WORDS, k=3)),
            "price": round(rng.uniform(0, 500), 2),
            "in_stock": rng.random() < 0.7,
            "created_at": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T12:00:00Z",
            "tags": rng.sample(WORDS, k=rng.randint(1, 4)),
        }
        records.append(record)
        size += len(json.dumps(record, indent=2)) + 4
    return json.dumps(records, indent=2)[:chars]


def non_ascii(rng: random.Random, chars: int) -> str:
    return " ".join(rng.choices(NON_ASCII, k=chars // 40))[:chars]


def stdlib_sources() -> Iterator[str]:
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        yield path.read_text(encoding="utf-8", errors="replace")


def docstrings(source: str) -> Iterator[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


def take(texts: Iterator[str], chars: int) -> str:
    """Concatenate texts until `chars` characters."""
    parts: list[str] = []
    size = 0
    for part in texts:
        parts.append(part)
        size += len(part) + 2
        if size >= chars:
            break
    return "\n\n".join(parts)[:chars]


def corpus() -> dict[str, str]:
    """~2 MB: English prose (the stdlib's docstrings), Python code, JSON, several scripts."""
    rng = random.Random(SEED)
    prose_docs = (d for s in stdlib_sources() for d in docstrings(s))
    return {
        "prose": take(prose_docs, CORPUS_CHARS["prose"]),
        "code": take(stdlib_sources(), CORPUS_CHARS["code"]),
        "json": json_text(rng, CORPUS_CHARS["json"]),
        "non-ASCII": non_ascii(rng, CORPUS_CHARS["non-ASCII"]),
    }


def pieces(texts: Sequence[str]) -> list[str]:
    """Cut each text into message-sized pieces of varied length."""
    rng = random.Random(SEED)
    cut: list[str] = []
    for whole in texts:
        at = 0
        while at < len(whole):
            size = rng.randint(*PIECE_CHARS)
            cut.append(whole[at : at + size])
            at += size
    return cut


# --- 1. Read + project latency -----------------------------------------------------------


def message(role: str, turn: int) -> NewEntry:
    rng = random.Random(turn * 2 + (role == "assistant"))
    content = f"{role} turn {turn}: " + prose(rng, CONTENT_CHARS)
    return NewEntry(EntryKind.MESSAGE, {"role": role, "content": content[:CONTENT_CHARS]}, {})


def tool_pair(turn: int) -> list[NewEntry]:
    refs = {"call_id": f"turn-{turn}", "tool_call_id": f"call-{turn}"}
    rng = random.Random(-turn)
    return [
        NewEntry(EntryKind.TOOL_CALL, {"name": "search", "arguments": {"query": f"t{turn}"}}, refs),
        NewEntry(EntryKind.TOOL_RESULT, {"content": json_text(rng, 600)}, refs),
    ]


def thread_entries() -> Iterator[NewEntry]:
    """An endless conversation: user and assistant messages, now and then a tool call."""
    for turn in itertools.count():
        yield message("user", turn)
        if turn % TOOL_EVERY == TOOL_EVERY - 1:
            yield from tool_pair(turn)
        yield message("assistant", turn)


async def loaded_session(engine: AsyncEngine, tenant: str, entries: int) -> str:
    session = await create_session(
        engine, tenant, title="bench", metadata={}, config={"model": MODEL}
    )
    session_id = session.id
    stream = thread_entries()
    for first in range(0, entries, LOAD_BATCH):
        batch = list(itertools.islice(stream, min(LOAD_BATCH, entries - first)))
        await append_entries(engine, tenant, session_id, batch, expected_rev=None)
    return session_id


@dataclass
class TailRead:
    """What the tail loader fetched during one projection."""

    rows: int = 0
    queries: int = 0
    complete: bool = False


async def recorded_projection(
    engine: AsyncEngine, settings: Settings, tenant: str, session_id: str
) -> tuple[SessionProjection, TailRead]:
    """One projection with the loader's reads counted: the service does not expose them."""
    seen = TailRead()
    read_tail, read_entries = journal_db.read_tail, journal_db.read_entries

    async def counted_tail(
        conn: AsyncConnection, segments: Sequence[Segment], *args: Any, **kwargs: Any
    ) -> tuple[list[JournalEntry], bool]:
        rows, complete = await read_tail(conn, segments, *args, **kwargs)
        seen.rows, seen.complete = len(rows), complete
        return rows, complete

    async def counted_page(*args: Any, **kwargs: Any) -> list[RowMapping]:
        seen.queries += 1
        return await read_entries(*args, **kwargs)

    with (
        patch.object(journal_db, "read_tail", counted_tail),
        patch.object(journal_db, "read_entries", counted_page),
    ):
        result = await project_session(engine, settings, tenant, session_id, policy=POLICY)
    return result, seen


async def bench_latency(engine: AsyncEngine, settings: Settings, tenant: str) -> None:
    start = time.perf_counter()
    sessions = {size: await loaded_session(engine, tenant, size) for size in SIZES}
    seconds = time.perf_counter() - start
    total = sum(SIZES)
    report("load", f"{total:,} entries, appends of {LOAD_BATCH:,}", f"{seconds:.1f} s")
    report("project", "policy", f"{MODEL}, {json.dumps(POLICY)}")

    async def once(size: int) -> None:
        await project_session(engine, settings, tenant, sessions[size], policy=POLICY)

    await once(SMALL)  # the first call compiles the statements
    medians: dict[int, float] = {}
    for size, session_id in sessions.items():
        medians[size] = await median_ms(partial(once, size), CALLS)
        result, read = await recorded_projection(engine, settings, tenant, session_id)
        meta = result.projection.meta
        report("project", f"{size:,}-entry session", f"median {medians[size]:.2f} ms over {CALLS}")
        report(
            "project",
            "  loader read",
            f"{read.rows:,} entries in {read.queries} queries (complete: {read.complete})",
        )
        report(
            "project",
            "  projected",
            f"{meta.entries_included:,} entries, {meta.estimated_tokens:,} of {meta.budget:,}"
            f" tokens (truncated: {meta.truncated})",
        )
    report(
        "project",
        "ratio big/small",
        f"{medians[BIG] / medians[SMALL]:.2f} (O(1) read: ~1; the small one fits whole)",
    )
    report(
        "project",
        f"ratio big/{SATURATED:,} (both overflow)",
        f"{medians[BIG] / medians[SATURATED]:.2f} (length-independent: ~1)",
    )


# --- 2. Token counting -------------------------------------------------------------------


def median_seconds(work: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def count_all(counter: TokenCounter, texts: Sequence[str]) -> int:
    return sum(counter.count(t) for t in texts)


def bench_tokenizers() -> None:
    parts = corpus()
    texts = pieces(list(parts.values()))
    chars = sum(len(t) for t in texts)
    megabytes = sum(len(t.encode()) for t in texts) / 2**20
    mix = ", ".join(f"{name} {len(body) // 1000} k" for name, body in parts.items())
    report("tokens", "corpus", f"{megabytes:.2f} MiB, {chars:,} chars ({mix})")
    report(
        "tokens", "  counted as", f"{len(texts):,} messages of {PIECE_CHARS[0]}-{PIECE_CHARS[1]}"
    )
    for name in ENCODINGS:
        counter = encoding_counter(name)
        tokens = count_all(counter, texts)  # also warms the encoder
        seconds = median_seconds(partial(count_all, counter, texts), COUNT_RUNS)
        report(
            "tokens",
            name,
            f"{tokens / seconds / 1e6:.2f} M tokens/s, {megabytes / seconds:.1f} MiB/s"
            f" ({tokens:,} tokens, {chars / tokens:.2f} chars/token)",
        )
    seconds = median_seconds(partial(count_all, HeuristicCounter(), texts), COUNT_RUNS)
    report(
        "tokens",
        "heuristic (4 chars/token)",
        f"{chars / seconds / 1e9:,.0f} G chars/s, {seconds / len(texts) * 1e9:.0f} ns per message"
        " (len() only: size-independent)",
    )


def counting_ms(entry: NewEntry) -> float:
    """Median ms of entry_tokens on `entry`: the counting an append does."""
    counter = stored_counter()
    samples = []
    for _ in range(COUNT_SAMPLES):
        start = time.perf_counter()
        for _ in range(COUNT_REPEAT):
            entry_tokens(entry.kind, entry.payload, entry.refs, counter)
        samples.append((time.perf_counter() - start) * 1000 / COUNT_REPEAT)
    return statistics.median(samples)


async def append_ms(engine: AsyncEngine, tenant: str, entry: NewEntry, times: int) -> float:
    """Median ms of appending `entry` alone, to a fresh session, `times` times."""
    session = await create_session(engine, tenant, title="bench", metadata={}, config={})
    session_id = session.id

    async def append() -> None:
        await append_entries(engine, tenant, session_id, [entry], expected_rev=None)

    await append()  # the first call compiles the statements
    return await median_ms(append, times)


async def bench_append_cost(engine: AsyncEngine, tenant: str) -> None:
    large_refs = {"tool_call_id": "call-large"}
    rng = random.Random(SEED)
    cases = {
        f"{CONTENT_CHARS}-char message": (message("user", 0), SHORT_APPENDS),
        f"{LARGE_CHARS // 1000} KB tool output": (
            NewEntry(EntryKind.TOOL_RESULT, {"content": json_text(rng, LARGE_CHARS)}, large_refs),
            LARGE_APPENDS,
        ),
    }
    for label, (entry, times) in cases.items():
        total = await append_ms(engine, tenant, entry, times)
        counting = counting_ms(entry)
        tokens = entry_tokens(entry.kind, entry.payload, entry.refs, stored_counter())
        report("append", f"{label}, {tokens:,} tokens", f"append with counting {total:.3f} ms")
        report("append", "  of which counting", f"{counting:.3f} ms ({counting / total:.1%})")


# --- 3. Prefix stability (pure) ----------------------------------------------------------


@dataclass(frozen=True)
class ToolUse:
    name: str
    arguments: dict[str, Any]
    result: str


@dataclass(frozen=True)
class Turn:
    user: str
    tool: ToolUse | None
    answer: str


def script() -> list[Turn]:
    """A research session: short and long asks and answers, a third of the turns calling a tool
    whose result is up to 5,000 characters of JSON."""
    rng = random.Random(SEED)
    turns = []
    for _ in range(TURNS):
        tool = None
        if rng.random() < 0.35:
            body = json_text(rng, rng.randint(200, 5_000))
            tool = ToolUse("search", {"query": prose(rng, 40)}, body)
        turns.append(
            Turn(prose(rng, rng.randint(40, 700)), tool, prose(rng, rng.randint(80, 2_400)))
        )
    return turns


def chat_script() -> list[Turn]:
    """A plain chat: asks of 40-500 characters, answers of 80-1,500, no tools."""
    rng = random.Random(SEED + 1)
    return [
        Turn(prose(rng, rng.randint(40, 500)), None, prose(rng, rng.randint(80, 1_500)))
        for _ in range(TURNS)
    ]


class Journal:
    """Entries as the service stores them: dense seqs, token counts taken at append."""

    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []
        self.token_total = 0
        self.counter = stored_counter()

    def add(self, kind: EntryKind, payload: dict[str, Any], refs: dict[str, Any]) -> None:
        seq = len(self.entries) + 1
        tokens = entry_tokens(kind, payload, refs, self.counter)
        self.entries.append(JournalEntry(seq, str(kind), payload, refs, tokens, f"e{seq}"))
        self.token_total += tokens

    def project(self, policy: ContextPolicy) -> Projection:
        return project(
            ProjectionInput(
                entries=tuple(self.entries),
                complete=True,
                rev=len(self.entries),
                policy=policy,
                counter=self.counter,
                exact=True,
                system_prompt=SYSTEM_PROMPT,
                tools=TOOLS,
            )
        )

    def finish_turn(self, turn: Turn, number: int, sent: Projection | None = None) -> None:
        """The model's side of a turn; `sent`: the context it was answered from, recorded on
        the answer and its calls as a run records it (refs.context_from)."""
        start = sent.meta.window_start_seq if sent is not None else None
        said = {} if start is None else {"context_from": start}
        if turn.tool is not None:
            refs = {"call_id": f"turn-{number}", "tool_call_id": f"call-{number}"}
            call = {"name": turn.tool.name, "arguments": turn.tool.arguments}
            self.add(EntryKind.TOOL_CALL, call, {**refs, **said})
            self.add(EntryKind.TOOL_RESULT, {"content": turn.tool.result}, refs)
        self.add(EntryKind.MESSAGE, {"role": "assistant", "content": turn.answer}, said)


def shared_prefix_tokens(previous: Projection, current: Projection) -> int:
    """Tokens of the leading part of `current`'s request that is identical to `previous`'s."""
    return _prefix_tokens(current, _same_messages(previous, current))


def cacheable_tokens(previous: Projection, current: Projection) -> int:
    """Tokens of `current`'s request a provider's prompt cache can serve: its prefix up to the
    furthest cache breakpoint of `previous` (where that request wrote the cache) that it
    repeats byte for byte."""
    same = _same_messages(previous, current)
    reached = [b for b in previous.meta.cache_breakpoints if b < same]
    return _prefix_tokens(current, reached[-1] + 1) if reached else 0


def _same_messages(previous: Projection, current: Projection) -> int:
    """How many leading messages the two requests share, on the wire (-1: the tools differ)."""
    before = to_openai(previous.messages, previous.tool_spec)
    after = to_openai(current.messages, current.tool_spec)
    if before.get("tools") != after.get("tools"):
        return -1
    same = 0
    for old, new in zip(before["messages"], after["messages"], strict=False):
        if old != new:
            break
        same += 1
    return same


def _prefix_tokens(projection: Projection, messages: int) -> int:
    """The tokens of the tools and the first `messages` messages (none when -1)."""
    if messages < 0:
        return 0
    counter = stored_counter()
    shared = sum(message_tokens(m, counter) for m in projection.messages[:messages])
    return count_tools(projection.tool_spec, counter) + shared


def request_tokens(projection: Projection) -> int:
    return _prefix_tokens(projection, len(projection.messages))


@dataclass
class WindowStats:
    asks: int = 0
    pairs: int = 0
    kept: int = 0
    jumps: int = 0
    truncated: int = 0
    prompt_tokens: int = 0
    shared_tokens: int = 0
    request_tokens: int = 0  # as the shares count them: tools and messages
    cacheable_tokens: int = 0
    thread_tokens: int = 0  # the whole conversation's stored token counts

    @property
    def kept_share(self) -> float:
        return self.kept / self.pairs

    @property
    def cacheable_share(self) -> float:
        return self.cacheable_tokens / self.request_tokens

    def add(self, previous: Projection | None, current: Projection) -> None:
        self.asks += 1
        self.prompt_tokens += current.meta.estimated_tokens
        self.request_tokens += request_tokens(current)
        self.truncated += current.meta.truncated
        if previous is None:
            return
        shared = shared_prefix_tokens(previous, current)
        self.pairs += 1
        self.shared_tokens += shared
        self.cacheable_tokens += cacheable_tokens(previous, current)
        self.kept += shared >= KEEP_SHARE * previous.meta.estimated_tokens
        self.jumps += previous.meta.window_start_seq != current.meta.window_start_seq


def simulate(policy: ContextPolicy, turns: Sequence[Turn]) -> WindowStats:
    """Ask after each user message; compare every ask's request with the one before."""
    journal = Journal()
    stats = WindowStats()
    previous: Projection | None = None
    for number, turn in enumerate(turns):
        journal.add(EntryKind.MESSAGE, {"role": "user", "content": turn.user}, {})
        current = journal.project(policy)
        stats.add(previous, current)
        previous = current
        journal.finish_turn(turn, number, current)
    stats.thread_tokens = journal.token_total
    return stats


@dataclass(frozen=True)
class CountedTurns:
    """A scripted conversation as its projections count it."""

    asks: list[int]  # each turn's user message: the newest turn when it is asked
    sizes: list[int]  # each whole turn, as the older history of later asks
    fixed: int  # tools, system message and reply priming


def counted_turns(policy: ContextPolicy, turns: Sequence[Turn]) -> CountedTurns:
    journal = Journal()
    for number, turn in enumerate(turns):
        journal.add(EntryKind.MESSAGE, {"role": "user", "content": turn.user}, {})
        journal.finish_turn(turn, number)
    # All of it, with the outputs evicted as under the policy's own budget.
    whole = policy.model_copy(
        update={
            "max_input_tokens": 10_000_000,
            "tool_output_eviction_tokens": policy.eviction_tokens,
            "window_chunk_tokens": 0,
        }
    )
    projection = journal.project(whole)
    counter = stored_counter()
    asks: list[int] = []
    sizes: list[int] = []
    for message in projection.messages:
        if message.role == "system":
            continue
        tokens = message_tokens(message, counter)
        if message.role == "user":
            asks.append(tokens)
            sizes.append(0)
        sizes[-1] += tokens
    meta = projection.meta
    return CountedTurns(asks, sizes, meta.estimated_tokens - meta.history_tokens)


def kept_at_most(
    counted: CountedTurns, budget: int, unused: int | None, keep_last_turns: int = 0
) -> float:
    """The most consecutive asks any windowing could keep the prompt prefix on, when a window
    may leave at most `unused` tokens of the room unused (None: any amount) and must hold the
    newest `keep_last_turns` turns while they fit (the policy's; the ask's own among them).

    A window that remembers where it started, jumps only when it no longer fits, and then lands
    on the latest turn start within the allowance: each jump's window starts as empty as allowed,
    so it fits the most asks before the next (it is checked only where it jumps, so this errs
    high). Between jumps the thread grows by at most the allowance and a turn: with turns of g
    tokens, about allowance / g asks keep the prefix for each that cannot.
    """
    start = kept = 0
    for ask in range(1, len(counted.asks)):
        room = budget - counted.fixed - counted.asks[ask]
        if sum(counted.sizes[start:ask]) <= room:
            kept += 1
            continue
        landing, fullest, window = None, ask, 0
        for index in range(ask - 1, start, -1):
            window += counted.sizes[index]
            if window > room:
                break
            fullest = index
            if landing is None and (unused is None or window >= room - unused):
                landing = index
        start = fullest if landing is None else landing
        protected = ask - (keep_last_turns - 1)
        if keep_last_turns > 1 and protected >= fullest:
            start = min(start, protected)
    return kept / (len(counted.asks) - 1)


def bench_prefix() -> None:
    summary: dict[str, list[str]] = {}
    for name, turns in (("research", script()), ("chat", chat_script())):
        for window in PREFIX_WINDOWS:
            policy = ContextPolicy(max_input_tokens=window)
            stats = bench_prefix_window(name, policy, turns)
            counted = counted_turns(policy, turns)
            keep = policy.keep_last_turns
            chunk = kept_at_most(counted, policy.budget, policy.chunk_tokens, keep)
            unkept = kept_at_most(counted, policy.budget, policy.chunk_tokens)
            anything = kept_at_most(counted, policy.budget, None)
            report(
                "prefix",
                "  kept at most",
                f"{chunk:.1%} with at most a chunk unused and the last {keep} turns kept "
                f"({unkept:.1%} dropping them), {anything:.1%} with any window "
                f"({sum(counted.sizes) / len(counted.sizes):,.0f} tokens per turn)",
            )
            summary.setdefault(name, []).append(
                f"{window // 1000}k {stats.kept_share:.1%} / {stats.cacheable_share:.1%}"
                f" (<= {chunk:.1%}, {(chunk - stats.kept_share) * 100:.1f} under)"
            )
    for name, figures in summary.items():
        report(
            "prefix",
            f"{name}: kept / cache can serve (kept at most, points under it)",
            ", ".join(figures),
        )


def bench_prefix_window(name: str, policy: ContextPolicy, turns: list[Turn]) -> WindowStats:
    chunked = policy
    sliding = policy.model_copy(update={"window_chunk_tokens": 0})
    results = {
        f"chunked ({chunked.chunk_tokens:,}-token chunks)": simulate(chunked, turns),
        "sliding (window_chunk_tokens=0)": simulate(sliding, turns),
    }
    chunk, slide = results.values()
    report(
        "prefix",
        f"{name}, max_input {chunked.max_input_tokens:,}",
        f"{TURNS} turns ({sum(t.tool is not None for t in turns)} with a tool call), "
        f"{chunk.thread_tokens / TURNS:,.0f} tokens per turn; budget {chunked.budget:,} "
        f"(system prompt and {len(TOOLS)} tools)",
    )
    for label, stats in results.items():
        report(
            "prefix",
            label,
            f"{stats.kept_share:.1%} of asks keep >= {KEEP_SHARE:.0%} of the prompt as prefix",
        )
        report("prefix", "  cache can serve", f"{stats.cacheable_share:.1%} of input tokens")
        report("prefix", "  window jumps", f"{stats.jumps} (of {stats.pairs} consecutive asks)")
        report(
            "prefix",
            "  mean tokens per ask",
            f"{stats.prompt_tokens / stats.asks:,.0f} prompt, "
            f"{stats.shared_tokens / stats.pairs:,.0f} shared with the ask before",
        )
        report("prefix", "  truncated asks", f"{stats.truncated} of {stats.asks}")
    ratio = (
        f"{chunk.kept_share / slide.kept_share:.2f}" if slide.kept else "n/a (sliding kept none)"
    )
    report("prefix", "ratio chunked/sliding (kept share)", ratio)
    return chunk


# --- Running -----------------------------------------------------------------------------


async def print_header(engine: AsyncEngine, source: str) -> None:
    async with engine.connect() as conn:
        server = (await conn.execute(text("SHOW server_version"))).scalar_one()
    print("Threadline projection benchmark")
    print(f"machine:  {os.cpu_count()} cores")
    print(f"database: {source}; postgres {server}")
    print(f"tiktoken: {version('tiktoken')}")


async def run(url: str, source: str) -> None:
    settings = Settings(database_url=url, default_model=MODEL)
    engine = create_engine(settings)
    try:
        await print_header(engine, source)
        tenant = await tenant_for_key(engine, await create_key(engine, "bench"))
        if tenant is None:
            raise RuntimeError("a freshly created key resolved to no tenant")
        await bench_latency(engine, settings, tenant)
        bench_tokenizers()
        await bench_append_cost(engine, tenant)
    finally:
        await engine.dispose()
    bench_prefix()


def main() -> None:
    if sys.argv[1:] == ["prefix"]:
        bench_prefix()
        return
    with database() as (url, source):
        asyncio.run(run(url, source))


if __name__ == "__main__":
    main()
