"""Token counters for models: tiktoken's exact encodings, estimates for the rest."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import tiktoken

from app.core.tokens import (
    STORED_ENCODING,
    STORED_IMAGES,
    HeuristicCounter,
    ImageRule,
    TokenCounter,
    image_rule_for,
)
from app.llm.vocab import VOCABS, default_cache_dir, install_vocab

PROVIDERS = frozenset({"openai", "anthropic", "compat", "local"})
ESTIMATORS = frozenset({"exact", "heuristic"})


@dataclass(frozen=True)
class TiktokenCounter:
    encoding: tiktoken.Encoding

    @property
    def name(self) -> str:
        return self.encoding.name

    def count(self, text: str) -> int:
        # User content may contain "<|endoftext|>" and the like; it is text, not a control token.
        return len(self.encoding.encode(text, disallowed_special=()))


@functools.cache
def encoding_counter(name: str) -> TiktokenCounter:
    """A counter for one of the encodings in VOCABS; loads its vocabulary on first use."""
    if name not in VOCABS:
        raise ValueError(f"no offline vocabulary for encoding {name!r}")
    install_vocab(default_cache_dir())
    return TiktokenCounter(tiktoken.get_encoding(name))


def stored_counter() -> TiktokenCounter:
    """The counter for entries' stored token_count."""
    return encoding_counter(STORED_ENCODING)


@dataclass(frozen=True)
class ModelCounter:
    """A text counter plus the image rule of the model's family (app.core.tokens)."""

    text: TokenCounter
    images: ImageRule

    @property
    def name(self) -> str:
        return self.text.name

    def count(self, text: str) -> int:
        return self.text.count(text)


@dataclass(frozen=True)
class ModelCounting:
    counter: TokenCounter
    exact: bool  # False: an estimate, to be given a safety margin


def counting_for(model: str, estimator: str = "exact") -> ModelCounting:
    """How to count tokens for a "provider:name" model.

    OpenAI models get the encoding tiktoken assigns them. Other providers' tokenizers are not
    public, so o200k_base stands in as an estimate.
    """
    provider, sep, name = model.partition(":")
    if not sep or not name or provider not in PROVIDERS:
        raise ValueError(f"model must be provider:name with provider in {sorted(PROVIDERS)}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {sorted(ESTIMATORS)}, not {estimator!r}")
    counting = _text_counting(provider, name, estimator)
    images = image_rule_for(model)
    if images == STORED_IMAGES:
        return counting
    return ModelCounting(ModelCounter(counting.counter, images), counting.exact)


def _text_counting(provider: str, name: str, estimator: str) -> ModelCounting:
    if estimator == "heuristic":
        return ModelCounting(HeuristicCounter(), exact=False)
    if provider == "openai":
        try:
            encoding = tiktoken.encoding_name_for_model(name)
        except KeyError:
            # Models newer than the installed tiktoken: current OpenAI models use o200k_base.
            encoding = STORED_ENCODING
        if encoding in VOCABS:
            return ModelCounting(encoding_counter(encoding), exact=True)
        # Legacy encodings (p50k_base, r50k_base, gpt2) are not bundled, so only estimated.
    return ModelCounting(stored_counter(), exact=False)
