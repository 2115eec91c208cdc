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
`--context-ceiling 8,32` prints, per drafting config and instead of its own row (`0,8,32` keeps that row
beside them), the bound that no scoring of context grafts (graph.py) can pass: every step extended in
hindsight by the context's continuation that runs furthest along the output from any node of the
accepted path (`context_ceiling`).
"""

import json
import shlex
import sys
from collections import defaultdict
from itertools import product
from pathlib import Path
from typing import Dict, Optional, Sequence

from . import _platform  # noqa: F401  (OpenBLAS before mlx)
from . import cli
from .config import WEIGHT_FORMATS
from ._platform import on_cpu
from .bench import format_of, parse_shapes as parse_ints
from .errors import DrafterMismatchError, ModelNotFoundError, NetworkError, RedrafterError
from .files import read_text_file
from .graph import graph_name, parse_graph
from .tokenizer import is_token_id
from .tree_search import DEFAULT_MIN_PROB
from .tuning import DEFAULT_LOOKUP, parse_shapes


PROG = "python -m redrafter_mlx.replay"  # how its errors, notes and --help name it (notes said "replay:")


def context_ceiling(index, context: Sequence[int], path: Sequence[int], future: Sequence[int], length: int,
                    every: bool = False) -> int:
    """How many more tokens a step could have emitted had context grafts (graph.py) been free and
    chosen in hindsight: the longest run of `future` that a continuation of the context copies
    from any node of the accepted `path`, beyond what the step accepted. An upper bound for any
    scoring of context grafts, with no probability floor and no node budget.

    context: the ids up to the step's root, indexed by `index` (a lookup.ContextIndex whose last
    `match` was this context); path: the accepted tokens, root first; future: the base model's
    tokens after the root. A node's continuation is what a context graft copies (its path's last
    3 or 2 tokens' occurrence that matches furthest back), up to `length` tokens; every: any
    occurrence of its last 2 tokens instead (what branching into every continuation could reach)."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    from .lookup import EXTENT, MIN_NGRAM

    accepted, n = len(path) - 1, MIN_NGRAM
    if every:  # every n-gram of the context that one token follows, as lookup.lookup_match scans them
        ctx = np.asarray(context, dtype=np.int64)
        windows = sliding_window_view(ctx[:-1], n) if ctx.size > n else np.zeros((0, n), dtype=np.int64)
    best = 0
    for j in range(len(path)):  # node path[j], j tokens past the root
        key = (list(context) + list(path[1 : j + 1]))[-EXTENT:]
        truth = np.asarray(future[j : j + length], dtype=np.int64)
        if every:
            hits = np.flatnonzero((windows == key[-n:]).all(axis=1)) if len(key) >= n else []
            copies = [ctx[s + n : s + n + length] for s in hits]
        else:
            copies = [index.follow(key, length, MIN_NGRAM).copy]
        for copy in copies:
            m = min(copy.size, truth.size)
            miss = np.flatnonzero(copy[:m] != truth[:m])
            run = int(miss[0]) if miss.size else m
            best = max(best, j + run - accepted)
    return best


