"""The chat app's engine: the one thread that owns MLX, and a scripted stand-in for tests.

Everything the UI needs from a model goes through these calls, all safe to make from any
thread (the app makes them from Textual workers):

    future = engine.start_load(progress)              # Future[EngineInfo]; progress(stage, text), stage in STAGES
    info = engine.load(progress)                      # the same, waiting for it
    for chunk in engine.reply(messages, settings, should_stop, on_status):
        chunk.text, chunk.stats, chunk.finish_reason  # a text delta and a stats snapshot per step
                                                      # on_status(text): a line while a long prompt is read
    engine.new_chat()                                 # forget the conversation's KV cache
    engine.close()

`EngineThread` runs every job, in order, on a single long-lived daemon thread fed by a queue
(as mlx-lm's server does): the real `Engine` imports and calls `redrafter_mlx` only from
there, so MLX never sees two threads. `reply()` hands the library's events across through a
second queue; its `should_stop` is the library's own, so a cancelled reply leaves the
`PromptCache` consistent. Stats cross as frozen `Stats` snapshots, never as the library's
`RunStats`, which the engine thread keeps updating in place.

`FakeEngine` runs on the same thread machinery with scripted replies and virtual timings:
deterministic stats, no MLX, no model. It can hold a reply mid-way until it is cancelled.

This module imports neither Textual nor MLX; errors leave it as `EngineError` with a
one-line message the UI can show as is.
"""

import math
import queue
import re
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Iterator, List, Optional, Tuple

STAGES = ("fetch", "load", "warm-up")
COPY_GROWTH = 4  # redrafter_mlx.lookup.MAX_GROWTH: a lookup copy taken whole doubles, up to this many times N
NO_DRAFTER = "speculation drafts from the conversation alone where that pays, else decodes plainly"
Progress = Callable[[str, str], None]  # (stage, text)
Messages = List[dict]  # [{"role": "user" | "assistant", "content": str}, ...]


SEED_MAX = 2**64 - 1  # redrafter_mlx.sampling.SEED_MAX: the seeds --seed and /seed take are 0 to this


def compact(value: int) -> str:
    """redrafter_mlx.errors.compact, for an int a message echoes: more than 20 digits in 3 significant ones
    (10**70: 1e+70, not its 71 digits)."""
    if abs(value) < 10**20:
        return str(value)
    log = math.log10(abs(value))
    exponent = math.floor(log)
    mantissa = round(10 ** (log - exponent), 2)
    if mantissa >= 10:  # 10**70's log may fall just short of 70
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{'-' if value < 0 else ''}{mantissa:g}e+{exponent}"


def compact_digits(negative: bool, digits: str) -> str:
    """redrafter_mlx.errors.compact_digits: `compact` of the int its sign and decimal `digits` (no leading zeros)
    write, from the text (one past Python's 4300 int digits cannot be made an int)."""
    if len(digits) <= 20:
        return ("-" if negative else "") + digits
    log = math.log10(int(digits[:17])) + len(digits) - 17
    exponent = math.floor(log)
    mantissa = round(10 ** (log - exponent), 2)
    if mantissa >= 10:
        mantissa, exponent = mantissa / 10, exponent + 1
    return f"{'-' if negative else ''}{mantissa:g}e+{exponent}"


class EngineError(Exception):
    """A readable, one-line reason a load or a reply failed; `details`: the whole text that line was cut from
    ("" when the line says it all), which the chat's /details shows."""

    def __init__(self, message: str = "", details: str = ""):
        super().__init__(message)
        self.details = details


