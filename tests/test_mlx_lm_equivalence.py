"""Greedy decoding of the default model (float32) is token-for-token identical to an independent
implementation of the same weights: a fresh mlx-lm Llama module (no tree wrappers) and mlx-lm's KV
cache, fed the same prompt ids, for the first 10 MT-Bench questions (first turn, in the chat template) x 64 tokens."""

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from redrafter_mlx import generate, load

N_PROMPTS = 10
N_TOKENS = 64


@pytest.fixture(scope="module")
def questions(shared_data):
    path = shared_data / "mt_bench.jsonl"
    if not path.is_file():
        pytest.skip(f"MT-Bench prompts not found at {path} (expected in ../shared/data beside the repository)")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line)["turns"][0] for line in lines[:N_PROMPTS]]


@pytest.fixture(scope="module")
def ours(default_model):
    if default_model.weight_format == "float32":
        return default_model
    return load("smollm2-135m", weight_format="float32", use_drafter=False)  # e.g. on a GPU


@pytest.fixture(scope="module")
def reference(ours):
    """A fresh mlx-lm model built from our config (GGUF weights: traditional rope), without the
    tree wrappers, holding our float32 weights."""
    from mlx_lm.utils import _get_classes

    assert ours.model.config["rope_traditional"] and ours.model.config.get("rope_scaling") is None
    model_class, args_class = _get_classes(ours.model.config)
    ref = model_class(args_class.from_dict(ours.model.config))
    weights = tree_flatten(ours.model.parameters())
    assert all(v.dtype == mx.float32 for _, v in weights)
    ref.load_weights(weights, strict=True)
    mx.eval(ref.parameters())
    return ref


def mlx_lm_greedy(model, ids, n):
    """Plain greedy decoding with mlx-lm's model and prompt cache."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)
    out = []
    for _ in range(n):
        token = int(mx.argmax(logits[0, -1]))
        out.append(token)
        logits = model(mx.array([[token]]), cache=cache)
    return out


@pytest.mark.parametrize("index", range(N_PROMPTS))
def test_greedy_matches_mlx_lm_on_mt_bench(ours, reference, questions, index):
    question = questions[index]
    ids = ours.tokenizer.prompt_ids(question)  # chat template (with the model's default system prompt)
    suffix = ours.tokenizer.hf.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[-len(suffix):] == suffix and question in ours.tokenizer.decode(ids)
    want = mlx_lm_greedy(reference, ids, N_TOKENS)
    got = generate(ours, ids, mode="ar", max_tokens=N_TOKENS)
    assert got.prompt_tokens == ids
    eos = set(ours.tokenizer.eos_token_ids)
    cut = next((i for i, t in enumerate(want) if t in eos), None)
    if cut is None:
        assert got.finish_reason == "length"
        assert got.tokens == want, f"differs at token {first_difference(got.tokens, want)} for {question!r}"
    else:  # ours stops at the end-of-turn token and does not emit it
        assert got.finish_reason == "eos"
        assert got.tokens == want[:cut], f"differs at token {first_difference(got.tokens, want)} for {question!r}"


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
