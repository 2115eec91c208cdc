"""`python -m redrafter_mlx "prompt"`: one reply from a model, streamed, with its stats.

    python -m redrafter_mlx "Explain speculative decoding in one paragraph."
    python -m redrafter_mlx --model smollm2-135m --mode ar --max-tokens 64 "Hi"
"""

import argparse
import sys

from . import _platform  # noqa: F401
from .errors import RedrafterError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m redrafter_mlx",
        description="Generate one chat reply with ReDrafter speculative decoding (or plain decoding) and print its stats.",
    )
    p.add_argument("prompt", help="the user message (wrapped in the model's chat template)")
    p.add_argument("--model", default=None, help="registry name, local path or hub id (default: smollm2-135m)")
    p.add_argument("--drafter", default=None, help="drafter folder overriding the one found beside the model")
    p.add_argument("--mode", default="auto", choices=["auto", "ar", "redrafter"],
                   help="auto = adaptive speculative decoding: each step's draft sized to this machine's measured "
                   "cost, plain decoding where drafting does not pay, the context alone without a drafter "
                   "(any of the drafting options below fixes the drafting instead); redrafter = needs a drafter; "
                   "ar = plain decoding")
    p.add_argument("--no-drafter", action="store_true",
                   help="leave the model's drafter out (auto then drafts from the context alone)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--beam-width", type=int, default=None,
                   help="beams drafted per step (default: the shape `redrafter-bench --tune` stored, else 4)")
    p.add_argument("--beam-length", type=int, default=None,
                   help="tokens per beam, the base model's own next token included (default: tuned, else 4)")
    p.add_argument("--lookup", type=int, default=None, metavar="N",
                   help="also draft up to N tokens copied from the context where its last tokens recur "
                        "(0 = off; default: tuned, else tuning.DEFAULT_LOOKUP)")
    p.add_argument("--tree", type=int, default=None, metavar="N",
                   help="draft a dynamic tree of up to N nodes (at most W children per node, L - 1 levels, "
                        "unlikely nodes dropped) instead of W x L beams (0 = beams; default: tuned, else "
                        "tuning.DEFAULT_TREE)")
    p.add_argument("--tree-min-prob", type=float, default=None, metavar="P",
                   help="drop tree nodes whose path probability is below P, in (0, 1] (default: tuned, else "
                        "tree_search.DEFAULT_MIN_PROB)")
    p.add_argument("--graph", type=int, default=None, metavar="K",
                   help="draft a graph (GSD): a drafted node whose last K + 1 tokens match a node drafted elsewhere "
                        "reuses that node's continuation, and drafted nodes whose last tokens occur in the context "
                        "get what followed there (the context graph); K = 0 matches on the token alone. Fixed "
                        "drafting needs --tree N")
    p.add_argument("--no-context-graph", action="store_true", help="with --graph: GSD alone, without the context graph")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--weight-format", default="auto", help="auto, stored, float32, float16 or bfloat16")
    args = p.parse_args(argv)

    from .generate import stream
    from .loader import load
    from .tuning import fixed_drafting

    try:
        m = load(args.model, drafter=args.drafter, weight_format=args.weight_format,
                 use_drafter=args.mode != "ar" and not args.no_drafter,
                 progress=lambda s: print(f"[{s}]", file=sys.stderr))
        print(f"[{m.name}: {m.weight_format} on {m.device}; drafter: {m.drafter_path or 'none'}]", file=sys.stderr)
        if args.mode != "ar" and not fixed_drafting(args.beam_width, args.beam_length, args.lookup, args.tree,
                                                     args.tree_min_prob):
            from .control import controller

            controller(m, not args.no_drafter, progress=lambda s: print(f"[{s}]", file=sys.stderr))
        last = None
        for last in stream(m, args.prompt, mode=args.mode, max_tokens=args.max_tokens, temperature=args.temperature,
                           top_p=args.top_p, seed=args.seed, beam_width=args.beam_width,
                           beam_length=args.beam_length, lookup=args.lookup, tree=args.tree,
                           tree_min_prob=args.tree_min_prob, system=args.system, graph=args.graph,
                           context_graph=not args.no_context_graph):
            print(last.text, end="", flush=True)
        print()
    except (RedrafterError, ValueError) as e:  # ValueError: a setting out of range (generate says which)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n[cancelled]", file=sys.stderr)
        return 130
    s = last.stats
    line = (f"[{s.mode}: {s.new_tokens} tokens, {s.tokens_per_second:.1f} tok/s, {s.tokens_per_step:.2f} tokens/step, "
            f"prefill {s.prefill_seconds:.2f}s ({s.prompt_tokens} tokens), stop: {last.finish_reason}")
    if s.mode == "redrafter":
        line += f", acceptance {s.acceptance_rate:.2f}, W={s.beam_width} L={s.beam_length}"
        line += f" tree={s.tree}" if s.tree else ""
    elif s.mode == "auto":
        c = s.controller
        line += (f", adaptive: {s.packed_per_step:.1f} tokens verified/step, {s.parked_share:.0%} of steps plain, "
                 f"verify 16 tokens = {c.get('x16', 0):.2f}x one")
    if args.graph is not None and s.steps:
        line += (f", graph: {s.aliases / s.steps:.2f} aliases, {s.grafted_tokens / s.steps:.2f} grafted and "
                 f"{s.graft_accepted_tokens / s.steps:.2f} accepted through grafts per step")
    print(line + "]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