@dataclass
class Settings:
    """How to generate; the app keeps one and passes a copy with each reply."""

    speculative: bool = True
    adaptive: bool = True  # the controller sizes each step's draft (and parks); False: the fixed beam below
    beam_width: int = 4
    beam_length: int = 4
    beam_tuned: bool = True  # adopt the model's tuned beam shape (EngineInfo.beam_shape) when it loads ...
    width_given: bool = False  # ... the part not given (-W or -L alone): the tuned length or width, as the
    length_given: bool = False  # library's tuning.drafting takes it; neither given: the whole shape and its tree
    lookup: Optional[int] = None  # context-lookup beam length (None: the library default, 0: off)
    tree: Optional[int] = None  # dynamic draft tree node budget (None: the library default, 0: W x L beams)
    tree_min_prob: Optional[float] = None  # the tree's path-probability floor (None: the library default)
    graph: Optional[int] = None  # graph drafting (GSD) with this k-gram length (None: a tree)
    context_graph: bool = True  # with graph: graft the context's continuations of drafted nodes too
    temperature: float = 0.0
    top_p: float = 1.0
    seed: Optional[int] = None  # sampling's seed for every reply (None: a fresh one for each)
    max_tokens: int = 256
    system: Optional[str] = None


@dataclass(frozen=True)
class Stats:
    """A snapshot of one reply's figures so far (see redrafter_mlx.stats.RunStats)."""

    mode: str = "ar"  # "ar" (plain decoding), "redrafter" (fixed drafting) or "auto" (the adaptive controller)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt's tokens, those the KV cache held from the turns before (not read again)
    new_tokens: int = 0
    steps: int = 0
    tokens_per_second: float = 0.0  # decode steps only, prefill excluded
    tokens_per_step: float = 0.0  # mean
    last_step_tokens: int = 0  # tokens of the last step, an end token it found included (as tokens_per_step counts)
    acceptance: float = 0.0  # accepted draft tokens / draft positions tried
    accepted_tokens: int = 0
    accepted_lengths: Tuple[int, ...] = ()  # tokens emitted per step
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    peak_memory_mb: float = 0.0
    beam_width: int = 0
    beam_length: int = 0
    tree: int = 0  # dynamic draft tree node budget (0: W x L beams)
    parked_share: float = 0.0  # adaptive: share of steps decoded plainly
    packed_per_step: float = 0.0  # tokens verified per step
    controller: Optional[Dict[str, float]] = None  # adaptive: the cost model's figures (control.Controller.summary)
    seed: Optional[int] = None  # sampling's seed for this reply (the given one, or the fresh one drawn); None: greedy


@dataclass(frozen=True)
class Chunk:
    text: str  # text delta since the previous chunk
    stats: Stats
    finish_reason: Optional[str] = None  # on the last chunk: "eos" | "length" | "context" | "cancelled"


@dataclass
class EngineInfo:
    """What was loaded, for the stats panel and the notices."""

    model: str
    weight_format: str  # the format weights run in, e.g. "float32"
    device: str
    context_length: int
    drafter: Optional[str] = None  # where the drafter came from; None: plain decoding only
    stored_format: Optional[str] = None  # the file's own quantization, when it differs
    load_seconds: float = 0.0
    plain_tokens_per_second: Optional[float] = None  # measured while warming up
    notices: List[str] = field(default_factory=list)
    beam_shape: Optional[Tuple[int, int]] = None  # (W, L) tuned for this device (redrafter-bench --tune)
    tree: Optional[int] = None  # dynamic-tree node budget tuned with beam_shape (0: beams)


