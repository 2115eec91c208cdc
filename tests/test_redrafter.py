"""ReDrafter decoding: packing, acceptance, losslessness (greedy and sampled), the draft head's format.

Tiny random base models with small vocabularies make random drafts agree with the base model
often, so multi-token acceptance, shared prefixes and every stopping rule are exercised.
"""

import importlib
import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from redrafter_mlx import generate, stream
from redrafter_mlx.config import DrafterArgs
from redrafter_mlx.drafter import Drafter, load_drafter, new_drafter, save_drafter
from redrafter_mlx.errors import DrafterMismatchError, RedrafterError
from redrafter_mlx.generate import PromptCache
from redrafter_mlx.loader import new_model
from redrafter_mlx.loader import LoadedModel
from redrafter_mlx.lookup import MAX_GROWTH, ContextIndex, extent, lookup, lookup_match
from redrafter_mlx.tuning import DEFAULT_LOOKUP
from redrafter_mlx.tokenizer import Detokenizer
from redrafter_mlx.tree import accept, pack

BEAM_SHAPES = [(1, 1), (1, 4), (4, 4), (8, 5), (16, 6)]


class CharTokenizer:
    """Ids -> letters; enough of the Tokenizer interface for id prompts."""

    def __init__(self, eos=()):
        self.eos_token_ids = list(eos)

    def prompt_ids(self, prompt, system=None):
        return [int(i) for i in prompt]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)

    def detokenizer(self):
        return Detokenizer(self)


def tiny_loaded(vocab=12, seed=0, context=4096, eos=(), lm_head="own", traditional=False):
    model = new_model(dict(
        model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=context, rope_traditional=traditional,
        tie_word_embeddings=False, rms_norm_eps=1e-5), seed)
    args = model.args
    # Sharpen the output so greedy choices are far from ties and sampling is not uniform.
    model.lm_head.weight = model.lm_head.weight * 4
    mx.eval(model.parameters())
    drafter = new_drafter(args, lm_head=lm_head, seed=seed + 1)
    mx.eval(drafter.parameters())
    return LoadedModel(model=model, tokenizer=CharTokenizer(eos), args=args, name="tiny", path=Path("."),
                       weight_format="float32", drafter=drafter)


PROMPT = [1, 5, 3, 7, 2, 9, 4]


# ---- drafting, packing and acceptance --------------------------------------------------

@pytest.mark.parametrize("width,length", [(1, 4), (4, 3), (6, 4)])
def test_beam_search_returns_distinct_beams_best_first(width, length):
    from redrafter_mlx.beam_search import beam_search

    loaded = tiny_loaded(seed=3)
    model, drafter = loaded.model, loaded.drafter
    h = mx.random.normal((model.args.hidden_size,))
    beams = np.array(beam_search(drafter, model, h, mx.array(5), width, length))
    assert beams.shape == (width, length) and (beams[:, 0] == 5).all()
    assert len({tuple(b) for b in beams}) == width  # no duplicates

    def score(beam):  # the draft log-probability of a beam, one token at a time
        state, total = mx.zeros((model.args.hidden_size,)), 0.0
        for prev, nxt in zip(beam[:-1], beam[1:]):
            state = drafter.update_state(model.embed(mx.array(int(prev))), state)
            logp = nn.log_softmax(drafter.draft_logits(h, state, model).astype(mx.float32))
            total += logp[int(nxt)].item()
        return total

    scores = [score(b) for b in beams]
    assert scores == sorted(scores, reverse=True), scores
    if width == 1:  # one beam is greedy drafting
        state, token = mx.zeros((model.args.hidden_size,)), 5
        for d in range(1, length):
            state = drafter.update_state(model.embed(mx.array(token)), state)
            token = int(mx.argmax(drafter.draft_logits(h, state, model)).item())
            assert beams[0, d] == token


def path_logprob(model, drafter, h, row):
    """The head's log-probability of a drafted row (root first, -1 past its end), token by token."""
    state, total = mx.zeros((model.args.hidden_size,)), 0.0
    row = [int(t) for t in row if t >= 0]
    for prev, nxt in zip(row[:-1], row[1:]):
        state = drafter.update_state(model.embed(mx.array(prev)), state)
        total += nn.log_softmax(drafter.draft_logits(h, state, model).astype(mx.float32))[nxt].item()
    return total


@pytest.mark.parametrize("width,depth,budget,min_prob", [(2, 4, 6, 0.02), (4, 5, 12, 0.01), (3, 6, 40, 0.001), (1, 4, 3, 0.05)])
def test_tree_search_keeps_the_likeliest_nodes_as_a_tree(width, depth, budget, min_prob):
    from redrafter_mlx.tree_search import tree_nodes, tree_search

    loaded = tiny_loaded(seed=3)
    model, drafter = loaded.model, loaded.drafter
    h = mx.random.normal((model.args.hidden_size,))
    beams = tree_search(drafter, model, h, 5, width, depth, budget, min_prob)
    assert beams.ndim == 2 and (beams[:, 0] == 5).all() and beams.shape[1] <= depth + 1
    nodes = {tuple(int(t) for t in row[: d + 1]) for row in beams for d in range(1, len(row)) if row[d] >= 0}
    assert 0 < len(nodes) == tree_nodes(beams) <= budget
    for node in nodes:  # every node clears min_prob, and no node has more than `width` children
        assert path_logprob(model, drafter, h, node) >= np.log(min_prob) - 1e-5
        assert sum(1 for other in nodes if other[:-1] == node) <= width
    leaves = [tuple(int(t) for t in row if t >= 0) for row in beams]
    assert len(set(leaves)) == len(leaves) and not any(a != b and b[: len(a)] == a for a in leaves for b in leaves)
    # The first row follows the head's most likely token at the first level.
    state = drafter.update_state(model.embed(mx.array(5)), mx.zeros((model.args.hidden_size,)))
    assert beams[0, 1] == int(mx.argmax(drafter.draft_logits(h, state, model)).item())
    # A node left out is no likelier than the least likely kept node, within the searched region:
    # children of kept nodes at the first level (all of which are searched).
    kept = min(path_logprob(model, drafter, h, n) for n in nodes)
    logp = nn.log_softmax(drafter.draft_logits(h, state, model).astype(mx.float32))
    top = np.argsort(-np.array(logp))[:width]
    for t in top:
        if (5, int(t)) not in nodes:
            assert logp[int(t)].item() <= kept + 1e-5 or logp[int(t)].item() < np.log(min_prob)


