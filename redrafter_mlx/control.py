"""The adaptive controller behind mode "auto": how much to draft, step by step, so that
speculation is never slower than plain decoding on the machine it finds itself on.

A fixed beam shape is right for one machine: on a 2-core CPU with OpenBLAS, verifying 16
tokens costs 2.4x one, without it 12x, on an H100 64 cost 1.4x. The controller needs no tuning
step. It holds three models and makes one choice per step:

- the cost model (costs.py): t_verify(n), measured once per device/model/format and corrected
  online, the drafter's seconds per level, and what a plain step costs;
- the acceptance model (`Acceptance`): the chance that verification accepts a draft node given
  that its parent was accepted, per bucket of the drafter's conditional probability (and
  depth), and for the context-lookup beam per matched n-gram length, position in the copy and
  whether the copy continues a run (the reply's latest tokens were what a copy predicted).
  Raw drafter probabilities are not calibrated; the buckets learn from what the base model
  accepts, starting from the raw value as a prior. The copy's buckets learn in hindsight, every
  position against what the reply then emitted, verified or not;
- the choice: a candidate tree (the drafter's tree, drafted as deep as recently paid off, plus
  the lookup copy), each node's path probability the product of its calibrated conditionals,
  nodes ranked by it (a child never outranks its parent, so every prefix of the ranking is a
  tree), and the B kept that maximize (sum of kept path probabilities) - R x t_verify(B + 1),
  R being the rate decoding achieves here (`Controller.rate`: speculative steps' tokens over
  their seconds, never below plain decoding's). A node is kept when it brings more tokens than its
  verification time would bring at that rate (the long-run best, where a step's own
  (1 + sum) / t_verify ratio ignores the drafting time every step pays); a level is drafted
  when its best node can repay the level's time the same way. B = 0 verifies the root alone.
  The copy enters in stages (`_stage`): at most the length at which it alone runs fastest, since
  where it holds, the next step verifies the rest.

A drafting step whose context copy alone is expected to be faster than the copy plus the
drafter (its measured time, and its usual tokens only where the copy's first token fails)
verifies the copy alone: in a quote or a loop the head's time is saved.

Parking: after each drafting step the controller scores expected tokens per second (the
calibrated expectation over the step's measured time, as ratios of averages, judged only once
PROBE_STEPS steps have drafted, unless drafting is clearly slower) against a plain step's. Once drafting no longer pays, it
parks: plain decoding, pipelined exactly as mode "ar", with only a context-lookup check per
step (tens of microseconds), which still verifies a copied continuation when that alone pays.
It probes again after a back-off that doubles while probes keep failing (4 .. 256 steps).
No probe runs where the cost model says drafting cannot pay even at its best
(`_drafting_can_pay`: verification costing ~k times one token).
Without a drafter the controller is always parked: lookup alone, where it pays.
"""

import bisect
import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from .costs import CostModel, cost_model
from .graph import ALIAS_GRAFT, CONTEXT_GRAFT, DRAFTER, context_grafts
from .lookup import NO_MATCH, ContextIndex
from .tree_search import Candidates, expand, leaf_paths

DRAFT_EDGES = np.array([0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99])
DRAFT_PRIOR = np.array([0.01, 0.035, 0.075, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.925, 0.97, 0.995])
LOOKUP_POSITIONS = np.array([2, 3, 5, 9])  # buckets: position 1, 2, 3-4, 5-8, 9+ in the copy
_POSITION_EDGES = LOOKUP_POSITIONS.tolist()  # (for bisect: a few positions a step, scored without numpy)
LOOKUP_PRIOR = 0.5
PRIOR_WEIGHT = 3.0  # observations the prior counts as
DECAY = 0.995  # per observation of a bucket: about the last 200 count
MAX_NODES = 63  # draft nodes verified at most (64 tokens with the root)
PARK_FIRST, PARK_MAX = 4, 256  # steps parked after the first failed probe, and at most
GAIN_EMA = 0.25
MAX_DEPTH = 8  # drafter levels at most
WATCHED = 8  # context copies scored in hindsight at once (Controller._watch)
RATE_EMA = 0.005  # weight of one speculative step in the rate decoding achieves (Controller.rate)
PROBE_STEPS = 4  # drafting steps a probe (or the first drafting) runs before a small loss parks it
CLEAR_LOSS = 0.8  # ... and below this speed over plain decoding's it parks at once
BEST_ACCEPTANCE = 0.9  # per drafted node, for the best case a probe could find (Controller._drafting_can_pay)


