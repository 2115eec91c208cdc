"""Configuration dataclasses.

`from_dict` ignores unknown keys (the mlx-lm habit).
"""

import inspect
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

from .errors import CorruptModelError, UnsupportedModelError

# The weight formats `load` takes (loader.py): here, where every command line can offer them
# without importing the loader (and mlx-lm, transformers: seconds before `--help` answered).
FLOAT_FORMATS = ("float32", "float16", "bfloat16")
WEIGHT_FORMATS = ("auto", "stored", *FLOAT_FORMATS)
# The model_type a drafter's config.json holds (ours and Apple's release): how a drafter folder is told from a model's.
DRAFTER_MODEL_TYPE = "recurrent_drafting_drafter"
def drafter_inside(path) -> str:
    """' (PATH/drafter holds one: pass that folder)' where a folder given as a drafter is not one but holds one in
    drafter/ (redrafter-train's --out, a model folder), else ''."""
    from pathlib import Path

    inner = Path(path).expanduser() / "drafter"
    return f" ({inner} holds one: pass that folder)" if (inner / "config.json").is_file() else ""


# What a drafter folder whose weights are missing or damaged says to do.
COPY_DRAFTER_AGAIN = "copy the whole drafter folder again, config.json with its model.safetensors"


def train_drafter(name) -> str:
    """The command that trains a drafter for the model `name` (a registry name, path or hub id) and installs it where
    load() finds it: what an error about a model with no drafter offers beside --drafter PATH, which a user whose
    model has none has no PATH for."""
    import shlex

    return f"redrafter-train --model {shlex.quote(str(name))}"


# Positions are int32 in MLX; larger contexts than any model has are a damaged config.
MAX_CONTEXT = 2**31 - 1


@dataclass
class BaseArgs:
    @classmethod
    def from_dict(cls, params: Dict[str, Any]):
        params = cls.normalize(dict(params))
        known = inspect.signature(cls).parameters
        missing = [k for k, p in known.items() if p.default is inspect.Parameter.empty and k not in params]
        if missing:  # it said "DrafterArgs.__init__() missing 2 required positional arguments: ..."
            raise TypeError(f"it lacks {', '.join(missing)}")
        return cls(**{k: v for k, v in params.items() if k in known})

    @classmethod
    def normalize(cls, params: Dict[str, Any]) -> Dict[str, Any]:
        """Map other spellings of a config onto the fields (a hook for subclasses)."""
        return params

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class ModelArgs(BaseArgs):
    """What the library needs to know of a base model, whatever its family. Built by
    `base_model.TreeModel` from the model itself; `from_config` reads it from a config.json
    alone (for tools that do not build the model)."""

    model_type: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = True
    # The factor the family's decoder multiplies input embeddings by (Gemma: sqrt(hidden_size)).
    embed_scale: float = 1.0

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "ModelArgs":
        text = config.get("text_config") or {}

        def get(key, default=None):
            return config.get(key, text.get(key, default))

        missing = [k for k in ("model_type", "hidden_size", "vocab_size", "num_hidden_layers") if get(k) is None]
        if missing:
            raise UnsupportedModelError(f"config.json lacks {', '.join(missing)}")
        from .base_model import SCALED_EMBEDDINGS

        model_type = str(get("model_type"))
        try:
            hidden = int(get("hidden_size"))
            context = int(get("max_position_embeddings", 4096) or 4096)  # 0 or null: not given
            if not 2 <= context <= MAX_CONTEXT:  # 1e30 was taken as is and failed later, in the tokenizer
                raise ValueError(f"max_position_embeddings {context} (a context of fewer than 2 tokens or "
                                 f"more than {MAX_CONTEXT})")
            check_head_counts(config)
            return cls(model_type=model_type, hidden_size=hidden, vocab_size=int(get("vocab_size")),
                       num_hidden_layers=int(get("num_hidden_layers")),
                       max_position_embeddings=context,
                       tie_word_embeddings=bool(get("tie_word_embeddings", True)),
                       embed_scale=hidden**0.5 if model_type in SCALED_EMBEDDINGS else 1.0)
        except (TypeError, ValueError, OverflowError) as e:
            raise CorruptModelError(f"config.json holds a size that is not a usable number: {e}") from e


def check_head_counts(config: Dict[str, Any], where: str = "config.json"):
    """0 attention heads failed later: in mlx-lm with a ZeroDivisionError, in the converter as the
    tokenizer's fault. A CorruptModelError that names the key (and `where`, the config's file)."""
    text = config.get("text_config") or {}
    for key in ("num_attention_heads", "num_key_value_heads"):
        value = config.get(key, text.get(key))
        try:
            usable = value is None or int(value) >= 1
        except (TypeError, ValueError, OverflowError):
            usable = False
        if not usable:
            raise CorruptModelError(f"{where} holds a size that is not a usable number: {key} {value}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class DrafterArgs(BaseArgs):
    """ReDrafter head configuration (paper section 3.1; field names follow Apple's release).

    hidden_size: the base model's hidden size (input h, token embeddings, RNN state).
    vocab_size: the base model's vocabulary.
    exit_dim: width of the residual blocks. The head's input is [h, s_k] (2 * hidden_size);
        when exit_dim differs, an `input_proj` maps it to exit_dim.
    num_draft_layers: number of `x + silu(Linear(x))` residual blocks.
    rnn: s_k = silu(W e_k + U s_{k-1} + b) when True, s_k = e_k + s_{k-1} when False.
    lm_head: "own" = a (vocab_size, exit_dim) projection (Apple's format) or "shared" = a
        projection to hidden_size followed by the base model's own output embedding.
    """

    hidden_size: int
    vocab_size: int
    exit_dim: Optional[int] = None
    num_draft_layers: int = 1
    rnn: bool = True
    lm_head: str = "own"
    # Size of the draft vocabulary: when set, drafts use only these tokens (a `draft_vocab`
    # tensor of ids, e.g. the most frequent tokens of the base model's outputs), which makes
    # each draft step's vocabulary projection that much cheaper. 0 = the whole vocabulary.
    draft_vocab_size: int = 0
    # The scale of the token embeddings the head reads (the base family's own input scale,
    # e.g. sqrt(hidden_size) for Gemma; 1.0 for drafters from before this field).
    embed_scale: float = 1.0
    # The model_type of the base model it was trained for ("" = not recorded).
    base_model_type: str = ""
    model_type: str = DRAFTER_MODEL_TYPE

    def __post_init__(self):
        # (a size that is not a number is left for drafter.check_args to name with its file)
        if self.exit_dim is None or (_number(self.exit_dim) and self.exit_dim <= 0):
            self.exit_dim = 2 * self.hidden_size if _number(self.hidden_size) else None
        if self.lm_head not in ("own", "shared"):
            raise UnsupportedModelError(f"drafter lm_head must be 'own' or 'shared', not {self.lm_head!r}")
