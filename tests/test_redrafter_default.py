"""ReDrafter on the default model (SmolLM2-135M-Instruct): greedy output equals plain decoding,
with a random draft head and with the shipped trained one."""

import pytest

from redrafter_mlx import generate, load
from redrafter_mlx.drafter import new_drafter

PROMPTS = [
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
]


@pytest.fixture(scope="module")
def default_model():
    return load("smollm2-135m")


@pytest.fixture(scope="module")
def plain(default_model):
    return {p: generate(default_model, p, mode="ar", max_tokens=96).tokens for p in PROMPTS}


@pytest.mark.parametrize("width,length", [(4, 4), (8, 5)])
def test_random_drafter_is_lossless(default_model, plain, width, length):
    m = default_model
    saved = m.drafter
    m.drafter = new_drafter(m.args, lm_head="shared", seed=1)
    try:
        for p in PROMPTS:
            rd = generate(m, p, mode="redrafter", max_tokens=96, beam_width=width, beam_length=length)
            assert rd.tokens == plain[p]
    finally:
        m.drafter = saved


@pytest.mark.parametrize("width,length", [(1, 4), (4, 5)])
def test_shipped_drafter_is_lossless_and_accepts(default_model, plain, width, length):
    m = default_model
    if m.drafter is None:
        pytest.skip("no drafter shipped for smollm2-135m under models/smollm2-135m/drafter")
    steps = tokens = 0
    for p in PROMPTS:
        rd = generate(m, p, mode="redrafter", max_tokens=96, beam_width=width, beam_length=length)
        assert rd.tokens == plain[p]
        steps += rd.stats.steps
        tokens += rd.stats.step_tokens
    assert tokens / steps > 1.3  # a trained head gets drafts accepted
