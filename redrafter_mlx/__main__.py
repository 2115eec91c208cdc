"""`python -m redrafter_mlx "prompt"`: one reply from a model, streamed, with its stats.

    python -m redrafter_mlx "Explain speculative decoding in one paragraph."
    python -m redrafter_mlx --model smollm2-135m --mode ar --max-tokens 64 "Hi"
    git diff | python -m redrafter_mlx --system "Review this change." -
"""

import shlex
import sys

from . import _platform  # noqa: F401
from . import cli
from .config import WEIGHT_FORMATS, train_drafter
from .errors import SettingError
from .graph import graph_k_error
from .tokenizer import is_blank
from .tree_search import DEFAULT_MIN_PROB
from .lookup import MAX_GROWTH
from .tuning import DEFAULT_LOOKUP, DEFAULT_TREE, drafting


def main(argv=None) -> int:
    p = cli.Parser(
        prog="python -m redrafter_mlx",
        description="Generate one chat reply with ReDrafter speculative decoding (or plain decoding) and print its stats.",
        epilog='example: git diff | python -m redrafter_mlx --system "Review this change." -',
    )
    cli.add_version(p)
    p.add_argument("prompt", help="the user message (wrapped in the model's chat template); - reads it from standard "
                   "input")
    p.add_argument("--model", default=None, help="registry name, local path or hub id (default: smollm2-135m)")
    p.add_argument("--drafter", default=None, help="drafter folder overriding the one found beside the model")
    p.add_argument("--mode", default="auto", choices=["auto", "ar", "redrafter"],
                   help="auto = adaptive speculative decoding: each step's draft sized to this machine's measured "
                   "cost, plain decoding where drafting does not pay, the context alone without a drafter "
                   "(any of the drafting options below fixes the drafting instead); redrafter = the same with the "
                   "drafter required: adaptive, or the fixed drafting that drafting options give; ar = plain decoding "
                   "(default: auto)")
    p.add_argument("--no-drafter", action="store_true",
                   help="leave the model's drafter out (auto then drafts from the context alone: adaptively, or only "
                   "the copy of --lookup N when that is given)")
    p.add_argument("--max-tokens", type=cli.positive, default=256, metavar="N",
                   help="longest reply in tokens (default: 256; it also stops at the end of its turn and at the "
                   "model's context length)")
    p.add_argument("--temperature", type=cli.temperature, default=0.0, metavar="T",
                   help="0 = greedy, token for token what plain decoding gives (default: 0); above 0, sampled from "
                   "the base model's own distribution")
    p.add_argument("--top-p", type=cli.probability, default=1.0, metavar="P",
                   help="sample from the smallest set of tokens holding this much probability (with --temperature "
                   "above 0), in (0, 1] (default: 1)")
    p.add_argument("--seed", type=cli.seed, default=None,
                   help="random seed for sampling (with --temperature above 0), 0 to 2**64 - 1 (default: a fresh one "
                   "each run, which the stats line says); a seed gives the same reply in every mode, as plain "
                   "decoding with it")
    p.add_argument("--beam-width", type=cli.positive, default=None, metavar="W",
                   help="beams drafted per step (default: the shape `redrafter-bench --tune` stored, else 4)")
    p.add_argument("--beam-length", type=cli.positive, default=None, metavar="L",
                   help="tokens per beam, the base model's own next token included (default: tuned, else 4); 1 "
                   "drafts no beams: mode auto with a drafter then decodes plainly, --lookup's copy left out (a tuned "
                   "1 too: plain decoding measured fastest here), and --mode redrafter drafts the copy alone")
    p.add_argument("--lookup", type=cli.non_negative, default=None, metavar="N",
                   help="also draft N tokens copied from the context where its last tokens recur, doubling "
                        f"while copies are taken whole, up to {MAX_GROWTH}N (0 = off; default: tuned, else "
                        f"{DEFAULT_LOOKUP}; none in mode auto with a drafter and a beam length of 1: see "
                        "--beam-length)")
    p.add_argument("--tree", type=cli.non_negative, default=None, metavar="N",
                   help="draft a dynamic tree of up to N nodes (at most W children per node, L - 1 levels, "
                        "unlikely nodes dropped) instead of W x L beams (0 = beams; default: tuned, else "
                        f"{DEFAULT_TREE})")
    p.add_argument("--tree-min-prob", type=cli.probability, default=None, metavar="P",
                   help="drop tree nodes whose path probability is below P, in (0, 1] (default: tuned, else "
                        f"{DEFAULT_MIN_PROB})")
    p.add_argument("--graph", type=cli.non_negative, default=None, metavar="K",
                   help="draft a graph (GSD): a drafted node whose last K + 1 tokens match a node drafted elsewhere "
                        "reuses that node's continuation, and drafted nodes whose last tokens occur in the context "
                        "get what followed there (the context graph); K = 0 matches on the token alone. Fixed "
                        "drafting needs --tree N")
    p.add_argument("--no-context-graph", action="store_true", help="with --graph: GSD alone, without the context graph")
    p.add_argument("--system", default=None,
                   help="system prompt (blank or left out: the chat template's default, if it has one)")
    p.add_argument("--weight-format", default="auto", choices=WEIGHT_FORMATS,
                   help="auto = the fastest for this device (default); stored = as in the file (e.g. 4-bit); or "
                   "float32, float16, bfloat16")
    # A prompt that begins with a short option ("-how do I exit vim?") is read as that option given the rest:
    # "argument -h/--help: ignored explicit argument 'ow do I exit vim?'", nothing saying the prompt was meant.
    words = sys.argv[1:] if argv is None else list(argv)
    words = words[: words.index("--")] if "--" in words else words
    shorts = {s for a in p._actions for s in a.option_strings if len(s) == 2}
    dashed = next((w for w in words if len(w) > 2 and w[:2] in shorts), None)
    if dashed is not None:
        shown = shlex.quote(dashed if len(dashed) <= 40 else dashed[:37] + "...")
        p.hint = f"; a prompt that begins with '-' goes after --: python -m redrafter_mlx [OPTIONS] -- {shown}"
    args, extra = p.parse_known_args(argv)
    if extra:
        words = [w for w in extra if not w.startswith("-")]
        if words and len(words) == len(extra):  # `python -m redrafter_mlx Explain MLX`: "unrecognized arguments: MLX"
            p.error(f"the prompt is one argument: quote it (\"{' '.join([args.prompt, *words])}\")")
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.prompt == "-":
        try:
            # a byte-order mark (a file saved by Notepad) is no text: the model read it (files drop it too)
            args.prompt = sys.stdin.read().removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            p.error(f"standard input is not text in {e.encoding}: {e.reason} at byte {e.start}")
        except (OSError, AttributeError):  # closed, or no standard input at all (pythonw)
            p.error("- reads the prompt from standard input, which could not be read")
        except KeyboardInterrupt:  # Ctrl-C while it waits for the prompt (typed at the terminal): was a traceback
            print(f"{cli.after_ctrl_c()}{p.prog}: cancelled", file=sys.stderr)
            return 130
    if is_blank(args.prompt):
        p.error("the prompt is empty")
    try:  # bytes that are not UTF-8 (from the command line or standard input) were refused after loading
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        p.error(f"the prompt is not UTF-8 text (at character {e.start})")
    bad_drafter = cli.drafter_error(args.drafter, args.no_drafter)
    if bad_drafter:
        p.error(bad_drafter)
    greedy = cli.sampling_error(args.temperature, args.top_p, args.seed)
    if greedy:
        p.error(greedy)
    bad_graph = cli.context_graph_error(args.no_context_graph, args.graph is not None)
    if bad_graph:
        p.error(bad_graph)
    too_big = (cli.draft_size_error(args.beam_width, args.beam_length, args.tree, args.lookup)
               or graph_k_error(args.graph))
    if too_big:
        p.error(too_big)
    unused = cli.unused_drafting_error(args.mode, args.no_drafter, args.drafter, args.beam_width, args.beam_length,
                                       args.lookup, args.tree, args.tree_min_prob, args.graph)
    if unused:
        p.error(unused)
    if args.mode == "redrafter" and args.no_drafter:
        p.error("--mode redrafter needs the drafter: drop --no-drafter, or use --mode auto (the context alone)")
    return cli.run("python -m redrafter_mlx", lambda: _reply(args))


