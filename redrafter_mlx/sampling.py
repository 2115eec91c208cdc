"""Turning base-model logits into tokens: greedy, temperature and top-p (nucleus) sampling.

One `Sampler` serves plain decoding and ReDrafter acceptance alike: `sampler(logits)` picks
one token per row of (..., V) logits. For T = 0 that is the argmax; otherwise a draw from
softmax(logits / T) restricted to the smallest set of tokens whose mass reaches top_p.

Given the positions the rows' tokens take in the sequence, a draw depends only on the seed and
its position (the Gumbel-max trick: argmax(log p + g), with g drawn from a key made of the seed
and the position). Verification accepts a drafted token where the base model's own draw picks
it, so the token a step keeps at position t is the one plain decoding draws at t from the same
prefix: a seed gives the same reply in every mode and with every tree, adaptive ones included
(whose trees follow measured timings; with a key chain, each tree's number of draws moved every
later draw, and a seeded reply changed from run to run). Rows at one position (siblings in a
tree) share a draw; only one of them is ever on the accepted path, so every path's draws stay
independent and each reply is still an exact draw from the base model's distribution. Without
positions (no caller in the package), draws follow a key chain of the seed, each call splitting the
key, or MLX's global generator when no seed was given; `seed_used` does not reproduce those.
"""

import math
import numbers
import os
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx
import numpy as np

from .errors import SettingError, compact

SEED_MAX = 2**64 - 1  # mx.random.key takes an unsigned 64-bit seed


GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment: 2**64 / the golden ratio, odd


def _mix(z: int) -> int:
    """SplitMix64's finalizer: a bijection of 64-bit integers that spreads every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & SEED_MAX
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & SEED_MAX
    return z ^ (z >> 31)


def position_key(seed: int, position: int) -> int:
    """A 64-bit key for (seed, position), so nearby seeds and positions get unrelated draws.

    The seed is mixed on its own first, then offset by the position and mixed again. Mixing
    seed + GOLDEN * (position + 1) in one go made seed s at position p + 1 the key of seed
    s + GOLDEN at position p: two replies with such seeds drew shifted copies of each other's
    noise. Both steps are bijections, so at one position no two seeds share a key, nor two
    positions with one seed."""
    return _mix((_mix((seed + GOLDEN) & SEED_MAX) + GOLDEN * (position + 1)) & SEED_MAX)


@dataclass
class Sampler:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: Optional[int] = None

    def __post_init__(self):
        for name in ("temperature", "top_p"):  # "0.7" or None failed with a bare TypeError below
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise SettingError(f"{name} must be a number, not {value!r}")
        try:
            finite = math.isfinite(self.temperature)
        except OverflowError:  # an int past float's range (10**400) was an OverflowError traceback
            finite = False
        if not (finite and self.temperature >= 0):
            raise SettingError(f"temperature must be a number >= 0 (0 = greedy), not {compact(self.temperature)}")
        if not 0.0 < self.top_p <= 1.0:
            raise SettingError(f"top_p must be in (0, 1], not {compact(self.top_p)}")
        if self.seed is not None and (isinstance(self.seed, bool) or not (isinstance(self.seed, numbers.Integral)
                                                                          and 0 <= self.seed <= SEED_MAX)):
            raise SettingError(f"seed must be an integer from 0 to 2**64 - 1, not {compact(self.seed, repr)}")
        self._key = mx.random.key(int(self.seed)) if self.seed is not None else None
        # positional draws need a seed: without one, a fresh one for this sampler (this reply)
        self._position_seed = int(self.seed) if self.seed is not None else int.from_bytes(os.urandom(8), "little")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def seed_used(self) -> Optional[int]:
        """The seed positional draws come from: `seed`, or the fresh one drawn for this sampler when
        none was given (passed back as `seed`, it draws the same tokens at the same positions); None
        when greedy (no draw). The fresh one was never exposed, so a sampled reply worth keeping could
        not be had again. It says nothing of draws made without positions (the key chain, which
        `generate.stream` never uses): those come from a chain of keys of `seed`, or, with no seed
        given, from MLX's global generator, which passing this value back as `seed` does not repeat."""
        return None if self.greedy else self._position_seed

    def _next_key(self):
        if self._key is None:
            return None
        self._key, sub = mx.random.split(self._key)
        return sub

    def logprobs(self, logits: mx.array) -> mx.array:
        """Log-probabilities of the distribution a token is drawn from, (..., V)."""
        # The top logit is 0 before scaling, so a tiny temperature sends the rest to -inf, not every
        # logit to +-inf (below ~1e-38, logits / T overflowed and gave NaN: token 0 every time); a
        # temperature float32 rounds to 0 is taken as 1e-30, which is as good as greedy with ties drawn.
        logits = logits.astype(mx.float32)
        # (as a float: an int temperature past int64, 10**30, reached MLX as a RuntimeError 'std::bad_cast')
        logits = (logits - mx.max(logits, axis=-1, keepdims=True)) / max(float(self.temperature), 1e-30)
        if self.top_p < 1.0:
            logits = apply_top_p(logits, self.top_p)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def __call__(self, logits: mx.array, positions=None) -> mx.array:
        """(..., V) logits -> (...,) int32 tokens. positions: the index in the sequence (prompt
        included) of the token each row draws, an int or a (...,) array; with them a draw depends
        only on the seed and its position (module docstring)."""
        if self.greedy:
            return mx.argmax(logits, axis=-1).astype(mx.int32)
        if positions is None:
            return mx.random.categorical(self.logprobs(logits), axis=-1, key=self._next_key()).astype(mx.int32)
        return mx.argmax(self.logprobs(logits) + self.noise(positions, logits.shape[-1]), axis=-1).astype(mx.int32)

    def noise(self, positions, vocab: int) -> mx.array:
        """Gumbel noise, (..., V), for the given positions: one draw per distinct position."""
        positions = np.asarray(positions, dtype=np.int64)
        unique, inverse = np.unique(positions, return_inverse=True)
        rows = [mx.random.gumbel(shape=(vocab,), key=mx.random.key(position_key(self._position_seed, int(p))))
                for p in unique]
        table = mx.stack(rows)  # (U, V)
        return table[mx.array(inverse.reshape(positions.shape).astype(np.int32))]


def apply_top_p(logits: mx.array, top_p: float) -> mx.array:
    """Set to -inf every logit outside the nucleus: the smallest top set with mass >= top_p."""
    order = mx.argsort(-logits, axis=-1)
    sorted_logits = mx.take_along_axis(logits, order, axis=-1)
    probs = mx.softmax(sorted_logits, axis=-1)
    # Mass strictly before each token: a token is kept while what precedes it is < top_p. The likeliest
    # is kept whatever top_p is: one under float32's least number (~1e-45) rounded to 0 in the comparison
    # and kept none, and every logit became NaN (token 0 every step).
    before = mx.cumsum(probs, axis=-1) - probs
    keep_sorted = (before < top_p) | (mx.arange(probs.shape[-1]) == 0)
    keep = mx.put_along_axis(mx.zeros_like(keep_sorted), order, keep_sorted, axis=-1)
    return mx.where(keep, logits, -mx.inf)
