"""Model routing: provider by model string, retries, fallback, circuit breaker.

A model string is "<prefix>:<rest>": openai:<name>, anthropic:<name>, compat:<endpoint> or
compat:<endpoint>/<name> (an OpenAI-compatible server from settings.compat_endpoints), or
local:<name> (settings.local_model_path, else the bundled SmolLM2-135M-Instruct, run in-process,
whatever the name). Other prefixes are served by factories registered with `Router.register`.

A call is retried (then falls back) while nothing has been yielded. Once the caller has seen
output, a failure propagates unchanged and the caller keeps what it got as an incomplete
answer, unless the caller asked for restarts: then a transient failure after output is retried
too, within the same retry budget, and the next attempt that has output to show starts with a
`Restart` event, so the caller drops what the failed one streamed. The caller is left holding
the failed attempt's output only if no later one produced any.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import random
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from dataclasses import dataclass, field, replace

from app.config import Settings
from app.core import tool_choice
from app.llm import local_provider
from app.llm.base import (
    ModelRequest,
    Provider,
    ProviderError,
    Restart,
    RoutedEvent,
    StreamEvent,
    storable,
)
from app.llm.catalog import can_reason, catalog_model, uses_responses_api
from app.llm.local_provider import LocalProvider
from app.telemetry import metrics, tracing

log = logging.getLogger(__name__)
MAX_RETRY_DELAY_SECONDS = 30.0
# The modules of the providers whose SDKs take long to import, by prefix (see
# Router.import_providers).
_PROVIDER_MODULES = {
    "openai": "app.llm.openai_provider",
    "compat": "app.llm.openai_provider",
    "anthropic": "app.llm.anthropic_provider",
}
# How far back the circuit breaker weighs a provider's failures against its answers.
BREAKER_WINDOW_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Route:
    """Where a model string goes.

    `key` names one provider instance: providers are built once per key and share a circuit
    breaker. `model` is the provider's own model name; `build` makes the provider on first use.
    """

    key: str
    model: str
    build: Callable[[], Provider]


# Receives what follows "<prefix>:" and says where it goes (or raises ProviderError).
ProviderFactory = Callable[[str], Route]


@dataclass(slots=True)
class _Breaker:
    """A provider's recent calls (failed, or answering) within BREAKER_WINDOW_SECONDS. Its
    circuit opens when the failures reach the threshold and outnumber the calls answered: with
    a hundred streams in flight, a few calls failing at once (a dropped connection) must not
    take the provider away from the many it is answering."""

    outcomes: deque[tuple[float, bool]] = field(default_factory=deque)  # (when, answered)
    answers: int = 0  # of the outcomes
    open_until: float | None = None

    def record(self, now: float, *, answered: bool) -> tuple[int, int]:
        """Add a call's outcome; the failures and answers within the window."""
        self.outcomes.append((now, answered))
        self.answers += answered
        while self.outcomes[0][0] < now - BREAKER_WINDOW_SECONDS:
            self.answers -= self.outcomes.popleft()[1]
        return len(self.outcomes) - self.answers, self.answers