def test_tree_search_edge_cases():
    from redrafter_mlx.tree_search import tree_search

    loaded = tiny_loaded(seed=3)
    model, drafter = loaded.model, loaded.drafter
    h = mx.random.normal((model.args.hidden_size,))
    for budget, depth, min_prob in [(0, 4, 0.1), (8, 0, 0.1), (8, 4, 1.0)]:
        assert tree_search(drafter, model, h, 5, 4, depth, budget, min_prob).tolist() == [[5]]
    chain = tree_search(drafter, model, h, 5, 1, 3, 3, 1e-9)  # width 1, no threshold: greedy drafting
    assert chain.shape == (1, 4)
    from redrafter_mlx.beam_search import beam_search

    assert chain.tolist() == np.array(beam_search(drafter, model, h, mx.array(5), 1, 4)).tolist()
    for bad in [dict(width=0), dict(depth=-1), dict(budget=-1), dict(min_prob=0.0), dict(min_prob=1.5)]:
        kw = dict(width=2, depth=3, budget=4, min_prob=0.1) | bad
        with pytest.raises(ValueError):
            tree_search(drafter, model, h, 5, **kw)


def test_pack_round_trip_and_mask():
    beams = np.array([
        [5, 1, 2, 3],
        [5, 1, 2, 4],
        [5, 1, 7, 3],
        [5, 6, 2, 3],
        [5, 1, 2, 3],  # duplicate of beam 0
    ])
    tree = pack(beams)
    assert np.array_equal(tree.tokens[tree.unpacker], beams)
    # unique prefixes: root, 1, 1-2, 1-2-3, 1-2-4, 1-7, 1-7-3, 6, 6-2, 6-2-3
    assert tree.size == 10
    assert np.array_equal(tree.unpacker[0], tree.unpacker[4])
    for w in range(len(beams)):
        for d in range(beams.shape[1]):
            node = tree.unpacker[w, d]
            assert tree.depth[node] == d
            # a node sees exactly its own beam's prefix
            assert set(np.nonzero(tree.mask[node])[0]) == set(tree.unpacker[w, : d + 1])
    assert all(tree.parent[i] < i for i in range(1, tree.size))


def test_pack_rejects_bad_beams():
    with pytest.raises(ValueError):
        pack(np.array([[1, 2], [3, 2]]))
    with pytest.raises(ValueError):
        pack(np.zeros((0, 3), dtype=np.int32))


def test_pack_ragged_beams():
    """A negative token ends its row: the context-lookup beam is longer or shorter than the rest."""
    beams = np.array([
        [5, 1, 2, -1, -1],
        [5, 1, 2, 3, 4],  # extends beam 0
        [5, 6, -1, -1, -1],
    ])
    tree = pack(beams)
    assert tree.size == 6  # root, 1, 1-2, 1-2-3, 1-2-3-4, 6
    assert list(tree.unpacker[0, 3:]) == [-1, -1] and list(tree.unpacker[2, 2:]) == [-1, -1, -1]
    for w in range(len(beams)):
        for d in range(beams.shape[1]):
            node = tree.unpacker[w, d]
            if beams[w, d] < 0:
                assert node == -1
                continue
            assert tree.tokens[node] == beams[w, d] and tree.depth[node] == d
            assert set(np.nonzero(tree.mask[node])[0]) == set(tree.unpacker[w, : d + 1])
    choices = np.full(tree.size, 9)
    choices[[0, tree.unpacker[1, 1], tree.unpacker[1, 2], tree.unpacker[1, 3]]] = [1, 2, 3, 4]
    path, bonus = accept(tree, choices)
    assert list(tree.tokens[path]) == [5, 1, 2, 3, 4] and bonus == 9


def test_lookup_copies_what_followed_the_longest_match():
    #      0  1  2  3  4  5  6  7  8  9 10 11
    ids = [7, 1, 2, 3, 8, 9, 1, 2, 4, 5, 1, 2]
    # suffix trigram (5, 1, 2) never occurred before; the bigram (1, 2) did, latest at 6
    assert lookup(ids, 3).tolist() == [4, 5, 1]
    assert lookup(ids, 1).tolist() == [4]
    assert lookup([7, 1, 2, 3, 9, 5, 1, 2, 4, 7, 1, 2], 2).tolist() == [3, 9]  # trigram (7, 1, 2) at 0 wins
    assert lookup_match(ids, 3).n == 2 and lookup_match(ids, 3).extent == 2
    # Of the trigram's occurrences, the one matching furthest back wins over the latest: (5, 1, 2)
    # at 1..3 follows a 4 as the suffix does (extent 4); at 6..8 it follows a 0.
    #            0  1  2  3  4  5  6  7  8  9 10 11 12 13
    quoted = [4, 5, 1, 2, 3, 0, 5, 1, 2, 6, 4, 5, 1, 2]
    m = lookup_match(quoted, 2)
    assert (m.n, m.extent) == (3, 4)
    assert lookup(quoted, 2).tolist() == [3, 0]
    assert lookup(quoted[1:], 2).tolist() == [6, 4]  # without the leading 4 both match 3 back: the latest
    # At the end of the context the copy goes on as the text repeats from the match on (period 4 here)
    assert lookup(ids, 10).tolist() == [4, 5, 1, 2, 4, 5, 1, 2, 4, 5]
    assert lookup([3, 3, 3, 3], 4).tolist() == [3, 3, 3, 3]  # a loop: the latest earlier match is one step back
    assert lookup([6, 1, 2, 3, 4, 5, 1, 2, 3], 8).tolist() == [4, 5, 1, 2, 3, 4, 5, 1]  # a repeated line
    assert lookup([1, 2, 3, 4, 5], 3).size == 0  # nothing recurs
    assert lookup([4, 1, 2, 3, 1], 3).size == 0  # single tokens recur, but min_ngram is 2
    assert lookup([4, 1, 2, 3, 1], 3, min_ngram=1).tolist() == [2, 3, 1]
    assert lookup(ids, 0).size == 0 and lookup([1], 3).size == 0
    with pytest.raises(ValueError):
        lookup(ids, 3, max_ngram=1, min_ngram=2)


