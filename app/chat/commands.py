"""What a line typed at the chat prompt means: a message to ask, or a slash command.

Pure: parsing never fails on any input; a line that is not a valid command becomes `Invalid`
with a message for the user.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.entries import MAX_ENTRY_SEQ


@dataclass(frozen=True)
class Say:
    """Ask the model: the line as typed."""

    text: str


@dataclass(frozen=True)
class Compact:
    focus: str | None


@dataclass(frozen=True)
class Context:
    pass


@dataclass(frozen=True)
class Fork:
    at_seq: int | None


@dataclass(frozen=True)
class History:
    pass


@dataclass(frozen=True)
class Search:
    term: str


@dataclass(frozen=True)
class Model:
    name: str | None  # None: show the session's model


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Reasoning:
    """Show or hide the model's reasoning (toggle)."""


@dataclass(frozen=True)
class Help:
    pass


@dataclass(frozen=True)
class Quit:
    pass


@dataclass(frozen=True)
class Empty:
    """A blank line: nothing to do."""


@dataclass(frozen=True)
class Invalid:
    message: str


Command = (
    Say
    | Compact
    | Context
    | Fork
    | History
    | Search
    | Model
    | Stop
    | Reasoning
    | Help
    | Quit
    | Empty
    | Invalid
)

HELP = (
    ("/compact [focus]", "summarize the history into a checkpoint (optionally about a focus)"),
    ("/context", "how full the context is, by segment"),
    ("/fork [seq]", "fork the session (at a seq, default: now) and continue in the fork"),
    ("/history", "the latest entries of the session"),
    ("/search TERM", "full-text search of the session's history"),
    ("/model [NAME]", "show the model, or switch the session to NAME (provider:model)"),
    ("/stop", "stop the last answer if it is still running (Ctrl-C stops one while it streams)"),
    ("/reasoning", "show or hide the model's reasoning (shown dimmed above its answer)"),
    ("/help", "this list"),
    ("/quit", "leave (also Ctrl-D, or Ctrl-C at the prompt)"),
)
NAMES = (
    *("compact", "context", "fork", "history", "search", "model", "stop", "reasoning"),
    *("help", "quit"),
)


def parse_seq(text: str) -> int | None:
    """A seq written in ASCII digits (>= 1, JSON-safe), else None."""
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if 1 <= value <= MAX_ENTRY_SEQ else None


def parse(line: str) -> Command:
    """The command a prompt line stands for. `//text` sends `/text` as a message."""
    stripped = line.strip()
    if not stripped:
        return Empty()
    if stripped.startswith("//"):
        return Say(stripped[1:])
    if not stripped.startswith("/"):
        return Say(stripped)
    name, _, rest = stripped[1:].partition(" ")
    name, argument = name.lower(), rest.strip()
    if name in ("quit", "exit", "q"):
        return Quit() if not argument else Invalid(f"/{name} takes no argument")
    if name in ("help", "?"):
        return Help()
    if name == "compact":
        return Compact(argument or None)
    if name == "context":
        return Context() if not argument else Invalid("/context takes no argument")
    if name == "history":
        return History() if not argument else Invalid("/history takes no argument")
    if name == "stop":
        return Stop() if not argument else Invalid("/stop takes no argument")
    if name == "reasoning":
        return Reasoning() if not argument else Invalid("/reasoning takes no argument")
    if name == "fork":
        if not argument:
            return Fork(None)
        seq = parse_seq(argument)
        if seq is None:
            return Invalid(f"/fork takes a seq (a whole number from 1), not {argument!r}")
        return Fork(seq)
    if name == "search":
        return Search(argument) if argument else Invalid("/search needs a term: /search TERM")
    if name == "model":
        if " " in argument:
            return Invalid("/model takes one name, e.g. /model openai:gpt-4o-mini")
        return Model(argument or None)
    known = ", ".join(f"/{n}" for n in NAMES)
    return Invalid(f"unknown command /{name} (commands: {known}; //text sends /text)")


def parse_fork_spec(spec: str) -> tuple[str, int | None]:
    """`--fork ID[@SEQ]` as (session id, seq or None). Raises ValueError with a message."""
    session_id, at, seq_text = spec.partition("@")
    if not session_id.strip():
        raise ValueError(f"--fork needs a session id (ID or ID@SEQ), not {spec!r}")
    if not at:
        return session_id.strip(), None
    seq = parse_seq(seq_text.strip())
    if seq is None:
        raise ValueError(f"--fork ID@SEQ needs a seq (a whole number from 1), not {seq_text!r}")
    return session_id.strip(), seq
