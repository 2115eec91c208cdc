"""The ReDrafter draft head (arXiv 2403.09919, section 3.1) as an MLX module, with save/load.

Inputs: h, the base model's last hidden state (after its final norm) at the last accepted
token, and e_k, the base model's own input embedding of the k-th token of a draft. Then

    s_0 = 0,   s_k = silu(W e_k + U s_{k-1} + b)        (rnn=True; rnn=False: s_k = e_k + s_{k-1})
    x   = [h, s_k]                                       (2 * hidden_size)
    x   = input_proj(x)                                  (only when exit_dim != 2 * hidden_size)
    x   = x + silu(Linear(x))                            (num_draft_layers times)
    logits = Linear(x)                                   ("own": exit_dim -> vocab, Apple's format)
           | base.logits(Linear(x))                      ("shared": exit_dim -> hidden, then the
                                                          base model's own output embedding)

On disk: a folder with config.json + model.safetensors, tensor names as in Apple's release
(`rnn_u.weight`, `rnn_u.bias`, `rnn_w.weight`, `lm_head.{i}.linear.weight|bias`,
`lm_head.{N}.weight`, optional `input_proj.*`).

Draft vocabulary (our addition, optional): `draft_vocab` (int32 ids) restricts drafting to a
subset of tokens. The vocabulary projection is the largest cost of a draft step (for
SmolLM2, 49152 x 576 per beam per depth); projecting onto the few thousand tokens the base
model actually writes makes drafting several times cheaper. It never affects correctness:
verification always uses the base model's full distribution.
"""

import json
import math
import shutil
from pathlib import Path
from typing import Union

import mlx.core as mx
import mlx.nn as nn

from .config import COPY_DRAFTER_AGAIN, DRAFTER_MODEL_TYPE, DrafterArgs, drafter_inside
from .errors import CorruptModelError, DrafterMismatchError, ModelNotFoundError, UnsupportedModelError, one_line
from .files import read_json_object, refuse_lfs_pointer, replace_folder, staging_folder


class ResBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim, bias=True)

    def __call__(self, x):
        return x + nn.silu(self.linear(x))