def test_accept_walks_the_choices():
    beams = np.array([[5, 1, 2, 3], [5, 1, 7, 3], [5, 6, 2, 3]])
    tree = pack(beams)
    choices = np.full(tree.size, 9)
    choices[0] = 1  # root -> 1
    choices[tree.unpacker[0, 1]] = 7  # 1 -> 7 (beam 1)
    choices[tree.unpacker[1, 2]] = 3  # 7 -> 3
    choices[tree.unpacker[1, 3]] = 8  # bonus after the full beam
    path, bonus = accept(tree, choices)
    assert list(tree.tokens[path]) == [5, 1, 7, 3] and bonus == 8
    choices[0] = 4  # nothing matches: only the root, the base model's own token next
    path, bonus = accept(tree, choices)
    assert path == [0] and bonus == 4


# ---- greedy losslessness -----------------------------------------------------------------

@pytest.mark.parametrize("width,length", BEAM_SHAPES)
@pytest.mark.parametrize("lm_head", ["own", "shared"])
def test_greedy_equals_plain_tiny(width, length, lm_head):
    m = tiny_loaded(lm_head=lm_head)
    ar = generate(m, PROMPT, mode="ar", max_tokens=256)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=256, beam_width=width, beam_length=length)
    assert rd.tokens == ar.tokens
    assert len(rd.tokens) == 256 and rd.finish_reason == "length"
    assert rd.stats.steps <= ar.stats.steps
    if width >= 4 and length > 1:
        assert rd.stats.accepted_tokens > 0  # 4+ beams over 12 tokens: some drafts get accepted
        # the beams, plus the copy: it grows to 4x the lookup while accepted whole, and in a loop
        # it runs on past the context's end as the text repeats
        assert rd.stats.packed_tokens <= rd.stats.steps * (width * length + MAX_GROWTH * DEFAULT_LOOKUP)
    # The reply loops over 3 tokens from its third, so with the lookup on (the default) the copy drafts
    # ~240 of its tokens: the accepted drafts above are the copy's, and verifying the drafter's beams wrongly
    # (or not at all) passed. Without the copy, the drafter's own drafts must be accepted, tokens unchanged.
    alone = generate(m, PROMPT, mode="redrafter", max_tokens=256, beam_width=width, beam_length=length, lookup=0)
    assert alone.tokens == ar.tokens and alone.stats.looked_up_tokens == 0
    if length > 1:
        assert alone.stats.accepted_tokens > 0 and alone.stats.steps < ar.stats.steps
        assert alone.stats.drafted_tokens == alone.stats.steps * width * (length - 1)


@pytest.mark.parametrize("width,length,look", [(1, 2, 8), (4, 3, 3), (1, 5, 2)])
def test_greedy_with_context_lookup_equals_plain_tiny(width, length, look):
    """The lookup beam (longer, as long as, or shorter than the drafter's) changes steps, never tokens.
    A tiny random model soon loops, so copies from its own reply get accepted."""
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=200)
    plain = generate(m, PROMPT, mode="redrafter", max_tokens=200, beam_width=width, beam_length=length, lookup=0)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=200, beam_width=width, beam_length=length, lookup=look)
    assert rd.tokens == ar.tokens and plain.tokens == ar.tokens
    assert plain.stats.looked_up_tokens == 0
    assert rd.stats.looked_up_tokens > 0
    assert rd.stats.steps < plain.stats.steps
    assert rd.stats.drafted_tokens / rd.stats.steps > plain.stats.drafted_tokens / plain.stats.steps
    assert 0 < rd.stats.acceptance_rate <= 1
    with pytest.raises(ValueError, match="lookup"):
        generate(m, PROMPT, mode="redrafter", lookup=-1)


def test_the_copy_grows_while_copies_are_accepted_whole():
    from redrafter_mlx.lookup import MAX_GROWTH, CopyLength

    c = CopyLength(8)
    lengths = []
    for copied, taken in [(8, 8), (16, 16), (32, 32), (32, 32), (12, 12), (32, 5), (8, 3), (0, 0), (8, 8)]:
        c.update(copied, taken)
        lengths.append(c.length)
    # doubled while a whole copy was accepted (a short copy that ran to the context's end too),
    # capped at MAX_GROWTH x 8, back to 8 after a miss or a step without a copy
    assert lengths == [16, 32, 32, 32, 32, 8, 8, 8, 16] and MAX_GROWTH * 8 == 32
    off = CopyLength(0)
    off.update(0, 5)
    assert off.length == 0
    fixed = CopyLength(8, max_growth=1)  # replay --no-lookup-growth: the copy stays at 8
    fixed.update(8, 8)
    assert fixed.length == 8
    big = CopyLength(600, limit=1024)  # a step's draft limit caps the growth (lookup 1024 grew to 4096)
    big.update(600, 600)
    big.update(1024, 1024)
    assert big.length == 1024 and CopyLength(2000, limit=1024).cap == 2000  # never below the lookup asked for
    # In decoding: a tiny random model loops, so whole copies are accepted and later copies run
    # past `lookup` (beams of length 2 accept at most 1 drafted token); output is unchanged.
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=200)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=200, beam_width=1, beam_length=2, lookup=2)
    assert rd.tokens == ar.tokens
    assert 2 < max(s.accepted for s in rd.step_stats) <= MAX_GROWTH * 2


def test_the_copy_grows_only_when_its_own_tokens_are_accepted(monkeypatch):
    """CopyLength grew after a step that accepted as many draft tokens as the copy held, though a drafter
    beam longer than the copy had them and the copy missed. Crafted: drafter beam 0 drafts the output
    itself (an oracle) and the copy's first token is always wrong, so no copy is ever taken: the copy
    stays at `lookup` tokens in decoding and in replay, which agree. Output is unchanged."""
    import redrafter_mlx.beam_search as beam_module
    import redrafter_mlx.lookup as lookup_module
    import redrafter_mlx.tree as tree_module
    from redrafter_mlx.lookup import copy_taken
    from redrafter_mlx.replay import replay

    gen_module = importlib.import_module("redrafter_mlx.generate")
    W, L, look, vocab = 2, 6, 2, 12
    m = tiny_loaded(vocab=vocab)
    g = generate(m, PROMPT, mode="ar", max_tokens=120).tokens
    at = [0]  # output index of the step's root
    beam_search, add_beam, accept = beam_module.beam_search, lookup_module.add_beam, tree_module.accept

    def oracle(*args):
        beams = np.array(beam_search(*args))
        truth = g[at[0] : at[0] + L]
        beams[0, : len(truth)] = truth
        return mx.array(beams)

    def missing(beams, copy):
        copy = copy.copy()
        copy[0] = (g[at[0] + 1] + 1) % vocab if at[0] + 1 < len(g) else copy[0]
        return add_beam(beams, copy)

    def walked(tree, choices):
        path, bonus = accept(tree, choices)
        at[0] += len(path)
        return path, bonus

    for module in (gen_module, beam_module):
        monkeypatch.setattr(module, "beam_search", oracle)
    for module in (gen_module, lookup_module):
        monkeypatch.setattr(module, "add_beam", missing)
    for module in (gen_module, tree_module):
        monkeypatch.setattr(module, "accept", walked)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=120, beam_width=W, beam_length=L, lookup=look)
    assert rd.tokens == g
    assert sum(s.accepted >= look for s in rd.step_stats) > 10  # the drafter's beam ran past the copy's length
    assert max(s.drafted - W * (L - 1) for s in rd.step_stats) == look  # and the copy never grew
    at[0] = 0
    out = replay(m, rd.prompt_tokens, g, W, L, look)
    assert out["steps"] == rd.stats.steps and out["packed"] == rd.stats.packed_tokens
    # copy_taken: the copy's tokens on the accepted path, from the root down
    tree = pack(np.array([[0, 1, 2, 3], [0, 1, 5, -1]]))
    assert [copy_taken(tree, 1, p) for p in ([0], [0, 1], [0, 1, 2, 3], [0, 1, 4])] == [0, 1, 1, 2]


