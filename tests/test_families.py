"""Tree verification over mlx-lm's own model classes (base_model.py), family by family.

Tiny random models of each family, built by mlx-lm from a config: a packed tree's logits equal a
sequential decode of each of its paths, a committed path continues like the plain sequence,
greedy ReDrafter equals plain decoding, plain decoding equals mlx-lm's own `generate_step`, and
families that cannot verify a tree are refused by name.
"""

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from test_redrafter import CharTokenizer

from redrafter_mlx import base_model, generate
from redrafter_mlx.drafter import load_drafter, new_drafter, save_drafter
from redrafter_mlx.errors import DrafterMismatchError, UnsupportedModelError
from redrafter_mlx.loader import LoadedModel, new_model

V = 64
BASE = dict(hidden_size=32, num_hidden_layers=4, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=V, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=False)
FAMILIES = {
    "llama": dict(model_type="llama"),
    "llama3-rope": dict(model_type="llama", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    # DynamicNTK does Python arithmetic on the offset: the rope wrapper's one-call-per-position path.
    "llama-dynamic-ntk": dict(model_type="llama", rope_scaling={"type": "dynamic", "factor": 2.0},
                              max_position_embeddings=16),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", head_dim=8, tie_word_embeddings=True),
    "gemma2": dict(model_type="gemma2", head_dim=8, query_pre_attn_scalar=8, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0),
    "gemma3_text": dict(model_type="gemma3_text", head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                        sliding_window_pattern=2),
    "phi3-longrope": dict(model_type="phi3", partial_rotary_factor=0.5, original_max_position_embeddings=16,
                          rope_scaling={"type": "longrope", "long_factor": [1.5, 1.5], "short_factor": [1.0, 1.0]}),
    "mistral-sliding-window": dict(model_type="mistral", sliding_window=3,
                                   layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=8, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "granite": dict(model_type="granite", logits_scaling=2.0, attention_multiplier=0.1, embedding_multiplier=3.0,
                    residual_multiplier=0.5, attention_bias=False, mlp_bias=False),
    "cohere2": dict(model_type="cohere2", head_dim=8, logit_scale=0.5, sliding_window=4, sliding_window_pattern=2,
                    layer_norm_eps=1e-5, use_qk_norm=False),
    # Its decoder's `layers` is a module holding the list (mlx-lm's Model.layers reaches it): was refused,
    # "2 layer caches for 1 layers". Also shares k/v heads by n_shared_head.
    "plamo": dict(model_type="plamo", n_shared_head=2),
    # The last 2 of 4 layers reuse the keys and values of the last sliding and full layers before them (KV-shared
    # layers, as every Gemma 4 with per-layer inputs has): was refused, "2 caches for its 4 layers".
    "gemma4_text-kv-shared": dict(model_type="gemma4_text", head_dim=8, global_head_dim=16, num_key_value_heads=1,
                                  num_kv_shared_layers=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=V,
                                  sliding_window=4, sliding_window_pattern=2),
    # Heterogeneous blocks: the 2nd has no attention (no cache: 2 caches for 3 layers, was refused), the 3rd no MLP.
    "nemotron-nas": dict(model_type="nemotron-nas", num_hidden_layers=3, block_configs=[
        {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"n_heads_in_group": 2}, "ffn": {"no_op": True}}]),
    # Multi-head latent attention (keys and values of different widths, a rope part split off) with mlx-lm's own
    # yarn rope class.
    "deepseek_v2-mla": dict(model_type="deepseek_v2", kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                            qk_nope_head_dim=8, v_head_dim=8, rope_scaling={
                                "type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "mscale": 1.0,
                                "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}),
    # Attention sinks, alternating sliding and full layers.
    "gpt_oss": dict(model_type="gpt_oss", head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"] * 2),
    # NoPE layers (no rope every 2nd layer).
    "smollm3": dict(model_type="smollm3", no_rope_layer_interval=2),
    # Cross-layer attention: every 2nd layer reuses the keys and values of the one before.
    "hunyuan-cla": dict(model_type="hunyuan", rope_scaling={"alpha": 1000.0, "factor": 1.0, "type": "dynamic"},
                        moe_topk=2, num_experts=4, num_shared_expert=1, use_mixed_mlp_moe=True, use_qk_norm=True,
                        use_cla=True, cla_share_factor=2, moe_intermediate_size=16, attention_bias=False),
    # Decoders whose parts have other names (base_model.EMBEDDING_NAMES, ...): refused before, "its decoder keeps no
    # embed_tokens and layers". gpt_neox's decoder applies its output head (embed_out) itself; partial rotary.
    "gpt_neox": dict(model_type="gpt_neox", rotary_emb_base=10000, rotary_pct=0.5, layer_norm_eps=1e-5),
    # tok_embeddings, layers, norm, and an output head called `output`.
    "internlm2": dict(model_type="internlm2"),
    # wte, h, ln_f; an output head with a bias.
    "qwen": dict(model_type="qwen", kv_channels=8, layer_norm_epsilon=1e-5, no_bias=False),
    # wte, blocks, norm_f (a LayerNorm without bias); experts.
    "dbrx": dict(model_type="dbrx", d_model=32, n_layers=4, n_heads=4,
                 ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
                 attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}),
    # Learned position embeddings (wpe) indexed from cache.offset, no rope: given each tree token's own position.
    "gpt2": dict(model_type="gpt2", n_ctx=512, n_embd=32, n_head=4, n_layer=4, n_positions=512,
                 layer_norm_epsilon=1e-5),
    # Its last 2 layers keep no cache: they attend to the keys and values of the last layer that does.
    "afm7": dict(model_type="afm7", hidden_dim=32, num_layers=4, num_kv_reuse_layers=2, num_heads=4, num_kv_heads=2),
}
PROMPT = [(7 * i + 3) % V for i in range(20)]  # longer than every window and original rope context
# A tree in topological order: node i's parent (-1 = child of the last committed token).
PARENTS = [-1, -1, 0, 0, 2, 3, 4, 1]
TOKENS = [10, 11, 12, 13, 14, 15, 16, 17]


def model_of(family, seed=0, **kw):
    return new_model({**BASE, **FAMILIES[family], **kw}, seed)


def tree_inputs(parents, offset):
    depth, mask = [], np.zeros((len(parents), len(parents)), dtype=bool)
    for i, p in enumerate(parents):
        depth.append(0 if p < 0 else depth[p] + 1)
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mx.array(offset + np.array(depth)), mx.array(mask)


def path_to(node, parents):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def sequential(model, ids):
    """Logits and hidden state after each of `ids`, decoded one token at a time (mlx-lm's code)."""
    cache = model.make_cache()
    model(mx.array([PROMPT]), cache)
    out = []
    for t in ids:
        logits, hidden = model(mx.array([[t]]), cache)
        out.append((logits[0, -1], hidden[0, -1]))
    return out


def rel(a, b):
    return float(mx.abs(a - b).max() / mx.abs(b).max())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tree_forward_equals_sequential_decoding_of_each_path(family):
    model = model_of(family)
    cache = model.make_cache()
    model(mx.array([PROMPT]), cache)
    positions, mask = tree_inputs(PARENTS, len(PROMPT))
    logits, hidden = model(mx.array([TOKENS]), cache, positions=positions, mask=mask)
    for node in range(len(TOKENS)):
        want_logits, want_hidden = sequential(model, [TOKENS[i] for i in path_to(node, PARENTS)])[-1]
        assert rel(logits[0, node], want_logits) < 1e-4, (family, node)
        assert rel(hidden[0, node], want_hidden) < 1e-4, (family, node)
    # Commit one root-to-leaf path, then decode on: the same as decoding that path.
    path = path_to(6, PARENTS)
    cache.commit(len(PROMPT), path)
    after, _ = model(mx.array([[20]]), cache)
    want, _ = sequential(model, [TOKENS[i] for i in path] + [20])[-1]
    assert cache.offset == len(PROMPT) + len(path) + 1
    assert rel(after[0, -1], want) < 1e-4


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3_text", "mistral-sliding-window", "phi3-longrope",
                                    "gpt2"])
def test_a_batch_of_two_different_trees(family):
    model = model_of(family, seed=1)
    cache = model.make_cache()
    model(mx.array([PROMPT, PROMPT[::-1]]), cache)
    parents = [[-1, 0, 1, -1], [-1, -1, 1, 2]]
    tokens = [[5, 6, 7, 8], [9, 10, 11, 12]]
    positions, masks = zip(*(tree_inputs(p, len(PROMPT)) for p in parents))
    logits, _ = model(mx.array(tokens), cache, positions=mx.stack(positions), mask=mx.stack(masks)[:, None])
    for row, prompt in enumerate([PROMPT, PROMPT[::-1]]):
        for node in range(4):
            seq = model.make_cache()
            model(mx.array([prompt]), seq)
            for i in path_to(node, parents[row]):
                want, _ = model(mx.array([[tokens[row][i]]]), seq)
            assert rel(logits[row, node], want[0, -1]) < 1e-4, (family, row, node)


def test_the_controls_fail_sequential_positions_and_a_causal_mask():
    """The comparison above can fail: without tree positions, or with a causal mask, the
    logits of nodes below the first level are wrong."""
    model = model_of("llama")
    cache = model.make_cache()
    model(mx.array([PROMPT]), cache)
    positions, mask = tree_inputs(PARENTS, len(PROMPT))
    good, _ = model(mx.array([TOKENS]), cache, positions=positions, mask=mask)
    cache.rewind(len(TOKENS))
    causal = mx.array(np.tril(np.ones((len(TOKENS),) * 2, dtype=bool)))
    wrong_mask, _ = model(mx.array([TOKENS]), cache, positions=positions, mask=causal)
    cache.rewind(len(TOKENS))
    wrong_pos, _ = model(mx.array([TOKENS]), cache, positions=mx.arange(len(PROMPT), len(PROMPT) + len(TOKENS)),
                         mask=mask)
    want, _ = sequential(model, [TOKENS[i] for i in path_to(4, PARENTS)])[-1]
    assert rel(good[0, 4], want) < 1e-4
    assert rel(wrong_mask[0, 4], want) > 1e-2 and rel(wrong_pos[0, 4], want) > 1e-2



@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gpt2"])
def test_a_forward_in_another_thread_waits_for_a_tree_forward_on_the_same_model(family):
    """The tree state, and the output head (gpt_neox's embed_out) or position embedding (gpt2's wpe) that a
    forward shadows on the shared decoder, were seen by every thread: a plain forward run while another
    thread's tree forward was inside the decoder read its positions (gpt2: its position embeddings), and
    took its shadowed head away when it ended (gpt_neox: the tree forward's hidden states came out as logits)."""
    import threading

    model = model_of(family)
    layers = model.layers
    cache = model.make_cache()
    model(mx.array([PROMPT]), cache)
    positions, mask = tree_inputs(PARENTS, len(PROMPT))
    want_tree, want_tree_hidden = model(mx.array([TOKENS]), cache, positions=positions, mask=mask)
    cache.rewind(len(TOKENS))
    want_plain, want_plain_hidden = model(mx.array([PROMPT[:5]]))
    mx.eval(want_tree, want_tree_hidden, want_plain, want_plain_hidden, [(c.keys, c.values) for c in cache])

    tree_thread, inside, go = [], threading.Event(), threading.Event()
    first = layers[0]

    class Pause:  # the tree forward waits inside the decoder, at its first layer, until told to go on
        def __call__(self, *args, **kwargs):
            if threading.current_thread() in tree_thread:
                inside.set()
                go.wait(10)
            return first(*args, **kwargs)

        def __getattr__(self, name):  # what model code reads off a layer (llama: use_sliding)
            return getattr(first, name)

    layers[0] = Pause()
    results, errors = {}, []

    def run(name, *args, **kwargs):
        try:
            results[name] = model(*args, **kwargs)
            mx.eval(results[name])  # in the thread that built it (MLX's streams are per thread)
        except Exception as e:  # (the test reads them below)
            errors.append(e)

    a = threading.Thread(target=run, args=("tree", mx.array([TOKENS]), cache), kwargs=dict(positions=positions, mask=mask))
    b = threading.Thread(target=run, args=("plain", mx.array([PROMPT[:5]])))
    tree_thread.append(a)
    a.start()
    assert inside.wait(10), errors
    b.start()
    b.join(0.5)  # (unfixed, it ran to the end inside the tree forward)
    go.set()
    a.join(10)
    b.join(10)
    layers[0] = first
    assert not errors, errors
    for name, (want_logits, want_hidden) in (("tree", (want_tree, want_tree_hidden)),
                                             ("plain", (want_plain, want_plain_hidden))):
        logits, hidden = results[name]
        assert hidden.shape == want_hidden.shape and logits.shape == want_logits.shape, (family, name)
        assert rel(hidden, want_hidden) < 1e-5 and rel(logits, want_logits) < 1e-5, (family, name)

def loaded_of(model, drafter=None):
    return LoadedModel(model=model, tokenizer=CharTokenizer(), args=model.args, name="tiny", path=Path("."),
                       weight_format="float32", drafter=drafter)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3-longrope",
                                    "mistral-sliding-window", "qwen3_moe", "deepseek_v2-mla", "gpt_oss",
                                    "gpt_neox", "internlm2", "gpt2", "afm7"])