def _ema(old: Optional[float], new: float, weight: float = GAIN_EMA) -> float:
    """An exponential average (weight: GAIN_EMA unless given), starting at the first value."""
    return new if old is None else old + weight * (new - old)


class Acceptance:
    """Calibrated P(node accepted | parent accepted), learned online per bucket."""

    def __init__(self):
        self.draft_n = np.zeros((4, DRAFT_PRIOR.size))  # depth 1, 2, 3+, grafted (graph.py) x conditional-probability bin
        self.draft_a = np.zeros((4, DRAFT_PRIOR.size))
        # (in a run or not) x matched n-gram 2, 3+ x position bucket; a copy is "in a run" when the
        # reply so far was what an earlier copy predicted (a quote, a list, a loop under way)
        self.look_n = np.zeros((4, LOOKUP_POSITIONS.size + 1))
        self.look_a = np.zeros((4, LOOKUP_POSITIONS.size + 1))

    @staticmethod
    def draft_bucket(q: np.ndarray, levels: np.ndarray, grafted=None) -> np.ndarray:
        """Flat bucket index of drafter nodes from conditional probability q and depth (copies
        grafted under a GSD alias have their own row: the head drafted them on another path)."""
        row = np.minimum(levels - 1, 2) if grafted is None else np.where(grafted, 3, np.minimum(levels - 1, 2))
        return row * DRAFT_PRIOR.size + np.searchsorted(DRAFT_EDGES, q, side="right")

    @staticmethod
    def lookup_bucket(n: int, positions: np.ndarray, run: bool = False) -> np.ndarray:
        """Flat bucket index of lookup nodes from the matched n-gram length, 1-based position and
        whether the copy continues a run (Controller._in_run)."""
        row = 2 * bool(run) + min(max(n - 2, 0), 1)
        return row * (LOOKUP_POSITIONS.size + 1) + np.searchsorted(LOOKUP_POSITIONS, positions, side="right")

    def draft_p(self, buckets: np.ndarray) -> np.ndarray:
        n, a = self.draft_n.reshape(-1)[buckets], self.draft_a.reshape(-1)[buckets]
        prior = DRAFT_PRIOR[buckets % DRAFT_PRIOR.size]
        return (a + PRIOR_WEIGHT * prior) / (n + PRIOR_WEIGHT)

    def lookup_p(self, buckets: np.ndarray) -> np.ndarray:
        n, a = self.look_n.reshape(-1)[buckets], self.look_a.reshape(-1)[buckets]
        return (a + PRIOR_WEIGHT * LOOKUP_PRIOR) / (n + PRIOR_WEIGHT)

    @staticmethod
    def lookup_buckets(n: int, first: int, last: int, run: bool = False) -> list:
        """`lookup_bucket` of positions first .. last as a list: what hindsight scoring (Controller._learn)
        asks of every watched copy (up to WATCHED), every step, parked or not: numpy calls on a few
        positions each had cost a parked step a quarter of the controller's ~100 us along a loop."""
        base = (2 * bool(run) + min(max(n - 2, 0), 1)) * (LOOKUP_POSITIONS.size + 1)
        return [base + bisect.bisect_right(_POSITION_EDGES, p) for p in range(first, last + 1)]

    @staticmethod
    def _update(n: np.ndarray, a: np.ndarray, buckets, hits):
        if len(buckets) == 0:
            return
        flat_n, flat_a = n.reshape(-1), a.reshape(-1)
        if isinstance(buckets, np.ndarray):
            buckets, hits = buckets.astype(np.int64).tolist(), np.asarray(hits).tolist()
        for b, hit in zip(buckets, hits):
            flat_n[b] = flat_n[b] * DECAY + 1.0
            flat_a[b] = flat_a[b] * DECAY + float(hit)

    def update(self, draft_buckets, draft_hits, lookup_buckets=(), lookup_hits=()):
        self._update(self.draft_n, self.draft_a, draft_buckets, draft_hits)
        self._update(self.look_n, self.look_a, lookup_buckets, lookup_hits)