class Drafter(nn.Module):
    def __init__(self, args: DrafterArgs):
        super().__init__()
        self.args = args
        h = args.hidden_size
        if args.rnn:
            self.rnn_u = nn.Linear(h, h, bias=True)
            self.rnn_w = nn.Linear(h, h, bias=False)
        if args.exit_dim != 2 * h:
            self.input_proj = nn.Linear(2 * h, args.exit_dim, bias=True)
        out_dim = args.vocab_size if args.lm_head == "own" else h
        self.lm_head = [ResBlock(args.exit_dim) for _ in range(args.num_draft_layers)]
        self.lm_head.append(nn.Linear(args.exit_dim, out_dim, bias=False))
        if args.draft_vocab_size:
            self.draft_vocab = mx.arange(args.draft_vocab_size, dtype=mx.int32)
            self.freeze(keys=["draft_vocab"], recurse=False)  # ids, not weights
        self._projection = None  # (key, function) cache for draft_logits

    def set_draft_vocab(self, ids):
        """Restrict drafting to `ids` (None: the whole vocabulary)."""
        if ids is None:
            if "draft_vocab" in self:
                del self["draft_vocab"]
            self.args.draft_vocab_size = 0
        else:
            self.draft_vocab = mx.array(ids, dtype=mx.int32)
            self.freeze(keys=["draft_vocab"], recurse=False)
            self.args.draft_vocab_size = int(self.draft_vocab.size)
        self._projection = None

    def update_state(self, emb: mx.array, state: mx.array) -> mx.array:
        """s_k from e_k and s_{k-1}: (..., hidden) -> (..., hidden)."""
        if self.args.embed_scale != 1.0:
            emb = emb * mx.array(self.args.embed_scale, dtype=emb.dtype)
        if self.args.rnn:
            return nn.silu(self.rnn_w(emb) + self.rnn_u(state))
        return emb + state

    def features(self, h: mx.array, state: mx.array) -> mx.array:
        """The residual blocks' output: (..., hidden) x2 -> (..., exit_dim)."""
        x = mx.concatenate([h, state], axis=-1)
        if "input_proj" in self:
            x = self.input_proj(x)
        for layer in self.lm_head[:-1]:
            x = layer(x)
        return x

    def logits(self, h: mx.array, state: mx.array, base=None) -> mx.array:
        """Draft logits over the whole vocabulary (..., V). `base` is needed for lm_head='shared'."""
        x = self.lm_head[-1](self.features(h, state))
        if self.args.lm_head == "shared":
            x = self._base(base).logits(x.astype(_activation_dtype(base)))
        return x

    def _base(self, base):
        if base is None:
            raise ValueError("a drafter with lm_head='shared' needs the base model to compute logits")
        return base

    def _draft_projection(self, base):
        """(..., exit_dim) -> logits over the draft vocabulary, with the weights gathered once."""
        return self._projections(base)[1]

    def vocab_logits(self, hidden: mx.array, base) -> mx.array:
        """The base model's own logits over the draft vocabulary for its hidden states
        (..., hidden_size) -> (..., V_draft): the teacher's view of what the head drafts
        ('shared' heads only; used for distillation targets)."""
        if self.args.lm_head != "shared":
            raise ValueError("vocab_logits needs a drafter with lm_head='shared'")
        return self._projections(self._base(base))[0](hidden)

    def _projections(self, base):
        """(project, draft): project maps (..., hidden) to logits over the draft vocabulary
        through the base model's output embedding ('shared'; for 'own' it is the head's own
        output layer), draft maps the head's features (..., exit_dim) to draft logits."""
        key = (id(base), int(self.draft_vocab.size) if "draft_vocab" in self else 0)
        if self._projection is not None and self._projection[0] == key:
            return self._projection[1]
        project = None
        if "draft_vocab" not in self:
            fn = self.lm_head[-1]
            if self.args.lm_head == "shared":
                dtype = _activation_dtype(base)
                project = base.logits
                fn = lambda x: base.logits(self.lm_head[-1](x).astype(dtype))  # noqa: E731
        else:
            ids = self.draft_vocab
            if self.args.lm_head == "own":
                layer = self.lm_head[-1]
            else:
                layer = base.lm_head if base.lm_head is not None else base.embed_tokens
            if hasattr(layer, "scales"):  # quantized: gather rows of the packed weight and their scales
                w, s, b = layer.weight[ids], layer.scales[ids], layer.biases[ids]
                gs, bits = layer.group_size, layer.bits
                mx.eval(w, s, b)
                project = lambda x: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)  # noqa: E731
            else:
                w = layer.weight[ids]
                mx.eval(w)
                project = lambda x: x @ w.T  # noqa: E731
            if self.args.lm_head == "own":
                fn = project
            else:
                dtype = _activation_dtype(base)
                fn = lambda x: project(self.lm_head[-1](x).astype(dtype))  # noqa: E731
        self._projection = (key, (project, fn))
        return project, fn

    def draft_logits(self, h: mx.array, state: mx.array, base=None) -> mx.array:
        """Logits over the draft vocabulary, (..., V_draft); index i is token `draft_vocab[i]`
        when a draft vocabulary is set, token i otherwise."""
        if self.args.lm_head == "shared":
            self._base(base)
        return self._draft_projection(base)(self.features(h, state))

    def __call__(self, h: mx.array, embeddings: mx.array, base=None) -> mx.array:
        """Teacher-forced logits for training: h (B, T, H), embeddings (B, T, K, H) of the K
        tokens following each position -> logits (B, T, K, V); row k predicts the token
        after the k-th embedded one."""
        state = mx.zeros_like(embeddings[..., 0, :])
        states = []
        for k in range(embeddings.shape[-2]):
            state = self.update_state(embeddings[..., k, :], state)
            states.append(state)
        states = mx.stack(states, axis=-2)  # (B, T, K, H)
        hk = mx.broadcast_to(h[..., None, :], states.shape)
        return self.logits(hk, states, base)


def _activation_dtype(base) -> mx.Dtype:
    """The dtype the base model computes in."""
    return base.activation_dtype


def new_drafter(base_args, exit_dim: int = None, num_draft_layers: int = 1, lm_head: str = "own", rnn: bool = True, seed: int = 0):
    """A randomly initialised drafter sized for a base model's args."""
    mx.random.seed(seed)
    args = DrafterArgs(
        hidden_size=base_args.hidden_size,
        vocab_size=base_args.vocab_size,
        exit_dim=exit_dim,
        num_draft_layers=num_draft_layers,
        lm_head=lm_head,
        rnn=rnn,
        embed_scale=getattr(base_args, "embed_scale", 1.0),
        base_model_type=getattr(base_args, "model_type", ""),
    )
    return Drafter(args)


DRAFTER_ADVICE = "use the drafter trained for this model (or --no-drafter; in Python, use_drafter=False)"


def check_compatible(args: DrafterArgs, base_args, where: str = "drafter", advice: str = DRAFTER_ADVICE):
    if args.base_model_type and args.base_model_type != base_args.model_type:
        raise DrafterMismatchError(
            f"{where} was trained for a {args.base_model_type!r} base model, not this {base_args.model_type!r} one: "
            + advice
        )
    if args.hidden_size != base_args.hidden_size or args.vocab_size != base_args.vocab_size:
        raise DrafterMismatchError(
            f"{where} was trained for a base model with hidden size {args.hidden_size} and "
            f"vocabulary {args.vocab_size}, but this base model has hidden size {base_args.hidden_size} and "
            f"vocabulary {base_args.vocab_size}: " + advice
        )