def test_greedy_redrafter_with_a_random_drafter_equals_plain_decoding(family):
    """The equality means something only where drafts were accepted: a step that accepts none emits the base
    model's own next token, plain decoding with extra work. gemma3_text at seed 2 (window 4: its greedy reply
    does not repeat, so lookup finds nothing) accepted no draft at all with tree=12, and one draft token per
    step at most with beams; its seed is one whose reply the drafts reach."""
    model = model_of(family, seed=6 if family == "gemma3_text" else 2)
    drafter = new_drafter(model.args, seed=3)
    assert drafter.args.embed_scale == (32**0.5 if family.startswith("gemma") else 1.0)
    loaded = loaded_of(model, drafter)
    plain = generate(loaded, PROMPT, mode="ar", max_tokens=64)
    for kw in (dict(beam_width=3, beam_length=3, lookup=8), dict(tree=12, lookup=8), {}):
        got = generate(loaded, PROMPT, mode="redrafter", max_tokens=64, **kw)
        assert got.tokens == plain.tokens, (family, kw)
        if kw:  # drafting every step (the adaptive default may decode plainly): some step took 2+ draft tokens
            assert got.stats.mode == "redrafter" and got.stats.accepted_tokens > 0, (family, kw)
            assert max(got.stats.accepted_lengths) >= 3, (family, kw, got.stats.accepted_lengths)
    assert len(plain.tokens) == 64


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text", "mistral-sliding-window"])
def test_plain_decoding_equals_mlx_lm_generate_step(family):
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import _get_classes

    model = model_of(family, seed=4)
    model_class, args_class = _get_classes(model.config)
    fresh = model_class(args_class.from_dict(model.config))  # mlx-lm untouched: no tree wrappers
    from mlx.utils import tree_flatten

    fresh.load_weights(tree_flatten(model.parameters()), strict=True)
    want = [int(t) for t, _ in generate_step(mx.array(PROMPT), fresh, max_tokens=40)]
    got = generate(loaded_of(model), PROMPT, mode="ar", max_tokens=40).tokens
    assert got == want


