"""Graph-structured drafting (GSD, graph.py): merging, grafting, the context graph, losslessness."""

import math

import mlx.core as mx
import numpy as np
import pytest

from redrafter_mlx import generate
from redrafter_mlx.graph import ALIAS_GRAFT, CONTEXT_GRAFT, DRAFTER, Merger, graft, search
from redrafter_mlx.lookup import MAX_GROWTH, ContextIndex
from redrafter_mlx.tree_search import expand, tree_search

from test_control import flat_costs, linear_costs, with_costs
from test_redrafter import PROMPT, SAMPLING_PROMPT, CharTokenizer, chi_square_p, exact_distribution, \
    sampled_counts, tiny_loaded


class MarkovStub:
    """A drafter whose next-token distribution depends on the last token alone (a transition
    table), so an alias's grafted continuation is exactly what drafting it would have given."""

    def __init__(self, table):
        self.logp = np.log(np.asarray(table, dtype=np.float64))  # (V, V) rows sum to 1
        self.V = self.logp.shape[0]

    def __contains__(self, name):
        return False

    def update_state(self, emb, state):
        return emb  # the state is the last token, one-hot

    def draft_logits(self, context, state, base):
        return state @ mx.array(self.logp.astype(np.float32))


class OneHotBase:
    def __init__(self, V):
        self.V = V

    def embed(self, ids):
        return mx.array(np.eye(self.V, dtype=np.float32))[ids]


def table(V, rows):
    t = np.full((V, V), 1e-6)
    for a, nxt in rows.items():
        for b, p in nxt.items():
            t[a, b] = p
    return t / t.sum(axis=1, keepdims=True)


H = mx.zeros(1)


def paths(tokens, parents):
    """Every node's token path from the root, as a tuple."""
    out = []
    for i in range(len(tokens)):
        p, node = [], i
        while node >= 0:
            p.append(int(tokens[node]))
            node = int(parents[node])
        out.append(tuple(p[::-1]))
    return out


# ---- merging and grafting ------------------------------------------------------------------

def test_shared_suffixes_graft_the_representatives_subtree():
    # root 0 -> 1 (0.6) or 2 (0.4); both 1 and 2 -> 3; 3 -> 4 -> 5. With k=0 the second 3
    # (under 2) is an alias of the first (under 1): it is not drafted from, and 3 -> 4 -> 5 is
    # grafted under it with its conditional probabilities.
    V = 6
    stub = MarkovStub(table(V, {0: {1: 0.6, 2: 0.4}, 1: {3: 1.0}, 2: {3: 1.0}, 3: {4: 0.9, 5: 0.1}, 4: {5: 1.0},
                                5: {0: 1.0}}))
    base = OneHotBase(V)
    plain = expand(stub, base, H, 0, 4, 4, min_prob=0.01)  # 4 wide: every node clearing the floor is drafted
    graphed = expand(stub, base, H, 0, 4, 4, min_prob=0.01, graph=0, prefix=[0])
    alias = {paths(graphed.tokens, graphed.parents)[a] for a in np.flatnonzero(graphed.alias >= 0)}
    assert alias == {(2, 3), (1, 3, 4, 5)}  # the second: a 5 under 4 matches the 5 under 3
    assert graphed.rows < plain.rows  # the alias was not fed to the drafter
    got = {p: s for p, s in zip(paths(graphed.tokens, graphed.parents), graphed.logp)}
    want = {p: s for p, s in zip(paths(plain.tokens, plain.parents), plain.logp)}
    # A Markov drafter gives the graft exactly what drafting would have: same nodes, same scores.
    assert set(got) == set(want)
    for p in want:
        assert got[p] == pytest.approx(want[p], abs=1e-5)
    assert (graphed.sources[graphed.sources != DRAFTER] == ALIAS_GRAFT).all() and (graphed.sources == ALIAS_GRAFT).any()
    # Scores never rise down a path; the depth cap and the floor hold for grafts too.
    has_parent = graphed.parents >= 0
    assert (graphed.logp[has_parent] <= graphed.logp[graphed.parents[has_parent]] + 1e-9).all()
    assert graphed.levels.max() <= 4 and (graphed.logp >= math.log(0.01)).all()
    # Kept as a tree: the budget's best nodes, closed under parents.
    rows = tree_search(stub, base, H, 0, 2, 4, 5, 0.01)
    g = search(stub, base, H, 0, 2, 4, 5, 0.01, 0, [0])
    assert sum(1 for _ in {tuple(r[: d + 1]) for r in g.rows.tolist() for d in range(1, len(r)) if r[d] >= 0}) <= 5
    assert g.rows.shape[1] <= 5 and (g.rows[:, 0] == 0).all()
    assert rows.shape[0] >= 1


