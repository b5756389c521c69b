"""The calculator is bounded: whatever the model writes, it answers a number within bounds or an
error result, and never holds a worker (no assertion here measures time: sizes are asserted)."""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config import Settings
from app.core.builtin_tools import BUILTIN_TOOLS
from app.core.tool_loop import PendingCall
from app.tools import calculator
from app.tools.calculator import (
    MAX_DIGITS,
    MAX_EXPONENT,
    MAX_EXPRESSION_CHARS,
    CalculatorError,
    TooLarge,
    evaluate,
)
from app.tools.registry import ToolContext, execute
from testkit.api import new_session
from testkit.server import free_port
from testkit.sse_client import read_to_end
from testkit.upstream import FakeUpstream, Text, ToolCall
from tests.conftest import issue_key
from tests.e2e import Process, create_database, e2e_env, process_env

CONTEXT = ToolContext("t", "s", "r", "c")
CALCULATOR = [{"name": "calculator", "kind": "builtin"}]
TOWER = "((9**999)**999)**999"


async def calculate(expression: str) -> tuple[Any, bool]:
    outcome = await execute(
        PendingCall("c", "calculator", {"expression": expression}, 1), CALCULATOR, CONTEXT
    )
    return outcome.content, outcome.is_error


def within_bounds(value: Any) -> bool:
    """A number the journal can store and the model can read: finite, an integer of at most
    MAX_DIGITS digits."""
    json.dumps(value, allow_nan=False)  # raises for inf / nan, and for ints past 4300 digits
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, int) and abs(value) < 10**MAX_DIGITS


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(4 + 2) * 3 - 2 ** 3", 10),
        ("2 ** 1000", 2**1000),
        ("9 ** 999", 9**999),  # 954 digits: exact
        ("-(10**1000)**3 * 10**999 - 1", -(10**3999) - 1),  # 4000 digits
        ("10 / 4", 2.5),
        ("7 // 2 + -3 % 5", 5),
        ("2 ** -2", 0.25),
        ("1.5e300 * 1e8", 1.5e308),
        ("1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1 ** 1", 1),
    ],
)
async def test_what_is_within_bounds_is_exact(expression: str, value: Any) -> None:
    assert await calculate(expression) == (value, False)


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        (TOWER, "too large"),
        ("(9**999)**999", "too large"),  # ~952,000 digits: refused before computing it
        ("10 ** 4000", "too large"),
        ("(10 ** 2000) * (10 ** 2000)", "too large"),
        ("*".join(["(9 ** 999)"] * 50), "too large"),  # repeated multiplication
        ("2 ** 1001", "exponent"),
        ("2 ** (10 ** 100)", "exponent"),
        ("10.0 ** 400", "too large"),  # float overflow
        ("1e308 * 10", "too large"),  # inf
        ("(10 ** 4000 - 1) / 3", "too large"),  # no float holds it
        ("(-8) ** 0.5", "not a real number"),
        ("1 / 0", "division by zero"),
        ("1" + "+1" * (MAX_EXPRESSION_CHARS // 2), "too large"),  # too long
        ("-" * 5000 + "1", "too"),  # too deep for the parser
        ("(" * 300 + "1" + ")" * 300, "arithmetic expression"),
        ("__import__('os')", "only numbers"),
        ("True + 1", "only numbers"),
        ("9" * 5000, "too large"),  # a literal over Python's 4300-digit limit
    ],
)
async def test_what_is_out_of_bounds_is_an_error_result(expression: str, says: str) -> None:
    content, is_error = await calculate(expression)
    assert is_error and content.startswith("Error: calculator failed: ") and says in content
    assert len(content) < 500  # a sentence for the model, not the number


async def test_the_tower_of_powers_says_what_it_would_have_been() -> None:
    content, is_error = await calculate(TOWER)
    assert is_error
    assert content == (
        "Error: calculator failed: the result would have about 952,335 digits: too large "
        f"(at most {MAX_DIGITS:,})"
    )


def test_a_wall_clock_guard_stops_between_steps() -> None:
    """Past its deadline the evaluation stops at the next step (here: before the first)."""
    with pytest.raises(TooLarge, match="too large to evaluate"):
        evaluate("1 + 1", seconds=-1)


async def test_the_evaluation_is_not_the_event_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []

    def recording(expression: str) -> int:
        threads.append(threading.get_ident())
        return 2

    monkeypatch.setattr(calculator, "evaluate", recording)
    assert await calculate("1 + 1") == (2, False)
    assert threads and threads[0] != threading.get_ident()


def test_the_model_is_told_the_bounds() -> None:
    description = BUILTIN_TOOLS["calculator"]["description"]
    for bound in (MAX_EXPONENT, MAX_DIGITS, MAX_EXPRESSION_CHARS):
        assert str(bound) in description


