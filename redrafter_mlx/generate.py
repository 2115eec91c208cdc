"""Generation: plain autoregressive decoding and ReDrafter speculative decoding.

`stream(...)` yields an `Event` per step (text delta, new token ids, step and run stats);
`generate(...)` collects them. Both modes share prefill, stopping rules and bookkeeping:

- prefill runs the prompt (minus whatever a `PromptCache` already holds) and samples the
  first token from its last logits;
- a step of `ar` feeds one token; a step of `redrafter` drafts W beams of L tokens from the
  base model's last hidden state (plus, with `lookup`, one beam copied from the context,
  lookup.py), packs them into one tree, verifies them in ONE forward pass, accepts the
  longest path the base model agrees with, and commits only that path's K/V to the cache
  (see beam_search.py, tree.py);
- generation stops on an end-of-turn token (not emitted), `max_tokens`, the model's
  context length, or `should_stop()` returning True between steps.

The cache always holds exactly `PromptCache.ids`: a step interrupted by an exception
(KeyboardInterrupt included) is rolled back, and a prompt's reading keeps the chunks it finished,
so a cancelled reply leaves it whole.
"""

import difflib
import functools
import inspect
import numbers
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Union

import mlx.core as mx
import numpy as np

from .beam_search import beam_search
from .errors import ContextLengthError, CorruptModelError, InvalidPromptError, RedrafterError, SettingError, compact
from .graph import context_only, graft_counts, graph_k_error, root_copy, search as graph_search
from .lookup import ContextIndex, CopyLength, add_beam, copy_taken
from .sampling import Sampler
from .stats import RunStats, StepStats
from .tokenizer import first_non_id
from .tree import accept, beam_of, pack
from .tree_search import tree_nodes, tree_search
from .tuning import drafting, fixed_drafting
from .control import controller
from .costs import heal_cached

MAX_DRAFT_TOKENS = 1024  # beam_width x (beam_length - 1), tree, lookup: each at most this
PREFILL_CHUNK = 512  # tokens a prompt is read in at most ...
PREFILL_MIN_CHUNK = 64  # ... and at least, where chunks are slow:
PREFILL_SECONDS = 2.0  # a chunk should take about this long at most, since a cancel waits for it
MODES = ("auto", "ar", "redrafter")