@pytest.mark.parametrize("config,why", [
    (dict(model_type="mamba", state_size=4, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=4),
     "recurrent layers"),
    (dict(model_type="qwen3_next"), "recurrent layers"),
    (dict(model_type="ministral3"), "outside rope"),
    # Its attention scale is computed from cache.offset too: the self-check passed it (relative error 0.045),
    # and greedy beams drifted from plain decoding past original_max_position_embeddings.
    (dict(model_type="mistral4", rope_parameters={"rope_theta": 10000.0, "llama_4_scaling_beta": 0.5,
                                                  "original_max_position_embeddings": 4}), "outside rope"),
    # Its fused q/k norm + rope kernel takes cache.offset (no per-token positions); it failed in the rope wrapper,
    # "AttributeError: '_TreeRoPE' object has no attribute 'base'".
    (dict(model_type="muse_spark"), "fused kernel at cache.offset"),
    # Its decoder module returns logits (altup, then the head): the hidden states drafted from were logits, and
    # drafting failed in the drafter's first matmul.
    (dict(model_type="gemma3n"), "applies the output head itself"),
    # Block-sparse layers mask by key count and add the cache's mask as numbers: a tree's logits were 0.4-0.6% off
    # at every node, under the self-check's tolerance (and mlx-lm's own decoding of a tiny one crashed on a CPU).
    (dict(model_type="phi3small"), "block-sparse"),
    # A vision-language wrapper is refused for the text model it builds.
    (dict(model_type="mistral3", text_config={**BASE, "model_type": "ministral3"}), "'ministral3' text model"),
    (dict(model_type="not_a_family"), "unsupported architecture"),
    # Runs its layers in two loops, each with caches of its own: it said "'iquestloopcoder': 4 layer caches for 2 layers".
    (dict(model_type="iquestloopcoder", head_dim=8, loop_num=2, loop_window_size=4),
     "cannot verify a draft tree: it keeps 8 caches for its 4 layers"),
    # Rope applied by a function at cache.offset in the attention code, no rope module to wrap: the adapter would
    # find their decoders (wte and h; embed and blocks) and verify trees wrongly.
    (dict(model_type="nanochat"), "mx.fast.rope at cache.offset"),
    (dict(model_type="talkie"), "mx.fast.rope at cache.offset"),
    (dict(model_type="lille-130m", block_size=512, n_embd=32, n_head=4, n_kv_heads=2, n_layer=2,
          layer_norm_eps=1e-5), "applies the output head itself"),
    (dict(model_type="phixtral", num_vocab=V, model_dim=32, num_heads=4, num_layers=2, rotary_dim=4),
     "takes the attention mask from its caller"),
    # Ling 2.5's layers are 3 in 4 linear attention (KDA) by default.
    (dict(model_type="bailing_moe_v3", layer_group_size=2, num_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=16, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
          v_head_dim=8, n_group=1, topk_group=1, moe_shared_expert_intermediate_size=16), "ArraysCaches"),
])
def test_families_that_cannot_verify_a_tree_are_refused(config, why):
    with pytest.raises(UnsupportedModelError, match=why) as info:
        new_model({**BASE, **config})
    assert "\n" not in str(info.value) and config["model_type"] in str(info.value)