@pytest.mark.parametrize("width,length,tree,look", [(2, 4, 6, 0), (4, 6, 16, 0), (3, 5, 8, 8), (1, 6, 5, 0)])
def test_greedy_with_a_dynamic_tree_equals_plain_tiny(width, length, tree, look):
    from redrafter_mlx.lookup import MAX_GROWTH

    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=200)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=200, beam_width=width, beam_length=length, lookup=look,
                  tree=tree, tree_min_prob=0.01)
    assert rd.tokens == ar.tokens and rd.finish_reason == "length"
    assert rd.stats.tree == tree and rd.stats.accepted_tokens > 0
    assert max(s.drafted for s in rd.step_stats) <= tree + MAX_GROWTH * look  # the copy grows (lookup.CopyLength)
    assert max(s.accepted for s in rd.step_stats) <= max(length - 1, MAX_GROWTH * look)
    if not look:
        assert max(s.packed for s in rd.step_stats) <= tree + 1
        assert rd.stats.steps < ar.stats.steps
    with pytest.raises(ValueError, match="tree"):
        generate(m, PROMPT, mode="redrafter", tree=-1)
    with pytest.raises(ValueError, match="tree_min_prob"):
        generate(m, PROMPT, mode="redrafter", tree=4, tree_min_prob=0.0)


@pytest.mark.parametrize("mode", ["redrafter", "auto"])
def test_a_tree_floor_with_beams_is_refused(mode):
    """tree_min_prob prunes a dynamic tree (and draft_top_k limits beams); given where W x L beams are drafted
    (tree=0, or no tree given and none tuned) it was dropped, saying nothing. It is a SettingError now, before
    anything runs."""
    from redrafter_mlx.errors import SettingError

    m = tiny_loaded()
    for kw in (dict(beam_width=2, beam_length=3), dict(tree=0), {}):
        with pytest.raises(SettingError, match="tree_min_prob is a dynamic tree's floor.*pass tree=N"):
            generate(m, PROMPT, mode=mode, max_tokens=4, tree_min_prob=0.5, **kw)
    m.tree = 6  # a tuned tree, which a call naming no shape takes: the floor prunes it
    # draft_top_k alone drafts beams, not the tuned tree (only beam search reads it)
    assert generate(m, PROMPT, mode=mode, max_tokens=4, draft_top_k=2).stats.tree == 0
    with pytest.raises(SettingError, match="draft_top_k"):
        generate(m, PROMPT, mode=mode, max_tokens=4, tree=4, draft_top_k=2)
    assert generate(m, PROMPT, mode=mode, max_tokens=4, tree=0, draft_top_k=2).stats.tree == 0
    assert generate(m, PROMPT, mode=mode, max_tokens=4, tree_min_prob=0.5).stats.tree == 6


@pytest.mark.parametrize("width,length,look,tree", [(1, 3, 0, 0), (4, 3, 0, 0), (1, 3, 8, 0), (3, 5, 4, 0), (3, 5, 4, 8), (1, 2, 2, 0)])
def test_replay_counts_the_steps_real_decoding_takes(width, length, look, tree):
    """replay.py scores a drafter from plain decoding's output alone; on a tiny float32 model it
    must agree step for step with real decoding, for outputs ending at max_tokens and at eos."""
    from redrafter_mlx.replay import replay

    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=150)
    kw = dict(beam_width=width, beam_length=length, lookup=look, tree=tree)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=150, **kw)
    out = replay(m, ar.prompt_tokens, ar.tokens, width, length, look, tree=tree)
    assert out["steps"] == rd.stats.steps and out["produced"] == rd.stats.step_tokens == 149
    assert out["packed"] == rd.stats.packed_tokens and out["looked_up"] == rd.stats.looked_up_tokens
    eos = ar.tokens[100]
    m.tokenizer = CharTokenizer(eos=[eos])
    ar = generate(m, PROMPT, mode="ar", max_tokens=150)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=150, **kw)
    assert ar.finish_reason == "eos" == rd.finish_reason
    out = replay(m, ar.prompt_tokens, ar.tokens, width, length, look, ended=True, tree=tree)
    assert out["steps"] == rd.stats.steps and out["produced"] == rd.stats.step_tokens + rd.stats.end_tokens