def test_k_gram_length_decides_what_merges():
    # 1 -> 3 and 2 -> 3: the 3s end in (1, 3) and (2, 3), so with k=1 they do not merge, but
    # the 4s below them end in (3, 4) and do; with k=2, the 5s (3, 4, 5); with k=3, nothing.
    V = 6
    stub = MarkovStub(table(V, {0: {1: 0.6, 2: 0.4}, 1: {3: 1.0}, 2: {3: 1.0}, 3: {4: 1.0}, 4: {5: 1.0}}))
    base = OneHotBase(V)

    def aliases(k):
        c = expand(stub, base, H, 0, 2, 4, min_prob=0.01, graph=k, prefix=[0])
        return {paths(c.tokens, c.parents)[a] for a in np.flatnonzero(c.alias >= 0)}

    assert aliases(0) == {(2, 3)} and aliases(1) == {(2, 3, 4)}
    assert aliases(2) == {(2, 3, 4, 5)} and aliases(3) == set()


def test_a_stub_that_repeats_one_token_terminates_at_the_depth_cap():
    V = 3
    stub = MarkovStub(table(V, {0: {1: 0.5, 2: 0.5}, 1: {1: 0.99, 2: 0.01}, 2: {1: 0.99, 2: 0.01}}))
    base = OneHotBase(V)
    for k in (0, 1, 2):
        c = expand(stub, base, H, 0, 3, 7, min_prob=1e-6, graph=k, prefix=[0, 0])
        assert c.levels.max() <= 7 and c.tokens.size < 300
        has_parent = c.parents >= 0
        assert (c.logp[has_parent] <= c.logp[c.parents[has_parent]] + 1e-9).all()


def test_merger_never_aliases_an_ancestor():
    m = Merger(0, [7])
    assert m.add([7, 5], [-1, -1]).tolist() == [-1, -1]  # 7 under the root is not the root's alias
    assert m.add([7], [0]).tolist() == [-1]  # 7 under 7: its match is its own ancestor
    assert m.add([7], [1]).tolist() == [0]  # 7 under 5: an alias of node 0
    with pytest.raises(ValueError, match="k"):
        Merger(-1, [])


def test_graft_obeys_floor_and_depth():
    tokens = np.array([1, 2, 3, 4])
    parents = np.array([-1, -1, 0, 2])
    logp = np.log(np.array([0.5, 0.4, 0.25, 0.05]))
    levels = np.array([1, 1, 2, 3])
    alias = np.array([-1, 0, -1, -1])  # node 1 reuses node 0's continuation
    t, p, s, lv = graft(tokens, parents, logp, levels, alias, math.log(0.1), 3)
    assert t.tolist() == [3] and p.tolist() == [1] and s[0] == pytest.approx(math.log(0.4 * 0.5))  # 4 falls below 0.1
    t, p, s, lv = graft(tokens, parents, logp, levels, alias, math.log(0.001), 2)
    assert t.tolist() == [3]  # depth cap 2
    t, p, s, lv = graft(tokens, parents, logp, levels, alias, math.log(0.001), 5)
    assert t.tolist() == [3, 4] and p.tolist() == [1, 4] and lv.tolist() == [2, 3]


@pytest.mark.parametrize("width,depth,budget,min_prob", [(2, 4, 6, 0.02), (4, 5, 12, 0.01), (3, 6, 40, 0.001)])
def test_graph_search_without_merging_is_the_tree(width, depth, budget, min_prob):
    m = tiny_loaded()
    h = m.model.hidden(mx.array([PROMPT]))[0, -1]
    tree = tree_search(m.drafter, m.model, h, 5, width, depth, budget, min_prob)
    g = search(m.drafter, m.model, h, 5, width, depth, budget, min_prob, None, PROMPT + [5])
    assert np.array_equal(tree, g.rows) and g.aliases == 0
    assert set(g.sources[g.sources >= 0].tolist()) <= {DRAFTER}


