"""redrafter-train: a drafter for your own model in one command.

    redrafter-train --model smollm2-135m --budget quick
    redrafter-train --model mlx-community/Qwen3-0.6B-4bit --budget standard --prompts my_prompts.jsonl

Takes a model (registry name, folder, GGUF file or hub id) to a drafter installed where
`load()` finds it, in five stages, each resumable after Ctrl-C or a crash (run the same
command again):

1. self-instruct: the model writes new tasks from the seed prompts, for wider coverage;
2. distill: the model answers the prompts greedily; its replies and hidden states are kept
   (self-distillation: the head learns what this model writes);
3. train: the draft head learns from them (the base model frozen), with a held-out
   accuracy per depth, checkpointed every few dozen steps;
4. evaluate: real decoding of held-out prompts (never MT-Bench, never the training ones):
   plain decoding, `auto` with the new drafter, and a fixed 4x5 tree with the new drafter and
   with the one already in place, if any, of the drafter's beams alone (no context copy);
5. install: the drafter, with a README and manifest.json (data, steps, time, machine,
   held-out accuracy, tokens/step, speedup), goes to the model's drafter home (beside a GGUF
   file or in a model folder, whose manifest.json then names it where the converter wrote one;
   for hub models in this package's cache), unless the drafter
   already there drafts as many tokens per step or more, or none of the new drafter's drafts were accepted
   (then `--force` installs it anyway). The drafter it replaces is kept beside it as `<name>.previous`
   (`drafter.previous/`), replacing an older one there; load() never uses it.

The work (prompts answered, checkpoints) is kept in `--work` (default: this package's cache,
`train/<model>`); delete it to start over. The prompts shipped with the package are the
self-instruct seed tasks (Apache-2.0) and GSM8K train questions (MIT); see
redrafter_mlx/data/README.md. `--prompts` uses your own instead.
"""

import contextlib
import filecmp
import hashlib
import json
import re
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

from . import _platform  # noqa: F401

import mlx.core as mx  # noqa: E402

from . import cli  # noqa: E402
from .distill import check_seeds, read_prompt_files  # noqa: E402
from .config import WEIGHT_FORMATS  # noqa: E402
from .errors import RedrafterError  # noqa: E402
from .registry import default_model_name  # noqa: E402
from .files import (model_manifest_of, one_run_in, record_drafter, replace_folder, signals_held,  # noqa: E402
                    staging_folder, unwritable_ancestor, write_json)

DATA = Path(__file__).parent / "data"
TRAIN_PROMPTS = DATA / "train_prompts.jsonl"
EVAL_PROMPTS = DATA / "eval_prompts.jsonl"
EVAL_SHAPE = (4, 5)  # the fixed tree that compares drafters: the same on every machine, with no context copy
DEPTH = 4  # draft tokens the head learns to predict per position (EVAL_SHAPE's length - 1)


@dataclass
class Budget:
    self_instruct: int  # new tasks written by the model
    prompts: int  # prompts answered (interleaved: seeds, new tasks, the rest)
    max_tokens: int  # longest reply
    steps: int  # training steps of 512 positions
    eval_prompts: int
    eval_tokens: int
    minutes_cpu: int  # wall clock on the 2-core x86 CPU, default model (SmolLM2-135M): standard took 30 min with MKL, ~60 with OpenBLAS


BUDGETS = {
    "quick": Budget(self_instruct=32, prompts=192, max_tokens=128, steps=200, eval_prompts=6, eval_tokens=96,
                    minutes_cpu=15),
    "standard": Budget(self_instruct=64, prompts=1024, max_tokens=200, steps=600, eval_prompts=12, eval_tokens=128,
                       minutes_cpu=30),
}
BUDGET_HELP = (
    "quick: 32 new tasks, 192 replies of up to 128 tokens, 200 training steps (about 15 min on a 2-core CPU for "
    "the default 135M model); standard: 64 new tasks, 1024 replies of up to 200 tokens, 600 steps (30 min there "
    "with MKL, about an hour with OpenBLAS). A budget fixes the work, not the time: a larger model takes longer "
    "about in proportion to its size, and a GPU does the same work in a fraction of the time (default: quick)"
)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", name).strip("-.") or "model"