def test_looked_up_counts_the_tokens_only_the_copy_drafted(monkeypatch):
    """looked_up is the accepted output tokens that only the context copy drafted. Crafted: every drafter
    beam 0 is made to draft the copy's first L - 1 tokens, so a copy accepted past them owes the step only
    its tokens deeper than L - 1 (it counted the whole path, the shared prefix too). And it is cut by
    position where max_tokens or an end token cuts the step (it was clipped as a count), so generate and
    replay agree on every cut."""
    import redrafter_mlx.lookup as lookup_module
    from redrafter_mlx.graph import context_only
    from redrafter_mlx.replay import replay

    gen_module = importlib.import_module("redrafter_mlx.generate")
    add_beam = lookup_module.add_beam

    def sharing(beams, copy):  # drafter beam 0 takes the copy's first L - 1 tokens
        beams = beams.copy()
        k = min(beams.shape[1] - 1, copy.size)
        beams[0, 1 : 1 + k] = copy[:k]
        return add_beam(beams, copy)

    monkeypatch.setattr(gen_module, "add_beam", sharing)
    monkeypatch.setattr(lookup_module, "add_beam", sharing)  # replay imports it when called
    W, L, look = 2, 3, 8
    m = tiny_loaded()
    full = generate(m, PROMPT, mode="ar", max_tokens=120)
    for cut in (120, 37, 58, 91):
        ar = generate(m, PROMPT, mode="ar", max_tokens=cut)
        rd = generate(m, PROMPT, mode="redrafter", max_tokens=cut, beam_width=W, beam_length=L, lookup=look)
        assert rd.tokens == ar.tokens == full.tokens[:cut]
        # a path node deeper than L - 1 is the copy's alone; one at L - 1 or above, drafter beam 0's too
        assert [s.looked_up for s in rd.step_stats] == [max(0, s.accepted - (L - 1)) for s in rd.step_stats]
        out = replay(m, ar.prompt_tokens, ar.tokens, W, L, look)
        assert out["looked_up"] == rd.stats.looked_up_tokens
    assert rd.stats.looked_up_tokens > 0 and any(s.beam == W and s.looked_up < s.accepted for s in rd.step_stats)
    eos = full.tokens[70]
    m.tokenizer = CharTokenizer(eos=[eos])
    ar = generate(m, PROMPT, mode="ar", max_tokens=120)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=120, beam_width=W, beam_length=L, lookup=look)
    assert rd.finish_reason == "eos" and rd.tokens == ar.tokens
    assert [s.looked_up for s in rd.step_stats] == [max(0, s.accepted - (L - 1)) for s in rd.step_stats]
    assert replay(m, ar.prompt_tokens, ar.tokens, W, L, look, ended=True)["looked_up"] == rd.stats.looked_up_tokens
    # the rule itself, on a hand-built tree: drafter rows r-a-b and r-a-x, copy r-a-b-c-d; with graph
    # sources, a drafter row's context graft is the context's too
    tree = pack(np.array([[0, 1, 2, -1, -1], [0, 1, 9, -1, -1], [0, 1, 2, 3, 4]]))
    path = [0, *tree.unpacker[2, 1:].tolist()]
    assert context_only(tree, 2, path).tolist() == [False, False, True, True]
    sources = np.array([[-1, 0, 2], [-1, 0, 0]])  # (graph.DRAFTER 0, CONTEXT_GRAFT 2)
    assert context_only(tree, 2, path, sources).tolist() == [False, True, True, True]
    assert context_only(tree, 3, path).tolist() == [False] * 4


def test_greedy_stops_at_eos_mid_run(monkeypatch):
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=120)
    eos = ar.tokens[60]
    cut = ar.tokens.index(eos)
    m.tokenizer = CharTokenizer(eos=[eos])
    for width, length in [(1, 4), (8, 5)]:
        rd = generate(m, PROMPT, mode="redrafter", max_tokens=120, beam_width=width, beam_length=length)
        assert rd.tokens == ar.tokens[:cut] and rd.finish_reason == "eos"
    assert generate(m, PROMPT, mode="ar", max_tokens=120).tokens == ar.tokens[:cut]
    # The end token above first occurs at index 3 (the reply soon loops over three tokens), as the base
    # model's own token of its step: a stop that looked only at that token passed. Here it is an accepted
    # draft with more accepted drafts after it: the reply's loop is in the prompt, so the copy drafts it.
    gen = importlib.import_module("redrafter_mlx.generate")
    raw, real_accept = [], gen.accept

    def counting(tree, choices):  # the draft tokens each step accepted, before any cut
        path, bonus = real_accept(tree, choices)
        raw.append(len(path) - 1)
        return path, bonus

    monkeypatch.setattr(gen, "accept", counting)
    looping = PROMPT + ar.tokens[:30]
    m.tokenizer = CharTokenizer()
    free = generate(m, looping, mode="ar", max_tokens=40).tokens
    eos = free[2]
    cut = free.index(eos)
    assert cut > 0
    m.tokenizer = CharTokenizer(eos=[eos])
    for width, length in [(1, 4), (8, 5)]:
        raw.clear()
        rd = generate(m, looping, mode="redrafter", max_tokens=120, beam_width=width, beam_length=length)
        assert rd.tokens == free[:cut] and rd.finish_reason == "eos"
        assert raw[-1] > rd.step_stats[-1].emitted  # the end token was one of the step's accepted drafts


def test_greedy_context_limit():
    m = tiny_loaded(context=len(PROMPT) + 40)
    ar = generate(m, PROMPT, mode="ar", max_tokens=500)
    assert ar.finish_reason == "context"
    assert len(PROMPT) + len(ar.tokens) == m.context_length + 1  # the last token is emitted, never fed
    for width, length, look in [(4, 4, 0), (16, 6, 0), (1, 2, 16)]:
        rd = generate(m, PROMPT, mode="redrafter", max_tokens=500, beam_width=width, beam_length=length, lookup=look)
        assert rd.tokens == ar.tokens and rd.finish_reason == "context"


def test_cancel_keeps_prompt_cache_consistent():
    m = tiny_loaded()
    pc = PromptCache(m.model)
    calls = {"n": 0}

    def stop_after_three():
        calls["n"] += 1
        return calls["n"] > 3

    part = generate(m, PROMPT, mode="redrafter", max_tokens=100, prompt_cache=pc, should_stop=stop_after_three)
    assert part.finish_reason == "cancelled"
    assert pc.cache.offset == len(pc.ids)
    assert pc.ids[: len(PROMPT)] == PROMPT
    # Continuing the conversation on the reused cache gives what a fresh cache gives.
    follow = PROMPT + part.tokens + [3, 3]
    reused = generate(m, follow, mode="redrafter", max_tokens=40, prompt_cache=pc)
    fresh = generate(m, follow, mode="ar", max_tokens=40)
    assert reused.tokens == fresh.tokens
    assert pc.cache.offset == len(pc.ids)


