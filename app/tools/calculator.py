"""The built-in `calculator`: exact arithmetic, bounded so that no expression can stall a worker.

`((9**999)**999)**999` is three short powers; computing it would hold the CPU for hours, and a
worker's event loop with it (its heartbeats stop, the run is retried on the next worker, which
blocks too). So every step is bounded before it is taken: the expression's length, each
exponent, and the size of every intermediate integer, estimated from the operands' sizes before
multiplying or raising (digits of a**b ~ b * log10|a|). Each bounded step takes microseconds, and
a wall-clock guard between steps bounds the number of them. Evaluation runs in a thread, so even
those microseconds are not the event loop's. Whatever is refused is an error result the model
reads ("Error: calculator failed: ... too large ..."), never an exception of the run.
"""

from __future__ import annotations

import ast
import asyncio
import math
import operator
import re
import time
from collections.abc import Callable
from typing import Any

from app.tools.registry import ToolContext, builtin

MAX_EXPRESSION_CHARS = 10_000
MAX_EXPONENT = 1000  # what the tool's description promises the model
MAX_DIGITS = 4000  # of any integer, intermediate or final (str() of it stays under Python's 4300)
MAX_SECONDS = 2.0  # wall-clock guard: a bound on the number of (each bounded) steps

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_LIMIT = 10**MAX_DIGITS  # integers must stay below it in magnitude
_LONG_LITERAL = re.compile(rf"[0-9_]{{{MAX_DIGITS + 1},}}")
_ONLY = "only numbers, parentheses and + - * / // % ** are allowed"


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message is for the model."""


class TooLarge(CalculatorError):
    pass


@builtin("calculator")
async def calculator(arguments: dict[str, Any], context: ToolContext) -> Number:
    """Arithmetic on numbers (+ - * / // % **), evaluated without eval(), off the event loop."""
    return await asyncio.to_thread(evaluate, str(arguments.get("expression", "")))


def evaluate(expression: str, *, seconds: float = MAX_SECONDS) -> Number:
    """The value of an arithmetic expression, or CalculatorError (TooLarge for what is out of
    bounds). Iterative: the depth of the expression is no limit of the Python stack."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise TooLarge(
            f"the expression is too large: {len(expression)} characters "
            f"(at most {MAX_EXPRESSION_CHARS})"
        )
    if _LONG_LITERAL.search(expression):
        raise TooLarge(f"a number in the expression has over {MAX_DIGITS:,} digits: too large")
    tree = _parse(expression)
    deadline = time.monotonic() + seconds
    values: list[Number] = []
    todo: list[tuple[ast.AST, bool]] = [(tree, False)]
    while todo:
        if time.monotonic() > deadline:
            raise TooLarge(f"the expression is too large to evaluate in {seconds:g} s")
        node, operands_ready = todo.pop()
        if isinstance(node, ast.Constant):
            values.append(_checked(_number(node.value)))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            if operands_ready:
                right, left = values.pop(), values.pop()
                values.append(_binary(node.op, left, right))
            else:  # the left operand is evaluated first, then the right, then this
                todo += [(node, True), (node.right, False), (node.left, False)]
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            if operands_ready:
                values.append(_checked(_UNARY[type(node.op)](values.pop())))
            else:
                todo += [(node, True), (node.operand, False)]
        else:
            raise CalculatorError(_ONLY)
    (result,) = values
    return result


def _parse(expression: str) -> ast.AST:
    try:
        return ast.parse(expression.strip(), mode="eval").body
    except (RecursionError, MemoryError):
        raise TooLarge("the expression is nested too deeply") from None
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression: {exc.msg}") from None
    except ValueError as exc:  # a NUL character
        raise CalculatorError(f"not an arithmetic expression: {exc}") from None


def _number(value: object) -> Number:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalculatorError(_ONLY)
    return value


def _binary(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Pow):
        _check_power(left, right)
    elif isinstance(op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
        # |a*b| >= 2**(bits(a) + bits(b) - 2): refused unheard of when that is past the limit.
        at_least = (left.bit_length() + right.bit_length() - 2) * math.log10(2)
        if left and right and at_least >= MAX_DIGITS:
            raise _too_large(math.floor(at_least) + 1)
    try:
        result = _BINARY[type(op)](left, right)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise TooLarge("the result is too large for a floating-point number") from None
    return _checked(result)


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse a power before computing it when its exponent, or its estimated size, is out of
    bounds: digits of base**exponent ~ exponent * log10|base|."""
    if abs(exponent) > MAX_EXPONENT:
        raise TooLarge(f"the exponent {_show(exponent)} is too large (at most {MAX_EXPONENT})")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        magnitude = exponent * math.log10(abs(base))  # |base**exponent| = 10**magnitude
        if magnitude >= MAX_DIGITS:
            raise _too_large(math.floor(magnitude) + 1)


def _checked(value: object) -> Number:
    """A result within bounds: a real, finite number; an integer below 10**MAX_DIGITS."""
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise TooLarge("the result is too large for a floating-point number")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _LIMIT:
        raise _too_large(_digits(value))
    assert isinstance(value, int | float)
    return value


def _digits(value: int) -> int:
    """The number of decimal digits of an integer, within one (from its bit length: no
    conversion to decimal, which is quadratic)."""
    return max(1, math.ceil(abs(value).bit_length() * math.log10(2)))


def _show(value: Number) -> str:
    if isinstance(value, float) or _digits(value) <= 20:
        return repr(value)
    return f"of about {_digits(value):,} digits"


def _too_large(digits: int) -> TooLarge:
    return TooLarge(
        f"the result would have about {digits:,} digits: too large (at most {MAX_DIGITS:,})"
    )