def test_a_family_with_several_caches_per_layer_is_refused_for_what_it_is():
    """deepseek_v32's layers keep a CacheList (its sparse-attention indexer's keys beside the layer's): it was
    refused as "recurrent or hybrid layers ... (mlx-lm refuses speculative decoding for it too)", neither true."""
    config = dict(model_type="deepseek_v32", kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                  v_head_dim=8, index_head_dim=8, index_n_heads=2, index_topk=4, n_routed_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1)
    with pytest.raises(UnsupportedModelError, match="'deepseek_v32' cannot verify a draft tree: its layers keep "
                                                    "several caches each") as info:
        new_model({**BASE, **config, "num_hidden_layers": 2})
    assert "recurrent" not in str(info.value) and "mlx-lm refuses" not in str(info.value)


def test_a_family_whose_mlx_lm_module_lacks_a_package_is_refused_not_exited(monkeypatch, capsys):
    """mlx-lm's olmo module prints a hint and calls sys.exit when ai2-olmo is missing: load() ended the
    process. A module that imports a missing package was "unsupported architecture: mlx-lm has no model"."""
    import sys
    import types

    import mlx_lm.utils

    monkeypatch.setitem(sys.modules, "hf_olmo", None)  # not installed, whatever this machine has
    monkeypatch.delitem(sys.modules, "mlx_lm.models.olmo", raising=False)
    with pytest.raises(UnsupportedModelError, match="'olmo' cannot be loaded: .*pip install ai2-olmo"):
        new_model({**BASE, "model_type": "olmo"})
    assert capsys.readouterr().out == ""  # the hint is in the error, not printed beside it

    def import_module(name):
        raise ModuleNotFoundError("No module named 'fancy_kernels'", name="fancy_kernels")

    monkeypatch.setattr(mlx_lm.utils, "importlib", types.SimpleNamespace(import_module=import_module))
    with pytest.raises(UnsupportedModelError, match="'qwen2' cannot be loaded: .* imports fancy_kernels, which is not"):
        new_model({**BASE, "model_type": "qwen2"})