def test_the_context_graph_grafts_what_followed_a_drafted_path():
    # The drafter proposes 3 after the root; the context holds "3 8 9 6 2" after a "5 3".
    V = 10
    stub = MarkovStub(table(V, {5: {3: 0.9, 4: 0.1}}))
    base = OneHotBase(V)
    ids = [1, 5, 3, 8, 9, 6, 2, 7, 5]
    index = ContextIndex()
    index.match(ids, 8)
    g = search(stub, base, H, 5, 2, 1, 8, 0.05, 0, ids, index, 4)
    rows = [tuple(x for x in r if x >= 0) for r in g.rows.tolist()]
    assert (5, 3, 8, 9) in rows or any(r[:4] == (5, 3, 8, 9) for r in rows)
    assert (g.sources == CONTEXT_GRAFT).sum() >= 2
    assert g.rows.shape[1] <= 1 + 4  # copies stop at the lookup length


def test_a_context_match_that_runs_further_back_grafts_further_under_the_floor():
    # The drafted path "... 7 5 3" is followed by "8 9 6 2" in both contexts. In the first the match
    # runs 6 tokens back ("1 2 4 7 5 3", a passage quoted), in the second only "5 3" matches. The
    # longer match's continuation is the more often right (graph.CONTEXT_PRIOR), so more of it
    # clears the probability floor.
    V = 10
    stub = MarkovStub(table(V, {5: {3: 0.9, 4: 0.1}}))
    grafted = {}
    for name, ids in (("extent 6", [1, 2, 4, 7, 5, 3, 8, 9, 6, 2, 0, 1, 2, 4, 7, 5]),
                      ("extent 2", [1, 5, 3, 8, 9, 6, 2, 4, 7, 5])):
        index = ContextIndex()
        index.match(ids, 8)
        g = search(stub, OneHotBase(V), H, 5, 2, 1, 8, 0.3, 0, ids, index, 5)  # copies to depth 5
        rows = [tuple(x for x in r if x >= 0) for r in g.rows.tolist()]
        grafted[name] = int((g.sources == CONTEXT_GRAFT).sum())
        assert any(r[:3] == (5, 3, 8) for r in rows)
    # 0.9 x (0.77, 0.76, 0.79, 0.79) stays above 0.3 for four tokens, x 0.85 falls under it at the fifth;
    # 0.9 x (0.59, 0.58, 0.73) falls under it at the third
    assert grafted == {"extent 6": 4, "extent 2": 2}


def test_a_k_gram_longer_than_the_index_s_n_grams_still_grafts_where_the_context_matches_that_far():
    # GSD's context graph grafts below a node whose last k + 1 tokens occur in the context; the index holds n-grams
    # of 2 and 3 tokens, and a k of 3 or more (a 4-gram and longer) had found nothing: graph=3 and above drafted no
    # context graft, saying nothing. The drafted path "0 2 4 7 5 3" runs 5 tokens back along the context's
    # "1 2 4 7 5 3 8 9", so k + 1 up to 5 grafts its "8" (one level below the drafted node: depth cap 2), and 6
    # does not.
    V = 10
    stub = MarkovStub(table(V, {5: {3: 0.9, 4: 0.1}}))
    ids = [1, 2, 4, 7, 5, 3, 8, 9, 6, 2, 0, 0, 2, 4, 7, 5]
    grafted = {}
    for k in (0, 1, 2, 3, 4, 5, 6):
        index = ContextIndex()
        index.match(ids, 8)
        g = search(stub, OneHotBase(V), H, 5, 2, 1, 8, 0.05, k, ids, index, 2)
        rows = [tuple(x for x in r if x >= 0) for r in g.rows.tolist()]
        grafted[k] = (5, 3, 8) in rows
    assert grafted == {0: True, 1: True, 2: True, 3: True, 4: True, 5: False, 6: False}
    index = ContextIndex()
    index.match(ids, 8)
    assert index.follow([2, 4, 7, 5, 3], 2, 5).copy.tolist() == [8, 9]  # 5 tokens back: met
    assert index.follow([0, 4, 7, 5, 3], 2, 5).copy.size == 0  # "4 7 5 3" only: 4 of the 5
    assert index.follow([7, 5, 3], 2, 4).copy.size == 0  # a key shorter than the k-gram


