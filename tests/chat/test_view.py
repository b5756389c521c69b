"""How a run shows: events in, what a terminal (or a pipe) gets out."""

from __future__ import annotations

import io
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text as RichText

from app.chat.client import RunEvent
from app.chat.view import RunView, Tail, printable


def console(terminal: bool, height: int = 40) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    screen = Console(file=out, force_terminal=terminal, width=80, height=height, highlight=False)
    return screen, out


def events(*pairs: tuple[str, dict[str, Any]]) -> list[RunEvent]:
    return [RunEvent(i, name, data) for i, (name, data) in enumerate(pairs, start=1)]


COMPLETED: dict[str, Any] = {
    "model": "openai:m",
    "text": "",
    "usage": None,
    "finish_reason": "stop",
}


def show(view: RunView, run: list[RunEvent]) -> None:
    with view:
        for event in run:
            view.handle(event)


def test_a_reset_voids_the_turn_that_streamed_not_the_tools_before_it() -> None:
    screen, out = console(terminal=True)
    view = RunView(screen)
    run = events(
        ("message.delta", {"text": "Let me look."}),
        ("tool_call", {"tool_call_id": "c", "name": "get_weather", "arguments": {"city": "Oslo"}}),
        (
            "tool_result",
            {
                "tool_call_id": "c",
                "name": "get_weather",
                "is_error": False,
                "preview": '{"temp_c": 3}',
            },
        ),
        ("message.delta", {"text": "Voided words"}),
        ("message.reset", {"reason": "provider_retry", "attempt": 1}),
        ("message.delta", {"text": "It is **3 °C**."}),
        ("run.completed", {**COMPLETED, "text": "It is 3 °C."}),
    )
    show(view, run)
    assert [b for b in view.blocks if isinstance(b, str)] == ["Let me look.", "It is **3 °C**."]
    final = out.getvalue()
    assert 'get_weather({"city": "Oslo"})' in final and "the answer starts over" in final


def test_a_pipe_gets_the_answer_as_plain_text_and_each_ending_says_how() -> None:
    screen, out = console(terminal=False)
    show(
        RunView(screen),
        events(
            ("message.delta", {"text": "Half an "}),
            ("message.delta", {"text": "answer"}),
            (
                "run.failed",
                {
                    "model": "openai:m",
                    "partial_text": "Half an answer",
                    "error": {"code": "provider_server", "message": "Upstream broke"},
                },
            ),
        ),
    )
    assert out.getvalue() == "Half an answer\nfailed: Upstream broke (provider_server)\n"

    screen, out = console(terminal=False)
    show(
        RunView(screen),
        events(("run.cancelled", {"model": "m", "partial_text": "", "reason": "cancel"})),
    )
    assert out.getvalue() == "stopped: the partial answer is kept, marked incomplete\n"

    screen, out = console(terminal=False)
    usage = {"input_tokens": 12, "output_tokens": 3}
    finished = {**COMPLETED, "text": "Cut", "usage": usage, "finish_reason": "length"}
    show(RunView(screen), events(("message.delta", {"text": "Cut"}), ("run.completed", finished)))
    assert out.getvalue() == "Cut\nopenai:m · 12 in / 3 out tokens · cut off (max_output_tokens)\n"


def test_a_compaction_shows_its_summary() -> None:
    screen, out = console(terminal=False)
    view = RunView(screen)
    show(
        view,
        events(("run.completed", {**COMPLETED, "text": "- the summary", "finish_reason": None})),
    )
    assert out.getvalue().startswith("- the summary\n")


COMPACTING: dict[str, Any] = {
    "reason": "requested",
    "from_seq": 1,
    "to_seq": 6,
    "entries": 6,
    "kept_turns": 1,
    "tokens": 90,
    "model": "local:smollm2-135m-instruct",
    "focus": None,
}


def test_a_compaction_shows_its_progress_then_why_it_was_refused() -> None:
    run = events(
        ("context.compacting", COMPACTING),
        ("context.compaction_progress", {"call": 1, "calls": 1, "chars": 0}),
        ("context.compaction_progress", {"call": 1, "calls": 1, "chars": 120}),
        ("context.compaction_progress", {"call": 1, "calls": 1, "chars": 480}),
        (
            "context.compaction_failed",
            {
                "error": {"code": "summary_not_shorter", "message": "the summary has 192 tokens"},
                "fallback": "windowing",
            },
        ),
    )
    screen, out = console(terminal=True)
    view = RunView(screen)
    show(view, run)
    shown = [str(b) for b in view.blocks]
    # One progress line, updated in place: the latest report.
    assert [line for line in shown if line.startswith("writing the summary")] == [
        "writing the summary: 480 characters so far"
    ]
    assert "compaction failed: the summary has 192 tokens (summary_not_shorter)" in shown

    screen, out = console(terminal=False)
    show(RunView(screen), run)
    lines = out.getvalue().splitlines()
    assert lines[1:] == [  # a pipe gets each step once, not a line a second
        "writing the summary…",
        "compaction failed: the summary has 192 tokens (summary_not_shorter)",
    ]


