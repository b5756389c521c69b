"""Router: model strings to providers, retries (after output too, for callers that take
restarts), fallback, circuit breaker, stall guard: real SDKs against the fake upstream."""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import pytest

from app.config import Settings
from app.core.messages import Message
from app.core.reasoning import Reasoning
from app.llm.anthropic_provider import AnthropicProvider
from app.llm.base import (
    Finish,
    ModelRequest,
    ProviderError,
    Restart,
    RoutedEvent,
    StreamEvent,
    TextDelta,
)
from app.llm.openai_provider import OpenAIProvider
from app.llm.router import Route, Router
from testkit.upstream import Fail, FailMidStream, FakeUpstream, Malformed, Stall, Text, Truncate
from tests.llm.streamed import collect

OPENAI = "openai:gpt-test"
ANTHROPIC = "anthropic:claude-test"
HELLO = ModelRequest("", (Message("user", "Hi"),))
COMPLETIONS = "/v1/chat/completions"
MESSAGES = "/v1/messages"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as up:
        yield up


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_router(upstream: FakeUpstream, clock: FakeClock) -> AsyncIterator[Any]:
    """Routers on the fake upstream: test settings, then the test's overrides."""
    upstream.clear()
    routers: list[Router] = []

    def make(**overrides: Any) -> Router:
        fields: dict[str, Any] = {
            "openai_api_key": "sk-test",
            "openai_base_url": upstream.openai_base_url,
            "anthropic_api_key": "sk-ant-test",
            "anthropic_base_url": upstream.url,
            "compat_endpoints": {
                "vllm": f"{upstream.url}/vllm/v1",
                "llama": f"{upstream.url}/llama/v1",
            },
            "compat_api_key": "compat-key",
            "llm_max_retries": 2,
            "llm_retry_base_seconds": 0.01,
            "llm_request_timeout_seconds": 5,
            "breaker_failures": 3,
            "breaker_cooldown_seconds": 30,
            **overrides,
        }
        router = Router(Settings(_env_file=None, **fields), clock=clock)
        routers.append(router)
        return router

    yield make
    for router in routers:
        await router.aclose()


def paths(upstream: FakeUpstream) -> list[str]:
    return [r.path for r in upstream.requests]


# --- Resolving model strings ---------------------------------------------------------------


def test_model_strings_pick_providers_and_names(make_router: Any) -> None:
    router = make_router()

    openai_a, name_a = router.provider_for("openai:gpt-a")
    openai_b, name_b = router.provider_for("openai:gpt-b")
    anthropic, claude = router.provider_for("anthropic:claude-x")

    assert isinstance(openai_a, OpenAIProvider)
    assert openai_a is openai_b  # one client per provider, whatever the model
    assert (name_a, name_b) == ("gpt-a", "gpt-b")
    assert isinstance(anthropic, AnthropicProvider)
    assert claude == "claude-x"


def test_compat_models_name_an_endpoint_and_maybe_a_model(make_router: Any) -> None:
    router = make_router()

    vllm, model = router.provider_for("compat:vllm/meta-llama/Llama-3-8B")
    vllm_again, bare = router.provider_for("compat:vllm")
    llama, _ = router.provider_for("compat:llama")

    assert isinstance(vllm, OpenAIProvider)
    assert model == "meta-llama/Llama-3-8B"
    assert bare == "vllm"  # no model named: the endpoint's name is the model's
    assert vllm is vllm_again
    assert llama is not vllm  # cached per endpoint
    assert router.route("compat:vllm/x").key == "compat:vllm"


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("compat:nowhere/some-model", "unknown compat endpoint 'nowhere'"),
        ("mystery:model", "unknown provider 'mystery'"),
        ("gpt-4o", "not <provider>:<name>"),
    ],
)
async def test_unroutable_models_are_unavailable(
    make_router: Any, upstream: FakeUpstream, model: str, words: str
) -> None:
    router = make_router()

    with pytest.raises(ProviderError) as caught:
        router.provider_for(model)
    assert caught.value.kind == "unavailable"
    assert words in caught.value.message

    with pytest.raises(ProviderError) as streamed:
        await collect(router.stream(model, HELLO))
    assert streamed.value.kind == "unavailable"
    assert upstream.requests == []


