"""`redrafter-chat`: the terminal chat app (argparse shell around app.app.create_app).

    redrafter-chat                                  # the default model, its drafter if shipped
    redrafter-chat --model path/to/model --drafter path/to/drafter --beam-width 8 --beam-length 5
"""

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Optional

from .engine import SEED_MAX, Engine, Settings, compact, compact_digits

ENGINE_EXIT_SECONDS = 10.0  # after quitting, how long the engine may take to finish its step

EXAMPLES = """\
examples:
  redrafter-chat
      chat with the default model (smollm2-135m, fetched once into
      $REDRAFTER_CACHE), with adaptive speculative decoding: each step's draft
      is sized to this machine's measured cost (a few seconds of measuring the
      first time), plain decoding wherever drafting does not pay
  redrafter-chat --model ~/llama-7b --drafter ~/llama-7b/drafter -W 8 -L 5
      a local model folder (or .gguf file) with a ReDrafter head, a fixed beam
      of 8 x 5 tokens
  redrafter-chat --model mlx-community/Qwen3-0.6B-4bit --no-speculative
      a Hugging Face hub model (any family mlx-lm builds), plain decoding to
      start with (Ctrl+T switches)
  redrafter-chat --temperature 0.7 --top-p 0.9 --system "Answer briefly."
  redrafter-chat --temperature 0.7 --seed 1234
      sampled replies drawn with seed 1234 (the stats panel shows each sampled
      reply's seed)

in the app:
  Enter send · Up/Down prompt history · PgUp/PgDn scroll the conversation
  Esc or Ctrl+C cancel the reply (the streamed part stays) or a message
      waiting for the model to load (with text selected, Ctrl+C copies it and
      cancels nothing)
  Ctrl+N new chat · Ctrl+Y copy the last reply
  Ctrl+T speculative decoding on/off
  /seed N draws the next replies with seed N (as --seed N)
      /seed shows the last reply's · /seed off a fresh one for each
  F5/F6 beam width -/+ · F7/F8 beam length -/+ (a fixed beam)
      /auto adaptive again
  F2 stats panel on/off · Ctrl+P all commands · /help lists the /commands
  Ctrl+Q quits
"""


# The library's own argparse types (redrafter_mlx.cli) would import the whole library, MLX included,
# before --help could print or a value typed wrong be refused: these few are the chat's (tests hold them
# to cli's: they take and refuse the same values, in the same words). The checks that run after parsing
# are cli's own (`refusal`).
_INTEGER = re.compile(r"\s*([+-]?)(\d(?:_?\d)*)\s*")  # what int() reads in base 10
ECHO = 60  # longest option text a message echoes whole


def _integer_text(text: str):
    """(negative, digits) of the base-10 integer `text` writes (underscores and leading zeros, which int()'s digit
    limit counts, left out), or None where it writes none."""
    found = _INTEGER.fullmatch(text)
    return None if found is None else (found.group(1) == "-", found.group(2).replace("_", "").lstrip("0") or "0")


class _TooManyDigits(argparse.ArgumentTypeError):  # cli's: an integer past the 4300 digits int() reads
    def __init__(self, negative: bool, digits: str):
        self.negative, self.shown = negative, compact_digits(negative, digits)
        limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
        super().__init__(f"expected an integer of at most {limit} digits, not {self.shown}")


def _shown(text: str) -> str:
    integer = _integer_text(text)
    if integer is None:  # other text past ECHO characters: its start and its length (5000 x's were echoed whole)
        return repr(text) if len(text) <= ECHO else f"{text[:ECHO // 2]!r}... ({len(text)} characters)"
    return compact_digits(*integer) if len(integer[1]) > 20 else repr(text)


def _number(kind, text: str):
    try:
        value = kind(text)
    except ValueError:
        integer = _integer_text(text) if kind is int else None
        if integer is not None:  # an integer past the digits Python reads (4300)
            try:  # (the limit counts leading zeros: 000...01 is 1)
                return int(("-" if integer[0] else "") + integer[1])
            except ValueError:
                raise _TooManyDigits(*integer) from None
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, not "
                                         f"{_shown(text)}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, not {_shown(text)}")
    return value


