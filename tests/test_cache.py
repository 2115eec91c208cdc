"""KV cache: append, growth in chunks, rewind / trim_to, commit of an accepted tree path, errors.

Keys and values carry their token's absolute position in every element, so the contents of a
cache can be checked against the exact list of positions it should hold.
"""

import mlx.core as mx
import numpy as np
import pytest

from redrafter_mlx.cache import Cache, KVCache

B, H, D, DV = 1, 2, 3, 5  # batch, KV heads, key dim, value dim (different, to catch mix-ups)


def kv(positions, b=B):
    """Keys (b, H, T, D) = position + 0.25 * head; values (b, H, T, DV) = -(position) - 0.5 * batch row."""
    p = mx.array(positions, dtype=mx.float32).reshape(1, 1, -1, 1)
    head = mx.arange(H, dtype=mx.float32).reshape(1, H, 1, 1)
    row = mx.arange(b, dtype=mx.float32).reshape(b, 1, 1, 1)
    k = mx.broadcast_to(p + 0.25 * head + 1000 * row, (b, H, len(positions), D))
    v = mx.broadcast_to(-p - 0.5 * row, (b, H, len(positions), DV))
    return k, v


def held(c: KVCache, b=B):
    """The positions a cache holds, read back from its keys (and checked against its values)."""
    k = np.array(c.keys[..., : c.offset, :])
    v = np.array(c.values[..., : c.offset, :])
    positions = [float(x) for x in k[0, 0, :, 0]]
    want_k, want_v = kv(positions, b)
    assert np.array_equal(k, np.array(want_k)) and np.array_equal(v, np.array(want_v)), "keys/values out of step"
    return positions


def test_update_and_fetch_returns_everything_cached():
    c = KVCache()
    assert c.offset == 0 and c.capacity == 0 and c.state == []
    k, v = c.update_and_fetch(*kv([0, 1, 2]))
    assert c.offset == 3 and k.shape == (B, H, 3, D) and v.shape == (B, H, 3, DV)
    k, v = c.update_and_fetch(*kv([3]))
    assert k.shape == (B, H, 4, D) and v.shape == (B, H, 4, DV)
    assert np.array_equal(np.array(k), np.array(kv([0, 1, 2, 3])[0]))
    assert np.array_equal(np.array(v), np.array(kv([0, 1, 2, 3])[1]))
    assert held(c) == [0, 1, 2, 3]


@pytest.mark.parametrize("step,chunks", [(4, [3, 3, 3, 1, 7]), (256, [200, 100, 300])])
def test_growth_past_the_chunk_size_keeps_contents(step, chunks):
    c = KVCache()
    c.step = step
    pos, capacities = 0, []
    for n in chunks:
        c.update_and_fetch(*kv(list(range(pos, pos + n))))
        pos += n
        capacities.append(c.capacity)
        assert c.capacity % step == 0 and c.capacity >= pos
    assert len(set(capacities)) > 1, "the test must cross at least one chunk boundary"
    assert c.offset == pos
    assert held(c) == list(range(pos))


def test_growth_after_a_rewind_keeps_only_the_live_tokens():
    c = KVCache()
    c.step = 4
    c.update_and_fetch(*kv([0, 1, 2, 3]))
    c.rewind(2)
    c.update_and_fetch(*kv([10, 11, 12, 13, 14]))  # grows from 4 to 8
    assert c.capacity == 8 and held(c) == [0, 1, 10, 11, 12, 13, 14]


def test_batched_cache_keeps_rows_apart():
    c = KVCache()
    c.step = 2
    c.update_and_fetch(*kv([0, 1, 2], b=2))
    c.update_and_fetch(*kv([3, 4], b=2))
    c.commit(3, [1])
    assert held(c, b=2) == [0, 1, 2, 4]


def test_rewind_then_append_overwrites():
    c = KVCache()
    c.update_and_fetch(*kv(list(range(6))))
    c.rewind(2)
    assert c.offset == 4 and held(c) == [0, 1, 2, 3]
    k, _ = c.update_and_fetch(*kv([40, 41, 42]))
    assert k.shape[2] == 7 and held(c) == [0, 1, 2, 3, 40, 41, 42]
    c.rewind(0)
    assert c.offset == 7
    c.rewind(7)
    assert c.offset == 0 and c.update_and_fetch(*kv([9]))[0].shape[2] == 1 and held(c) == [9]