def model_label(resolved, asked: Optional[str]) -> str:
    """The model as the work folder and the manifest name it: its full path for a local one (as typed,
    `--model .` named nothing: "# Drafter for ."), else its registry name or hub id."""
    local = asked is not None and Path(asked).expanduser().exists()
    return str(resolved.path.resolve()) if local else resolved.name


def default_work(resolved, asked: Optional[str]) -> Path:
    """The package cache's work folder for a model: by its full path for a local one. (By the name as typed,
    `--model .` worked in the cache's train/ folder itself, shared by every model run that way, each run of
    another one deleting the last one's work; `--model ..` was refused for a --work it had not been given.)"""
    from . import registry

    return registry.cache_dir() / "train" / _safe(model_label(resolved, asked))


class Log:
    """Stage headers and the figures of this run, kept in WORK/state.json across resumed runs."""

    def __init__(self, work: Path):
        self.path = work / "state.json"
        try:  # (damaged, it stopped every later run with a traceback from inside json: its figures are begun again)
            state = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except ValueError:
            state = {}
        self.state = state if isinstance(state, dict) and isinstance(state.get("seconds"), dict) else {"seconds": {}}

    def stage(self, i: int, name: str, what: str):
        print(f"[{i}/5] {name}: {what}", file=sys.stderr, flush=True)
        self._name, self._t0, self._open = name, time.perf_counter(), True

    def done(self, anew: bool = False, **figures):
        """The stage's time is added to the time it took in earlier runs (a stage resumed after Ctrl-C goes on
        from its work); `anew`: the stage was done again from the start, and this run's time replaces it."""
        seconds = self.state["seconds"]
        seconds[self._name] = round((0.0 if anew else seconds.get(self._name, 0.0)) + time.perf_counter() - self._t0, 1)
        self.state.update(figures)
        self._open = False
        self.save()

    def stopped(self):
        """At the end of a run: a stage stopped by Ctrl-C or an error keeps the time it ran, which its resumed run
        adds to (the minutes of replies distilled before Ctrl-C were missing from the stage's time)."""
        if getattr(self, "_open", False):
            try:
                self.done()
            except OSError:  # (a full disk: the error that stopped the run is the one to say)
                pass

    def save(self):
        write_json(self.path, self.state)


def shipped_groups() -> List[List[str]]:
    """The shipped training prompts, one group per source (interleaved later)."""
    groups: Dict[str, List[str]] = {}
    for line in TRAIN_PROMPTS.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            groups.setdefault(row["source"], []).append(row["prompt"])
    return list(groups.values())


