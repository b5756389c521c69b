"""Steering from the OpenAI facade: a response created with multitask_strategy steer (the
SDK's extra_body) while its conversation's response is in progress goes to that response."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from openai import AsyncOpenAI

from testkit.upstream import FakeUpstream, Hold, Text, ToolCall

MODEL = "gpt-4o-mini"


async def test_a_response_steers_the_one_in_progress(
    client: AsyncOpenAI, upstream: FakeUpstream
) -> None:
    """multitask_strategy: steer (Threadline's own, in extra_body): the message reaches the
    response in progress at its next model turn, after its current tool call, and that
    response is the one returned."""
    release = threading.Event()
    upstream.script(ToolCall("c1", "calculator", json.dumps({"expression": "1+1"})))
    upstream.script(Hold(release), ToolCall("c2", "calculator", json.dumps({"expression": "2"})))
    builtin: Any = {"type": "builtin", "name": "calculator"}
    first = await client.responses.create(
        model=MODEL, input="1 + 1?", tools=[builtin], background=True
    )
    await upstream.requests_arrived(2)  # its second model turn is held

    steered = await client.responses.create(
        model=MODEL,
        input="Answer in French.",
        conversation=first.conversation.id if first.conversation else None,
        background=True,
        extra_body={"multitask_strategy": "steer"},
    )
    assert steered.id == first.id
    upstream.script(Text("Deux."))
    release.set()
    done = await client.responses.retrieve(first.id)
    while done.status in ("queued", "in_progress"):
        await asyncio.sleep(0.05)
        done = await client.responses.retrieve(first.id)
    assert done.status == "completed" and done.output_text == "Deux."
    # The turn after the held one saw the steered message, after that turn's tool result.
    sent = [m for m in upstream.requests[-1].body["messages"] if m["role"] != "system"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "tool", "user"]
    assert sent[-1]["content"] == "Answer in French."