@dataclass
class Plan:
    """One step's candidate tree and the nodes kept for verification."""

    rows: np.ndarray  # (R, D) ragged beams (root first, -1 past a row's end) for tree.pack
    node_at: np.ndarray  # (R, D) candidate node index at each row position (-1: root or past the end)
    parent: np.ndarray  # (N,) candidate parents (-1: the root)
    kept: np.ndarray  # (B,) indices of the kept candidate nodes
    draft_bucket: np.ndarray  # (N,) -1 where the drafter did not propose the node
    lookup_bucket: np.ndarray  # (N,) -1 where the copy did not
    expected: float  # expected tokens this step emits: 1 + sum of kept path probabilities
    drafted: int  # candidate nodes drafted (drafter and copy)
    levels: int  # drafter levels run
    from_lookup: np.ndarray  # (N,) bool: proposed by the copy
    path_p: np.ndarray  # (N,) calibrated probability that the node is accepted
    depth: np.ndarray  # (N,) depth below the root
    source: np.ndarray  # (N,) graph.DRAFTER, ALIAS_GRAFT or CONTEXT_GRAFT (the root copy's nodes: DRAFTER)
    aliases: int = 0  # kept GSD aliases
    drafter_rows: int = 0  # rows the drafter ran for this step's candidates (frontier nodes, summed over levels)
    forwards: int = 0  # drafter levels actually run (expansion stops early where no child can pay)