def test_a_prompt_cache_used_by_another_call_ends_the_stream_that_had_it():
    """A stream paused while another call used its cache went on from that call's history."""
    from redrafter_mlx.errors import SettingError

    m = tiny_loaded()
    pc = PromptCache(m.model)
    first = stream(m, PROMPT, mode="redrafter", max_tokens=40, prompt_cache=pc)
    for _ in range(3):
        next(first)
    other = PROMPT[:3] + [8, 8]
    assert generate(m, other, mode="redrafter", max_tokens=10, prompt_cache=pc).tokens == \
        generate(m, other, mode="ar", max_tokens=10).tokens
    with pytest.raises(SettingError, match="used by another call"):
        next(first)
    assert pc.cache.offset == len(pc.ids)  # the cache stays whole for the next call
    # an abandoned stream closed while another one holds the cache between steps leaves that one's cache alone
    ar_ref = generate(m, other, mode="ar", max_tokens=12).tokens
    old = stream(m, PROMPT, mode="ar", max_tokens=40, prompt_cache=pc)
    for _ in range(3):  # inside its decoding loop
        next(old)
    new = stream(m, other, mode="ar", max_tokens=12, prompt_cache=pc)
    got = [t for _ in range(4) for t in next(new).tokens]  # pipelined: a queued token sits in the cache ahead of pc.ids
    old.close()
    got += [t for ev in new for t in ev.tokens]
    assert got == ar_ref and pc.cache.offset == len(pc.ids)
    assert generate(m, PROMPT, mode="redrafter", max_tokens=40, prompt_cache=pc).tokens == \
        generate(m, PROMPT, mode="ar", max_tokens=40).tokens
    # two streams on their own caches, interleaved, are both plain decoding's reply
    a, b = (stream(m, p, mode="redrafter", max_tokens=30, prompt_cache=PromptCache(m.model)) for p in (PROMPT, other))
    got = {0: [], 1: []}
    for pair in zip(a, b):
        for i, ev in enumerate(pair):
            got[i] += ev.tokens
    assert got[0] == generate(m, PROMPT, mode="ar", max_tokens=30).tokens[: len(got[0])]
    assert got[1] == generate(m, other, mode="ar", max_tokens=30).tokens[: len(got[1])]


