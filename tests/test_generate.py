"""Plain (ar) generation: greedy decoding against a cache-free reference, seeded sampling,
top-p, stopping rules (max_tokens, EOS, context, cancellation) and PromptCache consistency."""

import mlx.core as mx
import numpy as np
import pytest

from redrafter_mlx import generate, stream
from redrafter_mlx.errors import ContextLengthError, RedrafterError
from redrafter_mlx.generate import PREFILL_CHUNK, PromptCache
from redrafter_mlx.sampling import Sampler, apply_top_p
from redrafter_mlx.stats import RunStats

PROMPT = "the cat"


def greedy_direct(model, ids, n):
    """Reference greedy decoding: a full forward pass over the whole sequence for every token."""
    ids, out = list(ids), []
    for _ in range(n):
        t = int(mx.argmax(model(mx.array([ids]))[0][0, -1]))
        out.append(t)
        ids.append(t)
    return out


def assert_cache_holds(model, pc: PromptCache):
    """The PromptCache's K/V are exactly those of its ids: every layer at len(ids), contents equal
    to a fresh prefill of the ids."""
    assert [c.offset for c in pc.cache] == [len(pc.ids)] * len(pc.cache)
    fresh = model.make_cache()
    model(mx.array([pc.ids]), fresh)
    for ours, ref in zip(pc.cache, fresh):
        n = len(pc.ids)
        assert np.allclose(np.array(ours.keys[..., :n, :]), np.array(ref.keys[..., :n, :]), atol=1e-5)
        assert np.allclose(np.array(ours.values[..., :n, :]), np.array(ref.values[..., :n, :]), atol=1e-5)


# ---- greedy ------------------------------------------------------------------------------

def test_greedy_equals_cache_free_reference_and_is_deterministic(tiny_loaded):
    m = tiny_loaded
    a = generate(m, PROMPT, max_tokens=24)
    assert a.finish_reason == "length" and len(a.tokens) == 24
    assert a.tokens == greedy_direct(m.model, a.prompt_tokens, 24)
    b = generate(m, PROMPT, max_tokens=24)
    assert b.tokens == a.tokens and b.text == a.text
    assert a.stats.mode == "auto" and a.stats.new_tokens == 24 and a.stats.prompt_tokens == len(a.prompt_tokens)
    assert a.text == m.tokenizer.decode(a.tokens, skip_special_tokens=True)


def test_long_prompt_prefills_in_chunks(tiny_loaded):
    m = tiny_loaded
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(0, 256, PREFILL_CHUNK + 37)]
    lines = []
    g = generate(m, ids, max_tokens=4, mode="ar", progress=lines.append)
    assert g.prompt_tokens == ids
    assert g.tokens == greedy_direct(m.model, ids, 4)
    # a prompt longer than one chunk says how far its reading got; one chunk or less says nothing
    assert lines == [f"reading the prompt: {i} of {len(ids)} tokens" for i in (0, PREFILL_CHUNK)]
    lines.clear()
    generate(m, ids[:PREFILL_CHUNK], max_tokens=1, mode="ar", progress=lines.append)
    assert lines == []
    # cancelled between chunks: the time spent reading is reported with it
    g = generate(m, [1] + ids, max_tokens=4, mode="ar", should_stop=lambda: True)
    assert g.finish_reason == "cancelled" and g.tokens == [] and g.stats.prefill_seconds > 0
    # stopped before it starts: nothing is read or emitted (a prompt of one chunk was read and gave a token)
    pc = PromptCache(m.model)
    g = generate(m, ids[:8], max_tokens=4, mode="ar", should_stop=lambda: True, prompt_cache=pc)
    assert g.finish_reason == "cancelled" and g.tokens == [] and g.stats.new_tokens == 0 and pc.ids == []


def test_stream_events(tiny_loaded):
    m = tiny_loaded
    events = list(stream(m, PROMPT, max_tokens=5))
    assert [len(e.tokens) for e in events] == [1, 1, 1, 1, 1]
    assert events[0].step is None and all(e.step is not None for e in events[1:])
    assert [e.finish_reason for e in events] == [None] * 4 + ["length"]
    assert all(e.stats is events[0].stats for e in events)
    assert events[-1].stats.new_tokens == 5 and events[-1].stats.steps == 4
    # generate() counts the events stream yielded (it counted the decode steps: 4 of these 5)
    g = generate(m, PROMPT, max_tokens=5)
    assert g.events == len(events) == 5 and len(g.step_stats) == g.stats.steps == 4



def test_generate_returns_the_prompt_ids_stream_read(tiny_loaded, monkeypatch):
    """generate() rendered the chat template a second time for prompt_tokens, after stream had: twice the
    work, and ids the model never read where a template is not deterministic (a date in it) or the
    tokenizer changed in between. The first event carries the ids stream read; later ones carry None."""
    real, calls = tiny_loaded.tokenizer.prompt_ids, []

    def prompt_ids(prompt, system=None):  # a template that renders differently each time
        calls.append(prompt)
        return real(prompt, system=system) + [5] * len(calls)

    monkeypatch.setattr(tiny_loaded.tokenizer, "prompt_ids", prompt_ids)
    g = generate(tiny_loaded, PROMPT, mode="ar", max_tokens=3)
    assert len(calls) == 1 and g.prompt_tokens == real(PROMPT) + [5] and g.stats.prompt_tokens == len(g.prompt_tokens)
    events = list(stream(tiny_loaded, PROMPT, mode="ar", max_tokens=3))
    assert events[0].prompt_ids == real(PROMPT) + [5, 5] and [e.prompt_ids for e in events[1:]] == [None, None]
    # a reply cancelled before its first token still says what was read
    cancelled = generate(tiny_loaded, PROMPT, mode="ar", max_tokens=3, should_stop=lambda: True)
    assert cancelled.finish_reason == "cancelled" and cancelled.prompt_tokens == real(PROMPT) + [5, 5, 5]

def with_drafter(tiny_kit, tmp_path):
    """The tiny model loaded with a (random) drafter of its own."""
    from redrafter_mlx import load
    from redrafter_mlx.drafter import new_drafter, save_drafter

    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "m", model)
    save_drafter(new_drafter(model.args, lm_head="shared", seed=1), path / "drafter")
    return load(str(path))