def drafter_args(config: dict, where) -> DrafterArgs:
    """The checked DrafterArgs of a drafter's config.json (`where`, which every error names)."""
    kind = config.get("model_type")
    if kind not in (None, "", DRAFTER_MODEL_TYPE):  # a base model's folder: its sizes fit, its tensors did not
        raise CorruptModelError(f"{where} is not a drafter config but a {kind!r} model's (a base model's folder?): "
                                "give the drafter's folder, the one with the draft head's config.json")
    try:
        args = DrafterArgs.from_dict(config)
    except TypeError as e:  # a field missing
        raise CorruptModelError(f"{where} is not a drafter config: {e}") from e
    except UnsupportedModelError as e:  # an lm_head of another kind
        raise UnsupportedModelError(f"{where}: {e}") from e
    check_args(args, where)
    return args


def check_args(args: DrafterArgs, where) -> None:
    """Refuse a drafter config whose sizes or embedding scale no drafter can have."""
    for key in ("hidden_size", "vocab_size", "exit_dim", "num_draft_layers", "draft_vocab_size"):
        value = getattr(args, key, 0)
        if value is None and key == "draft_vocab_size":  # null: no draft vocabulary
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:  # (a null size failed later)
            raise CorruptModelError(f"{where}: {key} must be a whole number, not {value!r}")
    scale = args.embed_scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise CorruptModelError(f"{where}: embed_scale must be a finite number, not {scale!r}")


def check_draft_vocab(drafter: Drafter) -> None:
    """ValueError unless the loaded draft vocabulary holds token ids of the base vocabulary
    (a negative one crashed the process at the first draft)."""
    if not drafter.args.draft_vocab_size:
        return
    ids = drafter.draft_vocab
    if not mx.issubdtype(ids.dtype, mx.integer):
        raise ValueError(f"draft_vocab holds {ids.dtype} values, not token ids")
    if int(ids.min()) < 0 or int(ids.max()) >= drafter.args.vocab_size:
        raise ValueError(f"draft_vocab holds ids outside the vocabulary (0 to {drafter.args.vocab_size - 1})")


def load_drafter(path: Union[str, Path], base=None, advice: str = DRAFTER_ADVICE) -> Drafter:
    """Load a drafter folder; when `base` is given, refuse one that does not fit it (saying `advice`)."""
    path = Path(path).expanduser()
    cfg_path = path / "config.json"
    if path.is_file():  # it said "no drafter at d/config.json: expected d/config.json/config.json"
        raise ModelNotFoundError(f"{path} is a file: a drafter is the folder that holds config.json and "
                                 "model.safetensors")
    if not cfg_path.is_file() and (path / "model.safetensors").is_file():
        raise ModelNotFoundError(f"drafter at {path} has no config.json (its settings): {COPY_DRAFTER_AGAIN}")
    if not cfg_path.is_file():  # (train's --out holds its drafter in drafter/: it was not said)
        raise ModelNotFoundError(f"no drafter at {path}: expected {cfg_path}{drafter_inside(path)}")
    config = read_json_object(cfg_path, "drafter config")
    if config.get("model_type") not in (None, "", DRAFTER_MODEL_TYPE) and drafter_inside(path):
        raise CorruptModelError(f"{path} is a model folder, not a drafter{drafter_inside(path)}")
    args = drafter_args(config, cfg_path)
    if base is not None:
        check_compatible(args, base.args, f"the drafter at {path}", advice)
    weights_path = path / "model.safetensors"
    if not weights_path.is_file():
        raise ModelNotFoundError(f"drafter at {path} has no model.safetensors (its weights): {COPY_DRAFTER_AGAIN}")
    try:
        weights = mx.load(str(weights_path))
    except Exception as e:
        refuse_lfs_pointer(weights_path)  # it said "Invalid json header length"
        # (a damaged file was said in the reader's words alone, with nothing to do)
        raise CorruptModelError(f"cannot read {weights_path}: {one_line(e)} (damaged? {COPY_DRAFTER_AGAIN})") from e
    drafter = Drafter(args)
    try:
        drafter.load_weights(list(weights.items()), strict=True)
        check_draft_vocab(drafter)
    except ValueError as e:
        raise CorruptModelError(f"drafter weights in {weights_path} do not fit its config: {one_line(e)}") from e
    dtype = _activation_dtype(base) if base is not None else mx.float32
    drafter.set_dtype(dtype)  # floating parameters only; draft_vocab stays int32
    mx.eval(drafter.parameters())
    return drafter


def save_drafter(drafter: Drafter, path: Union[str, Path], extra_config: dict = None):
    """Write config.json + model.safetensors atomically (temp folder, then rename)."""
    from mlx.utils import tree_flatten

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_folder(path)
    try:
        config = drafter.args.to_dict()
        config.update(extra_config or {})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        mx.save_safetensors(str(tmp / "model.safetensors"), dict(tree_flatten(drafter.parameters())), metadata={"format": "mlx"})
        replace_folder(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
