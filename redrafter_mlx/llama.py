"""Llama-family decoder (Llama 1/2/3, Vicuna, Mistral-style GQA, SmolLM2) in MLX.

Follows mlx-lm's model-file shape (args dataclass, Attention, MLP, Block, Model, sanitize),
with the three things speculative decoding needs that mlx-lm's forward lacks:

- explicit per-token positions: a packed tree of draft tokens puts tokens of the same depth
  at the same position (ReDrafter paper, section 3.3, "dynamic tree attention");
- an explicit attention mask over [cached + new] tokens (each tree token sees the cache and
  its own ancestors only);
- the last hidden states (after the final norm) next to the logits: the draft head reads them.

Shapes: B batch, T new tokens, S = cached + new tokens, H heads, D head dim, V vocab.
"""

from typing import Optional, Tuple, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from .cache import Cache, KVCache
from .config import LlamaArgs

Mask = Union[None, str, mx.array]


def build_mask(T: int, offset: int, mask: Mask) -> Mask:
    """Turn the caller's mask into what scaled_dot_product_attention takes.

    None -> causal over [cached + new]; an array of shape (..., T, T) covers the new tokens
    only and gets the cache prepended (every new token sees all cached ones); an array of
    shape (..., T, offset + T) is used as is. Boolean masks: True = may attend. Float masks
    are additive.
    """
    if mask is None:
        return "causal" if T > 1 else None
    if isinstance(mask, str):
        return mask
    if mask.shape[-1] == T + offset:
        return mask
    if mask.shape[-1] != T or mask.shape[-2] != T:
        raise ValueError(f"mask of shape {mask.shape} fits neither {T} new tokens nor {T + offset} in all")
    prefix_shape = mask.shape[:-1] + (offset,)
    if mask.dtype == mx.bool_:
        prefix = mx.ones(prefix_shape, dtype=mx.bool_)
    else:
        prefix = mx.zeros(prefix_shape, dtype=mask.dtype)
    return mx.concatenate([prefix, mask], axis=-1)


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        dim = args.hidden_size
        self.n_heads = args.num_attention_heads
        self.n_kv_heads = args.num_key_value_heads
        self.head_dim = args.head_dim
        self.scale = self.head_dim**-0.5
        bias = args.attention_bias
        self.q_proj = nn.Linear(dim, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, dim, bias=bias)
        self.rope = initialize_rope(
            self.head_dim,
            args.rope_theta,
            args.rope_traditional,
            args.rope_scaling,
            args.max_position_embeddings,
        )

    def _rotate(self, x: mx.array, offset: int, positions: Optional[mx.array]) -> mx.array:
        if positions is None:
            return self.rope(x, offset=offset)
        # Per-token positions: fold T into the batch so each token gets its own rope offset.
        B, H, T, D = x.shape
        pos = mx.broadcast_to(positions, (B, T)).reshape(B * T)
        x = x.transpose(0, 2, 1, 3).reshape(B * T, H, 1, D)
        x = self.rope(x, offset=pos)
        return x.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    def __call__(self, x, mask: Mask, cache: Optional[KVCache], positions: Optional[mx.array]):
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, self.n_heads, -1).transpose(0, 2, 1, 3)  # (B, H, T, D)
        k = self.k_proj(x).reshape(B, T, self.n_kv_heads, -1).transpose(0, 2, 1, 3)  # (B, Hkv, T, D)
        v = self.v_proj(x).reshape(B, T, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = cache.offset if cache is not None else 0
        q = self._rotate(q, offset, positions)
        k = self._rotate(k, offset, positions)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)  # (B, Hkv, S, D)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        dim, hidden, bias = args.hidden_size, args.intermediate_size, args.mlp_bias
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def __call__(self, x):
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x, mask, cache, positions):
        h = x + self.self_attn(self.input_layernorm(x), mask, cache, positions)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class Model(nn.Module):
    """`model(tokens, cache, positions, mask) -> (logits (B, T, V), hidden (B, T, hidden_size))`."""

    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.args = args
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    @property
    def layers(self):
        return self.model.layers

    def make_cache(self) -> Cache:
        return Cache(len(self.model.layers))

    def embed(self, tokens: mx.array) -> mx.array:
        """The input embedding of tokens: (...,) -> (..., hidden_size)."""
        return self.model.embed_tokens(tokens)

    def hidden(
        self,
        tokens: mx.array,
        cache: Optional[Cache] = None,
        positions: Optional[mx.array] = None,
        mask: Mask = None,
    ) -> mx.array:
        """Last hidden states after the final norm, (B, T, hidden_size). Appends to `cache`.

        tokens: (B, T) ids. positions: (T,) or (B, T) absolute positions, default
        cache.offset + arange(T). mask: see `build_mask`.
        """
        if tokens.ndim == 1:
            tokens = tokens[None]
        T = tokens.shape[1]
        offset = cache.offset if cache is not None else 0
        mask = build_mask(T, offset, mask)
        h = self.model.embed_tokens(tokens)
        layer_caches = cache if cache is not None else [None] * len(self.model.layers)
        for layer, c in zip(self.model.layers, layer_caches):
            h = layer(h, mask, c, positions)
        return self.model.norm(h)

    def logits(self, hidden: mx.array) -> mx.array:
        """Output projection: (..., hidden_size) -> (..., V)."""
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(hidden)
        return self.lm_head(hidden)

    def __call__(
        self,
        tokens: mx.array,
        cache: Optional[Cache] = None,
        positions: Optional[mx.array] = None,
        mask: Mask = None,
    ) -> Tuple[mx.array, mx.array]:
        h = self.hidden(tokens, cache, positions, mask)
        return self.logits(h), h

    def sanitize(self, weights: dict) -> dict:
        """Drop checkpoint entries that are not parameters of this module."""
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if self.args.tie_word_embeddings:
            for suffix in ("weight", "scales", "biases"):
                weights.pop(f"lm_head.{suffix}", None)
        return weights