def test_numpy_settings_give_stats_json_can_write(tiny_kit, tmp_path):
    """Counts given as numpy integers (a sweep over np.arange) were kept as such in RunStats, whose
    to_dict() json.dumps then refused ("Object of type int64 is not JSON serializable")."""
    import json

    m = with_drafter(tiny_kit, tmp_path)
    g = generate(m, PROMPT, mode="redrafter", max_tokens=np.int64(6), beam_width=np.int64(2),
                 beam_length=np.int32(3), lookup=np.int64(0))
    assert g.stats.beam_width == 2 and type(g.stats.beam_width) is int and len(g.tokens) == 6
    assert json.loads(json.dumps(g.stats.to_dict()))["beam_length"] == 3
    g = generate(m, PROMPT, mode="redrafter", max_tokens=6, tree=np.int64(8), tree_min_prob=np.float32(0.2))
    assert json.loads(json.dumps(g.stats.to_dict()))["tree"] == 8


def test_stats_to_dict_holds_every_figure(tiny_loaded):
    """to_dict() left out cached_tokens (the prompt tokens a PromptCache held), so a JSON record of a
    chat's later turn could not tell what was read from what was reused."""
    import dataclasses

    pc = PromptCache(tiny_loaded.model)
    generate(tiny_loaded, PROMPT, max_tokens=4, mode="ar", prompt_cache=pc)
    d = generate(tiny_loaded, PROMPT + " more", max_tokens=4, mode="ar", prompt_cache=pc).stats.to_dict()
    assert d["cached_tokens"] > 0 and d["cached_tokens"] < d["prompt_tokens"]
    as_histogram = {"accepted_lengths": "accepted_length_histogram"}
    assert [f.name for f in dataclasses.fields(RunStats) if as_histogram.get(f.name, f.name) not in d] == []


def test_plain_decoding_verifies_one_token_a_step(tiny_kit, tmp_path):
    """packed_per_step is 1 for a plain step, as the adaptive controller's parked steps count: mode "ar" read 0.00
    (its to_dict() too), its steps packing no draft tree."""
    m = with_drafter(tiny_kit, tmp_path)
    s = generate(m, PROMPT, mode="ar", max_tokens=5).stats
    assert s.steps == 4 and s.packed_per_step == 1.0 and s.to_dict()["packed_per_step"] == 1.0
    # (what drafting stopped at beam length 1 runs: plain decoding too)
    assert generate(m, PROMPT, mode="auto", beam_length=1, max_tokens=5).stats.packed_per_step == 1.0
    s = generate(m, PROMPT, mode="redrafter", beam_width=2, beam_length=3, lookup=0, max_tokens=5).stats
    assert s.packed_per_step == s.packed_tokens / s.steps > 1  # each step verifies the root and its drafts


def test_merged_tokens_counts_the_drafts_the_prefix_merge_removed(tiny_kit, tmp_path):
    """W * L per step minus packed went negative with a lookup copy (packed too: -40 for 1 x 2 beams and
    lookup 8) and counted W - 1 copies of the root as merged."""
    m = with_drafter(tiny_kit, tmp_path)
    prompt = "the cat the cat the cat"
    s = generate(m, prompt, mode="redrafter", max_tokens=30, beam_width=3, beam_length=3, lookup=0).stats
    assert s.merged_tokens == s.steps * (3 * 2 + 1) - s.packed_tokens  # each step: 6 drafts and the root
    for kw in (dict(beam_width=1, beam_length=2, lookup=8), dict(tree=8, lookup=8)):
        s = generate(m, prompt, mode="redrafter", max_tokens=30, **kw).stats
        assert s.looked_up_tokens > 0 and 0 <= s.merged_tokens == s.drafted_tokens + s.steps - s.packed_tokens, kw
    assert generate(m, prompt, mode="ar", max_tokens=5).stats.merged_tokens == 0


def test_a_prompt_of_the_wrong_shape_says_what_to_pass(tiny_loaded):
    """One message (a dict) read "not dict", and a (1, T) batch of ids (a tokenizer's return_tensors)
    "token ids are whole numbers ..., not [3, 4, 5]": what the prompt is not, not what to pass."""
    from redrafter_mlx.errors import InvalidPromptError

    with pytest.raises(InvalidPromptError, match=r"not one message \(dict\): put it in a list"):
        generate(tiny_loaded, {"role": "user", "content": "hi"}, mode="ar")
    for batch in (np.array([[3, 4, 5]]), [[3, 4, 5]]):
        with pytest.raises(InvalidPromptError, match=r"one flat list .*\(pass ids\[0\] for a batch of one"):
            generate(tiny_loaded, batch, mode="ar")
    assert generate(tiny_loaded, np.array([[3, 4, 5]])[0], mode="ar", max_tokens=2).prompt_tokens == [3, 4, 5]


def test_a_single_token_id_as_the_prompt_says_to_put_it_in_a_list(tiny_loaded):
    """A numpy or MLX scalar (np.int64(5), ids[0] of an array, mx.array(5)) has a tolist() but no len(): it ended in
    a TypeError traceback ("object of type 'numpy.int64' has no len()"), where a Python int is refused in one line."""
    from redrafter_mlx.errors import InvalidPromptError

    for one in (5, np.int64(5), np.array(5), mx.array(5), np.array([[3, 4, 5]])[0][0]):
        with pytest.raises(InvalidPromptError, match=r"list of token ids, not \w+: one token id is a list of one"):
            generate(tiny_loaded, one, mode="ar")
    with pytest.raises(InvalidPromptError, match=r"list of token ids, not ndarray$"):
        generate(tiny_loaded, np.array(0.5), mode="ar")
    assert generate(tiny_loaded, [np.int64(5)], mode="ar", max_tokens=1).prompt_tokens == [5]


def test_max_tokens(tiny_loaded):
    m = tiny_loaded
    full = generate(m, PROMPT, max_tokens=12).tokens
    for n in (1, 2, 7):
        g = generate(m, PROMPT, max_tokens=n)
        assert g.finish_reason == "length" and g.tokens == full[:n]