def test_threads_sharing_a_model_take_turns(monkeypatch):
    """Two threads decoding trees on one model at once broke verification (a rope error, or a reply
    unlike plain decoding): each step now holds the model's lock."""
    import threading
    import time

    from redrafter_mlx import base_model

    rope = base_model._TreeRoPE.__call__

    def slow_rope(self, *a, **k):  # a forward as long as a real model's, so the threads overlap in it
        time.sleep(0.002)
        return rope(self, *a, **k)

    monkeypatch.setattr(base_model._TreeRoPE, "__call__", slow_rope)
    m = tiny_loaded(vocab=40)
    prompts = [PROMPT, [4, 4, 9, 1, 30, 2]]
    want = [generate(m, p, mode="ar", max_tokens=60).tokens for p in prompts]
    kw = [dict(beam_width=3, beam_length=4), dict(tree=6, beam_length=5, lookup=3)]
    for _ in range(3):
        got = {}

        def work(i):
            try:
                got[i] = generate(m, prompts[i], mode="redrafter", max_tokens=60, **kw[i]).tokens
            except Exception as e:  # noqa: BLE001 (reported below)
                got[i] = repr(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [got[0], got[1]] == want



@pytest.mark.parametrize("kw", [dict(beam_width=4, beam_length=4), dict(tree=8), {}])
def test_a_conversation_or_a_stream_goes_on_in_another_thread(kw):
    """MLX computes a lazy array only on the thread that built it: a chat's second turn run on another
    worker thread with the same PromptCache (a server's thread pool), or a stream resumed on another
    thread (a sync generator read through a thread pool), failed with "There is no Stream(cpu, 4) in
    current thread" where a step had committed a path whose keys were still lazy."""
    import threading

    def in_thread(fn):
        out = []
        thread = threading.Thread(target=lambda: out.append(fn()))
        thread.start()
        thread.join()
        return out[0] if out else None

    m = tiny_loaded(seed=0)
    if not kw:  # adaptive drafting: on fixed costs (this machine's timing, under load, parked it, and the premise
        from test_control import flat_costs, with_costs  # below failed: 1.5 tokens a step)

        with_costs(m, flat_costs())
    pc = PromptCache(m.model)
    first = in_thread(lambda: generate(m, PROMPT, mode="redrafter", max_tokens=30, prompt_cache=pc, **kw))
    assert first is not None and first.stats.tokens_per_step > 2  # paths of several tokens were committed
    following = PROMPT + first.tokens + [3, 4]
    second = in_thread(lambda: generate(m, following, mode="redrafter", max_tokens=30, prompt_cache=pc, **kw))
    assert second is not None and second.stats.cached_tokens >= len(PROMPT + first.tokens) - 1  # (the last not fed)
    assert second.tokens == generate(m, following, mode="ar", max_tokens=30).tokens
    events = stream(m, PROMPT, mode="redrafter", max_tokens=30, **kw)
    begun = in_thread(lambda: [next(events) for _ in range(3)])
    assert begun is not None
    assert [t for e in begun + list(events) for t in e.tokens] == generate(m, PROMPT, mode="ar", max_tokens=30).tokens

def test_interrupted_step_rolls_back(monkeypatch):
    m = tiny_loaded()
    pc = PromptCache(m.model)
    gen = importlib.import_module("redrafter_mlx.generate")

    real_pack = gen.pack
    calls = {"n": 0}

    def failing_pack(beams):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_pack(beams)

    monkeypatch.setattr(gen, "pack", failing_pack)
    with pytest.raises(KeyboardInterrupt):
        generate(m, PROMPT, mode="redrafter", max_tokens=50, prompt_cache=pc)
    assert pc.cache.offset == len(pc.ids)
    monkeypatch.setattr(gen, "pack", real_pack)
    again = generate(m, PROMPT, mode="redrafter", max_tokens=30, prompt_cache=pc)
    assert again.tokens == generate(m, PROMPT, mode="ar", max_tokens=30).tokens


def test_redrafter_without_drafter_is_refused():
    m = tiny_loaded()
    m.drafter = None
    with pytest.raises(RedrafterError, match="no drafter"):
        generate(m, PROMPT, mode="redrafter")
    g = generate(m, PROMPT, mode="auto", max_tokens=5)  # adaptive: drafts from the context alone
    assert g.stats.mode == "auto" and g.stats.accepted_tokens == g.stats.looked_up_tokens
    assert generate(m, PROMPT, mode="auto", max_tokens=5, beam_width=4).stats.mode == "ar"  # fixed drafting needs one


def test_auto_mode_is_adaptive_and_drafting_settings_fix_it():
    m = tiny_loaded()
    g = generate(m, PROMPT, max_tokens=5)
    assert g.stats.mode == "auto" and g.stats.adaptive and g.stats.beam_width == 0
    m.beam_shape = (2, 3)  # a tuned shape no longer overrides the controller ...
    assert generate(m, PROMPT, max_tokens=5).stats.mode == "auto"
    g = generate(m, PROMPT, max_tokens=5, lookup=8)  # ... but fills in fixed drafting's unset settings
    assert g.stats.mode == "redrafter" and not g.stats.adaptive and (g.stats.beam_width, g.stats.beam_length) == (2, 3)
    m.beam_shape = (1, 1)  # tuned: plain decoding was fastest on this device
    assert generate(m, PROMPT, max_tokens=5, lookup=8).stats.mode == "ar"
    assert generate(m, PROMPT, max_tokens=5, beam_length=3).stats.mode == "redrafter"  # asked for drafts


def test_draft_top_k_drafts_beams_and_is_refused_with_a_tree():
    """draft_top_k limits beam search, and a dynamic tree has no top-k: with tree=N, or with a tree
    tuned beside the shape (draft_top_k alone), it was ignored, saying nothing."""
    from redrafter_mlx.errors import SettingError

    m = tiny_loaded()
    kw = dict(mode="redrafter", max_tokens=24, lookup=0, beam_width=4, beam_length=4)
    beams = generate(m, PROMPT, tree=0, draft_top_k=1, **kw)
    assert beams.stats.packed_tokens != generate(m, PROMPT, tree=0, **kw).stats.packed_tokens  # it drafts otherwise
    with pytest.raises(SettingError, match="draft_top_k .* tree=8"):
        generate(m, PROMPT, tree=8, draft_top_k=1, **kw)
    m.beam_shape, m.tree = (4, 4), 8  # tuned: a tree of 8 nodes
    assert generate(m, PROMPT, mode="redrafter", max_tokens=24, lookup=0).stats.tree == 8
    tuned = generate(m, PROMPT, mode="redrafter", max_tokens=24, lookup=0, draft_top_k=1)
    assert tuned.stats.tree == 0 and tuned.stats.packed_tokens == beams.stats.packed_tokens
    assert tuned.tokens == generate(m, PROMPT, mode="ar", max_tokens=24).tokens


# ---- sampled losslessness ----------------------------------------------------------------

def exact_distribution(m, prompt, k, temperature, top_p):
    """P(first k tokens) by enumeration with the base model: (V,)*k array."""
    from redrafter_mlx.sampling import Sampler

    s = Sampler(temperature, top_p)
    V = m.args.vocab_size
    probs = np.zeros((V,) * k)
    for seq in np.ndindex(*(V,) * k):
        ids = mx.array([prompt + list(seq[:-1])])
        logits, _ = m.model(ids)
        lp = np.array(s.logprobs(logits[0, -k:]))  # rows predict seq[0..k-1]
        probs[seq] = np.exp(sum(lp[i, seq[i]] for i in range(k)))
    return probs


def sampled_counts(m, prompt, k, n, runs=None, **kw):
    """Counts of the first k tokens over seeds 0 to n - 1; `runs` (a list) collects each reply (a Generation),
    so a test can check that the replies did go through what it claims to test (drafts, copies, grafts)."""
    V = m.args.vocab_size
    counts = np.zeros((V,) * k)
    for seed in range(n):
        g = generate(m, prompt, max_tokens=k, seed=seed, **kw)
        counts[tuple(g.tokens)] += 1
        if runs is not None:
            runs.append(g)
    return counts


def chi_square_p(counts, probs):
    from scipy.stats import chisquare

    keep = probs.ravel() > 0
    expected = probs.ravel()[keep] / probs.ravel()[keep].sum() * counts.sum()
    assert counts.ravel()[~keep].sum() == 0, "sampled a sequence of probability 0"
    observed = counts.ravel()[keep]
    # Cells expected fewer than 5 times are pooled into one (the chi-square approximation needs
    # it: one draw in a cell expected 1e-4 times would otherwise weigh 10^4).
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return chisquare(observed, expected).pvalue


SAMPLING_PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def sampling_model():
    # A seed whose 3-token distribution is spread out at T=0.7, top-p 0.8 too (9 sequences above
    # 2%; many seeds put all the mass on one sequence there, which tests nothing).
    return tiny_loaded(vocab=4, seed=2)


@pytest.mark.parametrize("temperature,top_p,shape,look", [(1.0, 1.0, (3, 3), 0), (0.7, 0.8, (3, 3), 0), (1.0, 1.0, (1, 2), 3)])
def test_sampling_matches_base_distribution(sampling_model, temperature, top_p, shape, look):
    """(With a context-lookup beam: a repetitive prompt and one drafted token, so the third
    token comes from the copy whenever it is accepted, about half of the accepted tokens.)"""
    m = sampling_model
    prompt = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2] if look else SAMPLING_PROMPT
    probs = exact_distribution(m, prompt, 3, temperature, top_p)
    runs = []
    counts = sampled_counts(m, prompt, 3, 1500, runs, mode="redrafter", temperature=temperature, top_p=top_p,
                            beam_width=shape[0], beam_length=shape[1], lookup=look)
    assert chi_square_p(counts, probs) > 1e-3
    # the replies went through verified drafts (a mode decoding plainly would pass the chi-square too):
    # ~0.7, ~0.35 and ~0.13 accepted drafts a reply, of which ~0.05 the copy's in the third case
    assert sum(g.stats.accepted_tokens for g in runs) > 100
    if look:
        assert sum(g.stats.looked_up_tokens for g in runs) > 20


def test_sampling_test_catches_a_wrong_scheme(sampling_model, monkeypatch):
    """Accepting the first beam's drafts without checking them must fail the same test."""
    gen = importlib.import_module("redrafter_mlx.generate")

    def trusting_accept(tree, choices):
        path = [int(i) for i in tree.unpacker[0]]
        return path, int(choices[path[-1]])

    monkeypatch.setattr(gen, "accept", trusting_accept)
    m = sampling_model
    probs = exact_distribution(m, SAMPLING_PROMPT, 3, 1.0, 1.0)
    counts = sampled_counts(m, SAMPLING_PROMPT, 3, 1500, mode="redrafter", temperature=1.0, beam_width=3, beam_length=3)
    assert chi_square_p(counts, probs) < 1e-3


# ---- the draft head: Apple's format and a reference forward -------------------------------

