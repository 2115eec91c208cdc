"""The Llama module: packed-tree forward (explicit mask + per-token positions) equals running the
branches as separate sequences; rope traditional / half-split; GQA; quantized weights; and
agreement with mlx-lm's own Llama implementation of the same weights."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest


ATOL = 2e-5  # float32

PREFIX = [3, 14, 15, 92, 65, 35, 89, 79]
# Three branches of depth 4: A and B share their first two tokens, C shares nothing.
BRANCHES = [[7, 8, 9, 10], [7, 8, 2, 11], [4, 1, 6, 12]]


def trie(branches):
    """Pack branches into a trie laid out parents-first: (tokens, parent, depth, where) with
    where[(b, d)] = packed index of branch b's token at depth d."""
    tokens, parent, depth, where, index = [], [], [], {}, {}
    for b, branch in enumerate(branches):
        for d in range(len(branch)):
            key = tuple(branch[: d + 1])
            if key not in index:
                index[key] = len(tokens)
                tokens.append(branch[d])
                parent.append(index[key[:-1]] if d else -1)
                depth.append(d)
            where[(b, d)] = index[key]
    return tokens, parent, depth, where


def ancestor_mask(parent):
    T = len(parent)
    mask = np.zeros((T, T), bool)
    for i in range(T):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    return mask


def close(a, b, atol=ATOL):
    a, b = np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
    assert a.shape == b.shape
    err = float(np.abs(a - b).max())
    assert err <= atol, f"max abs difference {err} > {atol}"


def prefilled(model, prefix=PREFIX):
    cache = model.make_cache()
    model(mx.array([prefix]), cache)
    return cache


def check_tree_equals_branches(model, atol=ATOL):
    tokens, parent, depth, where = trie(BRANCHES)
    assert len(tokens) == 10  # 4 + 2 + 4: the shared prefix is packed once
    mask = ancestor_mask(parent)
    P = len(PREFIX)
    cache = prefilled(model)
    logits, hidden = model(mx.array([tokens]), cache, positions=mx.array(P + np.array(depth)), mask=mx.array(mask))
    assert logits.shape == (1, len(tokens), model.args.vocab_size)
    assert hidden.shape == (1, len(tokens), model.args.hidden_size)
    assert cache.offset == P + len(tokens)
    for b, branch in enumerate(BRANCHES):
        ref_cache = prefilled(model)
        ref_logits, ref_hidden = model(mx.array([branch]), ref_cache)  # causal, on top of the prefix
        idx = [where[(b, d)] for d in range(len(branch))]
        close(logits[0, idx], ref_logits[0], atol)
        close(hidden[0, idx], ref_hidden[0], atol)
    return logits, hidden, cache, where