# ---- sampling ------------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible(tiny_loaded):
    m = tiny_loaded
    kw = dict(max_tokens=20, temperature=1.0)
    a = generate(m, PROMPT, seed=7, **kw).tokens
    assert generate(m, PROMPT, seed=7, **kw).tokens == a
    assert generate(m, PROMPT, seed=8, **kw).tokens != a
    assert a != generate(m, PROMPT, max_tokens=20).tokens  # not greedy
    # A PromptCache holding the prompt does not change the draw.
    pc = PromptCache(m.model)
    generate(m, PROMPT, max_tokens=3, prompt_cache=pc)
    assert generate(m, PROMPT, seed=7, prompt_cache=pc, **kw).tokens == a


def test_tiny_top_p_is_greedy(tiny_loaded):
    """A nucleus that holds only the most likely token makes sampling greedy."""
    m = tiny_loaded
    greedy = generate(m, PROMPT, max_tokens=15).tokens
    for seed in (1, 2):
        assert generate(m, PROMPT, max_tokens=15, temperature=1.0, top_p=1e-6, seed=seed).tokens == greedy
        # with temperature 0, top_p and seed are checked and not used (stream's docstring)
        assert generate(m, PROMPT, max_tokens=15, top_p=0.3, seed=seed).tokens == greedy
    # below float32's least number a top_p rounded to 0 and kept no token: NaN, token 0 every step
    for top_p in (1e-46, 1e-320):
        assert generate(m, PROMPT, max_tokens=15, temperature=1.0, top_p=top_p, seed=1).tokens == greedy
        assert generate(m, PROMPT, max_tokens=15, temperature=0.7, top_p=top_p, seed=1, mode="auto").tokens == greedy


def test_a_tiny_temperature_is_greedy(tiny_loaded):
    """logits / T overflowed below T ~ 1e-38 and gave NaN: token 0 every time (an empty reply)."""
    m = tiny_loaded
    greedy = generate(m, PROMPT, max_tokens=12).tokens
    for t in (1e-45, 1e-320, 1e-30):
        assert generate(m, PROMPT, max_tokens=12, temperature=t, seed=3).tokens == greedy
        assert generate(m, PROMPT, max_tokens=12, temperature=t, top_p=0.5, seed=3, mode="auto").tokens == greedy


def test_apply_top_p_keeps_the_nucleus():
    probs = np.array([[0.05, 0.3, 0.5, 0.15], [0.5, 0.3, 0.15, 0.05]])
    logits = mx.array(np.log(probs).astype(np.float32))
    kept = lambda p: np.isfinite(np.array(apply_top_p(logits, p))).tolist()  # noqa: E731
    assert kept(0.4) == [[False, False, True, False], [True, False, False, False]]
    assert kept(0.75) == [[False, True, True, False], [True, True, False, False]]
    assert kept(0.9) == [[False, True, True, True], [True, True, True, False]]
    assert kept(1.0) == [[True] * 4] * 2
    assert kept(1e-46) == [[False, False, True, False], [True, False, False, False]]  # the likeliest, always
    # Kept logits are unchanged.
    out = np.array(apply_top_p(logits, 0.75))
    assert np.allclose(out[0, 1:3], np.log(probs[0, 1:3]))


def test_sampler_draws_from_the_renormalized_nucleus():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    n = 4000
    logits = mx.broadcast_to(mx.array(np.log(probs).astype(np.float32)), (n, 4))
    s = Sampler(temperature=1.0, top_p=0.75, seed=0)
    lp = np.exp(np.array(s.logprobs(logits[:1])))[0]
    assert np.allclose(lp, [0.5 / 0.8, 0.3 / 0.8, 0, 0], atol=1e-6)
    draws = np.array(s(logits))
    counts = np.bincount(draws, minlength=4) / n
    assert counts[2:].sum() == 0
    assert abs(counts[0] - 0.625) < 0.04 and abs(counts[1] - 0.375) < 0.04
    # Temperature: frequencies follow softmax(logits / T).
    s = Sampler(temperature=0.5, seed=1)
    want = probs**2 / (probs**2).sum()
    counts = np.bincount(np.array(s(logits)), minlength=4) / n
    assert np.abs(counts - want).max() < 0.04
    # Greedy: the argmax.
    assert np.array(Sampler()(logits[:3])).tolist() == [0, 0, 0]
    # Same seed, same draws; another seed, other draws.
    assert np.array_equal(np.array(Sampler(1.0, seed=5)(logits)), np.array(Sampler(1.0, seed=5)(logits)))
    assert not np.array_equal(np.array(Sampler(1.0, seed=5)(logits)), np.array(Sampler(1.0, seed=6)(logits)))


def test_positional_draws_follow_the_nucleus_and_are_independent():
    """Decoding draws with positions (Gumbel-max, one key per seed and position); the test above
    checks the key chain only. Over seeds, a position's draw follows the renormalized nucleus,
    draws at two positions are independent, and rows at one position share their draw."""
    from scipy.stats import chisquare

    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = mx.broadcast_to(mx.array(np.log(probs).astype(np.float32)), (2, 4))
    want = np.array([0.5, 0.3, 0, 0]) / 0.8
    pairs = np.zeros((4, 4))
    for seed in list(range(1500)) + [2**64 - 1]:
        a, b = np.array(Sampler(1.0, 0.75, seed)(logits, np.array([40, 41]))).tolist()
        pairs[a, b] += 1
    assert pairs[2:].sum() == pairs[:, 2:].sum() == 0  # nothing outside the nucleus
    kept = pairs[:2, :2].ravel()
    assert chisquare(kept, np.outer(want[:2], want[:2]).ravel() * kept.sum()).pvalue > 1e-3  # independent, p = q
    siblings = np.array(Sampler(1.0, seed=3)(mx.broadcast_to(logits[:1], (64, 4)), np.full(64, 9)))
    assert len(set(siblings.tolist())) == 1
    spread = np.array(Sampler(1.0, seed=3)(mx.broadcast_to(logits[:1], (64, 4)), np.arange(64)))
    assert len(set(spread.tolist())) > 1


