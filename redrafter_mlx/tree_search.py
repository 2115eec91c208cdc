"""Drafting a dynamic tree with the draft head (the node selection of EAGLE-2, arXiv 2406.16858,
on ReDrafter's recurrent head).

Beam search (beam_search.py) drafts a fixed block of W beams of L tokens every step, however
sure or unsure the head is. A dynamic tree spends a budget of N draft nodes where the head is
sure and stops early where it is not:

- a node's score is the head's probability of its whole path from the root (the product of the
  draft probabilities along it). For a calibrated head that is the chance verification accepts
  the node, and the expected number of accepted drafts is the sum of the kept nodes' scores;
- expansion goes level by level: the `width` best nodes of the last level (the frontier) each
  propose their `width` most likely next tokens, for at most `depth` levels;
- candidates scoring below `min_prob` are dropped (a node that unlikely is not worth the cost of
  verifying it), and expansion stops once no candidate clears it, or once N kept nodes all
  outscore the best frontier node (a descendant can never outscore its ancestors);
- the N best nodes are kept: since a child never outscores its parent, they form a tree.

Measured replaying MT-Bench (20 questions, shipped SmolLM2 head, with the lookup beam): the
expected accepted drafts per step (sum of kept scores, 0.754) matched the accepted ones
(0.755), and a tree of up to 16 nodes, 4 wide, 6 deep, min_prob 0.1 emitted 1.745 tokens/step
with 4.7 packed tokens against 1.573 with 3.8 for 1 beam of 3 tokens. On all 80 questions (64
tokens) min_prob 0.2 gave 1.79 tokens/step with 3.7 packed, 0.1 1.95 with 5.4, 0.05 2.08 with 8.6,
against 1.74 with 4.1 for 1 beam of 3 and 1.99 with 8.5 for 4 beams of 3.

One host sync per level picks the frontier; the result is ragged beams (root first, -1 past a
row's end), one per leaf, ordered best path first, for tree.pack.
"""

import math
from typing import List, NamedTuple, Optional, Sequence

import mlx.core as mx
import numpy as np

from .graph import ALIAS_GRAFT, Merger, graft

DEFAULT_MIN_PROB = 0.2  # best of 0.1 / 0.2 on the 2-core CPU (docs/RESULTS.md); cheaper verification (GPU) favours lower


class Candidates(NamedTuple):
    """Draft nodes below a root, level by level, best first within a level."""

    tokens: np.ndarray  # (N,) int token ids
    parents: np.ndarray  # (N,) index of the parent node, -1 for a child of the root
    logp: np.ndarray  # (N,) float, log-probability of the node's whole path from the root
    levels: np.ndarray  # (N,) depth below the root, 1 ..
    sources: Optional[np.ndarray] = None  # (N,) graph.DRAFTER / ALIAS_GRAFT (a copy grafted under an alias)
    alias: Optional[np.ndarray] = None  # (N,) representative of an alias node (graph.py), -1 for others
    rows: int = 0  # rows the drafter ran (frontier nodes fed to it, summed over levels)
    forwards: int = 0  # levels the drafter ran (the last may have kept nothing)

    @property
    def depth(self) -> int:
        return int(self.levels.max()) if self.levels.size else 0

    @classmethod
    def empty(cls) -> "Candidates":
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, np.zeros(0), none, none, none, 0, 0)


def tree_search(drafter, base, h: mx.array, token: int, width: int, depth: int, budget: int,
                min_prob: float = DEFAULT_MIN_PROB) -> np.ndarray:
    """Draft a tree of at most `budget` nodes below the root `token`, at most `width` children
    per node and `depth` levels. h: (hidden,) base hidden state at the last accepted token.
    Returns beams (R, <= depth + 1) int32, beams[:, 0] == token, -1 past a row's end; a single
    (1, 1) root row when nothing clears `min_prob`."""
    if budget < 0:
        raise ValueError(f"tree needs budget >= 0, got {budget}")
    c = expand(drafter, base, h, token, width, depth if budget else 0, budget, min_prob)
    return _rows(token, c.tokens.tolist(), c.parents.tolist(), c.logp.tolist(), c.levels.tolist(), budget)


