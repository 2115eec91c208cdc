"""Greedy decoding of the default model equals an independent implementation of the same weights:
mlx-lm's own Llama module and KV cache, 10 MT-Bench prompts x 64 tokens."""

import json

import mlx.core as mx
import pytest
from helpers import SHARED_DATA
from mlx.utils import tree_flatten

from redrafter_mlx import generate, load


@pytest.fixture(scope="module")
def models():
    ours = load("smollm2-135m", use_drafter=False)
    from mlx_lm.models import llama as mllama

    a = ours.args
    ref = mllama.Model(mllama.ModelArgs(
        model_type="llama", hidden_size=a.hidden_size, num_hidden_layers=a.num_hidden_layers,
        intermediate_size=a.intermediate_size, num_attention_heads=a.num_attention_heads,
        rms_norm_eps=a.rms_norm_eps, vocab_size=a.vocab_size, num_key_value_heads=a.num_key_value_heads,
        head_dim=a.head_dim, max_position_embeddings=a.max_position_embeddings, rope_theta=a.rope_theta,
        rope_traditional=a.rope_traditional, tie_word_embeddings=a.tie_word_embeddings))
    ref.load_weights(tree_flatten(ours.model.parameters()), strict=True)
    mx.eval(ref.parameters())
    return ours, ref


def mlx_lm_greedy(model, ids, n):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)
    out = []
    for _ in range(n):
        t = int(mx.argmax(logits[0, -1]))
        out.append(t)
        logits = model(mx.array([[t]]), cache=cache)
    return out


def test_greedy_matches_mlx_lm_on_mt_bench(models):
    path = SHARED_DATA / "mt_bench.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found (../shared/data beside the repository)")
    ours, ref = models
    questions = [json.loads(line)["turns"][0] for line in path.read_text().splitlines()[:10]]
    for q in questions:
        ids = ours.tokenizer.prompt_ids(q)
        got = generate(ours, ids, mode="ar", max_tokens=64)
        want = mlx_lm_greedy(ref, ids, 64)
        eos = set(ours.tokenizer.eos_token_ids)
        cut = next((i for i, t in enumerate(want) if t in eos), len(want))
        assert got.tokens == want[:cut], q
