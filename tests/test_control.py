"""The adaptive controller (control.py) and its cost model (costs.py): decisions against fake
cost curves, parking and recovery, losslessness through the trees it picks, the cost cache."""

import importlib
import itertools
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from redrafter_mlx import costs, generate
from redrafter_mlx.control import PARK_FIRST, PARK_MAX, PROBE_STEPS, Controller, controller, controller_key
from redrafter_mlx.costs import CostModel, FixedCosts
from redrafter_mlx.generate import PromptCache
from redrafter_mlx.tree_search import Candidates

from test_redrafter import PROMPT, SAMPLING_PROMPT, CharTokenizer, chi_square_p, exact_distribution, sampled_counts, \
    tiny_loaded

SIZES = [1, 2, 4, 8, 16, 32, 64]


def linear_costs():
    """Verifying n tokens costs n plain steps (a CPU without a fast BLAS, 4-bit CPU kernels)."""
    return FixedCosts(SIZES, [0.1 * n for n in SIZES], draft_level=0.002)


def flat_costs():
    """Verifying 64 tokens costs 1.3 plain steps (a GPU)."""
    return FixedCosts(SIZES, [0.1 * (1 + 0.3 * (n - 1) / 63) for n in SIZES], draft_level=0.001)


def cpu_costs():
    """Verifying n tokens on a 2-core CPU with a fast BLAS: 64 cost 6.3 plain steps."""
    return FixedCosts(SIZES, [0.1 * r for r in (1, 1.1, 1.6, 2.0, 2.5, 3.7, 6.3)], draft_level=0.002)


class Timed(FixedCosts):
    """A fake machine whose curve is fixed but whose steps take the seconds a test says: the
    curve lets drafting pay, the steps show whether it does."""

    def step_seconds(self, n, measured):
        return measured

    def drafting_seconds(self, levels, measured):
        return measured


def timed(costs):
    return Timed(costs.sizes.astype(int).tolist(), costs.seconds.tolist(), costs.draft_level)


def chain(q, depth):
    """A drafter candidate chain below the root, each node with conditional probability q."""
    logp = np.cumsum(np.full(depth, np.log(q)))
    return Candidates(np.arange(10, 10 + depth), np.arange(-1, depth - 1), logp, np.arange(1, depth + 1))


def wide(q, width, depth):
    """`width` chains of `depth` nodes below the root."""
    tokens, parents, logp, levels = [], [], [], []
    for w in range(width):
        for d in range(depth):
            parents.append(-1 if d == 0 else len(tokens) - 1)
            tokens.append(10 + w * depth + d)
            logp.append((d + 1) * np.log(q))
            levels.append(d + 1)
    return Candidates(np.array(tokens), np.array(parents), np.array(logp), np.array(levels))


# ---- decisions against fake cost models ------------------------------------------------------

def test_linear_verification_and_low_acceptance_verify_the_root_alone():
    ctl = Controller(linear_costs(), has_drafter=True)
    plan = ctl._choose(5, chain(0.3, 6), [], 63, 6)
    assert plan.kept.size == 0 and plan.rows.tolist() == [[5]] and plan.expected == 1.0


def test_flat_verification_keeps_a_large_tree():
    ctl = Controller(flat_costs(), has_drafter=True)
    plan = ctl._choose(5, wide(0.5, 8, 5), [], 63, 5)
    assert plan.kept.size >= 30
    assert plan.rows.shape[0] == 8 and (plan.rows[:, 0] == 5).all()
    # Every kept node's parent is kept: the rows are a tree.
    kept = set(plan.kept.tolist())
    assert all(plan.parent[k] < 0 or plan.parent[k] in kept for k in kept)


def test_the_kept_size_grows_as_verification_gets_cheaper():
    cands = wide(0.6, 4, 6)
    sizes = []
    for slope in (1.0, 0.3, 0.1, 0.02):
        c = CostModel(SIZES, [0.1 * (1 + slope * (n - 1)) for n in SIZES], draft_level=0.001)
        sizes.append(Controller(c, True)._choose(5, cands, [], 63, 6).kept.size)
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_a_confident_copy_is_kept_and_merges_with_the_drafter():
    ctl = Controller(CostModel(SIZES, [0.1 * (1 + 0.2 * (n - 1)) for n in SIZES]), True)
    cands = chain(0.9, 3)  # tokens 10, 11, 12
    copy = np.array([10, 11, 40, 41], dtype=np.int32)  # shares the drafter's first two nodes
    plan = ctl._choose(5, cands, [(-1, copy, 3, False)], 63, 3)
    assert plan.drafted == 5  # 3 drafted + 2 copied nodes the drafter did not have
    assert plan.from_lookup[:2].all() and not plan.from_lookup[2]
    assert (plan.draft_bucket[3:] < 0).all() and (plan.lookup_bucket[:2] >= 0).all()


def drive(ctl, expected, seconds, steps):
    """Feed `steps` drafting steps that expect `expected` tokens in `seconds`; returns the kinds
    the controller chose for the steps in between."""
    kinds = []
    plan = ctl._choose(5, chain(0.5, 1), [], 63, 1)
    plan.expected = expected
    for _ in range(steps):
        kind = ctl.next_step([1, 2, 3, 4], True, 100)
        kinds.append(kind)
        if kind == "draft":
            ctl.observe("draft", plan, np.zeros(0, dtype=np.int64), 2, seconds / 2, seconds / 2)
    return kinds


def test_parks_when_drafting_does_not_pay_and_backs_off():
    """Drafting at 0.4x plain decoding's speed parks at once; each failed probe doubles the back-off."""
    ctl = Controller(timed(cpu_costs()), has_drafter=True)
    kinds = drive(ctl, expected=1.0, seconds=0.25, steps=40)
    first = kinds.index("plain")
    assert kinds[:first] == ["draft"] and kinds[first:first + PARK_FIRST] == ["plain"] * PARK_FIRST
    assert kinds[first + PARK_FIRST] == "draft"  # the probe
    probes = [i for i, k in enumerate(kinds) if k == "draft"]
    gaps = np.diff(probes) - 1
    assert list(gaps[:3]) == [PARK_FIRST, 2 * PARK_FIRST, 4 * PARK_FIRST]  # the back-off doubles
    assert ctl.backoff <= PARK_MAX


def test_a_small_loss_parks_after_a_probe_of_several_steps():
    """Drafting at 0.9x plain decoding's speed runs PROBE_STEPS steps before it is judged (one
    unlucky step parked probes that paid), then parks, and probes again the same way."""
    ctl = Controller(timed(cpu_costs()), has_drafter=True)
    kinds = drive(ctl, expected=1.8, seconds=0.2, steps=80)  # a plain step 0.1 s
    first = kinds.index("plain")
    assert kinds[:first] == ["draft"] * PROBE_STEPS and kinds[first:first + PARK_FIRST] == ["plain"] * PARK_FIRST
    probe = first + PARK_FIRST
    assert kinds[probe:probe + PROBE_STEPS + 1] == ["draft"] * PROBE_STEPS + ["plain"]
    runs = [len(list(g)) for k, g in itertools.groupby(kinds) if k == "plain"]
    assert runs[:3] == [PARK_FIRST, 2 * PARK_FIRST, 4 * PARK_FIRST]


def test_a_probe_is_judged_on_its_steps_together():
    """One slow step among paying ones does not park: the probe's steps are averaged."""
    ctl = Controller(CostModel(SIZES, [0.1 * (1 + 0.1 * (n - 1)) for n in SIZES], draft_level=0.002, plain=0.1),
                     has_drafter=True)
    plan = ctl._choose(5, chain(0.5, 1), [], 63, 1)
    for seconds in (0.14, 0.12, 0.12, 0.12):  # the first step is slow: 1.2 tokens in 0.14 s, a plain step 0.1 s
        plan.expected = 3.0 if seconds < 0.14 else 1.2
        assert ctl.next_step([1, 2, 3, 4], True, 100) == "draft"
        ctl.observe("draft", plan, np.zeros(0, dtype=np.int64), 2, seconds - 0.11, 0.11)  # verified as calibrated
    assert ctl.parked == 0 and ctl.gain > 1.0


def test_recovers_after_parking_when_drafting_pays_again():
    ctl = Controller(timed(flat_costs()), has_drafter=True)
    drive(ctl, expected=1.0, seconds=0.3, steps=30)  # parked, backed off
    assert ctl.parked > 0 and ctl.backoff > PARK_FIRST
    kinds = drive(ctl, expected=3.0, seconds=0.12, steps=200)
    assert kinds[-50:] == ["draft"] * 50  # drafting again, for good
    assert ctl.backoff == PARK_FIRST and ctl.gain > 1