def test_seeds_a_golden_step_apart_draw_unrelated_noise():
    """position_key mixed seed + GOLDEN * (position + 1) in one go, so seed s at position p + 1 had
    the key of seed s + GOLDEN at position p: two replies with such seeds drew shifted copies of one
    noise. Keys of nearby (seed, position) pairs, and of seeds a multiple of GOLDEN apart, now all differ."""
    from redrafter_mlx.sampling import GOLDEN, SEED_MAX, position_key

    logits = mx.zeros((32, 64))  # uniform over 64 tokens: equal draws at 32 positions by chance are ~64**-32
    for seed in (0, 7, SEED_MAX):
        for shift in (1, 2, 5):
            other = (seed + shift * GOLDEN) & SEED_MAX
            a = np.array(Sampler(1.0, seed=seed)(logits, np.arange(shift, shift + 32)))
            b = np.array(Sampler(1.0, seed=other)(logits, np.arange(32)))
            assert not np.array_equal(a, b), (seed, shift)
    pairs = [(s, p) for s in list(range(8)) + [(k * GOLDEN) & SEED_MAX for k in range(1, 8)] for p in range(64)]
    assert len({position_key(s, p) for s, p in pairs}) == len(pairs)


def test_a_temperature_given_as_a_large_int_samples_as_its_float_does(tiny_loaded):
    """An int temperature past int64 (10**30) reached MLX's division as a RuntimeError 'std::bad_cast'."""
    logits = mx.array(np.random.default_rng(0).normal(size=(8, 40)).astype(np.float32))
    for t in (10**30, 2**64, 7):
        assert np.array_equal(np.array(Sampler(t, seed=3)(logits, np.arange(8))),
                              np.array(Sampler(float(t), seed=3)(logits, np.arange(8)))), t
    g = generate(tiny_loaded, PROMPT, max_tokens=5, temperature=10**30, seed=1)
    assert g.tokens == generate(tiny_loaded, PROMPT, max_tokens=5, temperature=1e30, seed=1).tokens


# 10**400: an int past float's range, which math.isfinite met with an OverflowError traceback
@pytest.mark.parametrize("kw", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(temperature=10**400)])
def test_bad_sampling_parameters(tiny_loaded, kw):
    with pytest.raises(ValueError, match="temperature|top_p"):
        Sampler(**kw)
    with pytest.raises(ValueError, match="temperature|top_p"):
        generate(tiny_loaded, PROMPT, **kw)


def test_bad_generation_parameters(tiny_loaded):
    with pytest.raises(ValueError, match="max_tokens"):
        generate(tiny_loaded, PROMPT, max_tokens=0)
    with pytest.raises(ValueError, match="mode"):
        generate(tiny_loaded, PROMPT, mode="fast")
    with pytest.raises(RedrafterError, match="no drafter"):
        generate(tiny_loaded, PROMPT, mode="redrafter")


def test_generate_shows_the_settings_it_takes():
    """generate(loaded, prompt, **kwargs) showed help(), inspect and editors no setting at all."""
    import inspect

    from redrafter_mlx import Generation

    sig = inspect.signature(generate)
    assert list(sig.parameters) == list(inspect.signature(stream).parameters)
    assert sig.parameters["temperature"].default == 0.0 and sig.parameters["seed"].default is None
    assert sig.return_annotation is Generation


def test_help_of_stream_and_generate_says_what_each_setting_means_and_its_default():
    """help(stream) (which generate points to) had no entry for should_stop, context_graph or tree_min_prob,
    and did not say the default of mode, max_tokens, top_p, draft_top_k, use_drafter, prompt_cache or progress."""
    from helpers import undocumented_settings

    assert undocumented_settings(stream) == {}
    assert "help(stream)" in generate.__doc__


def test_help_of_prompt_cache_says_what_it_is_made_with():
    """PromptCache's docstring did not name its argument, which is the base model (loaded.model), not the
    LoadedModel that load() returns."""
    from helpers import undocumented_settings

    assert undocumented_settings(PromptCache, skip=()) == {}
    assert "loaded.model" in PromptCache.__doc__ and PromptCache.reset.__doc__


def test_a_loaded_model_reads_as_one_line_that_names_it(tiny_kit, tmp_path):
    """`>>> m` printed the dataclass's whole repr: the drafter's module tree over several lines, the adaptive
    controllers, the registry entry (1.7 KB for the default model). It is one line: name, file, weight format,
    drafter and context."""
    m = with_drafter(tiny_kit, tmp_path)
    text = repr(m)
    assert "\n" not in text and len(text) < 400, text
    assert text.startswith("LoadedModel(name=") and repr(m.name) in text and repr(m.weight_format) in text
    assert repr(str(m.drafter_path)) in text and f"context_length={m.context_length}" in text
    from redrafter_mlx import load

    assert "drafter=None" in repr(load(str(m.path), use_drafter=False))


def test_a_prompt_cache_reads_as_the_tokens_it_holds(tiny_loaded):
    """repr(PromptCache) was Python's default, <redrafter_mlx.generate.PromptCache object at 0x...>."""
    pc = PromptCache(tiny_loaded.model)
    assert repr(pc) == "PromptCache(0 tokens)"
    generate(tiny_loaded, PROMPT, max_tokens=3, mode="ar", prompt_cache=pc)
    assert repr(pc) == f"PromptCache({len(pc.ids)} tokens)" and len(pc.ids) > 0


def test_a_generation_reads_without_its_steps(tiny_loaded):
    """`>>> out` listed a StepStats of ~280 characters per decode step (30-70 KB for a 256-token reply) in the
    middle of the reply's fields; the steps stay in out.step_stats, and out.stats sums them."""
    out = generate(tiny_loaded, PROMPT, max_tokens=12, mode="ar")
    assert len(out.step_stats) == out.stats.steps > 0
    text = repr(out)
    assert "StepStats(" not in text and "step_stats" not in text
    assert repr(out.text) in text and f"finish_reason={out.finish_reason!r}" in text and "stats=RunStats(" in text


def test_stream_refuses_bad_arguments_when_called(tiny_loaded):
    """stream() is read as a generator: its checks waited for the first next(), so a typo, a bad
    setting or an empty prompt said nothing at the call, and the error came wherever the events were
    read (a UI's worker thread). Now they are raised at the call; the model runs from the first next()."""
    import threading

    from redrafter_mlx.errors import EmptyPromptError, SettingError

    m = tiny_loaded
    with pytest.raises(TypeError, match="temprature.*did you mean 'temperature'"):
        stream(m, PROMPT, temprature=0.7)
    with pytest.raises(SettingError, match="temperature"):
        stream(m, PROMPT, temperature=-1)
    with pytest.raises(SettingError, match="seed"):
        stream(m, PROMPT, temperature=1.0, seed=-1)
    with pytest.raises(EmptyPromptError):
        stream(m, " ")
    with pytest.raises(SettingError, match="takes the model that load"):
        stream("smollm2-135m", PROMPT)
    # checked here, read in another thread: the same reply as generate's
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.9, seed=11)
    events, got = stream(m, PROMPT, **kw), []
    thread = threading.Thread(target=lambda: got.extend(t for e in events for t in e.tokens))
    thread.start()
    thread.join()
    assert got == generate(m, PROMPT, **kw).tokens and len(got) == 12


