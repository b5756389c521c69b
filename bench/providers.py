"""Provider benchmark: the CPU a provider spends per streamed chunk.

Prints figures only. Run with `python -m bench.providers` (`make bench`). Each provider streams
CHUNKS text chunks from the fake upstream (testkit/upstream.py, a thread of this process) through
the real SDK over HTTP, and the figure is the CPU time of this process's main thread (where the
SDK, the provider and the event loop run; the upstream's thread is not counted) per chunk, the
best of ROUNDS runs. Clients are made before the clock starts (a client's TLS context alone
costs tens of milliseconds, once per process). Beside each, "typed": the same stream read
through the SDK's create() on its default HTTP client, which builds a pydantic model of every
chunk; and "routed": the provider behind the Router (its retries, stall guard and surrogate
check), as the worker gets it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anthropic
import openai

from app.config import Settings
from app.core.messages import Message
from app.llm.anthropic_provider import AnthropicProvider
from app.llm.base import Finish, ModelRequest, StreamEvent, TextDelta, ToolCallDelta
from app.llm.openai_provider import OpenAIProvider
from app.llm.router import Router
from testkit.upstream import FakeUpstream, Text

QUICK = bool(os.environ.get("BENCH_QUICK"))
CHUNKS = 2_000 if QUICK else 10_000
ROUNDS = 3 if QUICK else 5
REQUEST = ModelRequest("bench-model", (Message("user", "Count to ten thousand."),))


async def typed_openai(client: openai.AsyncOpenAI) -> AsyncIterator[StreamEvent]:
    """The stream read from the SDK's typed chunks (ChatCompletionChunk)."""
    chunks = await client.chat.completions.create(
        model=REQUEST.model,
        messages=[{"role": "user", "content": "Count to ten thousand."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    async with chunks:
        async for chunk in chunks:
            for choice in chunk.choices:
                if choice.index != 0:
                    continue
                delta = choice.delta
                if delta.content:
                    yield TextDelta(delta.content)
                for call in delta.tool_calls or ():
                    function = call.function
                    yield ToolCallDelta(
                        call.index,
                        call.id,
                        function.name if function else None,
                        (function.arguments or "") if function else "",
                    )
                if choice.finish_reason is not None:
                    yield Finish(choice.finish_reason)


async def typed_anthropic(client: anthropic.AsyncAnthropic) -> AsyncIterator[StreamEvent]:
    """The stream read from the SDK's typed events (RawMessageStreamEvent)."""
    events = await client.messages.create(
        model=REQUEST.model,
        max_tokens=4096,
        messages=[{"role": "user", "content": "Count to ten thousand."}],
        stream=True,
    )
    async with events:
        async for event in events:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                if event.delta.text:
                    yield TextDelta(event.delta.text)
            elif event.type == "message_delta" and event.delta.stop_reason is not None:
                yield Finish(event.delta.stop_reason)


def routed(upstream: FakeUpstream) -> Router:
    return Router(
        Settings(
            openai_api_key="sk-bench",
            openai_base_url=upstream.openai_base_url,
            anthropic_api_key="sk-bench",
            anthropic_base_url=upstream.url,
        )
    )


async def routed_stream(router: Router, model: str) -> AsyncIterator[Any]:
    async for _model, event in router.stream(model, REQUEST, restarts=True):
        yield event


async def cpu_per_chunk(upstream: FakeUpstream, stream: Callable[[], AsyncIterator[Any]]) -> float:
    """Main-thread CPU microseconds per text chunk, the best of ROUNDS streams."""
    best = float("inf")
    for _ in range(ROUNDS):
        upstream.script(*[Text("tok ") for _ in range(CHUNKS)])
        texts = 0
        started = time.thread_time()
        async for event in stream():
            texts += isinstance(event, TextDelta)
        used = time.thread_time() - started
        assert texts == CHUNKS, f"streamed {texts} text chunks of {CHUNKS}"
        best = min(best, used / CHUNKS * 1e6)
    return best


async def compare(
    upstream: FakeUpstream,
    name: str,
    typed: Callable[[], AsyncIterator[Any]],
    provider: OpenAIProvider | AnthropicProvider,
    router: Router,
) -> None:
    model = f"{name}:{REQUEST.model}"
    before = await cpu_per_chunk(upstream, typed)
    after = await cpu_per_chunk(upstream, lambda: provider.stream(REQUEST))
    behind_router = await cpu_per_chunk(upstream, lambda: routed_stream(router, model))
    print(
        f"  {name:9} typed SDK chunks {before:6.1f} us   provider {after:6.1f} us"
        f" ({before / after:.2f}x less)   behind the router {behind_router:6.1f} us"
    )


async def run() -> None:
    print(f"CPU per streamed chunk ({CHUNKS} chunks, best of {ROUNDS}), main thread:")
    with FakeUpstream() as upstream:
        typed_openai_client = openai.AsyncOpenAI(
            api_key="sk-bench", base_url=upstream.openai_base_url
        )
        typed_anthropic_client = anthropic.AsyncAnthropic(api_key="sk-bench", base_url=upstream.url)
        openai_provider = OpenAIProvider("sk-bench", upstream.openai_base_url)
        anthropic_provider = AnthropicProvider("sk-bench", upstream.url)
        router = routed(upstream)
        try:
            await compare(
                upstream,
                "openai",
                lambda: typed_openai(typed_openai_client),
                openai_provider,
                router,
            )
            await compare(
                upstream,
                "anthropic",
                lambda: typed_anthropic(typed_anthropic_client),
                anthropic_provider,
                router,
            )
        finally:
            await typed_openai_client.close()
            await typed_anthropic_client.close()
            await openai_provider.aclose()
            await anthropic_provider.aclose()
            await router.aclose()


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
