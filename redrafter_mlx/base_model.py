"""Tree verification over mlx-lm's own model classes.

`TreeModel` wraps any attention-only mlx-lm model (llama, qwen, gemma, phi, mistral, MoE, ...)
and gives it the three things a packed tree of draft tokens needs that mlx-lm's forward lacks,
without any per-architecture model code:

- per-token positions: every rope module is wrapped (`_TreeRoPE`); during a tree forward it
  folds the tokens into the batch axis, so each token is rotated at its own depth, whatever
  offset the attention module passes; a learned position embedding (gpt2's `wpe`) is given the
  tokens' positions in place of the ones the decoder computes from cache.offset;
- a tree mask: mlx-lm asks the cache for its mask (`create_attention_mask` calls
  `cache.make_mask`), so our cache returns the cached prefix plus the tree's ancestor mask,
  with the layer's sliding window applied on positions;
- the hidden state after the final norm: the inner decoder (the module holding a token
  embedding and layers, under llama's names or others': EMBEDDING_NAMES, LAYER_NAMES) returns
  it, and logits come from the model's own head code (tied embeddings, softcapping, logit
  scaling), run on a given hidden state.

Plain forwards (prefill, plain decoding) run mlx-lm's code unchanged. Models whose caches
cannot branch over a tree (recurrent and hybrid layers) and families that compute
position-dependent terms outside rope are refused by name (`check_supported`).

`model(tokens, cache, positions, mask) -> (logits (B, T, V), hidden (B, T, hidden_size))`.
"""

import threading
from typing import Any, Dict, List, Optional, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models import rope_utils

from .cache import Cache
from .config import ModelArgs
from .errors import UnsupportedModelError

Mask = Union[None, str, mx.array]

# Families that mlx-lm runs but whose forward cannot verify a tree, and why.
REFUSED = {
    "ministral3": "it scales attention by a position-dependent factor computed from cache.offset outside rope",
    "mistral4": "it scales attention by a position-dependent factor computed from cache.offset outside rope",
    "llama4": "it scales attention by position outside rope and uses chunked attention",
    "llama4_text": "it scales attention by position outside rope and uses chunked attention",
    "muse_spark": "it rotates queries and keys in a fused kernel at cache.offset, not through its rope module",
    "gemma3n": "its decoder applies the output head itself, so the hidden state a draft head reads is not exposed",
    "phi3small": "its block-sparse layers build their own attention mask from the number of keys, not from positions",
    "nanochat": "it rotates queries and keys with mx.fast.rope at cache.offset in its attention code, not through a "
                "rope module",
    "talkie": "it rotates queries and keys with mx.fast.rope at cache.offset in its attention code, not through a "
              "rope module",
    "lille-130m": "its decoder applies the output head itself, so the hidden state a draft head reads is not exposed",
    "phixtral": "its decoder takes the attention mask from its caller and leaves the final norm to the output head",
}
# Families with recurrent (state-space, linear-attention) layers, as of mlx-lm 0.32: their
# state cannot branch over a tree. Any other family whose caches are not plain or sliding-window
# KV caches is refused too, when it is built (`_layer_windows`).
RECURRENT = {
    "baichuan_m1", "bailing_hybrid", "bailing_moe_linear", "falcon_h1", "granitemoehybrid", "jamba", "kimi_linear",
    "lfm2", "lfm2_moe", "mamba", "mamba2", "nemotron_h", "olmo_hybrid", "plamo2", "qwen3_5", "qwen3_next",
    "recurrent_gemma", "rwkv7",
}
# Families whose decoder multiplies the input embeddings by sqrt(hidden_size): a draft head
# for them reads the embeddings at that scale (recorded in the drafter's config).
SCALED_EMBEDDINGS = {"gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma4", "gemma4_text", "recurrent_gemma"}
# Families that build 5-D (B, kv heads, repeats, T, S) attention scores by hand: a batched mask
# needs two singleton axes.
FIVE_D_SCORES = {"gemma2"}
# Rope classes that take an array offset (one position per batch row) as mx.fast.rope does.
_ARRAY_OFFSET_ROPES = (nn.RoPE, rope_utils.SuScaledRoPE, rope_utils.Llama3RoPE, rope_utils.YarnRoPE,
                       rope_utils.ProportionalRoPE)


