"""The heuristic token estimate against real BPE counts (tiktoken o200k_base and cl100k_base):
never under on generated text of each script class, at most ~1.3x over on fixed samples."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.tokens import HeuristicCounter
from app.llm.tokenizers import encoding_counter
from tests.core.token_samples import CJK, CODE, EMOJI, PROSE, SAMPLES

ESTIMATE = HeuristicCounter()
# "~1.3x": the CJK sample sits at 1.31 (cl100k spends ~1.1 tokens a character, o200k ~0.7).
MAX_RATIO = 1.32


def real_tokens(text: str) -> int:
    """The larger of two real encodings: a stand-in for vendors whose tokenizer is not public."""
    return max(encoding_counter(e).count(text) for e in ("o200k_base", "cl100k_base"))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_estimate_is_at_most_about_1_3x_over_on_samples(name: str) -> None:
    text = SAMPLES[name]
    ratio = ESTIMATE.count(text) / real_tokens(text)
    assert 1.0 <= ratio <= MAX_RATIO, f"{name}: {ratio:.2f}"


def _chunks(text: str) -> list[str]:
    """CJK has no spaces: runs of 1-4 characters keep local structure, as real text has."""
    return [text[i : i + n] for n in (1, 2, 3, 4) for i in range(0, len(text), n)]


# Generated text of each class: real units of the samples in random order and number.
PROSE_UNITS = re.findall(r"\s*\S+", PROSE)
CODE_UNITS = CODE.splitlines(keepends=True) + re.findall(r"\s*\S+", CODE)
CJK_UNITS = [u for line in CJK.split("\n") for u in _chunks(line)]
EMOJI_UNITS = re.findall(r".[\u200d\ufe0f\U0001F3FB-\U0001F3FF]*", EMOJI)
GENERATED = {
    "prose": st.lists(st.sampled_from(PROSE_UNITS), min_size=1, max_size=60, unique=True),
    "code": st.lists(st.sampled_from(CODE_UNITS), min_size=1, max_size=30, unique=True),
    "cjk": st.lists(st.sampled_from(CJK_UNITS), min_size=1, max_size=60, unique=True),
    "emoji": st.lists(st.sampled_from(EMOJI_UNITS), min_size=1, max_size=60, unique=True),
}


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_estimate_is_never_under_on_generated_text(name: str) -> None:
    @given(GENERATED[name])
    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    def never_under(units: list[str]) -> None:
        text = "".join(units)
        assert ESTIMATE.count(text) >= real_tokens(text), text

    never_under()


def test_mixed_text_and_empty() -> None:
    mixed = PROSE[:200] + CJK[:50] + EMOJI[:20] + CODE[:200]
    assert ESTIMATE.count(mixed) >= real_tokens(mixed)
    assert ESTIMATE.count("") == 0
