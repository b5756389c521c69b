"""How a run shows in the terminal: its answer rendered as Markdown while it streams (Rich
Live), tool calls and context notes between, and how it ended. The model's reasoning, when it
reasons, shows dimmed above the answer it leads to (unless hidden). Where stdout is not a
terminal the answer is written as plain text, piece by piece, with no control sequences."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.markdown import Markdown
from rich.segment import Segment
from rich.text import Text

from app.chat.client import RunEvent
from app.eventlog.registry import TERMINAL_EVENTS, EventType

# C0 controls but tab and newline, DEL and C1 controls: what the service sends (a model's
# answer, a tool's result) must never move the cursor, retitle the window or write the
# clipboard (ESC sequences), in a terminal or in a file that is later printed.
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


REASONING_STYLE = "dim italic"
PLAIN_REASONING = "thinking: "


def printable(text: str) -> str:
    return CONTROLS.sub("", text)


class Tail:
    """The last lines of a renderable that fit the screen: a long answer scrolls while it
    streams instead of being cut off (the whole answer is drawn when it ends)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.renderable, options, pad=False)
        room = max(1, console.height - 2)
        for line in lines[-room:]:
            yield from line
            yield Segment.line()


def one_line(text: str, width: int) -> str:
    flat = " ".join(printable(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class RunView:
    """One run on screen. `handle` each event; use as a context manager around them."""

    def __init__(self, console: Console, show_reasoning: bool = True) -> None:
        self.console = console
        self.show_reasoning = show_reasoning
        self.live_mode = console.is_terminal
        self.blocks: list[RenderableType | str] = []  # str: answer text (Markdown)
        self.turn_start = 0  # the first block of the current model turn
        self.answered = False
        self.ended: str | None = None  # the terminal event, once it came
        self.text = ""  # the final text (an answer, or a compaction's summary)
        self._live: Live | None = None
        self._plain_open = False  # plain mode: an answer line is being written
        self._progress: Text | None = None  # the compaction's progress line, updated in place
        self._thoughts: dict[int, Text] = {}  # the turn's open reasoning blocks (live mode)

    def __enter__(self) -> RunView:
        if self.live_mode:
            self._live = Live(
                Tail(Group()),
                console=self.console,
                refresh_per_second=8,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.update(self._group(), refresh=False)  # the whole answer, not its tail
            self._live.stop()
            self._live = None
        elif self._plain_open:
            self.console.file.write("\n")
            self.console.file.flush()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The live display stopped (what it showed stays on screen), for a prompt."""
        if self._live is None:
            if self._plain_open:
                self.console.file.write("\n")
                self._plain_open = False
            yield
            return
        self._live.update(self._group(), refresh=True)
        self._live.stop()
        self.blocks, self.turn_start = [], 0  # shown: the display starts afresh after
        try:
            yield
        finally:
            self._live = Live(
                Tail(Group()),
                console=self.console,
                refresh_per_second=8,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    # -- what is shown

    def _group(self) -> Group:
        return Group(*(Markdown(b) if isinstance(b, str) else b for b in self.blocks))

    def _changed(self) -> None:
        if self._live is not None:
            self._live.update(Tail(self._group()))

    def delta(self, text: str) -> None:
        text = printable(text)
        self.answered = True
        if self.blocks and isinstance(self.blocks[-1], str):
            self.blocks[-1] += text
        else:
            self.blocks.append(text)
        if self._live is not None:
            self._changed()
        else:
            self.console.file.write(text)
            self.console.file.flush()
            self._plain_open = True

    def reasoning(self, data: dict[str, Any]) -> None:
        """A piece of a reasoning block: dimmed, a block of its own above the answer; nothing
        when reasoning is hidden."""
        if not self.show_reasoning:
            return
        block, text = int(data.get("index", 0)), printable(str(data.get("text", "")))
        if data.get("redacted"):
            self.note("(the provider encrypted this reasoning)", REASONING_STYLE)
            return
        if self._live is None:
            if block not in self._thoughts:
                if self._plain_open:
                    self.console.file.write("\n")
                self.console.file.write(PLAIN_REASONING)  # no dimming in a pipe: say what it is
                self._thoughts[block] = Text()
            self.console.file.write(text)
            self._plain_open = True
            if data.get("end"):
                self.console.file.write("\n")
                self._plain_open = False
                del self._thoughts[block]
            self.console.file.flush()
            return
        thought = self._thoughts.get(block)
        if thought is None:
            thought = self._thoughts[block] = Text(style=REASONING_STYLE)
            self.blocks.append(thought)
        thought.append(text)
        if data.get("end"):
            del self._thoughts[block]
        self._changed()

    def note(self, text: str, style: str = "dim") -> None:
        text = printable(text)
        self.blocks.append(Text(text, style=style))
        if self._live is not None:
            self._changed()
        else:
            if self._plain_open:
                self.console.file.write("\n")
                self._plain_open = False
            self.console.print(text, style=style, markup=False, highlight=False)

    def progress(self, text: str, first: bool) -> None:
        """A progress line that each report replaces (live mode); as plain text, only the
        `first` report of each step is written, so a pipe gets no line a second."""
        if self._live is None:
            if first:
                self.note(text)
            return
        line = Text(printable(text), style="dim")
        if self._progress is not None and self.blocks and self.blocks[-1] is self._progress:
            self.blocks[-1] = line
        else:
            self.blocks.append(line)
        self._progress = line
        self._changed()

    def reset(self) -> None:
        """The model turn starts over: what it streamed so far is void."""
        del self.blocks[self.turn_start :]
        self._thoughts.clear()
        self.note("(the answer starts over)")
        self.turn_start = len(self.blocks)
        if self._live is not None:
            self._changed()

    # -- the events

    def handle(self, event: RunEvent) -> None:
        data = event.data
        kind = event.event
        if kind == EventType.MESSAGE_DELTA:
            self.delta(str(data.get("text", "")))
        elif kind == EventType.REASONING_DELTA:
            self.reasoning(data)
        elif kind == EventType.MESSAGE_RESET:
            self.reset()
        elif kind == EventType.TOOL_CALL:
            arguments = json.dumps(data.get("arguments"), ensure_ascii=False)
            self.note(f"⚙ {data.get('name')}({one_line(arguments, 60)})", "cyan")
        elif kind == EventType.TOOL_RESULT:
            style = "red" if data.get("is_error") else "dim cyan"
            self.note(f"  ↳ {one_line(str(data.get('preview', '')), 70)}", style)
            self.turn_start = len(self.blocks)  # a reset voids the next turn, not this one
        elif kind == EventType.RUN_STEERED and "iteration" in data:
            self.note(f"» your message reached the model (turn {data['iteration']})", "magenta")
        elif kind == EventType.RUN_STEERED and "next_run_id" in data:
            self.note("» your message came as the answer ended: it gets an answer of its own")
        elif kind == EventType.CONTEXT_WARNING and data.get("message"):
            self.note(str(data["message"]), "yellow")
        elif kind == EventType.CONTEXT_WARNING:
            self.note(f"context {data.get('percent')}% of its budget ({data.get('level')})")
        elif kind == EventType.CONTEXT_COMPACTING:
            focus = f", focus: {data['focus']}" if data.get("focus") else ""
            self.note(
                f"compacting entries {data.get('from_seq')}-{data.get('to_seq')} "
                f"with {data.get('model')}{focus}…"
            )
        elif kind == EventType.CONTEXT_COMPACTION_PROGRESS:
            call, calls, chars = data.get("call"), data.get("calls"), data.get("chars") or 0
            part = f" (part {call} of {calls})" if calls != 1 else ""
            written = f": {chars:,} characters so far" if chars else "…"
            self.progress(f"writing the summary{part}{written}", first=not chars)
        elif kind == EventType.CONTEXT_COMPACTED:
            self.note(
                f"compacted entries {data.get('from_seq')}-{data.get('to_seq')} into a summary "
                f"of {data.get('summary_tokens')} tokens (seq {data.get('summary_seq')}); "
                f"context {data.get('tokens_before')} → {data.get('tokens_after')} tokens"
            )
        elif kind == EventType.CONTEXT_COMPACTION_FAILED:
            self.note(f"compaction failed: {_error(data.get('error'))}", "yellow")
        elif kind in TERMINAL_EVENTS:
            self._end(kind, data)

    def _end(self, kind: str, data: dict[str, Any]) -> None:
        self.ended = kind
        if kind == EventType.RUN_COMPLETED:
            self.text = str(data.get("text") or "")
            if self.text and not self.answered:
                self.delta(self.text)  # a compaction's summary (it streams no deltas)
            usage = data.get("usage") or {}
            tokens = (
                f" · {usage.get('input_tokens')} in / {usage.get('output_tokens')} out tokens"
                if usage
                else ""
            )
            cut = " · cut off (max_output_tokens)" if data.get("finish_reason") == "length" else ""
            self.note(f"{data.get('model')}{tokens}{cut}")
        elif kind == EventType.RUN_FAILED:
            self.note(f"failed: {_error(data.get('error'))}", "bold red")
        else:
            self.note("stopped: the partial answer is kept, marked incomplete", "yellow")


def _error(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    return f"{error.get('message')} ({error.get('code')})"