# --- Hostile expressions, generated -------------------------------------------------------

LITERALS = st.one_of(
    st.integers(0, 10**6),
    st.sampled_from([9, 10, 99, 999, 2**64, 10**100, 10**3999]),
    st.floats(min_value=0, allow_nan=False, allow_infinity=False),
).map(repr)
OPERATORS = st.sampled_from(["+", "-", "*", "/", "//", "%", "**"])


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    # Repetition nests: unfiltered, three levels of 300 copies of a 4,000-digit literal were a
    # 100 GB string (the suite was OOM-killed). Past twice the calculator's limit, an
    # expression adds nothing: it is refused by its length alone.
    return st.one_of(
        st.tuples(children, OPERATORS, children).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
        children.map(lambda c: f"-{c}"),
        # Big exponents, towers and long products: the blow-ups.
        st.tuples(children, st.integers(0, MAX_EXPONENT + 5)).map(lambda t: f"({t[0]})**{t[1]}"),
        st.tuples(children, st.integers(2, 300)).map(lambda t: "*".join([f"({t[0]})"] * t[1])),
        st.tuples(children, st.integers(2, 6)).map(lambda t: "**".join([f"({t[0]})"] * t[1])),
    ).filter(lambda expression: len(expression) <= 2 * MAX_EXPRESSION_CHARS)


HOSTILE = st.recursive(LITERALS, _combine, max_leaves=12)


@given(HOSTILE)
@settings(max_examples=300, deadline=None)
def test_hostile_expressions_answer_a_bounded_number_or_an_error(expression: str) -> None:
    try:
        value = evaluate(expression)
    except CalculatorError as exc:
        assert str(exc) and len(str(exc)) < 300
        return
    assert within_bounds(value), expression


@given(st.integers(2, 10**6), st.integers(1, MAX_EXPONENT))
@settings(max_examples=200, deadline=None)
def test_a_power_is_refused_exactly_when_its_result_is_past_the_limit(
    base: int, exponent: int
) -> None:
    """The estimate before computing refuses nothing within bounds (checked against the exact
    power, cheap here: at most ~6000 digits)."""
    exact = base**exponent
    try:
        value = evaluate(f"{base} ** {exponent}")
    except TooLarge:
        assert exact >= 10**MAX_DIGITS
    else:
        assert value == exact < 10**MAX_DIGITS


# --- End to end: a worker that is asked for the tower ------------------------------------


@pytest.fixture
def calculating_service(database_url: str, upstream: FakeUpstream) -> Iterator[tuple[str, str]]:
    """`threadline serve` (API and workers) in a process of its own, on a database of its own:
    a worker that blocked would block only it, and it can be killed. Its URL and a key."""
    upstream.clear()
    settings = Settings(database_url=create_database(database_url, "calc"), **e2e_env(upstream))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = Process(
        ["serve", "--port", str(port)],
        process_env(settings, port=port, worker_concurrency=2),
        f"{url}/readyz",
    )
    try:
        yield url, issue_key(settings, f"calc-{uuid.uuid4()}")
    finally:
        process.stop()


async def test_a_run_whose_model_asks_for_the_tower_completes_and_the_session_goes_on(
    calculating_service: tuple[str, str], upstream: FakeUpstream
) -> None:
    url, key = calculating_service
    # The read timeout is only a safety net: heartbeats (every second) keep a healthy stream
    # well inside it, and a stream whose server blocked fails the test instead of hanging it.
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as api:
        sid = (await new_session(api, config={"tools": CALCULATOR}))["id"]
        upstream.script(ToolCall("c1", "calculator", json.dumps({"expression": TOWER})))
        upstream.script(Text("That number is too large to compute."))
        first = await read_to_end(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "go"})
        assert first.status == 200 and first.events[-1].type == "run.completed", first
        (result,) = [e.data for e in first.events if e.type == "tool_result"]
        assert result["is_error"] and "too large" in result["preview"], result
        # The model read the error result, and the run went on to its answer.
        sent = upstream.requests[-1].body["messages"]
        assert any(m["role"] == "tool" and "too large" in str(m["content"]) for m in sent)
        assert first.events[-1].data["text"] == "That number is too large to compute."
        # One attempt: no worker stalled, so none took the run over.
        assert [e.data["attempt"] for e in first.events if e.type == "run.started"] == [1]

        upstream.script(Text("next"))
        second = await read_to_end(api, "POST", f"/v1/sessions/{sid}/ask", json={"input": "hi"})
        assert second.status == 200 and second.events[-1].type == "run.completed", second
        assert second.events[-1].data["text"] == "next"