def test_a_graft_copies_the_occurrence_that_matches_furthest_back():
    # "5 3" occurs twice: early after "2 4 7" (as the drafted path has it), followed by 8 9; later
    # after "0", followed by 6 6. The latest would copy 6 6; the furthest-back match copies 8 9.
    V = 10
    stub = MarkovStub(table(V, {5: {3: 0.9, 4: 0.1}}))
    ids = [2, 4, 7, 5, 3, 8, 9, 1, 0, 5, 3, 6, 6, 1, 2, 4, 7, 5]
    index = ContextIndex()
    index.match(ids, 8)
    g = search(stub, OneHotBase(V), H, 5, 2, 1, 8, 0.05, 0, ids, index, 3)  # copies to depth 3
    rows = [tuple(x for x in r if x >= 0) for r in g.rows.tolist()]
    assert (5, 3, 8, 9) in rows and not any(r[:3] == (5, 3, 6) for r in rows)


def test_the_root_copy_is_cut_by_its_calibrated_probability():
    from redrafter_mlx.graph import ROOT_FLOOR, copy_prior, root_copy
    from redrafter_mlx.lookup import Match

    copy = np.arange(32, dtype=np.int32)
    short, long = root_copy(Match(copy, 2, 2), 0.2), root_copy(Match(copy, 3, 33), 0.2)
    assert 1 <= short.size < long.size <= 32
    assert short.tolist() == copy[: short.size].tolist()
    path = np.cumprod(copy_prior(2, 32))
    assert path[short.size - 1] >= ROOT_FLOOR * 0.2 > path[short.size]
    assert root_copy(Match(copy[:0], 0, 0), 0.2).size == 0
    # a lower floor keeps more; the prior never rises above 1 or falls to 0
    assert root_copy(Match(copy, 2, 2), 0.02).size > short.size
    assert np.all((copy_prior(5, 40) > 0) & (copy_prior(5, 40) < 1))


# ---- losslessness and counting --------------------------------------------------------------

@pytest.mark.parametrize("graph,context_graph", [(0, True), (2, True), (4, True), (0, False), (None, True)])
def test_greedy_graph_drafting_equals_plain_tiny(graph, context_graph):
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=200)
    kw = dict(beam_width=4, beam_length=6, lookup=8, tree=16, tree_min_prob=0.001, graph=graph,
              context_graph=context_graph)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=200, **kw)
    assert rd.tokens == ar.tokens and rd.finish_reason == "length"
    assert max(s.packed for s in rd.step_stats) <= 16 + 1 + MAX_GROWTH * 8  # the copy grows while accepted whole
    if graph == 0:
        assert rd.stats.aliases > 0  # 12 tokens: drafts often reach the same token on two branches
        assert rd.stats.graft_accepted_tokens <= rd.stats.accepted_tokens
    if graph is not None and context_graph:
        # A tiny model loops: drafted nodes meet the loop in the context and get grafts, unless the
        # root's copy, running on around the loop (lookup.periodic), carries the steps by itself.
        grafts = rd.stats.grafted_tokens > 0 and rd.stats.graft_accepted_tokens > 0
        assert grafts or rd.stats.looked_up_tokens > 150
    if graph is None:
        assert rd.stats.grafted_tokens == 0 and rd.stats.aliases == 0
    # end-of-turn mid-run and the context limit
    eos = ar.tokens[60]
    m.tokenizer = CharTokenizer(eos=[eos])
    cut = ar.tokens.index(eos)
    rd = generate(m, PROMPT, mode="redrafter", max_tokens=200, **kw)
    assert rd.tokens == ar.tokens[:cut] and rd.finish_reason == "eos"
    small = tiny_loaded(context=len(PROMPT) + 40)
    ar = generate(small, PROMPT, mode="ar", max_tokens=500)
    rd = generate(small, PROMPT, mode="redrafter", max_tokens=500, **kw)
    assert rd.tokens == ar.tokens and rd.finish_reason == "context"


@pytest.mark.parametrize("costs", ["flat", "linear"])
def test_adaptive_graph_drafting_equals_plain_tiny(costs):
    """On linear costs drafting never pays: the controller parks every step, so that case compares plain
    decoding with plain decoding (it said nothing of it, as if graph drafting had been checked there).
    It says so now; the flat case checks that graphs were drafted, merged and accepted."""
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=200)
    with_costs(m, flat_costs() if costs == "flat" else linear_costs())
    auto = generate(m, PROMPT, mode="auto", max_tokens=200, graph=0)
    assert auto.tokens == ar.tokens and auto.stats.adaptive
    if costs == "flat":
        assert auto.stats.grafted_tokens > 0 and auto.stats.aliases > 0
        assert auto.stats.parked_steps == 0 and auto.stats.accepted_tokens > 150
    else:
        assert auto.stats.parked_steps == auto.stats.steps and auto.stats.accepted_tokens == 0
    small = tiny_loaded(context=len(PROMPT) + 40)
    ar = generate(small, PROMPT, mode="ar", max_tokens=500)
    auto = generate(with_costs(small, flat_costs()), PROMPT, mode="auto", max_tokens=500, graph=1)
    assert auto.tokens == ar.tokens and auto.finish_reason == "context"