def test_the_rope_wrapper_passes_on_what_model_code_reads_off_its_rope():
    rope = base_model._TreeRoPE(nn.RoPE(8, base=500.0), base_model.TreeState())
    assert rope.base == 500.0 and rope.dims == 8
    with pytest.raises(AttributeError):
        rope.not_a_rope_attribute


def test_self_check_passes_and_catches_broken_tree_verification(monkeypatch):
    model = model_of("qwen3")
    ok, err = base_model.self_check(model)
    assert ok and err < 1e-4
    # Rope wrappers that ignore the tree's positions (as a new mlx-lm could make them): caught.
    monkeypatch.setattr(base_model._TreeRoPE, "__call__", lambda self, x, offset=0, **kw: self._rope(x, offset=offset))
    ok, err = base_model.self_check(model)
    assert not ok and err > base_model.CHECK_TOLERANCE
    monkeypatch.undo()
    # A small error in float32 (mistral4's attention scale read off cache.offset gave 0.045, under the 0.05
    # float16 needs, and greedy drafting then differed from plain decoding): caught where rounding is ~1e-6.
    real = base_model.TreeModel.__call__

    def slightly_off(self, tokens, cache=None, positions=None, mask=None, **kw):
        logits, h = real(self, tokens, cache, positions=positions, mask=mask, **kw)
        return (logits * 1.01 if mask is not None else logits), h

    monkeypatch.setattr(base_model.TreeModel, "__call__", slightly_off)
    ok, err = base_model.self_check(model)
    assert not ok and 0.005 < err < base_model.CHECK_TOLERANCE