def test_a_provider_without_a_key_is_unavailable(make_router: Any) -> None:
    router = make_router(openai_api_key=None)

    with pytest.raises(ProviderError) as caught:
        router.provider_for(OPENAI)

    assert caught.value.kind == "unavailable"
    assert "THREADLINE_OPENAI_API_KEY" in caught.value.message


class ScriptedProvider:
    """A provider in-process: what the SDKs cannot be made to do on cue."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        self.calls += 1
        for delay in self.delays:
            await asyncio.sleep(delay)
            yield TextDelta(request.model)
        yield Finish("stop")


async def test_registered_prefixes_are_routed(make_router: Any) -> None:
    router = make_router()
    provider = ScriptedProvider([0])
    router.register("local", lambda name: Route("local", name.upper(), lambda: provider))

    events = await collect(router.stream("local:gemma", HELLO))

    assert events == [("local:gemma", TextDelta("GEMMA")), ("local:gemma", Finish("stop"))]
    assert router.provider_for("local:other") == (provider, "OTHER")


# --- Streaming through the SDKs ----------------------------------------------------------


async def test_streams_with_the_routed_model_name(make_router: Any, upstream: FakeUpstream) -> None:
    upstream.script(Text("Hel"), Text("lo"))

    events = await collect(make_router().stream(OPENAI, HELLO))

    assert [e for _, e in events][:2] == [TextDelta("Hel"), TextDelta("lo")]
    assert {model for model, _ in events} == {OPENAI}
    assert upstream.requests[0].body["model"] == "gpt-test"


async def test_compat_endpoints_get_their_base_url(
    make_router: Any, upstream: FakeUpstream
) -> None:
    router = make_router()

    await collect(router.stream("compat:vllm/meta-llama/Llama-3-8B", HELLO))
    await collect(router.stream("compat:llama", HELLO))

    first, second = upstream.requests
    assert first.path == "/vllm/v1/chat/completions"
    assert first.body["model"] == "meta-llama/Llama-3-8B"
    assert first.headers["authorization"] == "Bearer compat-key"
    assert second.path == "/llama/v1/chat/completions"
    assert second.body["model"] == "llama"


async def test_only_openai_itself_gets_the_prompt_cache_key(
    make_router: Any, upstream: FakeUpstream
) -> None:
    """OpenAI routes a thread's calls to one prompt cache by the key; compatible servers (vLLM,
    llama.cpp) know no such field and may refuse it."""
    router = make_router()
    keyed = replace(HELLO, cache_key="threadline-s1")

    await collect(router.stream(OPENAI, keyed))
    await collect(router.stream("compat:vllm/meta-llama/Llama-3-8B", keyed))

    openai_request, compat_request = upstream.requests
    assert openai_request.body["prompt_cache_key"] == "threadline-s1"
    assert "prompt_cache_key" not in compat_request.body


async def test_a_rate_limit_before_output_is_retried(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Fail(429))
    upstream.script(Text("fine"))

    events = await collect(make_router().stream(OPENAI, HELLO))

    assert (OPENAI, TextDelta("fine")) in events
    assert paths(upstream) == [COMPLETIONS, COMPLETIONS]


async def test_retries_back_off(make_router: Any, upstream: FakeUpstream) -> None:
    upstream.script(Fail(500))
    upstream.script(Fail(500))
    router = make_router(llm_retry_base_seconds=0.1)

    started = time.monotonic()
    await collect(router.stream(ANTHROPIC, HELLO))

    # Delays of 0.1 then 0.2 seconds, each jittered down to no less than half.
    assert time.monotonic() - started >= 0.15
    assert paths(upstream) == [MESSAGES] * 3


async def test_a_failure_after_the_first_delta_is_not_retried(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Text("partial"), FailMidStream("overloaded"))
    upstream.script(Text("never sent"))
    events: list[tuple[str, StreamEvent]] = []

    with pytest.raises(ProviderError) as caught:
        await collect(make_router().stream(ANTHROPIC, HELLO, fallback=OPENAI), events)

    assert caught.value.kind == "overloaded"
    assert events == [(ANTHROPIC, TextDelta("partial"))]
    assert paths(upstream) == [MESSAGES]  # no retry, and no fallback either
    assert upstream.pending == 1


def texts_and_restarts(events: list[tuple[str, RoutedEvent]]) -> list[tuple[str, str]]:
    """(model, the text, or "<restart:kind>") of each text delta and restart."""
    return [
        (model, e.text if isinstance(e, TextDelta) else f"<restart:{e.error.kind}>")
        for model, e in events
        if isinstance(e, TextDelta | Restart)
    ]


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (FailMidStream("overloaded"), "overloaded"),
        (FailMidStream(disconnect=True), "connection"),
        (Stall(5), "timeout"),
        (Truncate(), "server"),
        (Malformed(), "bad_response"),
    ],
)
@pytest.mark.parametrize("model", [OPENAI, ANTHROPIC])
async def test_with_restarts_a_fault_after_output_is_retried_after_a_restart(
    make_router: Any, upstream: FakeUpstream, model: str, fault: Any, kind: str
) -> None:
    upstream.script(Text("half "), Text("an answer"), fault)
    upstream.script(Text("the whole answer"))
    router = make_router(llm_request_timeout_seconds=0.5)

    events = await collect(router.stream(model, HELLO, restarts=True))

    assert texts_and_restarts(events) == [
        (model, "half "),
        (model, "an answer"),
        (model, f"<restart:{kind}>"),
        (model, "the whole answer"),
    ]
    assert isinstance(events[-1][1], Finish)
    first, second = upstream.requests
    assert first.body == second.body  # the same request, asked again


async def test_a_restart_waits_for_new_output(make_router: Any, upstream: FakeUpstream) -> None:
    upstream.script(Text("partial"), FailMidStream("overloaded"))
    upstream.script(Fail(529))
    upstream.script(Text("again"))

    events = await collect(make_router().stream(OPENAI, HELLO, restarts=True))

    assert texts_and_restarts(events) == [
        (OPENAI, "partial"),
        (OPENAI, "<restart:overloaded>"),
        (OPENAI, "again"),
    ]
    assert len(upstream.requests) == 3


async def test_with_restarts_retries_are_still_bounded(
    make_router: Any, upstream: FakeUpstream
) -> None:
    for attempt in range(3):  # the first try and 2 retries
        upstream.script(Text(f"try {attempt}"), FailMidStream("overloaded"))
    upstream.script(Text("never sent"))
    events: list[tuple[str, RoutedEvent]] = []

    with pytest.raises(ProviderError) as caught:
        await collect(make_router().stream(ANTHROPIC, HELLO, restarts=True), events)

    assert caught.value.kind == "overloaded"
    assert texts_and_restarts(events) == [
        (ANTHROPIC, "try 0"),
        (ANTHROPIC, "<restart:overloaded>"),
        (ANTHROPIC, "try 1"),
        (ANTHROPIC, "<restart:overloaded>"),
        (ANTHROPIC, "try 2"),
    ]
    assert upstream.pending == 1


async def test_output_of_a_failed_attempt_stands_when_no_later_one_has_any(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Text("partial"), FailMidStream("overloaded"))
    upstream.script(Fail(529))
    upstream.script(Fail(500))
    events: list[tuple[str, RoutedEvent]] = []

    with pytest.raises(ProviderError) as caught:
        await collect(make_router().stream(OPENAI, HELLO, restarts=True), events)

    assert caught.value.kind == "server"
    assert texts_and_restarts(events) == [(OPENAI, "partial")]  # no restart: nothing replaced it


async def test_with_restarts_a_fault_after_output_falls_back_once_retries_run_out(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Text("primary"), FailMidStream("overloaded"))
    upstream.script(Text("from the fallback"))

    events = await collect(
        make_router(llm_max_retries=0).stream(ANTHROPIC, HELLO, fallback=OPENAI, restarts=True)
    )

    assert texts_and_restarts(events) == [
        (ANTHROPIC, "primary"),
        (OPENAI, "<restart:overloaded>"),
        (OPENAI, "from the fallback"),
    ]
    assert paths(upstream) == [MESSAGES, COMPLETIONS]


async def test_with_restarts_a_permanent_failure_after_output_is_not_retried(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Text("partial"), FailMidStream("bad_request", "no such thing"))
    upstream.script(Text("never sent"))
    events: list[tuple[str, RoutedEvent]] = []

    with pytest.raises(ProviderError) as caught:
        await collect(make_router().stream(OPENAI, HELLO, restarts=True), events)

    assert caught.value.kind == "bad_request"
    assert texts_and_restarts(events) == [(OPENAI, "partial")]
    assert upstream.pending == 1


async def test_exhausted_retries_fall_back(make_router: Any, upstream: FakeUpstream) -> None:
    for _ in range(3):
        upstream.script(Fail(529))
    upstream.script(Text("from the fallback"))

    events = await collect(make_router().stream(ANTHROPIC, HELLO, fallback=OPENAI))

    assert events[0] == (OPENAI, TextDelta("from the fallback"))
    assert {model for model, _ in events} == {OPENAI}
    assert paths(upstream) == [MESSAGES] * 3 + [COMPLETIONS]


async def test_exhausted_retries_without_fallback_raise_the_last_error(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Fail(500))
    upstream.script(Fail(500))
    upstream.script(Fail(429))

    with pytest.raises(ProviderError) as caught:
        await collect(make_router().stream(OPENAI, HELLO))

    assert caught.value.kind == "rate_limited"
    assert len(upstream.requests) == 3


async def test_a_non_retryable_error_goes_straight_to_the_fallback(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Fail(400))

    events = await collect(make_router().stream(OPENAI, HELLO, fallback=ANTHROPIC))

    assert events[0][0] == ANTHROPIC
    assert paths(upstream) == [COMPLETIONS, MESSAGES]


async def test_a_non_retryable_error_without_fallback_is_raised_at_once(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Fail(401))

    with pytest.raises(ProviderError) as caught:
        await collect(make_router().stream(OPENAI, HELLO))

    assert caught.value.kind == "auth"
    assert len(upstream.requests) == 1


async def test_both_failing_raises_the_fallbacks_error(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(Fail(400))
    upstream.script(Fail(404))

    with pytest.raises(ProviderError) as caught:
        await collect(make_router(llm_max_retries=0).stream(OPENAI, HELLO, fallback=ANTHROPIC))

    assert caught.value.kind == "not_found"


# --- Circuit breaker -----------------------------------------------------------------------


async def test_the_breaker_opens_after_consecutive_failures_and_closes_after_cooldown(
    make_router: Any, upstream: FakeUpstream, clock: FakeClock
) -> None:
    router = make_router(llm_max_retries=0)
    for _ in range(3):
        upstream.script(Fail(500))
        with pytest.raises(ProviderError):
            await collect(router.stream(OPENAI, HELLO))
    assert router.circuit_open("openai")

    with pytest.raises(ProviderError) as caught:
        await collect(router.stream(OPENAI, HELLO))
    assert caught.value.kind == "unavailable"
    assert "circuit open" in caught.value.message
    assert len(upstream.requests) == 3  # skipped: the upstream saw nothing

    # Other providers are unaffected, and serve as the fallback while the circuit is open.
    events = await collect(router.stream(OPENAI, HELLO, fallback=ANTHROPIC))
    assert events[0][0] == ANTHROPIC
    assert paths(upstream)[-1] == MESSAGES

    clock.now += 29
    assert router.circuit_open("openai")
    clock.now += 2
    assert not router.circuit_open("openai")
    upstream.script(Text("back"))
    events = await collect(router.stream(OPENAI, HELLO))
    assert events[0] == (OPENAI, TextDelta("back"))

    # A success reset the count: one failure now does not reopen the circuit.
    upstream.script(Fail(500))
    with pytest.raises(ProviderError):
        await collect(router.stream(OPENAI, HELLO))
    assert not router.circuit_open("openai")


async def test_a_few_failures_among_many_answered_calls_do_not_open_the_breaker(
    make_router: Any, upstream: FakeUpstream, clock: FakeClock
) -> None:
    """Calls in flight that answered count against the failures: with many streams running, a
    handful of calls failing together (a dropped connection) leaves the provider in use. This
    opened the circuit for every stream before (five failures in a row, whatever else ran)."""
    router = make_router(llm_max_retries=0)  # breaker_failures=3
    answering = [router.stream(OPENAI, HELLO) for _ in range(4)]
    for stream in answering:  # each has begun answering, and is still open
        upstream.script(Text("on"), Text("going"))
        assert await anext(stream) == (OPENAI, TextDelta("on"))
    for _ in range(4):
        upstream.script(Fail(500))
        with pytest.raises(ProviderError):
            await collect(router.stream(OPENAI, HELLO))
    assert not router.circuit_open("openai")  # 4 failures, 4 answers
    upstream.script(Fail(500))
    with pytest.raises(ProviderError):
        await collect(router.stream(OPENAI, HELLO))
    assert router.circuit_open("openai")  # now they outnumber the answers
    for stream in answering:
        await stream.aclose()


async def test_answers_older_than_the_window_do_not_hold_the_breaker_closed(
    make_router: Any, upstream: FakeUpstream, clock: FakeClock
) -> None:
    router = make_router(llm_max_retries=0)  # breaker_failures=3
    for _ in range(5):
        upstream.script(Text("fine"))
        await collect(router.stream(OPENAI, HELLO))
    clock.now += 61
    for _ in range(3):
        upstream.script(Fail(500))
        with pytest.raises(ProviderError):
            await collect(router.stream(OPENAI, HELLO))
    assert router.circuit_open("openai")


async def test_a_failed_trial_after_cooldown_reopens_at_once(
    make_router: Any, upstream: FakeUpstream, clock: FakeClock
) -> None:
    router = make_router(llm_max_retries=0, breaker_failures=2)
    for _ in range(2):
        upstream.script(Fail(529))
        with pytest.raises(ProviderError):
            await collect(router.stream(ANTHROPIC, HELLO))
    assert router.circuit_open("anthropic")

    clock.now += 31
    upstream.script(Fail(529))
    with pytest.raises(ProviderError) as caught:
        await collect(router.stream(ANTHROPIC, HELLO))

    assert caught.value.kind == "overloaded"
    assert router.circuit_open("anthropic")


async def test_the_breaker_stops_retries_once_open(
    make_router: Any, upstream: FakeUpstream
) -> None:
    router = make_router(llm_max_retries=5, breaker_failures=2)
    for _ in range(5):
        upstream.script(Fail(500))

    with pytest.raises(ProviderError) as caught:
        await collect(router.stream(OPENAI, HELLO))

    assert caught.value.kind == "unavailable"
    assert len(upstream.requests) == 2


async def test_client_errors_do_not_trip_the_breaker(
    make_router: Any, upstream: FakeUpstream
) -> None:
    router = make_router(llm_max_retries=0, breaker_failures=1)
    upstream.script(Fail(400))

    with pytest.raises(ProviderError):
        await collect(router.stream(OPENAI, HELLO))

    assert not router.circuit_open("openai")


# --- Stall guard ---------------------------------------------------------------------------


async def test_a_stall_after_output_times_out(make_router: Any, upstream: FakeUpstream) -> None:
    upstream.script(Text("a"), Stall(5))
    router = make_router(llm_request_timeout_seconds=0.3)
    events: list[tuple[str, StreamEvent]] = []

    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        await collect(router.stream(ANTHROPIC, HELLO), events)

    assert caught.value.kind == "timeout"
    assert events == [(ANTHROPIC, TextDelta("a"))]
    assert time.monotonic() - started < 2
    assert len(upstream.requests) == 1


async def test_a_stall_before_output_is_retried(make_router: Any, upstream: FakeUpstream) -> None:
    upstream.script(Stall(5))
    upstream.script(Text("awake"))

    events = await collect(make_router(llm_request_timeout_seconds=0.3).stream(OPENAI, HELLO))

    assert events[0] == (OPENAI, TextDelta("awake"))
    assert len(upstream.requests) == 2


async def test_the_guard_times_out_a_provider_that_goes_quiet(make_router: Any) -> None:
    router = make_router(llm_request_timeout_seconds=0.2, llm_max_retries=1)
    provider = ScriptedProvider([0, 1.0])
    router.register("slow", lambda name: Route("slow", name, lambda: provider))
    events: list[tuple[str, StreamEvent]] = []

    with pytest.raises(ProviderError) as caught:
        await collect(router.stream("slow:m", HELLO), events)

    assert caught.value.kind == "timeout"
    assert events == [("slow:m", TextDelta("m"))]
    assert provider.calls == 1  # the stall came after output: not retried


async def test_a_slow_but_steady_stream_is_not_a_stall(
    make_router: Any, upstream: FakeUpstream
) -> None:
    upstream.script(*[Text(str(i)) for i in range(8)], token_delay=0.1)

    events = await collect(make_router(llm_request_timeout_seconds=0.5).stream(OPENAI, HELLO))

    assert "".join(e.text for _, e in events if isinstance(e, TextDelta)) == "01234567"


async def test_a_stall_timeout_leaves_no_cancel_pending(make_router: Any) -> None:
    router = make_router(llm_request_timeout_seconds=0.2, llm_max_retries=0)
    provider = ScriptedProvider([0, 0, 3600])
    router.register("slow", lambda name: Route("slow", name, lambda: provider))

    with pytest.raises(ProviderError) as caught:
        await collect(router.stream("slow:m", HELLO))

    assert caught.value.kind == "timeout"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the guard's cancel was taken back
    await asyncio.sleep(0)  # and none is delivered later


async def test_the_time_the_caller_holds_an_event_is_not_a_stall(make_router: Any) -> None:
    router = make_router(llm_request_timeout_seconds=0.2, llm_max_retries=0)
    provider = ScriptedProvider([0, 0, 0])
    router.register("quick", lambda name: Route("quick", name, lambda: provider))
    events: list[StreamEvent] = []

    async for _, event in router.stream("quick:m", HELLO):
        events.append(event)
        await asyncio.sleep(0.5)  # a slow caller (its database, say); the provider is quick

    assert events == [TextDelta("m")] * 3 + [Finish("stop")]


async def test_a_cancel_while_waiting_for_the_provider_is_a_cancel_not_a_timeout(
    make_router: Any,
) -> None:
    router = make_router(llm_request_timeout_seconds=30)
    provider = ScriptedProvider([0, 3600])
    router.register("held", lambda name: Route("held", name, lambda: provider))
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in router.stream("held:m", HELLO):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 30)
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    assert provider.calls == 1


def imported_sdks(code: str, **env: str) -> set[str]:
    """Which of the provider SDKs a fresh interpreter has imported after running `code`."""
    probe = f"{code}\nimport sys\nprint(sorted({{'openai', 'anthropic'}} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=True,
    )
    return set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


def test_the_api_resolves_models_without_importing_the_sdks() -> None:
    # The SDKs took ~1.5 s of every start of an API process and of `threadline keys` & co.
    resolve = (
        "from app.main import create_app\nfrom app.config import Settings\n"
        "from app.llm.router import Router\n"
        "settings = Settings(openai_api_key='k', anthropic_api_key='k')\n"
        "create_app(settings)\n"
        "router = Router(settings)\n"
        "router.route('openai:gpt-4o'), router.route('anthropic:claude-haiku-4-5')\n"
    )
    assert imported_sdks(resolve) == set()


@pytest.mark.parametrize(
    ("configured", "sdks"),
    [
        ("openai_api_key='k'", {"openai"}),
        ("anthropic_api_key='k'", {"openai", "anthropic"}),  # it shares openai's error kinds
        ("compat_endpoints={'llama': 'http://127.0.0.1:1/v1'}", {"openai"}),
        ("", set()),
    ],
)
def test_a_process_that_calls_models_imports_its_providers_at_startup(
    configured: str, sdks: set[str]
) -> None:
    start = (
        "from app.config import Settings\nfrom app.llm.router import Router\n"
        f"Router(Settings({configured})).import_providers()\n"
    )
    # Keys from the environment would configure more providers than the test names.
    clean = {"THREADLINE_OPENAI_API_KEY": "", "THREADLINE_ANTHROPIC_API_KEY": ""}
    assert imported_sdks(start, **clean) == sdks


async def test_a_fallback_that_cannot_reason_is_asked_without_reasoning(
    make_router: Any, upstream: FakeUpstream
) -> None:
    thinking = replace(HELLO, reasoning=Reasoning(effort="low"))
    for _ in range(3):
        upstream.script(Fail(529))
    upstream.script(Text("from the fallback"))

    sonnet, haiku = "anthropic:claude-sonnet-4-5", "anthropic:claude-3-5-haiku-latest"
    router = make_router(breaker_failures=100)  # one provider for both: not tripped here
    events = await collect(router.stream(sonnet, thinking, fallback=haiku))

    assert events[0] == (haiku, TextDelta("from the fallback"))
    asked = [r.body.get("thinking") for r in upstream.requests]
    assert asked == [{"type": "enabled", "budget_tokens": 1024}] * 3 + [None]
