"""tool_choice: parsing, the per-turn rule, and each provider's wire fields."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.tool_choice import (
    NamedTool,
    ToolChoice,
    anthropic_tool_choice,
    as_json,
    for_turn,
    openai_fields,
    parse,
    problem,
)

CHOICES: list[ToolChoice] = ["auto", "none", "required", NamedTool("get_weather")]


@pytest.mark.parametrize("choice", CHOICES)
def test_the_stored_form_reads_back(choice: ToolChoice) -> None:
    assert parse(as_json(choice)) == choice


def test_a_named_tool_is_stored_in_the_responses_shape() -> None:
    assert as_json(NamedTool("get_weather")) == {"type": "function", "name": "get_weather"}


@pytest.mark.parametrize(
    "value",
    [
        "any",
        "AUTO",
        "",
        None,
        {"type": "function"},
        {"type": "function", "name": ""},
        {"type": "function", "name": 3},
        {"type": "tool", "name": "x"},
        {"type": "function", "function": {"name": "x"}},  # Chat Completions' shape
        {"type": "function", "name": "x", "strict": True},
        {"type": "allowed_tools", "mode": "auto", "tools": []},
        ["auto"],
    ],
)
def test_anything_else_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="tool_choice is"):
        parse(value)


@given(
    st.recursive(
        st.none() | st.booleans() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_parse_never_fails_otherwise(value: Any) -> None:
    try:
        choice = parse(value)
    except ValueError:
        return
    assert choice in CHOICES[:3] or isinstance(choice, NamedTool)


@pytest.mark.parametrize("choice", ["required", NamedTool("get_weather")])
def test_a_forced_choice_holds_for_the_first_turn_only(choice: ToolChoice) -> None:
    assert for_turn(choice, 1) == choice
    assert [for_turn(choice, i) for i in (2, 3, 10)] == ["auto", "auto", "auto"]


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_auto_and_none_hold_on_every_turn(choice: ToolChoice) -> None:
    assert [for_turn(choice, i) for i in (1, 2, 7)] == [choice] * 3


def test_problems_with_the_offered_tools() -> None:
    assert problem("auto", []) is None
    assert problem("none", []) is None
    assert problem("required", ["a"]) is None
    assert problem(NamedTool("a"), ["a", "b"]) is None
    assert "needs at least one tool" in (problem("required", []) or "")
    named = problem(NamedTool("c"), ["b", "a"]) or ""
    assert "'c'" in named and "(a, b)" in named
    assert "(none)" in (problem(NamedTool("c"), []) or "")


@pytest.mark.parametrize(
    ("choice", "parallel", "fields"),
    [
        ("auto", True, {}),
        ("auto", False, {"parallel_tool_calls": False}),
        ("none", True, {"tool_choice": "none"}),
        ("none", False, {"tool_choice": "none"}),
        ("required", True, {"tool_choice": "required"}),
        ("required", False, {"tool_choice": "required", "parallel_tool_calls": False}),
        (
            NamedTool("get_weather"),
            True,
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        ),
        (
            NamedTool("get_weather"),
            False,
            {
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": False,
            },
        ),
    ],
)
def test_openai_fields(choice: ToolChoice, parallel: bool, fields: dict[str, Any]) -> None:
    assert openai_fields(choice, parallel, has_tools=True) == fields
    # OpenAI refuses both fields in a request without tools.
    assert openai_fields(choice, parallel, has_tools=False) == {}


@pytest.mark.parametrize(
    ("choice", "parallel", "wire"),
    [
        ("auto", True, None),
        ("auto", False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("none", True, {"type": "none"}),
        ("none", False, {"type": "none"}),
        ("required", True, {"type": "any"}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (NamedTool("get_weather"), True, {"type": "tool", "name": "get_weather"}),
        (
            NamedTool("get_weather"),
            False,
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        ),
    ],
)
def test_anthropic_tool_choice(choice: ToolChoice, parallel: bool, wire: Any) -> None:
    assert anthropic_tool_choice(choice, parallel, has_tools=True) == wire
    assert anthropic_tool_choice(choice, parallel, has_tools=False) is None
