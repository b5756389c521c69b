"""What we know about models: context windows, from genai-prices with our own corrections."""

from __future__ import annotations

from decimal import Decimal
from functools import cache

from app.core.policy import DEFAULT_CONTEXT_WINDOW

# genai-prices gives the total context, which for some models is not what a prompt may use:
# the GPT-5 family takes at most 272k input tokens of its 400k; gpt-4.1's window is 1,047,576.
# Longest matching prefix wins.
WINDOW_OVERRIDES: dict[str, int] = {
    "openai:gpt-5": 272_000,
    "openai:gpt-4.1": 1_047_576,
    "local:gemma-3-270m": 8_192,  # the n_ctx the local provider loads it with
}


@cache
def context_window(model: str) -> int:
    """Tokens a prompt plus its answer may use with `model` ("provider:name")."""
    matches = [p for p in WINDOW_OVERRIDES if model.startswith(p)]
    if matches:
        return WINDOW_OVERRIDES[max(matches, key=len)]
    provider, _, name = model.partition(":")
    if provider in ("openai", "anthropic"):
        from genai_prices import data_snapshot

        try:
            _, info = data_snapshot.get_snapshot().find_provider_model(name, None, provider, None)
        except LookupError:
            return DEFAULT_CONTEXT_WINDOW
        if info.context_window:
            return int(info.context_window)
    return DEFAULT_CONTEXT_WINDOW


def cost_usd(
    model: str, input_tokens: int, output_tokens: int, cached_tokens: int
) -> Decimal | None:
    """What a call cost, where genai-prices knows the model's price; None elsewhere."""
    provider, _, name = model.partition(":")
    if provider not in ("openai", "anthropic"):
        return None
    from genai_prices import Usage, calc_price

    # genai-prices counts cache reads inside input_tokens, as both providers report them.
    usage = Usage(
        input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cached_tokens
    )
    try:
        return Decimal(calc_price(usage, model_ref=name, provider_id=provider).total_price)
    except LookupError:
        return None