def expand(drafter, base, h: mx.array, token: int, width: int, depth: int, budget: Optional[int] = None,
           min_prob: float = DEFAULT_MIN_PROB, stop_prob: float = 0.0, graph: Optional[int] = None,
           prefix: Optional[Sequence[int]] = None) -> Candidates:
    """The candidate nodes of a tree drafted below `token` (see the module doc): `width` best
    children of each of the `width` best nodes per level, for at most `depth` levels, those
    whose path probability is at least `min_prob`; expansion ends early once `budget` nodes
    outscore the whole next frontier (budget None: never), or once the best frontier node's
    path probability is below `stop_prob` (no child of it can pay for another level).
    graph: GSD's k (graph.py): a node whose last k + 1 tokens match a node drafted elsewhere is
    an alias, left out of the frontier, and its representative's subtree is grafted under it
    (prefix: the context ending with `token`, for the keys of shallow nodes). None: a tree."""
    if width < 1 or depth < 0:
        raise ValueError(f"tree needs width >= 1, depth >= 0, got {width}, {depth}")
    if not 0.0 < min_prob <= 1.0:
        raise ValueError(f"min_prob must be in (0, 1], got {min_prob}")
    vocab = drafter.draft_vocab if "draft_vocab" in drafter else None
    log_min = math.log(min_prob)
    context = h.reshape(1, -1)  # (1, H)
    state = mx.zeros_like(context)  # (F, H), F = frontier size
    last = mx.array([token], dtype=mx.int32)  # (F,) token ids of the frontier
    frontier_score = np.zeros(1)  # (F,) log-probability of each frontier path
    frontier_node = np.array([-1])  # (F,) node index (-1: the root)
    tokens: List[np.ndarray] = []  # per level, the kept nodes best first
    parents: List[np.ndarray] = []
    scores: List[np.ndarray] = []
    levels: List[np.ndarray] = []
    count = fed = forwards = 0
    merger = Merger(graph, prefix if prefix is not None else [token]) if graph is not None else None
    for level in range(1, depth + 1):
        fed += int(state.shape[0])
        forwards += 1
        state = drafter.update_state(base.embed(last).astype(state.dtype), state)  # (F, H)
        logits = drafter.draft_logits(mx.broadcast_to(context, state.shape), state, base).astype(mx.float32)
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (F, V_draft)
        k = min(width, logp.shape[-1])
        top = mx.argpartition(-logp, kth=k - 1, axis=-1)[:, :k]  # (F, k), unordered
        if vocab is not None:
            top_ids = vocab[top]  # draft-vocabulary index -> token id
        else:
            top_ids = top
        top_logp = mx.take_along_axis(logp, top, axis=-1)  # (F, k)
        # one sync per level: evaluated together (np.array of each in turn waited twice, the second
        # time for the gather alone: a round trip to the device per level on a GPU)
        mx.eval(top_ids, top_logp)
        top_ids, top_logp = np.array(top_ids), np.array(top_logp)
        candidate = (frontier_score[:, None] + top_logp).reshape(-1)  # (F * k,)
        keep = np.flatnonzero(candidate >= log_min)
        if keep.size == 0:
            break
        keep = keep[np.argsort(-candidate[keep], kind="stable")]  # best first
        tokens.append(top_ids.reshape(-1)[keep])
        parents.append(frontier_node[keep // k])
        scores.append(candidate[keep])
        levels.append(np.full(keep.size, level))
        first, count = count, count + keep.size
        fresh = keep
        if merger is not None:  # aliases are not drafted from: their representative's continuation is grafted
            fresh = keep[merger.add(tokens[-1].tolist(), parents[-1].tolist()) < 0]
            if fresh.size == 0:
                break
        nxt = fresh[:width]  # the next frontier
        if stop_prob > 0 and candidate[nxt[0]] < math.log(stop_prob):
            break  # not even the best frontier node's children would pay for another level
        if budget is not None and count >= budget:
            best = np.sort(np.concatenate(scores))[-budget]
            if best >= candidate[nxt[0]]:
                break  # N nodes already outscore anything deeper
        state = state[mx.array(nxt // k, dtype=mx.int32)]
        last = mx.array(top_ids.reshape(-1)[nxt], dtype=mx.int32)
        frontier_score = candidate[nxt]
        frontier_node = np.arange(first, first + nxt.size)
    if not tokens:
        return Candidates.empty()._replace(rows=fed, forwards=forwards)
    t, p = np.concatenate(tokens).astype(np.int64), np.concatenate(parents).astype(np.int64)
    lp, lv = np.concatenate(scores), np.concatenate(levels)
    sources = np.zeros(t.size, dtype=np.int64)
    if merger is None:
        return Candidates(t, p, lp, lv, sources, np.full(t.size, -1, dtype=np.int64), fed, forwards)
    alias = np.asarray(merger.alias, dtype=np.int64)
    gt, gp, gs, gl = graft(t, p, lp, lv, alias, log_min, depth)
    return Candidates(np.concatenate([t, gt]), np.concatenate([p, gp]), np.concatenate([lp, gs]),
                      np.concatenate([lv, gl]), np.concatenate([sources, np.full(gt.size, ALIAS_GRAFT)]),
                      np.concatenate([alias, np.full(gt.size, -1, dtype=np.int64)]), fed, forwards)


def _rows(root: int, tokens, parents, scores, levels, budget: int) -> np.ndarray:
    """The `budget` best nodes as root-to-leaf rows, best path first (at each level the
    higher-scoring branch), -1 padded."""
    return node_rows(root, tokens, parents, scores, levels, budget)[0]


def node_rows(root: int, tokens, parents, scores, levels, budget: int):
    """(rows, node_at): `_rows`' rows and the node index at each of their positions (-1 at the
    root and past a row's end)."""
    if not tokens or budget == 0:
        return np.array([[root]], dtype=np.int32), np.full((1, 1), -1, dtype=np.int64)
    scores, levels = np.asarray(scores), np.asarray(levels)
    kept = np.lexsort((levels, -scores))[:budget]  # by score, a parent before its equal-scoring child
    kept_set = set(kept.tolist())
    if any(parents[i] >= 0 and parents[i] not in kept_set for i in kept):
        raise AssertionError("tree selection is not closed under parents")  # scores never grow with depth
    node_at = leaf_paths(kept, np.asarray(parents), scores)
    out = np.where(node_at >= 0, np.append(np.asarray(tokens, dtype=np.int32), root)[node_at], -1).astype(np.int32)
    out[:, 0] = root
    return out, node_at


def leaf_paths(kept: np.ndarray, parents: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Kept nodes (closed under parents) as root-to-leaf rows, best branch first at every level:
    (R, D) node index at each position, -1 at the root (column 0) and past a row's end."""
    if kept.size == 0:
        return np.full((1, 1), -1, dtype=np.int64)
    inner = {int(parents[k]) for k in kept.tolist()}
    paths = []
    for leaf in kept.tolist():
        if leaf in inner:
            continue
        path, node = [], leaf
        while node >= 0:
            path.append(node)
            node = int(parents[node])
        paths.append(path[::-1])
    paths.sort(key=lambda p: [-scores[n] for n in p])
    node_at = np.full((len(paths), max(len(p) for p in paths) + 1), -1, dtype=np.int64)
    for r, p in enumerate(paths):
        node_at[r, 1 : len(p) + 1] = p
    return node_at


def tree_nodes(beams: np.ndarray) -> int:
    """Distinct draft nodes (root excluded) in ragged beams whose rows share prefixes."""
    return len({tuple(row[: d + 1]) for row in beams.tolist() for d in range(1, len(row)) if row[d] >= 0})