def replay(loaded, prompt: Sequence[int], tokens: Sequence[int], width: int, length: int, lookup: int = 0,
           ended: bool = False, hidden=None, tree: int = 0, tree_min_prob: float = None, graph: Optional[int] = None,
           context_graph: bool = True, grow_lookup: bool = True, ceiling: int = 0,
           ceiling_every: bool = False) -> Dict[str, int]:
    """Replay greedy ReDrafter steps along plain decoding's output `tokens` (prompt ids first).

    ended: the output stopped at an end-of-turn token, which the last step then also produces
    (counted in tokens/step as redrafter-bench counts it). hidden: the base model's final
    hidden states over prompt + tokens, (T, H), when already computed. tree: draft a dynamic
    tree of up to this many nodes, W wide and L - 1 deep, instead of W x L beams (nodes below
    tree_min_prob dropped; None: tree_search's default). graph: draft a GSD graph with this k
    (graph.py; needs a tree), with the context graph unless context_graph is False.
    grow_lookup: the copy grows while copies are accepted whole, as decoding does
    (lookup.CopyLength); False keeps it at `lookup` tokens. ceiling: extend every step by
    `context_ceiling` with copies of up to this many tokens (ceiling_every: from any occurrence),
    for the bound no context graft can pass; the next step starts after the extension. Returns
    steps, produced (tokens the decode steps produced), packed and looked_up token counts,
    drafter rows run, aliases, grafted nodes verified and accepted."""
    import mlx.core as mx
    import numpy as np

    from .beam_search import beam_search
    from .graph import context_only, graft_counts, root_copy, search as graph_search
    from .lookup import MAX_GROWTH, ContextIndex, CopyLength, add_beam, copy_taken
    from .tree import accept, pack

    prompt, g = list(prompt), list(tokens)
    keys = ("steps", "produced", "packed", "looked_up", "drafter_rows", "aliases", "grafted", "graft_accepted",
            "ceiling_extra")
    if not g:
        return dict.fromkeys(keys, 0)
    if graph is not None and not tree:
        raise ValueError("graph drafting needs a tree (tree > 0)")
    ids = prompt + g
    if hidden is None:
        hidden = loaded.model.hidden(mx.array(ids, dtype=mx.int32)[None])[0]  # (T, H)
    P, n_out = len(prompt), len(g)
    if ended:  # the end token is the base model's choice after the last output token
        g.append(int(mx.argmax(loaded.model.logits(hidden[-1]))))
    g_np = np.array(g + [-1], dtype=np.int32)  # -1: no choice past the output's end
    out = dict.fromkeys(keys, 0)
    index = ContextIndex()
    # as generate.stream: within a step's draft limit (replay let lookup 1024 grow to 4096 where decoding stops at 1024)
    copy_length = CopyLength(lookup, MAX_GROWTH if grow_lookup else 1, limit=cli.MAX_DRAFT_TOKENS)
    min_prob = DEFAULT_MIN_PROB if tree_min_prob is None else tree_min_prob
    i = 0  # index in g of the current root
    while i < len(g) - 1:
        context = ids[: P + i + 1]
        if tree and graph is not None and context_graph:  # as generate.stream: the root's copy cut by probability
            copy = root_copy(index.match(context, copy_length.cap), min_prob)
        else:
            copy = index.match(context, copy_length.length).copy
        sources = None
        if tree:  # as generate.stream drafts (graph.search with k None and no index is tree_search)
            d = graph_search(loaded.drafter, loaded.model, hidden[P - 1 + i], g[i], width, length - 1, tree,
                             min_prob, graph, context,
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
        # accepted tokens only the copy (or a context graft) drafted, output ones only (not the end token): as
        # generate.stream counts them
        out["looked_up"] += int(np.sum(context_only(packed_tree, beams.shape[0], path, sources)[: n_out - 1 - i]))
        if sources is not None:
            grafted, graft_accepted = graft_counts(packed_tree, sources, path)
            out["grafted"] += grafted
            out["graft_accepted"] += graft_accepted
        out["packed"] += packed_tree.size
        out["drafter_rows"] += rows
        out["steps"] += 1
        copy_length.update(copy.size, copy_taken(packed_tree, beams.shape[0], path) if copy.size else 0)
        extra = 0
        if ceiling:
            extra = context_ceiling(index, context, g[i : i + len(path)], g[i + 1 :], ceiling, ceiling_every)
            out["ceiling_extra"] += extra
        i += len(path) + extra
    out["produced"] = len(g) - 1
    return out


# Cost profiles for replaying the adaptive controller (`replay_auto`): (sizes, seconds to verify
# that many tokens, drafter seconds per level), measured on the default model unless said.
PROFILES = {
    # 2-core x86_64 CPU, float32, MKL from pip (costs.calibrate, 2026-11-25)
    "mkl": ([1, 2, 4, 8, 16, 32, 64], [0.0426, 0.0468, 0.0689, 0.0992, 0.1051, 0.1480, 0.2491], 0.00165),
    # the same CPU with the system OpenBLAS
    "openblas": ([1, 2, 4, 8, 16, 32], [0.0706, 0.0790, 0.0936, 0.1160, 0.1626, 0.2712], 0.00245),
    # the same CPU with MLX's own BLAS, stored 4-bit weights: verification ~linear
    "linear": ([1, 2, 4], [0.1126, 0.2051, 0.4135], 0.01266),
    # H200 (MLX CUDA, float16): 4.9 ms for one token, 7.2-7.9 ms for 2-64; the drafter's time per
    # level there was not measured: 1 ms assumed
    "gpu": ([1, 2, 4, 8, 16, 32, 64], [0.0049, 0.0072, 0.0073, 0.0074, 0.0075, 0.0077, 0.0079], 0.001),
    # 2-core AMD EPYC, float32, MKL from pip (2026-12-01): a plain (pipelined) step 50 ms, verifying
    # one token 59, a second 21 ms more: the first drafted node is dear, drafting marginal
    "epyc": ([1, 2, 4, 8, 16, 32], [0.059, 0.080, 0.093, 0.101, 0.120, 0.191], 0.0032, 0.050),
}


def profile_costs(name: str, loaded=None):
    """A fixed cost model (never refined online, so a replay's decisions are the profile's alone):
    one of PROFILES, or "cached": this machine's cost model for `loaded`, as last measured."""
    from .costs import FixedCosts, read_cached, time_missing_drafter

    if name == "cached":
        c = read_cached(loaded) if loaded is not None else None
        if c is None:
            # (in the weight format replayed, the bench's: a run in the format "auto" gives here can cache another)
            raise RedrafterError(f"no cost model cached for {loaded.name} in {loaded.weight_format} on this machine "
                                 f"yet: run redrafter-bench --model {loaded.name} --weight-format "
                                 f"{format_of(loaded.weight_format)} --modes auto once, or pick a profile: "
                                 + ", ".join(PROFILES))
        time_missing_drafter(loaded, c)
        return FixedCosts(c.sizes.astype(int).tolist(), c.seconds.tolist(), c.draft_level)
    if name not in PROFILES:
        raise RedrafterError(f"unknown cost profile {name!r}: pick cached or one of " + ", ".join(PROFILES))
    sizes, seconds, draft_level, *plain = PROFILES[name]  # (a plain step's seconds where not the first size's)
    return FixedCosts(sizes, seconds, draft_level, plain=plain[0] if plain else None)


def replay_auto(loaded, ctl, prompt: Sequence[int], tokens: Sequence[int], ended: bool = False, hidden=None,
                graph: Optional[int] = None, context_graph: bool = True) -> Dict[str, float]:
    """Replay the adaptive controller `ctl` (control.Controller, on a fixed cost model:
    `profile_costs`) along plain decoding's output, making generate.stream's decisions in its
    order: a plain step decides the next one before its root is known (pipelining), drafting and
    lookup steps verify what the controller keeps. The controller learns as in decoding, so
    pass the same one for every question of a run. Without a drafter (ctl.has_drafter False)
    only the copy is drafted. Returns what `replay` counts plus parked (plain) steps and the
    modeled seconds (the profile's plain, drafting and verification times)."""
    import mlx.core as mx
    import numpy as np

    from .graph import DRAFTER
    from .tree import accept, pack

    prompt, g = list(prompt), list(tokens)
    keys = ("steps", "produced", "packed", "looked_up", "drafter_rows", "aliases", "grafted", "graft_accepted",
            "parked", "seconds")
    out = dict.fromkeys(keys, 0)
    if not g:
        return out
    ids = prompt + g
    if hidden is None:
        hidden = loaded.model.hidden(mx.array(ids, dtype=mx.int32)[None])[0]
    P, costs, n_out = len(prompt), ctl.costs, len(g)
    max_tokens = len(g) if not ended else 1 << 30  # what decoding was allowed (only its pipelining reads it)
    if ended:
        g.append(int(mx.argmax(loaded.model.logits(hidden[-1]))))
    g_np = np.array(g + [-1], dtype=np.int32)
    drafter = loaded.drafter if ctl.has_drafter else None
    limit = loaded.context_length
    i, kind = 0, None  # i: index in g of the current root
    while i < len(g) - 1:
        room = limit - (P + i)
        if room < 1:
            break
        ctl_room = min(room, max_tokens - (i + 1))  # as generate: no drafts past what max_tokens leaves
        if kind is None:
            kind = ctl.next_step(ids[: P + i + 1], True, ctl_room)
        out["steps"] += 1
        if kind == "plain":  # emits g[i + 1]; decides the next step before that token is known
            kind = None
            if room >= 2 and i + 2 < max_tokens:
                kind = ctl.next_step(ids[: P + i + 1], False, ctl_room - 1)
            out["packed"] += 1
            out["parked"] += 1
            out["seconds"] += costs.plain
            i += 1
            continue
        plan = ctl.plan(kind, drafter, loaded.model, hidden[P - 1 + i], g[i], ids[: P + i + 1], ctl_room, graph=graph,
                        context_graph=context_graph)
        packed = pack(plan.rows)
        path, _ = accept(packed, g_np[np.minimum(i + 1 + packed.depth, len(g))])
        node = np.full(packed.size, -1, dtype=np.int64)  # packed index -> candidate node, as generate maps it
        valid = packed.unpacker >= 0
        node[packed.unpacker[valid]] = plan.node_at[valid]
        on_path = node[path[1:]]
        draft_seconds = plan.forwards * (costs.draft_level or 0.0)
        verify_seconds = costs.verify(packed.size)
        ctl.observe(kind, plan, on_path, packed.size, draft_seconds, verify_seconds)
        copied = plan.from_lookup[on_path] & (plan.draft_bucket[on_path] < 0)
        out["looked_up"] += int(np.sum(copied[: n_out - 1 - i]))  # output tokens only, as generate.stream counts
        out["drafter_rows"] += plan.drafter_rows
        out["aliases"] += plan.aliases
        if graph is not None:
            out["grafted"] += int(np.sum(plan.source[plan.kept] != DRAFTER))
            out["graft_accepted"] += int(np.sum(plan.source[on_path] != DRAFTER))
        out["packed"] += packed.size
        out["seconds"] += draft_seconds + verify_seconds
        kind = None
        i += len(path)
    out["produced"] = len(g) - 1
    return out


def print_categories(configs, totals, categories, what: str, name, cell, width: int):
    """Per-category table under the main one: a row per config (`name(config)`), a column per
    category (and per turn, for results of redrafter-bench --turns) (`cell(config, totals)`),
    `what` saying what a cell holds. categories: ("category", name) and ("turn", "turn N") groups."""
    if not categories:
        return
    turns = {label for group, label in categories if group == "turn"}
    # the questions without a category, as redrafter-bench names them; a category named like a turn, said to be one
    labels = [label + " (category)" if group == "category" and label in turns else label or "(none)"
              for group, label in categories]
    # each column as wide as its name: a category past 18 characters pushed the cells out of their columns
    widths = [max(18, len(label)) for label in labels]
    print(f"\nper category: {what}")
    print(f"{'config':<{width}} " + " ".join(f"{label:>{w}}" for label, w in zip(labels, widths)))
    for config in configs:
        cells = [cell(config, totals[(config, cat)]) for cat in categories]
        print(f"{name(config):<{width}} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths)))


def modeled_speedup(tokens: int, seconds: float, plain: float) -> float:
    """Plain decoding's modeled time for `tokens` (a plain step's `plain` seconds each) over `seconds`."""
    return tokens * plain / seconds if seconds else 0.0


def print_auto(configs, totals, categories, per_step, plain: Dict[str, float], no_drafter: bool, replies):
    """The --auto table: per (profile, graph) config, and per category. plain: each profile's
    plain step seconds; replies: per config, (reply, tokens, modeled seconds) of each reply
    replayed, for the line on those slower than plain decoding."""

    def speedup(tot, profile):  # ("-" where no step was replayed: it read 0.00x)
        return f"{modeled_speedup(tot['produced'], tot['seconds'], plain[profile]):.2f}x" if tot["steps"] else "-"

    what = "the context copy alone" if no_drafter else "drafter + context copy"
    print(f"adaptive controller ({what}), fixed cost profiles; speedup = plain decoding's modeled time / auto's")
    print(f"{'profile':<9} {'graph':>7} {'tokens/step':>11} {'packed/step':>11} {'rows/step':>9} {'lookup/step':>11} "
          f"{'parked':>7} {'grafted':>7} {'graft acc':>9} {'speedup':>8}")
    for config in configs:
        tot = totals[(config, None)]
        print(f"{config[0]:<9} {graph_name(config[1]):>7} {per_step(tot, 'produced', '.3f'):>11} "
              f"{per_step(tot, 'packed', '.2f'):>11} {per_step(tot, 'drafter_rows', '.2f'):>9} "
              f"{per_step(tot, 'looked_up', '.3f'):>11} {per_step(tot, 'parked', '.1%'):>7} "
              f"{per_step(tot, 'grafted', '.2f'):>7} {per_step(tot, 'graft_accepted', '.3f'):>9} "
              f"{speedup(tot, config[0]):>8}")
    print_categories(configs, totals, categories, "tokens/step / packed/step / modeled speedup",
                     lambda config: f"{config[0]} {graph_name(config[1])}",
                     lambda config, tot: f"{per_step(tot, 'produced', '.2f')}/{per_step(tot, 'packed', '.1f')}/"
                                         f"{speedup(tot, config[0])}", 18)
    for config in configs:
        print(f"{config[0]} {graph_name(config[1])}: {slower_replies(replies[config], plain[config[0]])}")


def slower_replies(replies, plain: float, worst: int = 5) -> str:
    """What the controller's "never slower than plain decoding" comes to per reply, which the
    totals hide: how many replies ran slower than plain decoding would have (modeled), and the
    slowest. replies: (name, tokens produced, modeled seconds)."""
    speeds = sorted((modeled_speedup(tokens, seconds, plain), name) for name, tokens, seconds in replies
                    if seconds > 0)
    if not speeds:  # (it said "0 of 0 replies slower than plain decoding")
        return "no reply took a decoding step (each ended at its first token)"
    below = [(x, name) for x, name in speeds if x < 1.0 - 1e-9]
    said = f"{len(below)} of {len(speeds)} replies slower than plain decoding"
    return said + (" (slowest: " + ", ".join(f"{name} {x:.2f}x" for x, name in below[:worst]) + ")" if below else "")


def main(argv=None) -> int:
    p = cli.Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                   epilog="Without --auto it prints, per drafting config, tokens/step (what greedy decoding with it "
                   "emits per step), packed/step (tokens verified per step), drafter rows/step and accepted tokens "
                   "per step that only the context lookup drafted, then the same per category; speed needs "
                   "redrafter-bench. "
                   "example: redrafter-bench --modes ar --json bench.json, then "
                   "python -m redrafter_mlx.replay bench.json --shapes 1x3,4x3 --lookup 0,8")
    cli.add_version(p)
    p.add_argument("results", type=cli.path,
                   help="a redrafter-bench --json file with ar results (greedy: --modes ar, the default)")
    p.add_argument("--model", default=None, help="the model the results came from (default: the one they name)")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the one found beside the model)")
    p.add_argument("--shapes", type=parse_shapes, default=None, metavar="WxL[,WxL...]",
                   help="comma-separated WxL beam shapes: W beams of L tokens, counting the base model's own "
                        "(default: 1x3,4x3)")
    p.add_argument("--lookup", type=lambda t: parse_ints(t, "--lookup", minimum=0), default=None, metavar="N[,N...]",
                   help="comma-separated context-lookup lengths: tokens of the context's copy added to the drafts "
                        f"(0 = none, the default; redrafter-bench's fixed drafting adds {DEFAULT_LOOKUP} unless tuned)")
    p.add_argument("--tree", type=lambda t: parse_ints(t, "--tree", minimum=0), default=None, metavar="N[,N...]",
                   help="comma-separated node budgets of a dynamic draft tree, W wide and L - 1 deep "
                        "(0 = the W x L beams; default: 0)")
    p.add_argument("--tree-min-prob", type=cli.probability, default=None,
                   metavar="P", help="with --tree: drop tree nodes whose path probability is below P (default: "
                   f"{DEFAULT_MIN_PROB}, the tree search's)")
    p.add_argument("--graph", type=parse_graph, default=[(None, True)], metavar="K[,K...]",
                   help="draft a GSD graph (graph.py) with k-gram length K (0: match the token alone) and the "
                        "context graph; gsdK: GSD alone; 'none': the tree; comma-separated, e.g. none,0,gsd0 "
                        "(fixed shapes need a --tree above 0; --auto takes it alone; default: none)")
    p.add_argument("--no-context-graph", action="store_true",
                   help="with --graph: merge inside the draft only, without grafting the context's continuations")
    p.add_argument("--no-lookup-growth", action="store_true",
                   help="keep the copy at --lookup tokens (decoding doubles it after a step that accepted all of "
                        "it, up to 4x: lookup.CopyLength)")
    p.add_argument("--context-ceiling", type=lambda t: parse_ints(t, "--context-ceiling", minimum=0), default=[0],
                   metavar="L[,L...]",
                   help="also extend every step by the longest context continuation (up to L tokens) that matches "
                        "the output from any node of the accepted path: an upper bound for any scoring of context "
                        "grafts, no floor, no budget; packed/step then counts the drafted trees' tokens only "
                        "(comma-separated; 0: off, the default)")
    p.add_argument("--ceiling-every", action="store_true",
                   help="with --context-ceiling: copy from any earlier occurrence of a node's last 2 tokens, not "
                        "only from the one a context graft copies (the bound for branching into every continuation)")
    p.add_argument("--auto", type=lambda t: list(dict.fromkeys(x.strip() for x in t.split(",") if x.strip())),
                   default=None,
                   metavar="PROFILE[,PROFILE...]",
                   help="replay the adaptive controller (mode auto) instead of fixed shapes, on a fixed cost "
                        f"profile: {', '.join(PROFILES)} (measured; see replay.PROFILES) or cached (this machine's "
                        "cost model for the model); prints tokens/step, packed/step, parked share and the speedup "
                        "the profile's costs give, and the replies it makes slower than plain decoding (--graph "
                        "applies; --shapes, --lookup, --tree and --tree-min-prob are refused)")
    p.add_argument("--no-drafter", action="store_true", help="with --auto: draft from the context copy alone")
    p.add_argument("--limit", type=cli.positive, default=None, metavar="N", help="only the first N questions")
    args = p.parse_args(argv)
    shaped = [flag for flag, value in (("--shapes", args.shapes), ("--lookup", args.lookup), ("--tree", args.tree),
                                       ("--tree-min-prob", args.tree_min_prob)) if value is not None]
    if args.auto and shaped:  # the controller sizes its own drafts: they were ignored, saying nothing
        p.error(f"{', '.join(shaped)} shape fixed drafting; --auto replays the adaptive controller, which sizes "
                "its own drafts: drop one or the other")
    args.shapes = args.shapes or parse_shapes("1x3,4x3")
    args.lookup = args.lookup if args.lookup is not None else [0]
    args.tree = args.tree if args.tree is not None else [0]
    # each once (--graph 1,gsd1 --no-context-graph names gsd1 twice): configs that were listed twice replayed
    # twice, and --auto's twice on one controller, which then learned from each question twice
    graphs = list(dict.fromkeys((k, c and not args.no_context_graph) for k, c in args.graph))
    if any(k is not None for k, _ in graphs) and not all(args.tree) and not args.auto:
        p.error("--graph needs --tree N (N > 0): a graph is drafted as a dynamic tree")
    if args.auto and any(args.context_ceiling):
        p.error("--context-ceiling bounds fixed drafting; it does not apply to --auto")
    if args.no_drafter and not args.auto:
        p.error("--no-drafter replays the adaptive controller: add --auto PROFILE")
    bad_drafter = cli.drafter_error(args.drafter, args.no_drafter)  # (a missing folder was said after the model loaded)
    if bad_drafter:
        p.error(bad_drafter)
    # options that were ignored, saying nothing (and drafts no decoding would run: --shapes 99999x99999 ran on)
    if args.auto is not None and not args.auto:
        p.error(f"--auto takes one or more profiles: {', '.join(PROFILES)} or cached")
    unknown = [name for name in args.auto or [] if name != "cached" and name not in PROFILES]
    if unknown:  # it was said after the model had loaded
        p.error(f"unknown cost profile{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} for --auto: "
                f"pick cached or one of {', '.join(PROFILES)}")
    if args.no_lookup_growth and (args.auto or not any(args.lookup)):  # it was ignored, saying nothing
        p.error("--no-lookup-growth keeps fixed drafting's copy at --lookup N tokens: " + (
            "--auto replays the controller, which sizes its own copies; drop it" if args.auto
            else "add --lookup N (N > 0), or drop it"))
    if args.ceiling_every and not any(args.context_ceiling):
        p.error("--ceiling-every applies to --context-ceiling N: add it, or drop --ceiling-every")
    bad_graph = cli.context_graph_error(args.no_context_graph, any(k is not None for k, _ in args.graph))
    if bad_graph:
        p.error(bad_graph)
    if args.tree_min_prob is not None and not any(args.tree) and not args.auto:
        p.error("--tree-min-prob is a dynamic tree's floor: add --tree N (N > 0), or drop it")
    if not args.auto:
        for w, length in args.shapes:
            too_big = cli.draft_size_error(w, length, max(args.tree) or None, max(args.lookup) or None)
            if too_big:
                p.error(too_big)
    return cli.run(PROG, lambda: _run(args, graphs))