class PromptCache:
    """A KV cache and the token ids it holds, kept across calls (e.g. the turns of a chat).

    A new prompt reuses the longest common prefix of ids and only prefills the rest.
    model: the base model, `loaded.model` (not the LoadedModel that load() returned), whose keys
    and values it holds; it serves that model alone."""

    def __init__(self, model):
        if not callable(getattr(model, "make_cache", None)):  # e.g. the LoadedModel that load() returns
            raise SettingError(f"PromptCache takes the base model, PromptCache(loaded.model), not "
                               f"{type(model).__name__}")
        self.cache = model.make_cache()
        self.ids: List[int] = []
        self.user = None  # the stream using it (set by stream(): another call's use ends that one)
        self.prefill_chunk: Optional[int] = None  # the chunk size _prefill last found to fit (None: PREFILL_CHUNK)

    def belongs_to(self, model) -> bool:
        """Whether this cache was made by `model`: it holds that model's keys and values, and its
        layers read that model's tree state for their masks (another model's, even one loaded from
        the same files, would verify trees with the wrong mask)."""
        return len(self.cache) > 0 and all(c.tree is getattr(model, "state", None) for c in self.cache)

    def reuse(self, prompt: Sequence[int]) -> int:
        """Trim to the longest prefix shared with `prompt`, keeping at least one prompt token
        to run (its logits start the reply). Returns how many tokens are reused."""
        if hasattr(prompt, "tolist") and getattr(prompt, "ndim", None) == 1:  # a numpy or MLX array of ids
            prompt = prompt.tolist()
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence) or not prompt:
            # [] said "PromptCache.truncate takes a number of tokens >= 0, not -1", None a TypeError from zip,
            # and "text" cleared the cache
            raise SettingError(f"PromptCache.reuse takes a prompt's token ids, at least one, not {prompt!r:.40}")
        where = first_non_id(prompt)
        if where is not None:  # ["a", "b"] (tokens as text) and [1.5] matched nothing and cleared the cache
            raise SettingError(f"PromptCache.reuse takes a prompt's token ids, whole numbers >= 0, not "
                               f"{compact(prompt[where], repr):.40}")
        n = 0
        for a, b in zip(self.ids, prompt):
            if a != b:
                break
            n += 1
        n = min(n, len(prompt) - 1)
        return self.truncate(n)

    def truncate(self, n: int) -> int:
        """Keep the first n tokens; returns how many are kept: n (all of them where n is more), or 0
        where a windowed layer already dropped keys that decoding from n would need (the cache
        then starts over, and the next prompt is prefilled whole). A stream that was using the cache
        stops with a SettingError at its next step, as where another stream takes it."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            # -1 rewound the cache past its start (a ValueError from the first layer); 1.5 failed slicing the ids
            raise SettingError(f"PromptCache.truncate takes a number of tokens >= 0, not {compact(n, repr)}")
        # Between two steps of a stream using this cache (its model's lock), and that stream then stops with a
        # SettingError, as where another stream takes the cache: resumed after a reset or truncate, it went on
        # from tokens no longer there, saying nothing, and left keys and values that were not those of `ids`.
        with _lock_of(self.cache[0].tree if len(self.cache) else None):
            self.user = None
            n = min(int(n), len(self.ids))  # more than it holds returned n, the count asked for, not the one kept
            start_over = not self.cache.can_trim_to(n)
            n = 0 if start_over else n
            # The ids first: Ctrl-C between the two then leaves keys past the ids, which the next trim drops (as
            # after a forward cut short); the other way round, ids past the keys had the next prompt read at the
            # wrong positions, a wrong reply saying nothing.
            del self.ids[n:]
            if start_over:
                self.cache.clear()
            self.cache.trim_to(n)
            return n

    def reset(self):
        """Empty it, as truncate(0): the next prompt is read whole."""
        self.truncate(0)

    def __repr__(self) -> str:  # (was <redrafter_mlx.generate.PromptCache object at 0x...>: nothing of what it holds)
        return f"PromptCache({len(self.ids)} tokens)"


@dataclass
class Event:
    """What one step of `stream` added. The first event carries the token sampled from the prompt's
    last logits, with step None (no token where it was the end of turn or the prompt's reading was
    cancelled); each later one a decode step's tokens and its StepStats, but for a last event that
    only ends the reply ("cancelled", "context": no tokens, step None)."""

    text: str  # text delta since the previous event
    tokens: List[int]  # token ids this event added
    # The run so far: one RunStats object, updated in place as the reply goes on (every event of a
    # stream holds the same one), so read its figures as the event arrives, or copy.deepcopy it.
    stats: RunStats
    step: Optional[StepStats] = None
    finish_reason: Optional[str] = None  # "eos" | "length" | "context" | "cancelled" on the last event
    # The prompt's token ids as the model read them (chat template included), on the first event
    # only (None on later ones): what `generate` returns as prompt_tokens, without rendering it again.
    prompt_ids: Optional[List[int]] = None


@dataclass
class Generation:
    """What `generate` returns: a stream's events gathered (the reply, its ids, the prompt's, the run's stats
    and why it ended)."""

    text: str  # the reply (the end-of-turn token not included)
    tokens: List[int]  # its token ids
    prompt_tokens: List[int]  # the prompt's token ids, chat template included
    stats: RunStats
    finish_reason: str  # "eos" | "length" | "context" | "cancelled"
    events: int = 0  # events `stream` yielded (see Event: the first, then one per decode step, and perhaps an end)
    # one per decode step (stats.steps of them); left out of the repr, where a 256-token reply's ran to 30-70 KB
    step_stats: List[StepStats] = field(default_factory=list, repr=False)


def _prefill(model, pc: PromptCache, prompt: List[int], start: int, stopped: Callable[[], bool],
             progress: Optional[Callable[[str], None]] = None):
    """Run the prompt past `start`, the tokens `pc` holds already (pc.reuse). Returns (logits (V,),
    hidden (H,)) of its last token, or None when `stopped()` is true before a chunk (the chunks done
    stay cached: a valid prefix that the next prompt can reuse). `progress` hears of each chunk of a
    prompt longer than one. A chunk that took longer than PREFILL_SECONDS makes the next ones
    smaller (halved until they would fit it, down to PREFILL_MIN_CHUNK; they grow back where fast),
    so a cancel is seen within a few seconds: on the 2-core CPU a 512-token chunk of the default
    model took 3 s at the start of a prompt and 8-15 s after 1,500 tokens (attention's exp over the
    cached keys), while 128-token chunks read a long prompt as fast. The size found is kept on `pc`:
    the next prompt of a conversation starts there (its first chunk at 512 took 8 s to cancel in the
    chat, past 2,000 tokens of conversation)."""
    todo = prompt[start:]
    i, size = 0, min(pc.prefill_chunk or PREFILL_CHUNK, PREFILL_CHUNK)
    while i < len(todo):
        if stopped():  # (before the first chunk too: a call stopped already read a short prompt and gave a token)
            return None
        if progress is not None and len(todo) > PREFILL_CHUNK:
            progress(f"reading the prompt: {i} of {len(todo)} tokens")
        part = todo[i : i + size]
        began = time.perf_counter()
        h = model.hidden(mx.array(part, dtype=mx.int32)[None], pc.cache)
        mx.eval(h)  # keep prefill memory bounded chunk by chunk
        took = time.perf_counter() - began
        pc.ids.extend(part)
        pc.cache.drop_old()  # windowed layers keep about their window, not the whole prompt
        i += len(part)
        if took > PREFILL_SECONDS:  # to the power of two that would have taken about PREFILL_SECONDS
            least, rate = min(PREFILL_MIN_CHUNK, size), took / len(part)
            while size > least and size * rate > PREFILL_SECONDS:
                size = max(least, size // 2)
        elif took < PREFILL_SECONDS / 4 and len(part) == size:
            size = min(PREFILL_CHUNK, 2 * size)
        pc.prefill_chunk = size
    h = h[0, -1]
    return model.logits(h), h


def _check_types(**settings):
    """Whole numbers where a count is expected (tree_min_prob: any real number), None meaning the
    default: 2.5 tokens or "5" failed deep inside decoding, after a first call's calibration."""
    for name, value in settings.items():
        kind, what = (numbers.Real, "a number") if name == "tree_min_prob" else (numbers.Integral, "a whole number")
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise SettingError(f"{name} must be {what}, not {value!r}")