def test_graph_needs_a_tree_and_a_valid_k():
    m = tiny_loaded()
    with pytest.raises(ValueError, match="graph"):
        generate(m, PROMPT, mode="redrafter", beam_width=2, beam_length=3, tree=0, graph=0)
    with pytest.raises(ValueError, match="graph"):
        generate(m, PROMPT, mode="redrafter", tree=8, graph=-1)


def test_a_k_gram_longer_than_any_draft_is_refused():
    """graph=10**30 was taken as is: past a step's deepest draft (MAX_DRAFT_TOKENS) a longer k-gram compares only
    the context with itself. The API and the bench's and replay's --graph say so in one line; 1024 still runs."""
    import argparse
    import re

    from redrafter_mlx.errors import SettingError, compact
    from redrafter_mlx.generate import MAX_DRAFT_TOKENS
    from redrafter_mlx.graph import MAX_GRAPH_K, parse_graph

    assert MAX_GRAPH_K == MAX_DRAFT_TOKENS
    m = tiny_loaded()
    for k in (MAX_GRAPH_K + 1, 10**30):
        said = f"graph {compact(k)}: GSD's k-gram length is at most 1024 ("  # (k's 31 digits: 1e+30)
        for mode in ("redrafter", "auto"):
            with pytest.raises(SettingError, match=re.escape(said)) as e:
                generate(m, PROMPT, mode=mode, tree=8, graph=k)
            assert "\n" not in str(e.value)
        for text in (str(k), f"gsd{k}", f"none,{k}"):
            with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"--{said}")):
                parse_graph(text)
    assert parse_graph(f"{MAX_GRAPH_K},gsd{MAX_GRAPH_K}") == [(MAX_GRAPH_K, True), (MAX_GRAPH_K, False)]
    assert generate(m, PROMPT, mode="redrafter", tree=8, graph=MAX_GRAPH_K, max_tokens=4).finish_reason == "length"


def test_replay_counts_the_steps_real_graph_decoding_takes():
    from redrafter_mlx.replay import replay

    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=150)
    for graph, ctx in ((0, True), (1, False)):
        kw = dict(beam_width=3, beam_length=5, lookup=4, tree=8, graph=graph, context_graph=ctx)
        rd = generate(m, PROMPT, mode="redrafter", max_tokens=150, **kw)
        out = replay(m, ar.prompt_tokens, ar.tokens, 3, 5, 4, tree=8, graph=graph, context_graph=ctx)
        assert out["steps"] == rd.stats.steps and out["produced"] == rd.stats.step_tokens
        assert out["packed"] == rd.stats.packed_tokens and out["grafted"] == rd.stats.grafted_tokens
        assert out["graft_accepted"] == rd.stats.graft_accepted_tokens and out["aliases"] == rd.stats.aliases


@pytest.mark.parametrize("mode", ["redrafter", "auto"])
def test_sampling_through_grafted_nodes_matches_base_distribution(mode):
    """The context graph grafts copies of the prompt's run of 0s (what this model tends to say next), and a
    4-token vocabulary makes aliases. With the prompt 1 2 3 0 1 2 3 0 1 2 this test had, one reply of 3
    tokens in ~200 went through a grafted node (none in mode auto), and accepting grafted nodes unchecked
    passed it; most grafts sit deeper than 3 tokens reach. Now ~1 in 10 does, and longer replies, which go
    through grafts in both modes, are each checked against plain decoding's reply for their seed (a draw
    depends on the seed and its position alone: sampling.py): that break fails it."""
    m = tiny_loaded(vocab=4, seed=2)
    if mode == "auto":
        with_costs(m, flat_costs())
    prompt = [1, 2, 3] + [0] * 8  # 13 sequences of 3 tokens above 2%
    probs = exact_distribution(m, prompt, 3, 1.0, 1.0)
    kw = dict(beam_width=3, beam_length=4, lookup=3, tree=8, tree_min_prob=0.01) if mode == "redrafter" else {}
    runs = []
    counts = sampled_counts(m, prompt, 3, 1500, runs, mode=mode, temperature=1.0, graph=0, **kw)
    assert chi_square_p(counts, probs) > 1e-3
    assert sum(g.stats.accepted_tokens for g in runs) > 300  # the replies went through trees
    if mode == "redrafter":
        assert sum(g.stats.aliases for g in runs) > 0 and sum(g.stats.graft_accepted_tokens for g in runs) > 75
    grafts = 0
    for seed in range(60):
        g = generate(m, prompt, mode=mode, max_tokens=16, seed=seed, temperature=1.0, graph=0, **kw)
        assert g.tokens == generate(m, prompt, mode="ar", max_tokens=16, seed=seed, temperature=1.0).tokens, seed
        grafts += g.stats.graft_accepted_tokens
    assert grafts > (30 if mode == "redrafter" else 0)  # (auto: 4 tokens, in these 60 replies)


