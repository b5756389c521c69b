"""What we know about models: context windows (genai-prices with our own corrections, the local
GGUF's metadata, what a compat server says or is configured with), prices, which can reason,
and the names metrics label them by."""

from __future__ import annotations

import asyncio
import logging
import time
from decimal import Decimal
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

import httpx

from app.config import DEFAULT_LOCAL_MODEL, Settings
from app.core.policy import DEFAULT_CONTEXT_WINDOW

if TYPE_CHECKING:
    from genai_prices.types import ModelInfo

log = logging.getLogger(__name__)

# genai-prices gives the total context, which for some models is not what a prompt may use:
# the GPT-5 family takes at most 272k input tokens of its 400k; gpt-4.1's window is 1,047,576.
# Longest matching prefix wins.
WINDOW_OVERRIDES: dict[str, int] = {
    "openai:gpt-5": 272_000,
    "openai:gpt-4.1": 1_047_576,
}
# A compat server that neither says its window nor has one configured: small enough for the
# usual local servers, so history is windowed rather than refused by the server.
COMPAT_DEFAULT_WINDOW = 8192
LOCAL_FALLBACK_WINDOW = 8192  # a local model whose GGUF cannot be read (not installed)
# Models that can reason (think before they answer), by the longest matching prefix; a model
# none matches cannot. Anthropic: extended thinking (Claude 3.7 Sonnet and the Claude 4
# family); OpenAI: the o-series and GPT-5 (not its chat model).
REASONING: dict[str, bool] = {
    "anthropic:claude-3-7-sonnet": True,
    "anthropic:claude-sonnet-4": True,
    "anthropic:claude-opus-4": True,
    "anthropic:claude-haiku-4-5": True,
    "openai:o1": True,
    "openai:o3": True,
    "openai:o4-mini": True,
    "openai:gpt-5": True,
    "openai:gpt-5-chat": False,
}
# Anthropic models that think between tool calls too (interleaved thinking: the Claude 4
# family, with the beta header INTERLEAVED_THINKING_BETA); others think once, before a turn.
INTERLEAVED_THINKING = (
    "anthropic:claude-sonnet-4",
    "anthropic:claude-opus-4",
    "anthropic:claude-haiku-4",
)
INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
# Hosted models' inputs besides text, by the longest matching prefix: what each reads of
# images and PDFs. A hosted model none matches is taken to read both (the current families
# do); these name the ones known not to. OpenAI reads PDFs where it reads images (a page is
# text and an image); Anthropic's Claude 3 (not 3.5 and later) reads no PDF. Compat and local
# models read no PDF (text documents reach every model, as text).
READS_IMAGES: dict[str, bool] = {
    "openai:gpt-3.5": False,
    "openai:gpt-4": False,
    "openai:gpt-4-turbo": True,
    "openai:gpt-4-vision": True,
    "openai:gpt-4o": True,
    "openai:gpt-4.1": True,
    "openai:gpt-4.5": True,
    "openai:o1-mini": False,
    "openai:o1-preview": False,
    "openai:o3-mini": False,
}
READS_PDFS: dict[str, bool] = {
    **READS_IMAGES,
    "anthropic:claude-3-": False,
    "anthropic:claude-3-5": True,
    "anthropic:claude-3-7": True,
}
DISCOVERY_TIMEOUT_SECONDS = 3.0
DISCOVERY_RETRY_SECONDS = 60.0  # a server that did not answer is asked again after this
# The metrics' name of a model the catalog does not know: clients may send any model string,
# and each label value would be a time series of its own.
OTHER_MODEL = "other"
HOSTED_PROVIDERS = ("openai", "anthropic")

# Discovered windows by base URL: (window or None, monotonic time of the answer).
_DISCOVERED: dict[str, tuple[int | None, float]] = {}
_DISCOVERING: dict[str, asyncio.Lock] = {}


async def context_window_for(settings: Settings, model: str) -> int:
    """Tokens a prompt plus its answer may use with `model` ("provider:name") as configured."""
    provider, _, rest = model.partition(":")
    if provider == "local":
        from app.llm.base import ProviderError
        from app.llm.local_provider import local_context_window

        try:
            return await asyncio.to_thread(local_context_window, settings.local_model_path)
        except ProviderError:  # no model to read: the ask fails as unavailable when it runs
            return LOCAL_FALLBACK_WINDOW
    if provider == "compat":
        return await _compat_window(settings, rest)
    return context_window(model)


@cache
def context_window(model: str) -> int:
    """The window of a hosted model ("openai:..." or "anthropic:..."), from what is published."""
    matches = [p for p in WINDOW_OVERRIDES if model.startswith(p)]
    if matches:
        return WINDOW_OVERRIDES[max(matches, key=len)]
    provider, _, name = model.partition(":")
    if provider in HOSTED_PROVIDERS:
        info = _hosted_model(provider, name)
        if info is not None and info.context_window:
            return int(info.context_window)
    return DEFAULT_CONTEXT_WINDOW