def test_a_model_with_a_cache_no_layer_fills_is_refused_by_the_self_check():
    """nemotron-nas makes a cache for an attention block replaced by a linear layer: it stays empty, and
    the self-check failed with "ValueError: cannot rewind 1 tokens from a cache holding 0", which load()
    reported as a damaged config."""
    blocks = [{"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 1.0}},
              {"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 1.0}}]
    model = new_model({**BASE, "model_type": "nemotron-nas", "num_hidden_layers": 2, "block_configs": blocks})
    with pytest.raises(UnsupportedModelError, match="'nemotron-nas' cannot verify a draft tree: 1 of its 2 layer "
                                                    "caches take no keys"):
        base_model.self_check(model)


def test_a_model_failing_the_self_check_decodes_plainly(tiny_kit, tmp_path, monkeypatch):
    from redrafter_mlx import load

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))
    monkeypatch.setattr(base_model._TreeRoPE, "__call__", lambda self, x, offset=0, **kw: self._rope(x, offset=offset))
    with pytest.warns(RuntimeWarning, match="speculation off"):
        loaded = load(str(path), use_drafter=False)
    assert not loaded.tree_ok
    loaded.drafter = new_drafter(loaded.args, seed=1)
    plain = generate(loaded, "the cat", mode="ar", max_tokens=12)
    got = generate(loaded, "the cat", mode="redrafter", max_tokens=12)
    assert got.tokens == plain.tokens and got.stats.mode == "ar"


def test_a_model_whose_kernels_this_device_lacks_is_refused_in_one_line(tiny_kit, tmp_path, monkeypatch):
    """bitnet's forward calls Metal kernels: on a CPU its first forward (the self-check) raised a
    RuntimeError, which load() let through as a traceback."""
    from redrafter_mlx import load, loader

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))

    def no_metal(model):
        raise RuntimeError("[metal_kernel] No Metal back-end.")

    monkeypatch.setattr(loader, "self_check", no_metal)
    with pytest.raises(UnsupportedModelError, match="m loads but cannot run on this device .*No Metal back-end"):
        load(str(path), use_drafter=False)