def test_where_drafting_cannot_pay_at_its_best_no_probe_runs():
    """Verification costing k times one token: even nodes accepted at 90% cannot repay verifying
    and drafting them, so the controller never drafts (a probe would cost ~10% of a first short
    reply); where verification is cheaper it drafts at once."""
    ctl = Controller(linear_costs(), has_drafter=True)
    assert not ctl._drafting_can_pay()
    assert {ctl.next_step([1, 2, 3, 4, 5], True, 100) for _ in range(1000)} == {"plain"}
    for costs in (cpu_costs(), flat_costs(), CostModel(SIZES, [0.1 * n ** 0.8 for n in SIZES], draft_level=0.002)):
        ctl = Controller(costs, has_drafter=True)
        assert ctl._drafting_can_pay() and ctl.next_step([1, 2, 3, 4, 5], True, 100) == "draft"
    # Only a due probe asks: drafting that measurably pays runs on whatever the curve says meanwhile.
    ctl = Controller(timed(cpu_costs()), has_drafter=True)
    assert drive(ctl, expected=3.0, seconds=0.12, steps=10) == ["draft"] * 10
    ctl._drafting_can_pay = lambda: False
    assert drive(ctl, expected=3.0, seconds=0.12, steps=10) == ["draft"] * 10


def test_without_a_drafter_only_the_copy_is_verified_and_only_where_it_pays():
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]  # the copy would continue 4, 5, 6, ...
    assert Controller(flat_costs(), has_drafter=False).next_step(ids, True, 100) == "lookup"
    assert Controller(linear_costs(), has_drafter=False).next_step(ids, True, 100) == "plain"
    assert Controller(flat_costs(), has_drafter=False).next_step([1, 2, 3, 4, 5], True, 100) == "plain"


def test_a_speculative_steps_host_work_counts_against_it():
    """The host's own work around a speculative step (deciding it, mapping the accepted path back,
    learning from it) is charged to such steps: a copy that beats a plain step on its verification
    alone does not once a step's bookkeeping costs as much as a plain step (a fast machine, where a
    plain step takes a few ms, a small model on a GPU). A fixed profile (replays) never counts it."""
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]  # the copy would continue 4, 5, 6, ...
    curve = [0.003 * r for r in (1, 1.0, 1.0, 1.2, 1.5, 2.2, 3.2)]
    ctl = Controller(CostModel(SIZES, curve, plain=0.003), has_drafter=False)
    assert ctl.next_step(ids, True, 100) == "lookup"
    ctl.observe_overhead(0.003)
    assert ctl.costs.overhead == pytest.approx(0.003) and ctl.costs.summary()["overhead_ms"] == pytest.approx(3.0)
    assert ctl.next_step(ids, True, 100) == "plain"
    fixed = Controller(FixedCosts(SIZES, curve), has_drafter=False)
    fixed.observe_overhead(0.003)
    assert fixed.costs.overhead == 0.0 and fixed.next_step(ids, True, 100) == "lookup"


def test_the_host_work_of_a_step_is_averaged_and_a_stall_does_not_dominate_it():
    costs = CostModel(SIZES, [0.01 * n for n in SIZES], plain=0.01)
    costs.observe_overhead(0.001)
    assert costs.overhead == pytest.approx(0.001)  # the first reading as it is
    costs.observe_overhead(5.0)  # a collector's pause: clipped to a plain step
    assert costs.overhead == pytest.approx(0.001 + 0.1 * (0.01 - 0.001))


def test_decoding_charges_speculative_steps_their_host_work():
    m = with_costs(tiny_loaded(), CostModel(SIZES, [0.1 * (1 + 0.3 * (n - 1) / 63) for n in SIZES],
                                            draft_level=0.001))
    ar = generate(m, PROMPT, mode="ar", max_tokens=60)
    auto = generate(m, PROMPT, mode="auto", max_tokens=60)
    assert auto.tokens == ar.tokens and auto.stats.accepted_tokens > 0
    assert 0.0 < m.controllers[controller_key(m)].costs.overhead


def test_the_quick_forms_of_buckets_and_the_curve_give_the_same_figures():
    """Per-step shortcuts (lists instead of small numpy arrays, tabulated figures) change no number."""
    from redrafter_mlx.control import Acceptance

    for n, run in itertools.product((0, 2, 3, 5), (False, True)):
        assert Acceptance.lookup_buckets(n, 3, 14, run) == Acceptance.lookup_bucket(n, np.arange(3, 15), run).tolist()
    a = CostModel(SIZES, [0.003 * r for r in (1, 1.14, 1.61, 2.02, 2.47, 3.66, 6.3)], plain=0.003)
    for n in (1, 2, 3, 5, 8, 63, 64, 65, 200, 256, 300):
        assert a._base[n - 1] == a.base(n) if n <= costs.TABLE else True
        assert min(max(n, 1).bit_length() - 1, 7) == int(CostModel._bucket(n))
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 300, 200).tolist():
        a.observe_verify(n, a.verify(n) * float(rng.lognormal(0, 0.3)))
    table = a.verify_curve(costs.TABLE)
    assert np.array_equal(table, a._corrected(np.arange(1, costs.TABLE + 1)))


def test_copies_are_scored_in_hindsight_position_by_position():
    ctl = Controller(flat_costs(), has_drafter=False)
    ids = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    ctl._watch(ids, np.array([3, 4, 5, 6], dtype=np.int32), 2)  # what followed "1 2" before
    ctl._watch(ids, np.array([3, 4], dtype=np.int32), 2)  # the same position again: ignored
    ctl._learn(ids + [3, 4])  # two positions known so far, both hits: still watched
    look = ctl.acceptance
    assert look.look_n.sum() == pytest.approx(2) and look.look_a.sum() == pytest.approx(2)
    assert len(ctl._copies) == 1
    ctl._learn(ids + [3, 4, 9, 6])  # position 3 missed: scored, and the copy is done
    assert look.look_n.sum() == pytest.approx(3) and look.look_a.sum() == pytest.approx(2)
    third = look.lookup_bucket(2, np.array([3]))[0]
    assert look.look_n.reshape(-1)[third] == pytest.approx(1) and look.look_a.reshape(-1)[third] == 0
    assert ctl._copies == []
    ctl._watch(ids, np.array([3], dtype=np.int32), 2)
    ctl._learn([8, 8])  # a new reply: the watched copy no longer applies
    assert ctl._copies == [] and look.look_n.sum() == pytest.approx(3)


def test_a_copy_continuing_a_run_is_learned_apart():
    """Once the reply has followed a watched copy for 2+ tokens, the next copy is 'in a run' and
    its positions learn (and are scored) in their own buckets."""
    ctl = Controller(flat_costs(), has_drafter=False)
    ids = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert not ctl._in_run(ids)
    ctl._watch(ids, np.array([3, 4, 5, 6], dtype=np.int32), 2)
    ctl._learn(ids + [3, 4])  # the copy held for two tokens, up to now
    assert ctl._in_run(ids + [3, 4]) and not ctl._in_run(ids + [3, 4, 5])
    ctl._watch(ids + [3, 4], np.array([5, 6], dtype=np.int32), 3, ctl._in_run(ids + [3, 4]))
    ctl._learn(ids + [3, 4, 5, 9])
    look = ctl.acceptance
    in_run = look.lookup_bucket(3, np.array([1, 2]), run=True)
    assert look.look_n.reshape(-1)[in_run].tolist() == pytest.approx([1, 1])
    assert look.look_a.reshape(-1)[in_run].tolist() == pytest.approx([1, 0])
    assert not set(in_run.tolist()) & set(look.lookup_bucket(3, np.arange(1, 64)).tolist())
    ctl._learn([7, 7])  # an unrelated context: no run
    assert not ctl._in_run([7, 7])


def test_a_copy_that_keeps_holding_is_verified_ever_deeper():
    """A reply repeating its context: positions of the copy never verified are still learned,
    so the controller moves from one or two copied tokens a step to long copies."""
    costs = cpu_costs()
    ctl = Controller(costs, has_drafter=False)
    text = list(range(100, 400))
    ids, kept = text[:150] + text[:2], []
    while len(ids) < 300:
        kind = ctl.next_step(ids, True, 1000)
        if kind == "plain":
            ids.append(text[len(ids) - 150])
            continue
        plan = ctl.plan("lookup", None, None, None, ids[-1], ids, 1000)
        on_path = np.sort(plan.kept)  # the copy is a chain, and every copied token holds
        ctl.observe("lookup", plan, on_path, 1 + plan.kept.size, 0.0, costs.verify(1 + plan.kept.size))
        kept.append(plan.kept.size)
        ids += text[len(ids) - 150 : len(ids) - 150 + plan.kept.size + 1]
    assert max(kept) >= 16 and kept[-1] >= 16