def _reply(args) -> int:
    from .generate import stream
    from .loader import load

    m = load(args.model, drafter=args.drafter, weight_format=args.weight_format,
             use_drafter=args.mode != "ar" and not args.no_drafter,
             progress=lambda s: print(f"[{s}]", file=sys.stderr))
    # (a model of the user's own said "drafter: none", and nothing of where one comes from)
    none = "none" if args.mode == "ar" or args.no_drafter else f"none ({train_drafter(m.name)} trains one)"
    print(f"[{m.name}: {m.weight_format} on {m.device}; drafter: {m.drafter_path or none}]", file=sys.stderr)
    if not m.tokenizer.has_chat_template:  # (the reply ran on from the prompt's text, saying nothing, as the chat notes)
        print(f"[{m.name} has no chat template: the prompt reaches it as plain text to continue, not as a user turn"
              + (", after the --system text" if args.system and args.system.strip() else "") + "]", file=sys.stderr)
    shaping = [flag for flag, value in (("--beam-width", args.beam_width), ("--beam-length", args.beam_length),
                                        ("--tree", args.tree), ("--tree-min-prob", args.tree_min_prob),
                                        ("--graph", args.graph)) if value is not None]
    # they decoded plainly, dropped, saying nothing (--graph: drafting from the context alone, as without it)
    if m.drafter is None and shaping and m.tree_ok:
        raise SettingError(f"{', '.join(shaping)} shape{'s' if len(shaping) == 1 else ''} the drafter's drafts, and "
                           f"{m.name} has no drafter: pass --drafter PATH (or train one: {train_drafter(m.name)}), "
                           "or drop " + ("it" if len(shaping) == 1 else "them")
                           + " (without a drafter, --lookup N drafts the context's copy alone)")
    if args.tree_min_prob is not None and args.tree is None and m.drafter is not None and not drafting(m).tree:
        # known once loaded (a tuned tree takes the floor): stream said it in its own words, "pass tree=N"
        raise SettingError(f"{cli.FLOOR_WITH_BEAMS} (no tree is tuned for {m.name} on this device)")
    last, cancelled = None, False
    try:
        for last in stream(m, args.prompt, mode=args.mode, max_tokens=args.max_tokens, temperature=args.temperature,
                           top_p=args.top_p, seed=args.seed, beam_width=args.beam_width,
                           beam_length=args.beam_length, lookup=args.lookup, tree=args.tree,
                           tree_min_prob=args.tree_min_prob, system=args.system, graph=args.graph,
                           context_graph=not args.no_context_graph,
                           progress=lambda s: print(f"[{s}]", file=sys.stderr)):
            print(last.text, end="", flush=True)
    except KeyboardInterrupt:
        if last is None:  # while the prompt was read: no reply, no figures (cli.run says "cancelled", status 130)
            raise
        cancelled = True  # while decoding: the reply so far was printed, and its figures are said as at an end
    print()
    s = last.stats
    label = "redrafter, adaptive" if s.mode == "auto" and args.mode == "redrafter" else s.mode  # what ran
    # a reply of the prefill's token alone (--max-tokens 1, an end of turn or a cancel first) ran no decode step:
    # its rates read "0.0 tok/s, 0.00 tokens/step", as if decoding had stalled
    rates = f"{s.tokens_per_second:.1f} tok/s, {s.tokens_per_step:.2f} tokens/step" if s.steps else "no decode step"
    line = (f"[{label}: {s.new_tokens} token{'' if s.new_tokens == 1 else 's'}, {rates}, "
            f"prefill {s.prefill_seconds:.2f}s ({s.prompt_tokens} tokens), "
            f"stop: {'cancelled' if cancelled else last.finish_reason}")
    if s.steps and s.mode == "redrafter":
        line += f", acceptance {s.acceptance_rate:.2f}, W={s.beam_width} L={s.beam_length}"
        line += f" tree={s.tree}" if s.tree else ""
    elif s.steps and s.mode == "auto":
        c = s.controller
        line += (f", adaptive: {s.packed_per_step:.1f} tokens verified/step, {s.parked_share:.0%} of steps plain, "
                 f"verify 16 tokens = {c.get('x16', 0):.2f}x one")
    if args.graph is not None and s.steps:
        line += (f", graph: {s.aliases / s.steps:.2f} aliases, {s.grafted_tokens / s.steps:.2f} grafted and "
                 f"{s.graft_accepted_tokens / s.steps:.2f} accepted through grafts per step")
    if s.seed is not None and args.seed is None:  # the fresh seed this reply drew: nothing said it, so it was lost
        line += f", seed {s.seed} (--seed {s.seed} gives this reply again)"
    print(line + "]", file=sys.stderr)
    return 130 if cancelled else 0  # (Ctrl-C: cli.run's status for it)


if __name__ == "__main__":
    sys.exit(main())
