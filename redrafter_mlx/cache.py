"""KV cache for the base model, built for speculative decoding.

Follows mlx-lm's cache protocol (keys, values, offset, `update_and_fetch`) and adds the two
operations that drafting needs:

- `rewind(n)`: forget the last n tokens (moving the offset; nothing is copied).
- `commit(start, indices)`: after a verification pass wrote T tree tokens at
  [start, start + T), keep only the tokens `start + indices` (the accepted path), packed in
  order at [start, start + len(indices)). This is how a packed tree of draft beams turns back
  into a plain left-to-right history.

Storage is pre-allocated in chunks of `step` tokens (or all at once with `reserve`), so the
history is not copied on every step. Shapes: keys/values (B, H_kv, T_max, D).
"""

from typing import List, Optional, Sequence, Tuple, Union

import mlx.core as mx
import numpy as np

from mlx_lm.models.base import create_causal_mask

Indices = Union[mx.array, Sequence[int]]


def _checked_indices(indices: Indices, start: int, offset: int) -> np.ndarray:
    """`indices` as a host int32 array, after checking they pick tokens written after `start`."""
    host = np.asarray(indices if not isinstance(indices, mx.array) else np.array(indices)).reshape(-1)
    n = host.size
    if start < 0 or start + n > offset:
        raise ValueError(f"commit of {n} tokens at {start} exceeds the cache ({offset})")
    if n and (host.min() < 0 or host.max() >= offset - start):
        raise ValueError(f"commit indices {host.tolist()} must lie in [0, {offset - start}): the tokens after {start}")
    return host.astype(np.int32)


def _commit_plan(indices: Indices, start: int, offset: int) -> Tuple[int, int, Optional[mx.array]]:
    """(n, moved, src) for a commit of `indices` at `start`: n tokens kept; the first `moved`
    are already in place (indices[i] == i, the usual case when the best beam is packed first);
    src holds the cache positions to gather into [start + moved, start + n), None if none."""
    idx = _checked_indices(indices, start, offset)
    n = idx.size
    in_place = idx == np.arange(n)
    moved = n if in_place.all() else int(np.argmin(in_place))  # first index that must move
    return n, moved, (mx.array(idx[moved:] + start) if moved < n else None)


