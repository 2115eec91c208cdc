"""Graph-structured drafting (GSD, arXiv 2407.16207) on the recurrent head, extended to the context.

GSD notices that draft hypotheses recur: two branches of a draft often reach the same last
few tokens, and from there their continuations tend to agree. It drafts a directed acyclic
graph instead of a tree: a candidate whose last k + 1 tokens equal those of a node drafted
elsewhere becomes a pointer to that node (an *alias* of its *representative*), is not
drafted from again, and inherits the representative's continuation. Verification needs a
tree, so the graph is unrolled: the representative's subtree is copied (*grafted*) under the
alias. Here, on ReDrafter's recurrent head:

- `Merger` finds aliases level by level while the tree is expanded (tree_search.expand): the
  node's last k + 1 tokens (the context above the root included) match a node of this step
  that is not its ancestor. An alias is kept as a draft node but never fed to the drafter, so
  its row of the drafter's next level is saved;
- `graft` copies each representative's subtree under its alias once drafting ends. The
  recurrent state depends on the whole path, so what is reused is the representative's
  continuation tokens and their conditional probabilities: a graft's score is the alias's
  plus the copied conditional log-probabilities, so scores never rise down a path. Grafts
  obey the tree's probability floor and a depth cap (cycles end there), and they count
  against the node budget like any other node: they are verified tokens;
- the context is part of the graph too (`context_grafts`): a draft node whose last tokens
  also occur in the prompt or the reply so far gets what followed there as its continuation
  (n-grams of max(k + 1, 2) .. 3 tokens, as lookup.py's beam: the longest n, and of its
  occurrences the one matching furthest back along the node's path). Today's lookup beam at
  the root is the special case of a node at depth 0: with the context graph its copy is cut
  where its calibrated probability falls under half the tree's floor (`root_copy`). A context
  graft is scored by a match probability per position in the copy and the match's extent
  (how far back it runs; lookup.Match): `CONTEXT_PRIOR` for fixed drafting, learned online by
  the adaptive controller (control.py) for mode "auto".

Which nodes are kept is decided as before (the best `budget` by score for a fixed tree, the
controller's expected tokens per second in mode "auto"); the kept set is closed under
parents, and packing, verification and acceptance are unchanged. Verification decides every
token, so output is the base model's exactly: greedy output equals plain decoding, and
sampling follows the base distribution through grafted nodes as through any other.
"""

import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .errors import compact
from .lookup import EXTENT, MIN_NGRAM, Match

# GSD's k-gram length (graph=K, --graph K) at most: a node matches on its last K + 1 tokens (Merger), and no step
# drafts deeper than generate.MAX_DRAFT_TOKENS below its root (a test checks they agree; generate imports this
# module), so a longer k-gram compares only the context above the root with itself (and keys every node by as much
# of the context, each step). 10**30 was taken as is.
MAX_GRAPH_K = 1024


def graph_k_error(k: Optional[int], name: str = "--graph") -> Optional[str]:
    """Why GSD's k-gram length `k` is refused for being too long, in the words of `name` (the flag, or the
    API's setting); None when it is not (None: not given). A negative k is refused where it is parsed."""
    if k is None or k <= MAX_GRAPH_K:
        return None
    return (f"{name} {compact(k)}: GSD's k-gram length is at most {MAX_GRAPH_K} (a node matches on its last K + 1 "
            f"tokens, and no step drafts deeper than {MAX_GRAPH_K}: a longer one compares only the context with "
            "itself)")