@pytest.mark.parametrize("name,said", [("temp", "did you mean 'temperature'?"), ("max_new_tokens", "'max_tokens'"),
                                       ("max_length", "'max_tokens'"), ("top_k", "top-k sampling is not offered"),
                                       ("stop", "should_stop"), ("stream", "stream() yields"),
                                       ("beam_widht", "did you mean 'beam_width'?"),
                                       ("model", "the model is the first argument"), ("min_tokens", "not offered"),
                                       ("stop_strings", "should_stop"), ("eos_token_id", "should_stop"),
                                       ("num_beams", "shape drafting"), ("verbose", "stats"),
                                       ("prompt_progress_callback", "'progress'")])
def test_an_unknown_setting_is_not_read_as_an_unrelated_one(tiny_loaded, name, said):
    """Read as typos of the nearest setting, other libraries' names pointed to unrelated ones: mlx-lm's
    `temp` was "did you mean 'system'?", `top_k` and `stop` "did you mean 'top_p'?", `model` "did you mean
    'mode'?", vLLM's `min_tokens` "did you mean 'max_tokens'?"; transformers' stop_strings, eos_token_id and
    num_beams, mlx-lm's verbose and prompt_progress_callback said nothing."""
    for call in (generate, stream):
        with pytest.raises(TypeError) as e:
            call(tiny_loaded, PROMPT, **{name: 1})
        assert str(e.value).startswith(f"{call.__name__}() got an unexpected keyword argument {name!r}")
        assert said in str(e.value), str(e.value)
    with pytest.raises(TypeError) as e:
        generate(tiny_loaded, PROMPT, colour=1)
    assert str(e.value) == "generate() got an unexpected keyword argument 'colour'"


# ---- stopping rules ------------------------------------------------------------------------

def test_eos_stops_generation(tiny_loaded):
    m = tiny_loaded
    free = generate(m, PROMPT, max_tokens=30).tokens
    k = next(i for i in range(3, 30) if free[i] not in free[:i])  # first occurrence of some token
    m.tokenizer.eos_token_ids = [free[k]]
    g = generate(m, PROMPT, max_tokens=30)
    assert g.finish_reason == "eos" and g.tokens == free[:k]  # the EOS token itself is not emitted
    # The step that produced the end token counts it: plain decoding is exactly 1 token per step.
    assert g.stats.end_tokens == 1 and g.stats.steps == k and g.stats.tokens_per_step == 1.0
    assert set(g.stats.histogram()) == {1}
    # EOS as the very first token.
    m.tokenizer.eos_token_ids = [free[0]]
    g = generate(m, PROMPT, max_tokens=30)
    assert g.finish_reason == "eos" and g.tokens == [] and g.text == ""


def test_context_limit(tiny_loaded):
    m = tiny_loaded
    ids = m.tokenizer.prompt_ids(PROMPT)
    free = generate(m, PROMPT, max_tokens=30).tokens
    m.args.max_position_embeddings = len(ids) + 10
    assert m.context_length == len(ids) + 10
    pc = PromptCache(m.model)
    g = generate(m, PROMPT, max_tokens=30, prompt_cache=pc)
    # Every context position is used; the last token is predicted from a full window and never fed.
    assert g.finish_reason == "context" and g.tokens == free[:11]
    assert len(pc.ids) == m.context_length and pc.cache.offset == m.context_length
    # max_tokens reached exactly at the limit: "length" wins.
    assert generate(m, PROMPT, max_tokens=11).finish_reason == "length"
    # The longest prompt that fits: one token.
    m.args.max_position_embeddings = len(ids) + 1
    g = generate(m, PROMPT, max_tokens=30)
    assert g.finish_reason == "context" and g.tokens == free[:2]
    # A prompt filling the context leaves no room: refused before any work.
    m.args.max_position_embeddings = len(ids)
    with pytest.raises(ContextLengthError, match=rf"{len(ids)} tokens .* context of {len(ids)}"):
        generate(m, PROMPT)


# ---- cancellation and PromptCache -----------------------------------------------------------

def stop_after(n):
    calls = {"n": 0}

    def should_stop():
        calls["n"] += 1
        return calls["n"] > n

    return should_stop


def test_should_stop_cancels_and_keeps_the_cache_consistent(tiny_loaded):
    m = tiny_loaded
    free = generate(m, PROMPT, max_tokens=30)
    pc = PromptCache(m.model)
    part = generate(m, PROMPT, max_tokens=30, prompt_cache=pc, should_stop=stop_after(5))
    # asked before the prompt is read, then before each decode step: the prefill's token and 4 steps'
    assert part.finish_reason == "cancelled" and part.tokens == free.tokens[:5]
    assert pc.ids[: len(free.prompt_tokens)] == free.prompt_tokens
    assert pc.ids[len(free.prompt_tokens):] == part.tokens[: len(pc.ids) - len(free.prompt_tokens)]
    assert_cache_holds(m.model, pc)
    # Reusing the cache: the same prompt, then the next chat turn, as a fresh run would give.
    assert generate(m, PROMPT, max_tokens=30, prompt_cache=pc).tokens == free.tokens
    assert_cache_holds(m.model, pc)
    turn2 = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": free.text},
             {"role": "user", "content": "and the dog?"}]
    assert generate(m, turn2, max_tokens=10, prompt_cache=pc).tokens == generate(m, turn2, max_tokens=10).tokens
    assert_cache_holds(m.model, pc)