class TreeState:
    """What one tree forward tells the rope wrappers and the caches (None outside one)."""

    def __init__(self):
        self.positions: Optional[mx.array] = None  # (B * T,) int32, row-major over (B, T)
        self.batch = 0  # B
        self.mask: Optional[mx.array] = None  # (B' in {1, B}, T, T or offset + T) bool
        self.five_d = False
        self.key_bucket = 0  # > 0: caches return keys padded to a multiple of this (shape buckets)
        self._host: Optional[np.ndarray] = None
        # One step of one generation at a time per model (generate.stream): two threads' trees
        # through this shared state broke verification (a rope error, or a reply unlike plain decoding).
        self.lock = threading.RLock()

    @property
    def active(self) -> bool:
        return self.positions is not None

    def begin(self, positions: mx.array, mask: mx.array):
        self.positions, self.batch, self.mask, self._host = positions.reshape(-1), positions.shape[0], mask, None

    def end(self):
        self.positions = self.mask = self._host = None

    @property
    def host_positions(self) -> np.ndarray:
        """The positions on the host, (B * T,): read back only by ropes that need Python ints."""
        if self._host is None:
            self._host = np.array(self.positions)
        return self._host


def _is_rope(module) -> bool:
    if isinstance(module, _TreeRoPE):
        return False
    name = type(module).__name__.lower()
    return isinstance(module, _ARRAY_OFFSET_ROPES) or "rope" in name or "rotary" in name


class _TreeRoPE(nn.Module):
    """A rope module that, inside a tree forward, rotates each token at its own position."""

    def __init__(self, rope: nn.Module, state: TreeState):
        super().__init__()
        self._rope = rope  # underscore: not part of the parameter tree
        self._state = state
        self._array_offset = isinstance(rope, _ARRAY_OFFSET_ROPES)

    def __getattr__(self, name):
        """What model code reads off its rope (muse_spark: `self.rope.base`) is the wrapped rope's."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") or name == "_rope":
                raise
            return getattr(self._rope, name)

    def __call__(self, x, offset=0, **kwargs):
        st = self._state
        if not st.active:
            return self._rope(x, offset=offset, **kwargs)
        B, H, T, D = x.shape
        folded = x.transpose(0, 2, 1, 3).reshape(B * T, H, 1, D)
        if self._array_offset:
            out = self._rope(folded, offset=st.positions, **kwargs)
        else:  # the rope does Python arithmetic on the offset: one call per distinct position
            pos = st.host_positions
            order, parts = [], []
            for p in np.unique(pos):
                idx = np.nonzero(pos == p)[0]
                order.append(idx)
                parts.append(self._rope(folded[mx.array(idx)], offset=int(p), **kwargs))
            inverse = np.empty(pos.size, dtype=np.int32)
            inverse[np.concatenate(order)] = np.arange(pos.size, dtype=np.int32)
            out = mx.concatenate(parts, axis=0)[mx.array(inverse)]
        return out.reshape(B, T, H, D).transpose(0, 2, 1, 3)


class _HiddenStub:
    """Stands in for the inner decoder while the head runs on a given hidden state: calling it
    returns that state; any attribute (embed_tokens for tied heads, ...) is the real decoder's."""

    def __init__(self, inner, hidden):
        self._inner, self._hidden = inner, hidden

    def __call__(self, *args, **kwargs):
        return self._hidden

    def __getattr__(self, name):
        return getattr(self._inner, name)


# What a decoder's parts are called, tried in this order: mlx-lm's llama layout first, then the names other
# families give the same parts (gpt_neox: embed_in, h, final_layer_norm; internlm2: tok_embeddings, layers,
# norm, output; qwen: wte, h, ln_f, lm_head; dbrx: wte, blocks, norm_f).
EMBEDDING_NAMES = ("embed_tokens", "embed_in", "tok_embeddings", "word_embeddings", "token_embeddings", "wte",
                   "embedding")
LAYER_NAMES = ("layers", "h", "blocks")
NORM_NAMES = ("norm", "final_layer_norm", "ln_f", "norm_f", "output_norm")
HEAD_NAMES = ("lm_head", "output")
# An output head the decoder applies itself (gpt_neox), after its final norm: shadowed by the identity while
# the decoder runs, so the decoder returns the hidden state, and applied to it in `logits`.
DECODER_HEAD_NAMES = ("embed_out",)
# A learned position embedding the decoder adds to the token embeddings (gpt2, gpt_bigcode), indexed with
# positions it computes from cache.offset: inside a tree forward it is given each token's own position.
POSITION_EMBEDDING_NAMES = ("wpe",)