# Other libraries' names (mlx-lm, Hugging Face transformers) for a setting, or for one not offered here: read as
# typos, `temp` was "did you mean 'system'?", `top_k` and `stop` "did you mean 'top_p'?", `max_length` 'beam_length'
_STOP = "stop strings are not offered: should_stop, a function asked between steps, ends a reply"
_OTHER_NAMES = {
    "temp": "did you mean 'temperature'?",
    "max_new_tokens": "did you mean 'max_tokens'?",
    "max_length": "did you mean 'max_tokens'? It counts the reply's tokens, not the prompt's",
    "random_seed": "did you mean 'seed'?",
    "sampler": "temperature and top_p set the sampling",
    "top_k": "top-k sampling is not offered: top_p limits sampling (draft_top_k shapes drafting, not sampling)",
    "min_p": "min-p sampling is not offered: top_p limits sampling",
    "repetition_penalty": "not offered: a reply follows the base model's own distribution",
    "logits_processors": "not offered: a reply follows the base model's own distribution",
    "stop": _STOP,
    "stream": "stream() yields the reply as it comes, generate() returns it whole",
    "draft_model": "the drafter comes with the model: load(NAME, drafter=PATH)",
    "num_draft_tokens": "beam_width and beam_length, or tree, size the drafts (none of them: adaptive)",
    # (these read as typos: `model` was "did you mean 'mode'?", `min_tokens` "did you mean 'max_tokens'?")
    "model": "the model is the first argument, the one load() returned; mode picks the decoding",
    "min_tokens": "not offered: a reply ends at the model's end-of-turn token or max_tokens",
    "max_completion_tokens": "did you mean 'max_tokens'?",
    "stop_strings": _STOP, "stop_sequences": _STOP, "eos_token_id": _STOP,
    "do_sample": "temperature > 0 samples, 0 (the default) decodes greedily",
    "num_beams": "beam search of the reply is not offered; beam_width and beam_length shape drafting",
    "verbose": "the reply's figures are in its stats (out.stats, or each event's)",
    "prompt_progress_callback": "did you mean 'progress'?",
    "messages": "a list of messages is the prompt, the second argument",
    "system_prompt": "did you mean 'system'?",
}


def _check_names(caller: str, kwargs) -> None:
    """An unknown setting names the function the user called and the setting meant, if one is
    close (`generate(m, p, max_token=9)` said "stream() got an unexpected keyword argument"), or
    what stands here for another library's setting (_OTHER_NAMES). Only near misses are read as
    typos: at difflib's default cutoff, `stream` was "did you mean 'system'?"."""
    for name in kwargs:
        if name not in _SETTINGS:
            close = difflib.get_close_matches(name, _SETTINGS, n=1, cutoff=0.8)
            hint = _OTHER_NAMES.get(name) or (f"did you mean {close[0]!r}?" if close else "")
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}" + (f" ({hint})" if hint else ""))


def _check_loaded(caller: str, loaded) -> None:
    """A registry name or None for the model read "AttributeError: 'str' object has no attribute 'model'"."""
    if not (hasattr(loaded, "model") and hasattr(loaded, "tokenizer")):
        raise SettingError(f"{caller}() takes the model that load() returned (m = load(NAME); {caller}(m, prompt)), "
                           f"not {type(loaded).__name__} {loaded!r:.60}")


_SHARED_LOCK = threading.RLock()  # for models without a TreeState (the tests' stand-ins)


def _lock_of(state) -> threading.RLock:
    """The lock of a model's tree state (TreeState.lock), which a stream's step holds; _SHARED_LOCK without one."""
    return getattr(state, "lock", None) or _SHARED_LOCK


def _one_step_at_a_time(fn):
    """`stream` computes each event holding its model's lock, so threads sharing a loaded model
    take turns step by step (their trees share the model's tree state: two at once broke
    verification). Its checks run when it is called: `fn` yields None once they have passed,
    before anything runs."""

    @functools.wraps(fn)
    def wrapper(loaded, prompt, *args, **kwargs):
        _check_names(fn.__name__, kwargs)
        _check_loaded(fn.__name__, loaded)
        lock = _lock_of(getattr(loaded.model, "state", None))
        inner = fn(loaded, prompt, *args, **kwargs)
        # A setting, prompt or model refused at the call, as Python refuses a bad argument: a generator's
        # checks had waited for the first next(), so `it = stream(m, p, temprature=0.7)` said nothing
        # there, and the error came where the events were read (another thread, a UI's worker).
        with lock:
            next(inner)
        return _events(inner, lock)

    return wrapper


def _events(inner, lock) -> Iterator["Event"]:
    """The events of `inner`, a stream past its checks, each computed holding `lock`."""
    try:
        while True:
            with lock:
                try:
                    ev = next(inner)
                except StopIteration:
                    return
            yield ev
    finally:
        with lock:
            inner.close()