def _integer(text: str, minimum: int, maximum: Optional[int] = None, span: str = "") -> int:
    span = span or f"at least {minimum}"
    try:
        value = _number(int, text)
    except _TooManyDigits as e:
        if e.negative or maximum is not None:
            raise argparse.ArgumentTypeError(f"must be {span}, not {e.shown}") from None
        raise
    if value < minimum or (maximum is not None and value > maximum):
        raise argparse.ArgumentTypeError(f"must be {span}, not {compact(value)}")
    return value


def _positive(text: str) -> int:
    return _integer(text, 1)


def _non_negative(text: str) -> int:
    return _integer(text, 0)


def _temperature(text: str) -> float:
    value = _number(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 = greedy), not {value:g}")
    return value


def _top_p(text: str) -> float:
    value = _number(float, text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], not {value:g}")
    return value


def _seed(text: str) -> int:  # redrafter_mlx.cli.seed's range and words
    return _integer(text, 0, SEED_MAX, "from 0 to 2**64 - 1")


def _versions() -> str:  # as redrafter_mlx.cli.versions, from the packages' metadata
    from importlib.metadata import PackageNotFoundError, version

    def of(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"redrafter-mlx {of('redrafter-mlx')} (mlx {of('mlx')}, mlx-lm {of('mlx-lm')}, textual {of('textual')})"


class _Parser(argparse.ArgumentParser):
    """One-line errors, as redrafter_mlx.cli.Parser gives the other tools (not imported: importing
    the library takes seconds during which the terminal would stay blank)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (options: {self.prog} --help)\n")


def configure_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="redrafter-chat",
        # (lines of their own, as the examples: the formatter keeps them as written, and one line of 148 characters
        # broke mid-word in an 80-column terminal)
        description="Chat with a local LLM in the terminal, with ReDrafter speculative decoding on\n"
        "MLX and live decoding stats (tok/s, tokens/step, acceptance, speedup).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=_versions(), help="print the versions and exit")
    p.add_argument("--model", metavar="NAME|PATH|HUB_ID", default=None,
                   help="registry name, local .gguf file or model folder, or Hugging Face hub id "
                   "(default: the registry default, smollm2-135m)")
    p.add_argument("--drafter", metavar="PATH", default=None,
                   help="ReDrafter head folder (default: the one found beside the model, if any; "
                   "without one, speculation drafts from the conversation alone where that pays)")
    p.add_argument("-W", "--beam-width", type=_positive, default=None, metavar="N",
                   help="fixed drafting, N beams per step (this and the four options below fix the drafting; "
                   "without any, the adaptive controller sizes each step; default: the shape `redrafter-bench "
                   "--tune` stored for this model and device, else 4)")
    p.add_argument("-L", "--beam-length", type=_positive, default=None, metavar="N",
                   help="tokens per beam, the base model's own next token included (default: tuned, else 4); 1 drafts "
                   "no beams: the conversation's copy (--lookup) alone")
    p.add_argument("--lookup", type=_non_negative, default=None, metavar="N",
                   help="also draft N tokens copied from the conversation where its last tokens recur, twice as "
                   "many after a copy taken whole, up to 4N (one more beam, checked like the others; 0 = off; "
                   "default: tuned, else 8)")
    p.add_argument("--tree", type=_non_negative, default=None, metavar="N",
                   help="draft a dynamic tree of up to N nodes (at most W children per node, L - 1 levels, "
                   "unlikely nodes dropped) instead of W x L beams (0 = beams; default: tuned, else 0)")
    p.add_argument("--tree-min-prob", type=_top_p, default=None, metavar="P",
                   help="drop tree nodes whose path probability is below P, in (0, 1] (lower: more drafted, "
                   "accepted and verified; default: tuned, else 0.2)")
    p.add_argument("--graph", type=_non_negative, default=None, metavar="K",
                   help="draft a graph (GSD): a drafted node whose last K + 1 tokens match one drafted elsewhere "
                   "reuses its continuation, and drafted nodes whose last tokens occur in the conversation get what "
                   "followed there (0: match on the token alone; fixed drafting needs --tree N)")
    p.add_argument("--no-context-graph", action="store_true", help="with --graph: GSD alone, without the context graph")
    p.add_argument("--temperature", type=_temperature, default=0.0, metavar="T",
                   help="0 = greedy (default: 0); above 0, sampled from the base model's own distribution")
    p.add_argument("--top-p", type=_top_p, default=1.0, metavar="P",
                   help="nucleus sampling mass, with --temperature above 0, in (0, 1] (default: 1)")
    p.add_argument("--seed", type=_seed, default=None, metavar="N",
                   help="random seed of every reply's sampling (with --temperature above 0), 0 to 2**64 - 1 "
                   "(default: a fresh one for each reply); the stats panel shows each sampled reply's seed, and a "
                   "seed gives the same reply to the same conversation, with or without speculation")
    p.add_argument("--max-tokens", type=_positive, default=256, metavar="N",
                   help="longest reply in tokens (default: 256)")
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="system prompt (blank or left out: the chat template's default, if it has one)")
    p.add_argument("--no-drafter", action="store_true",
                   help="leave the model's drafter out: speculation drafts from the context alone (prompt lookup: "
                   "adaptively, or only the copy of --lookup N when that is given)")
    p.add_argument("--no-speculative", action="store_true",
                   help="start with plain decoding (the drafter is still loaded, unless --no-drafter: Ctrl+T "
                        "switches live)")
    return p


def missing_path(args) -> Optional[str]:
    """A --model that names a local path that is not there, said before the chat opens (the screen
    opened, and the error waited for Ctrl+Q). A model is a path when it ends in .gguf or .safetensors,
    starts with /, . or ~, or holds a path separator without being org/name (else it may be a registry
    name or a hub id)."""
    from redrafter_mlx.registry import hub_id_in_url, looks_like_path

    model = args.model
    if model and hub_id_in_url(model) and not Path(model).expanduser().exists():
        return f"--model {model}: a web address; give the model's hub id, {hub_id_in_url(model)}"
    if model and model.strip() and looks_like_path(model) and not Path(model).expanduser().exists():
        return f"--model {model}: no such file or folder"
    return None


def unknown_name(args) -> Optional[str]:
    """A --model that is neither a path here nor a registry name nor a hub id (org/name), said before the
    chat opens (the screen opened, and then said the model did not load), in redrafter_mlx.registry.resolve's
    words. Its registry is read without loading mlx-lm (a fraction of a second, not the seconds a load takes)."""
    model = args.model
    if not model or not model.strip() or "/" in model or os.sep in model or Path(model).expanduser().exists():
        return None
    from redrafter_mlx.registry import did_you_mean, known_models

    names = known_models()
    if model in names:
        return None
    return (f"--model {model}{did_you_mean(model)}: not a known name ({', '.join(sorted(names))}), an existing .gguf "
            "file or folder, or a Hugging Face hub id (org/name)")


def fixed_drafting(args) -> bool:
    """Any drafting option fixes the drafting; without one the adaptive controller sizes each step
    (redrafter_mlx.tuning.fixed_drafting, the library's one rule)."""
    from redrafter_mlx.tuning import fixed_drafting as rule

    return rule(args.beam_width, args.beam_length, args.lookup, args.tree, args.tree_min_prob)


GRAPH_NEEDS_TREE = ("--graph with fixed drafting (-W, -L, --lookup, --tree-min-prob) needs --tree N (N > 0 nodes); "
                    "without any of those options drafting is adaptive and takes --graph as it is")


def refusal(args) -> Optional[str]:
    """What the other command lines refuse of these options (the chat has no --mode: mode auto), by
    redrafter_mlx.cli's own rules and in its words, so that the two cannot drift apart; then the chat's
    own: a graph over fixed drafting with no tree given (the tree a load would tune is not known here,
    and every reply would fail). None: nothing to refuse.

    Imported after parsing, not before: --help and the argparse types' errors answer without the
    library (it imports MLX), and every start imports it anyway to read the registry (`missing_path`)."""
    from redrafter_mlx import cli
    from redrafter_mlx.graph import graph_k_error

    said = (cli.drafter_error(args.drafter, args.no_drafter)
            or cli.sampling_error(args.temperature, args.top_p, args.seed)
            or cli.context_graph_error(args.no_context_graph, args.graph is not None)
            or cli.draft_size_error(args.beam_width, args.beam_length, args.tree, args.lookup)
            or graph_k_error(args.graph)
            or cli.unused_drafting_error("auto", args.no_drafter, args.drafter, args.beam_width, args.beam_length,
                                         args.lookup, args.tree, args.tree_min_prob, args.graph))
    if said:
        return said
    if args.graph is not None and fixed_drafting(args) and not args.tree:  # over a tuned tree too: its budget
        return GRAPH_NEEDS_TREE  # is not known here
    return None


def settings_from(args) -> Settings:
    """The chat's Settings for its parsed options (fixed drafting when any drafting option is given)."""
    fixed = fixed_drafting(args)
    return Settings(
        speculative=not args.no_speculative,
        adaptive=not fixed,
        beam_width=args.beam_width or 4,
        beam_length=args.beam_length or 4,
        beam_tuned=args.beam_width is None or args.beam_length is None,
        width_given=args.beam_width is not None,
        length_given=args.beam_length is not None,
        lookup=args.lookup,
        tree=args.tree,
        tree_min_prob=args.tree_min_prob,
        graph=args.graph,
        context_graph=not args.no_context_graph,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        system=args.system,
    )


def has_terminal() -> bool:
    """The chat draws on a terminal and reads keys from one: with input or output redirected it drew
    escape codes into the file and waited forever, spinning a core. Textual draws on standard error:
    `redrafter-chat 2>chat.log` drew the whole screen into the log and left the terminal blank."""
    return sys.stdin.isatty() and sys.stdout.isatty() and sys.stderr.isatty()


def main(argv=None) -> int:
    parser = configure_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not any(word.startswith("-") for word in extra):  # (it said "unrecognized arguments: What is MLX?")
        shown = " ".join(extra)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        parser.error(f"the chat takes no prompt on its command line ({shown!r}): type it once the chat opens; "
                     "python -m redrafter_mlx PROMPT answers one prompt in a script")
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.system is not None:  # bytes that are not UTF-8 (another locale's argv): every reply failed, the chat open
        try:
            args.system.encode("utf-8")
        except UnicodeEncodeError as e:
            parser.error(f"--system is not valid text: {e.reason} at character {e.start} (bytes that are not UTF-8: "
                         "is the terminal's locale UTF-8?)")
    if args.model is not None and not args.model.strip():  # said after the screen opened, in the library's words
        parser.error("--model is empty: give a registry name, a path or a hub id, or leave --model out (smollm2-135m)")
    try:  # the library's import (MLX's) and Textual's take seconds before the screen opens
        refused = refusal(args) or missing_path(args) or unknown_name(args)
        if refused:
            parser.error(refused)
        if not has_terminal():
            parser.error("the chat needs a terminal, and its input or output is redirected; for a reply in a script: "
                         "python -m redrafter_mlx PROMPT (or - to read the prompt from standard input)")
        from .app import create_app

        settings = settings_from(args)
        engine = Engine(args.model, args.drafter, use_drafter=not args.no_drafter)
        app = create_app(engine, settings)
    except KeyboardInterrupt:  # Ctrl+C then printed a traceback of 30-odd lines from inside those imports
        print("\nredrafter-chat: cancelled", file=sys.stderr)  # (after the "^C" the terminal echoed)
        return 130
    app.run()  # quitting cancels a running reply and closes the engine (ChatApp.on_unmount)
    status = 1 if app.return_code else 0  # Textual's 1 after an error it printed (the shell was told 0)
    if app.load_error is not None:  # the screen is gone: say it where it stays, whole (the screen said its first line)
        print(f"redrafter-chat: error: {getattr(app, 'load_details', None) or app.load_error}", file=sys.stderr)
        status = 1
    engine.close()  # the app closed it too, unless it never mounted
    # Quit during the load: nothing of it is wanted, and a load stops only between its stages (the shell
    # waited up to ENGINE_EXIT_SECONDS for it, the chat gone). Leave at once: the terminal is restored by
    # now, and what a load writes (a download, a measured cost curve) is written whole or not at all.
    try:
        ended = engine.wait(0 if app.status == "loading" else ENGINE_EXIT_SECONDS)
    except KeyboardInterrupt:  # Ctrl+C while waiting for the engine printed a traceback from inside the wait
        print("\nredrafter-chat: cancelled", file=sys.stderr)  # (after the "^C" the terminal echoed)
        status, ended = 130, False  # the engine's step still runs: leave as below
    if not ended:
        # Still inside MLX (a load, or a step longer than that): finalizing the interpreter around a
        # thread that runs MLX can abort the process ("terminate called without an active
        # exception"); leave without tearing the runtime down.
        registry = sys.modules.get("redrafter_mlx.registry")  # (imported by the load, if it got that far)
        if registry is not None:
            registry.stop_downloads()  # pip went on downloading the default model after the chat had left
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