def not_a_report(text: str, e: json.JSONDecodeError) -> str:
    """What a results file that is not JSON is, in words: empty, a JSONL prompt file (redrafter-bench's
    --prompts, given in place of its --json report), or JSON cut short or damaged where `e` says."""
    if not text.strip():
        return "it is empty"
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        rows = [json.loads(line) for line in lines[:3]]
    except ValueError:
        rows = []
    if rows and all(is_question(r) for r in rows):
        return PROMPT_FILE
    return f"it is not JSON ({e.msg}: line {e.lineno}, column {e.colno}), cut short or damaged"


PROMPT_FILE = "it is a JSONL prompt file (what redrafter-bench --prompts reads): give the report its --json writes"


def is_question(row) -> bool:
    """Whether `row` is a line of a prompt file (Spec-Bench's "turns", or a one-turn "prompt")."""
    return isinstance(row, dict) and ("turns" in row or "prompt" in row) and "results" not in row


def read_results(path: Path):
    """The greedy `ar` rows of a redrafter-bench --json file, and the report; a RedrafterError
    saying what is wrong with any other file."""
    text = read_text_file(path, "results file", "give a redrafter-bench --json file")
    try:
        try:
            report = json.loads(text)
        except json.JSONDecodeError as e:  # it said "JSONDecodeError: Extra data: line 2 column 1 (char 95)"
            raise ValueError(not_a_report(text, e)) from e
        if is_question(report):  # a prompt file of one question (one line of JSON)
            raise ValueError(PROMPT_FILE)
        if not isinstance(report, dict) or not isinstance(report.get("results"), list):  # it said "KeyError: 'results'"
            raise ValueError("it holds no 'results' list (redrafter-bench --json writes an object with one)")
        if not isinstance(report.get("settings", {}), dict):
            raise ValueError("its settings are not an object")
        if not all(isinstance(r, dict) for r in report["results"]):
            raise ValueError("its results are not all objects")
        rows = [r for r in report["results"] if r.get("mode") == "ar"]
        for i, r in enumerate(rows):
            for key in ("prompt_tokens", "tokens"):
                # an empty prompt ended in a traceback from MLX; an empty reply is one that ended at its first
                # token, which the bench writes (it was refused, and with it the whole file)
                if not isinstance(r.get(key), list) or key == "prompt_tokens" and not r[key]:
                    raise ValueError(f"its ar result {i + 1} has no {key!r} list" + (", or an empty one"
                                                                                      if key == "prompt_tokens" else ""))
                if not all(is_token_id(t) for t in r[key]):
                    raise ValueError(f"its ar result {i + 1} has {key!r} that are not token ids")
            r["category"] = str(r.get("category", "") or "")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        why = str(e) if type(e) is ValueError else f"{type(e).__name__}: {e}"  # (ours: what is wrong, in words)
        raise RedrafterError(f"{path} is not a redrafter-bench --json file: {why}") from e
    if not rows and not report["results"] and report.get("complete") is False:  # (it said: run with --modes ar)
        raise RedrafterError(f"{path} holds no results: its redrafter-bench run stopped before the first question "
                             "finished")
    if not rows:
        raise RedrafterError(f"{path} has no ar results: run redrafter-bench with ar among its --modes (e.g. --modes "
                             "ar,auto)")  # (it said "with --modes ar", as if ar alone were needed)
    temperature = report.get("settings", {}).get("temperature", 0.0)
    if temperature != 0.0:  # (it said no more than that: not which run gives greedy ones)
        raise RedrafterError(f"{path} holds sampled outputs (--temperature {json.dumps(temperature)}), and replay needs "
                             "greedy ones: run redrafter-bench without --temperature (0, greedy, is the default) and "
                             "replay its report")
    return rows, report


