"""Replay: greedy ReDrafter tokens/step from plain decoding's outputs, without decoding again.

Greedy ReDrafter emits exactly plain decoding's tokens g, so how many tokens each step
accepts is fixed by the drafts alone. A step whose root (the base model's token, not yet
verified) is g[i] drafts from the base hidden state that predicted g[i], adds the context
lookup beam if asked, and accepts the longest beam prefix equal to g[i+1:]; the next step's
root is the token after it. One forward pass over prompt + output gives every hidden state,
so a drafter, a beam shape or a lookup length is scored on a whole benchmark in about a
minute on a 2-core CPU, against ~20 for real decoding. It measures tokens/step only; speed
needs `redrafter-bench`. Full-sequence and step-wise forward passes round differently, so a
draft at a near tie can go the other way: expect agreement with real decoding to ~0.02
tokens/step (exact on the tests' tiny models).

    python -m redrafter_mlx.replay runs/bench.json --shapes 1x3,4x3 --lookup 0,8 [--drafter DIR]

reads the `ar` rows of a `redrafter-bench --json` file (prompt ids and output ids).
"""

import argparse
import json
import sys
from collections import defaultdict
from itertools import product
from pathlib import Path
from typing import Dict, Optional, Sequence

from . import _platform  # noqa: F401  (OpenBLAS before mlx)
from .bench import parse_shapes as parse_ints
from .errors import RedrafterError
from .graph import graph_name, parse_graph
from .tuning import parse_shapes