def _hosted_model(provider: str, name: str) -> ModelInfo | None:
    """genai-prices' entry for a hosted model (dated and aliased names find theirs), or None."""
    from genai_prices import data_snapshot

    try:
        _, info = data_snapshot.get_snapshot().find_provider_model(name, None, provider, None)
    except LookupError:
        return None
    return info


# Bounded: the names come from clients.
@lru_cache(maxsize=1024)
def catalog_model(provider: str, name: str) -> str:
    """The name metrics label the model `name` of `provider` (a route's: "openai", "compat:vllm")
    by: a hosted model's id in genai-prices (gpt-4o-mini-2024-07-18 is gpt-4o-mini), the local
    model, a compat endpoint's own model (named by its endpoint); OTHER_MODEL for any other."""
    family = provider.partition(":")[0]  # "openai:responses" is OpenAI's other API
    if family in HOSTED_PROVIDERS:
        info = _hosted_model(family, name)
        return OTHER_MODEL if info is None else str(info.id)
    if provider == "local":
        return name if f"local:{name}" == DEFAULT_LOCAL_MODEL else OTHER_MODEL
    if provider.startswith("compat:"):
        return name if name == provider.removeprefix("compat:") else OTHER_MODEL
    return OTHER_MODEL


async def _compat_window(settings: Settings, rest: str) -> int:
    from app.llm.base import ProviderError
    from app.llm.router import compat_endpoint_of

    try:
        endpoint, name = compat_endpoint_of(settings, rest)
    except ProviderError:
        return COMPAT_DEFAULT_WINDOW  # the ask fails as unavailable when it gets there
    config = settings.compat_endpoint(endpoint)
    assert config is not None
    if config.context_window is not None:
        return config.context_window
    discovered = await discovered_window(config.url, name or endpoint)
    return discovered if discovered is not None else COMPAT_DEFAULT_WINDOW


async def discovered_window(base_url: str, model: str) -> int | None:
    """The context window an OpenAI-compatible server says it serves, None if it does not.

    Read from /models (vLLM's max_model_len; llama.cpp's meta.n_ctx or n_ctx_train) or
    llama.cpp's /props (the n_ctx it runs with). Answers are kept; silence is retried later.
    """
    known = _DISCOVERED.get(base_url)
    if known is not None and (known[0] is not None or _fresh(known[1])):
        return known[0]
    lock = _DISCOVERING.setdefault(base_url, asyncio.Lock())
    async with lock:
        known = _DISCOVERED.get(base_url)
        if known is not None and (known[0] is not None or _fresh(known[1])):
            return known[0]
        window = await _ask_window(base_url, model)
        if window is None:
            log.warning(
                "%s does not say its context window: assuming %d tokens (set context_window "
                "in THREADLINE_COMPAT_ENDPOINTS)",
                base_url,
                COMPAT_DEFAULT_WINDOW,
            )
        _DISCOVERED[base_url] = (window, time.monotonic())
        return window


def _fresh(at: float) -> bool:
    return time.monotonic() - at < DISCOVERY_RETRY_SECONDS


async def _ask_window(base_url: str, model: str) -> int | None:
    base = base_url.rstrip("/")
    root = base.removesuffix("/v1")
    async with httpx.AsyncClient(timeout=DISCOVERY_TIMEOUT_SECONDS) as client:
        props = await _get_json(client, f"{root}/props")
        if isinstance(props, dict):
            settings = props.get("default_generation_settings")
            for source in (settings, props):
                window = _positive(source.get("n_ctx")) if isinstance(source, dict) else None
                if window is not None:
                    return window
        models = await _get_json(client, f"{base}/models")
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list):
        return None
    listed = [e for e in entries if isinstance(e, dict)]
    chosen = next((e for e in listed if e.get("id") == model), listed[0] if listed else None)
    if chosen is None:
        return None
    said = chosen.get("meta")
    meta: dict[str, Any] = said if isinstance(said, dict) else {}
    for value in (chosen.get("max_model_len"), meta.get("n_ctx"), meta.get("n_ctx_train")):
        window = _positive(value)
        if window is not None:
            return window
    return None


async def _get_json(client: httpx.AsyncClient, url: str) -> Any:
    try:
        response = await client.get(url)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):  # a server that cannot say
        return None


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def cost_usd(
    model: str,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int,
    cache_write_tokens: int = 0,
) -> Decimal | None:
    """What a call cost, where genai-prices knows the model's price; None elsewhere.

    Cache reads and writes are priced at the model's own cache prices (Anthropic: reads a
    tenth of the input price, writes a quarter above it; OpenAI: reads half of it)."""
    provider, _, name = model.partition(":")
    if provider not in ("openai", "anthropic"):
        return None
    from genai_prices import Usage, calc_price

    # genai-prices counts cache reads and writes inside input_tokens, as we report them.
    usage = Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cached_tokens,
        cache_write_tokens=cache_write_tokens,
    )
    try:
        return Decimal(calc_price(usage, model_ref=name, provider_id=provider).total_price)
    except LookupError:
        return None


