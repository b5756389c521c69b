"""Built-in tools and the executor: errors and timeouts are results, not crashes."""

from __future__ import annotations

import asyncio
from typing import Any

from app.core.tool_loop import PendingCall
from app.tools.registry import BUILTINS, ToolContext, builtin, execute

CONTEXT = ToolContext("t", "s", "r", "c")
CALCULATOR = [{"name": "calculator", "kind": "builtin"}]


def pending(name: str, **arguments: Any) -> PendingCall:
    return PendingCall("c", name, arguments, 1)


async def test_calculator() -> None:
    outcome = await execute(
        pending("calculator", expression="(4 + 2) * 3 - 2 ** 3"), CALCULATOR, CONTEXT
    )
    assert (outcome.content, outcome.is_error) == (10, False)
    refused = await execute(
        pending("calculator", expression="__import__('os')"), CALCULATOR, CONTEXT
    )
    assert refused.is_error and "only numbers" in refused.content


async def test_unknown_and_unoffered_tools_are_errors_the_model_can_read() -> None:
    assert (await execute(pending("nope"), CALCULATOR, CONTEXT)).is_error
    offered_but_missing = [{"name": "ghost", "kind": "builtin"}]
    assert "no built-in" in (await execute(pending("ghost"), offered_but_missing, CONTEXT)).content


async def test_a_slow_tool_times_out() -> None:
    @builtin("sleepy")
    async def sleepy(arguments: dict[str, Any], context: ToolContext) -> str:
        await asyncio.sleep(5)
        return "late"

    try:
        tools = [{"name": "sleepy", "kind": "builtin", "timeout_seconds": 0.05}]
        outcome = await execute(pending("sleepy"), tools, CONTEXT)
        assert outcome.is_error and "timed out" in outcome.content
    finally:
        del BUILTINS["sleepy"]