def test_a_long_copy_is_verified_in_stages():
    """A copy whose tokens hold 95% of the time, given the previous one: this step verifies it
    up to the length at which the copy alone runs fastest (about 20 tokens on the 2-core CPU's
    curve), not all 63 that the rate alone would pay for: the rest is verified next step where
    the copy holds, and a miss early in the copy does not waste a 64-token verification."""
    ctl = Controller(cpu_costs(), has_drafter=False)
    acc = ctl.acceptance
    buckets = np.concatenate([acc.lookup_bucket(n, np.arange(1, 64)) for n in (2, 3)])
    acc.update((), (), np.repeat(buckets, 40), np.tile(np.arange(40) % 20 != 0, buckets.size))
    text = list(range(100, 400))
    ids = text[:150] + text[:3]
    plan = ctl.plan("lookup", None, None, None, ids[-1], ids, 1000)
    copied = plan.kept.size
    p = np.cumprod(acc.lookup_p(acc.lookup_bucket(3, np.arange(1, 64))))
    fastest = int(np.argmax((1 + np.cumsum(p)) / ctl.costs.verify_curve(64)[1:])) + 1
    assert 8 <= copied == fastest <= 28
    rate_alone = int(np.argmax(np.concatenate([[0.0], np.cumsum(p)]) - ctl.rate() * ctl.costs.verify_curve(64)))
    assert rate_alone > 40  # what the rate rule alone kept


def drafting(ctl, seconds, mass, steps=10):
    """`steps` drafting steps that took `seconds` to draft and kept drafter nodes worth `mass`
    expected tokens (two nodes); the last one's plan is returned. The fake machine's drafter
    takes seconds / 2 a level (a fixed cost profile judges steps by its own figures)."""
    cands = chain(0.5, 2)
    ctl.costs.draft_level = seconds / 2
    for _ in range(steps):
        plan = ctl._choose(5, cands, [], 63, 2)
        plan.forwards = 2
        plan.path_p[:] = mass / 2
        plan.kept = np.arange(2)
        plan.expected = 1.0 + mass
        ctl.observe("draft", plan, np.zeros(0, dtype=np.int64), 3, seconds, ctl.costs.verify(3))
    return plan


def test_a_copy_carrying_the_reply_skips_the_drafter():
    """While drafting, a step whose context copy alone is expected to beat drafting with it (the
    head's time, its usual gain only where the copy's first token fails) verifies the copy alone;
    elsewhere the drafter runs as before."""
    text = list(range(100, 300))
    repeat = text[:120] + text[:3]  # the copy continues text[3:]
    ctl = Controller(cpu_costs(), has_drafter=True)
    assert ctl.next_step(repeat, True, 1000) == "draft"  # nothing drafted yet: no figures to weigh
    drafting(ctl, seconds=0.04, mass=0.8)
    assert ctl.draft_seconds == pytest.approx(0.04) and ctl.draft_mass == pytest.approx(0.8)
    acc = ctl.acceptance
    held = acc.lookup_bucket(3, np.arange(1, 64))
    acc.update((), (), np.repeat(held, 40), np.ones(40 * held.size, dtype=bool))  # copies have held
    assert ctl.next_step(repeat, True, 1000) == "lookup"
    assert ctl.next_step(text[:120], True, 1000) == "draft"  # no copy here
    # A copy that rarely holds does not replace a head that pays.
    doubtful = Controller(cpu_costs(), has_drafter=True)
    drafting(doubtful, seconds=0.004, mass=1.5)
    doubtful.acceptance.update((), (), np.repeat(held, 40), np.tile(np.arange(40) % 4 == 0, held.size))
    assert doubtful.next_step(repeat, True, 1000) == "draft"


def test_a_copy_carrying_the_reply_is_lossless_through_copy_only_steps(monkeypatch):
    m = with_costs(tiny_loaded(), cpu_costs())
    prompt = PROMPT + PROMPT
    ar = generate(m, prompt, mode="ar", max_tokens=200)
    kinds, next_step = [], Controller.next_step
    monkeypatch.setattr(Controller, "next_step", lambda self, *a, **k: kinds.append(next_step(self, *a, **k)) or kinds[-1])
    auto = generate(m, prompt, mode="auto", max_tokens=200)
    assert auto.tokens == ar.tokens
    # the premise: steps that verified the copy alone, between drafted ones (it was not checked, so a controller that
    # never chose one passed)
    assert kinds.count("lookup") >= 3 and "draft" in kinds, kinds


def test_acceptance_model_learns_from_outcomes():
    ctl = Controller(flat_costs(), True)
    acc = ctl.acceptance
    bucket = acc.draft_bucket(np.array([0.15]), np.array([1]))
    before = acc.draft_p(bucket)[0]
    acc.update(np.repeat(bucket, 200), np.ones(200, dtype=bool), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
    assert before == pytest.approx(0.15) and acc.draft_p(bucket)[0] > 0.95


# ---- losslessness through the controller's trees ----------------------------------------------

def with_costs(m, c):
    """`m` with a controller on cost model `c` (instead of measuring this machine)."""
    m.controllers[controller_key(m)] = Controller(c, m.drafter is not None)
    return m


@pytest.mark.parametrize("curve", ["flat", "linear", "measured"])
def test_adaptive_greedy_equals_plain_tiny(curve):
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=200)
    if curve != "measured":
        with_costs(m, flat_costs() if curve == "flat" else linear_costs())
    auto = generate(m, PROMPT, mode="auto", max_tokens=200)
    assert auto.tokens == ar.tokens and auto.finish_reason == "length"
    assert auto.stats.mode == "auto" and auto.stats.adaptive
    if curve == "flat":
        assert auto.stats.accepted_tokens > 0 and auto.stats.steps < ar.stats.steps
    if curve == "linear":
        assert auto.stats.parked_steps > 0


def test_every_transition_between_plain_copy_and_drafted_steps_is_lossless(monkeypatch):
    """Force the controller through every order of plain (pipelined), copy-only and drafted steps."""
    m = with_costs(tiny_loaded(), flat_costs())
    ar = generate(m, PROMPT, mode="ar", max_tokens=150)
    pattern = itertools.cycle(["plain", "plain", "draft", "lookup", "plain", "draft", "draft", "lookup", "lookup",
                               "plain", "lookup", "draft", "plain"])
    monkeypatch.setattr(Controller, "next_step", lambda self, ids, root_known, room: next(pattern))
    auto = generate(m, PROMPT, mode="auto", max_tokens=150)
    assert auto.tokens == ar.tokens
    assert auto.stats.parked_steps > 0 and auto.stats.accepted_tokens > 0


def test_only_a_plain_step_that_queued_its_successor_times_plain_decoding(monkeypatch):
    """The last plain step of a parked run (the next one drafts, nothing is queued) reads back a
    forward that ran during the step before, in a fraction of a step's time: timing it held the
    plain estimate 10-20% low on the 2-core CPU and parked drafting that paid."""
    m = with_costs(tiny_loaded(), flat_costs())
    pattern = itertools.cycle(["plain", "plain", "plain", "draft", "plain", "plain", "lookup", "plain", "draft"])
    events = []

    def next_step(self, ids, root_known, room):
        kind = next(pattern)
        events.append(("next", root_known, kind))
        return kind

    monkeypatch.setattr(Controller, "next_step", next_step)
    monkeypatch.setattr(Controller, "observe_plain", lambda self, seconds: events.append(("timed",)))
    generate(m, PROMPT, mode="auto", max_tokens=120)
    timed_at = [i for i, e in enumerate(events) if e[0] == "timed"]
    assert timed_at and len(timed_at) < sum(e[2] == "plain" for e in events if e[0] == "next")
    assert all(events[i - 1] == ("next", False, "plain") for i in timed_at)


@pytest.mark.parametrize("use_drafter", [True, False])
@pytest.mark.parametrize("curve", ["flat", "cpu", "linear"])
def test_replay_of_the_controller_takes_the_steps_decoding_takes(use_drafter, curve):
    """replay.replay_auto makes generate.stream's adaptive decisions (pipelined plain steps
    decide before their root is known) on a fixed cost model: the same steps, packed tokens and
    parked steps as real decoding on that model, for outputs ending at max_tokens and at eos."""
    from redrafter_mlx.replay import replay_auto

    def costs_():
        if curve == "flat":
            return flat_costs()
        if curve == "linear":  # parks, probes and backs off
            return FixedCosts(SIZES, [10.0 * n for n in SIZES], draft_level=1e-6)
        # a fast-BLAS CPU's curve; seconds long enough that the tiny drafter's real time (which
        # decoding measures and the replay models as draft_level per level) moves no decision
        return FixedCosts(SIZES, [10 * r for r in (1, 1.1, 1.6, 2.0, 2.5, 3.7, 6.3)], draft_level=1e-6)

    m = tiny_loaded()
    eos = generate(m, PROMPT, mode="ar", max_tokens=150).tokens[90]
    for tokenizer in (m.tokenizer, CharTokenizer(eos=[eos])):
        m.tokenizer = tokenizer
        ar = generate(m, PROMPT, mode="ar", max_tokens=150)
        m.controllers.clear()
        key = controller_key(m, use_drafter)
        m.controllers[key] = Controller(costs_(), use_drafter)
        rd = generate(m, PROMPT, mode="auto", max_tokens=150, use_drafter=use_drafter)
        assert rd.tokens == ar.tokens
        out = replay_auto(m, Controller(costs_(), use_drafter), ar.prompt_tokens, ar.tokens,
                          ended=ar.finish_reason == "eos")
        assert out["steps"] == rd.stats.steps and out["packed"] == rd.stats.packed_tokens + rd.stats.parked_steps
        assert out["parked"] == rd.stats.parked_steps and out["produced"] == rd.stats.step_tokens + rd.stats.end_tokens
        # decoding's last step may accept copied tokens past max_tokens, which the replay cannot see: neither
        # counts them (looked_up counts output tokens, by position)
        assert out["looked_up"] == rd.stats.looked_up_tokens