DRAFTER, ALIAS_GRAFT, CONTEXT_GRAFT = 0, 1, 2  # node sources
# Fixed drafting: P(a context graft's token is accepted | its parent is), per extent of the match
# (how many tokens before the copy equal the path's last ones: 2, 3, 4, 5-6, 7-8, 9-12, 13-16, 17-32,
# more) and position in the copy (1, 2, 3-4, 5-8, 9-16, 17+). Measured along greedy replies of the
# default model to 128 training prompts (alpaca, self-instruct seeds, GSM8K; not MT-Bench): at extent
# 2 a copy's first token was right 59% of the time, past 32 tokens 99% (the model repeating itself).
EXTENT_BUCKETS = np.array([2, 3, 4, 6, 8, 12, 16, 32])  # upper ends; past the last: the last row
POSITION_BUCKETS = np.array([1, 2, 4, 8, 16])  # upper ends; past the last: the last column
CONTEXT_PRIOR = np.array([
    [0.59, 0.58, 0.73, 0.78, 0.89, 0.91],
    [0.56, 0.70, 0.78, 0.79, 0.89, 0.91],
    [0.69, 0.76, 0.75, 0.82, 0.89, 0.92],
    [0.77, 0.76, 0.79, 0.85, 0.90, 0.93],
    [0.76, 0.82, 0.82, 0.89, 0.88, 0.95],
    [0.84, 0.86, 0.88, 0.90, 0.89, 0.94],
    [0.90, 0.90, 0.90, 0.90, 0.91, 0.95],
    [0.93, 0.92, 0.92, 0.93, 0.95, 0.94],
    [0.99, 0.98, 0.93, 0.96, 0.96, 0.92],
])
# The root's copy (the lookup beam) is verified beside the tree, outside its node budget, and kept
# while its calibrated path probability is at least this share of the tree's floor. Replayed along
# the replies to the 128 training prompts (tree 16 @0.2, lookup 8, k=1; a prototype of this scoring),
# tokens/step at packed tokens/step: share 1: 3.006 at 5.45, 0.5: 3.092 at 6.33, 0.25: 3.130 at 7.43
# (the growing copy of fixed drafting without the context graph: 3.082 at 6.27). A lower share trades
# verified tokens for accepted ones: worth it where verification is cheap (GPUs, MKL), less on a CPU.
ROOT_FLOOR = 0.5


def copy_prior(extent: int, size: int) -> np.ndarray:
    """CONTEXT_PRIOR's conditional probabilities for the first `size` tokens of a copy whose
    match has this extent."""
    row = CONTEXT_PRIOR[int(np.searchsorted(EXTENT_BUCKETS, max(int(extent), 1)))]
    return row[np.searchsorted(POSITION_BUCKETS, np.arange(1, size + 1))]


def root_copy(match, min_prob: float) -> np.ndarray:
    """The part of the root's copy (a lookup.Match) worth verifying beside a tree with this
    probability floor: the prefix whose calibrated path probability stays at or above
    ROOT_FLOOR x min_prob."""
    if match.copy.size == 0:
        return match.copy
    path = np.cumprod(copy_prior(match.extent, match.copy.size))
    return match.copy[: int(np.sum(path >= ROOT_FLOOR * min_prob))]


MAX_GRAFTS = 256  # grafted nodes made per step at most (the kept ones are far fewer)