@_one_step_at_a_time
def stream(
    loaded,
    prompt: Union[str, list],
    *,
    mode: str = "auto",
    max_tokens: int = 256,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: Optional[int] = None,
    beam_width: Optional[int] = None,
    beam_length: Optional[int] = None,
    draft_top_k: Optional[int] = None,
    lookup: Optional[int] = None,
    tree: Optional[int] = None,
    tree_min_prob: Optional[float] = None,
    system: Optional[str] = None,
    prompt_cache: Optional[PromptCache] = None,
    should_stop: Optional[Callable[[], bool]] = None,
    use_drafter: bool = True,
    graph: Optional[int] = None,
    context_graph: bool = True,
    progress: Optional[Callable[[str], None]] = None,
) -> Iterator[Event]:
    """Generate a reply, yielding an Event per step.

    The settings, the model and the prompt are checked when stream() is called (the errors below
    are raised there); the model runs from the first next() on.
    loaded: a LoadedModel from `load()`. prompt: text (wrapped in the chat template), a list
    of {"role", "content"} messages (roles: system, user, assistant, tool), or a list of token
    ids (used as is).
    mode: "auto" (the default), "ar" (plain decoding: the drafting settings below are not used, so
    a caller can switch speculation off without dropping them; the CLIs refuse them with --mode ar)
    or "redrafter" (needs a drafter).
    With no drafting setting given (beam_width, beam_length, tree, tree_min_prob, lookup and
    draft_top_k all None), "auto" and "redrafter" are adaptive (control.py): every step the
    controller keeps the draft nodes that maximize expected tokens per second on this machine's
    measured cost curve, and parks (plain decoding) where drafting does not pay; "auto" without
    a drafter (or with use_drafter=False) drafts from the context alone where that pays.
    With any drafting setting given, drafting is fixed (mode "auto": redrafter when the model
    has a drafter and the beam length is not 1; without a drafter, or with use_drafter=False,
    only the copy of a `lookup` > 0 given, else plain decoding).
    beam_width/beam_length: W beams of L tokens, L counting the base model's own (so L=1 drafts
    nothing; mode "auto" then decodes plainly, mode "redrafter" still adds the lookup beam); None
    (the default) takes the shape tuned for this device (`redrafter-bench --tune`,
    `loaded.beam_shape`; W=1 L=1 when plain decoding measured fastest), else tuning.DEFAULT_SHAPE.
    lookup: in redrafter mode, also draft a copy of up to this many tokens from the context where
    its last tokens recur (lookup.py); after a step that accepted the whole copy the next may be
    twice as long, up to lookup.MAX_GROWTH times this (within MAX_DRAFT_TOKENS), and back to this
    after one that did not (lookup.CopyLength). 0 turns it off; None (the default) takes the tuned
    length, else tuning.DEFAULT_LOOKUP.
    tree: in redrafter mode, draft a dynamic tree of up to this many nodes instead of the fixed
    beams (tree_search.py): W wide, L - 1 deep, nodes whose path probability is below
    `tree_min_prob` dropped (0 = fixed beams; None, the default, takes the budget tuned with the
    beam shape when the shape is tuned too, else tuning.DEFAULT_TREE).
    tree_min_prob: that floor, in (0, 1] (None, the default: the tuned floor, else
    tree_search.DEFAULT_MIN_PROB); given where W x L beams are drafted, which it would not
    prune, it is refused. `tuning.drafting` holds these rules.
    draft_top_k: beam search draws each beam's next token from the drafter's k most likely ones
    (W x L beams only: given without `tree`, it drafts beams, not a tuned tree; with tree > 0 it is
    refused, a tree keeping at most W children per node already). None (the default): from all.
    use_drafter: True (the default) drafts with the model's drafter where it has one; False drafts
    without it (adaptive: from the context alone).
    graph: draft a graph (GSD, graph.py) instead of a tree, K being GSD's k-gram length (0
    matches on the token alone): a node whose last K + 1 tokens match one drafted elsewhere
    reuses that one's continuation, and with `context_graph` every drafter node whose last
    tokens occur in the context gets what followed there (up to `lookup` tokens), and the root's
    copy runs up to 4 x `lookup`, cut by its calibrated probability (graph.root_copy). Needs a
    tree (`tree` > 0) when drafting is fixed; adaptive drafting chooses among grafted nodes as
    among any. None (the default): a tree, as without GSD. Without a drafter (use_drafter=False,
    or a model with none) it is not used: no node is drafted to merge, or to graft the context under.
    context_graph: with `graph`, also graft what followed in the context (above); True by
    default, False grafts only between drafted nodes.
    max_tokens: the longest reply in tokens (>= 1; 256 by default); it also ends at the chat
    template's end-of-turn token (not output), at the model's context length ("context"), or when
    should_stop() returns True ("cancelled").
    should_stop: a function () -> bool, asked between prompt chunks and before each decode step;
    True ends the reply ("cancelled"). None (the default): never asked.
    temperature: 0 (the default) decodes greedily, token for token plain decoding; above 0, tokens
    are drawn from softmax(logits / temperature) of the base model, restricted to the smallest
    set of tokens holding top_p of the probability.
    top_p: in (0, 1]; 1 (the default) keeps every token. top_p and seed serve sampling alone:
    with temperature 0 they are checked and not used (so a caller can switch sampling off
    without dropping them, as mode "ar" does drafting; the CLIs refuse them).
    seed: sampling's random seed, 0 to 2**64 - 1 (None, the default: a fresh one for each reply,
    which `stats.seed` gives, so a reply can be had again with seed=stats.seed). A draw depends
    only on the seed and its position in the sequence (sampling.py), so a seed gives plain
    decoding's reply in every mode and with every tree, the adaptive controller's (whose trees
    follow measured timings) included.
    prompt_cache: a PromptCache(loaded.model) kept across calls (the turns of a chat): the prompt's
    longest prefix it holds is not read again. One per model and conversation, used by one stream
    at a time (a stream whose cache another call used before it ended stops with a SettingError).
    None (the default): a cache for this call alone.
    system: a system prompt, put first before a text prompt or a message list (blank or None, the
    default: the chat template's default); refused with token ids, and with a message list that
    begins with a system message of its own.
    progress: a function (str) -> None called with a line of text while an adaptive call
    calibrates this machine's cost curve (the first call for a device and model, a few seconds),
    after the settings, the prompt and the context length were checked, and per chunk of a prompt
    (its part not cached yet) longer than one chunk (PREFILL_CHUNK tokens) while it is read.
    None (the default): nothing is told.
    """
    if mode not in MODES:
        raise SettingError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    _check_types(max_tokens=max_tokens, beam_width=beam_width, beam_length=beam_length, draft_top_k=draft_top_k,
                 lookup=lookup, tree=tree, graph=graph, tree_min_prob=tree_min_prob)
    # numpy's integers (np.arange's) pass as whole numbers: as Python ints they reach RunStats, whose to_dict()
    # json.dumps refused ("Object of type int64 is not JSON serializable")
    max_tokens, beam_width, beam_length, draft_top_k, lookup, tree, graph = (
        None if v is None else int(v) for v in (max_tokens, beam_width, beam_length, draft_top_k, lookup, tree, graph))
    for name, flag in (("use_drafter", use_drafter), ("context_graph", context_graph)):
        if not isinstance(flag, (bool, np.bool_)):  # use_drafter="no" was taken as True
            raise SettingError(f"{name} must be True or False, not {flag!r}")
    if graph is not None and graph < 0:
        raise SettingError(f"graph must be >= 0 (GSD's k-gram length), not {compact(graph)}")
    too_long = graph_k_error(graph, "graph")
    if too_long:
        raise SettingError(too_long)
    drafter = loaded.drafter if use_drafter else None
    adaptive = mode != "ar" and not fixed_drafting(beam_width, beam_length, tree, lookup, tree_min_prob, draft_top_k)
    lookup_given = lookup is not None  # (`drafting` below fills in the default)
    floor_given = tree_min_prob is not None
    shape_unnamed = [name for name, value in (("beam_width", beam_width), ("beam_length", beam_length)) if value is None]
    if draft_top_k is not None and tree is None:
        tree = 0  # it shapes beam search's beams: a tree tuned with the shape would have ignored it, saying nothing
    # The node budget is `budget`: below, `tree` holds each step's packed tree.
    beam_width, beam_length, budget, lookup, tree_min_prob = drafting(
        loaded, beam_width, beam_length, tree, lookup, tree_min_prob)
    if mode == "redrafter" and drafter is None:
        if loaded.drafter is None:
            from .config import train_drafter

            raise RedrafterError(f"model {loaded.name} has no drafter: load one (drafter=PATH, --drafter PATH), train "
                                 f"one ({train_drafter(loaded.name)}) or use mode 'auto' or 'ar'")
        raise SettingError("mode 'redrafter' with no drafter: use_drafter=False (--no-drafter) left the model's "
                             "drafter out; drop it, or use mode 'auto' or 'ar'")
    if mode == "auto" and not adaptive and drafter is None and lookup_given and lookup > 0:
        # fixed drafting from the context alone: the copy, and no drafter beams (L=1 calls no drafter); a graph,
        # like a tree, shapes the drafter's drafts (with one, this decoded plainly, where the chat drafts the copy)
        mode, beam_width, beam_length, budget, graph = "redrafter", 1, 1, 0, None
    elif mode == "auto" and not adaptive:  # L=1 (e.g. tuned: plain decoding was fastest here) drafts nothing
        mode = "redrafter" if drafter is not None and beam_length != 1 else "ar"
    elif mode == "auto":
        mode = "redrafter"
    if mode == "redrafter" and not getattr(loaded, "tree_ok", True):
        mode, adaptive = "ar", False  # the load-time self-check found tree verification wrong here
    if beam_width < 1 or beam_length < 1:  # in every mode, as every other drafting option is
        raise SettingError(f"beam width and length must be >= 1, not {compact(beam_width)} x {compact(beam_length)}")
    # A verified tree's mask and attention grow with its size squared: a million beams ran out of
    # memory inside MLX, which ends the process. Trees past ~64 tokens are slower than plain
    # decoding on every machine measured (an H100 verifies 64 for ~1.4x one).
    if beam_width * (beam_length - 1) > MAX_DRAFT_TOKENS:
        # a width alone (--beam-width 1000) is only refused here, the length being known once loaded: say where
        # the rest of the shape came from (it read "not beams of 1000 x 4, tree 0, lookup 8")
        tuned = getattr(loaded, "beam_shape", None)
        source = "tuned for this device" if tuned and tuned[1] > 1 else "the default"
        note = f" ({' and '.join(shape_unnamed)} not given: {source})" if shape_unnamed else ""
        raise SettingError(f"beams of {compact(beam_width)} x {compact(beam_length)} tokens{note} draft "
                           f"{compact(beam_width * (beam_length - 1))} "
                           f"tokens a step; at most {MAX_DRAFT_TOKENS}")
    for name, value in (("tree", budget), ("lookup", lookup)):
        if value > MAX_DRAFT_TOKENS:
            raise SettingError(f"{name} {compact(value)}: drafts are limited to {MAX_DRAFT_TOKENS} tokens a step")
    if draft_top_k is not None and draft_top_k < 1:  # 0 kept every token, -1 all but the least likely
        raise SettingError(f"draft_top_k must be >= 1, not {compact(draft_top_k)}")
    if draft_top_k is not None and budget and mode == "redrafter":  # tree_search has no top-k: it was ignored
        raise SettingError(f"draft_top_k limits the W x L beams of beam search, and tree={budget} drafts a dynamic tree "
                           "(at most W children per node): give one of them")
    for name, fn in (("should_stop", should_stop), ("progress", progress)):
        if fn is not None and not callable(fn):
            kind = "() -> bool" if name == "should_stop" else "(str) -> None"
            raise SettingError(f"{name} must be a function ({kind}) or None, not {type(fn).__name__}")
    if max_tokens is None:
        raise SettingError("max_tokens must be a whole number >= 1, not None")
    if max_tokens < 1:
        raise SettingError(f"max_tokens must be >= 1, not {compact(max_tokens)}")
    if lookup < 0:
        raise SettingError(f"lookup must be >= 0, not {compact(lookup)}")
    if budget < 0:
        raise SettingError(f"tree must be >= 0 nodes, not {compact(budget)}")
    if not 0.0 < tree_min_prob <= 1.0:
        raise SettingError(f"tree_min_prob must be in (0, 1], not {compact(tree_min_prob)}")
    if floor_given and mode == "redrafter" and not adaptive and not budget:
        # the floor only prunes a dynamic tree: with beams it was dropped, saying nothing
        why = "tree=0" if tree is not None else "no tree given, and no tuned one applies"
        raise SettingError(f"tree_min_prob is a dynamic tree's floor, and this call drafts W x L beams ({why}): "
                           "pass tree=N with N > 0 draft nodes, or leave tree_min_prob out")
    if graph is not None and mode == "redrafter" and not adaptive and not budget:
        raise SettingError("graph drafting needs a dynamic tree: pass tree=N (--tree N) with N > 0 draft nodes, or "
                          "no drafting option at all (adaptive drafting)")
    model, tok = loaded.model, loaded.tokenizer
    if prompt_cache is not None and not isinstance(prompt_cache, PromptCache):
        raise SettingError(f"prompt_cache must be a PromptCache(loaded.model), not {type(prompt_cache).__name__}")
    if prompt_cache is not None and not prompt_cache.belongs_to(model):
        # another model's keys and tree state: a traceback where shapes differ, a wrong reply where they match
        # (it said "made for another model, not NAME" where it was made for NAME, loaded before: a reload)
        raise SettingError(f"prompt_cache was made for another model, or for an earlier load of {loaded.name}: a cache "
                           "serves the model it was made with; make one for this one, PromptCache(loaded.model)")
    sampler = Sampler(temperature, top_p, seed)
    ids = tok.prompt_ids(prompt, system=system)
    vocab, top = model.args.vocab_size, max(ids)
    # (the first element by iteration: a deque of ids has no slices, and prompt[:1] was a TypeError)
    if top >= vocab and (isinstance(prompt, str) or isinstance(next(iter(prompt), None), dict)):
        # the tokenizer made it: it said "token ids are whole numbers from 0 to ...", of a text prompt
        raise CorruptModelError(f"the tokenizer of {loaded.name} gave token id {top}, past the model's vocabulary of "
                                f"{vocab}: its tokenizer files do not belong to its weights")
    if top >= vocab:  # an id past the embedding table crashed the process inside MLX
        raise InvalidPromptError(f"token ids are whole numbers from 0 to {vocab - 1} for {loaded.name}, "
                                 f"not {compact(top)}")
    limit = loaded.context_length
    if len(ids) >= limit:
        turns = sum(1 for m in prompt if isinstance(m, dict) and m.get("role") != "system") \
            if isinstance(prompt, list) else 1
        raise ContextLengthError(
            f"the prompt has {len(ids)} tokens but {loaded.name} has a context of {limit}: "
            + ("shorten the conversation or start a new chat" if turns > 1 else "shorten it")
        )
    yield None  # the checks passed: stream() returns here (_one_step_at_a_time), and the first next() goes on
    ctl = controller(loaded, use_drafter, progress, not sampler.greedy) if adaptive else None  # after the checks: a first call calibrates
    pc = prompt_cache if prompt_cache is not None else PromptCache(model)
    owner = pc.user = object()  # another call on this cache takes it: this stream then stops (below)
    detok = tok.detokenizer()
    stats = RunStats(mode="auto" if ctl is not None else mode, prompt_tokens=len(ids), adaptive=ctl is not None,
                     seed=sampler.seed_used)
    if mode == "redrafter" and ctl is None:
        stats.beam_width, stats.beam_length, stats.tree = beam_width, beam_length, budget
    mx.reset_peak_memory()
    taken = ("the prompt_cache of this stream was used by another call before it ended: give each conversation its "
             "own PromptCache, and finish (or close) one stream before the next starts on the same cache")

    def stopped() -> bool:
        stop = should_stop is not None and should_stop()
        if pc.user is not owner:  # should_stop itself used the cache (reset it, or ran a call on it): the step or
            raise SettingError(taken)  # chunk it was asked before had run on what that left (a wrong token, silently)
        return stop

    def told(line: str):  # progress, asked before a prompt's chunk, guarded as should_stop is (a reset cache there
        progress(line)    # had the chunk read as the start of a context: a wrong first token, or a reply ended "eos")
        if pc.user is not owner:
            raise SettingError(taken)

    eos = tok.eos_token_ids

    first_event = True

    def event(new: List[int], step: Optional[StepStats], reason: Optional[str]) -> Event:
        nonlocal first_event
        # Queue the keys and values the cache keeps past this yield: MLX computes a lazy array only on
        # the thread that built it (its streams are per thread), and the next step, or the next turn on
        # this PromptCache, may run on another (a chat's second turn on another worker thread failed
        # with "There is no Stream(cpu, 4) in current thread" where the first had committed a path).
        mx.async_eval(pc.cache.state)
        text = detok.add(new) + (detok.flush() if reason else "")
        # Live, for UIs (a cheap host query). MLX keeps one peak per process, which every stream resets
        # as it starts: kept as the highest read, so a stream started beside this one (another thread,
        # interleaved generators) does not take back what this one had already reported (3.9 MB after a
        # long prompt fell to 0.4 at the next step).
        stats.peak_memory_mb = max(stats.peak_memory_mb, mx.get_peak_memory() / 1e6)
        if ctl is not None:
            stats.controller = ctl.summary()
        read, first_event = (ids if first_event else None), False
        return Event(text, new, stats, step, reason, read)

    # ---- prefill: the prompt's last logits give the first token --------------------------
    try:
        t0 = time.perf_counter()
        stats.cached_tokens = pc.reuse(ids)
        pc.user = owner  # (reuse, as every call that trims the cache, took it from the stream that had it)
        prefilled = _prefill(model, pc, ids, stats.cached_tokens, stopped, told if progress is not None else None)
        if prefilled is None:
            stats.prefill_seconds = time.perf_counter() - t0
            yield event([], None, "cancelled")
            return
        logits, h = prefilled
        token = sampler(logits, len(ids))  # positions: the sequence index each drawn token takes (sampling.py)
        first = token.item()
        stats.prefill_seconds = time.perf_counter() - t0
    except BaseException:
        # Drop only a chunk cut short (its keys may be in some layers, its ids are not): the chunks read before it
        # stay, a valid prefix the next prompt reuses, as where should_stop ends the reading. This rolled back to
        # the cache's length before the call, so Ctrl-C (or closing the stream at its "cancelled" event) in the
        # 2,000th token of a prompt dropped all it had read, and a windowed layer that had freed old keys since
        # then could not be rolled back: the whole conversation's cache started over.
        if pc.user is owner:  # (closed at the "cancelled" event after another call took the cache: leave it)
            pc.truncate(len(pc.ids))
        raise
    if first in eos:
        yield event([], None, "eos")
        return
    stats.new_tokens = 1
    reason = "length" if max_tokens == 1 else None
    yield event([first], None, reason)
    if reason:
        return

    # ---- decode: `token` is the latest emitted token, not yet in the cache ---------------
    # `kind`: the adaptive controller's choice for the coming step ("plain", "lookup" or "draft"),
    # None until made; a plain step that pipelines its successor makes it in advance.
    token_id, ahead, kind = first, None, None
    context = ContextIndex()  # fixed drafting's copy source (the controller keeps its own)
    # fixed drafting's copy length: grows while copies are accepted whole, within a step's draft limit
    copy_length = CopyLength(lookup, limit=MAX_DRAFT_TOKENS)
    try:
        while True:
            if pc.user is not owner:  # another call used the cache while this stream was paused
                raise SettingError(taken)
            if stopped():
                yield event([], None, "cancelled")
                return
            room = limit - len(pc.ids)  # positions left for tokens fed to the model
            if room < 1:
                yield event([], None, "context")
                return
            start = len(pc.ids)
            t_step = time.perf_counter()
            # What the controller may draft: a step outputs at most max_tokens - new_tokens tokens (its
            # accepted drafts and the base model's own), so drafts past that are verified for nothing.
            ctl_room = min(room, max_tokens - stats.new_tokens)
            if ctl is not None and kind is None:
                kind = ctl.next_step(pc.ids + [token_id], True, ctl_room)
            try:
                if mode == "ar" or kind == "plain":
                    # One token per step, pipelined as mlx-lm does: the next step's forward is queued
                    # (async_eval) before this step's token is read back, so graph building and
                    # device work overlap. A queued token sits in the cache ahead of `pc.ids` until
                    # the next step records it; `finally` below drops it if generation ends first.
                    # The adaptive controller pipelines only while the next step stays plain.
                    steady = ahead is not None
                    if ahead is None:
                        logits, h = model(token.reshape(1, 1), pc.cache)
                        ahead = sampler(logits[0, -1], len(pc.ids) + 1)  # (`token` is at len(pc.ids))
                        # queued on its own, as mlx-lm does: read back below, it then waits for
                        # this forward alone, not for the successor queued after it too
                        mx.async_eval(ahead)
                    pc.ids.append(token_id)
                    after, kind = None, None
                    if room >= 2 and stats.new_tokens + 1 < max_tokens and (
                            ctl is None or (kind := ctl.next_step(pc.ids, False, ctl_room - 1)) == "plain"):
                        logits, h = model(ahead.reshape(1, 1), pc.cache)
                        after = sampler(logits[0, -1], len(pc.ids) + 1)  # (`ahead` is at len(pc.ids) now)
                        mx.async_eval(after)
                    new = [ahead.item()]
                    token, ahead = ahead, after
                    step = StepStats(emitted=1, parked=ctl is not None)
                    copied = np.zeros(0, dtype=bool)
                    if ctl is not None and steady and after is not None:
                        # Only a step in the middle of a pipelined run times a plain step: the
                        # last one (the next step drafts, nothing is queued) reads back a forward
                        # that ran during the step before, in ~10 ms on the 2-core CPU against
                        # ~57, and those readings held the estimate 10-20% low, so drafting that
                        # paid was judged slower than plain decoding and parked.
                        ctl.observe_plain(time.perf_counter() - t_step)
                else:
                    t_draft = time.perf_counter()
                    plan = None
                    if ctl is not None:
                        # The controller drafts a candidate tree (the drafter's and the copy's nodes)
                        # and keeps what pays on this machine; `plan.rows` are its root-to-leaf rows.
                        plan = ctl.plan(kind, drafter, model, h, token_id, pc.ids + [token_id], ctl_room,
                                        graph=graph, context_graph=context_graph)
                        beams_np, drafted = plan.rows, plan.drafted
                        sources_np, aliases = None, plan.aliases
                        if graph is not None:
                            sources_np = np.append(plan.source, -1)[plan.node_at]  # node -1 (root, past the end): -1
                    else:
                        # Draft W beams of L tokens (or a dynamic tree of up to `tree` nodes, W wide,
                        # L - 1 deep) from h, the hidden state at the last cached token.
                        L = min(beam_length, room)
                        ctx_ids = pc.ids + [token_id]
                        if budget and graph is not None and context_graph:
                            # the root is a node of the context graph: its copy is cut by calibrated probability
                            copy = root_copy(context.match(ctx_ids, min(copy_length.cap, room - 1)), tree_min_prob)
                        else:
                            copy = context.match(ctx_ids, min(copy_length.length, room - 1)).copy  # (C,)
                        sources_np, aliases = None, 0
                        if budget and graph is not None:
                            g = graph_search(drafter, model, h, token_id, beam_width, L - 1, budget, tree_min_prob,
                                             graph, ctx_ids, context if context_graph else None, min(lookup, room - 1))
                            beams_np, sources_np, aliases, drafted = g.rows, g.sources, g.aliases, g.drafted
                        elif budget:
                            beams_np = tree_search(drafter, model, h, token_id, beam_width, L - 1, budget, tree_min_prob)
                            drafted = tree_nodes(beams_np)
                        else:
                            beams = beam_search(drafter, model, h, token, beam_width, L, draft_top_k)  # (W, L)
                            beams_np = np.array(beams)
                            drafted = beam_width * (L - 1)
                        rows = beams_np.shape[0]  # the drafter's rows; the lookup beam comes after them
                        if copy.size:  # one more (ragged) beam: root, then the copy
                            beams_np = add_beam(beams_np, copy)  # (rows + 1, max(L, C + 1))
                            drafted += copy.size
                    t_verify = time.perf_counter()
                    # Merge shared prefixes, verify all beams in one forward pass.
                    tree = pack(beams_np)
                    positions = mx.array(start + tree.depth, dtype=mx.int32)
                    mask = mx.array(tree.mask)
                    logits, hidden = model(mx.array(tree.tokens)[None], pc.cache, positions=positions, mask=mask)
                    # (P,) the base model's pick after each node, drawn as plain decoding draws there
                    choices = np.array(sampler(logits[0], start + tree.depth + 1))
                    # Accept the longest path the base model agrees with; keep only its K/V.
                    path, bonus = accept(tree, choices)
                    pc.cache.commit(start, path)
                    pc.ids.extend(int(t) for t in tree.tokens[path])
                    h = hidden[0, path[-1]]
                    mx.async_eval(h)  # the next step drafts from it, perhaps on another thread (see event)
                    token = mx.array(bonus, dtype=mx.int32)
                    new = [int(t) for t in tree.tokens[path[1:]]] + [bonus]
                    beam = beam_of(tree, path)
                    t_done = time.perf_counter()
                    grafted = graft_accepted = 0
                    if sources_np is not None:  # graph drafting: which packed nodes were grafted
                        grafted, graft_accepted = graft_counts(tree, sources_np, path)
                    if plan is not None:
                        node = np.full(tree.size, -1, dtype=np.int64)  # packed index -> candidate node
                        valid = tree.unpacker >= 0
                        node[tree.unpacker[valid]] = plan.node_at[valid]
                        on_path = node[path[1:]]
                        copied = plan.from_lookup[on_path] & (plan.draft_bucket[on_path] < 0)
                        ctl.observe(kind, plan, on_path, tree.size, t_verify - t_draft, t_done - t_verify)
                        # the host work this step did outside drafting and verifying: deciding it (where the step
                        # before drafted too; after a plain step, that step's time holds it) and learning from it
                        ctl.observe_overhead(t_draft - t_step + time.perf_counter() - t_done)
                    else:
                        copied = context_only(tree, rows, path, sources_np)
                        copy_length.update(copy.size, copy_taken(tree, rows, path) if copy.size else 0)
                    kind = None
                    step = StepStats(
                        emitted=len(new),
                        drafted=drafted,
                        packed=tree.size,
                        accepted=len(path) - 1,
                        beam=beam,
                        depth=int(tree.depth.max()),
                        draft_seconds=t_verify - t_draft,
                        verify_seconds=t_done - t_verify,
                        aliases=aliases,
                        grafted=grafted,
                        graft_accepted=graft_accepted,
                    )
            except BaseException:
                pc.truncate(start)
                raise
            token_id = new[-1]
            pc.cache.drop_old()
            # ---- stopping rules over this step's tokens ------------------------------------
            reason = None
            for i, t in enumerate(new):
                if t in eos:
                    new, reason = new[:i], "eos"
                    break
            if stats.new_tokens + len(new) >= max_tokens:
                new, reason = new[: max_tokens - stats.new_tokens], "length"
            step.emitted = len(new)
            # Drafts accepted past max_tokens or an end token are not output: not counted (a copy
            # can run far past the output's end in a loop; replay counts the output only).
            step.accepted = min(step.accepted, step.emitted)
            # (`copied` holds one flag per accepted draft token, in output order: clipped by position)
            step.looked_up = int(np.sum(copied[: step.emitted]))
            step.graft_accepted = min(step.graft_accepted, step.emitted)
            step.ended = reason == "eos"
            step.seconds = time.perf_counter() - t_step
            stats.add(step)
            yield event(new, step, reason)
            if reason:
                return
    finally:
        if pc.user is owner:  # (else the cache is another stream's now, with its own pipelined token)
            pc.cache.trim_to(len(pc.ids))  # drop a pipelined token nobody will read
        if ctl is not None:
            heal_cached(loaded, ctl.costs)  # a cached curve far slower than this run: measure it again next time


_SETTINGS = [name for name in inspect.signature(stream).parameters if name not in ("loaded", "prompt")]  # for _check_names


def generate(loaded, prompt, **kwargs) -> Generation:
    """Run `stream` to the end, with its settings and checks (see help(stream)); returns a Generation:
    text, tokens, prompt_tokens, stats, finish_reason ("eos", "length", "context" or "cancelled"),
    events and step_stats."""
    _check_names("generate", kwargs)
    _check_loaded("generate", loaded)
    text, tokens, steps, last, events, prompt_ids = [], [], [], None, 0, None
    for last in stream(loaded, prompt, **kwargs):
        if events == 0:
            prompt_ids = last.prompt_ids  # the ids stream read (rendering the template again could differ)
        events += 1
        text.append(last.text)
        tokens.extend(last.tokens)
        if last.step is not None:
            steps.append(last.step)
    return Generation("".join(text), tokens, prompt_ids, last.stats, last.finish_reason, events, steps)


# help(generate), an editor's hints and inspect read stream's settings, not **kwargs (which said nothing of them)
generate.__signature__ = inspect.signature(stream).replace(return_annotation=Generation)