def test_slow_prefill_chunks_shrink_and_fast_ones_grow_back(tiny_loaded, monkeypatch):
    # A cancel waits for the chunk being read: chunks slower than PREFILL_SECONDS get smaller.
    import sys
    import types

    gen = sys.modules["redrafter_mlx.generate"]
    m = tiny_loaded
    rng = np.random.default_rng(1)
    ids = [int(i) for i in rng.integers(0, 256, 90)]
    monkeypatch.setattr(gen, "PREFILL_CHUNK", 16)
    monkeypatch.setattr(gen, "PREFILL_MIN_CHUNK", 4)
    now = [0.0]
    monkeypatch.setattr(gen, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    real_hidden = m.model.hidden
    per_token = iter([0.6] + [0.3] * 3 + [0.01] * 100)  # seconds per token, chunk by chunk (PREFILL_SECONDS 2)

    def hidden(tokens, cache=None, *a, **k):
        now[0] += next(per_token) * tokens.shape[1]
        return real_hidden(tokens, cache, *a, **k)

    monkeypatch.setattr(m.model, "hidden", hidden)
    lines = []
    g = generate(m, ids, max_tokens=3, mode="ar", progress=lines.append)
    starts = [int(line.split()[3]) for line in lines]
    # 16 tokens at 0.6 s: 9.6 s -> 2 s fits 2 tokens, but 4 is the least; 4 x 0.3 s is 1.2 s: kept;
    # then 0.04 s chunks double back to 16
    assert starts == [0, 16, 20, 24, 28, 32, 40, 56, 72, 88]
    assert g.tokens == greedy_direct(m.model, ids, 3)
    # the size found is kept with a conversation's cache: its next prompt starts there, not at 16 again
    pc = PromptCache(m.model)
    per_token = iter([0.6] * 100)
    generate(m, ids[:40], max_tokens=1, mode="ar", prompt_cache=pc)
    assert pc.prefill_chunk == 4  # 16 tokens at 0.6 s: 9.6 s, then 4 at a time (2.4 s: the least)
    lines.clear()
    generate(m, ids, max_tokens=1, mode="ar", prompt_cache=pc, progress=lines.append)
    assert [int(line.split()[3]) for line in lines][:3] == [0, 4, 8]  # of the 50 tokens not cached yet


def test_cancel_during_a_long_prefill(tiny_loaded, monkeypatch):
    import sys

    gen = sys.modules["redrafter_mlx.generate"]  # the package exports a function of the same name
    m = tiny_loaded
    free = generate(m, PROMPT, max_tokens=10)
    monkeypatch.setattr(gen, "PREFILL_CHUNK", 4)
    pc = PromptCache(m.model)
    part = generate(m, PROMPT, max_tokens=10, prompt_cache=pc, should_stop=stop_after(1))
    assert part.finish_reason == "cancelled" and part.tokens == []
    assert pc.ids == free.prompt_tokens[:4]  # asked before each chunk: one ran, then the stop was seen
    assert_cache_holds(m.model, pc)
    assert generate(m, PROMPT, max_tokens=10, prompt_cache=pc).tokens == free.tokens


@pytest.mark.parametrize("how", ["raises", "closed"])
def test_an_interrupted_prompt_reading_keeps_the_chunks_it_read(tiny_loaded, monkeypatch, how):
    """Ctrl-C (here an exception from the third chunk's forward) while a long prompt was read, or a stream
    closed at the "cancelled" event should_stop gave there, rolled the cache back to its length before the
    call: every chunk read was dropped and read again by the next call (and a windowed layer that had freed
    old keys meanwhile started the whole conversation over). The chunks read stay, as where should_stop
    alone ends the reading; a chunk cut short is dropped."""
    import sys

    gen = sys.modules["redrafter_mlx.generate"]
    m = tiny_loaded
    free = generate(m, PROMPT, max_tokens=10)
    pc = PromptCache(m.model)
    generate(m, free.prompt_tokens[:3], max_tokens=1, prompt_cache=pc)  # the cache held a conversation before
    monkeypatch.setattr(gen, "PREFILL_CHUNK", 4)
    real_hidden, chunks, fail = m.model.hidden, [], [how == "raises"]

    def hidden(tokens, cache=None, *a, **k):
        out = real_hidden(tokens, cache, *a, **k)
        chunks.append(tokens.shape[1])
        if fail[0] and len(chunks) == 3:
            fail[0] = False
            mx.eval(out)  # the cut chunk's keys are in the cache, its ids are not
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(m.model, "hidden", hidden)
    if how == "raises":
        with pytest.raises(KeyboardInterrupt):
            generate(m, PROMPT, max_tokens=10, prompt_cache=pc)
    else:
        it = stream(m, PROMPT, max_tokens=10, prompt_cache=pc, should_stop=stop_after(2))
        assert next(it).finish_reason == "cancelled"
        it.close()
    assert pc.ids == free.prompt_tokens[:3 + 8]  # the 3 held, then 2 chunks of 4 read (was: the 3 alone)
    assert_cache_holds(m.model, pc)
    chunks.clear()
    assert generate(m, PROMPT, max_tokens=10, prompt_cache=pc).tokens == free.tokens
    assert chunks[0] == min(4, len(free.prompt_tokens) - 11)  # reading went on from there
    assert_cache_holds(m.model, pc)


def test_prompt_cache_reuses_the_common_prefix(tiny_loaded, monkeypatch):
    m = tiny_loaded
    pc = PromptCache(m.model)
    first = generate(m, PROMPT, max_tokens=8, prompt_cache=pc)
    fed = []
    real_hidden = m.model.hidden
    monkeypatch.setattr(m.model, "hidden", lambda tokens, cache=None, *a, **k: fed.append(tokens.shape[1]) or
                        real_hidden(tokens, cache, *a, **k))
    turn2 = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": first.text},
             {"role": "user", "content": "more"}]
    ids2 = m.tokenizer.prompt_ids(turn2)
    shared = next(i for i, (a, b) in enumerate(zip(pc.ids, ids2 + [None])) if a != b)
    assert shared >= len(first.prompt_tokens)
    g = generate(m, turn2, mode="ar", max_tokens=5, prompt_cache=pc)
    assert fed[0] == len(ids2) - shared  # only the new part of the prompt was prefilled
    assert fed[1:] == [1] * (len(fed) - 1)  # then one token per step
    monkeypatch.undo()
    assert g.tokens == generate(m, turn2, mode="ar", max_tokens=5).tokens
    assert_cache_holds(m.model, pc)