def test_drafters_record_their_base_and_are_refused_elsewhere(tmp_path):
    qwen, gemma = model_of("qwen3"), model_of("gemma3_text")
    drafter = new_drafter(qwen.args)
    assert drafter.args.base_model_type == "qwen3" and drafter.args.embed_scale == 1.0
    save_drafter(drafter, tmp_path / "d")
    load_drafter(tmp_path / "d", qwen)
    with pytest.raises(DrafterMismatchError, match="qwen3"):
        load_drafter(tmp_path / "d", gemma)


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_a_drafter_trained_for_the_family_runs_lossless(family, tmp_path):
    """Distill the base model's greedy replies, train a head on them, and decode with it."""
    from redrafter_mlx.distill import generate_batch
    from redrafter_mlx.train import train

    model = model_of(family, seed=5)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, V, size=6)] for _ in range(24)]
    samples = [{"prompt": np.array(p, np.int32), "reply": np.array(r, np.int32), "hidden": h}
               for p, (r, h, _) in zip(prompts, generate_batch(model, prompts, 24, eos=[]))]
    drafter = train(model, samples, tmp_path / "run", depth=3, steps=40, batch=64, lr=3e-3, warmup=4,
                    draft_vocab=0, progress=False, save_every=1000)
    assert drafter.args.base_model_type == model.args.model_type
    assert drafter.args.embed_scale == model.args.embed_scale
    loaded = loaded_of(model, drafter)
    plain = generate(loaded, prompts[0], mode="ar", max_tokens=48)
    spec = generate(loaded, prompts[0], mode="redrafter", max_tokens=48, beam_width=2, beam_length=3, lookup=0)
    assert spec.tokens == plain.tokens
    assert spec.stats.tokens_per_step > 1.0  # the trained head's drafts are accepted


# ---- the registry -------------------------------------------------------------------------

# Hub repos known to be in the old `weights.npz` layout, which mlx-lm no longer loads.
OLD_LAYOUT = {"mlx-community/Llama-2-7b-chat-4-bit", "mlx-community/Llama-2-7b-chat-mlx"}


def test_registry_entries_are_well_formed():
    import re

    from redrafter_mlx import registry
    from redrafter_mlx.loader import model_classes

    models = registry.known_models()
    assert registry.default_model_name() in models
    for name, entry in models.items():
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", name), name
        assert entry.get("description"), name
        model_classes({"model_type": entry["family"]})  # a family mlx-lm builds and trees can verify
        if entry["source"] == "hf":
            assert re.fullmatch(r"[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+", entry["repo"]), name
            assert entry["repo"] not in OLD_LAYOUT, name
        else:
            assert entry["source"] == "pypi", name
            assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]) and entry["package"] and entry["version"], name
        if entry.get("drafter"):
            assert registry.shipped_drafter(entry) is not None, name


@pytest.mark.parametrize("family", ["llama", "gemma2", "mistral-sliding-window", "qwen3_moe", "gpt2", "afm7"])
def test_shape_buckets_pad_trees_without_changing_them(family):
    """With shape buckets on (where new shapes cost a compilation), a tree of 7 is verified as 8
    over keys padded to 256: the same logits as the sequential decode, and the cache holds
    only the tree afterwards."""
    model = model_of(family)
    model.use_shape_buckets(True)
    cache = model.make_cache()
    model(mx.array([PROMPT]), cache)
    positions, mask = tree_inputs(PARENTS, len(PROMPT))
    logits, hidden = model(mx.array([TOKENS]), cache, positions=positions, mask=mask)
    assert logits.shape[1] == len(TOKENS) and cache.offset == len(PROMPT) + len(TOKENS)
    for node in range(len(TOKENS)):
        want_logits, _ = sequential(model, [TOKENS[i] for i in path_to(node, PARENTS)])[-1]
        assert rel(logits[0, node], want_logits) < 1e-4, (family, node)
    path = path_to(6, PARENTS)
    cache.commit(len(PROMPT), path)
    after, _ = model(mx.array([[20]]), cache)
    want, _ = sequential(model, [TOKENS[i] for i in path] + [20])[-1]
    assert rel(after[0, -1], want) < 1e-4