def replay(loaded, prompt: Sequence[int], tokens: Sequence[int], width: int, length: int, lookup: int = 0,
           ended: bool = False, hidden=None, tree: int = 0, tree_min_prob: float = None, graph: Optional[int] = None,
           context_graph: bool = True, grow_lookup: bool = True) -> Dict[str, int]:
    """Replay greedy ReDrafter steps along plain decoding's output `tokens` (prompt ids first).

    ended: the output stopped at an end-of-turn token, which the last step then also produces
    (counted in tokens/step as redrafter-bench counts it). hidden: the base model's final
    hidden states over prompt + tokens, (T, H), when already computed. tree: draft a dynamic
    tree of up to this many nodes, W wide and L - 1 deep, instead of W x L beams (nodes below
    tree_min_prob dropped; None: tree_search's default). graph: draft a GSD graph with this k
    (graph.py; needs a tree), with the context graph unless context_graph is False.
    grow_lookup: the copy grows while copies are accepted whole, as decoding does
    (lookup.CopyLength); False keeps it at `lookup` tokens. Returns
    steps, produced (tokens the decode steps produced), packed and looked_up token counts,
    drafter rows run, aliases, grafted nodes verified and accepted."""
    import mlx.core as mx
    import numpy as np

    from .beam_search import beam_search
    from .graph import graft_counts, search as graph_search
    from .lookup import MAX_GROWTH, ContextIndex, CopyLength, add_beam
    from .tree import accept, beam_of, pack
    from .tree_search import DEFAULT_MIN_PROB

    prompt, g = list(prompt), list(tokens)
    keys = ("steps", "produced", "packed", "looked_up", "drafter_rows", "aliases", "grafted", "graft_accepted")
    if not g:
        return dict.fromkeys(keys, 0)
    if graph is not None and not tree:
        raise ValueError("graph drafting needs a tree (tree > 0)")
    ids = prompt + g
    if hidden is None:
        hidden = loaded.model.hidden(mx.array(ids, dtype=mx.int32)[None])[0]  # (T, H)
    P = len(prompt)
    if ended:  # the end token is the base model's choice after the last output token
        g.append(int(mx.argmax(loaded.model.logits(hidden[-1]))))
    g_np = np.array(g + [-1], dtype=np.int32)  # -1: no choice past the output's end
    out = dict.fromkeys(keys, 0)
    index = ContextIndex()
    copy_length = CopyLength(lookup, MAX_GROWTH if grow_lookup else 1)
    i = 0  # index in g of the current root
    while i < len(g) - 1:
        context = ids[: P + i + 1]
        copy, _ = index.match(context, copy_length.length)
        sources = None
        if tree:  # as generate.stream drafts (graph.search with k None and no index is tree_search)
            d = graph_search(loaded.drafter, loaded.model, hidden[P - 1 + i], g[i], width, length - 1, tree,
                             DEFAULT_MIN_PROB if tree_min_prob is None else tree_min_prob, graph, context,
                             index if graph is not None and context_graph else None, lookup)
            beams, rows = d.rows, d.drafter_rows
            if graph is not None:
                sources = d.sources
                out["aliases"] += d.aliases
        else:
            beams = np.array(beam_search(loaded.drafter, loaded.model, hidden[P - 1 + i], mx.array(g[i]), width, length))
            rows = width * (length - 1)
        packed_tree = pack(add_beam(beams, copy) if copy.size else beams)
        # the base model's greedy choice after a node at depth d, were its path right: g[i + 1 + d]
        path, _ = accept(packed_tree, g_np[np.minimum(i + 1 + packed_tree.depth, len(g))])
        if beam_of(packed_tree, path) == beams.shape[0]:  # only the lookup beam held the accepted path
            out["looked_up"] += len(path) - 1
        if sources is not None:
            grafted, graft_accepted = graft_counts(packed_tree, sources, path)
            out["grafted"] += grafted
            out["graft_accepted"] += graft_accepted
        out["packed"] += packed_tree.size
        out["drafter_rows"] += rows
        out["steps"] += 1
        copy_length.update(copy.size, len(path) - 1)
        i += len(path)
    out["produced"] = len(g) - 1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m redrafter_mlx.replay", description=__doc__.split("\n\n")[0],
                                epilog="example: python -m redrafter_mlx.replay bench.json --shapes 1x3,4x3 --lookup 0,8")
    p.add_argument("results", type=Path, help="a redrafter-bench --json file with ar results (greedy)")
    p.add_argument("--model", default=None, help="the model the results came from (default: the one they name)")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the one found beside the model)")
    p.add_argument("--shapes", type=parse_shapes, default="1x3,4x3",
                   help="comma-separated WxL beam shapes (default: 1x3,4x3)")
    p.add_argument("--lookup", type=lambda t: parse_ints(t, "--lookup", minimum=0), default=[0],
                   help="comma-separated context-lookup lengths (default: 0)")
    p.add_argument("--tree", type=lambda t: parse_ints(t, "--tree", minimum=0), default=[0],
                   help="comma-separated node budgets of a dynamic draft tree, W wide and L - 1 deep "
                        "(0 = the W x L beams; default: 0)")
    p.add_argument("--tree-min-prob", type=float, default=None,
                   help="drop tree nodes whose path probability is below this (default: tree_search.DEFAULT_MIN_PROB, 0.2)")
    p.add_argument("--graph", type=parse_graph, default=[(None, True)], metavar="K[,K...]",
                   help="draft a GSD graph (graph.py) with k-gram length K (0: match the token alone) and the "
                        "context graph; gsdK: GSD alone; 'none': the tree; comma-separated, e.g. none,0,gsd0 "
                        "(needs --tree)")
    p.add_argument("--no-context-graph", action="store_true",
                   help="with --graph: merge inside the draft only, without grafting the context's continuations")
    p.add_argument("--no-lookup-growth", action="store_true",
                   help="keep the copy at --lookup tokens (decoding doubles it after a step that accepted all of "
                        "it, up to 4x: lookup.CopyLength)")
    p.add_argument("--limit", type=int, default=None, help="only the first N questions")
    args = p.parse_args(argv)
    shapes, lookups, trees = args.shapes, args.lookup, args.tree
    graphs = [(k, c and not args.no_context_graph) for k, c in args.graph]
    if any(k is not None for k, _ in graphs) and not all(trees):
        p.error("--graph needs --tree N (N > 0): a graph is drafted as a dynamic tree")

    from .loader import load

    try:
        if not args.results.is_file():
            raise RedrafterError(f"results file {args.results} not found")
        try:
            report = json.loads(args.results.read_text())
            rows = [r for r in report["results"] if r["mode"] == "ar"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise RedrafterError(f"{args.results} is not a redrafter-bench --json file: {e}") from e
        if not rows:
            raise RedrafterError(f"{args.results} has no ar results: run redrafter-bench with --modes ar")
        if report.get("settings", {}).get("temperature", 0.0) != 0.0:
            raise RedrafterError(f"{args.results} holds sampled outputs; replay needs greedy ones")
        loaded = load(args.model or report.get("model"), drafter=args.drafter)
        if loaded.drafter is None:
            raise RedrafterError(f"no drafter found for {loaded.name}: pass --drafter PATH")
    except RedrafterError as e:
        print(f"replay: error: {e}", file=sys.stderr)
        return 2
    import mlx.core as mx
    from tqdm import tqdm

    rows = rows[: args.limit] if args.limit else rows
    totals: Dict[tuple, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    configs = list(product(shapes, lookups, trees, graphs))
    for r in tqdm(rows, desc="replay", unit="question", file=sys.stderr):
        hidden = loaded.model.hidden(mx.array(r["prompt_tokens"] + r["tokens"], dtype=mx.int32)[None])[0]
        for config in configs:
            (w, n), c, t, (k, ctx) = config
            out = replay(loaded, r["prompt_tokens"], r["tokens"], w, n, c, r.get("finish_reason") == "eos", hidden, t,
                         args.tree_min_prob, k, ctx, not args.no_lookup_growth)
            for key in ((config, ""), (config, r.get("category", ""))):
                for name, v in out.items():
                    totals[key][name] += v
    categories = sorted({key[1] for key in totals if key[1]})

    def per_step(tot, name):
        return tot[name] / max(tot["steps"], 1)

    print(f"{'shape':<7} {'tree':>4} {'lookup':>6} {'graph':>7} {'tokens/step':>11} {'packed/step':>11} "
          f"{'rows/step':>9} {'lookup/step':>11} {'aliases':>7} {'grafted':>7} {'graft acc':>9}")
    for config in configs:
        (w, n), c, t, g = config
        tot = totals[(config, "")]
        print(f"{w}x{n:<5} {t:>4} {c:>6} {graph_name(g):>7} {per_step(tot, 'produced'):>11.3f} "
              f"{per_step(tot, 'packed'):>11.2f} {per_step(tot, 'drafter_rows'):>9.2f} {per_step(tot, 'looked_up'):>11.3f} "
              f"{per_step(tot, 'aliases'):>7.2f} {per_step(tot, 'grafted'):>7.2f} {per_step(tot, 'graft_accepted'):>9.3f}")
    if categories:
        print("\nper category: tokens/step / packed/step / drafter rows/step")
        print(f"{'config':<24} " + " ".join(f"{cat:>18}" for cat in categories))
        for config in configs:
            (w, n), c, t, g = config
            cells = []
            for cat in categories:
                tot = totals[(config, cat)]
                cells.append(f"{per_step(tot, 'produced'):.2f}/{per_step(tot, 'packed'):.1f}/{per_step(tot, 'drafter_rows'):.1f}")
            name = f"{w}x{n} t{t} l{c} {graph_name(g)}"
            print(f"{name:<24} " + " ".join(f"{cell:>18}" for cell in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