def test_looked_up_is_cut_where_the_output_is():
    """A step that max_tokens cuts counts the copied tokens among those it output: looked_up was clipped
    as a count (min(looked_up, emitted)), so a step whose path ran drafter, drafter, copy, copy, copy
    and was cut to 3 tokens counted 3 copied ones, not 1. The replay, which sees the output only, counts
    by position; the two agree on every cut."""
    from redrafter_mlx.replay import replay_auto

    m = tiny_loaded()
    full = generate(m, PROMPT, mode="ar", max_tokens=45).tokens
    for cut in range(5, 45, 3):
        m.controllers.clear()
        m.controllers[controller_key(m)] = Controller(flat_costs(), True)
        rd = generate(m, PROMPT, mode="auto", max_tokens=cut)
        assert rd.tokens == full[:cut]
        out = replay_auto(m, Controller(flat_costs(), True), rd.prompt_tokens, rd.tokens)
        assert out["steps"] == rd.stats.steps
        assert out["looked_up"] == rd.stats.looked_up_tokens, cut


def test_adaptive_stops_at_eos_and_the_context_limit():
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=120)
    eos = ar.tokens[60]
    cut = ar.tokens.index(eos)
    m.tokenizer = CharTokenizer(eos=[eos])
    for c in (flat_costs(), linear_costs()):
        auto = generate(with_costs(m, c), PROMPT, mode="auto", max_tokens=120)
        assert auto.tokens == ar.tokens[:cut] and auto.finish_reason == "eos"
    small = tiny_loaded(context=len(PROMPT) + 40)
    ar = generate(small, PROMPT, mode="ar", max_tokens=500)
    for c in (flat_costs(), linear_costs()):
        auto = generate(with_costs(small, c), PROMPT, mode="auto", max_tokens=500)
        assert auto.tokens == ar.tokens and auto.finish_reason == "context"


@pytest.mark.parametrize("use_drafter", [True, False])
def test_nothing_is_drafted_past_max_tokens(use_drafter):
    # A step outputs at most what max_tokens leaves: drafts past it were verified for nothing
    # (with max_tokens=2 the one decode step drafted and verified 4 tokens to output 1).
    for max_tokens in (2, 3, 9, 40):
        m = tiny_loaded()
        ar = generate(m, PROMPT, mode="ar", max_tokens=max_tokens)
        if not use_drafter:
            m.drafter = None
        auto = generate(with_costs(m, flat_costs()), PROMPT, mode="auto", max_tokens=max_tokens)
        assert auto.tokens == ar.tokens
        out = 1  # the prefill's token
        for step in auto.step_stats:
            assert step.packed <= max_tokens - out, (max_tokens, out, step)  # the root and what it could output
            out += step.emitted
        if max_tokens == 2:
            assert auto.stats.drafted_tokens == 0 and auto.stats.parked_steps == 1


def test_auto_without_a_drafter_drafts_from_the_context():
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=200)
    m.drafter = None
    auto = generate(with_costs(m, flat_costs()), PROMPT, mode="auto", max_tokens=200)
    assert auto.tokens == ar.tokens and auto.stats.mode == "auto"
    assert auto.stats.looked_up_tokens > 0 and auto.stats.parked_steps > 0  # a tiny model loops: copies pay


def test_use_drafter_false_keeps_the_drafter_out():
    m = with_costs(tiny_loaded(), flat_costs())
    m.controllers[controller_key(m, False)] = Controller(flat_costs(), False)
    ar = generate(m, PROMPT, mode="ar", max_tokens=100)
    auto = generate(m, PROMPT, mode="auto", max_tokens=100, use_drafter=False)
    assert auto.tokens == ar.tokens
    assert auto.stats.accepted_tokens == auto.stats.looked_up_tokens  # every accepted token was copied


def test_adaptive_sampling_matches_base_distribution():
    m = tiny_loaded(vocab=4, seed=3)
    with_costs(m, flat_costs())
    probs = exact_distribution(m, SAMPLING_PROMPT, 3, 1.0, 1.0)
    counts = sampled_counts(m, SAMPLING_PROMPT, 3, 1500, mode="auto", temperature=1.0)
    assert chi_square_p(counts, probs) > 1e-3


def test_a_seed_gives_the_same_sampled_reply_in_every_mode_and_tree():
    """A draw depends only on the seed and its position (sampling.py), and verification keeps the
    base model's own draw: every mode, fixed beams, trees, graphs and the adaptive controller (whose
    trees change from run to run) give plain decoding's reply for a seed. With a key chain the number
    of draws a tree made moved every later one, so adaptive replies changed between runs of one seed."""
    m = with_costs(tiny_loaded(), flat_costs())
    accepted = 0
    for seed in range(8):
        kw = dict(max_tokens=24, temperature=1.0, top_p=0.9, seed=seed)
        ar = generate(m, PROMPT, mode="ar", **kw).tokens
        assert generate(m, PROMPT, mode="ar", **{**kw, "seed": seed + 100}).tokens != ar  # seeds do differ
        for extra in (dict(mode="auto"), dict(mode="auto"), dict(mode="redrafter", beam_width=3, beam_length=4),
                      dict(mode="redrafter", tree=8, lookup=4), dict(mode="redrafter", tree=8, graph=1),
                      dict(mode="auto", use_drafter=False)):
            g = generate(m, PROMPT, **kw, **extra)
            assert g.tokens == ar, (seed, extra)
            accepted += g.stats.accepted_tokens
    assert accepted > 50  # drafts were accepted: the replies did go through trees


def test_an_unseeded_sampled_reply_says_its_seed_which_gives_it_again():
    """Without a seed a sampled reply drew a fresh one that nothing exposed, so a reply worth keeping could
    not be had again. stats.seed says it (to_dict() too); passed back, it gives the reply again in every mode."""
    import json

    m = with_costs(tiny_loaded(), flat_costs())
    kw = dict(max_tokens=24, temperature=1.0, top_p=0.9)
    first = generate(m, PROMPT, mode="auto", **kw)
    seed = first.stats.seed
    assert isinstance(seed, int) and 0 <= seed < 2**64
    assert json.loads(json.dumps(first.stats.to_dict()))["seed"] == seed
    for extra in (dict(mode="auto"), dict(mode="ar"), dict(mode="redrafter", beam_width=3, beam_length=4)):
        again = generate(m, PROMPT, seed=seed, **kw, **extra)
        assert (again.tokens, again.stats.seed) == (first.tokens, seed), extra
    assert generate(m, PROMPT, mode="ar", seed=5, **kw).stats.seed == 5
    assert generate(m, PROMPT, max_tokens=4, seed=5).stats.seed is None  # greedy: no draw, no seed


SAMPLED_MODES = (dict(mode="auto"), dict(mode="auto", graph=0), dict(mode="auto", use_drafter=False),
                 dict(mode="redrafter", beam_width=4, beam_length=4, lookup=4),
                 dict(mode="redrafter", beam_width=2, beam_length=6, draft_top_k=2, lookup=0),
                 dict(mode="redrafter", tree=16, graph=2, context_graph=False, tree_min_prob=0.001))


def test_a_seed_gives_plain_decodings_reply_through_cuts_end_tokens_and_turns():
    """The seed's promise where a step's accepted drafts are cut: by max_tokens or an end token
    mid-step (the cache then holds drafts past the reply), and in the next turns of a PromptCache;
    with seed 2**64 - 1 and a top_p that leaves few tokens."""
    m = with_costs(tiny_loaded(), flat_costs())
    kw = dict(temperature=0.8, top_p=0.7, seed=2**64 - 1)
    full = generate(m, PROMPT, mode="ar", max_tokens=40, **kw).tokens
    m.tokenizer = CharTokenizer(eos=[full[20]])
    for max_tokens in (2, 7, 40):
        ar = generate(m, PROMPT, mode="ar", max_tokens=max_tokens, **kw)
        for extra in SAMPLED_MODES:
            g = generate(m, PROMPT, max_tokens=max_tokens, **kw, **extra)
            assert (g.tokens, g.finish_reason) == (ar.tokens, ar.finish_reason), (max_tokens, extra)
    assert ar.finish_reason == "eos"
    m.tokenizer = CharTokenizer()
    accepted = 0
    for extra in SAMPLED_MODES:
        pc, prompt = PromptCache(m.model), list(PROMPT)
        for turn in range(3):
            g = generate(m, prompt, max_tokens=9, prompt_cache=pc, **kw, **extra)
            assert g.tokens == generate(m, prompt, mode="ar", max_tokens=9, **kw).tokens, (turn, extra)
            accepted += g.stats.accepted_tokens
            prompt = prompt + g.tokens[: 4 + turn] + [turn + 1]  # the reply, cut short, and a new turn
    assert accepted > 20  # drafts were accepted: the replies went through trees


