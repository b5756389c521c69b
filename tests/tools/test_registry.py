"""Built-in tools and the executor: errors and timeouts are results, not crashes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import app.tools
from app.core.tool_loop import PendingCall
from app.tools.registry import BUILTINS, ToolContext, builtin, execute
from tests.core.test_purity import imported_modules

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


def test_webhook_tools_never_import_the_registry() -> None:
    # The registry routes webhook calls to app.tools.webhook; an import back (even one inside a
    # function) would make the two a cycle again. What both need lives in app.tools.context.
    tools = Path(app.tools.__file__).parent
    assert "app.tools.registry" not in imported_modules(tools / "webhook.py")
    assert not {m for m in imported_modules(tools / "context.py") if m.startswith("app.")}
    assert "app.tools.webhook" in imported_modules(tools / "registry.py")