class Controller:
    """Per loaded model (and drafter): decides plain vs speculative steps and each tree's size."""

    def __init__(self, costs: CostModel, has_drafter: bool):
        self.costs = costs
        self.acceptance = Acceptance()
        self.has_drafter = has_drafter
        self.parked = 0  # plain steps left before the next probe
        self.backoff = PARK_FIRST
        self.gain: Optional[float] = None  # expected speed over plain speed, drafting steps (averages' ratio)
        self._gain_tokens: Optional[float] = None  # EMAs of drafting steps' expected tokens and seconds
        self._gain_seconds: Optional[float] = None
        self._probed = 0  # drafting steps since the latest probe began
        # EMAs over drafting steps, for _copy_beats_drafting: seconds drafting took (the head and
        # the host's planning), the head's kept nodes and their expected accepted tokens.
        self.draft_seconds: Optional[float] = None
        self.draft_nodes: Optional[float] = None
        self.draft_mass: Optional[float] = None
        self.mass = np.full(MAX_DEPTH + 2, 0.25)  # EMA per depth of the kept drafter nodes' path probabilities
        self.depth = 4  # levels to draft: the deepest paying its level's drafting time, plus one to explore
        self.last_floor = 0.05  # the last floor() (for the stats)
        self.context = ContextIndex()  # the copy source, indexed as the context grows
        self._copies = []  # [start, token before it, copy, n, positions scored, run]: copies awaiting the reply (_watch)
        self._confirmed = -1  # the reply up to this index was what a watched copy predicted, 2+ tokens of it
        self._n_max_key, self._n_max_val = None, 0
        self._rate_tokens: Optional[float] = None  # averages over speculative steps of tokens emitted and seconds taken
        self._rate_seconds: Optional[float] = None
        self._rate_steps = 0

    def rate(self) -> float:
        """Tokens per second that decoding achieves: speculative steps' emitted tokens over their
        time (averages over ~200 steps: drafting steps alone, or ~20 steps, valued time too cheaply
        where copies carry the reply), never below plain decoding's. A draft node, or a level of drafting, pays
        when it brings more tokens than this rate times the seconds it costs."""
        plain = 1.0 / max(self.costs.plain, 1e-9)
        if self._rate_tokens is None:
            return plain
        return max(plain, self._rate_tokens / max(self._rate_seconds, 1e-9))

    # ---- what the next step is ---------------------------------------------------------------
    def next_step(self, ids, root_known: bool, room: int) -> str:
        """'draft' (drafter + lookup), 'lookup' (the copy alone) or 'plain' for the coming step.
        ids: the context ending with the latest emitted token; root_known: that token is the
        next step's root (False: a pipelined step will emit one more first, unknown yet); room:
        the tokens that step may feed (its root and drafts), within the context and max_tokens."""
        self._learn(ids)
        if room < 2:  # nothing can be drafted (the reply's last token, the context's end): a plain step
            return "plain"
        if self.has_drafter and self.parked <= 0 and self._probed == 0 and not self._drafting_can_pay():
            # a probe (or the first drafting) is due; once drafting runs, its measured speed judges it
            self.parked = PARK_MAX  # asked again then: the copies' verifications refine the curve
        if self.has_drafter and self.parked <= 0:
            if root_known and self.draft_seconds is not None and self._copy_beats_drafting(ids, room):
                return "lookup"
            return "draft"
        if self.has_drafter:
            self.parked -= 1
        return "lookup" if self._lookup_pays(ids, root_known, room) else "plain"

    def _drafting_can_pay(self) -> bool:
        """Could drafting be faster than plain decoding on this cost model at all: a chain of B
        drafted nodes, each accepted with BEST_ACCEPTANCE given its parent (no drafter does better
        on average), against verifying B + 1 tokens and drafting B levels? Where verification
        costs ~k times one token (MLX's own BLAS, 4-bit weights on a CPU) it cannot, and the
        probes that found so cost ~10% of a first 96-token reply on the 2-core CPU; the controller
        then only verifies copies, where they pay. Asked only when a probe is due."""
        n = self._n_max()
        if n < 1:
            return False
        levels = np.arange(1, n + 1)
        tokens = 1.0 + np.cumsum(BEST_ACCEPTANCE ** levels)
        seconds = self.costs.speculative_curve(n + 1) + levels * (self.costs.draft_level or 0.0)
        return bool(np.max(tokens * self.costs.plain / seconds) > 1.0)

    def _copy(self, ids, root_known: bool, room: int):
        """The context's copy for the coming step as (expected accepted tokens of each prefix,
        verification cost of each prefix in plain steps); (None, None) when there is none."""
        n_max = min(self._n_max(), room - 1 - (not root_known))
        if n_max < 1:
            return None, None
        copy, n, _ = self.context.match(ids, n_max + (not root_known))
        run = self._in_run(ids)
        self._watch(ids, copy, n, run)
        if not root_known:
            # The copy's first token predicts the token the pipelined step emits; the rest is the draft.
            if copy.size < 2:
                return None, None
            first = float(self.acceptance.lookup_p(self.acceptance.lookup_bucket(n, np.array([1]), run))[0])
            copy = copy[1:]
        else:
            first = 1.0
        if copy.size == 0:
            return None, None
        seconds = self.costs.speculative_curve(copy.size + 1)
        return first * np.cumsum(self._copy_path(copy.size, n, run)), seconds / self.costs.plain

    def _copy_path(self, size: int, n: int, run: bool) -> np.ndarray:
        """P(the copy's first j tokens are all accepted), j = 1 .. size, for a copy matched on an
        n-gram (run: it continues a run)."""
        acc = self.acceptance
        return np.cumprod(acc.lookup_p(acc.lookup_bucket(n, np.arange(1, size + 1), run)))

    def _lookup_pays(self, ids, root_known: bool, room: int) -> bool:
        gains, cost = self._copy(ids, root_known, room)
        return gains is not None and bool(np.max((1.0 + gains) / cost) > 1.05)  # a margin: it costs the pipelining too

    def _copy_beats_drafting(self, ids, room: int) -> bool:
        """While drafting: is the copy alone expected to be faster than drafting with it this
        step? Drafting adds the drafter's time (measured, host work included) and the drafter's
        usual expected tokens, which count only where the copy's first token fails (where it
        holds, the head's best path is mostly the copy's own tokens). In a stretch the context
        carries (a reply quoting its prompt, a loop) the head's time is then saved."""
        gains, cost = self._copy(ids, True, room)
        if gains is None:
            return False
        speed = (1.0 + gains) / cost
        b = int(np.argmax(speed))
        extra = (1.0 - gains[0]) * self.draft_mass
        packed = b + 2 + int(round(self.draft_nodes))  # root, the copy's b + 1 tokens, the head's usual nodes
        seconds = self.costs.speculative(packed) + self.draft_seconds
        drafting = (1.0 + gains[b] + extra) * self.costs.plain / seconds
        return bool(speed[b] > drafting)

    # ---- one speculative step -------------------------------------------------------------------
    def _n_max(self) -> int:
        """Most draft nodes worth considering: a step costing more than 6 plain steps never pays
        on what a head drafts."""
        # Recomputed when the curve is rebuilt or the plain step moves by 2%.
        key = (self.costs.version, round(50 * math.log(max(self.costs.plain, 1e-9))))
        if key != self._n_max_key:
            curve = self.costs.verify_curve(MAX_NODES + 1) / self.costs.plain
            fits = np.flatnonzero(curve <= 6.0)
            self._n_max_key, self._n_max_val = key, int(min(MAX_NODES, fits[-1])) if fits.size else 0
        return self._n_max_val

    def floor(self, n_max: int) -> float:
        """Path probability below which no node can pay: verifying one more token costs `slope`
        seconds (the curve's mean slope over its first 16 tokens: the least slope anywhere was 0
        where the curve is flat, and the floor then dropped nothing), which at the rate decoding
        achieves (`rate`) would bring rate x slope tokens; a node brings its acceptance probability."""
        curve = self.costs.verify_curve(max(n_max, 1) + 1)
        top = min(curve.size, 16)
        slope = float((curve[top - 1] - curve[0]) / (top - 1)) if top > 1 else self.costs.plain
        self.last_floor = float(np.clip(0.5 * self.rate() * slope, 0.005, 0.5))  # half: the head's raw scores are uncalibrated
        return self.last_floor

    def plan(self, kind: str, drafter, base, h, token: int, ids, room: int, graph: Optional[int] = None,
             context_graph: bool = True) -> Plan:
        """Draft the candidates for a step of `kind` ('draft' or 'lookup') from the root `token`
        (ids: the context ending with it) and keep the nodes that maximize expected tokens per
        second. graph: draft a GSD graph with this k (graph.py); context_graph: graft the
        context's continuation of every drafted node too."""
        n_all = self._n_max()
        n_max = min(n_all, room - 1)
        levels = 0
        cands = Candidates.empty()
        if kind == "draft" and n_max >= 1:
            levels = int(min(self.depth, n_max))
            width = 8 if self.costs.ratio(32) < 2.0 else 4  # wide where verification is nearly free (GPUs)
            floor = self.floor(n_all)
            # Another level pays only if its best node can repay the level's drafting time and its
            # own verification at the rate decoding achieves: rate x (level seconds + slope).
            stop = 2 * floor + (self.costs.draft_level or 0.0) * self.rate()
            cands = expand(drafter, base, h, token, width, levels, budget=n_max, min_prob=floor, stop_prob=stop,
                           graph=graph, prefix=ids)
        copy, n, _ = self.context.match(ids, n_max) if n_max >= 1 else NO_MATCH
        run = self._in_run(ids)
        self._watch(ids, copy, n, run)
        copies = [(-1, self._stage(copy, n, run), n, run)] if copy.size else []
        if graph is not None and context_graph and cands.tokens.size:
            copies += [(i, m.copy, m.n, False) for i, m in
                       context_grafts(self.context, ids, cands.tokens.tolist(), cands.parents.tolist(),
                                      cands.levels.tolist(), n_max, n_max, graph)]
        return self._choose(token, cands, copies, n_max, levels)

    def _stage(self, copy: np.ndarray, n: int, run: bool) -> np.ndarray:
        """The part of the context's copy worth verifying this step: at most the length at which
        the copy alone runs fastest, (1 + expected accepted tokens) / t_verify. What is left
        is not lost: where the copy holds, the next step verifies it. Valuing every copied token
        at the rate decoding achieves instead kept copies of 63 tokens at 330 ms a step on a
        2-core CPU, and a miss at their first token lost the lot (on MT-Bench replies that
        rephrase their own earlier sentences); where the copy holds, the next step's copy runs at
        the copy's own rate, which is the rate to weigh its tokens at."""
        seconds = self.costs.speculative_curve(copy.size + 1)
        speed = (1.0 + np.cumsum(self._copy_path(copy.size, n, run))) / seconds
        return copy[: int(np.argmax(speed)) + 1]

    def _choose(self, root: int, cands: Candidates, copies, n_max: int, levels: int) -> Plan:
        """copies: (node, tokens, n, run) context continuations to graft below candidate `node`
        (-1: the root, the lookup copy), n the matched n-gram length, run: the copy continues a
        run (_in_run)."""
        acc = self.acceptance
        N = cands.tokens.size
        tokens, parent = cands.tokens.tolist(), cands.parents.tolist()
        depth = cands.levels.tolist()
        extra = sum(c.size for _, c, _, _ in copies)
        cond = np.zeros(N + extra)
        draft_bucket = np.full(N + extra, -1, dtype=np.int64)
        lookup_bucket = np.full(N + extra, -1, dtype=np.int64)
        source = np.zeros(N + extra, dtype=np.int64)
        if N:
            if cands.sources is not None:
                source[:N] = cands.sources
            parent_logp = np.where(cands.parents >= 0, cands.logp[np.maximum(cands.parents, 0)], 0.0)
            q = np.exp(cands.logp - parent_logp)
            draft_bucket[:N] = acc.draft_bucket(q, cands.levels, source[:N] == ALIAS_GRAFT)
            cond[:N] = acc.draft_p(draft_bucket[:N])
        if copies:
            child = {(p, t): i for i, (p, t) in enumerate(zip(parent, tokens))}
            for at, copy, match_n, run in copies:
                lb = acc.lookup_bucket(match_n, np.arange(1, copy.size + 1), run)
                lp = acc.lookup_p(lb)
                node = at
                for i, t in enumerate(copy.tolist()):
                    hit = child.get((node, t))
                    if hit is None:
                        hit = len(tokens)
                        tokens.append(t)
                        parent.append(node)
                        depth.append((depth[node] if node >= 0 else 0) + 1)
                        source[hit] = CONTEXT_GRAFT if at >= 0 else DRAFTER
                        child[(node, t)] = hit
                    cond[hit] = max(cond[hit], lp[i])
                    lookup_bucket[hit] = lb[i]
                    node = hit
        M = len(tokens)
        cond, draft_bucket, lookup_bucket, source = cond[:M], draft_bucket[:M], lookup_bucket[:M], source[:M]
        path_p = np.empty(M)
        for i in range(M):  # parents come before children
            path_p[i] = cond[i] * (path_p[parent[i]] if parent[i] >= 0 else 1.0)
        depth_arr = np.asarray(depth, dtype=np.int64)
        order = np.lexsort((depth_arr, -path_p))[: max(0, n_max)]
        gains = np.concatenate([[0.0], np.cumsum(path_p[order])])
        cost = self.costs.verify_curve(order.size + 1)
        b = int(np.argmax(gains - self.rate() * cost))
        kept = order[:b]
        node_at = leaf_paths(kept, np.asarray(parent, dtype=np.int64), path_p)
        rows = np.where(node_at >= 0, np.asarray(tokens + [root], dtype=np.int32)[node_at], -1).astype(np.int32)
        rows[:, 0] = root
        aliases = int(np.sum(cands.alias[kept[kept < N]] >= 0)) if N and cands.alias is not None else 0
        return Plan(rows, node_at, np.asarray(parent, dtype=np.int64), kept, draft_bucket, lookup_bucket,
                    float(1.0 + gains[b]), M, levels, lookup_bucket >= 0, path_p, depth_arr, source, aliases,
                    cands.rows, cands.forwards)

    # ---- learning from the step -------------------------------------------------------------------
    def _in_run(self, ids) -> bool:
        """Does a copy for the position after `ids` continue a run: the reply's latest tokens
        (2 or more) were what a watched copy predicted, up to now? Copies in a run hold far more
        often (a quote, a list's pattern, a loop), and one acceptance for all copies
        underestimated them: on MT-Bench steps copying alone expected 3.5 tokens and emitted 4.9."""
        return self._confirmed == len(ids)

    def _watch(self, ids, copy: np.ndarray, n: int, run: bool = False):
        """Keep the context's copy for the position after `ids`, to score it against what the
        reply then emits (_learn). Every position of the copy is learned so, verified or not:
        learning only from verified nodes left the buckets of positions never verified at their
        prior, so those positions were never verified (on MT-Bench's extraction the controller
        verified 1-2 copied tokens a step along a copy accepting 30)."""
        start = len(ids)
        if copy.size == 0 or (self._copies and self._copies[-1][0] == start):
            return
        self._copies.append([start, ids[-1], copy.tolist(), n, 0, run])
        if len(self._copies) > WATCHED:
            del self._copies[0]

    def _learn(self, ids):
        """Score the watched copies' positions that the context `ids` now covers: position j is
        a hit when the reply emitted the copy's j-th token after the first j - 1 (each
        observation is P(accepted | parent accepted), the bucket's meaning); a copy is done at
        its first miss or its end."""
        if not self._copies:
            return
        T, kept, buckets, hits = len(ids), [], [], []
        for entry in self._copies:
            start, before, copy, n, done, run = entry
            if start > T or ids[start - 1] != before:  # a new reply, or the context was cut
                continue
            end = min(len(copy), T - start)
            seen = [copy[j] == ids[start + j] for j in range(done, end)]
            if False in seen:
                seen = seen[: seen.index(False) + 1]
            else:
                if end >= 2:
                    self._confirmed = max(self._confirmed, start + end)
                if end < len(copy):
                    entry[4] = end
                    kept.append(entry)
            if seen:
                buckets += self.acceptance.lookup_buckets(n, done + 1, done + len(seen), run)
                hits += seen
        self._copies = kept
        if hits:
            self.acceptance.update((), (), buckets, hits)

    def observe(self, kind: str, plan: Plan, accepted: np.ndarray, packed: int, draft_seconds: float,
                verify_seconds: float):
        """After a step of `kind`: accepted = candidate nodes on the accepted path."""
        on_path = np.zeros(plan.parent.size + 1, dtype=bool)  # index -1 (the root) is the last entry
        on_path[-1] = True
        on_path[accepted] = True
        kept = plan.kept
        tested = kept[on_path[plan.parent[kept]]]  # kept nodes whose parent was accepted
        hits = on_path[tested]
        # The root copy's nodes are learned in hindsight (_learn); nodes grafted from the context
        # below drafted ones (graph.py) from what this step verified.
        d, l = plan.draft_bucket[tested], plan.lookup_bucket[tested]
        l[plan.source[tested] != CONTEXT_GRAFT] = -1
        self.acceptance.update(d[d >= 0], hits[d >= 0], l[l >= 0], hits[l >= 0])
        self.costs.observe_verify(packed, verify_seconds)
        # The step's seconds as measured (a fixed cost profile: as modeled, so replays are exact).
        # (and the host's bookkeeping around it, which a plain step's timing holds for its own part)
        seconds = self.costs.step_seconds(packed, verify_seconds) + self.costs.overhead
        if kind == "draft":
            self.costs.observe_draft(plan.forwards, draft_seconds)
            seconds += self.costs.drafting_seconds(plan.forwards, draft_seconds)
        # a plain mean over the first steps, then the average over the last ~1 / RATE_EMA: an
        # average starting at the first step's figure kept a slow first step for ~100 steps
        self._rate_steps += 1
        weight = max(RATE_EMA, 1.0 / self._rate_steps)
        self._rate_tokens = _ema(self._rate_tokens, float(len(accepted) + 1), weight)
        self._rate_seconds = _ema(self._rate_seconds, seconds, weight)
        if kind != "draft":
            return
        # Drafting level d pays when the kept nodes it yields are worth its time at the rate decoding
        # achieves. Levels not drafted this step teach nothing.
        drafted = kept[plan.draft_bucket[kept] >= 0]
        self.draft_seconds = _ema(self.draft_seconds, self.costs.drafting_seconds(plan.forwards, draft_seconds))
        self.draft_nodes = _ema(self.draft_nodes, float(drafted.size))
        self.draft_mass = _ema(self.draft_mass, float(np.sum(plan.path_p[drafted])))
        mass = np.bincount(plan.depth[drafted], weights=plan.path_p[drafted], minlength=MAX_DEPTH + 2)
        seen = slice(1, plan.levels + 1)
        self.mass[seen] += 0.2 * (mass[: MAX_DEPTH + 2][seen] - self.mass[seen])
        worth = np.flatnonzero(self.mass[1 : MAX_DEPTH + 1] > (self.costs.draft_level or 0.0) * self.rate())
        self.depth = int(min(MAX_DEPTH, (worth[-1] + 1 if worth.size else 0) + 1))
        # Speed over plain decoding's, from the expected tokens (the acceptance model is calibrated)
        # and the step's measured time: the curve's figure for this size (interpolated, corrected by
        # averages) ran up to 20% above the measured verification on the 2-core CPU with OpenBLAS,
        # and parked the controller where drafting paid.
        self._gain_tokens = _ema(self._gain_tokens, plan.expected)
        self._gain_seconds = _ema(self._gain_seconds, seconds)
        self.gain = self._gain_tokens * self.costs.plain / max(self._gain_seconds, 1e-9)
        self._probed += 1
        if self.gain < 1.0 and (self._probed >= PROBE_STEPS or self.gain < CLEAR_LOSS):
            self.parked = self.backoff
            self.backoff = min(2 * self.backoff, PARK_MAX)
            self._gain_tokens = self._gain_seconds = None  # the next probe starts afresh
            self._probed = 0
        elif self._probed >= PROBE_STEPS:
            self.backoff = PARK_FIRST  # drafting pays again: a later dip parks briefly first

    def observe_plain(self, seconds: float):
        """A pipelined plain step's time: what speculation competes with."""
        self.costs.observe_plain(seconds)

    def observe_overhead(self, seconds: float):
        """A speculative step's host seconds outside its drafting and verification (costs.py)."""
        self.costs.observe_overhead(seconds)

    def summary(self) -> Dict[str, float]:
        return {**self.costs.summary(), "draft_depth": self.depth, "floor": self.last_floor,
                "parked_for": max(self.parked, 0)}