def can_reason(settings: Settings, model: str) -> bool:
    """Whether `model` ("provider:name") can reason: a hosted model as published (REASONING),
    a compat endpoint as configured (its `reasoning`); a local model cannot."""
    provider, _, rest = model.partition(":")
    if provider == "compat":
        from app.llm.base import ProviderError
        from app.llm.router import compat_endpoint_of

        try:
            name, _ = compat_endpoint_of(settings, rest)
        except ProviderError:  # not configured: the ask fails as unavailable anyway
            return False
        endpoint = settings.compat_endpoint(name)
        return endpoint is not None and endpoint.reasoning
    matches = [p for p in REASONING if model.startswith(p)]
    return bool(matches) and REASONING[max(matches, key=len)]


def uses_responses_api(settings: Settings, model: str) -> bool:
    """Whether an openai:* model is called through the Responses API rather than Chat
    Completions: as THREADLINE_OPENAI_API says, and by default ("auto") the models that can
    reason (REASONING), whose reasoning only the Responses API hands over and takes back."""
    if model.partition(":")[0] != "openai":
        return False
    if settings.openai_api != "auto":
        return settings.openai_api == "responses"
    return can_reason(settings, model)


def reasoning_sent_back(settings: Settings, model: str) -> frozenset[str]:
    """The reasoning part types that go back to `model` in later requests of a tool loop:
    Anthropic's thinking (the API requires it, signed), the Responses API's reasoning items
    (encrypted, as it documents for store: false); other APIs take none back."""
    from app.core.content import ANTHROPIC_REASONING, OPENAI_REASONING

    if model.partition(":")[0] == "anthropic":
        return ANTHROPIC_REASONING
    if uses_responses_api(settings, model):
        return OPENAI_REASONING
    return frozenset()


def interleaves_thinking(model: str) -> bool:
    """Whether `model` ("provider:name") can think between its tool calls (Anthropic's
    interleaved thinking), not only before its turn."""
    return model.startswith(INTERLEAVED_THINKING)


def reads_images(model: str) -> bool:
    """Whether `model` ("provider:name") reads images: hosted models as READS_IMAGES says;
    compat and local models are sent them as before (a compat server says if it cannot)."""
    return _hosted_reads(READS_IMAGES, model)


def reads_pdfs(model: str) -> bool:
    """Whether `model` reads PDF documents: hosted models as READS_PDFS says; compat and local
    models do not (their servers take no file parts)."""
    return model.partition(":")[0] in HOSTED_PROVIDERS and _hosted_reads(READS_PDFS, model)


def _hosted_reads(table: dict[str, bool], model: str) -> bool:
    matches = [p for p in table if model.startswith(p)]
    return not matches or table[max(matches, key=len)]


def offered_models(settings: Settings) -> list[str]:
    """The models to offer someone choosing one: the default model first, then one for each
    configured provider (its usual model; a compat endpoint by its name). Any other name a
    configured provider serves works too: this is a choice to start from, not a limit."""
    from app.config import DEFAULT_ANTHROPIC_MODEL, DEFAULT_LOCAL_MODEL, DEFAULT_OPENAI_MODEL
    from app.llm.router import Router

    usual = {
        "openai": DEFAULT_OPENAI_MODEL,
        "anthropic": DEFAULT_ANTHROPIC_MODEL,
        "local": DEFAULT_LOCAL_MODEL,
    }
    models = [settings.default_model]
    for provider in Router(settings).configured_providers():
        model = usual.get(provider, provider)
        if model not in models:
            models.append(model)
    return models


# The provider labels of model strings besides compat:<endpoint> (the router's own providers).
PROVIDER_PREFIXES = (*HOSTED_PROVIDERS, "local")


def model_labels(model: str) -> tuple[str, str]:
    """The provider and model labels of a model string: ("openai", "gpt-4o-mini") of
    "openai:gpt-4o-mini-2024-07-18". Compat models keep their endpoint in the provider
    ("compat:vllm"); a prefix no provider serves is "other"; the model is the catalog's name
    of it, or "other" (catalog_model): clients choose these strings, labels must stay few."""
    prefix, _, rest = model.partition(":")
    if prefix == "compat":
        endpoint, _, name = rest.partition("/")
        provider, name = f"compat:{endpoint}", name or endpoint
    elif prefix in PROVIDER_PREFIXES:
        provider, name = prefix, rest
    else:
        return OTHER_MODEL, OTHER_MODEL
    return provider, catalog_model(provider, name)
