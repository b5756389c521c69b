"""What model calls cost in tokens: one call's usage as the provider reported it (or as counted),
summed over a run's calls."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UsageReport:
    input_tokens: int  # the whole prompt, cache reads and writes included
    output_tokens: int
    cached_tokens: int = 0  # of the input, read from the provider's prompt cache
    # Counted by us with a tokenizer because the server reported none: an estimate.
    estimated: bool = False
    # Of the input, written to the provider's prompt cache (Anthropic bills these above the
    # input price; OpenAI caches without a charge and reports none).
    cache_write_tokens: int = 0
    # Of the output, tokens the model reasoned with, where the provider says (OpenAI's
    # reasoning models; Anthropic counts thinking in the output without saying how much).
    reasoning_tokens: int = 0

    def plus(self, other: UsageReport | None) -> UsageReport:
        """Usage summed over several model calls (estimated if any of them was)."""
        if other is None:
            return self
        return UsageReport(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_tokens + other.cached_tokens,
            self.estimated or other.estimated,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )
