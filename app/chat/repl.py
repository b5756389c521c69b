"""The chat loop: read a line, ask or run a slash command, show what came back."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from app.chat import commands
from app.chat.client import ApiError, ChatError, Client, RunEvent, Stream
from app.chat.steering import NoSteering, SteerReader
from app.chat.view import RunView, one_line, printable
from app.core.content import is_reasoning
from app.eventlog.registry import EventType

# Turns shown when a session is resumed, and entries /history shows.
RESUME_MESSAGES = 6
HISTORY_ENTRIES = 20
SHOWN_KINDS = ("message", "tool_call", "tool_result", "summary", "rollback")


def shown(text: str) -> str:
    """Text from the service or the user, printed as itself: no markup, no control codes."""
    return escape(printable(text))


def entry_line(entry: dict[str, Any], width: int = 200) -> tuple[str, str]:
    """(label, text) of an entry for /history and --resume."""
    payload, kind = entry.get("payload") or {}, entry.get("kind")
    if kind == "message":
        incomplete = " (incomplete)" if payload.get("incomplete") else ""
        return f"{payload.get('role')}{incomplete}", one_line(content_text(payload), width)
    if kind == "tool_call":
        return "tool call", one_line(f"{payload.get('name')}({payload.get('arguments')})", width)
    if kind == "tool_result":
        return "tool result", one_line(f"{payload.get('name')}: {payload.get('content')}", width)
    if kind == "summary":
        span = f"{payload.get('from_seq')}-{payload.get('to_seq')}"
        return f"summary of {span}", one_line(str(payload.get("content", "")), width)
    if kind == "rollback":
        span = f"{payload.get('from_seq')}-{payload.get('to_seq')}"
        return "rollback", f"{span} left out of the context ({payload.get('reason', '')})"
    return str(kind), one_line(str(payload), width)


def content_text(payload: dict[str, Any]) -> str:
    content = payload.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif is_reasoning(part):
                continue  # the model's thinking is not what it said
            else:
                parts.append("[image]")
        return " ".join(parts)
    return "" if content is None else str(content)


def highlighted(excerpt: str) -> Text:
    """A search excerpt with its <b>…</b> marks (Postgres ts_headline) in bold."""
    text = Text()
    for i, piece in enumerate(re.split(r"</?b>", printable(excerpt))):
        text.append(" ".join(piece.split("\n")), style="bold" if i % 2 else "")
    return text


class Chat:
    def __init__(
        self,
        client: Client,
        console: Console,
        session: dict[str, Any],
        show_reasoning: bool = True,
        read_answer: Callable[[str], str] | None = None,
        steer_fd: int | None = None,
    ) -> None:
        self.client, self.console = client, console
        self.session_id = str(session["id"])
        self.last_run: str | None = None
        self.show_reasoning = show_reasoning
        # How a ruling on a tool call is typed (a prompt, then a line); EOFError: none.
        self.read_answer = read_answer or console.input
        self._requested: list[dict[str, Any]] = []  # approval requests not yet ruled on
        # Where lines typed during an answer are read from (a terminal's descriptor; None:
        # nothing is read beside the stream), and the runs they started, to follow next.
        self.steer_fd = steer_fd
        self._started: list[str] = []
        self._steering: SteerReader | NoSteering = NoSteering()

    # -- the loop

    def loop(self, read_line: Callable[[], str]) -> None:
        """Until /quit, Ctrl-D, or Ctrl-C at the prompt (or a second one during an answer)."""
        while True:
            try:
                line = read_line()
            except (EOFError, KeyboardInterrupt):
                return
            try:
                if not self.execute(commands.parse(line)):
                    return
            except KeyboardInterrupt:
                return  # a second Ctrl-C while an answer was being stopped
            except ApiError as exc:
                self.console.print(f"[red]error:[/] {shown(str(exc))}")
            except ChatError as exc:  # the service went away: it may come back
                self.console.print(f"[red]{shown(str(exc))}[/]")

    def execute(self, command: commands.Command) -> bool:
        """Do what the command says; False: leave."""
        match command:
            case commands.Quit():
                return False
            case commands.Empty():
                pass
            case commands.Invalid(message):
                self.console.print(f"[yellow]{shown(message)}[/]")
            case commands.Help():
                self.help()
            case commands.Say(text):
                self.ask(text)
            case commands.Compact(focus):
                self.compact(focus)
            case commands.Context():
                self.context()
            case commands.Fork(at_seq):
                self.fork(at_seq)
            case commands.History():
                self.history(HISTORY_ENTRIES, SHOWN_KINDS)
            case commands.Search(term):
                self.search(term)
            case commands.Model(name):
                self.model(name)
            case commands.Stop():
                self.stop()
            case commands.Reasoning():
                self.show_reasoning = not self.show_reasoning
                shown_or_not = "shown" if self.show_reasoning else "hidden"
                self.console.print(f"[dim]the model's reasoning is {shown_or_not}[/]")
        return True

    # -- runs

    def ask(self, text: str) -> None:
        self.follow(self.client.ask(self.session_id, text))

    def compact(self, focus: str | None) -> None:
        try:
            self.follow(self.client.compact(self.session_id, focus))
        except ApiError as exc:
            if exc.code != "nothing_to_compact":
                raise
            self.console.print(shown(exc.message), style="yellow")  # a short chat: not an error

    def follow(self, stream: Stream) -> None:
        """Show a run as it streams. A line typed meanwhile goes to the run (a steer). Ctrl-C
        cancels it and shows how it ended; a second Ctrl-C leaves (KeyboardInterrupt goes up
        to the loop). Then the runs that typed lines started, if any."""
        shown_id = 0  # the last event shown (Ctrl-C may come between receiving and showing)
        with RunView(self.console, self.show_reasoning) as view, self._reader(view) as reader:
            self._steering = reader
            try:
                for event in stream:
                    with reader.lock:
                        self._show(event, view)
                    shown_id = event.id
            except KeyboardInterrupt:
                reader.stop()
                view.note("stopping…", "yellow")
                # Before its first event, the same ask again (same Idempotency-Key) names the
                # run; an ask the service never got is then made, and cancelled at once.
                run_id = stream.run_id or self._join(stream)
                if run_id is None:
                    return
                self._cancel(run_id)
                for event in self.client.run_events(run_id, shown_id):
                    self._show(event, view)
            finally:
                self._steering = NoSteering()
        if stream.ended is not None:  # a repeated key whose run is over: its outcome
            self.console.print(f"[dim]that run had ended: {stream.ended.get('status')}[/]")
        elif view.ended is None:
            self.console.print("[yellow]the stream ended before the run did[/]")
        self._follow_started()

    def _reader(self, view: RunView) -> SteerReader | NoSteering:
        if self.steer_fd is None:
            return NoSteering()

        def send(text: str) -> Callable[[], None]:
            try:
                run_id, steer_id = self.client.steer(self.session_id, text)
            except ChatError as exc:
                refused = f"not sent: {shown(str(exc))}"
                return lambda: view.note(refused, "red")
            if steer_id is None:  # no run was in progress any more: it asked anew
                self._started.append(run_id)
                said = f"» sent: {one_line(text, 60)} (it gets an answer of its own)"
                return lambda: view.note(said)
            said = f"» sent to the running answer: {one_line(text, 60)}"
            return lambda: view.note(said, "magenta")

        return SteerReader(self.steer_fd, send)

    def _follow_started(self) -> None:
        """The runs that lines typed during the last one started (in the order they did)."""
        while self._started:
            run_id = self._started.pop(0)
            with RunView(self.console, self.show_reasoning) as view:
                for event in self.client.run_events(run_id, 0):
                    self._show(event, view)

    def _show(self, event: RunEvent, view: RunView) -> None:
        if event.event == EventType.RUN_CREATED:
            self.last_run = str(event.data["run_id"])
        view.handle(event)
        if event.event == EventType.TOOL_APPROVAL_REQUESTED:
            self._requested.append(dict(event.data))
        if event.event == EventType.RUN_STEERED and "next_run_id" in event.data:
            self._started.append(str(event.data["next_run_id"]))
        if event.event == EventType.RUN_AWAITING_APPROVAL and self.last_run is not None:
            requested, self._requested = self._requested, []
            with view.paused(), self._steering.paused():
                for call in requested:
                    self._rule_on(self.last_run, call)
        if event.event == EventType.RUN_REQUIRES_ACTION:
            names = ", ".join(str(c.get("name")) for c in event.data.get("tool_calls", []))
            view.note(
                f"the model called client-side tools ({names}), which the terminal chat cannot "
                "run: stopping the answer",
                "yellow",
            )
            if self.last_run is not None:  # set by this run's run.created
                self._cancel(self.last_run)

    def _rule_on(self, run_id: str, call: dict[str, Any]) -> None:
        """Ask the user to approve, edit or reject a tool call, until the service takes the
        ruling. Ctrl-C or Ctrl-D here stops the answer (KeyboardInterrupt, as during one)."""
        name, arguments = str(call.get("name")), call.get("arguments") or {}
        self.console.print(
            f"[bold yellow]approve?[/] {shown(name)}({shown(json.dumps(arguments))})"
        )
        while True:
            try:
                choice = self.read_answer("y approve · e edit · n reject: ").strip().lower()
                ruling: dict[str, Any] = {"tool_call_id": call["tool_call_id"]}
                if choice in ("y", "yes"):
                    ruling["decision"] = "approve"
                elif choice in ("e", "edit"):
                    typed = self.read_answer("arguments (JSON): ")
                    try:
                        ruling |= {"decision": "approve", "arguments": json.loads(typed)}
                    except json.JSONDecodeError as exc:
                        self.console.print(f"[red]not JSON:[/] {shown(str(exc))}")
                        continue
                elif choice in ("n", "no"):
                    reason = self.read_answer("reason (optional): ").strip()
                    ruling["decision"] = "reject"
                    if reason:
                        ruling["reason"] = reason
                else:
                    continue
            except EOFError:
                raise KeyboardInterrupt from None
            try:
                self.client.answer_approval(run_id, ruling)
            except ApiError as exc:
                self.console.print(f"[red]error:[/] {shown(str(exc))}")
                if exc.status == 422:
                    continue  # e.g. edited arguments that do not fit the tool: try again
                return  # answered meanwhile, or the run ended: its events say how
            verdict = "approved" if ruling["decision"] == "approve" else "rejected"
            self.console.print(f"[dim]{verdict}[/]")
            return

    def _join(self, stream: Stream) -> str | None:
        """The run of an ask interrupted before its first event: the same Idempotency-Key
        names it."""
        again = stream.again()
        for _ in again:
            if again.run_id is not None:
                return again.run_id
        return None

    def _cancel(self, run_id: str) -> None:
        with contextlib.suppress(ApiError):  # it ended meanwhile: its terminal event says how
            self.client.cancel(run_id)

    def stop(self) -> None:
        if self.last_run is None:
            self.console.print("[dim]no answer to stop[/]")
            return
        run = self.client.run(self.last_run)
        if run["status"] in ("completed", "failed", "cancelled"):
            self.console.print(f"[dim]the last run is over ({run['status']})[/]")
            return
        ended = self.client.cancel(self.last_run)
        self.console.print(f"[yellow]stopped the last run ({ended['status']})[/]")

    # -- commands

    def help(self) -> None:
        table = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
        for usage, what in commands.HELP:
            table.add_row(Text(usage, style="bold"), what)
        self.console.print(table)
        self.console.print(
            "[dim]Anything else is sent to the model (//text sends /text). "
            "Ctrl-C stops an answer; Ctrl-D leaves.[/]"
        )

    def context(self) -> None:
        ctx = self.client.context(self.session_id)
        window = ctx["context_window"]
        self.console.print(f"{shown(ctx['model'])} · window {window:,} tokens")
        table = Table(box=None)
        table.add_column("segment")
        table.add_column("tokens", justify="right")
        table.add_column("of window", justify="right")
        for segment, tokens in ctx["breakdown"].items():
            table.add_row(
                Text(printable(segment)), f"{tokens:,}", f"{ctx['shares'].get(segment, 0):.1f}%"
            )
        table.add_row(
            Text("total", style="bold"),
            Text(f"{ctx['tokens']:,}", style="bold"),
            Text(f"{ctx['percent_of_window']:.1f}%", style="bold"),
        )
        self.console.print(table)
        share = 100 * ctx["tokens"] / ctx["budget"] if ctx["budget"] else 0.0
        flags = [
            name
            for name, on in (
                ("summary used", ctx["summary_used"]),
                ("truncated", ctx["truncated"]),
                ("needs a summary", ctx["needs_summary"]),
            )
            if on
        ]
        self.console.print(
            f"budget {ctx['budget']:,} ({share:.1f}% used; compacts at "
            f"{ctx['threshold_tokens']:,}) · {ctx['messages']} messages · entries "
            f"{ctx['entries_included']} of {ctx['entries_total']} · {ctx['summaries']} "
            f"summaries" + (f" · {', '.join(flags)}" if flags else ""),
            highlight=False,
        )
        if not ctx["compactable"]:
            self.console.print(shown(ctx["not_compactable_reason"]), style="dim")

    def fork(self, at_seq: int | None) -> None:
        child = self.client.fork(self.session_id, at_seq)
        self.console.print(f"forked at seq {child['fork_seq']}: now in [bold]{child['id']}[/]")
        self.session_id = str(child["id"])
        self.last_run = None

    def history(self, limit: int, kinds: tuple[str, ...]) -> None:
        entries = self.client.latest_entries(self.session_id, limit, kinds)
        if not entries:
            self.console.print("[dim]no entries yet[/]")
        width = max(40, self.console.width - 24)
        for entry in entries:
            label, text = entry_line(entry, width)
            line = Text(f"#{entry['seq']:<4} ", style="dim")
            line.append(f"{label}: ", style="bold")
            line.append(text)
            self.console.print(line)

    def search(self, term: str) -> None:
        hits = self.client.search(self.session_id, term)
        if not hits:
            self.console.print(f"[dim]nothing matches {shown(term)!r}[/]")
        for hit in hits:
            line = Text(f"#{hit['seq']:<4} {hit['kind']}: ", style="dim")
            line.append_text(highlighted(hit["excerpt"]))
            self.console.print(line)

    def model(self, name: str | None) -> None:
        if name is None:
            self.console.print(f"model: {shown(self.client.context(self.session_id)['model'])}")
            return
        self.client.set_model(self.session_id, name)
        self.console.print(f"model: {shown(name)}")


# -- starting


def resolve_url(flag: str | None) -> str:
    """--url, else THREADLINE_URL, else where `threadline serve` listens by default."""
    if flag:
        return flag
    if os.environ.get("THREADLINE_URL"):
        return os.environ["THREADLINE_URL"]
    from app.config import Settings

    settings = Settings()
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


def resolve_key(flag: str | None) -> str:
    """--key, else THREADLINE_API_KEY, else the development key `threadline serve` keeps."""
    if flag:
        return flag
    if os.environ.get("THREADLINE_API_KEY"):
        return os.environ["THREADLINE_API_KEY"]
    from app.config import Settings

    key_file = Settings().data_dir / "dev-key"
    try:
        return key_file.read_text().strip()
    except OSError:
        raise ChatError(
            f"no API key: pass --key or set THREADLINE_API_KEY (no development key in "
            f"{key_file}: `make run` or `threadline serve` writes one)"
        ) from None


def start_session(
    client: Client, resume: str | None, fork: str | None, agent: str | None = None
) -> tuple[dict[str, Any], str]:
    """The session to chat in, and how it was chosen."""
    if resume is not None:
        return client.session(resume), "resumed"
    if fork is not None:
        try:
            parent, at_seq = commands.parse_fork_spec(fork)
        except ValueError as exc:
            raise ChatError(str(exc)) from None
        child = client.fork(parent, at_seq)
        return child, f"forked from {parent} at seq {child['fork_seq']}"
    if agent is not None:
        session = client.create_session(agent)
        pinned = session["agent"]
        return session, f"new session · agent {pinned['name']} v{pinned['version']}"
    return client.create_session(), "new session"


def prompt_reader(console: Console) -> Callable[[], str]:
    """Lines typed at a prompt_toolkit prompt (editing, history across runs); plain lines
    when stdin is not a terminal."""
    if not sys.stdin.isatty():

        def read_plain() -> str:
            line = sys.stdin.readline()
            if not line:
                raise EOFError
            return line

        return read_plain
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    history: FileHistory | InMemoryHistory
    try:
        (state / "threadline").mkdir(parents=True, exist_ok=True)
        history = FileHistory(str(state / "threadline" / "chat-history"))
    except OSError:
        history = InMemoryHistory()
    session: PromptSession[str] = PromptSession(history=history)
    return lambda: session.prompt("› ")  # noqa: RUF001


def main(
    url: str | None,
    key: str | None,
    resume: str | None,
    fork: str | None,
    hide_reasoning: bool = False,
    agent: str | None = None,
) -> int:
    """`threadline chat`: the exit status (1 with a message when it cannot start)."""
    # Piped, lines are not wrapped at a width no one set (the header's session id stays whole).
    console = Console(highlight=False, soft_wrap=not sys.stdout.isatty())
    errors = Console(stderr=True, highlight=False)
    client: Client | None = None
    try:
        client = Client(resolve_url(url), resolve_key(key))
        session, how = start_session(client, resume, fork, agent)
        steer_fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        chat = Chat(client, console, session, show_reasoning=not hide_reasoning, steer_fd=steer_fd)
        model = session["config"].get("model") or client.context(chat.session_id)["model"]
        console.print(f"[bold]Threadline chat[/] · session [bold]{chat.session_id}[/]")
        console.print(f"{how} · model {shown(model)}")
        console.print(
            f"[dim]/help for commands · later: threadline chat --resume {chat.session_id}[/]"
        )
        if resume is not None:
            chat.history(RESUME_MESSAGES, ("message",))
        chat.loop(prompt_reader(console))
        return 0
    except ApiError as exc:
        errors.print(f"[red]error:[/] {shown(str(exc))}")
        return 1
    except ChatError as exc:
        errors.print(f"[red]{shown(str(exc))}[/]")
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if client is not None:
            client.close()
