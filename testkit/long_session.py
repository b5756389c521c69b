"""A scripted long session for the fake upstream: numbered turns, tool calls (some returning about
100 KB), and a model that answers whatever the service sends it — a summary when asked to
summarize, a tool call when the user asks for one, a short answer otherwise.

Shared by tests/api/test_long_session.py and bench/long_session.py.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
from collections.abc import Iterator
from typing import Any

from app.core.compaction import INSTRUCTIONS
from app.tools.registry import BUILTINS, ToolContext
from testkit.upstream import ReceivedRequest, Script, Text, ToolCall, Usage

SECRET = "ZEBRA-4417"
SECRET_TURN = 3
BIG_EVERY, BIG_OFFSET = 50, 7  # turns 7, 57, 107… run big_report (~100 KB)
TOOL_EVERY, TOOL_OFFSET = 10, 5  # turns 5, 15, 25… run lookup (small)
WINDOW, RESERVE = 4000, 500
BUDGET = WINDOW - RESERVE
POLICY = {
    "max_input_tokens": WINDOW,
    "reserve_output_tokens": RESERVE,
    "summarization": "auto",
    "keep_last_turns": 2,
}
TOOLS = [
    {
        "name": "big_report",
        "kind": "builtin",
        "description": "A long report about a region.",
        "parameters": {"type": "object", "properties": {"region": {"type": "integer"}}},
    },
    {
        "name": "lookup",
        "kind": "builtin",
        "description": "Looks an item up.",
        "parameters": {"type": "object", "properties": {"item": {"type": "integer"}}},
    },
]
SESSION_CONFIG = {
    "system_prompt": "You are a careful assistant.",
    "context_policy": POLICY,
    "tools": TOOLS,
}
_WORDS = [
    "invoice",
    "ledger",
    "account",
    "balance",
    "region",
    "quarter",
    "forecast",
    "margin",
    "supplier",
    "contract",
    "shipment",
    "warehouse",
    "audit",
    "budget",
    "payroll",
    "refund",
    "discount",
    "customer",
    "order",
    "renewal",
]
_TURN = re.compile(r"^turn (\d+):")


def user_text(turn: int) -> str:
    if turn == SECRET_TURN:
        return f"turn {turn}: remember that the launch code is {SECRET}."
    if turn % BIG_EVERY == BIG_OFFSET:
        return f"turn {turn}: please run big_report for region {turn}."
    if turn % TOOL_EVERY == TOOL_OFFSET:
        return f"turn {turn}: please run lookup for item {turn}."
    rng = random.Random(turn)
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(15, 60)))
    return f"turn {turn}: {words}."


def big_report(region: int) -> str:
    """About 100 KB of lines, multi-byte characters included, deterministic."""
    return "".join(
        f"row {k:05d} · region {region} · value {(k * 7919 + region) % 100_003} · ✓ ünïcødé\n"
        for k in range(1_800)
    )


def lookup(item: int) -> dict[str, Any]:
    return {"item": item, "status": "in stock", "count": item % 17}


@contextlib.contextmanager
def installed_tools() -> Iterator[None]:
    """The scenario's tools as built-ins of the in-process service, for the block's duration."""

    async def run_big_report(arguments: dict[str, Any], context: ToolContext) -> str:
        return big_report(int(arguments["region"]))

    async def run_lookup(arguments: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        return lookup(int(arguments["item"]))

    BUILTINS["big_report"], BUILTINS["lookup"] = run_big_report, run_lookup
    try:
        yield
    finally:
        del BUILTINS["big_report"], BUILTINS["lookup"]


def is_summarization(body: dict[str, Any]) -> bool:
    first = body["messages"][0]
    return first["role"] == "system" and str(first["content"]) == INSTRUCTIONS


def respond(request: ReceivedRequest) -> Script:
    """The fake model: what a cooperative model would answer to this request."""
    messages = request.body["messages"]
    if is_summarization(request.body):
        transcript = str(messages[-1]["content"])
        numbers = {int(n) for n in re.findall(r"user: turn (\d+):", transcript)}
        folded = re.search(r"through turns (\d+) to (\d+)", transcript)
        if folded:  # the summary so far is folded in, as the prompt asks
            numbers |= {int(folded.group(1)), int(folded.group(2))}
        turns = sorted(numbers)
        covered = f"turns {turns[0]} to {turns[-1]}" if turns else "earlier turns"
        summary = f"The user and the assistant went through {covered}; all were answered."
        return Script((Text(summary), Usage(1000, 20)))
    last = messages[-1]
    if last["role"] == "tool":
        return Script((Text(f"Done: {str(last['content'])[:40]}"), Usage(1000, 10)))
    text = str(last["content"])
    turn = int(match.group(1)) if (match := _TURN.match(text)) else -1
    if "run big_report" in text:
        call = ToolCall(f"call_big_{turn}", "big_report", json.dumps({"region": turn}))
        return Script((call, Usage(1000, 10)))
    if "run lookup" in text:
        call = ToolCall(f"call_lookup_{turn}", "lookup", json.dumps({"item": turn}))
        return Script((call, Usage(1000, 10)))
    return Script((Text(f"Noted turn {turn}."), Usage(1000, 5)))