def test_truncating_a_prompt_cache_keeps_what_it_says(tiny_loaded):
    """truncate(n) past the tokens held returned n, not the count kept; -1 failed inside the cache
    and 1.5 slicing the ids: a user's rewind of a conversation met a bare ValueError or TypeError."""
    from redrafter_mlx.errors import SettingError

    m = tiny_loaded
    pc = PromptCache(m.model)
    generate(m, PROMPT, max_tokens=6, prompt_cache=pc)
    held = list(pc.ids)
    assert pc.truncate(10**6) == len(held) and pc.ids == held
    for bad in (-1, 1.5, True, None):
        with pytest.raises(SettingError, match="truncate takes a number of tokens >= 0"):
            pc.truncate(bad)
    assert pc.ids == held
    assert_cache_holds(m.model, pc)
    assert pc.truncate(np.int64(3)) == 3 and pc.ids == held[:3]
    assert_cache_holds(m.model, pc)


def test_a_truncate_cut_short_by_ctrl_c_leaves_a_cache_the_next_call_can_use(tiny_loaded, monkeypatch):
    """truncate trimmed the keys and values, then the ids: Ctrl-C between the two (a second one, landing in the
    cleanup of a stream the first had stopped) left ids past the cache, and the next prompt was read at the wrong
    positions, a wrong reply saying nothing. The ids go first now; keys left past them are dropped by the next trim."""
    from redrafter_mlx.cache import Cache

    m = tiny_loaded
    free = generate(m, PROMPT, max_tokens=12).tokens
    pc = PromptCache(m.model)
    generate(m, PROMPT, max_tokens=12, prompt_cache=pc)
    real_trim, calls = Cache.trim_to, []

    def trim_then_ctrl_c(self, offset):
        real_trim(self, offset)
        calls.append(offset)
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(Cache, "trim_to", trim_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        pc.truncate(5)
    assert len(pc.ids) <= pc.cache.offset  # (were 36 ids over 5 tokens' keys)
    assert generate(m, PROMPT, max_tokens=12, prompt_cache=pc).tokens == free
    assert_cache_holds(m.model, pc)


def test_reusing_a_prompt_cache_for_no_token_ids_says_so(tiny_loaded):
    """reuse([]) said "PromptCache.truncate takes a number of tokens >= 0, not -1" (a method and a value the
    caller had not named), reuse(None) was a TypeError from zip, and reuse("text") cleared the cache."""
    from redrafter_mlx.errors import SettingError

    m = tiny_loaded
    pc = PromptCache(m.model)
    generate(m, PROMPT, max_tokens=6, prompt_cache=pc)
    held = list(pc.ids)
    for bad in ([], None, "text", 5):
        with pytest.raises(SettingError, match="reuse takes a prompt's token ids, at least one"):
            pc.reuse(bad)
    # ids that are not whole numbers >= 0 (tokens as text, 1.5) matched nothing and cleared the cache
    for bad, said in ((["the", "cat"], "'the'"), (held[:3] + [1.5], "1.5"), ([-1], "-1"), ([True], "True")):
        with pytest.raises(SettingError, match=f"reuse takes a prompt's token ids, whole numbers >= 0, not {said}"):
            pc.reuse(bad)
    assert pc.ids == held
    assert pc.reuse(np.array(held[:5] + [7])) == 5 and pc.ids == held[:5]  # (as before: ids as an array)
    assert pc.reuse(held[:4] + [7]) == 4 and pc.ids == held[:4]
    assert_cache_holds(m.model, pc)


def test_closing_the_stream_early_keeps_the_cache_consistent(tiny_loaded):
    m = tiny_loaded
    free = generate(m, PROMPT, max_tokens=20).tokens
    pc = PromptCache(m.model)
    it = stream(m, PROMPT, max_tokens=20, prompt_cache=pc)
    got = [t for _, e in zip(range(4), it) for t in e.tokens]
    it.close()
    assert got == free[:4]
    assert_cache_holds(m.model, pc)
    assert generate(m, PROMPT, max_tokens=20, prompt_cache=pc).tokens == free


@pytest.mark.parametrize("call", ["reset", "truncate", "reuse"])
def test_trimming_the_cache_of_a_paused_stream_ends_that_stream(tiny_loaded, call):
    """A stream paused between events whose PromptCache was reset or truncated went on when resumed, from
    tokens no longer there: a reply that was not the model's, and a cache whose keys and values were not
    those of its ids (the step's queued token had been written where the ids said another was). It stops
    with a SettingError, as where another stream takes the cache, and a reset waits for a step in progress
    (it holds the model's lock, as a step does)."""
    import threading

    from redrafter_mlx.errors import SettingError

    m = tiny_loaded
    free = generate(m, PROMPT, max_tokens=12, mode="ar").tokens
    pc = PromptCache(m.model)
    it = stream(m, PROMPT, max_tokens=12, mode="ar", prompt_cache=pc)
    assert [t for _, e in zip(range(3), it) for t in e.tokens] == free[:3]
    {"reset": pc.reset, "truncate": lambda: pc.truncate(5), "reuse": lambda: pc.reuse(pc.ids[:5] + [7])}[call]()
    with pytest.raises(SettingError, match="used by another call"):
        next(it)
    assert len(pc.ids) == (0 if call == "reset" else 5)
    assert pc.cache.offset == len(pc.ids) and (not pc.ids or assert_cache_holds(m.model, pc) is None)
    assert generate(m, PROMPT, max_tokens=12, prompt_cache=pc).tokens == free
    assert_cache_holds(m.model, pc)
    with m.model.state.lock:  # a step in progress on another thread
        done = threading.Event()
        worker = threading.Thread(target=lambda: (pc.reset(), done.set()))
        worker.start()
        assert not done.wait(0.2) and len(pc.ids) > 0
    worker.join()
    assert done.is_set() and pc.ids == [] and pc.cache.offset == 0


class Interrupt(BaseException):
    """Stands in for KeyboardInterrupt (a BaseException, not an Exception)."""


class FailingModel:
    """Delegates to a model, but raises after its n-th forward call (which did update the cache)."""

    def __init__(self, model, n):
        self._model, self._n, self.calls = model, n, 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        out = self._model(*args, **kwargs)
        self.calls += 1
        if self.calls == self._n:
            mx.eval(out)
            raise Interrupt
        return out


@pytest.mark.parametrize("fail_at", [1, 2, 5])
def test_interrupted_step_leaves_the_cache_consistent(tiny_loaded, fail_at):
    m = tiny_loaded
    free = generate(m, PROMPT, max_tokens=20).tokens
    real = m.model
    pc = PromptCache(real)
    m.model = FailingModel(real, fail_at)
    with pytest.raises(Interrupt):
        generate(m, PROMPT, max_tokens=20, prompt_cache=pc)
    m.model = real
    assert_cache_holds(real, pc)
    assert generate(m, PROMPT, max_tokens=20, prompt_cache=pc).tokens == free


def test_exception_in_should_stop_keeps_the_cache_consistent(tiny_loaded):
    m = tiny_loaded
    pc = PromptCache(m.model)

    def boom():
        if len(pc.ids) > len(m.tokenizer.prompt_ids(PROMPT)) + 2:
            raise RuntimeError("stop here")
        return False

    with pytest.raises(RuntimeError, match="stop here"):
        generate(m, PROMPT, max_tokens=20, prompt_cache=pc, should_stop=boom)
    assert_cache_holds(m.model, pc)


@pytest.mark.parametrize("where", ["reading the prompt", "decoding"])
def test_a_should_stop_that_uses_the_cache_ends_the_stream_before_it_runs_on_it(tiny_kit, tmp_path, monkeypatch,
                                                                                 where):
    """should_stop is asked inside a step, holding the model's lock: one that reset the stream's PromptCache (or
    ran a call on it) and returned False had the step go on from what that left. A drafted step verified its
    tree on the emptied cache and gave a wrong token; a prompt's next chunk was read as the start of a context,
    and the reply was another prompt's. It stops with the SettingError of a cache another call took, as it
    does between steps."""
    import sys

    from redrafter_mlx.errors import SettingError

    gen = sys.modules["redrafter_mlx.generate"]
    m = with_drafter(tiny_kit, tmp_path)
    kw = dict(mode="redrafter", beam_width=2, beam_length=3, max_tokens=20)
    free = generate(m, PROMPT, **kw).tokens
    if where == "reading the prompt":
        monkeypatch.setattr(gen, "PREFILL_CHUNK", 4)
    pc = PromptCache(m.model)
    asked, reset_at = [0], 2 if where == "reading the prompt" else 3

    def should_stop():
        asked[0] += 1
        if asked[0] == reset_at:  # before the prompt's second chunk; before the second decode step (asked once
            pc.reset()            # before the prompt, read in one chunk, then before each step)
        return False

    got = []
    with pytest.raises(SettingError, match="used by another call"):
        for ev in stream(m, PROMPT, prompt_cache=pc, should_stop=should_stop, **kw):
            got.append(ev.tokens)
    # nothing ran after the reset: the prefill's token and one step's, decoding (nothing, reading the prompt)
    assert len(got) == (2 if where == "decoding" else 0) and sum(got, []) == free[: len(sum(got, []))]
    assert pc.ids == [] and pc.cache.offset == 0
    assert generate(m, PROMPT, prompt_cache=pc, **kw).tokens == free


@pytest.mark.parametrize("before", ["the last chunk", "a middle chunk"])
@pytest.mark.parametrize("mode", ["ar", "redrafter"])
def test_a_progress_that_uses_the_cache_ends_the_stream_before_it_runs_on_it(tiny_kit, tmp_path, monkeypatch, before,
                                                                             mode):
    """progress is told of each chunk of a long prompt before it is read, as should_stop is asked, but was not
    guarded as should_stop is: one that reset the stream's PromptCache had the next chunk read as the start of a
    context. Before the last chunk, the first token came from those logits: here an end of turn, and the reply
    ended "eos", empty, where plain decoding answers. It stops with the SettingError of a cache another call took."""
    import sys

    from redrafter_mlx.errors import SettingError

    gen = sys.modules["redrafter_mlx.generate"]
    m = with_drafter(tiny_kit, tmp_path)
    kw = dict(mode=mode, max_tokens=8, **(dict(beam_width=2, beam_length=3) if mode == "redrafter" else {}))
    free = generate(m, PROMPT, mode="ar", max_tokens=8).tokens
    assert free and free[0] not in m.tokenizer.eos_token_ids
    n = len(m.tokenizer.prompt_ids(PROMPT))
    monkeypatch.setattr(gen, "PREFILL_CHUNK", 4)
    assert n > 9
    at = 4 * ((n - 1) // 4) if before == "the last chunk" else 4
    pc, said = PromptCache(m.model), []

    def progress(line):
        said.append(line)
        if line.startswith(f"reading the prompt: {at} of {n} ") and said.count(line) == 1:
            pc.reset()

    got = []
    with pytest.raises(SettingError, match="used by another call"):
        for ev in stream(m, PROMPT, prompt_cache=pc, progress=progress, **kw):
            got.append(ev)
    assert got == [] and said[-1].startswith(f"reading the prompt: {at} of")  # no chunk read after the reset
    assert pc.ids == [] and pc.cache.offset == 0
    assert generate(m, PROMPT, prompt_cache=pc, progress=progress, **kw).tokens == free  # (reset once: read whole)


def test_peak_memory_is_reported_live(tiny_loaded):
    """UIs show peak memory during a reply, so every event carries it, not just the last."""
    seen = [e.stats.peak_memory_mb for e in stream(tiny_loaded, PROMPT, mode="ar", max_tokens=5)]
    assert len(seen) == 5 and all(mb > 0 for mb in seen)  # read as each event arrives (stats is shared)


def test_a_stream_started_beside_another_does_not_take_back_its_peak_memory(tiny_loaded):
    """MLX keeps one peak per process and every stream resets it as it starts: a stream whose long
    prompt peaked at ~4 MB reported ~0.4 MB from the step after a second stream on the same model had
    started. Each stream's figure now never falls, and the second's counts from its own start."""
    long_prompt = [3 + i % 200 for i in range(400)]  # its prefill needs far more memory than a decode step
    a = stream(tiny_loaded, long_prompt, mode="ar", max_tokens=4)
    first = next(a).stats.peak_memory_mb
    b = stream(tiny_loaded, [3, 4, 5], mode="ar", max_tokens=4)
    b_first = next(b).stats.peak_memory_mb
    seen = [(x.stats.peak_memory_mb, y.stats.peak_memory_mb) for x, y in zip(a, b)]
    assert len(seen) == 3 and all(mb >= first for mb, _ in seen)
    assert b_first < first  # B read the peak since its own start, not A's prefill