class KVCache:
    """One layer's keys and values. `window`: the layer's sliding attention window (None =
    full attention), applied by the mask; `drop_old` frees what the window no longer sees,
    keeping `KEEP` tokens more than the window so a tree can be rolled back. `tree`: the
    model's TreeState (base_model.py); inside a tree forward, `make_mask` returns the tree's
    mask instead of a causal one. (No __len__: mlx-lm tests `if cache`.)

    `offset` counts every token seen (positions are absolute, as ropes need); storage index
    0 holds position `start` (> 0 once a windowed layer dropped old tokens)."""

    step = 256
    KEEP = 320  # tokens kept beyond a window: room for the largest tree and the rewinds after it

    def __init__(self, window: Optional[int] = None, tree=None):
        self.keys = None  # (B, H_kv, T_max, D)
        self.values = None  # (B, H_kv, T_max, D)
        self.offset = 0
        self.start = 0
        self.window = window
        self.tree = tree

    def make_mask(self, N: int, return_array: bool = False, window_size: Optional[int] = None):
        """The mask mlx-lm's `create_attention_mask` asks for: N new tokens after this cache."""
        windows = [w for w in (window_size, self.window) if w]
        window = min(windows) if windows else None
        if self.tree is not None and self.tree.active:
            return tree_mask(self.tree, N, self.offset, window, self.start)
        return plain_mask(N, self.offset - self.start, return_array, window)

    def can_rewind_to(self, offset: int) -> bool:
        """Whether decoding can go on from `offset`: the keys its window needs were not dropped."""
        return self.start == 0 or offset >= self.start + self.window - 1

    def drop_old(self):
        """Free the keys a windowed layer's queries can no longer see (copied once every `step`
        tokens): memory stays about window + KEEP + step tokens, however long the context."""
        if self.window is None or self.keys is None:
            return
        held = self.offset - self.start
        keep = self.window - 1 + self.KEEP
        if held <= keep + self.step:
            return
        drop = held - keep
        B, H, _, D = self.keys.shape
        size = -(-(keep + self.step) // self.step) * self.step
        new_k = mx.zeros((B, H, size, D), self.keys.dtype)
        new_v = mx.zeros((B, H, size, self.values.shape[-1]), self.values.dtype)
        new_k[..., :keep, :] = self.keys[..., drop:held, :]
        new_v[..., :keep, :] = self.values[..., drop:held, :]
        self.keys, self.values = new_k, new_v
        self.start += drop

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def _grow(self, B: int, H: int, D: int, dtype, need: int, v_dim: int):
        """Room for `need` tokens of storage (positions start .. start + need)."""
        if need <= self.capacity:
            return
        size = ((need + self.step - 1) // self.step) * self.step
        new_k = mx.zeros((B, H, size, D), dtype)
        new_v = mx.zeros((B, H, size, v_dim), dtype)
        held = self.offset - self.start
        if self.keys is not None and held > 0:
            new_k[..., :held, :] = self.keys[..., :held, :]
            new_v[..., :held, :] = self.values[..., :held, :]
        self.keys, self.values = new_k, new_v

    def reserve(self, B: int, H: int, D: int, dtype, total: int, v_dim: int = None):
        """Pre-size the storage for `total` tokens so no growth happens during a run."""
        self._grow(B, H, D, dtype, total, v_dim or D)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Append (B, H_kv, T, D) keys/values; return all cached ones, (B, H_kv, offset, D)."""
        B, H, T, D = keys.shape
        start = self.offset - self.start  # storage index of the first new token
        end = start + T
        bucket = self.tree.key_bucket if self.tree is not None and self.tree.active else 0
        if bucket:  # shape buckets: the keys past `end` are returned too, and masked out (tree_mask)
            end = -(-end // bucket) * bucket
        self._grow(B, H, D, keys.dtype, end, values.shape[-1])
        self.keys[..., start : start + T, :] = keys
        self.values[..., start : start + T, :] = values
        self.offset += T
        return self.keys[..., :end, :], self.values[..., :end, :]

    def keys_and_values(self):
        """The cached keys and values as the last `update_and_fetch` returned them: afm7's KV-reuse
        layers attend to the last cached layer's."""
        end = self.offset - self.start
        bucket = self.tree.key_bucket if self.tree is not None and self.tree.active else 0
        if bucket:
            end = -(-end // bucket) * bucket
        return self.keys[..., :end, :], self.values[..., :end, :]

    def rewind(self, n: int):
        if n < 0 or n > self.offset:
            raise ValueError(f"cannot rewind {n} tokens from a cache holding {self.offset}")
        if not self.can_rewind_to(self.offset - n):
            raise ValueError(f"cannot rewind to {self.offset - n}: this layer's window needs keys before {self.start}, "
                             "which were dropped")
        self.offset -= n

    def commit(self, start: int, indices: Indices):
        """Keep the tokens at `start + indices` (in that order) and drop the rest after `start`.

        Tokens already in place (a leading run indices[i] == i, the usual case when the best
        beam is packed first) are not moved: only the rest of the path is gathered."""
        self._apply_commit(start, *_commit_plan(indices, start, self.offset))

    def _apply_commit(self, start: int, n: int, moved: int, src: Optional[mx.array]):
        if src is not None:
            lo, hi = start + moved - self.start, start + n - self.start
            local = src - self.start if self.start else src
            self.keys[..., lo:hi, :] = mx.take(self.keys, local, axis=2)
            self.values[..., lo:hi, :] = mx.take(self.values, local, axis=2)
        self.offset = start + n

    def keep_rows(self, rows: mx.array):
        """Keep only the batch rows `rows` (B',) of keys and values, in that order."""
        if self.keys is not None:
            self.keys, self.values = self.keys[rows], self.values[rows]

    @property
    def state(self):
        if self.keys is None:
            return []
        return [self.keys, self.values]


class Cache(list):
    """One KVCache per layer, moved together. `offset` is the number of cached tokens."""

    def __init__(self, num_layers: int, windows: Optional[Sequence[Optional[int]]] = None, tree=None):
        windows = list(windows) if windows is not None else [None] * num_layers
        super().__init__(KVCache(w, tree) for w in windows)

    @property
    def offset(self) -> int:
        return self[0].offset

    def reserve(self, B: int, H: int, D: int, dtype, total: int, v_dim: int = None):
        for c in self:
            c.reserve(B, H, D, dtype, total, v_dim)

    def rewind(self, n: int):
        for c in self:
            c.rewind(n)

    def trim_to(self, offset: int):
        """Rewind every layer to an absolute length. Safe after an interrupted forward pass,
        where the first layers may already hold more tokens than the last ones."""
        for c in self:
            if offset < c.offset:
                c.rewind(c.offset - offset)

    def can_trim_to(self, offset: int) -> bool:
        """Whether `trim_to(offset)` can work: no windowed layer dropped keys decoding from
        there would need (else start over: `clear`)."""
        return all(c.can_rewind_to(offset) for c in self)

    def clear(self):
        for c in self:
            c.keys = c.values = None
            c.offset = c.start = 0

    def drop_old(self):
        """Let windowed layers free what their window no longer sees (KVCache.drop_old)."""
        for c in self:
            c.drop_old()

    def commit(self, start: int, indices: Indices):
        plan = _commit_plan(indices, start, self.offset)  # checked and planned once for all layers
        for c in self:
            c._apply_commit(start, *plan)

    def keep_rows(self, rows: Sequence[int]):
        """Keep only some batch rows (e.g. drop the sequences that finished), in that order."""
        rows = mx.array(np.asarray(rows, dtype=np.int32))
        for c in self:
            c.keep_rows(rows)

    @property
    def state(self) -> List[mx.array]:
        return [a for c in self for a in c.state]


def tree_mask(state, N: int, offset: int, window: Optional[int], start: int = 0) -> mx.array:
    """The attention mask of a tree forward for one layer: cached prefix (positions start ..
    offset, the ones still stored) + the state's mask, the window applied on positions. (T, S)
    for one row, (B, 1, T, S) for a batch."""
    mask = state.mask  # (B', T, T or offset + T)
    Bm, T, W = mask.shape
    held = offset - start
    if W == N:
        mask = mx.concatenate([mx.ones((Bm, T, held), dtype=mx.bool_), mask], axis=-1)
    elif start:
        mask = mask[..., start:]
    if window is not None:
        B = state.batch
        qpos = state.positions.reshape(B, T)
        kpos = mx.concatenate([mx.broadcast_to(mx.arange(start, offset, dtype=mx.int32), (B, held)), qpos], axis=1)
        mask = mask & ((qpos[:, :, None] - kpos[:, None, :]) < window)
    if state.key_bucket:  # the keys come padded to a multiple of the bucket (KVCache.update_and_fetch)
        extra = -(-(held + N) // state.key_bucket) * state.key_bucket - (held + N)
        if extra:
            mask = mx.concatenate([mask, mx.zeros((mask.shape[0], T, extra), dtype=mx.bool_)], axis=-1)
    if mask.shape[0] == 1:
        return mask[0]
    return mask[:, None, None] if state.five_d else mask[:, None]


def plain_mask(N: int, offset: int, return_array: bool, window: Optional[int]):
    """mlx-lm's mask for a causal chunk of N tokens after `offset` cached ones, the whole
    history kept (the window applied by the mask rather than by a rotating buffer)."""
    if window is not None and offset + N > window:
        return create_causal_mask(N, offset, window_size=window)
    if N == 1:
        return None
    return create_causal_mask(N, offset) if return_array else "causal"