def test_drafts_outside_the_nucleus_never_change_a_seeds_reply():
    """A drafter that proposes the base model's least likely tokens (all outside a top_p of 0.5):
    verification draws from the nucleus alone, so the replies are still plain decoding's."""
    m = with_costs(tiny_loaded(), flat_costs())
    own = type(m.drafter).draft_logits

    class Contrary(type(m.drafter)):
        def draft_logits(self, h, state, base=None):
            return -own(self, h, state, base)

    m.drafter.__class__ = Contrary
    for seed in (0, 1):
        kw = dict(max_tokens=20, temperature=1.5, top_p=0.5, seed=seed)
        ar = generate(m, PROMPT, mode="ar", **kw).tokens
        for extra in SAMPLED_MODES:
            assert generate(m, PROMPT, **kw, **extra).tokens == ar, (seed, extra)


def test_a_seed_gives_one_reply_in_every_mode_with_the_smallest_vocabularies():
    """One and two tokens: trees wider than the vocabulary, every draft an alias."""
    for vocab in (1, 2):
        m = with_costs(tiny_loaded(vocab=vocab), flat_costs())
        prompt = [t % vocab for t in PROMPT]
        kw = dict(max_tokens=16, temperature=1.0, seed=5)
        ar = generate(m, prompt, mode="ar", **kw).tokens
        assert len(ar) == 16 and set(ar) <= set(range(vocab))
        for extra in SAMPLED_MODES:
            assert generate(m, prompt, **kw, **extra).tokens == ar, (vocab, extra)


def test_unseeded_replies_differ_and_stay_in_the_nucleus_in_every_mode():
    """seed=None draws a fresh seed per reply (sampling.Sampler): replies differ from call to call,
    and every token of every mode's reply is one the base model's nucleus holds after its prefix."""
    from redrafter_mlx.sampling import Sampler

    m = with_costs(tiny_loaded(vocab=20, seed=4), flat_costs())
    nucleus = Sampler(1.0, 0.6)
    for extra in (dict(mode="ar"),) + SAMPLED_MODES:
        replies = [generate(m, PROMPT, max_tokens=12, temperature=1.0, top_p=0.6, **extra).tokens for _ in range(3)]
        assert len({tuple(r) for r in replies}) > 1, extra
        for reply in replies:
            logits, _ = m.model(mx.array([PROMPT + reply[:-1]]))
            lp = np.array(nucleus.logprobs(logits[0, len(PROMPT) - 1:]))  # (12, V): row i predicts reply[i]
            assert np.isfinite(lp[np.arange(len(reply)), reply]).all(), (extra, reply)


# ---- the cost model and its cache -------------------------------------------------------------

def test_cost_model_interpolates_extrapolates_and_refines():
    c = CostModel([1, 2, 4, 8], [0.1, 0.12, 0.16, 0.24])
    assert c.verify(3) == pytest.approx(0.14) and c.verify(16) == pytest.approx(0.40)
    assert c.ratio(8) == pytest.approx(2.4)
    for _ in range(100):
        c.observe_verify(4, 0.32)  # this size now costs twice the calibration
    # Buckets never observed take the nearest observed one's correction.
    assert c.verify(4) == pytest.approx(0.32, rel=0.01) and c.verify(1) == pytest.approx(0.2, rel=0.01)
    c.observe_verify(4, 30.0)  # a stall is not the curve
    assert c.verify(4) == pytest.approx(0.32, rel=0.01)
    for _ in range(100):
        c.observe_verify(1, 0.1)  # one token as calibrated: the correction goes from 1x at n = 1 to 2x at n = 5.7
    assert c.verify(1) == pytest.approx(0.1, rel=0.01) and c.verify(4) < 0.32  # the load has gone
    curve = c.verify_curve(64)
    assert np.all(np.diff(curve) >= 0) and c.verify(8) < 0.48


def test_cost_model_never_extrapolates_flat():
    # A calibration cut short under load: 4 tokens timed no slower than 2 (kept monotone, so flat).
    c = CostModel([1, 2, 4], [0.117, 0.218, 0.2])
    assert c.verify(4) == pytest.approx(0.218)
    slope = (0.218 - 0.117) / 3  # from one token to the last point: larger trees cost more
    assert c.verify(8) == pytest.approx(0.218 + 4 * slope) and c.verify(64) == pytest.approx(0.218 + 60 * slope)
    # A convex curve extrapolates on its last, steeper slope, as before.
    c = CostModel([1, 2, 4, 8], [0.1, 0.12, 0.16, 0.24])
    assert c.verify(16) == pytest.approx(0.40)


def test_corrections_never_make_more_tokens_cheaper():
    """Corrections applied bucket by bucket as steps made 16 tokens cost less than 15 (a bucket
    corrected by 1.3 beside one at 0.96), and the controller packed nodes that did not pay."""
    c = CostModel([1, 2, 4, 8, 16, 32], [0.069, 0.075, 0.087, 0.094, 0.135, 0.189])
    for n, t in [(8, 0.121), (9, 0.125), (16, 0.13), (5, 0.095)] * 30:
        c.observe_verify(n, t)
    curve = c.verify_curve(64)
    assert np.all(np.diff(curve) >= 0)
    assert c.verify(15) <= c.verify(16) and 0.095 < c.verify(8) < 0.125  # between what 5 and 9 tokens took


@pytest.fixture
def quiet_machine(monkeypatch):
    """Forwards timed on a fake machine that no other process ever loads, for the tests whose subject is
    the cost cache, not the timing. A real calibration beside a burst of load can stop at 1 and 2 tokens
    and then find 2 tokens cheap in its later rounds: the curve is cut short, and the next cost_model
    measures it again, by design, so a test asserting "cached" failed under load. Each forward takes a
    little jitter (drawn from a seeded generator), so two calibrations never give the same curve and a
    curve read back is told from one measured again."""
    rng = np.random.default_rng(0)
    monkeypatch.setattr(costs, "_time_forward",
                        lambda model, cache, start, n, vocab: (0.01 + 0.001 * n) * (1 + 0.05 * rng.random()))


def test_calibration_measures_a_rising_curve(tiny_loaded):
    """A real calibration of a real (tiny) model: the first sizes of SIZES, in order, positive finite times,
    none above n plain forwards, and a plain step timed. (It asserted `diff(seconds) >= 0`, which CostModel
    makes true of any curve it is given: that part could not fail. Whether more tokens cost more is not
    asserted: under load the fastest of 3 one-token forwards can outlast the larger sizes' here.)"""
    c = costs.calibrate(tiny_loaded.model, budget=1.0)
    n = len(c.sizes)
    assert n >= 2 and c.sizes.astype(int).tolist() == list(costs.SIZES[:n])
    assert np.all(np.isfinite(c.seconds)) and c.seconds[0] > 0 and np.isfinite(c.plain) and c.plain > 0
    assert np.all(c.seconds <= c.sizes * c.seconds[0] * (1 + 1e-9))  # never more than n plain forwards


@pytest.mark.parametrize("machine, sizes", [
    ("slow", [1, 2, 4, 8]),  # 0.55 s a token: the budget ran out after 1 token, which alone is no curve
    ("burst", [1, 2, 4, 8]),  # ... and a burst of load in the rounds of 2 tokens
    ("linear", [1, 2, 4]),  # n tokens cost n times one: larger n tell nothing new
    ("spike", [1, 2, 4, 8]),  # one burst on the first timed sample of 2 tokens (20x one): it had stopped
])                            # there, and the fastest of the rounds made the curve "cut short"
def test_calibration_times_enough_sizes_whatever_the_budget(tiny_loaded, monkeypatch, machine, sizes):
    """A calibration whose budget a slow machine or a burst of load spent had stopped after 1 or 2
    tokens; on a 2-token curve timed 3.6x one, 16 tokens cost 40x one, and every later run on the
    cached curve decoded plainly (drafting could never pay, so nothing corrected it)."""
    calls = {}

    def timed(model, cache, start, n, vocab):
        calls[n] = calls.get(n, 0) + 1
        if machine == "linear":
            return 0.5 * n
        if machine == "spike" and n == 2 and calls[n] == 2:  # (the first forward of a size is untimed)
            return 11.0
        return 2.0 if machine == "burst" and n == 2 else 0.5 + 0.05 * n

    monkeypatch.setattr(costs, "_time_forward", timed)
    c = costs.calibrate(tiny_loaded.model)
    assert c.sizes.astype(int).tolist() == sizes
    assert np.all(c.seconds <= c.sizes * c.seconds[0] + 1e-12)  # never more than n plain forwards
    assert not c.cut_short()
    if machine != "linear":
        assert c.ratio(16) < 3.5  # (the flat machine's 16 tokens cost 2.4x one)