class EngineThread:
    """One daemon thread that runs every job in submission order."""

    _DONE = object()

    def __init__(self, name: str = "engine"):
        self._jobs: "queue.SimpleQueue[Optional[Callable[[], None]]]" = queue.SimpleQueue()
        self.closing = threading.Event()  # set by close(): long jobs stop at their next stage
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        while (job := self._jobs.get()) is not None:
            job()
        self._finish()

    def _finish(self):
        """Runs on the thread as it ends (after close())."""

    def submit(self, fn, *args) -> Future:
        """Queue fn(*args) on the engine thread; returns its Future."""
        future: Future = Future()

        def job():
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:  # handed to the caller, who re-raises it
                    future.set_exception(e)

        self._jobs.put(job)
        return future

    def call(self, fn, *args):
        """Run fn(*args) on the engine thread and wait for its result."""
        return self.submit(fn, *args).result()

    def iterate(self, gen_fn, *args) -> Iterator:
        """Run the generator gen_fn(*args) on the engine thread, yielding its items here.

        If the caller stops iterating, the generator is closed after its next item (its
        `finally` blocks run on the engine thread)."""
        items: queue.SimpleQueue = queue.SimpleQueue()
        abandoned = threading.Event()

        def job():
            gen = gen_fn(*args)
            try:
                for item in gen:
                    items.put((True, item))
                    if abandoned.is_set():
                        break
            except BaseException as e:
                items.put((False, e))
            finally:
                gen.close()
                items.put((True, self._DONE))

        self._jobs.put(job)
        try:
            while True:
                ok, item = items.get()
                if not ok:
                    raise item
                if item is self._DONE:
                    return
                yield item
        finally:
            abandoned.set()

    def close(self):
        self.closing.set()
        self._jobs.put(None)

    def wait(self, timeout: float) -> bool:
        """After close(): wait up to `timeout` seconds for the job in progress (a cancelled reply
        ends within a step) and the thread to end. True if it has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


# ---- the real engine ------------------------------------------------------------------------


def _describe_quantization(quant) -> Optional[str]:
    if not quant or "bits" not in quant:
        return None
    return f"{quant['bits']}-bit g{quant.get('group_size', '?')}"


def _readable(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return text or type(e).__name__


def failure(e: BaseException, named: bool = True) -> EngineError:
    """`e` as an EngineError: its first line, after its type's name when `named` (not a user error), and its
    whole text as the details where that line leaves some out (only the first line was kept: a multi-line
    error lost the rest for good)."""
    line, whole = _readable(e), str(e).strip()
    name = f"{type(e).__name__}: " if named else ""
    return EngineError(name + line, name + whole if whole and whole != line else "")


def _readable_errors(fn):
    """fn, raising EngineError with a one-line message for whatever it raises."""

    def wrapped(*args):
        try:
            return fn(*args)
        except EngineError:
            raise
        except Exception as e:  # not a user error: name it
            raise failure(e) from e

    return wrapped


class Engine(EngineThread):
    """redrafter_mlx behind the engine thread: load, warm up, then stream chat replies.

    model: registry name, local path or hub id (None: the registry default).
    drafter: a drafter folder; without one, the drafter found beside the model is used.
    use_drafter: False leaves any drafter out (speculation then drafts from the context alone).
    If the drafter is missing or does not load, replies draft from the context alone where that
    pays, else decode plainly, and `EngineInfo.notices` says why."""

    def __init__(self, model: Optional[str] = None, drafter: Optional[str] = None, warm_up: bool = True,
                 use_drafter: bool = True):
        super().__init__(name="mlx-engine")
        self.model_name = model
        self.drafter_path = drafter
        self.warm_up = warm_up
        self.use_drafter = use_drafter
        self._m = None  # LoadedModel, engine thread only
        self._cache = None  # PromptCache of the chat, engine thread only

    @property
    def label(self) -> str:
        return self.model_name or "the default model"

    def start_load(self, progress: Progress) -> Future:
        return self.submit(_readable_errors(self._load), progress)

    def load(self, progress: Progress) -> EngineInfo:
        return self.start_load(progress).result()

    def reply(self, messages: Messages, settings: Settings, should_stop: Callable[[], bool],
              on_status: Optional[Callable[[str], None]] = None) -> Iterator[Chunk]:
        if self._m is None:
            raise EngineError("no model loaded")
        try:
            yield from self.iterate(self._reply, list(messages), replace(settings), should_stop, on_status)
        except EngineError:
            raise
        except Exception as e:  # not a user error: name it
            raise failure(e) from e

    def new_chat(self):
        self.submit(self._new_chat)

    def _finish(self):
        # MLX's streams of this thread must be destroyed by the thread itself: left to the
        # interpreter's exit, they aborted a script that had run a model on a thread in 2 of 16
        # runs here (7 of 12 with MLX's own BLAS: "terminate called without an active
        # exception"), and the chat on quitting; mx.clear_streams is MLX's advice
        # (ml-explore/mlx#3126, #4110).
        if "mlx.core" in sys.modules:
            sys.modules["mlx.core"].clear_streams()

    def _new_chat(self):
        if self._cache is not None:
            self._cache.reset()

    # ---- engine thread only ------------------------------------------------------------

    def _load(self, progress: Progress) -> EngineInfo:
        t0 = time.perf_counter()
        progress("fetch", "starting MLX")
        from redrafter_mlx import PromptCache, RedrafterError, generate, load
        from redrafter_mlx.loader import attach_drafter, find_drafter
        from redrafter_mlx.registry import default_model_name

        progress("fetch", f"finding {self.model_name or default_model_name() + ' (the default)'}")

        stage = ["fetch"]

        def on_progress(text: str):
            if text.startswith("loading"):
                stage[0] = "drafter" if text.startswith("loading drafter") else "load"
            else:  # "downloading ..."
                stage[0] = "fetch"
            progress("load" if stage[0] == "drafter" else stage[0], text)

        notices = []
        try:
            if not self.use_drafter:
                m = load(self.model_name, use_drafter=False, progress=on_progress)
            else:  # the base model first, then the drafter: a drafter's failure should not cost the base model
                m = load(self.model_name, use_drafter=False, progress=on_progress)
                drafter = self.drafter_path or find_drafter(m.resolved)  # (the one load() would attach)
                try:  # as load(drafter=...): with the shape tuned for it
                    if drafter is not None:
                        attach_drafter(m, drafter, lambda text: progress("load", text))
                except (RedrafterError, OSError, ValueError) as e:
                    progress("load", "the drafter did not load: the base model alone")
                    whose = f"The drafter {self.drafter_path}" if self.drafter_path else "The model's drafter"
                    notices.append(f"{whose} did not load ({_readable(e)}): {NO_DRAFTER}.")
        except RedrafterError as e:  # on one line, whole: the chat's notice goes on after it
            raise EngineError(" ".join(str(e).split()) or type(e).__name__) from e
        if m.drafter is None and not notices and self.use_drafter:
            notices.append(
                f"No drafter found for {m.name}: speculation drafts from the context alone where that pays. "
                "Pass --drafter PATH to use a ReDrafter head."
            )

        if not m.tokenizer.has_chat_template:  # (the chat said nothing, and its replies ran on from the user's text)
            notices.append(f"{m.name} has no chat template: the conversation reaches it as plain text, its turns "
                           "(and --system) joined by line breaks, so it continues the text rather than answering.")
        plain_tps = None
        if self.warm_up:
            self._stop_if_closing()
            progress("warm-up", "plain decoding (also measures its speed)")
            g = generate(m, "Hello", mode="ar", max_tokens=8)
            plain_tps = g.stats.tokens_per_second or None
            from redrafter_mlx.control import controller

            self._stop_if_closing()
            controller(m, progress=lambda text: progress("warm-up", text))  # measures the cost curve once per device
            self._stop_if_closing()
            progress("warm-up", "speculative decoding")
            generate(m, "Hello", mode="auto", max_tokens=4)
        self._m, self._cache = m, PromptCache(m.model)
        return EngineInfo(
            model=m.name,
            weight_format=m.weight_format,
            device=m.device,
            context_length=m.context_length,
            drafter=str(m.drafter_path) if m.drafter is not None else None,
            stored_format=_describe_quantization(m.info.get("source_quantization")),
            load_seconds=time.perf_counter() - t0,
            plain_tokens_per_second=plain_tps,
            notices=notices,
            beam_shape=m.beam_shape if m.drafter is not None else None,
            tree=m.tree if m.drafter is not None else None,
        )

    def _stop_if_closing(self):
        if self.closing.is_set():  # the app has quit: the rest of a load is not wanted
            raise EngineError("the app closed during the load")

    def _reply(self, messages: Messages, settings: Settings, should_stop, on_status=None) -> Iterator[Chunk]:
        try:
            yield from self._stream(messages, settings, should_stop, on_status)
        except Exception as e:
            from redrafter_mlx import RedrafterError

            if isinstance(e, (RedrafterError, ValueError)):  # the user's to fix: say it plainly
                raise failure(e, named=False) from e
            raise

    def _stream(self, messages: Messages, settings: Settings, should_stop, on_status=None) -> Iterator[Chunk]:
        from redrafter_mlx import stream

        m = self._m
        # Without a drafter, fixed drafting is the context's copy alone, of a lookup given (mode auto with
        # lookup=N alone, as `python -m redrafter_mlx --no-drafter --lookup N`; 0: plain decoding); the
        # other fixed options shape the drafter's drafts, so without one drafting stays adaptive.
        copy_only = settings.speculative and not settings.adaptive and m.drafter is None and settings.lookup is not None
        adaptive = settings.speculative and not copy_only and (settings.adaptive or m.drafter is None)
        mode = "auto" if adaptive or copy_only else "redrafter" if settings.speculative else "ar"
        fixed = {} if adaptive else dict(lookup=settings.lookup) if copy_only else dict(
            beam_width=settings.beam_width, beam_length=settings.beam_length, lookup=settings.lookup,
            # the W and L sent make the tree settings.tree (None: beams): a floor has nothing to prune
            # without one, and the library refuses it there (the app said so when the model loaded)
            tree=settings.tree, tree_min_prob=settings.tree_min_prob if settings.tree else None)
        last = 0
        for ev in stream(
            m,
            messages,
            mode=mode,
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=settings.seed,
            **fixed,
            # graph drafting needs a tree when drafting is fixed (the app says so when a beam is set)
            graph=settings.graph if settings.speculative and not copy_only and (adaptive or settings.tree) else None,
            context_graph=settings.context_graph,
            system=settings.system,
            prompt_cache=self._cache,
            should_stop=should_stop,
            progress=on_status,
        ):
            if ev.step is not None:  # its tokens as the mean counts them: the end token it stopped at included
                last = ev.step.emitted + int(ev.step.ended)
            s = ev.stats
            stats = Stats(
                mode=s.mode,
                prompt_tokens=s.prompt_tokens,
                cached_tokens=s.cached_tokens,
                new_tokens=s.new_tokens,
                steps=s.steps,
                tokens_per_second=s.tokens_per_second,
                tokens_per_step=s.tokens_per_step,
                last_step_tokens=last,
                acceptance=s.acceptance_rate,
                accepted_tokens=s.accepted_tokens,
                accepted_lengths=tuple(s.accepted_lengths),
                prefill_seconds=s.prefill_seconds,
                decode_seconds=s.decode_seconds,
                draft_seconds=s.draft_seconds,
                verify_seconds=s.verify_seconds,
                peak_memory_mb=s.peak_memory_mb,  # stream() resets the peak per reply and reports it live
                beam_width=s.beam_width,
                beam_length=s.beam_length,
                tree=s.tree,
                parked_share=s.parked_share,
                packed_per_step=s.packed_per_step,
                controller=dict(s.controller) if s.adaptive else None,
                seed=s.seed,
            )
            yield Chunk(ev.text, stats, ev.finish_reason)


# ---- the scripted engine ----------------------------------------------------------------------

PLAIN_STEP_SECONDS = 0.05  # virtual: 20 tok/s plain decoding
DRAFT_SECONDS, VERIFY_SECONDS = 0.012, 0.048  # virtual: a speculative step costs 1.2 plain steps
FAKE_COSTS = {"plain_ms": 50.0, "verify1_ms": 50.0, "x4": 1.1, "x16": 1.6, "x64": 3.0, "draft_level_ms": 2.0}
ACCEPT_PATTERN = (3, 1, 2, 4, 2)  # tokens per speculative step, cut to the beam length
FAKE_SEED = 12345678901234567890  # the "fresh" seed of a sampled reply given none


class FakeEngine(EngineThread):
    """A deterministic engine for tests: scripted replies, virtual timings, no MLX.

    replies: answered in turn (cycling); a "token" is a word with its trailing space.
    drafter: None to act like a model without a drafter.
    fail_load: a message to fail loading with (or an exception to raise, as an engine breaking its contract).
    fail_reply: an exception every reply raises before its first token (None: the replies run).
    hold_after: after this many chunks of each reply, wait until `should_stop()` (a reply
        that only ends by being cancelled; 0: before its first token).
    step_delay: real seconds to sleep per chunk (for trying the UI by hand).
    load_delay: real seconds the load takes.
    load_gate: a threading.Event the load waits for after that (a test's "while it loads", which a
        delay only gave while the machine typed faster than the delay ran out).
    beam_shape: the tuned (W, L) the load reports; tree: the tuned dynamic-tree budget.
    prefill_status: lines each reply reports through on_status before its first chunk (as a
        long prompt's reading does).

    Records `calls` (messages, settings) and `new_chats` for tests to check."""

    def __init__(
        self,
        replies=("Hello! I am a **scripted** reply.",),
        *,
        model: str = "fake-135m",
        drafter: Optional[str] = "fake-drafter",
        fail_load: Optional[str] = None,
        fail_reply: Optional[BaseException] = None,
        hold_after: Optional[int] = None,
        step_delay: float = 0.0,
        load_delay: float = 0.0,
        load_gate: Optional[threading.Event] = None,
        beam_shape: Optional[Tuple[int, int]] = None,
        tree: Optional[int] = None,
        prefill_status: Tuple[str, ...] = (),
    ):
        super().__init__(name="fake-engine")
        self.prefill_status = prefill_status
        self.load_delay, self.load_gate = load_delay, load_gate
        self.beam_shape, self.tree = beam_shape, tree
        self.replies = list(replies)
        self.model, self.drafter, self.fail_load, self.fail_reply = model, drafter, fail_load, fail_reply
        self.hold_after, self.step_delay = hold_after, step_delay
        self.calls: List[Tuple[Messages, Settings]] = []
        self.new_chats = 0
        self.cached = 0  # prompt tokens the "KV cache" holds: the last prompt's (the next one starts with it)
        self.loaded = False

    @property
    def label(self) -> str:
        return self.model

    def start_load(self, progress: Progress) -> Future:
        return self.submit(self._load, progress)

    def load(self, progress: Progress) -> EngineInfo:
        return self.start_load(progress).result()

    def reply(self, messages: Messages, settings: Settings, should_stop: Callable[[], bool],
              on_status: Optional[Callable[[str], None]] = None) -> Iterator[Chunk]:
        if not self.loaded:
            raise EngineError("no model loaded")
        return self.iterate(self._reply, [dict(m) for m in messages], replace(settings), should_stop, on_status)

    def new_chat(self):
        def reset():
            self.new_chats += 1
            self.cached = 0

        self.submit(reset)

    def _load(self, progress: Progress) -> EngineInfo:
        time.sleep(self.load_delay)
        if self.load_gate is not None and not self.load_gate.wait(60):
            raise EngineError("the load gate was never opened")
        progress("fetch", f"{self.model}.gguf (cached)")
        progress("load", f"loading {self.model}.gguf")
        if isinstance(self.fail_load, BaseException):  # an engine breaking its contract: not an EngineError
            raise self.fail_load
        if self.fail_load:
            raise EngineError(self.fail_load)
        progress("warm-up", "plain decoding")
        self.loaded = True
        notices = [] if self.drafter else [f"No drafter found for {self.model}: {NO_DRAFTER}."]
        return EngineInfo(
            model=self.model,
            weight_format="float32",
            device="cpu (fake)",
            context_length=2048,
            drafter=self.drafter,
            stored_format="4-bit g32",
            load_seconds=1.5,
            plain_tokens_per_second=1 / PLAIN_STEP_SECONDS,
            notices=notices,
            beam_shape=self.beam_shape,
            tree=self.tree,
        )

    def _reply(self, messages: Messages, settings: Settings, should_stop, on_status=None) -> Iterator[Chunk]:
        if self.fail_reply is not None:
            raise self.fail_reply
        self.calls.append((messages, settings))
        for line in self.prefill_status:
            if on_status is not None:
                on_status(line)
        text = self.replies[(len(self.calls) - 1) % len(self.replies)]
        tokens = re.findall(r"\S+\s*|\s+", text)
        spec = settings.speculative and self.drafter is not None
        adaptive = spec and settings.adaptive
        W, L = (settings.beam_width, settings.beam_length) if spec else (0, 0)
        prompt_tokens = sum(len(m["content"].split()) + 4 for m in messages)
        cached, self.cached = min(self.cached, prompt_tokens - 1), prompt_tokens
        run = dict(mode="auto" if adaptive else "redrafter" if spec else "ar", prompt_tokens=prompt_tokens,
                   cached_tokens=cached, beam_width=0 if adaptive else W, beam_length=0 if adaptive else L,
                   prefill_seconds=0.01 * (prompt_tokens - cached), peak_memory_mb=512.0,
                   packed_per_step=float(L) if spec else 1.0,
                   controller=dict(FAKE_COSTS) if adaptive else None,
                   seed=None if settings.temperature == 0 else FAKE_SEED if settings.seed is None else settings.seed)
        lengths: List[int] = []
        seconds = {"decode": 0.0, "draft": 0.0, "verify": 0.0}

        def stats(new: int) -> Stats:
            steps, emitted = len(lengths), sum(lengths)
            tried = steps * max(L - 1, 0)
            accepted = sum(n - 1 for n in lengths)
            return Stats(
                new_tokens=new, steps=steps, last_step_tokens=lengths[-1] if lengths else 0,
                tokens_per_second=emitted / seconds["decode"] if steps else 0.0,
                tokens_per_step=emitted / steps if steps else 0.0,
                acceptance=accepted / tried if tried else 0.0, accepted_tokens=accepted if spec else 0,
                accepted_lengths=tuple(lengths), decode_seconds=seconds["decode"],
                draft_seconds=seconds["draft"], verify_seconds=seconds["verify"], **run,
            )

        limit = min(len(tokens), settings.max_tokens)
        if limit == 0:
            yield Chunk("", stats(0), "eos")
            return

        def reason(done: int) -> Optional[str]:
            return None if done < limit else ("eos" if limit == len(tokens) else "length")

        if self.hold_after == 0:  # held before the first token (a long prompt being read)
            while not should_stop():
                time.sleep(0.01)
            yield Chunk("", stats(0), "cancelled")
            return
        yield Chunk(tokens[0], stats(1), reason(1))  # the prefill's token
        done, sent, step = 1, 1, 0
        while done < limit:
            if self.hold_after is not None and sent >= self.hold_after:
                while not should_stop():
                    time.sleep(0.01)
            if should_stop():
                yield Chunk("", stats(done), "cancelled")
                return
            if self.step_delay:
                time.sleep(self.step_delay)
            n = min(ACCEPT_PATTERN[step % len(ACCEPT_PATTERN)], L) if spec else 1
            n = min(n, limit - done)
            step += 1
            lengths.append(n)
            if spec:
                seconds["draft"] += DRAFT_SECONDS
                seconds["verify"] += VERIFY_SECONDS
                seconds["decode"] += DRAFT_SECONDS + VERIFY_SECONDS
            else:
                seconds["decode"] += PLAIN_STEP_SECONDS
            new = "".join(tokens[done : done + n])
            done += n
            sent += 1
            yield Chunk(new, stats(done), reason(done))