class Merger:
    """GSD's merging during expansion: which new nodes are aliases of a node drafted before.

    k: GSD's k-gram length (a node matches on its last k + 1 tokens; 0: on its token alone).
    prefix: the context ending with the root token (its last k tokens start the root's
    children's keys)."""

    def __init__(self, k: int, prefix: Sequence[int]):
        if k < 0:
            raise ValueError(f"graph k must be >= 0, got {k}")
        self.k = k
        self.root_key = tuple(int(t) for t in list(prefix)[-k:]) if k else ()
        self.keys: List[tuple] = []  # per node: its last k + 1 tokens
        self.parents: List[int] = []
        self.first: Dict[tuple, int] = {}  # key -> the first non-alias node holding it
        self.alias: List[int] = []  # per node: its representative, -1 when none

    def _ancestor(self, node: int, of: int) -> bool:
        p = self.parents[of]
        while p >= 0:
            if p == node:
                return True
            p = self.parents[p]
        return False

    def add(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Register one level's new nodes (best first; parents index earlier nodes, -1 the root).
        Returns their representatives (-1: not an alias)."""
        out = np.full(len(tokens), -1, dtype=np.int64)
        for j, (t, p) in enumerate(zip(tokens, parents)):
            up = self.keys[p] if p >= 0 else self.root_key
            key = (up + (int(t),))[-(self.k + 1):]
            node = len(self.keys)
            self.keys.append(key)
            self.parents.append(int(p))
            rep = self.first.get(key)
            if rep is not None and not self._ancestor(rep, node):
                out[j] = rep
            elif rep is None:
                self.first[key] = node
            self.alias.append(int(out[j]))
        return out


def graft(tokens: np.ndarray, parents: np.ndarray, logp: np.ndarray, levels: np.ndarray, alias: np.ndarray,
          log_min: float, depth_cap: int):
    """Unroll the draft graph into a tree: under every alias, a copy of its representative's
    subtree (recursively through aliases met on the way), each copy scored by its new parent's
    score plus the original's conditional log-probability; copies below `log_min` or deeper than
    `depth_cap` are not made. Returns the extra nodes (tokens, parents, logp, levels), parents
    indexing the joint list (the originals first), in an order where parents come first."""
    N = tokens.size
    children: List[List[int]] = [[] for _ in range(N)]
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            children[p].append(i)
    cond = logp - np.where(parents >= 0, logp[np.maximum(parents, 0)], 0.0)
    out_t, out_p, out_s, out_l = [], [], [], []
    stack = [(int(a), int(alias[a])) for a in range(N) if alias[a] >= 0]  # (copy under this node, the subtree of this one)
    stack.reverse()
    while stack and len(out_t) < MAX_GRAFTS:
        dst, src = stack.pop()
        dst_logp = logp[dst] if dst < N else out_s[dst - N]
        dst_level = levels[dst] if dst < N else out_l[dst - N]
        if dst_level >= depth_cap:
            continue
        while src < N and alias[src] >= 0:
            src = int(alias[src])
        for c in children[src] if src < N else []:
            s = float(dst_logp + cond[c])
            if s < log_min or len(out_t) >= MAX_GRAFTS:
                continue
            out_t.append(int(tokens[c]))
            out_p.append(dst)
            out_s.append(s)
            out_l.append(int(dst_level) + 1)
            stack.append((N + len(out_t) - 1, c))
    return (np.asarray(out_t, dtype=np.int64), np.asarray(out_p, dtype=np.int64), np.asarray(out_s, dtype=np.float64),
            np.asarray(out_l, dtype=np.int64))


def context_grafts(index, ids: Sequence[int], tokens: Sequence[int], parents: Sequence[int],
                   levels: Sequence[int], length: int, depth_cap: int, k: int = 0) -> List[Tuple[int, Match]]:
    """For each candidate node (parents first), the context's continuation of its path:
    (node, match) where the path's last n tokens (the context `ids`, ending with the root,
    above it) occur in the context, n from 3 down to max(k + 1, 2), and match.copy followed
    the occurrence that matches furthest back (ContextIndex.follow). `index` is a
    lookup.ContextIndex that has indexed `ids` (its `match`). Copies end at `depth_cap` levels
    below the root."""
    if length < 1:
        return []
    suffix: Dict[int, tuple] = {-1: tuple(int(t) for t in list(ids)[-EXTENT:])}  # node -> its path's last tokens
    min_n = max(k + 1, MIN_NGRAM)
    out = []
    for i, (t, p) in enumerate(zip(tokens, parents)):
        key = suffix[i] = (suffix[int(p)] + (int(t),))[-EXTENT:]
        room = min(length, depth_cap - int(levels[i]))
        if room < 1:
            continue
        m = index.follow(key, room, min_n)
        if m.copy.size:
            out.append((i, m))
    return out


class GraphDraft(NamedTuple):
    """A fixed tree drafted as a graph (`search`): rows for tree.pack and what each node is."""

    rows: np.ndarray  # (R, D) root-to-leaf rows, root first, -1 past a row's end
    sources: np.ndarray  # (R, D) DRAFTER / ALIAS_GRAFT / CONTEXT_GRAFT of the node there (-1: root, past the end)
    aliases: int  # aliases among the kept nodes
    drafted: int  # drafter nodes proposed (candidates, aliases included)
    drafter_rows: int  # rows the drafter ran, summed over levels


def search(drafter, base, h, token: int, width: int, depth: int, budget: int, min_prob: float, k: Optional[int],
           ids: Sequence[int], index=None, lookup: int = 0) -> GraphDraft:
    """tree_search.tree_search drafting a graph: the same expansion with GSD's merging (`k`;
    None: none, a tree), aliases' representatives grafted, and, when `index` is given (the
    context graph), every drafter node's context continuation of up to `lookup` tokens grafted
    with `CONTEXT_PRIOR`. The `budget` best-scoring nodes are kept. ids: the context ending with
    the root `token`."""
    from .tree_search import expand, node_rows

    c = expand(drafter, base, h, token, width, depth if budget else 0, budget, min_prob, graph=k, prefix=ids)
    tokens, parents, scores, levels = (c.tokens.tolist(), c.parents.tolist(), c.logp.tolist(), c.levels.tolist())
    sources = c.sources.tolist()
    drafted = int(np.sum(c.sources == DRAFTER))
    if index is not None and tokens:
        log_min = math.log(min_prob)
        child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}
        for node, m in context_grafts(index, ids, tokens, parents, levels, lookup, max(depth, lookup), k or 0):
            at, s = node, scores[node]
            for t, p in zip(m.copy.tolist(), copy_prior(m.extent, m.copy.size).tolist()):
                s += math.log(p)
                hit = child.get((at, t))
                if hit is None:
                    if s < log_min:
                        break
                    hit = len(tokens)
                    tokens.append(t)
                    parents.append(at)
                    scores.append(s)
                    levels.append(levels[at] + 1)
                    sources.append(CONTEXT_GRAFT)
                    child[(at, t)] = hit
                else:
                    scores[hit] = max(scores[hit], s)  # a context match raises a drafted node's odds
                at, s = hit, scores[hit]
    rows, node_at = node_rows(token, tokens, parents, scores, levels, budget)
    src = np.asarray(sources + [-1], dtype=np.int64)
    kinds = np.where(node_at >= 0, src[node_at], -1)
    kept = set(node_at[node_at >= 0].tolist())
    aliases = int(sum(1 for i in kept if i < c.alias.size and c.alias[i] >= 0))
    return GraphDraft(rows, kinds, aliases, drafted, c.rows)


def graft_counts(tree, sources: np.ndarray, path: Sequence[int]) -> Tuple[int, int]:
    """(grafted nodes in the packed `tree`, accepted ones on `path`): `sources` holds the node
    kind at each position of the first rows packed (a GraphDraft's, before any lookup row)."""
    kinds = np.full(tree.size, -1, dtype=np.int64)
    part = tree.unpacker[: sources.shape[0], : sources.shape[1]]
    valid = part >= 0
    kinds[part[valid]] = sources[: part.shape[0], : part.shape[1]][valid]
    grafted = (kinds == ALIAS_GRAFT) | (kinds == CONTEXT_GRAFT)
    return int(grafted.sum()), int(grafted[list(path)[1:]].sum())


def context_only(tree, rows: int, path: Sequence[int], sources: Optional[np.ndarray] = None) -> np.ndarray:
    """(len(path) - 1,) bool: for each accepted node below the root, whether only the context drafted
    it (stats.StepStats.looked_up counts these): the lookup copy (rows `rows` on) or a context graft
    put it there, and no drafter row (the first `rows`) holds it as a node of the drafter's own or a
    GSD alias. sources: the drafter rows' node kinds (a GraphDraft's; None: all are the drafter's).
    A copy's prefix that a drafter beam also drafted is the drafter's: the step had accepted it
    without the copy."""
    drafter = np.zeros(tree.size, dtype=bool)
    part = tree.unpacker[:rows]
    held = part >= 0
    if sources is not None:
        part = part[:, : sources.shape[1]]
        held = (part >= 0) & (sources[:rows, : part.shape[1]] != CONTEXT_GRAFT)
    drafter[part[held]] = True
    return ~drafter[np.asarray(path[1:], dtype=np.int64)]


def parse_graph(text: str) -> List[Tuple[Optional[int], bool]]:
    """A CLI's --graph list -> [(k, context_graph)]: 'none' (a tree), 'K' (GSD with k-gram length
    K and the context graph), 'gsdK' (GSD alone, without the context graph); e.g. 'none,1,gsd1'.
    An argparse `type=`: a bad value stops the command with a message that says what is wrong."""
    import argparse

    out = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        if part in ("none", "tree"):
            out.append((None, True))
            continue
        alone = part.startswith("gsd")
        try:
            k = int(part[3:] if alone else part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--graph takes k-gram lengths (0, 1, 2 ...), gsdK (without the context graph) or 'none', not {part!r}") from None
        if k < 0:
            raise argparse.ArgumentTypeError(f"--graph k must be >= 0, not {compact(k)}")
        too_long = graph_k_error(k)
        if too_long:
            raise argparse.ArgumentTypeError(too_long)
        out.append((k, not alone))
    if not out:
        raise argparse.ArgumentTypeError(f"no k-gram length in {text!r}: give e.g. 1, gsd1 or none")
    return list(dict.fromkeys(out))  # each once ('none' and 'tree' are one): a list runs a variant per value


def graph_name(spec: Tuple[Optional[int], bool]) -> str:
    k, context = spec
    return "tree" if k is None else (f"graph{k}" if context else f"gsd{k}")