class Router:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._clock = clock
        self._factories: dict[str, ProviderFactory] = {
            "openai": self._openai,
            "anthropic": self._anthropic,
            "compat": self._compat,
            "local": self._local,
        }
        self._providers: dict[str, Provider] = {}
        self._breakers: dict[str, _Breaker] = {}

    # --- Resolving model strings ---------------------------------------------------------

    def register(self, prefix: str, factory: ProviderFactory) -> None:
        """Serve "<prefix>:..." models (replacing any factory the prefix had)."""
        self._factories[prefix] = factory

    def route(self, model: str) -> Route:
        prefix, colon, rest = model.partition(":")
        if not colon or not rest:
            raise ProviderError("unavailable", f"model {model!r} is not <provider>:<name>")
        factory = self._factories.get(prefix)
        if factory is None:
            raise ProviderError("unavailable", f"unknown provider {prefix!r} in {model!r}")
        return factory(rest)

    def configured_providers(self) -> list[str]:
        """The providers model strings may name with these settings: "openai", "anthropic",
        "compat:<endpoint>" for each endpoint, "local", and any registered prefix."""
        settings = self._settings
        needs = {"openai": settings.openai_api_key, "anthropic": settings.anthropic_api_key}
        names: list[str] = []
        for prefix in self._factories:
            if prefix == "compat":
                names += [f"compat:{name}" for name in sorted(settings.compat_endpoints)]
            elif needs.get(prefix, True):
                names.append(prefix)
        return names

    def provider_for(self, model: str) -> tuple[Provider, str]:
        """The provider serving `model` and the model's name there."""
        route = self.route(model)
        return self._provider(route), route.model

    def _provider(self, route: Route) -> Provider:
        provider = self._providers.get(route.key)
        if provider is None:
            provider = self._providers[route.key] = route.build()
        return provider

    def import_providers(self) -> None:
        """Import the providers these settings configure, with their SDKs. Model strings
        resolve without them (an API process, `threadline keys`: ~1.5 s less to start); a
        process that calls models imports them at startup, not on its first call's event loop."""
        for provider in self.configured_providers():
            module = _PROVIDER_MODULES.get(provider.partition(":")[0])
            if module is not None:
                importlib.import_module(module)

    def _openai(self, name: str) -> Route:
        settings = self._settings
        key = _require(settings.openai_api_key, "openai", "THREADLINE_OPENAI_API_KEY")
        timeout = settings.llm_request_timeout_seconds

        if uses_responses_api(settings, f"openai:{name}"):

            def responses() -> Provider:
                from app.llm.openai_responses_provider import OpenAIResponsesProvider

                return OpenAIResponsesProvider(
                    key,
                    settings.openai_base_url,
                    timeout,
                    reasons=lambda model: can_reason(settings, f"openai:{model}"),
                )

            # Its own instance and breaker: the other API of the same account may be answering.
            return Route("openai:responses", name, responses)

        def build() -> Provider:
            from app.llm.openai_provider import OpenAIProvider

            return OpenAIProvider(key, settings.openai_base_url, timeout, send_cache_key=True)

        return Route("openai", name, build)

    def _anthropic(self, name: str) -> Route:
        settings = self._settings
        key = _require(settings.anthropic_api_key, "anthropic", "THREADLINE_ANTHROPIC_API_KEY")
        timeout = settings.llm_request_timeout_seconds

        def build() -> Provider:
            from app.llm.anthropic_provider import AnthropicProvider

            return AnthropicProvider(key, settings.anthropic_base_url, timeout)

        return Route("anthropic", name, build)

    def _compat(self, rest: str) -> Route:
        endpoint, name = compat_endpoint_of(self._settings, rest)
        config = self._settings.compat_endpoint(endpoint)
        assert config is not None
        # Local servers mostly ignore the key, but the SDK insists on one.
        api_key = self._settings.compat_api_key or "unused"
        timeout = self._settings.llm_request_timeout_seconds

        def build() -> Provider:
            from app.llm.openai_provider import OpenAIProvider

            return OpenAIProvider(
                api_key,
                config.url,
                timeout,
                legacy_max_tokens=True,
                output_limit=config.max_output_tokens,
                answer_in_room=True,
            )

        return Route(f"compat:{endpoint}", name or endpoint, build)

    def _local(self, name: str) -> Route:
        # One GGUF serves every local:* name; the provider loads it on first use.
        path = self._settings.local_model_path
        return Route("local", name, lambda: LocalProvider(path))

    # --- Streaming ------------------------------------------------------------------------

    async def stream(
        self,
        model: str,
        request: ModelRequest,
        fallback: str | None = None,
        *,
        restarts: bool = False,
    ) -> AsyncIterator[tuple[str, RoutedEvent]]:
        """(the model actually used, event) pairs; request.model is replaced by the route's.

        `restarts`: the caller can drop output it was shown (on `Restart`), so failures after
        output are retried and fall back like those before it. Raises the last ProviderError
        when no attempt of either model got to the end.
        """
        candidates = [model] if fallback in (None, model) else [model, fallback]
        failure: ProviderError | None = None
        restart: ProviderError | None = None  # why what the caller holds is to be dropped
        for candidate in candidates:
            assert candidate is not None
            produced = False
            try:
                attempts = self._with_retries(candidate, request, restarts, restart)
                async with contextlib.aclosing(attempts) as events:
                    async for event in events:
                        produced = True
                        yield candidate, event
                return
            except ProviderError as error:
                if produced and not restarts:
                    raise
                failure = error
                if produced:
                    restart = error
        assert failure is not None
        raise failure

    async def _with_retries(
        self,
        model: str,
        request: ModelRequest,
        restarts: bool = False,
        restart: ProviderError | None = None,
    ) -> AsyncGenerator[RoutedEvent, None]:
        """One model's attempts. `restart`: the caller holds output of a failed attempt, to be
        dropped (a `Restart` first) once an attempt here has output of its own."""
        route = self.route(model)
        provider = self._provider(route)
        routed = replace(request, model=route.model)
        if routed.reasoning is not None and not can_reason(self._settings, model):
            # A fallback model that cannot reason answers without (Anthropic would refuse it).
            routed = replace(routed, reasoning=None)
        retries = 0
        while True:
            self._check_breaker(route.key)
            produced = False
            span = tracing.start("model call", provider=route.key, model=route.model)
            try:
                async with contextlib.aclosing(self._guarded(provider.stream(routed))) as events:
                    async for event in events:
                        if restart is not None:
                            yield Restart(restart)
                            restart = None
                        if not produced:
                            produced = True
                            self._record_answer(route.key)
                        yield event
            except ProviderError as error:
                tracing.end(span, error)
                metrics.provider_call(route.key, catalog_model(route.key, route.model), error)
                if error.retryable:
                    self._record_failure(route.key)
                given_up = (produced and not restarts) or not error.retryable
                if given_up or retries >= self._settings.llm_max_retries:
                    log.warning("%s: %s (%s); given up", model, error, error.kind)
                    raise
                log.warning("%s: %s (%s); retrying", model, error, error.kind)
                if produced:
                    restart = error
                retries += 1
                metrics.provider_retry(route.key, catalog_model(route.key, route.model))
                await asyncio.sleep(self._retry_delay(retries))
                continue
            except BaseException as error:  # the caller stopped reading (a cancel), or a bug
                tracing.end(span, error)
                raise
            tracing.end(span)
            metrics.provider_call(route.key, catalog_model(route.key, route.model), None)
            return

    async def _guarded(
        self, events: AsyncIterator[StreamEvent]
    ) -> AsyncGenerator[StreamEvent, None]:
        """The events, failing with "timeout" when the next one takes too long (only the wait
        for it counts, not the time the caller holds each one)."""
        seconds = self._settings.llm_request_timeout_seconds
        watch = _StallWatch(seconds)
        try:
            while True:
                watch.waiting()
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError as error:
                    if watch.expired():
                        raise ProviderError("timeout", f"no response for {seconds:g}s") from error
                    raise
                finally:
                    watch.done()
                yield storable(event)
        finally:
            watch.close()
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()

    def _retry_delay(self, retry: int) -> float:
        delay = self._settings.llm_retry_base_seconds * 2.0 ** (retry - 1)
        # Jitter spreads out the callers that a shared outage failed at the same moment.
        return min(delay, MAX_RETRY_DELAY_SECONDS) * random.uniform(0.5, 1.0)

    # --- Circuit breaker ------------------------------------------------------------------

    def circuit_open(self, key: str) -> bool:
        """Whether the provider `key` (a Route.key, e.g. "openai" or "compat:vllm") is skipped."""
        breaker = self._breakers.get(key)
        return bool(
            breaker and breaker.open_until is not None and self._clock() < breaker.open_until
        )

    def _check_breaker(self, key: str) -> None:
        if self.circuit_open(key):
            raise ProviderError(
                "unavailable", f"{key}: circuit open after repeated failures, skipped for now"
            )

    def _record_answer(self, key: str) -> None:
        """A call to `key` began answering: the provider is up."""
        breaker = self._breakers.setdefault(key, _Breaker())
        if breaker.open_until is not None:  # the trial after the cooldown: closed again
            del self._breakers[key]
            return
        breaker.record(self._clock(), answered=True)

    def _record_failure(self, key: str) -> None:
        breaker = self._breakers.setdefault(key, _Breaker())
        now = self._clock()
        failures, answers = breaker.record(now, answered=False)
        # Past the cooldown one trial call goes through; failing, it reopens at once.
        reopen = breaker.open_until is not None
        if reopen or (failures >= self._settings.breaker_failures and failures > answers):
            breaker.open_until = now + self._settings.breaker_cooldown_seconds
            metrics.breaker_tripped(key)

    async def aclose(self) -> None:
        """Close the providers' HTTP clients."""
        providers, self._providers = list(self._providers.values()), {}
        for provider in providers:
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()