def measure(loaded, drafters: Dict[str, object], prompts: List[str], max_tokens: int) -> Dict[str, Dict]:
    """Greedy decoding of `prompts`: plain, `auto` with drafters['new'], and the fixed EVAL_SHAPE
    tree with every drafter given, without the context's copy (lookup 0): what the drafter drafts itself, so a
    drafter none of whose drafts were accepted reads 1.0 tokens/step there. (With the copy decoding adds by
    default, a drafter that drafted nothing right read 2.3 to 6.9 tokens/step on a tiny model's replies, which
    repeat their prompts, and was installed.) tok/s over decode time; tokens/step over decode steps."""
    from tqdm import tqdm

    from .generate import generate

    runs = [("ar", None, {})] + [("auto", "new", {})]
    runs += [(f"fixed {EVAL_SHAPE[0]}x{EVAL_SHAPE[1]}", key, dict(beam_width=EVAL_SHAPE[0],
                                                                  beam_length=EVAL_SHAPE[1], lookup=0))
             for key in drafters]
    out: Dict[str, Dict] = {}
    loaded.drafter = None
    generate(loaded, prompts[0], mode="ar", max_tokens=8)  # warm-up: the first forwards set up kernels
    bar = tqdm(total=len(runs) * len(prompts), desc="evaluate", unit="reply")
    # `auto`'s first reply calibrates the cost model where this machine and model were never measured (seconds
    # on a CPU, minutes on a fresh CUDA GPU): said above the bar, as the other commands say it (the bar stood still)
    say = lambda text: bar.write(text, file=sys.stderr)  # noqa: E731
    plain_tokens = None
    try:  # closed however the loop ends: an error was said on the bar's line, and the bar drawn again after it
        for mode, key, kw in runs:
            loaded.drafter_path, loaded.drafter = drafters[key] if key else (None, None)
            loaded.controllers = {}  # a controller per drafter: the new one's acceptance is learned anew
            tokens = ends = steps = 0
            seconds = 0.0
            outputs = []
            for p in prompts:
                g = generate(loaded, p, mode="ar" if mode == "ar" else "redrafter" if key else "auto",
                             max_tokens=max_tokens, progress=say if mode == "auto" else None, **kw)
                tokens += g.stats.step_tokens
                ends += g.stats.end_tokens  # a step that emitted the end token emitted a token (as RunStats counts)
                steps += g.stats.steps
                seconds += g.stats.decode_seconds
                outputs.append(g.tokens)
                bar.update(1)
            if plain_tokens is None:
                plain_tokens = outputs
            same = outputs == plain_tokens
            out[f"{mode} ({key})" if key else mode] = {
                "tokens_per_step": round((tokens + ends) / max(steps, 1), 3),
                "tokens_per_second": round(tokens / max(seconds, 1e-9), 2), "identical_to_ar": same}
    finally:
        bar.close()
    ar = out["ar"]["tokens_per_second"]
    for row in out.values():
        row["speedup"] = round(row["tokens_per_second"] / max(ar, 1e-9), 3)
    return out


def held_out_accuracy(train_dir: Path) -> Optional[Dict]:
    """The best held-out validation line of the training log (accuracy per depth)."""
    from .train import log_row

    best = None
    log = train_dir / "train_log.jsonl"
    if log.is_file():
        for line in log.read_text().splitlines():
            row = log_row(line) or {}  # (a line cut short: skipped)
            if "val_acc" in row and (best is None or row["val_accepted_drafts"] > best["val_accepted_drafts"]):
                best = row
    return best


def previous_home(home: Path) -> Path:
    """Where `install` keeps the drafter it replaces: beside it, named `<name>.previous` (MODEL/drafter.previous,
    NAME.drafter.previous beside a GGUF file, drafters/models--org--name.previous in the package cache). load()
    never looks there: it finds a drafter at `home` itself (loader.find_drafter)."""
    return home.with_name(home.name + ".previous")