def controller_key(loaded, use_drafter: bool = True, sampled: bool = False) -> Tuple[int, bool]:
    """The key of `loaded.controllers` for `loaded` with its drafter (or none), greedy or sampled."""
    return id(loaded.drafter if use_drafter else None), bool(sampled)


def controller(loaded, use_drafter: bool = True, progress=None, sampled: bool = False) -> Controller:
    """The controller of `loaded` with its drafter (or none: use_drafter False), for greedy or
    sampled decoding, made once and kept on `loaded.controllers`; the first one calibrates the cost
    model when this device, model, weight format and MLX version were never seen
    (costs.cost_model), and the others share it. Greedy and sampled calls learn apart: a draft is
    accepted far less often when tokens are drawn (its base-model probability, not its being the
    top token), and one controller for both steered a greedy reply after sampled ones by the
    sampled acceptance, for a couple of hundred observations (a chat switching temperature)."""
    drafter = loaded.drafter if use_drafter else None
    kept, key = loaded.controllers, controller_key(loaded, use_drafter, sampled)
    ctl = kept.get(key)
    if ctl is None:
        costs = next(iter(kept.values())).costs if kept else None
        if costs is None or (drafter is not None and costs.draft_level is None):
            costs = cost_model(loaded, progress)
        ctl = kept[key] = Controller(costs, drafter is not None)
    return ctl