class _StallWatch:
    """Cancels the task waiting for a provider's next event once one wait lasts `seconds`,
    as asyncio.timeout around each wait would, without arming a timer per event (that cost
    as much as reading the chunk): its one timer moves only when it finds the wait it fired in
    began later than it was set for."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0  # the task's pending cancels before the wait (asyncio.timeout's)
        self._since: float | None = None  # when the current wait began; None: not waiting
        self._timer: asyncio.TimerHandle | None = None
        self._fired = False

    def waiting(self) -> None:
        """A wait begins (the caller awaits the next event right after)."""
        self._task = task = asyncio.current_task()
        assert task is not None
        self._cancelling = task.cancelling()
        self._since = since = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(since + self._seconds, self._check)

    def done(self) -> None:
        """The wait is over. If the watch fired but its cancel was not what ended the wait, the
        cancel is taken back off the count, as asyncio.timeout does."""
        self._since = None
        if self._fired:
            self._fired = False
            assert self._task is not None
            self._task.uncancel()

    def expired(self) -> bool:
        """Whether the CancelledError the wait ended with is the watch's own (then taken back)
        rather than a cancel from elsewhere."""
        if not self._fired:
            return False
        self._fired = False
        assert self._task is not None
        return self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self._since is None:
            return  # between waits: armed again when the next one begins
        due = self._since + self._seconds
        if due - self._loop.time() > _CLOCK_RESOLUTION:
            self._timer = self._loop.call_at(due, self._check)  # a later wait than it was set for
            return
        assert self._task is not None
        self._fired = True
        self._task.cancel()


# asyncio runs a timer up to this early (the loop's own clock_resolution).
_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution


def tool_choice_problem(
    model: str, choice: tool_choice.ToolChoice, tool_names: Collection[str]
) -> str | None:
    """Why an ask of `model` ("provider:name") offering these tools cannot have `choice`, or
    None."""
    refused = tool_choice.problem(choice, tool_names)
    if refused is None and model.partition(":")[0] == "local":
        refused = local_provider.tool_choice_problem(choice)
    return refused


def compat_endpoint_of(settings: Settings, rest: str) -> tuple[str, str]:
    """(endpoint, model name on it, "" for the server's own) of a compat model string's tail."""
    endpoints = settings.compat_endpoints
    endpoint, _, name = rest.partition("/")
    if rest in endpoints:  # an endpoint configured under a name with a slash in it
        endpoint, name = rest, ""
    if endpoint not in endpoints:
        known = ", ".join(sorted(endpoints)) or "none"
        raise ProviderError(
            "unavailable", f"unknown compat endpoint {endpoint!r} (configured: {known})"
        )
    return endpoint, name


def _require(value: str | None, provider: str, variable: str) -> str:
    if not value:
        raise ProviderError("unavailable", f"{provider}:* models need {variable} to be set")
    return value
