"""What a prompt line means: messages, slash commands, and no crash on anything typed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.chat import commands
from app.chat.commands import (
    Compact,
    Context,
    Empty,
    Fork,
    Help,
    History,
    Invalid,
    Model,
    Quit,
    Reasoning,
    Say,
    Search,
    Stop,
    parse,
    parse_fork_spec,
)
from app.core.entries import MAX_ENTRY_SEQ


@pytest.mark.parametrize(
    ("line", "command"),
    [
        ("Weather in Oslo?", Say("Weather in Oslo?")),
        ("  padded  \n", Say("padded")),
        ("", Empty()),
        ("   \t ", Empty()),
        ("//etc/hosts is a file", Say("/etc/hosts is a file")),
        ("/compact", Compact(None)),
        ("/compact   the weather  ", Compact("the weather")),
        ("/context", Context()),
        ("/CONTEXT", Context()),
        ("/fork", Fork(None)),
        ("/fork 12", Fork(12)),
        ("/history", History()),
        ("/search umbrella rain", Search("umbrella rain")),
        ("/model openai:gpt-4o-mini", Model("openai:gpt-4o-mini")),
        ("/model", Model(None)),
        ("/stop", Stop()),
        ("/reasoning", Reasoning()),
        ("/reasoning on", Invalid("/reasoning takes no argument")),
        ("/help", Help()),
        ("/?", Help()),
        ("/quit", Quit()),
        ("/exit", Quit()),
    ],
)
def test_a_line_means_a_message_or_a_command(line: str, command: commands.Command) -> None:
    assert parse(line) == command


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("/fork x", "/fork takes a seq"),
        ("/fork 0", "/fork takes a seq"),
        ("/fork -3", "/fork takes a seq"),
        ("/fork 1.5", "/fork takes a seq"),
        ("/fork ٣", "/fork takes a seq"),  # an Arabic-Indic digit is a digit, not a seq
        (f"/fork {2**53}", "/fork takes a seq"),
        ("/search", "/search needs a term"),
        ("/search    ", "/search needs a term"),
        ("/model a b", "/model takes one name"),
        ("/context now", "/context takes no argument"),
        ("/quit please", "/quit takes no argument"),
        ("/frobnicate", "unknown command /frobnicate"),
        ("/", "unknown command /"),
    ],
)
def test_a_wrong_command_says_what_is_wrong(line: str, says: str) -> None:
    result = parse(line)
    assert isinstance(result, Invalid)
    assert says in result.message


def test_the_largest_seq_is_accepted() -> None:
    assert parse(f"/fork {2**53 - 1}") == Fork(2**53 - 1)


@given(st.text())
def test_any_line_parses_to_a_command(line: str) -> None:
    result = parse(line)
    assert isinstance(
        result,
        Say
        | Compact
        | Context
        | Fork
        | History
        | Search
        | Model
        | Stop
        | Help
        | Quit
        | Empty
        | Invalid,
    )
    if isinstance(result, Say):
        assert result.text and result.text == result.text.strip()  # never a blank message
    if isinstance(result, Fork) and result.at_seq is not None:
        assert 1 <= result.at_seq <= MAX_ENTRY_SEQ


@given(st.text(alphabet=st.characters(codec="utf-8"), min_size=1).map(lambda s: "/" + s))
def test_any_slash_line_is_a_command_or_says_why_not(line: str) -> None:
    result = parse(line)
    if isinstance(result, Invalid):
        assert result.message
    else:
        assert not isinstance(result, Empty)


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [("abc", ("abc", None)), ("abc@7", ("abc", 7)), (" abc @ 7 ", ("abc", 7))],
)
def test_fork_spec(spec: str, parsed: tuple[str, int | None]) -> None:
    assert parse_fork_spec(spec) == parsed


@pytest.mark.parametrize("spec", ["", "@3", "abc@", "abc@x", "abc@0", "abc@3@4"])
def test_a_bad_fork_spec_says_so(spec: str) -> None:
    with pytest.raises(ValueError, match="--fork"):
        parse_fork_spec(spec)


@given(st.text())
def test_any_fork_spec_parses_or_raises_value_error(spec: str) -> None:
    try:
        session_id, seq = parse_fork_spec(spec)
    except ValueError:
        return
    assert session_id and (seq is None or seq >= 1)