@pytest.mark.parametrize("traditional", [False, True], ids=["half-split-rope", "traditional-rope"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa2", "mqa"])
def test_tree_mask_and_positions_equal_separate_branches(tiny_kit, traditional, heads, kv_heads):
    model = tiny_kit.model(seed=1, rope_traditional=traditional, num_attention_heads=heads, num_key_value_heads=kv_heads)
    check_tree_equals_branches(model)


def test_tree_mask_matters(tiny_kit):
    """The same packed tokens run causally (no tree mask, sequential positions) give other
    results: the comparison above is not vacuous."""
    model = tiny_kit.model(seed=1)
    tokens, parent, depth, where = trie(BRANCHES)
    causal, _ = model(mx.array([tokens]), prefilled(model))
    tree, _ = model(mx.array([tokens]), prefilled(model), positions=mx.array(len(PREFIX) + np.array(depth)),
                    mask=mx.array(ancestor_mask(parent)))
    i = where[(1, 2)]  # B's third token: its causal run also sees A's tokens 9, 10
    assert np.abs(np.array(causal[0, i]) - np.array(tree[0, i])).max() > 1e-3
    # Right mask but sequential positions is also wrong.
    wrong_pos, _ = model(mx.array([tokens]), prefilled(model), mask=mx.array(ancestor_mask(parent)))
    assert np.abs(np.array(wrong_pos[0, i]) - np.array(tree[0, i])).max() > 1e-3


def test_committed_tree_path_continues_like_a_plain_sequence(tiny_kit):
    """After a tree pass, commit branch B's path; the next token's logits equal a plain causal
    run of prefix + B (the committed K/V carry B's positions)."""
    model = tiny_kit.model(seed=2, rope_traditional=True)
    _, _, cache, where = check_tree_equals_branches(model)
    P = len(PREFIX)
    cache.commit(P, [where[(1, d)] for d in range(4)])
    assert cache.offset == P + 4
    nxt = 42
    logits, hidden = model(mx.array([[nxt]]), cache)
    ref_logits, ref_hidden = model(mx.array([PREFIX + BRANCHES[1] + [nxt]]))
    close(logits[0, 0], ref_logits[0, -1])
    close(hidden[0, 0], ref_hidden[0, -1])


def test_batched_trees_with_per_row_positions(tiny_kit):
    """B = 2 rows, each with its own tree: (B, T) positions and a (B, 1, T, T) mask."""
    model = tiny_kit.model(seed=3)
    rows = [BRANCHES[:2], [BRANCHES[2], [4, 1, 5, 13]]]
    packed = [trie(r) for r in rows]
    T = max(len(p[0]) for p in packed)
    assert all(len(p[0]) == T for p in packed)
    P = len(PREFIX)
    cache = model.make_cache()
    model(mx.array([PREFIX, PREFIX[::-1]]), cache)
    tokens = mx.array([p[0] for p in packed])
    positions = mx.array(np.stack([P + np.array(p[2]) for p in packed]))
    mask = mx.array(np.stack([ancestor_mask(p[1]) for p in packed])[:, None])
    logits, hidden = model(tokens, cache, positions=positions, mask=mask)
    for r, (row_prefix, branches) in enumerate(zip([PREFIX, PREFIX[::-1]], rows)):
        where = packed[r][3]
        for b, branch in enumerate(branches):
            ref_logits, ref_hidden = model(mx.array([row_prefix + branch]))
            idx = [where[(b, d)] for d in range(len(branch))]
            close(logits[r, idx], ref_logits[0, P:])
            close(hidden[r, idx], ref_hidden[0, P:])


def test_mask_forms_agree(tiny_kit):
    """(T, T) boolean, (T, offset + T) boolean and additive float masks give the same result."""
    model = tiny_kit.model(seed=4)
    tokens, parent, depth, _ = trie(BRANCHES)
    pos = mx.array(len(PREFIX) + np.array(depth))
    small = ancestor_mask(parent)
    full = np.concatenate([np.ones((len(tokens), len(PREFIX)), bool), small], axis=1)
    additive = np.where(small, 0.0, -np.inf).astype(np.float32)
    outs = [model(mx.array([tokens]), prefilled(model), positions=pos, mask=mx.array(m))[0]
            for m in (small, full, additive)]
    close(outs[1], outs[0])
    close(outs[2], outs[0])


def test_bad_mask_shapes_are_refused(tiny_kit):
    model = tiny_kit.model(seed=1)
    cache = prefilled(model)
    with pytest.raises(ValueError, match="mask of shape"):
        model(mx.array([[5, 6, 7]]), cache, positions=mx.array([7, 8, 9]), mask=mx.ones((3, 4), dtype=mx.bool_))


def test_default_positions_and_incremental_decoding(tiny_kit):
    """positions=None means cache.offset + arange(T); feeding tokens one at a time through the
    cache equals one causal pass."""
    model = tiny_kit.model(seed=5)
    seq = PREFIX + BRANCHES[0]
    full_logits, full_hidden = model(mx.array([seq]))
    cache = model.make_cache()
    l1, _ = model(mx.array([seq[:5]]), cache, positions=mx.arange(5))
    close(l1[0], full_logits[0, :5])
    steps = [model(mx.array([[t]]), cache) for t in seq[5:]]
    close(mx.concatenate([s[0][0] for s in steps]), full_logits[0, 5:])
    close(mx.concatenate([s[1][0] for s in steps]), full_hidden[0, 5:])
    # Rewind and run again: the same numbers.
    cache.rewind(3)
    again, _ = model(mx.array([seq[-3:]]), cache)
    close(again[0], full_logits[0, -3:])


def test_rope_convention_matters(tiny_kit):
    """Same weights, the other rope convention: different outputs (beyond position 0)."""
    a = tiny_kit.model(seed=6, rope_traditional=False)
    b = tiny_kit.model(seed=6, rope_traditional=True)
    ids = mx.array([PREFIX])
    la, lb = a(ids)[0], b(ids)[0]
    close(la[0, 0], lb[0, 0])  # position 0: no rotation
    assert np.abs(np.array(la[0, 1:]) - np.array(lb[0, 1:])).max() > 1e-3


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_gqa_equals_mha_with_repeated_kv_heads(tiny_kit, kv_heads):
    """Grouped-query attention = multi-head attention whose K/V heads are repeated per group."""
    heads = 4
    gqa = tiny_kit.model(seed=7, num_attention_heads=heads, num_key_value_heads=kv_heads)
    mha = tiny_kit.model(seed=8, num_attention_heads=heads, num_key_value_heads=heads)
    D = gqa.config["hidden_size"] // heads
    weights = tiny_kit.weights(gqa)
    for k, w in list(weights.items()):
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            w = w.reshape(kv_heads, D, -1)
            weights[k] = mx.repeat(w, heads // kv_heads, axis=0).reshape(heads * D, -1)
    mha.load_weights(list(weights.items()), strict=True)
    tokens, parent, depth, _ = trie(BRANCHES)
    kw = dict(positions=mx.array(len(PREFIX) + np.array(depth)), mask=mx.array(ancestor_mask(parent)))
    out_g = gqa(mx.array([tokens]), prefilled(gqa), **kw)
    out_m = mha(mx.array([tokens]), prefilled(mha), **kw)
    close(out_g[0], out_m[0])
    close(out_g[1], out_m[1])


def test_tied_embeddings_and_helpers(tiny_kit):
    model = tiny_kit.model(seed=9, tie_word_embeddings=True)
    assert model.lm_head is None and model.args.tie_word_embeddings
    ids = mx.array([[5, 6, 7]])
    logits, hidden = model(ids)
    close(logits, hidden @ model.embed_tokens.weight.T)
    close(model.logits(hidden), logits)
    close(model.logits(hidden[0, 1]), logits[0, 1])
    close(model.hidden(ids), hidden)
    close(model.embed(mx.array([5])), model.embed_tokens.weight[5:6])


# ---- quantized ---------------------------------------------------------------------------

def dequantized_copy(tiny_kit, qmodel, seed, **kw):
    """A float model holding the dequantized weights of an nn.quantize'd model."""
    ref = tiny_kit.model(seed=seed, **kw)
    w = tiny_kit.weights(qmodel)
    out = {}
    for k, v in w.items():
        if k.endswith((".scales", ".biases")):
            continue
        p = k[: -len(".weight")]
        if p + ".scales" in w:
            mod = dict(qmodel.named_modules())[p]
            v = mx.dequantize(v, w[p + ".scales"], w[p + ".biases"], group_size=mod.group_size, bits=mod.bits)
        out[k] = v
    ref.load_weights(list(out.items()), strict=True)
    return ref


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_model_runs_and_matches_its_dequantized_weights(tiny_kit, bits):
    kw = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    model = tiny_kit.model(seed=10, **kw)
    float_logits, _ = model(mx.array([PREFIX]))
    nn.quantize(model, group_size=32, bits=bits)
    assert type(model.layers[0].self_attn.q_proj).__name__ == "QuantizedLinear"
    assert type(model.embed_tokens).__name__ == "QuantizedEmbedding"
    q_logits, q_hidden = model(mx.array([PREFIX]))
    assert q_logits.shape == float_logits.shape
    assert np.isfinite(np.array(q_logits)).all()
    # 8-bit stays close to the float model; 4-bit differs more (but is still a near copy).
    err = np.abs(np.array(q_logits) - np.array(float_logits)).max()
    assert err < (0.05 if bits == 8 else 0.5) and err > 0
    # Exactly what the dequantized weights compute, and the tree pass still equals the branches.
    ref = dequantized_copy(tiny_kit, model, seed=10, **kw)
    ref_logits, ref_hidden = ref(mx.array([PREFIX]))
    close(q_logits, ref_logits, 1e-4)
    close(q_hidden, ref_hidden, 1e-4)
    check_tree_equals_branches(model, atol=1e-4)


# ---- an independent implementation: mlx-lm's Llama -------------------------------------

def mlx_lm_twin(model):
    """A fresh mlx-lm model of the same config (no tree wrappers) holding the same weights."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(model.config)
    ref = model_class(args_class.from_dict(model.config))

    ref.load_weights(tree_flatten(model.parameters()), strict=True)
    mx.eval(ref.parameters())
    return ref


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("kv_heads,tied", [(4, False), (2, True), (1, False)])
def test_forward_equals_mlx_lm(tiny_kit, traditional, kv_heads, tied):
    from mlx_lm.models.cache import make_prompt_cache

    model = tiny_kit.model(seed=11, rope_traditional=traditional, num_key_value_heads=kv_heads,
                           tie_word_embeddings=tied, rope_theta=500.0)
    ref = mlx_lm_twin(model)
    seq = PREFIX + BRANCHES[0]
    ours, _ = model(mx.array([seq]))
    close(ours, ref(mx.array([seq])))
    # Incremental, each with its own cache.
    cache, ref_cache = model.make_cache(), make_prompt_cache(ref)
    close(model(mx.array([seq[:6]]), cache)[0], ref(mx.array([seq[:6]]), cache=ref_cache))
    for t in seq[6:]:
        close(model(mx.array([[t]]), cache)[0], ref(mx.array([[t]]), cache=ref_cache))