def test_a_cached_curve_cut_short_is_measured_again_once(tiny_loaded, monkeypatch, quiet_machine):
    """A curve cached by the code before (sizes 1 and 2 only, 2 tokens 3.6x one under load) is
    measured again at the next load, and not again after that."""
    m = tiny_loaded
    costs.cost_model(m)
    data = json.loads((m.path / costs.FILE).read_text())
    data[costs.cache_key(m)].update(sizes=[1, 2], seconds=[0.05, 0.18])
    (m.path / costs.FILE).write_text(json.dumps(data))
    calls, said = [], []
    real = costs.calibrate
    monkeypatch.setattr(costs, "calibrate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    again = costs.cost_model(m, said.append)
    assert calls == [1] and again.healed and len(again.sizes) >= 3 and "stopped at 1 and 2 tokens" in said[0]
    assert costs.cost_model(m).source.startswith("cached") and calls == [1]
    data = json.loads((m.path / costs.FILE).read_text())
    data[costs.cache_key(m)].update(sizes=[1, 2], seconds=[0.05, 0.18])  # cut short again, after a heal: kept
    (m.path / costs.FILE).write_text(json.dumps(data))
    assert costs.cost_model(m).sizes.tolist() == [1, 2] and calls == [1]


def test_cost_cache_round_trip_and_invalidation(tiny_loaded, monkeypatch, quiet_machine):
    m = tiny_loaded
    calls = []
    real = costs.calibrate

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(costs, "calibrate", counting)
    first = costs.cost_model(m)
    assert len(calls) == 1 and (m.path / costs.FILE).is_file()
    again = costs.cost_model(m)
    assert len(calls) == 1 and again.source.startswith("cached")
    assert again.seconds.tolist() == first.seconds.tolist()
    # Another weight format, MLX version or device, or changed weights: measured again.
    m.weight_format = "float16"
    costs.cost_model(m)
    assert len(calls) == 2
    monkeypatch.setattr(mx, "__version__", "0.0.1")
    costs.cost_model(m)
    assert len(calls) == 3
    monkeypatch.setattr(costs, "device_description", lambda: "gpu (a new one)")
    costs.cost_model(m)
    assert len(calls) == 4
    weights = next(m.path.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes() + b"\0" * 16)
    costs.cost_model(m)
    assert len(calls) == 5
    assert len(json.loads((m.path / costs.FILE).read_text())) == 5  # each key kept


def test_a_curve_from_another_cpu_or_fewer_cores_is_not_used(tiny_loaded, monkeypatch, quiet_machine):
    # On a CPU the device read "cpu (x86_64, MKL)" alone: a model folder shared with another
    # machine, or a process under `taskset -c 0`, used the curve another CPU measured.
    import os

    m = tiny_loaded
    monkeypatch.setattr(costs, "on_cpu", lambda: True, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(costs, "cpu_name", lambda: "CPU one", raising=False)
    calls = []
    real = costs.calibrate
    monkeypatch.setattr(costs, "calibrate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    costs.cost_model(m)
    assert costs.cost_model(m).source.startswith("cached") and len(calls) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert costs.cost_model(m).source == "measured" and len(calls) == 2
    monkeypatch.setattr(costs, "cpu_name", lambda: "CPU two", raising=False)
    assert costs.cost_model(m).source == "measured" and len(calls) == 3
    monkeypatch.setattr(costs, "cpu_name", lambda: "CPU one", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert costs.cost_model(m).source.startswith("cached") and len(calls) == 3  # the first machine's, kept


def test_models_built_in_memory_do_not_share_a_curve(monkeypatch, tmp_path):
    # path "." has no weight files: every such model had the same key, and a 12-token tiny
    # model's curve was read back for a 5,000-token one
    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    # the cache key is under test, not the timing: a burst of load had made a curve cut short (measured again)
    monkeypatch.setattr(costs, "_time_forward", lambda model, cache, start, n, vocab: 0.01 + 0.001 * n)
    small, big, wide = tiny_loaded(vocab=12), tiny_loaded(vocab=5000), tiny_loaded(vocab=12)
    wide.model.config = {**small.model.config, "intermediate_size": 2048}  # a field ModelArgs does not hold
    assert costs.cost_model(small).source == "measured"
    assert costs.cost_model(big).source == "measured" and costs.cost_model(wide).source == "measured"
    assert costs.cost_model(tiny_loaded(vocab=12, seed=3)).source.startswith("cached")  # the same shapes


def test_where_no_cache_folder_can_be_written_the_one_line_says_so(tiny_loaded, monkeypatch, tmp_path):
    # a read-only model folder and an unwritable REDRAFTER_CACHE: the curve is measured every run, and
    # the status line had said "once per model and device" every run (chmod does not bind root: simulated)
    import os

    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path / "cache"))
    said = []
    costs.cost_model(tiny_loaded, said.append)
    assert len(said) == 1 and "once per model and device" in said[0]
    (tiny_loaded.path / costs.FILE).unlink()

    def refused(path, *a, **kw):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(costs, "update_json", refused)
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)
    for _ in range(2):
        said.clear()
        assert costs.cost_model(tiny_loaded, said.append).source == "measured"
        assert len(said) == 1 and "every run" in said[0] and "REDRAFTER_CACHE" in said[0], said


def test_the_calibration_line_speaks_of_gpu_kernels_on_a_gpu_only(tiny_loaded, monkeypatch):
    # the first run on a CPU said "a fresh machine compiles GPU kernels first, ... can take minutes"
    for cpu in (True, False):
        monkeypatch.setattr(costs, "on_cpu", lambda: cpu)
        said = []
        costs.cost_model(tiny_loaded, said.append, refresh=True)
        assert len(said) == 1 and ("GPU kernels" in said[0]) is not cpu, said


def test_a_new_drafter_times_its_levels_and_keeps_the_cached_curve(tiny_loaded, monkeypatch, quiet_machine):
    from redrafter_mlx.drafter import new_drafter

    m = tiny_loaded
    assert m.drafter is None
    first = costs.cost_model(m)  # measured without a drafter
    assert first.draft_level is None
    stamp = json.loads((m.path / costs.FILE).read_text())[costs.cache_key(m)]["measured_at"]
    monkeypatch.setattr(costs, "calibrate", lambda *a, **kw: pytest.fail("the curve was measured again"))
    timed = []
    real = costs.time_drafter
    monkeypatch.setattr(costs, "time_drafter", lambda *a, **kw: timed.append(1) or real(*a, **kw))
    for n in range(2):  # two drafters (another checkout's, one just trained): each timed once, the curve kept
        m.drafter = new_drafter(m.args)
        m.drafter_path = m.path / f"drafter{n}"
        c = costs.cost_model(m)
        assert len(timed) == n + 1 and c.draft_level is not None and c.draft_level > 0
        assert c.seconds.tolist() == first.seconds.tolist() and c.plain_measured == first.plain_measured
        again = costs.cost_model(m)
        assert len(timed) == n + 1 and again.draft_level == c.draft_level
    entry = json.loads((m.path / costs.FILE).read_text())[costs.cache_key(m)]
    assert entry["measured_at"] == stamp and len(entry["draft_level"]) == 2


def test_a_drafter_put_in_place_of_another_times_its_own_levels(tiny_loaded, monkeypatch, quiet_machine):
    """The cached seconds per drafter level were keyed by the drafter's path: a drafter redrafter-train or the
    converter put in MODEL/drafter (another width, depth or draft vocabulary: another cost) was costed with the
    figure timed for the one it replaced. The figure is keyed by the drafter's digest now."""
    from redrafter_mlx.drafter import load_drafter, new_drafter, save_drafter

    m = tiny_loaded
    home = m.path / "drafter"
    timed = []
    real = costs.time_drafter
    monkeypatch.setattr(costs, "time_drafter", lambda *a, **kw: timed.append(1) or real(*a, **kw))
    for seed in (1, 1, 2):  # the same drafter twice (timed once), then another one in its place
        save_drafter(new_drafter(m.args, lm_head="shared", seed=seed), home)
        m.drafter, m.drafter_path = load_drafter(home, m.model), home
        assert costs.cost_model(m).draft_level > 0
    assert len(timed) == 2
    assert len(json.loads((m.path / costs.FILE).read_text())[costs.cache_key(m)]["draft_level"]) == 2


def test_a_damaged_cost_cache_is_measured_again(tiny_loaded):
    (tiny_loaded.path / costs.FILE).write_text("{not json")
    said = []
    c = costs.cost_model(tiny_loaded, said.append)
    assert c.source == "measured"
    # (the damaged file, which may hold other models' curves, is kept beside the new one, and that is said)
    assert (tiny_loaded.path / (costs.FILE + ".damaged")).read_text() == "{not json"
    assert any(f"kept as {costs.FILE}.damaged beside it" in line for line in said)
    assert costs.read_cached(tiny_loaded) is not None
    # a zero time divided by zero at the first auto run
    path = tiny_loaded.path / costs.FILE
    data = json.loads(path.read_text())
    entry = data[costs.cache_key(tiny_loaded)]
    for damage in ({"plain": 0}, {"seconds": [0.0] * len(entry["seconds"])}, {"plain": float("nan")}):
        path.write_text(json.dumps({**data, costs.cache_key(tiny_loaded): {**entry, **damage}}))
        assert costs.read_cached(tiny_loaded) is None


@pytest.mark.parametrize("damage", [[1], "x", 3, None])
def test_a_damaged_entry_under_this_key_is_measured_again_and_replaced(tiny_loaded, damage):
    # valid JSON whose entry for this very key is not an object: writing the new curve over it
    # raised AttributeError ('list' object has no attribute 'get') out of generate()
    path = tiny_loaded.path / costs.FILE
    path.write_text(json.dumps({costs.cache_key(tiny_loaded): damage}))
    assert costs.cost_model(tiny_loaded).source == "measured"
    assert costs.read_cached(tiny_loaded) is not None


def test_a_cached_entry_with_damaged_figures_is_not_used(tiny_loaded):
    from redrafter_mlx.drafter import new_drafter

    m = tiny_loaded
    m.drafter, m.drafter_path = new_drafter(m.args), m.path / "drafter"
    costs.cost_model(m)
    path = m.path / costs.FILE
    data = json.loads(path.read_text())
    key, entry = costs.cache_key(m), data[costs.cache_key(m)]
    # sizes that do not rise (they divided by zero, or made every size cost NaN): the curve is measured again
    for sizes in ([1] * len(entry["sizes"]), [1] + [float("nan")] * (len(entry["sizes"]) - 1),
                  [1] + sorted(entry["sizes"][1:], reverse=True)):
        path.write_text(json.dumps({**data, key: {**entry, "sizes": sizes}}))
        assert costs.read_cached(m) is None
    # a drafter's damaged figure is timed again, the curve kept; "false" is not True
    for level in ("x", -1.0, None, True):
        damaged = {**entry, "draft_level": {costs.drafter_key(m): level}, "shape_buckets": "false"}
        path.write_text(json.dumps({**data, key: damaged}))
        cached = costs.read_cached(m)
        assert cached is not None and cached.draft_level is None and cached.shape_buckets is False
        m.controllers.clear()
        out = generate(m, "hello", mode="auto", max_tokens=3)
        assert out.stats.new_tokens == 3 and m.controllers[controller_key(m)].costs.draft_level > 0


def test_a_curve_measured_under_load_is_measured_again_once(tiny_loaded, monkeypatch, quiet_machine):
    m = tiny_loaded
    costs.cost_model(m)
    cached = costs.cost_model(m)
    assert cached.source.startswith("cached")
    # a run at the curve's own speed leaves it alone
    for _ in range(2 * costs.HEAL_STEPS):
        cached.observe_plain(cached.plain_measured)
        cached.observe_verify(4, cached.verify(4))
    assert not cached.faster_than_measured() and not costs.heal_cached(m, cached)
    assert "stale" not in json.loads((m.path / costs.FILE).read_text())[costs.cache_key(m)]

    def run_at_half(c, kind):
        for _ in range(costs.HEAL_STEPS):
            assert not costs.heal_cached(m, c)  # too few steps to judge yet
            if kind == "plain":
                c.observe_plain(0.5 * c.plain_measured)
            else:
                c.observe_verify(4, 0.5 * c.base(4))
        assert c.faster_than_measured()

    run_at_half(cached, "plain")
    assert costs.heal_cached(m, cached) and not costs.heal_cached(m, cached)  # marked once
    assert "stale" in json.loads((m.path / costs.FILE).read_text())[costs.cache_key(m)]
    calls = []
    real = costs.calibrate
    monkeypatch.setattr(costs, "calibrate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    said = []
    healed = costs.cost_model(m, said.append)
    assert calls == [1] and healed.source == "measured" and healed.healed
    assert "busier" in said[0]
    entry = json.loads((m.path / costs.FILE).read_text())[costs.cache_key(m)]
    assert "stale" not in entry and entry["healed"]
    again = costs.cost_model(m)
    assert calls == [1] and again.source.startswith("cached") and again.healed
    run_at_half(again, "verify")  # faster again, by the verifications this time: not marked a second time
    assert not costs.heal_cached(m, again)
    costs.cost_model(m)
    assert calls == [1]


def test_a_curve_in_a_model_folder_that_can_no_longer_be_written_is_measured_again_once(tiny_loaded, monkeypatch,
                                                                                         tmp_path):
    """A model folder holding a cached curve that can no longer be written (a read-only mount, another user's
    folder): a curve measured there again (marked stale by a run, or cut short) went to the user cache, but the
    folder's old one was read first every time, so it was measured again on every run and never refreshed. The
    place a curve is written to (the user cache here) is read first."""
    m = tiny_loaded
    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path / "cache"))
    first = costs.cost_model(m)
    path = m.path / costs.FILE
    data = json.loads(path.read_text())
    data[costs.cache_key(m)]["stale"] = "a run found the machine faster"
    path.write_text(json.dumps(data))
    real_update, real_unwritable = costs.update_json, costs.unwritable_ancestor

    def refused(where, *a, **kw):
        if Path(where).parent == m.path:
            raise PermissionError(13, "Permission denied", str(where))
        return real_update(where, *a, **kw)

    monkeypatch.setattr(costs, "update_json", refused)  # (chmod does not bind root: simulated)
    monkeypatch.setattr(costs, "unwritable_ancestor",
                        lambda where: m.path if Path(where).parent == m.path else real_unwritable(where))
    calls = []
    real = costs.calibrate
    monkeypatch.setattr(costs, "calibrate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    assert costs.cost_model(m).source == "measured" and calls == [1]
    again = costs.cost_model(m)
    assert calls == [1] and again.source == f"cached ({costs.cache_paths(m)[1]})" and not again.stale
    assert json.loads(path.read_text())[costs.cache_key(m)]["seconds"] == first.seconds.tolist()  # left as it was


def test_a_run_marks_a_cached_curve_it_found_too_slow(tiny_loaded, monkeypatch, quiet_machine):
    from redrafter_mlx.drafter import new_drafter

    m = tiny_loaded
    m.drafter = new_drafter(m.args)
    costs.cost_model(m)  # measured and cached: the run below reads it from the cache
    monkeypatch.setattr(CostModel, "faster_than_measured", lambda self: True)
    generate(m, PROMPT, mode="auto", max_tokens=4)
    assert "stale" in json.loads((m.path / costs.FILE).read_text())[costs.cache_key(m)]


def test_controller_is_made_once_per_drafter(tiny_loaded):
    from redrafter_mlx.drafter import new_drafter

    tiny_loaded.drafter = new_drafter(tiny_loaded.args)
    a = controller(tiny_loaded)
    assert a.has_drafter and a.costs.draft_level is not None
    assert controller(tiny_loaded) is a
    b = controller(tiny_loaded, use_drafter=False)
    assert b is not a and not b.has_drafter and b.costs is a.costs


def test_greedy_and_sampled_calls_learn_on_controllers_of_their_own():
    """One controller served greedy and sampled calls on a model: a sampled reply's acceptance (a node is
    accepted with its base-model probability) steered the greedy replies after it, and back. Each now
    learns apart, on the one cost model."""
    m = tiny_loaded()
    # a curve on which drafting pays, its seconds long enough that the tiny model's real times move nothing
    greedy = m.controllers[controller_key(m)] = Controller(
        FixedCosts(SIZES, [10.0 * (1 + 0.3 * (n - 1) / 63) for n in SIZES], draft_level=1e-6), True)

    def learned(ctl):
        return ctl.acceptance.draft_n.sum() + ctl.acceptance.look_n.sum()

    generate(m, PROMPT, mode="auto", max_tokens=24, temperature=0.8, seed=3)
    sampled = m.controllers[controller_key(m, sampled=True)]
    assert sampled is not greedy and sampled.costs is greedy.costs and controller(m) is greedy
    assert learned(sampled) > 0 and learned(greedy) == 0  # the sampled reply taught the greedy controller nothing
    before = learned(sampled)
    generate(m, PROMPT, mode="auto", max_tokens=24)
    assert controller(m, sampled=True) is sampled and learned(sampled) == before and learned(greedy) > 0


def test_expansion_stops_where_no_child_can_pay():
    from redrafter_mlx.tree_search import expand

    m = tiny_loaded()
    h = mx.zeros((m.args.hidden_size,))
    full = expand(m.drafter, m.model, h, 5, 2, 4, min_prob=1e-9)
    assert full.depth == 4 and full.forwards == 4
    early = expand(m.drafter, m.model, h, 5, 2, 4, min_prob=1e-9, stop_prob=0.999)
    assert early.depth == 1 and early.forwards == 1  # the drafter's time is divided by the levels it ran


def test_the_kept_size_shrinks_where_drafting_achieves_more():
    """A node pays when it brings more tokens than its verification time would bring at the rate
    decoding achieves around here (Controller.rate, never below plain decoding's): where recent
    drafting steps emitted many tokens per second, marginal nodes are left out, and the floor
    and the expansion's stop rise with the rate."""
    ctl = Controller(cpu_costs(), True)
    cands = wide(0.6, 4, 6)
    assert ctl.rate() == pytest.approx(1 / 0.1)
    before, floor = ctl._choose(5, cands, [], 63, 6).kept.size, ctl.floor(63)
    sure = ctl._choose(5, chain(0.99, 4), [], 63, 4)
    for _ in range(100):  # every step emits 5 tokens for verifying 5 (1.7 plain steps): 29 tokens/s
        ctl.observe("draft", sure, sure.kept, 5, 0.0, ctl.costs.verify(5))
    assert ctl.rate() == pytest.approx(5 / ctl.costs.verify(5), rel=0.01) and ctl.rate() > 2.5 / 0.1
    after = ctl._choose(5, cands, [], 63, 6).kept.size
    assert 0 < after < before and ctl.floor(63) > floor


def test_shape_buckets_are_measured_cached_and_applied(tiny_loaded, monkeypatch, quiet_machine):
    """Where a forward at a new (tree size, context) shape costs several times a repeated one
    (MLX's CUDA backend compiles per shape), calibration turns shape buckets on, the cache
    keeps the choice, and loading the curve applies it to the model."""
    model = tiny_loaded.model
    assert costs.cost_model(tiny_loaded).shape_buckets is False and model.shape_buckets is False
    seen = set()
    real = costs._time_forward  # (quiet_machine's: a real reading under load turned buckets on, or cut the curve short)

    def compiling(model, cache, start, n, vocab):  # a backend that compiles per shape
        t = real(model, cache, start, n, vocab)
        key = (n, start)
        first = key not in seen
        seen.add(key)
        return t + (0.05 if first else 0.0)

    monkeypatch.setattr(costs, "_time_forward", compiling)
    fresh = costs.cost_model(tiny_loaded, refresh=True)
    assert fresh.shape_buckets is True and model.shape_buckets is True
    model.use_shape_buckets(False)
    cached = costs.cost_model(tiny_loaded)
    assert cached.source.startswith("cached") and cached.shape_buckets and model.shape_buckets


def test_one_slow_reading_does_not_turn_shape_buckets_on(tiny_loaded, monkeypatch):
    """A burst of load from another process can inflate one shape-penalty reading; shape buckets
    (padded trees) turn on only when a second reading, at contexts never seen either, agrees."""
    model = tiny_loaded.model
    cache = model.make_cache()
    mx.eval(model.hidden(mx.arange(16, dtype=mx.int32)[None], cache))
    for readings, wanted in (([3.0, 1.1], False), ([3.0, 2.5], True), ([1.2], False)):
        starts, left = [], list(readings)

        def reading(model, cache, vocab, n=3):
            starts.append(cache.offset)
            return left.pop(0)

        monkeypatch.setattr(costs, "shape_penalty", reading)
        assert costs.wants_shape_buckets(model, cache, 64) is wanted
        assert not left and cache.offset == 16  # every reading taken, the context given back
        assert len(set(starts)) == len(starts)  # the second reading at a context of its own


def test_cost_lookups_read_a_table_rebuilt_when_the_curve_moves():
    c = costs.CostModel([1, 2, 4], [0.1, 0.12, 0.2])
    before = c.verify_curve(8).copy()
    assert c.verify(3) == pytest.approx(0.16) and c.verify(300) == pytest.approx(0.2 + 296 * 0.04)
    c.observe_verify(3, 0.32)  # twice the curve: the bucket's correction moves
    assert c.verify(3) > 0.16 and c.verify_curve(8)[2] == c.verify(3)
    assert before[2] == pytest.approx(0.16)


def test_the_curve_comes_back_after_a_burst_of_load():
    """Verifications under a 4x load lift the whole curve; a few at the calibrated speed
    afterwards bring all of it back. Kept per size only, one token stayed at 4x after the load
    had gone, every size looked as slow (the curve never falls with size), and a filter for
    stalls ignored every step 5x faster than that curve: the controller stayed parked for good."""
    c = CostModel([1, 2, 4, 8], [0.1, 0.11, 0.13, 0.17], plain=0.09)
    for _ in range(30):
        c.observe_verify(1, 0.4)
        c.observe_verify(2, 0.44)
    assert c.verify(1) == pytest.approx(0.4, rel=0.1) and c.verify(8) == pytest.approx(0.68, rel=0.1)
    for _ in range(10):
        c.observe_verify(2, 0.11)  # the load has gone
    assert c.verify(1) == pytest.approx(0.1, rel=0.3) and c.verify(8) == pytest.approx(0.17, rel=0.3)  # not 0.4, 0.68
    for _ in range(2):
        c.observe_verify(2, 10.0)  # stalls: ignored
    assert c.verify(2) == pytest.approx(0.11, rel=0.2)


def test_sizes_no_longer_verified_keep_their_cost_while_the_load_moves():
    """Verification times with a little noise and a few stalls, sizes 2-20 for 1,000 steps, then
    sizes 2-4 only (the controller's trees shrink). Every verification moved both the load and
    the verified size's correction, with different filters, and nothing held the split between
    them: the load rose step after step, the verified sizes' corrections fell to match, and 16
    tokens, no longer verified, came to be modeled at 10-18x their true cost."""
    rng = np.random.default_rng(0)
    c = CostModel([1, 2, 4, 8, 16, 32, 64], [0.076, 0.084, 0.103, 0.113, 0.128, 0.18, 0.30], plain=0.06)

    def true(n):
        return 0.076 + 0.0045 * (n - 1)

    for step in range(4000):
        n = int(rng.choice([2, 4, 6, 8, 12, 16, 20])) if step < 1000 else int(rng.choice([2, 2, 2, 3, 4]))
        stall = rng.uniform(2, 8) if rng.random() < 0.03 else 1.0
        c.observe_verify(n, true(n) * rng.lognormal(0, 0.15) * stall)
    for n in (2, 4, 16, 32):
        assert 0.67 < c.verify(n) / true(n) < 1.5, n
    assert 0.5 < c.load < 2.0


def test_a_burst_of_load_while_parked_does_not_stay_in_the_plain_estimate():
    """Plain steps measured under load (another process) inflate the plain estimate; the next
    verification, at normal speed, caps it at 1.25x what verifying one token costs, or trees
    would grow on a false baseline."""
    c = CostModel([1, 2, 4, 8], [0.1, 0.11, 0.13, 0.17], plain=0.09)
    for _ in range(30):  # calm: a verification, then plain steps
        c.observe_verify(8, 0.17)
        c.observe_plain(0.03)  # the first after a verification overlaps the forward queued before it: not counted
        c.observe_plain(0.095)
        c.observe_plain(0.095)
    assert c.plain == pytest.approx(0.095, rel=0.02)
    for _ in range(40):
        c.observe_plain(0.2)  # parked under load, no verification in between
    assert c.plain > 0.15
    for _ in range(3):
        c.observe_verify(8, 0.17)  # load gone: 8 tokens verified at the calibrated speed
    assert c.plain == pytest.approx(1.25 * c.verify(1)) and c.plain < 0.13


def test_a_fixed_lookup_without_a_drafter_drafts_the_copy():
    """`lookup=N` with no drafter (or use_drafter=False) in mode auto decoded plainly, saying
    nothing, while the bench's auto drafted from the context: now it drafts the copy alone."""
    m = tiny_loaded()
    ar = generate(m, PROMPT, mode="ar", max_tokens=120)
    for kw in ({"use_drafter": False}, {}):
        if not kw:
            m.drafter = None
        out = generate(m, PROMPT, mode="auto", max_tokens=120, lookup=8, **kw)
        assert out.tokens == ar.tokens
        assert out.stats.mode == "redrafter" and (out.stats.beam_width, out.stats.beam_length) == (1, 1)
        assert out.stats.looked_up_tokens > 0 and out.stats.accepted_tokens == out.stats.looked_up_tokens
    assert generate(m, PROMPT, mode="auto", max_tokens=20, beam_width=4).stats.mode == "ar"  # nothing to draft with


def test_a_graph_without_a_drafter_drafts_the_copy_as_a_tree_does():
    """Without a drafter, `lookup=N` with a tree drafts the copy alone, but with a graph too
    (tree=8, graph=1) it decoded plainly, saying nothing, where the chat drafts the copy: a graph,
    like a tree, only shapes the drafter's drafts. A bad graph is still refused."""
    from redrafter_mlx.errors import SettingError

    m = tiny_loaded()
    copy = generate(m, PROMPT, mode="auto", max_tokens=60, lookup=4, use_drafter=False)
    for kw in ({"use_drafter": False}, {}):
        if not kw:
            m.drafter = None
        out = generate(m, PROMPT, mode="auto", max_tokens=60, lookup=4, tree=8, graph=1, **kw)
        assert out.stats.mode == "redrafter" and (out.stats.beam_width, out.stats.beam_length) == (1, 1)
        assert out.tokens == copy.tokens and out.stats.packed_tokens == copy.stats.packed_tokens
        with pytest.raises(SettingError, match="graph must be >= 0"):
            generate(m, PROMPT, mode="auto", max_tokens=6, lookup=4, tree=8, graph=-1, **kw)