@pytest.mark.parametrize("n", [-1, 5, 100])
def test_bad_rewind_is_refused_and_changes_nothing(n):
    c = KVCache()
    c.update_and_fetch(*kv([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=f"rewind {n} tokens from a cache holding 4"):
        c.rewind(n)
    assert c.offset == 4 and held(c) == [0, 1, 2, 3]


@pytest.mark.parametrize("as_array", [False, True])
def test_commit_keeps_the_chosen_tree_tokens_in_order(as_array):
    c = KVCache()
    c.step = 4
    c.update_and_fetch(*kv(list(range(10))))
    # A verification pass writes 6 tree tokens at [10, 16); the accepted path is 0 -> 2 -> 5.
    c.update_and_fetch(*kv([100, 101, 102, 103, 104, 105]))
    path = [0, 2, 5]
    c.commit(10, mx.array(path) if as_array else path)
    assert c.offset == 13
    assert held(c) == list(range(10)) + [100, 102, 105]
    # The next step appends after the committed path.
    c.update_and_fetch(*kv([200]))
    assert held(c) == list(range(10)) + [100, 102, 105, 200]


def test_commit_follows_the_given_order_and_start():
    c = KVCache()
    c.update_and_fetch(*kv(list(range(8))))
    c.commit(3, [4, 0, 2])  # gathers positions 7, 3, 5 into [3, 6)
    assert held(c) == [0, 1, 2, 7, 3, 5]
    c.commit(6, [])  # nothing accepted after 6 tokens: a no-op
    assert held(c) == [0, 1, 2, 7, 3, 5]
    c.commit(2, [])  # an empty path at 2 drops everything from there
    assert c.offset == 2 and held(c) == [0, 1]
    c.commit(0, [0, 1])  # identity
    assert held(c) == [0, 1]


@pytest.mark.parametrize(
    "path,expected",
    [
        ([0, 1, 2], [100, 101, 102]),  # the first packed beam: nothing moves
        ([0, 1, 4, 5], [100, 101, 104, 105]),  # a shared prefix stays, the rest is gathered
        ([0, 3], [100, 103]),
        ([2, 1, 0], [102, 101, 100]),  # not a path, but commit must still follow the order
    ],
)
def test_commit_moves_only_what_is_out_of_place(path, expected):
    c = KVCache()
    c.update_and_fetch(*kv(list(range(5))))
    c.update_and_fetch(*kv([100, 101, 102, 103, 104, 105]))
    c.commit(5, path)
    assert c.offset == 5 + len(path)
    assert held(c) == list(range(5)) + expected


@pytest.mark.parametrize(
    "start,indices,match",
    [
        (8, [0, 1, 2], "exceeds"),  # more tokens than were written after start
        (-1, [0], "exceeds"),  # negative start
        (6, [0, 4], "indices"),  # index past the tree tokens (only 4 after start)
        (6, [-1], "indices"),  # negative index
    ],
)
def test_bad_commit_is_refused_and_changes_nothing(start, indices, match):
    c = KVCache()
    c.update_and_fetch(*kv(list(range(10))))
    with pytest.raises(ValueError, match=match):
        c.commit(start, indices)
    assert c.offset == 10 and held(c) == list(range(10))


def test_reserve_presizes_without_losing_contents():
    c = KVCache()
    c.update_and_fetch(*kv([0, 1, 2]))
    c.reserve(B, H, D, mx.float32, 600, v_dim=DV)
    cap = c.capacity
    assert cap >= 600
    c.update_and_fetch(*kv(list(range(3, 600))))
    assert c.capacity == cap and held(c) == list(range(600))


# ---- Cache: one KVCache per layer -----------------------------------------------------

def layered(n_layers=3, n=6):
    cache = Cache(n_layers)
    for c in cache:
        c.update_and_fetch(*kv(list(range(n))))
    return cache


def test_layers_move_together():
    cache = layered()
    assert len(cache) == 3 and cache.offset == 6
    for c in cache:
        c.update_and_fetch(*kv([50, 51, 52, 53]))
    cache.commit(6, mx.array([0, 3]))
    assert cache.offset == 8 and all(held(c) == list(range(6)) + [50, 53] for c in cache)
    cache.rewind(3)
    assert [c.offset for c in cache] == [5, 5, 5]
    assert len(cache.state) == 2 * len(cache)
    with pytest.raises(ValueError):
        cache.rewind(6)


def test_trim_to_repairs_an_interrupted_forward():
    cache = layered()
    cache[0].update_and_fetch(*kv([6, 7]))  # only the first layers advanced
    cache[1].update_and_fetch(*kv([6]))
    cache.trim_to(6)
    assert [c.offset for c in cache] == [6, 6, 6]
    assert all(held(c) == list(range(6)) for c in cache)
    cache.trim_to(2)
    assert [c.offset for c in cache] == [2, 2, 2]
    cache.trim_to(4)  # cannot grow: a no-op
    assert [c.offset for c in cache] == [2, 2, 2]
    with pytest.raises(ValueError):
        cache.trim_to(-1)


def test_cache_reserve_applies_to_every_layer():
    cache = layered(2, 3)
    cache.reserve(B, H, D, mx.float32, 300, v_dim=DV)
    assert all(c.capacity >= 300 for c in cache)
    assert all(held(c) == [0, 1, 2] for c in cache)


def test_keep_rows_keeps_the_chosen_batch_rows_in_order():
    cache = Cache(2)
    for c in cache:
        c.update_and_fetch(*kv([0, 1, 2], b=4))
    cache.keep_rows([3, 1])
    for c in cache:
        k = np.array(c.keys[..., : c.offset, :])
        v = np.array(c.values[..., : c.offset, :])
        assert k.shape[0] == 2 and c.offset == 3
        assert k[:, 0, 0, 0].tolist() == [3000.0, 1000.0]  # rows 3 and 1, in that order
        assert v[:, 0, 2, 0].tolist() == [-3.5, -2.5]
    for c in cache:  # and it goes on appending as a 2-row cache
        c.update_and_fetch(*kv([3], b=2))
    assert cache.offset == 4
