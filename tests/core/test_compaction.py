"""Compaction planning and the summarizer's prompt: boundaries never cut a tool group or an
interleaved run, summaries are incremental, transcripts are chunked to fit."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.compaction import (
    CUT_MARK,
    INSTRUCTIONS,
    MIN_CHUNK_TOKENS,
    chunk_lines,
    plan_compaction,
    reaches_checkpoint,
    replaced_tokens,
    summary_problem,
    summary_request,
    transcript_lines,
)
from app.core.projection import JournalEntry
from app.core.tokens import HeuristicCounter


class Thread:
    """Builds a journal with dense seqs."""

    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []

    def add(self, kind: str, payload: dict[str, Any], **refs: Any) -> int:
        seq = len(self.entries) + 1
        self.entries.append(JournalEntry(seq, kind, payload, refs))
        return seq

    def user(self, text: str, run: str | None = None) -> int:
        refs = {"run_id": run} if run else {}
        return self.add("message", {"role": "user", "content": text}, **refs)

    def assistant(self, text: str, run: str | None = None) -> int:
        refs = {"run_id": run} if run else {}
        return self.add("message", {"role": "assistant", "content": text}, **refs)

    def tool_turn(self, call_id: str, output: str, run: str | None = None) -> tuple[int, int]:
        refs: dict[str, Any] = {"call_id": f"turn-{call_id}", "tool_call_id": call_id}
        if run:
            refs["run_id"] = run
        call = self.add("tool_call", {"name": "lookup", "arguments": {"q": call_id}}, **refs)
        result = self.add("tool_result", {"name": "lookup", "content": output}, **refs)
        return call, result

    def turn(self, index: int) -> int:
        first = self.user(f"question {index}")
        self.assistant(f"answer {index}")
        return first


def test_the_boundary_keeps_the_last_turns_raw() -> None:
    thread = Thread()
    starts = [thread.turn(i) for i in range(5)]
    plan = plan_compaction(thread.entries, keep_last_turns=2)
    assert plan is not None
    assert (plan.from_seq, plan.to_seq, plan.kept_turns) == (1, starts[3] - 1, 2)
    assert [e.seq for e in plan.entries] == list(range(1, starts[3]))
    assert plan.previous is None


def test_only_the_kept_turns_leaves_nothing_to_compact() -> None:
    thread = Thread()
    for i in range(3):
        thread.turn(i)
    assert plan_compaction(thread.entries, keep_last_turns=3) is None
    assert plan_compaction([], keep_last_turns=0) is None


def test_keep_zero_summarizes_everything() -> None:
    thread = Thread()
    for i in range(3):
        thread.turn(i)
    plan = plan_compaction(thread.entries, keep_last_turns=0)
    assert plan is not None and (plan.to_seq, plan.kept_turns) == (6, 0)


def test_a_tool_group_is_never_cut() -> None:
    thread = Thread()
    thread.turn(0)
    second = thread.user("look it up")
    call, result = thread.tool_turn("c1", "found")
    thread.assistant("here it is")
    third = thread.turn(2)
    plan = plan_compaction(thread.entries, keep_last_turns=1)
    assert plan is not None and plan.to_seq == third - 1
    assert {call, result} <= {e.seq for e in plan.entries}
    plan = plan_compaction(thread.entries, keep_last_turns=2)
    assert plan is not None and plan.to_seq == second - 1
    assert not {call, result} & {e.seq for e in plan.entries}


def test_an_interleaved_run_moves_the_boundary_back() -> None:
    # An enqueued ask is committed while the first run still works: its user message (seq 3)
    # precedes the first run's tool call and answer. No clean cut exists at it.
    thread = Thread()
    thread.user("first", run="r1")
    thread.add("run_start", {"run_id": "r1"}, run_id="r1")
    queued = thread.user("second", run="r2")
    thread.tool_turn("c1", "result", run="r1")
    thread.assistant("first answer", run="r1")
    thread.assistant("second answer", run="r2")
    assert plan_compaction(thread.entries, keep_last_turns=1) is None
    later = thread.turn(3)
    plan = plan_compaction(thread.entries, keep_last_turns=1)
    assert plan is not None and plan.to_seq == later - 1
    assert queued in {e.seq for e in plan.entries}


def test_a_run_never_summarizes_asks_made_after_it() -> None:
    thread = Thread()
    thread.turn(0)
    thread.user("mine", run="r1")
    after = thread.user("asked later", run="r2")
    plan = plan_compaction(thread.entries, keep_last_turns=1, run_id="r1")
    assert plan is not None and plan.to_seq == 2
    assert after not in {e.seq for e in plan.entries}


def test_compaction_is_incremental() -> None:
    thread = Thread()
    for i in range(4):
        thread.turn(i)
    thread.add("summary", {"from_seq": 1, "to_seq": 6, "content": "earlier"})
    for i in range(4, 7):
        thread.turn(i)
    plan = plan_compaction(thread.entries, keep_last_turns=1)
    assert plan is not None and plan.previous is not None
    assert plan.previous.payload["content"] == "earlier"
    assert plan.from_seq == 1  # the new summary covers the old one too
    assert [e.seq for e in plan.entries] == [7, 8, 10, 11, 12, 13]
    assert plan.to_seq == 13


def test_rolled_back_entries_are_not_summarized() -> None:
    thread = Thread()
    thread.turn(0)
    taken_back = thread.turn(1)
    thread.add("rollback", {"from_seq": taken_back, "to_seq": taken_back + 1})
    thread.turn(2)
    plan = plan_compaction(thread.entries, keep_last_turns=1)
    assert plan is not None
    assert [e.seq for e in plan.entries] == [1, 2]


def test_reaches_checkpoint() -> None:
    thread = Thread()
    for i in range(3):
        thread.turn(i)
    thread.add("summary", {"from_seq": 1, "to_seq": 4, "content": "s"})
    thread.turn(3)
    assert reaches_checkpoint(thread.entries[4:])  # starts right after what it covers
    assert not reaches_checkpoint(thread.entries[5:])
    assert not reaches_checkpoint(thread.entries[:4])  # no summary in it


def test_transcript_lines_tag_seqs_and_clip_huge_results() -> None:
    thread = Thread()
    thread.user("hello")
    thread.add(
        "message",
        {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url"}]},
    )
    thread.tool_turn("c1", "x" * 10_000)
    lines = transcript_lines(thread.entries)
    assert lines[0] == "[#1] user: hello"
    assert lines[1] == "[#2] user: see [1 image(s)]"
    assert lines[2] == '[#3] assistant called lookup({"q":"c1"})'
    assert lines[3].startswith("[#4] lookup returned: xxx")
    assert "characters omitted" in lines[3] and len(lines[3]) < 2_200


def test_the_summary_request_folds_in_the_previous_summary_and_the_focus() -> None:
    first = summary_request(None, ["[#1] user: hi"], None, 100)
    assert first[0].role == "system" and first[0].content == INSTRUCTIONS
    assert "summary so far" not in str(first[1].content)
    assert "IMPORTANT" not in str(first[1].content)
    again = summary_request("OLD SUMMARY", ["[#9] user: more"], "API changes", 100)
    text = str(again[1].content)
    assert text.startswith("The summary so far:\nOLD SUMMARY")
    assert "[#9] user: more" in text
    assert text.endswith("IMPORTANT: Focus the summary on: API changes")


def test_chunks_fit_their_limit_and_keep_every_line_in_order() -> None:
    counter = HeuristicCounter()
    lines = [f"[#{i}] user: " + "word " * (i % 40) for i in range(300)]
    chunks = chunk_lines(lines, counter, 200)
    assert [line for chunk in chunks for line in chunk] == lines
    assert all(sum(counter.count(line) + 1 for line in chunk) <= 200 for chunk in chunks)
    assert chunk_lines(lines, counter, 200) == chunks  # deterministic


def test_a_line_longer_than_a_chunk_is_cut_to_fit() -> None:
    counter = HeuristicCounter()
    chunks = chunk_lines(["short", "y" * 5_000, "tail"], counter, 100)
    cut = chunks[1][0] if len(chunks[0]) == 1 else chunks[0][1]
    assert cut.endswith(CUT_MARK) and counter.count(cut) + 1 <= 100
    with pytest.raises(ValueError):
        chunk_lines(["a"], counter, MIN_CHUNK_TOKENS - 1)


def test_a_range_stored_past_its_entry_covers_only_what_precedes_it() -> None:
    """Journals written before appends checked ranges: a summary reaching past its own seq
    (from 0) must not leave everything after it unsummarizable, nor plan an invalid range."""
    thread = Thread()
    for i in range(3):
        thread.turn(i)
    thread.add("summary", {"from_seq": 0, "to_seq": 1_000_000, "content": "earlier"})
    for i in range(3, 6):
        thread.turn(i)
    plan = plan_compaction(thread.entries, keep_last_turns=1)
    assert plan is not None
    assert (plan.from_seq, plan.to_seq) == (1, 11)
    assert [e.seq for e in plan.entries] == [8, 9, 10, 11]


@pytest.mark.parametrize(
    "summary",
    [
        "Here's the summary with only the requested 40 words: the user likes tea.",
        "Sure! Below is a summary of the chat.",
        "<|im_start|>assistant\nThe user likes tea.<|im_end|>",
        "<start_of_turn>model The user likes tea.",
        "The user likes tea.\n[#3] user: What did I ask you first?",
        "- the user likes tea\nassistant: I was just a helpful AI",
        "The summary so far:\nThe user likes tea.",
        "The user likes tea. Use at most 40 words.",
        "IMPORTANT: Focus the summary on: tea",
        "   ",
    ],
)
def test_a_summary_echoing_the_prompt_has_a_problem(summary: str) -> None:
    assert summary_problem(summary) is not None


@pytest.mark.parametrize(
    "summary",
    [
        "The user asked for the capital of France (Paris) and what 2+2 is (4).",
        "- Goal: plan a trip to Oslo [#3]\n- Decided: train, not plane (#5)\n- Open: hotel",
        "The user prefers short answers; the assistant's summary of the API: GET /v1/users.",
        "User goals: ship the billing API. Assistant notes: tests pass.",
    ],
)
def test_a_plain_summary_has_no_problem(summary: str) -> None:
    assert summary_problem(summary) is None


def test_replaced_tokens_count_the_entries_and_the_folded_summary() -> None:
    counter = HeuristicCounter()
    thread = Thread()
    thread.add("summary", {"from_seq": 1, "to_seq": 1, "content": "earlier summary text"})
    for i in range(3):
        thread.turn(i)
    plan = plan_compaction(thread.entries, keep_last_turns=1)
    assert plan is not None and plan.previous is not None
    entries = sum(counter.count(str(e.payload["content"])) for e in plan.entries)
    assert replaced_tokens(plan, counter) == entries + counter.count("earlier summary text")