def _first(module: nn.Module, names) -> Optional[str]:
    return next((n for n in names if n in module and isinstance(module[n], (nn.Module, list))), None)


def _find_decoder(model: nn.Module, model_type: str) -> Tuple[nn.Module, nn.Module, str]:
    """(inner decoder, its parent, attribute name): breadth-first, the first module that holds
    both an embedding (EMBEDDING_NAMES) and layers (LAYER_NAMES)."""
    queue = [model]
    while queue:
        parent = queue.pop(0)
        for name, child in parent.children().items():
            if isinstance(child, nn.Module):
                if _first(child, EMBEDDING_NAMES) and _first(child, LAYER_NAMES):
                    return child, parent, name
                queue.append(child)
    raise UnsupportedModelError(
        f"{model_type!r} is not supported: its decoder keeps no token embedding ({', '.join(EMBEDDING_NAMES)}) "
        f"beside its layers ({', '.join(LAYER_NAMES)}), the layout that tree verification wraps"
    )


def _layer_windows(model: nn.Module, model_type: str) -> List[Optional[int]]:
    """Each layer's attention window (None = full), read from the caches mlx-lm would make;
    refuses caches that cannot branch over a tree."""
    if hasattr(model, "make_cache"):
        native = model.make_cache()
    else:
        native = [mlx_cache.KVCache() for _ in model.layers]
    windows = []
    for c in native:
        kind = type(c).__name__
        if type(c) is mlx_cache.KVCache:
            windows.append(None)
        elif isinstance(c, mlx_cache.RotatingKVCache) and not c.keep:
            windows.append(int(c.max_size))
        else:
            if kind in ("ArraysCache", "MambaCache"):
                why = (f"it keeps {kind}s (recurrent layers' states, or longcat_flash_ngram's token history), "
                       "which cannot branch over several candidate tokens")
            elif kind == "CacheList":  # not recurrent: e.g. a sparse-attention indexer's keys beside the layer's
                why = "its layers keep several caches each (a CacheList), which tree verification does not wrap"
            else:
                why = f"its layers keep a {kind}, which tree verification does not wrap"
            # Trimmable caches (a CacheList of KV caches: deepseek_v32, longcat_flash) mlx-lm does speculate on.
            trimmable = getattr(c, "is_trimmable", lambda: False)()
            raise UnsupportedModelError(f"{model_type!r} cannot verify a draft tree: {why}"
                                        + ("" if trimmable else " (mlx-lm refuses speculative decoding for it too)"))
    return windows


def check_supported(model_type: str, config: Optional[Dict[str, Any]] = None):
    """Refuses by name the families above, and wrappers (vision-language models such as mistral3)
    whose config's text_config names one of them: mlx-lm builds the inner model from it."""
    text = (config or {}).get("text_config")
    inner = str(text["model_type"]) if isinstance(text, dict) and text.get("model_type") is not None else None
    for name in (model_type, inner):
        if name is None:
            continue
        what = repr(model_type) if name == model_type else f"{model_type!r} (a {name!r} text model)"
        if name in RECURRENT:
            raise UnsupportedModelError(
                f"{what} is not supported: its recurrent layers keep a state that cannot branch over a draft "
                "tree (mlx-lm refuses speculative decoding for it too); run it with mlx-lm's plain generation"
            )
        if name in REFUSED:
            raise UnsupportedModelError(f"{what} is not supported: {REFUSED[name]}")


KEY_BUCKET = 256  # shape buckets: attended keys padded to a multiple of this (the cache's step)