def _reference_logits(weights, h, embs, n_layers):
    """The paper's equations in numpy: s_k = silu(W e_k + U s_{k-1} + b); head on [h, s_k]."""
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    s = np.zeros_like(h)
    out = []
    for e in embs:
        s = silu(e @ weights["rnn_w.weight"].T + s @ weights["rnn_u.weight"].T + weights["rnn_u.bias"])
        x = np.concatenate([h, s])
        if "input_proj.weight" in weights:
            x = x @ weights["input_proj.weight"].T + weights["input_proj.bias"]
        for i in range(n_layers):
            x = x + silu(x @ weights[f"lm_head.{i}.linear.weight"].T + weights[f"lm_head.{i}.linear.bias"])
        out.append(x @ weights[f"lm_head.{n_layers}.weight"].T)
    return np.stack(out)


@pytest.mark.parametrize("exit_dim", [None, 48])
def test_apple_format_drafter_loads_and_matches_reference(tmp_path, exit_dim):
    H, V, N = 16, 30, 2
    rng = np.random.default_rng(0)
    E = exit_dim or 2 * H
    weights = {
        "rnn_u.weight": rng.normal(size=(H, H)) * 0.3,
        "rnn_u.bias": rng.normal(size=(H,)) * 0.1,
        "rnn_w.weight": rng.normal(size=(H, H)) * 0.3,
        f"lm_head.{N}.weight": rng.normal(size=(V, E)) * 0.3,
    }
    for i in range(N):
        weights[f"lm_head.{i}.linear.weight"] = rng.normal(size=(E, E)) * 0.2
        weights[f"lm_head.{i}.linear.bias"] = rng.normal(size=(E,)) * 0.1
    if exit_dim:
        weights["input_proj.weight"] = rng.normal(size=(E, 2 * H)) * 0.3
        weights["input_proj.bias"] = rng.normal(size=(E,)) * 0.1
    weights = {k: v.astype(np.float32) for k, v in weights.items()}
    folder = tmp_path / "drafter"
    folder.mkdir()
    config = {"hidden_size": H, "vocab_size": V, "num_draft_layers": N, "rnn": True, "emb_norm": False}
    if exit_dim:
        config["exit_dim"] = exit_dim
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()})

    drafter = load_drafter(folder)
    h = rng.normal(size=(H,)).astype(np.float32)
    embs = rng.normal(size=(3, H)).astype(np.float32)
    got = drafter(mx.array(h)[None, None], mx.array(embs)[None, None])[0, 0]  # (K, V)
    want = _reference_logits(weights, h, embs, N)
    assert np.allclose(np.array(got), want, atol=1e-4)


def test_drafter_save_load_round_trip(tmp_path):
    m = tiny_loaded(lm_head="shared")
    save_drafter(m.drafter, tmp_path / "d")
    again = load_drafter(tmp_path / "d", m.model)
    h, s = mx.ones((1, 32)), mx.zeros((1, 32))
    assert mx.allclose(again.logits(h, s, m.model), m.drafter.logits(h, s, m.model)).item()


def test_drafter_for_another_model_is_refused(tmp_path):
    m = tiny_loaded()
    other = Drafter(DrafterArgs(hidden_size=48, vocab_size=12))
    save_drafter(other, tmp_path / "other")
    with pytest.raises(DrafterMismatchError, match="hidden size 48"):
        load_drafter(tmp_path / "other", m.model)


@pytest.mark.parametrize("lm_head", ["own", "shared"])
def test_draft_vocabulary_restricts_drafts_and_stays_lossless(tmp_path, lm_head):
    m = tiny_loaded(lm_head=lm_head)
    ar = generate(m, PROMPT, mode="ar", max_tokens=100)
    allowed = sorted(set(ar.tokens))[:5]
    m.drafter.set_draft_vocab(allowed)
    seen = []
    import redrafter_mlx.tree as tree_module

    real_pack = tree_module.pack
    gen = importlib.import_module("redrafter_mlx.generate")

    def spy(beams):
        seen.append(np.array(beams))
        return real_pack(beams)

    gen.pack = spy
    try:
        rd = generate(m, PROMPT, mode="redrafter", max_tokens=100, beam_width=4, beam_length=4, lookup=0)
    finally:
        gen.pack = real_pack
    assert rd.tokens == ar.tokens
    drafted = np.concatenate([b[:, 1:].ravel() for b in seen])
    assert set(drafted.tolist()) <= set(allowed)
    # The restricted vocabulary survives a save/load round trip.
    save_drafter(m.drafter, tmp_path / "d")
    again = load_drafter(tmp_path / "d", m.model)
    assert again.draft_vocab.tolist() == allowed
    h, s = mx.ones((2, 32)), mx.zeros((2, 32))
    assert mx.allclose(again.draft_logits(h, s, m.model), m.drafter.draft_logits(h, s, m.model), atol=1e-5).item()


def test_context_index_answers_as_the_full_scan_does():
    """The incremental index (a few dictionary reads a step) gives lookup_match's answer on
    contexts that grow, restart and shrink, as a chat's do."""
    rng = np.random.default_rng(1)
    asked = 0
    for _ in range(100):
        index = ContextIndex()
        ids = rng.integers(0, 5, int(rng.integers(1, 30))).tolist()
        for _ in range(25):
            length = int(rng.integers(0, 9))
            want, got = lookup_match(ids, length), index.match(ids, length)
            assert got.n == want.n and got.extent == want.extent and got.copy.tolist() == want.copy.tolist(), (ids, length)
            asked += want[1] > 0
            r = rng.random()
            if r < 0.1:
                ids = rng.integers(0, 5, int(rng.integers(1, 30))).tolist()
            elif r < 0.15:
                ids = ids[: max(1, len(ids) - int(rng.integers(1, 5)))]
            else:
                ids = ids + rng.integers(0, 5, int(rng.integers(1, 4))).tolist()
    assert asked > 500  # most questions had a match to find
    # a match's extent, measured in slices, is the naive backward count (loops run long)
    for _ in range(300):
        period = int(rng.integers(1, 4))
        ctx = (rng.integers(0, 3, period).tolist() * 30)[: int(rng.integers(5, 90))]
        ctx = [t if rng.random() > 0.03 else 7 for t in ctx]
        key = ctx[-int(rng.integers(2, 40)) :]
        end = int(rng.integers(2, len(ctx)))
        if ctx[end - 2 : end] != key[-2:]:
            continue
        naive = 2
        while naive < min(len(key), end) and ctx[end - 1 - naive] == key[-1 - naive]:
            naive += 1
        assert extent(ctx, end, key, 2) == naive
    with pytest.raises(ValueError):
        ContextIndex(max_ngram=1, min_ngram=2)