def test_greedy_redrafter_with_shape_buckets_equals_plain_decoding():
    model = model_of("mistral-sliding-window", seed=2)
    loaded = loaded_of(model, new_drafter(model.args, seed=3))
    plain = generate(loaded, PROMPT, mode="ar", max_tokens=64)
    model.use_shape_buckets(True)
    for kw in (dict(tree=12, lookup=8), {}):
        got = generate(loaded, PROMPT, mode="redrafter", max_tokens=64, **kw)
        assert got.tokens == plain.tokens, kw
        if kw:  # padded trees were verified and drafts accepted: some step took 2+ draft tokens
            assert got.stats.mode == "redrafter" and max(got.stats.accepted_lengths) >= 3, got.stats.accepted_lengths


def test_padded_sizes():
    from redrafter_mlx.base_model import padded_size

    assert [padded_size(n) for n in (1, 2, 3, 5, 8, 9, 33, 64, 65, 130)] == [1, 2, 4, 8, 8, 16, 64, 64, 128, 192]


@pytest.fixture
def small_steps(monkeypatch):
    """Storage grows 8 tokens at a time and keeps 4 beyond a window: drops happen in a short run."""
    from redrafter_mlx.cache import KVCache

    monkeypatch.setattr(KVCache, "step", 8)
    monkeypatch.setattr(KVCache, "KEEP", 4)


@pytest.mark.parametrize("family", ["mistral-sliding-window", "gemma3_text", "cohere2"])
def test_windowed_layers_drop_old_keys_and_decode_the_same(family, small_steps):
    """Windowed layers keep about their window (plus a tree's worth), not the whole history:
    plain and ReDrafter decoding stay what they were, full-attention layers keep everything. The seeds are
    ones whose replies the drafts reach (at seed 4, mistral's tree=12 run accepted no draft and gemma3_text's
    one: the commits of accepted paths past dropped keys went untested)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import _get_classes
    from mlx.utils import tree_flatten

    from redrafter_mlx import PromptCache

    model = model_of(family, seed={"mistral-sliding-window": 2, "gemma3_text": 6}.get(family, 4))
    model_class, args_class = _get_classes(model.config)
    fresh = model_class(args_class.from_dict(model.config))
    fresh.load_weights(tree_flatten(model.parameters()), strict=True)
    want = [int(t) for t, _ in generate_step(mx.array(PROMPT), fresh, max_tokens=64)]
    loaded = loaded_of(model, new_drafter(model.args, seed=3))
    pc = PromptCache(model)
    assert generate(loaded, PROMPT, mode="ar", max_tokens=64, prompt_cache=pc).tokens == want
    windowed = [c for c in pc.cache if c.window]
    assert windowed and all(c.start > 0 and c.capacity <= c.window + 4 + 2 * 8 for c in windowed)
    assert all(c.start == 0 for c in pc.cache if not c.window)
    for kw in (dict(tree=12, lookup=8), {}):
        got = generate(loaded, PROMPT, mode="redrafter", max_tokens=64, prompt_cache=PromptCache(model),
                                **kw)
        assert got.tokens == want, kw
        if kw:  # drafting every step: some step took 2+ draft tokens
            assert got.stats.mode == "redrafter" and max(got.stats.accepted_lengths) >= 3, got.stats.accepted_lengths
    # Going back past what was dropped starts the cache over; the reply is still the same.
    assert not pc.cache.can_trim_to(len(PROMPT))
    again = generate(loaded, PROMPT, mode="auto", max_tokens=64, prompt_cache=pc)
    assert again.tokens == want and again.stats.prompt_tokens == len(PROMPT)
    with pytest.raises(ValueError, match="dropped"):
        windowed[0].rewind(windowed[0].offset - windowed[0].start)