def test_what_the_service_sends_cannot_drive_the_terminal() -> None:
    """An answer (or a tool result) holding escape sequences: retitle, clear, clipboard."""
    hostile = "Hi\x1b]0;pwned\x07 \x1b[2J\x1b]52;c;ZXZpbA==\x07there\x9b31m"
    for terminal in (True, False):
        screen, out = console(terminal)
        show(
            RunView(screen),
            events(
                ("message.delta", {"text": hostile}),
                (
                    "tool_result",
                    {"tool_call_id": "c", "name": "t", "is_error": False, "preview": hostile},
                ),
                ("run.completed", COMPLETED),
            ),
        )
        written = out.getvalue()
        assert "\x1b]" not in written and "\x07" not in written and "\x9b" not in written
        assert "\x1b[2J" not in written
        assert "Hi" in written and "there" in written


@given(st.text())
def test_printable_leaves_no_control_but_newline_and_tab(text: str) -> None:
    kept = printable(text)
    assert all(c in "\n\t" or not (ord(c) < 32 or 0x7F <= ord(c) <= 0x9F) for c in kept)


def test_a_long_answer_shows_its_tail_while_it_streams() -> None:
    screen, out = console(terminal=True, height=8)
    screen.print(Tail("\n\n".join(f"line {n}" for n in range(1, 21))))
    shown = out.getvalue()
    assert "line 20" in shown and "line 1\n" not in shown and "line 17" not in shown
    assert len(shown.splitlines()) == 6  # the screen's height, less room for the prompt


THINKING = events(
    ("reasoning.delta", {"index": 0, "text": "Oslo is far ", "start": True}),
    ("reasoning.delta", {"index": 0, "text": "north.", "end": True}),
    ("reasoning.delta", {"index": 1, "text": "", "start": True, "end": True, "redacted": True}),
    ("message.delta", {"text": "Pack a coat."}),
    ("run.completed", {**COMPLETED, "text": "Pack a coat."}),
)


def test_reasoning_shows_dimmed_above_the_answer_or_not_at_all_when_hidden() -> None:
    screen, out = console(terminal=True)
    view = RunView(screen)
    show(view, THINKING)
    thought, redacted, answer = view.blocks[:3]
    assert isinstance(thought, RichText) and thought.plain == "Oslo is far north."
    assert thought.style == "dim italic"
    assert isinstance(redacted, RichText) and "encrypted" in redacted.plain
    assert answer == "Pack a coat."
    final = out.getvalue()
    assert final.index("Oslo is far north.") < final.index("Pack a coat.")
    assert "\x1b[2;3m" in final  # dim italic

    screen, out = console(terminal=True)
    hidden = RunView(screen, show_reasoning=False)
    show(hidden, THINKING)
    assert hidden.blocks[0] == "Pack a coat."
    assert "Oslo" not in out.getvalue() and "encrypted" not in out.getvalue()


def test_a_pipe_gets_reasoning_marked_as_such_on_lines_of_its_own() -> None:
    screen, out = console(terminal=False)
    show(RunView(screen), THINKING)
    assert out.getvalue().splitlines()[:3] == [
        "thinking: Oslo is far north.",
        "(the provider encrypted this reasoning)",
        "Pack a coat.",
    ]


def test_a_reset_voids_the_reasoning_of_the_turn_too() -> None:
    screen, _ = console(terminal=True)
    view = RunView(screen)
    show(
        view,
        events(
            ("reasoning.delta", {"index": 0, "text": "Half a thou", "start": True}),
            ("message.reset", {"reason": "provider_retry", "attempt": 1}),
            ("reasoning.delta", {"index": 0, "text": "Whole.", "start": True, "end": True}),
            ("run.completed", COMPLETED),
        ),
    )
    shown = [b.plain for b in view.blocks if isinstance(b, RichText)]
    assert "Half a thou" not in shown and "Whole." in shown