def padded_size(n: int) -> int:
    """A tree of n tokens padded for shape buckets: the next power of two up to 64, then the
    next multiple of 64."""
    return 1 << max(n - 1, 0).bit_length() if n <= 64 else -(-n // 64) * 64


def _pad_tree(tokens: mx.array, pos: mx.array, mask: mx.array, pad: int):
    """`pad` more tokens after a tree's T: each attends only to itself (and the cache, when the
    mask covers only the new tokens); no real token attends to them."""
    B, T = tokens.shape
    Bm, _, W = mask.shape
    tokens = mx.concatenate([tokens, mx.zeros((B, pad), dtype=tokens.dtype)], axis=1)
    pos = mx.concatenate([pos, mx.broadcast_to(pos[:, -1:], (B, pad))], axis=1)
    bottom = np.zeros((pad, W + pad), dtype=bool)
    bottom[np.arange(pad), W + np.arange(pad)] = True
    top = mx.concatenate([mask, mx.zeros((Bm, T, pad), dtype=mx.bool_)], axis=-1)
    mask = mx.concatenate([top, mx.broadcast_to(mx.array(bottom), (Bm, pad, W + pad))], axis=1)
    return tokens, pos, mask


class TreeModel:
    """An mlx-lm model that verifies packed trees of draft tokens. `model` is mlx-lm's Model,
    `config` the config.json it was built from."""

    def __init__(self, model: nn.Module, config: Dict[str, Any]):
        self.model = model
        self.config = config
        model_type = str(config.get("model_type", getattr(getattr(model, "args", None), "model_type", "?")))
        check_supported(model_type, config)
        self.windows = _layer_windows(model, model_type)
        self.decoder, self._head_owner, self._decoder_name = _find_decoder(model, model_type)
        self._embed_name = _first(self.decoder, EMBEDDING_NAMES)
        self._layers_name = _first(self.decoder, LAYER_NAMES)
        self._decoder_head = _first(self.decoder, DECODER_HEAD_NAMES)
        self._position_embedding = _first(self.decoder, POSITION_EMBEDDING_NAMES)
        n_layers = len(self.layers)
        # Fewer caches than layers is the model's own design (gemma4's KV-shared layers reuse earlier layers'
        # keys, handed on by the model); more is not (layers run in loops, each pass with caches of its own).
        if len(self.windows) > n_layers:
            raise UnsupportedModelError(
                f"{model_type!r} cannot verify a draft tree: it keeps {len(self.windows)} caches for its {n_layers} "
                "layers, which tree verification cannot map to them"
            )
        self.state = TreeState()
        self.state.five_d = model_type in FIVE_D_SCORES
        self.shape_buckets = False  # see use_shape_buckets
        self._wrap_ropes()
        emb = self.embed_tokens
        vocab, hidden = (emb.num_embeddings, emb.dims) if hasattr(emb, "dims") else emb.weight.shape
        # The config's figures, with what the built model says about its shape taking precedence.
        self.args = ModelArgs.from_config({**config, "model_type": model_type, "hidden_size": int(hidden),
                                           "vocab_size": int(vocab), "num_hidden_layers": n_layers,
                                           "tie_word_embeddings": self.lm_head is None})

    def _wrap_ropes(self):
        for _, module in self.decoder.named_modules():
            for name, child in list(module.children().items()):
                if isinstance(child, nn.Module) and _is_rope(child):
                    setattr(module, name, _TreeRoPE(child, self.state))

    # ---- what the rest of the library uses -------------------------------------------------
    @property
    def layers(self) -> list:
        """The decoder layers, one cache each: mlx-lm's `Model.layers` (plamo's decoder holds them one
        module further down), else the decoder's."""
        layers = getattr(self.model, "layers", None)
        return layers if isinstance(layers, list) else self.decoder[self._layers_name]

    @property
    def embed_tokens(self) -> nn.Module:
        """The input embedding table (embed_tokens, or what the family calls it: EMBEDDING_NAMES)."""
        return self.decoder[self._embed_name]

    @property
    def lm_head(self) -> Optional[nn.Module]:
        """The untied output layer, None when the output reuses the input embeddings."""
        if self._decoder_head is not None:
            return self.decoder[self._decoder_head]
        name = _first(self._head_owner, HEAD_NAMES)
        return self._head_owner[name] if name is not None else None

    @property
    def activation_dtype(self) -> mx.Dtype:
        name = _first(self.decoder, NORM_NAMES)
        norm = self.decoder[name] if name is not None else None
        if norm is not None and "weight" in norm:
            return norm.weight.dtype
        return next(v.dtype for _, v in tree_flatten(self.decoder.parameters()) if mx.issubdtype(v.dtype, mx.floating))

    def __getattr__(self, name):
        """Anything else (parameters, load_weights, named_modules, ...) is mlx-lm's model's."""
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def use_shape_buckets(self, on: bool):
        """Pad tree forwards to a few shapes: the tree to a power of two (multiples of 64 past
        64) and the attended keys to a multiple of KEY_BUCKET, the padding masked out. Where
        every new (tree size, context length) pair costs a kernel compilation or a graph
        build (MLX's CUDA backend: 50-80 ms each, against 13 ms for the forward, measured on
        an H200), a growing context made every verification pay one; `costs.calibrate`
        measures whether this machine does and turns this on only there."""
        self.shape_buckets = bool(on)
        self.state.key_bucket = KEY_BUCKET if on else 0

    def make_cache(self) -> Cache:
        return Cache(len(self.windows), windows=self.windows, tree=self.state)

    def embed(self, tokens: mx.array) -> mx.array:
        """The input embedding table's rows for tokens, (...,) -> (..., hidden_size), unscaled."""
        return self.embed_tokens(tokens)

    def _run_decoder(self, tokens: mx.array, cache, pos: Optional[mx.array] = None) -> mx.array:
        """The decoder's hidden state after its final norm (without the head a decoder applies itself).
        pos: (B, T) the tokens' positions in a tree forward, for a learned position embedding.
        The shadows below are set on the shared decoder: callers hold self.state.lock."""
        shadows = {}  # instance attributes shadow the child modules of these names while the decoder runs
        if self._decoder_head is not None:
            shadows[self._decoder_head] = lambda h: h
        if pos is not None and self._position_embedding is not None:
            table = self.decoder[self._position_embedding]
            shadows[self._position_embedding] = lambda ids: table(pos)  # (B, T, D), not the ids from cache.offset
        for name, fn in shadows.items():
            object.__setattr__(self.decoder, name, fn)
        try:
            return self.decoder(tokens, cache=cache)
        finally:
            for name in shadows:
                object.__delattr__(self.decoder, name)

    def hidden(self, tokens: mx.array, cache: Optional[Cache] = None, positions: Optional[mx.array] = None,
               mask: Mask = None) -> mx.array:
        """Last hidden states after the final norm, (B, T, hidden_size). Appends to `cache`.

        tokens: (B, T) ids. positions: (T,) or (B, T) absolute positions, default
        cache.offset + arange(T). mask: None or "causal" for a causal chunk; a boolean array of
        shape (..., T, T) over the new tokens (each also sees the whole cache) or
        (..., T, offset + T) over all of them; True = may attend.
        """
        # One forward at a time per model: the tree state, and the head or position embedding
        # _run_decoder shadows on the decoder, are shared by every thread using this model (a plain
        # forward in one thread during another's tree forward rotated its tokens at the other's
        # positions, and the first to finish took the other's shadows away). MLX builds the graph
        # here and computes it later, so the lock is held for the building only.
        with self.state.lock:
            return self._hidden(tokens, cache, positions, mask)

    def _hidden(self, tokens: mx.array, cache: Optional[Cache], positions: Optional[mx.array], mask: Mask) -> mx.array:
        if tokens.ndim == 1:
            tokens = tokens[None]
        if positions is None and (mask is None or isinstance(mask, str)):
            return self._run_decoder(tokens, cache)
        B, T = tokens.shape
        if cache is None:
            cache = self.make_cache()
        offset = cache.offset
        if positions is None:
            positions = mx.arange(offset, offset + T)
        pos = mx.broadcast_to(mx.array(positions).astype(mx.int32), (B, T))
        if mask is None or isinstance(mask, str):
            mask = mx.tril(mx.ones((T, T), dtype=mx.bool_))
        if mask.dtype != mx.bool_:
            mask = mask > -1e4  # additive float mask: large negatives block
        if mask.shape[-1] not in (T, offset + T) or mask.shape[-2] != T:
            raise ValueError(f"mask of shape {mask.shape} fits neither {T} new tokens nor {offset + T} in all")
        mask = mask.reshape(-1, T, mask.shape[-1])
        if mask.shape[0] not in (1, B):
            raise ValueError(f"mask of shape {mask.shape} does not fit a batch of {B}")
        pad = padded_size(T) - T if self.shape_buckets else 0
        if pad:
            tokens, pos, mask = _pad_tree(tokens, pos, mask, pad)
        self.state.begin(pos, mask)
        try:
            h = self._run_decoder(tokens, cache, pos)
        finally:
            self.state.end()
        if pad:
            cache.trim_to(cache.offset - pad)  # the padding's keys and values are not history
            h = h[:, :T]
        return h

    def logits(self, hidden: mx.array) -> mx.array:
        """The model's own output head on hidden states: (..., hidden_size) -> (..., V)."""
        shape = hidden.shape
        h = hidden.reshape(-1, 1, shape[-1]) if hidden.ndim != 3 else hidden
        owner, name = self._head_owner, self._decoder_name
        stub = _HiddenStub(self.decoder, h)
        with self.state.lock:  # the shadow is seen by every thread using this model (see hidden)
            object.__setattr__(owner, name, stub)  # the instance attribute shadows the child module
            try:
                out = owner(mx.zeros(h.shape[:2], dtype=mx.int32))
            finally:
                object.__delattr__(owner, name)
        if isinstance(out, tuple):
            out = out[0]
        if self._decoder_head is not None:  # the head code above passed the decoder's output on as it was
            out = self.decoder[self._decoder_head](out)
        return out.reshape(*shape[:-1], out.shape[-1])

    def __call__(self, tokens: mx.array, cache: Optional[Cache] = None, positions: Optional[mx.array] = None,
                 mask: Mask = None) -> Tuple[mx.array, mx.array]:
        h = self.hidden(tokens, cache, positions, mask)
        return self.logits(h), h


# A small tree for the load-time self-check: node i's parent (-1 = the root), in topological order.
_CHECK_PARENTS = (-1, -1, 0, 0, 2)
_CHECK_PREFIX = 8
CHECK_TOLERANCE = 0.05  # relative logit error in float16 / bfloat16; wrong positions or masks give 0.3-0.5
CHECK_TOLERANCE_FLOAT32 = 1e-3  # in float32 (rounding alone gives < 1e-5): mistral4's offset-scaled attention gave 0.045


def self_check(model: TreeModel) -> Tuple[bool, float]:
    """Verify a small tree on the real weights against each of its paths run as a causal
    chunk through mlx-lm's own code. Returns (ok, max relative logit error). Guards
    losslessness against model code this adapter does not know (e.g. a new mlx-lm release)."""
    vocab = model.args.vocab_size
    prefix = mx.array([[(7 * i + 3) % vocab for i in range(_CHECK_PREFIX)]], dtype=mx.int32)
    tokens = [(11 * i + 5) % vocab for i in range(len(_CHECK_PARENTS))]
    depth, mask = [], np.zeros((len(tokens),) * 2, dtype=bool)
    for i, p in enumerate(_CHECK_PARENTS):
        depth.append(0 if p < 0 else depth[p] + 1)
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    cache = model.make_cache()
    model.hidden(prefix, cache)
    idle = [i for i, c in enumerate(cache) if c.offset != _CHECK_PREFIX]
    if idle:  # nemotron-nas makes a cache for an attention block replaced by a linear layer, which never fills it
        raise UnsupportedModelError(
            f"{model.args.model_type!r} cannot verify a draft tree: {len(idle)} of its {len(cache)} layer caches take "
            f"no keys (cache {idle[0]}: e.g. for attention replaced by a linear layer), so a draft cannot be rolled back"
        )
    tree_logits, _ = model(mx.array([tokens], dtype=mx.int32), cache,
                           positions=mx.array(_CHECK_PREFIX + np.array(depth)), mask=mx.array(mask))
    mx.eval(tree_logits)
    seq = cache  # the same prefix, the tree's keys and values taken off again (as decoding rewinds)
    seq.trim_to(_CHECK_PREFIX)
    worst = 0.0
    for leaf in range(len(tokens)):
        if leaf in _CHECK_PARENTS:
            continue
        path, j = [], leaf
        while j >= 0:
            path.append(j)
            j = _CHECK_PARENTS[j]
        # Root to leaf as one causal chunk (fed a token at a time, the paths cost 6 forwards, ~0.3 s of a load).
        path.reverse()
        logits, _ = model(mx.array([[tokens[n] for n in path]], dtype=mx.int32), seq)
        for i, node in enumerate(path):
            ref = logits[0, i].astype(mx.float32)
            got = tree_logits[0, node].astype(mx.float32)
            err = float(mx.abs(ref - got).max() / mx.maximum(mx.abs(ref).max(), 1e-6))
            worst = max(worst, err)
        seq.rewind(len(path))
    tolerance = CHECK_TOLERANCE_FLOAT32 if tree_logits.dtype == mx.float32 else CHECK_TOLERANCE
    return worst <= tolerance, worst