def install(src: Path, home: Path, manifest: Dict) -> Optional[Path]:
    """Copy the drafter folder `src` to `home` with its manifest: written beside, then swapped
    in, so an interruption leaves either the old drafter or the new one, never half of one.
    The drafter it replaces is kept at `previous_home(home)`, replacing an older one there (it was
    deleted, hours of training included), and its place is returned (None when `home` held nothing).
    A model folder the converter wrote (home is MODEL/drafter) has its manifest.json's `drafter`
    entry name the new drafter in the same moment (it went on naming the one converted with the
    model, hashes and all)."""
    from .registry import sha256_of

    home.parent.mkdir(parents=True, exist_ok=True)
    model_manifest = model_manifest_of(home)
    tmp = staging_folder(home, "new-")
    failed = None
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
        (tmp / "README.md").write_text(readme(manifest))
        if model_manifest is not None:  # (hashed before the swap: the swap and the entry change together)
            config = json.loads((tmp / "config.json").read_text())
            # the weights' dtype, as the converter's entry says it (the entry had none)
            head = mx.load(str(tmp / "model.safetensors"))[f"lm_head.{config['num_draft_layers']}.weight"]
            entry = {"source": str(src), "command": manifest["command"], "manifest": f"{home.name}/manifest.json",
                     "config": config, "dtype": str(head.dtype).replace("mlx.core.", ""),
                     "sha256": {f.name: sha256_of(f) for f in sorted(tmp.iterdir())
                                if f.name in ("config.json", "model.safetensors")}}
        with signals_held():  # (replace_folder holds them too: the manifest's entry changes with the drafter)
            previous = previous_home(home)
            kept = previous if home.exists() or home.is_symlink() else None
            replace_folder(tmp, home, keep=previous)
            if model_manifest is not None:
                failed = record_drafter(model_manifest, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if failed:  # the drafter is in place: a note, not a failed run
        print(f"redrafter-train: note: {failed}", file=sys.stderr)
    return kept


def readme(m: Dict) -> str:
    ev = m["evaluation"]
    acc = m.get("held_out") or {}
    lines = [
        f"# Drafter for {m['model']}",
        "",
        f"Trained by `{m['command']}` on {m['machine']} ({m['finished']}), budget `{m['budget']}`.",
        "",
        f"- Data: {m['data']['replies']} of the base model's own greedy replies ({m['data']['tokens']} tokens) to "
        f"{m['data']['prompts']}.",
        f"- Training: {m['training']['steps']} steps of 512 positions, depth {m['training']['depth']}, draft vocabulary "
        f"{m['training']['draft_vocab']}.",
        "- Time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in m["seconds"].items()) + ".",
    ]
    if acc:
        lines.append(f"- Held-out agreement with the base model per depth (step {acc['step']}): "
                     + " ".join(f"{a:.2f}" for a in acc["val_acc"]) + ".")
    lines += ["", f"Evaluation: {ev['prompts']} held-out prompts, {ev['max_tokens']} tokens, greedy:", "",
              "| decoding | tokens/step | tok/s | speedup | identical to plain |", "|---|---|---|---|---|"]
    for name, row in ev["results"].items():
        lines.append(f"| {name} | {row['tokens_per_step']} | {row['tokens_per_second']} | {row['speedup']}x | "
                     f"{row['identical_to_ar']} |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = cli.Parser(
        prog="redrafter-train",
        description="Train a drafter for a model and install it where redrafter-chat, redrafter-bench and load() "
                    "find it: self-instruct, distillation of the model's own replies, training, evaluation on "
                    "held-out prompts, install. Every stage resumes after Ctrl-C or a crash: run the same command "
                    "again.",
        epilog="example: redrafter-train --model smollm2-135m --budget quick",
    )
    cli.add_version(p)
    p.add_argument("--model", default=None,
                   help="the model to train a drafter for: registry name, model folder, GGUF file or hub id "
                        f"(default: {default_model_name()})")
    p.add_argument("--budget", choices=sorted(BUDGETS), default="quick", help=BUDGET_HELP)
    p.add_argument("--prompts", type=cli.path, nargs="+", default=None, metavar="FILE.jsonl",
                   help="your own training prompts (JSONL lines with 'prompt', 'instruction', 'question' or 'turns'), "
                        "instead of the shipped seed tasks and GSM8K questions; never MT-Bench")
    p.add_argument("--eval-prompts", type=cli.path, default=None, metavar="FILE.jsonl",
                   help="held-out prompts for the evaluation, in the same format: the first "
                        f"{BUDGETS['quick'].eval_prompts} (--budget quick) or {BUDGETS['standard'].eval_prompts} "
                        "(standard) that are not training prompts too (default: the shipped held-out set)")
    p.add_argument("--work", type=cli.work_folder, default=None, metavar="DIR",
                   help="folder for the resumable work (default: train/<model> in the package cache: "
                        "$REDRAFTER_CACHE, else $XDG_CACHE_HOME/redrafter-mlx or ~/.cache/redrafter-mlx); a run on "
                        "other prompts, another model, --budget or --weight-format starts it afresh, deleting the "
                        "earlier run's work (another --batch-size, --eval-prompts or --force resumes it); a folder "
                        "holding distill/, train/, state.json or prompts.json that no run wrote is refused")
    p.add_argument("--force", action="store_true",
                   help="install even when the drafter in place drafts as many tokens per step or more, or when "
                        "none of the new drafter's drafts were accepted (a drafter replaced is kept beside it, as "
                        "drafter.previous/)")
    p.add_argument("--weight-format", default="auto", choices=WEIGHT_FORMATS,
                   help="the format the base model runs in while distilling and evaluating (default: auto, the "
                        "fastest here)")
    p.add_argument("--batch-size", type=cli.positive, default=None, metavar="N",
                   help="prompts the model answers together while distilling (default: 128 on a CPU, 64 on a GPU)")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given, for the manifest
    return args


def _held_out(prompts: List[str], groups: List[List[str]], source) -> List[str]:
    """The evaluation prompts that are not training prompts too: the same file as --prompts and
    --eval-prompts measured the drafter on replies it had learned, and the inflated tokens/step
    decided whether it replaced the drafter in place."""
    training = {p for g in groups for p in g}
    kept = [p for p in prompts if p not in training]
    if not kept:
        raise RedrafterError(f"every evaluation prompt in {source} is a training prompt too: give held-out ones "
                             "(--eval-prompts) that --prompts does not hold")
    if len(kept) < len(prompts):
        print(f"evaluation: {len(prompts) - len(kept)} of {len(prompts)} prompts in {source} are training prompts too, "
              "and are left out", file=sys.stderr)
    return kept


def _fitting(loaded, prompts: List[str], source, reply: int) -> List[str]:
    """The evaluation prompts that leave room in the model's context for a reply of `reply` tokens
    (distillation skips the others too): one that left none (a 505-token prompt in a 512-token context)
    was measured on the 8 tokens it had room for."""
    limit = loaded.context_length
    kept = [p for p in prompts if len(loaded.tokenizer.prompt_ids(p)) + reply <= limit]
    if not kept:
        raise RedrafterError(f"none of the evaluation prompts in {source} leaves room for a {reply}-token reply in "
                             f"{loaded.name}'s context of {limit} tokens: give shorter ones (--eval-prompts)")
    if len(kept) < len(prompts):
        print(f"evaluation: {len(prompts) - len(kept)} of {len(prompts)} prompts are longer than the context of "
              f"{limit} tokens leaves room for with a {reply}-token reply, and are left out", file=sys.stderr)
    return kept


def _check_installable(home: Path):
    """Refuse at the start, not after an hour of work, a model whose drafter place cannot be written."""
    above = unwritable_ancestor(home)
    if above is not None:
        raise RedrafterError(f"the drafter would be installed in {home}, which cannot be written ({above} is not a "
                             "folder you can write): copy the model to a folder you can write, or give yourself "
                             "write access there")


WORK_NAMES = ("prompts.json", "distill", "train", "state.json")  # what a run keeps in its work folder


def _check_work_folder(work: Path):
    """Refuse a --work folder that holds names a run keeps there (distill/, train/, ...) but that no run
    made: starting afresh deleted them (`--work .` in a project with its own train/ folder lost it)."""
    if not work.is_dir() or (work / "data_key.txt").is_file():
        return
    try:  # a run from before data_key.txt: its state.json
        ours = isinstance(json.loads((work / "state.json").read_text()).get("seconds"), dict)
    except (OSError, ValueError, AttributeError):
        ours = False
    theirs = [f"{name}/" if (work / name).is_dir() else name for name in WORK_NAMES if (work / name).exists()]
    if theirs and not ours:
        them = "them" if len(theirs) > 1 else "it"  # ("holds train/ ... would delete them" for one entry)
        raise RedrafterError(f"--work {work} holds {', '.join(theirs)}, which redrafter-train did not write, and a run "
                             f"there would delete {them}: give a new or empty folder, or the work folder of an earlier "
                             "run")


def _start_afresh_if_other_data(work: Path, groups: List[List[str]], model: str, settings: str):
    """A work folder holds one run's data: replies distilled from other prompts or by another model
    (`model`: a digest of its weight files), and a drafter trained on them, would be resumed as if
    they were this run's (a second run with new --prompts, or `--model ./m` from another folder,
    trained 0 steps and installed the old drafter). So they go, and the run says so. So do a run's
    under other `settings` (--budget, --weight-format): a second run with --budget standard kept the
    quick run's 128-token replies and resumed its training, while its manifest said standard."""
    key = hashlib.sha256(json.dumps([groups, model, settings]).encode()).hexdigest()[:16]
    mark = work / "data_key.txt"
    stale = [work / name for name in WORK_NAMES if (work / name).exists()]
    if stale and (not mark.is_file() or mark.read_text().strip() != key):
        print(f"redrafter-train: {work} holds a run on other prompts, another model or other settings (--budget, "
              "--weight-format): starting afresh there",
              file=sys.stderr)
        for path in stale:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    mark.write_text(key + "\n")


def run(args) -> Dict:
    with contextlib.ExitStack() as held:  # the work folder, held from when it is made to the end (files.one_run_in)
        return _run(args, lambda work: held.enter_context(one_run_in(
            work, f"another redrafter-train is working in {work}: let it finish (or stop it: the work is kept), or "
                  "give this run another --work")), held.callback)


def _run(args, hold, at_exit=lambda f: None) -> Dict:
    from . import registry
    from .distill import distill, interleave, read_shards, self_instruct
    from .drafter import load_drafter
    from .loader import load
    from .train import default_warmup, open_log, save_copy, train

    budget = BUDGETS[args.budget]
    user_prompts = args.prompts is not None
    groups = read_prompt_files(args.prompts) if user_prompts else shipped_groups()
    eval_source = args.eval_prompts or EVAL_PROMPTS
    eval_set = _held_out(read_prompt_files([eval_source])[0], groups, eval_source)[: budget.eval_prompts]
    # self-instruct's seeds: every prompt the user gave (the first file's alone were, so the order of the
    # files decided whether a run was refused), else the shipped seed tasks
    seeds = [p for g in groups for p in g] if user_prompts else groups[0]
    check_seeds(seeds)  # before the model loads
    resolved = registry.resolve(args.model)
    work = args.work or default_work(resolved, args.model)
    _check_work_folder(work)  # before the model loads
    _check_installable(resolved.drafter_home)
    loaded = load(args.model, weight_format=args.weight_format, use_drafter=False,
                  progress=lambda m: print(m, file=sys.stderr))
    if not loaded.tokenizer.has_chat_template:  # trained on that, saying nothing
        print(f"redrafter-train: note: {resolved.name} has no chat template, so the prompts reach it as plain text to "
              "continue (as chat messages will): for a chat model, give it one (python -m convert --chat-template)",
              file=sys.stderr)
    eval_set = _fitting(loaded, eval_set, eval_source, budget.eval_tokens)
    work.mkdir(parents=True, exist_ok=True)
    hold(work)  # before any of it is read or changed
    from .costs import model_files_digest

    _start_afresh_if_other_data(work, groups, model_files_digest(resolved.path), f"{args.budget} {args.weight_format}")
    log = Log(work)
    at_exit(log.stopped)  # (while the work folder is still held)
    batch_size = args.batch_size or (128 if mx.default_device().type == mx.cpu else 64)
    print(f"redrafter-train: {resolved.name} on {_platform.device_description()}, budget {args.budget} "
          f"(work in {work})", file=sys.stderr)

    # 1. self-instruct: new tasks from the seeds (the shipped seed tasks, or the user's prompts). The
    # prompt list is fixed once made, so a resumed run answers the same prompts.
    chosen = work / "prompts.json"
    key = hashlib.sha256(json.dumps([groups, asdict(budget)]).encode()).hexdigest()[:16]
    try:  # (one cut short by a crash in an older version's write: chosen again, from the tasks kept)
        kept = json.loads(chosen.read_text()) if chosen.is_file() else {}
    except ValueError:
        kept = {}
    if not (isinstance(kept, dict) and isinstance(kept.get("tasks"), list) and isinstance(kept.get("prompts"), list)):
        kept = {}  # (JSON of another shape, a hand edit: it failed with an AttributeError traceback; chosen again)
    log.stage(1, "self-instruct", f"{budget.self_instruct} new tasks from {len(seeds)} seed prompts")
    if kept.get("key") == key:
        tasks, prompts = kept["tasks"], kept["prompts"]
    else:
        tasks = self_instruct(loaded, seeds, budget.self_instruct, work / "distill" / "self_instruct.jsonl",
                              batch_size=min(batch_size, 16))
        prompts = interleave(groups + [tasks])[: budget.prompts]
        write_json(chosen, {"key": key, "tasks": tasks, "prompts": prompts}, indent=None)  # whole or not at all
    log.done()

    # 2. distill: the model's own replies
    log.stage(2, "distill", f"{len(prompts)} prompts, replies of up to {budget.max_tokens} tokens")
    distill(loaded, prompts, work / "distill", batch_size, budget.max_tokens, max_prompt_tokens=256)
    samples = list(read_shards(work / "distill"))
    if not samples:
        raise RedrafterError(f"distillation produced no replies in {work / 'distill'}")
    n_tokens = sum(len(s["reply"]) for s in samples)
    log.done(replies=len(samples), reply_tokens=n_tokens)

    # 3. train
    depth, vocab = DEPTH, 4096
    log.stage(3, "train", f"{budget.steps} steps on {len(samples)} replies ({n_tokens} tokens)")
    with open_log(work / "train") as f:
        drafter = train(loaded.model, samples, work / "train", depth=depth, steps=budget.steps, batch=512, lr=1e-3,
                        warmup=default_warmup(budget.steps), weight_decay=0.01, draft_vocab=vocab,
                        eos_ids=loaded.tokenizer.eos_token_ids, save_every=min(25, max(budget.steps // 4, 1)), log=f,
                        val_every=max(budget.steps // 4, 1), save_dtype=mx.float16,
                        val_advice="give more prompts (--prompts)" if user_prompts else "use --budget standard")
    final = work / "train" / "drafter"
    save_copy(drafter, final, mx.float16, {"training": {"steps": budget.steps, "depth": depth}})
    trained = work / "train" / "best" if (work / "train" / "best" / "config.json").is_file() else final
    log.done()

    # 4. evaluate, against the drafter in place
    home = resolved.drafter_home
    from .loader import find_drafter

    current = find_drafter(resolved)
    drafters = {"new": (trained, load_drafter(trained, loaded.model))}
    # the same command run again after it installed: the drafter in place is this one (it was said "not installed: the
    # drafter in place drafts as many tokens per step", and measured twice over, a quarter of the evaluation's time)
    weights = "model.safetensors"
    already = current is not None and (current / weights).is_file() and (current / "config.json").is_file() \
        and filecmp.cmp(current / weights, trained / weights, shallow=False)
    if current is not None and not already:
        try:
            drafters["in place"] = (current, load_drafter(current, loaded.model))
        except RedrafterError as e:
            # (it said "so it is replaced" before the evaluation, and a new drafter none of whose drafts were accepted
            # was then not installed)
            print(f"the drafter in place ({current}) does not load, so the new one is not compared with it (it replaces "
                  f"it if any of its drafts are accepted, or with --force): {e}", file=sys.stderr)
    log.stage(4, "evaluate", f"{len(eval_set)} held-out prompts, {budget.eval_tokens} tokens: plain, auto, and "
                             f"fixed {EVAL_SHAPE[0]}x{EVAL_SHAPE[1]} (no context copy) for {', '.join(drafters)}")
    results = measure(loaded, drafters, eval_set, budget.eval_tokens)
    # every run measures again: the manifest's time is this evaluation's (a run again with --force, every stage done,
    # recorded the sum of both evaluations as the time it took)
    log.done(anew=True, evaluation=results)

    # 5. install
    shape = f"fixed {EVAL_SHAPE[0]}x{EVAL_SHAPE[1]}"
    new_tps = results[f"{shape} (new)"]["tokens_per_step"]
    old = results.get(f"{shape} (in place)")
    log.stage(5, "install", str(home))
    manifest = {
        "model": model_label(resolved, args.model), "budget": args.budget, "budget_settings": asdict(budget),
        # (from sys.argv when its name was redrafter-train: python -m redrafter_mlx.autotrain was recorded as
        # "--model M --budget B", its --prompts and other options left out)
        "command": shlex.join(["redrafter-train", *getattr(args, "argv", [])]),
        "machine": _platform.device_description(), "mlx": mx.__version__, "weight_format": loaded.weight_format,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "data": {"prompts": "your prompts (" + ", ".join(str(p) for p in args.prompts) + ")" if user_prompts
                 else "the shipped self-instruct seed tasks (Apache-2.0) and GSM8K train questions (MIT), plus "
                      f"{len(tasks)} tasks the model wrote from the seeds",
                 "replies": len(samples), "tokens": n_tokens},
        "training": {"steps": budget.steps, "depth": depth, "draft_vocab": vocab, "from": trained.name},
        "held_out": held_out_accuracy(work / "train"),
        "seconds": log.state["seconds"],
        "evaluation": {"prompts": len(eval_set), "max_tokens": budget.eval_tokens, "results": results},
    }
    # a drafter none of whose drafts were accepted (1.0 tokens/step: the verified token alone) only slows decoding
    installed = args.force or (not already and new_tps > 1.0 and (old is None or new_tps > old["tokens_per_step"]))
    previous = install(trained, home, manifest) if installed else None
    log.done(installed=str(home) if installed or already else None)
    manifest["installed"] = str(home) if installed else None
    manifest["previous"] = str(previous) if previous else None  # (not in the installed manifest: this run's news)
    manifest["already_installed"] = already and not installed
    manifest["kept_at"] = str(trained)
    return manifest


def report(m: Dict, out=None):
    out = out or sys.stdout
    ev = m["evaluation"]["results"]
    auto, shape = ev["auto (new)"], f"fixed {EVAL_SHAPE[0]}x{EVAL_SHAPE[1]}"
    print(f"held-out prompts: plain {ev['ar']['tokens_per_second']} tok/s; auto with the new drafter "
          f"{auto['tokens_per_second']} tok/s, {auto['tokens_per_step']} tokens/step, speedup {auto['speedup']}x; "
          f"{shape}: {ev[shape + ' (new)']['tokens_per_step']} tokens/step"
          + (f" (the drafter in place: {ev[shape + ' (in place)']['tokens_per_step']})"
             if shape + " (in place)" in ev else ""), file=out)
    differed = [name for name, row in ev.items() if not row["identical_to_ar"]]
    if differed:  # (recorded in the manifest alone: greedy output is promised identical to plain decoding)
        print(f"warning: {', '.join(differed)} gave replies that differ from plain decoding on the held-out prompts, "
              "which greedy decoding must never do: please report it", file=out)
    if m["installed"]:
        print(f"installed {m['installed']} (redrafter-chat --model {m['model']} and load() use it)"
              + (f"; the drafter it replaces is kept at {m['previous']} (put it back in its place to use it again)"
                 if m.get("previous") else ""), file=out)
    elif m.get("already_installed"):
        print(f"already installed: the drafter in place is this one, installed by an earlier run (redrafter-chat "
              f"--model {m['model']} and load() use it; --force installs it again)", file=out)
    elif ev[shape + " (new)"]["tokens_per_step"] <= 1.0:
        print(f"not installed: none of the new drafter's drafts were accepted on the held-out prompts "
              f"({ev[shape + ' (new)']['tokens_per_step']} tokens/step at {shape}), so it would only slow decoding; "
              f"it is at {m['kept_at']} (more data and steps, --budget standard, may help; --force installs it)",
              file=out)
    else:
        tie = ev[shape + " (in place)"]["tokens_per_step"] == ev[shape + " (new)"]["tokens_per_step"]
        print(f"not installed: the drafter in place drafts {'as many' if tie else 'more'} tokens per step; "
              f"the new one is at {m['kept_at']} "
              "(--force installs it)", file=out)


RESUME = "run the same command again to resume"


def main(argv=None) -> int:
    args = parse_args(argv)
    return cli.run("redrafter-train", lambda: _train(args), resume=RESUME)


def _train(args):
    try:
        report(run(args))
    except KeyboardInterrupt as e:  # every stage keeps its work: say so (cli.run puts it on a line of its own)
        raise KeyboardInterrupt(f"interrupted; {RESUME}") from e


if __name__ == "__main__":
    sys.exit(main())