def same_model(named: str, loaded) -> bool:
    """Whether `loaded` is the model a bench report names: by name, or a local one (the bench
    names it by its absolute path) by the file or folder it is (--model tiny from the folder
    above was said to be another model than the report's /home/me/tiny)."""
    if loaded.name == named:
        return True
    try:
        return Path(named).expanduser().exists() and Path(named).expanduser().resolve() == Path(loaded.path).resolve()
    except (OSError, ValueError):  # (a name no path can be: "embedded null byte")
        return False


def decoded_format(report: Dict) -> str:
    """The weight format a bench report's outputs were decoded with, to load them so again: its
    "weight_format", the loaded weights' description ("float32", "4-bit (group 32)"). The settings'
    --weight-format ("auto", the default) was read before, and "auto" resolves per machine: a
    GPU's run (stored weights) was replayed in float32 on a CPU, and a 4-bit run on a CPU without
    a fast BLAS in float32 on one with it. (A report without one: its settings' format.)"""
    described = report.get("weight_format")
    if isinstance(described, str) and described.strip():
        fmt = format_of(described)
        # A GPU's float16 run replayed on a CPU: MLX computes float16 there in software (~25x slower);
        # float32 drafts and verifies the same tokens but for rounding at near-ties.
        return "float32" if fmt in ("float16", "bfloat16") and on_cpu() else fmt
    asked = report.get("settings", {}).get("weight_format")
    return asked if asked in WEIGHT_FORMATS else "auto"