@pytest.mark.parametrize("kw", [
    dict(mode="redrafter", beam_width=3, beam_length=4, lookup=0, tree=8, tree_min_prob=0.01),  # a tree, no graph
    dict(mode="redrafter", beam_width=3, beam_length=4, lookup=3, tree=16, tree_min_prob=0.001, graph=1,
         context_graph=False),  # merging alone
], ids=["tree", "graph1-no-context"])
def test_sampling_with_top_p_matches_base_distribution_in_the_other_drafting_modes(kw):
    """Two modes the tests above leave out, at T = 0.7 and top_p = 0.8 (accepting the first row
    unchecked fails it: sequences of probability 0). Merging alone had a tree of 8 nodes at a floor of
    0.01, where no node was ever merged (0 aliases in every reply): it ran as the tree case; 16 nodes at
    0.001 merge (~7 aliases a reply), and the test says so."""
    m = tiny_loaded(vocab=4, seed=2)
    prompt = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2]
    probs = exact_distribution(m, prompt, 3, 0.7, 0.8)
    runs = []
    counts = sampled_counts(m, prompt, 3, 600, runs, temperature=0.7, top_p=0.8, **kw)
    assert chi_square_p(counts, probs) > 1e-3
    assert sum(g.stats.accepted_tokens for g in runs) > 100  # the replies went through trees
    if kw.get("graph") is not None:
        assert sum(g.stats.aliases for g in runs) > 600


def test_context_ceiling_extends_a_step_by_what_the_context_continues():
    from redrafter_mlx.replay import context_ceiling

    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    context = [5, 6, 7, 8, 9, 4, 5, 6, 1, 2, 3, 0, 5]  # the root is the last token, 5
    index = ContextIndex()
    index.match(context, 4)
    future = [6, 7, 8, 9, 3]  # what the base model says after the root
    # nothing accepted: the root's keys (3, 0, 5) and (0, 5) never occurred before
    assert context_ceiling(index, context, [5], future, 8) == 0
    # 6 accepted: its key (5, 6) last occurred at 6..7 and continues 1, not 7
    assert context_ceiling(index, context, [5, 6], future, 8) == 0
    # any occurrence: (5, 6) at 0..1 continues 7, 8, 9, 4: matches 7, 8, 9, then 4 != 3
    assert context_ceiling(index, context, [5, 6], future, 8, every=True) == 3
    assert context_ceiling(index, context, [5, 6], future, 2, every=True) == 2  # copies of 2 tokens at most
    # accepted 6, 7: the node 7's key (5, 6, 7) occurred at 0..2, latest, and continues 8, 9 (then 4 != 3)
    assert context_ceiling(index, context, [5, 6, 7], future, 8) == 2
    # already accepted further than any copy reaches: never negative
    assert context_ceiling(index, context, [5, 6, 7, 8, 9, 3], future + [1], 8) == 0


def test_replay_with_a_context_ceiling_takes_fewer_steps_on_a_repeating_reply():
    from redrafter_mlx.replay import replay

    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=150)
    kw = dict(tree=8, graph=1)
    base = replay(m, ar.prompt_tokens, ar.tokens, 3, 5, 4, **kw)
    assert replay(m, ar.prompt_tokens, ar.tokens, 3, 5, 4, ceiling=0, **kw) == base
    latest = replay(m, ar.prompt_tokens, ar.tokens, 3, 5, 4, ceiling=8, **kw)
    every = replay(m, ar.prompt_tokens, ar.tokens, 3, 5, 4, ceiling=8, ceiling_every=True, **kw)
    assert latest["produced"] == base["produced"] and latest["ceiling_extra"] > 0
    assert every["steps"] <= latest["steps"] < base["steps"]
