"""Configuration dataclasses.

`LlamaArgs.from_dict` accepts a raw Hugging Face / mlx-lm `config.json` as is: unknown
keys are ignored (the mlx-lm habit), missing optional ones take Llama defaults.
"""

import inspect
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

from .errors import UnsupportedModelError

# Architectures whose HF config describes a plain pre-norm RMSNorm/SwiGLU/RoPE decoder.
LLAMA_FAMILY = {"llama", "mistral", "vicuna", "smollm", "smollm2"}


@dataclass
class BaseArgs:
    @classmethod
    def from_dict(cls, params: Dict[str, Any]):
        params = cls.normalize(dict(params))
        known = inspect.signature(cls).parameters
        return cls(**{k: v for k, v in params.items() if k in known})

    @classmethod
    def normalize(cls, params: Dict[str, Any]) -> Dict[str, Any]:
        """Map other spellings of a config onto the fields (a hook for subclasses)."""
        return params

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class LlamaArgs(BaseArgs):
    @classmethod
    def normalize(cls, params: Dict[str, Any]) -> Dict[str, Any]:
        # transformers >= 5 writes rope settings as {"rope_parameters": {"rope_theta", "rope_type", ...}}.
        rope = params.get("rope_parameters")
        if isinstance(rope, dict):
            params.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
            if rope.get("rope_type", "default") != "default":
                params.setdefault("rope_scaling", rope)
        return params

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    model_type: str = "llama"
    rms_norm_eps: float = 1e-5
    num_key_value_heads: Optional[int] = None
    head_dim: Optional[int] = None
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rope_traditional: bool = False
    rope_scaling: Optional[Dict[str, Any]] = None
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    mlp_bias: bool = False
    # Per-layer or global MLX quantization, as mlx-lm writes it into config.json:
    # {"group_size": 64, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}, ...}
    quantization: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        if self.model_type not in LLAMA_FAMILY:
            raise UnsupportedModelError(
                f"unsupported architecture {self.model_type!r}: this tool runs Llama-family "
                f"decoders ({', '.join(sorted(LLAMA_FAMILY))})"
            )
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise UnsupportedModelError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )


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
    model_type: str = "recurrent_drafting_drafter"

    def __post_init__(self):
        if self.exit_dim is None or self.exit_dim <= 0:
            self.exit_dim = 2 * self.hidden_size
        if self.lm_head not in ("own", "shared"):
            raise UnsupportedModelError(f"drafter lm_head must be 'own' or 'shared', not {self.lm_head!r}")