def _run(args, graphs) -> int:
    stop = cli.Stop()  # from the start: SIGTERM ended the process where it stood, saying nothing
    try:
        return _replay_rows(args, graphs, stop)
    except KeyboardInterrupt:
        if stop.status == 130:  # Ctrl-C: cli.run says "cancelled"
            raise
        print(f"\n{PROG}: {stop.why}", file=sys.stderr)  # (on a line of its own: the progress bar may hold the last)
        return stop.status
    finally:
        stop.restore()


def _replay_rows(args, graphs, stop) -> int:
    from .loader import attach_drafter, find_drafter, load

    shapes, lookups, trees = args.shapes, args.lookup, args.tree
    rows, report = read_results(args.results)
    if report.get("complete") is False:  # its figures covered what the run finished, saying nothing
        asked, held = report.get("settings", {}).get("limit"), len({r.get("question_id") for r in rows})
        print(f"{PROG}: note: {args.results} is the report of a redrafter-bench run that stopped early (\"complete\": "
              f"false): it holds {held} question{'' if held == 1 else 's'}"  # (it said "1 questions")
              + (f" of the {asked} asked for" if isinstance(asked, int) else ""), file=sys.stderr)
    fmt = decoded_format(report)
    named = report.get("model")
    if not args.model and not (isinstance(named, str) and named.strip()):  # it loaded the default model, saying nothing
        raise RedrafterError(f"{args.results} names no model: pass --model, the one its outputs came from")
    # The drafter is attached below: one that does not fit the model said to pass --no-drafter, which replay takes
    # only with --auto, and one found beside the model without its weights that the report's model "cannot be
    # loaded here"
    try:
        loaded = load(args.model or named, weight_format=fmt, use_drafter=False)
    except (ModelNotFoundError, NetworkError) as e:
        if args.model:
            raise
        # it said only "unknown model ...", of a name the user never typed (a model moved since the bench ran), and
        # of a hub id not cached here "could not reach the Hugging Face hub", without a word of --model
        raise type(e)(f"{args.results} names the model {named!r}, which cannot be loaded here ({e}): "
                      "pass --model, the model its outputs came from") from e
    vocab = loaded.model.args.vocab_size
    if any(t >= vocab for r in rows for key in ("prompt_tokens", "tokens") for t in r[key]):
        # an id past the embedding table crashed the process inside MLX; ids within it gave figures of nothing.
        # Said before the drafter is found: notes came first that told to pass the bench's drafter, which does not
        # fit this model
        raise RedrafterError(f"{args.results} holds token ids past {loaded.name}'s vocabulary ({vocab}): it is another "
                             "model's run; pass that model with --model")
    drafter = None if args.no_drafter else args.drafter or find_drafter(loaded.resolved)
    if drafter is not None:
        instead = "pass --drafter PATH, or --auto PROFILE --no-drafter to replay the context copy alone"
        try:
            attach_drafter(loaded, drafter, advice=f"use the drafter trained for this model ({instead})")
        except RedrafterError as e:
            if args.drafter or isinstance(e, DrafterMismatchError):
                raise
            raise type(e)(f"{e} (the drafter found for {loaded.name}: {instead})") from e
    if named and not same_model(named, loaded):  # replayed silently; only ids past the vocabulary were caught
        print(f"{PROG}: note: {args.results} was decoded by {named}, and {loaded.name} replays it: its figures are "
              "that model's only if the two are the same", file=sys.stderr)
    used = report.get("drafter")  # the bench's drafter (None: a run of ar alone loads none)
    if loaded.drafter is None and not args.no_drafter:
        # the bench's, where it is still there: a bench run with --drafter DIR named it in its report, and replay
        # said "pass --drafter PATH" of a path it held
        path = f"{shlex.quote(used)} (the bench's)" if isinstance(used, str) and used and Path(used).is_dir() \
            else "PATH"
        # (it said "or --auto --no-drafter", which --auto refuses without a profile, and to an --auto run too)
        raise RedrafterError(f"no drafter found for {loaded.name}: pass --drafter {path}" + (
            ", or --no-drafter to replay the controller on the context copy alone" if args.auto
            else " (or --auto PROFILE --no-drafter to replay the adaptive controller on the context copy alone)"))
    if (not args.drafter and not args.no_drafter and isinstance(used, str) and used and loaded.drafter_path
            and Path(used).resolve() != Path(loaded.drafter_path).resolve()):  # its figures differed, saying nothing
        print(f"{PROG}: note: {args.results} was decoded with the drafter {used}, and the one found for "
              f"{loaded.name}, {loaded.drafter_path}, replays it: pass --drafter {used} to replay the bench's",
              file=sys.stderr)
    if args.auto and not args.no_drafter and report.get("settings", {}).get("no_drafter") is True:
        # (the controller was replayed with the drafter beside the model, against a bench that drafted without one)
        print(f"{PROG}: note: {args.results} is of a redrafter-bench run with --no-drafter, and the controller is "
              f"replayed with {loaded.name}'s drafter: add --no-drafter to replay the bench's", file=sys.stderr)
    profiles = {name: profile_costs(name, loaded) for name in args.auto or []}
    import mlx.core as mx
    from tqdm import tqdm

    if args.limit:  # questions, not rows: a --turns report has a row per turn (--limit 1 replayed turn 1 alone)
        held = list(dict.fromkeys(r.get("question_id") for r in rows))
        if len(held) < args.limit:  # (said nothing)
            print(f"{PROG}: note: --limit {args.limit}, and {args.results} holds {len(held)} question"
                  f"{'' if len(held) == 1 else 's'}: all of them are replayed", file=sys.stderr)
        first = held[: args.limit]
        rows = [r for r in rows if r.get("question_id") in first]
    totals: Dict[tuple, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    replies: Dict[tuple, list] = defaultdict(list)  # --auto: per config, (reply, tokens, seconds) of each
    if args.auto:
        from .control import Controller

        configs = list(product(args.auto, graphs))
        # one controller per config for the whole run: it learns across questions, as in a bench
        # (a fixed cost model never changes, so the configs of one profile share it)
        controllers = {config: Controller(profiles[config[0]], not args.no_drafter) for config in configs}
        plain = {name: costs.plain for name, costs in profiles.items()}
    else:
        configs = list(product(shapes, lookups, trees, graphs, args.context_ceiling))
    done, status = 0, 0
    try:
        unit = "reply" if any("turn" in r for r in rows) else "question"
        for r in tqdm(rows, desc="replay", unit=unit, file=sys.stderr):
            hidden = loaded.model.hidden(mx.array(r["prompt_tokens"] + r["tokens"], dtype=mx.int32)[None])[0]
            ended = r.get("finish_reason") == "eos"
            outs = []  # a question counts once every config replayed it
            for config in configs:
                if args.auto:
                    k, ctx = config[1]
                    out = replay_auto(loaded, controllers[config], r["prompt_tokens"], r["tokens"], ended, hidden, k,
                                      ctx)
                else:
                    (w, n), c, t, (k, ctx), ceil = config
                    out = replay(loaded, r["prompt_tokens"], r["tokens"], w, n, c, ended, hidden, t,
                                 args.tree_min_prob, k, ctx, not args.no_lookup_growth, ceil, args.ceiling_every)
                outs.append((config, out))
            # redrafter-bench --turns; a group of its own (a category named "turn 1" was counted as turn 1)
            turn = (("turn", f"turn {r['turn']}"),) if "turn" in r else ()
            for config, out in outs:
                if args.auto:
                    reply = f"q{r.get('question_id', done + 1)}" + (f" turn {r['turn']}" if turn else "")
                    replies[config].append((reply, out["produced"], out["seconds"]))
                # None: all rows. (It was "", which a question without a category also is: such rows counted
                # twice in the totals, and were left out of the per-category table)
                for group in (None, ("category", r.get("category", "")), *turn):
                    for name, v in out.items():
                        totals[(config, group)][name] += v
            done += 1
    except KeyboardInterrupt:
        if not done:
            raise
        what = "replies" if unit == "reply" else "questions"  # (a --turns report: a row per turn)
        said = "cancelled" if stop.status == 130 else stop.why  # (Ctrl-C as before; SIGTERM ended it saying nothing)
        print(f"\n{PROG}: {said}; the figures below cover the first {done} of {len(rows)} {what}", file=sys.stderr)
        status = stop.status
    groups = {key[1] for key in totals if key[1] is not None}
    kinds = sorted(g for g in groups if g[0] == "category")
    # the questions without a category ("") where some have one (redrafter-bench's "(none)" row); a file without any
    # has no per-category figures but its turns'
    turns = sorted((g for g in groups if g[0] == "turn"), key=lambda g: int(g[1].split()[-1]))  # (turn 10 after 9, not 1)
    categories = (kinds if kinds != [("category", "")] else []) + turns

    def per_step(tot, name, spec):
        """tot[name] per step in `spec`, or "-" where no step was replayed (replies that ended at their first token,
        --max-tokens 1: they read 0.000 tokens/step, as if measured, where redrafter-bench shows "-")."""
        return format(tot[name] / tot["steps"], spec) if tot["steps"] else "-"

    if args.auto:
        print_auto(configs, totals, categories, per_step, plain, args.no_drafter, replies)
        return status

    def drafting(g, ceil):
        return graph_name(g) + (f"+ceil{ceil}" + ("all" if args.ceiling_every else "") if ceil else "")

    print(f"{'shape':<7} {'tree':>4} {'lookup':>6} {'graph':>15} {'tokens/step':>11} {'packed/step':>11} "
          f"{'rows/step':>9} {'lookup/step':>11} {'aliases':>7} {'grafted':>7} {'graft acc':>9}")
    for config in configs:
        (w, n), c, t, g, ceil = config
        tot = totals[(config, None)]
        print(f"{w}x{n:<5} {t:>4} {c:>6} {drafting(g, ceil):>15} {per_step(tot, 'produced', '.3f'):>11} "
              f"{per_step(tot, 'packed', '.2f'):>11} {per_step(tot, 'drafter_rows', '.2f'):>9} "
              f"{per_step(tot, 'looked_up', '.3f'):>11} {per_step(tot, 'aliases', '.2f'):>7} "
              f"{per_step(tot, 'grafted', '.2f'):>7} {per_step(tot, 'graft_accepted', '.3f'):>9}")
    print_categories(configs, totals, categories, "tokens/step / packed/step / drafter rows/step",
                     lambda config: f"{config[0][0]}x{config[0][1]} t{config[2]} l{config[1]} "
                                    f"{drafting(config[3], config[4])}",
                     lambda config, tot: f"{per_step(tot, 'produced', '.2f')}/{per_step(tot, 'packed', '.1f')}/"
                                         f"{per_step(tot, 'drafter_rows', '.1f')}", 30)
    return status


if __name__ == "__main__":
    sys.exit(main())
