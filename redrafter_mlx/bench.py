"""redrafter-bench: tokens/s and tokens/step of plain and ReDrafter decoding on a prompt set.

    redrafter-bench --model smollm2-135m --prompts ../shared/data/mt_bench.jsonl --limit 10 \
        --modes ar,redrafter --beam-width 4 --beam-length 4 --json out.json

Prompts are Spec-Bench JSONL (`{"question_id", "category", "turns": [...]}`); the first turn
is wrapped in the model's chat template. With `--turns N` each question is a conversation of its
first N turns, as Spec-Bench runs MT-Bench (2): every mode answers turn i after its own earlier
replies, the whole conversation prefilled again, and each turn is a result row of its own
("turn"). Every question runs in every mode, one after the
other, on the same loaded weights. The JSON holds "model", "device", "weight_format",
"settings" (the options as run; the drafting ones, tuned values filled in, are the redrafter
column's, null where no column drafts a fixed shape), "columns" (each column's mode, "auto" for
adaptive drafting, and its fixed shape), "results" (one object
per question, turn and mode; a sampled one's "seed" gives its reply again), "summary" (per
mode: tokens/s pooled and the mean of the replies' tokens/s (over the replies with a decode
step that emitted a token), tokens/step, speedup over ar,
and, for greedy runs, whether every output equals ar's token for token), "categories", and
with --turns, "turns" (the same per turn).

    redrafter-bench --prompts ../shared/data/mt_bench.jsonl --limit 8 --modes ar,redrafter \
        --grid --widths 1,2,4,8 --lengths 3,4,5 --plot grid.png
    redrafter-bench --prompts ../shared/data/mt_bench.jsonl --limit 6 --tune

`--grid` runs redrafter once per beam shape W x L (variants named `redrafter@WxL` in the
summary); `--plot` draws speedup and tokens/step against the shape and the accepted-length
histogram of the fastest shape; `--tune` runs the grid and stores the fastest shape whose
greedy output equals ar's in the model folder (`beam_shape.json`, per machine, weight
format, model file and drafter: tuning.device_keys; another drafter put in its place does not
use it), where `load()`, the API, the chat and this bench pick it up as
the default of fixed drafting (any drafting option given; adaptive drafting, mode "auto"
with none, sizes each step itself). When plain decoding beats every shape, --tune stores W=1
L=1 instead ("plain decoding"): fixed drafting given only a lookup length then decodes
plainly on this machine.
"""

import argparse
import importlib.util
import json
import sys
import time
from collections import defaultdict
from itertools import product
from pathlib import Path
from statistics import mean
from typing import Dict, List, Optional

from . import _platform  # noqa: F401  (OpenBLAS before mlx)
from . import cli
from .errors import ContextLengthError, RedrafterError, json_kind
from .files import json_document, messages_instead_of_text, read_text_file, unwritable_ancestor, write_json
from .graph import graph_name, parse_graph
from .lookup import MAX_GROWTH
from .registry import default_model_name
from .tokenizer import is_blank
from .config import FLOAT_FORMATS, WEIGHT_FORMATS, train_drafter
from .tree_search import DEFAULT_MIN_PROB
from .tuning import FILE as TUNED_FILE
from .tuning import DEFAULT_LOOKUP, DEFAULT_TREE, drafting, fixed_drafting, model_folder, save_beam_shape

MODES = ("ar", "auto", "redrafter", "mlx-lm")


TUNE_MIN_TOKENS = 256  # plain-decoding tokens below which --tune says its stored shape is a rough guess


SHIPPED_PROMPTS = Path(__file__).parent / "data" / "eval_prompts.jsonl"  # (redrafter_mlx/data/README.md)


def report_instead_of_prompts(text: str) -> Optional[str]:
    """What to say of a prompt file that is a redrafter-bench --json report (the file replay reads, given
    as --prompts): it was "one JSON object over several lines, not JSONL", with a jq command that made it
    one line, which then "has neither 'turns' nor 'prompt'". None for any other file."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        whole = json.loads(text)
    except ValueError:  # (JSONL: more than one object)
        return None
    if not (isinstance(whole, dict) and isinstance(whole.get("results"), list) and "summary" in whole):
        return None
    settings = whole.get("settings")
    used = settings.get("prompts") if isinstance(settings, dict) else None
    return ("a redrafter-bench --json report, not a prompt file: give a JSONL file of questions"
            + (f", such as the one its run read, {used}" if isinstance(used, str) and used.strip() else ""))


def read_prompts(path: Path, limit: int = None, turns: int = 1) -> List[Dict]:
    """The questions, each with its first `turns` turns ("turns"; fewer where it has fewer) and
    the first as "prompt". A line with "prompt" and no "turns" is a one-turn question, its
    "source" the category where it has none."""
    out, seen = [], {}
    text = read_text_file(path, "prompt file", "give a JSONL file")
    document = report_instead_of_prompts(text) or json_document(text, path)
    if document:
        raise RedrafterError(f"prompt file {path} is {document}")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):  # it said "list indices must be integers or slices, not str"
                raise TypeError(f"a line is a JSON object, not {json_kind(row)}")
            if "turns" not in row and isinstance(row.get("prompt"), str):  # a one-turn line (the shipped prompts)
                row = {**row, "turns": [row["prompt"]], "category": row.get("category", row.get("source", ""))}
            elif "turns" not in row and "prompt" in row:  # it said "it has none" (of 'turns')
                prompt = row["prompt"]
                raise TypeError(messages_instead_of_text(prompt, "'prompt'")
                                or f"'prompt' is {json_kind(prompt)}, and a question is a string")
            if not isinstance(row["turns"], list):  # and "unhashable type: 'slice'" of an object
                raise TypeError(f"'turns' must be a list of non-empty questions, not {json_kind(row['turns'])}")
            asked = row["turns"][:turns]
            if not isinstance(asked, list) or not asked or not all(isinstance(t, str) and not is_blank(t) for t in asked):
                raise TypeError("'turns' must be a list of non-empty questions")
            for i, t in enumerate(asked, 1):  # a lone surrogate ("\ud800") stopped the run when its turn came up
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise TypeError(f"turn {i} is not valid text: {e.reason} at character {e.start}") from None
            qid, category = row.get("question_id", n), row.get("category", "")
            # (each as the file writes it: null, true, ["x"]; it said None, True, ['x'])
            if isinstance(qid, bool) or not isinstance(qid, (int, str)):  # (1.5 is a number)
                raise TypeError("'question_id' must be a whole number or a string, not "
                                + json.dumps(qid, ensure_ascii=False))
            if not isinstance(category, str):
                raise TypeError(f"'category' must be a string, not {json.dumps(category, ensure_ascii=False)}")
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            # a KeyError's text is the key alone; a JSONDecodeError's "line 1 column 15 (char 14)" is the line's own
            # (said of file line 2, as distill says it)
            why = f"it has neither (its keys: {', '.join(map(str, row)) or 'none'})" if isinstance(e, KeyError) else \
                f"not JSON: {e.msg} (column {e.colno})" if isinstance(e, json.JSONDecodeError) else e
            raise RedrafterError(f"{path}:{n} is not a Spec-Bench line with 'turns' (or a line with 'prompt'): "
                                 f"{why}") from e
        if qid in seen:  # results are matched to ar's by question: a second one read as not identical to ar
            raise RedrafterError(f"{path}:{n} has question_id {qid!r}, as line {seen[qid]} does (a line without one "
                                 "takes its line number): give each question its own")
        seen[qid] = n
        out.append({"question_id": qid, "category": category, "prompt": asked[0], "turns": asked})
        if limit and len(out) >= limit:
            break
    if not out:
        raise RedrafterError(f"prompt file {path} holds no questions")
    short = sum(len(q["turns"]) < turns for q in out)
    if short:
        print(f"redrafter-bench: note: {short} of {len(out)} questions have fewer than {turns} turns; they run the "
              "turns they have", file=sys.stderr)  # (only the bench asks for more than one)
    return out


def mlx_lm_twin(loaded):
    """mlx-lm's own model holding the very same tensors: the base model is mlx-lm's module
    (plain forwards run its code unchanged), so it is used as is."""
    return loaded.model.model


def run_mlx_lm(loaded, twin, prompt: str, args) -> Dict:
    """mlx-lm's plain generation (generate_step) of the same prompt ids; tokens/s as mlx-lm
    counts it: tokens after the first over the time after the first."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    ids = loaded.tokenizer.prompt_ids(prompt)
    # as generate: no token fed past the model's context (mlx-lm decoded on past it, and its reply to a prompt
    # near the context read as not identical to ar's, which stops there); a prompt that fills it is refused
    room = loaded.context_length - len(ids)
    if room < 1:
        raise ContextLengthError(f"the prompt has {len(ids)} tokens but {loaded.name} has a context of "
                                 f"{loaded.context_length}")
    max_tokens = min(args.max_tokens, room + 1)  # (the last token is sampled, not fed)
    eos = set(loaded.tokenizer.eos_token_ids)
    mx.reset_peak_memory()
    tokens, t0, t_first, reason = [], time.perf_counter(), None, "length"
    sampler = make_sampler(temp=args.temperature, top_p=args.top_p if args.top_p < 1 else 0.0)
    if args.seed is not None:
        mx.random.seed(args.seed)
    for t, _ in generate_step(mx.array(ids), twin, max_tokens=max_tokens, sampler=sampler):
        t = int(t)
        if t_first is None:
            t_first = time.perf_counter()
        if t in eos:
            reason = "eos"
            break
        tokens.append(t)
    if reason == "length" and len(tokens) < args.max_tokens:
        reason = "context"
    end = time.perf_counter()
    decode = end - t_first if t_first else 0.0
    n = len(tokens)
    return {
        "mode": "mlx-lm", "prompt_tokens": ids, "tokens": tokens, "new_tokens": n, "steps": max(n - 1, 0),
        "seconds": end - t0, "tokens_per_second": (n - 1) / decode if decode > 0 and n > 1 else 0.0,
        "tokens_per_step": 1.0 if n > 1 else 0.0, "finish_reason": reason,
        "prefill_seconds": (t_first or end) - t0, "decode_seconds": decode, "draft_seconds": 0.0,
        "verify_seconds": 0.0, "drafted_tokens": 0, "packed_tokens": 0, "accepted_tokens": 0,
        "acceptance_rate": 0.0, "peak_memory_mb": mx.get_peak_memory() / 1e6, "accepted_length_histogram": {},
    }


def run_one(loaded, prompt: str, mode: str, args, shape=None, graph=(None, True)) -> Dict:
    """One generation. mode "auto": the adaptive controller (control.py), with the drafter unless
    --no-drafter; "redrafter": fixed drafting with shape (W, L, lookup, tree, tree_min_prob).
    graph: (k, context_graph) of graph drafting (graph.py; k None: a tree)."""
    from .generate import generate

    if mode == "redrafter":
        width, length, lookup, tree, min_prob = shape
    else:
        width = length = lookup = tree = min_prob = None
    t0 = time.perf_counter()
    g = generate(
        loaded,
        prompt,
        mode=mode,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        beam_width=width,
        beam_length=length,
        lookup=lookup,
        tree=tree,
        tree_min_prob=min_prob if tree else None,  # (stream refuses a floor with beams, which have none)
        use_drafter=not args.no_drafter,
        graph=graph[0],
        context_graph=graph[1],
    )
    seconds = time.perf_counter() - t0
    s = g.stats
    return {
        "mode": mode,
        **({"beam_width": width, "beam_length": length, "lookup": lookup, "tree": tree} if mode == "redrafter" else {}),
        **({"tree_min_prob": min_prob} if mode == "redrafter" and tree else {}),
        "prompt_tokens": g.prompt_tokens,
        "tokens": g.tokens,
        "new_tokens": s.new_tokens,
        "steps": s.steps,
        "end_tokens": s.end_tokens,
        "seconds": seconds,
        "tokens_per_second": s.tokens_per_second,
        "tokens_per_step": s.tokens_per_step,
        "finish_reason": g.finish_reason,
        "prefill_seconds": s.prefill_seconds,
        "decode_seconds": s.decode_seconds,
        "draft_seconds": s.draft_seconds,
        "verify_seconds": s.verify_seconds,
        "drafted_tokens": s.drafted_tokens,
        "packed_tokens": s.packed_tokens,
        "accepted_tokens": s.accepted_tokens,
        "draft_depth": s.draft_depth,  # draft positions offered, what acceptance_rate divides by
        "looked_up_tokens": s.looked_up_tokens,
        **({"graph": graph[0], "context_graph": graph[1], "aliases": s.aliases, "grafted_tokens": s.grafted_tokens,
            "graft_accepted_tokens": s.graft_accepted_tokens} if graph[0] is not None else {}),
        "acceptance_rate": s.acceptance_rate,
        "peak_memory_mb": s.peak_memory_mb,
        "accepted_length_histogram": s.histogram(),
        **({"parked_steps": s.parked_steps, "controller": s.controller} if s.adaptive else {}),
        **({"seed": s.seed} if s.seed is not None else {}),  # a sampled reply's: --seed with it gives the reply again
    }


def own_controllers(loaded, first, names: List[str], use_drafter: bool, sampled: bool = False) -> Dict[str, Dict]:
    """A controller of its own for each adaptive column (`loaded.controllers` as each runs), on a
    copy of the first one's cost model: what a controller learns (acceptance, the machine's
    measured costs, parking) steers its next steps, and one controller shared by the columns made
    each column's figures depend on what ran beside it (on 40 Spec-Bench questions, `auto` ran
    2.04 tokens/step beside `auto+graph1` and 2.26 alone)."""
    from copy import deepcopy

    from .control import Controller, controller_key

    if first is None:
        return {}
    key = controller_key(loaded, use_drafter, sampled)
    return {name: {key: Controller(deepcopy(first.costs), first.has_drafter)} for name in names}


def variant_of(r: Dict) -> str:
    return r.get("variant", r["mode"])


def summarize(results: List[Dict], modes: List[str], greedy: bool) -> Dict[str, Dict]:
    """Per variant ("ar", "redrafter", "redrafter@4x5", "mlx-lm"), pooled over the questions."""
    by_mode = defaultdict(list)
    for r in results:
        by_mode[variant_of(r)].append(r)
    summary = {}
    for mode in modes:
        rows = by_mode[mode]
        steps = sum(r["steps"] for r in rows)
        decode = sum(r["decode_seconds"] for r in rows)
        step_tokens = sum(r["new_tokens"] - 1 for r in rows if r["new_tokens"] > 0)
        produced = step_tokens + sum(r.get("end_tokens", 0) for r in rows)  # what tokens/step counts
        if mode == "mlx-lm":
            steps = produced = step_tokens
        first = rows[0] if rows else {}
        # the mean of the replies' rates covers those with one: a reply that ended at its first token (or ran
        # with max_tokens 1) emitted nothing in decode time, its rate 0.0 (the table's "-", _rate), which had
        # pulled the mean down
        rated = [r["tokens_per_second"] for r in rows if r["tokens_per_second"]]
        summary[mode] = {
            "questions": len({r["question_id"] for r in rows}),  # (len(rows) counted each turn of --turns as one)
            **({"replies": len(rows)} if any("turn" in r for r in rows) else {}),  # one per question and turn
            "new_tokens": sum(r["new_tokens"] for r in rows),
            "mean_tokens_per_second": mean(rated) if rated else 0.0,
            "tokens_per_second": step_tokens / decode if decode else 0.0,  # pooled over all questions
            "tokens_per_step": produced / steps if steps else 0.0,
            "peak_memory_mb": max((r["peak_memory_mb"] for r in rows), default=0.0),
        }
        if "beam_width" in first:
            summary[mode]["beam_width"], summary[mode]["beam_length"] = first["beam_width"], first["beam_length"]
            summary[mode]["lookup"] = first.get("lookup", 0)
            summary[mode]["tree"] = first.get("tree", 0)
            if first.get("tree"):
                summary[mode]["tree_min_prob"] = first.get("tree_min_prob", DEFAULT_MIN_PROB)
        if first.get("mode") in ("auto", "redrafter"):
            drafted = sum(r["drafted_tokens"] for r in rows)
            parked = sum(r.get("parked_steps", 0) for r in rows)  # a parked (plain) step verifies 1 token
            summary[mode]["packed_tokens_per_step"] = (sum(r["packed_tokens"] for r in rows) + parked) / steps if steps else 0
            summary[mode]["drafted_tokens_per_step"] = drafted / steps if steps else 0
            # pooled as the rest: a mean of the rows' rates weighed a 2-step reply, or one the controller decoded
            # plainly throughout (0 of 0 offered read 0.0), as much as a 200-step one
            offered = sum(r["draft_depth"] for r in rows)
            summary[mode]["acceptance_rate"] = sum(r["accepted_tokens"] for r in rows) / offered if offered else 0.0
            summary[mode]["looked_up_tokens_per_step"] = (
                sum(r.get("looked_up_tokens", 0) for r in rows) / steps if steps else 0)
            if first.get("graph") is not None:
                summary[mode]["graph"], summary[mode]["context_graph"] = first["graph"], first["context_graph"]
                for name in ("aliases", "grafted_tokens", "graft_accepted_tokens"):
                    summary[mode][f"{name}_per_step"] = sum(r.get(name, 0) for r in rows) / steps if steps else 0
        if first.get("mode") == "auto":
            summary[mode]["parked_share"] = parked / steps if steps else 0.0
            summary[mode]["controller"] = rows[-1].get("controller", {})  # its cost model, as the run ended
    if "ar" in summary:
        base = summary["ar"]["tokens_per_second"]
        ar_tokens = {(r["question_id"], r.get("turn", 1)): r["tokens"] for r in by_mode["ar"]}
        for mode in modes:
            if base:  # (replies of one token time no decode step: ar over itself read 0.00x, as every mode did)
                summary[mode]["speedup"] = summary[mode]["tokens_per_second"] / base
            if greedy and mode != "ar" and by_mode[mode]:  # mlx-lm included: an independent check of our plain decoding
                summary[mode]["identical_to_ar"] = all(r["tokens"] == ar_tokens.get((r["question_id"], r.get("turn", 1)))
                                                       for r in by_mode[mode])
    return summary


def per_category(results: List[Dict], modes: List[str], group=lambda r: r["category"],
                 order=None) -> Dict[str, Dict[str, Dict]]:
    """{category: {variant: {tokens_per_step, tokens_per_second, speedup}}}, pooled per category
    (or per whatever `group` returns for a row, e.g. its turn), in the order of the sort key `order` (by name)."""
    out = {}
    for cat in sorted({group(r) for r in results}, key=order):
        rows = [r for r in results if group(r) == cat]
        s = summarize(rows, [m for m in modes if any(variant_of(r) == m for r in rows)], greedy=False)
        out[cat] = {m: {k: v[k] for k in ("tokens_per_step", "tokens_per_second", "speedup") if k in v}
                    for m, v in s.items()}
    return out


def per_turn(results: List[Dict], modes: List[str]) -> Dict[str, Dict[str, Dict]]:
    """per_category's figures per turn of the conversations ("turn 1", "turn 2", ...)."""
    # (in turn order: by name, "turn 10" came before "turn 2")
    return per_category(results, modes, lambda r: f"turn {r.get('turn', 1)}", order=lambda t: int(t.split()[-1]))


def _speedup(figures: Dict) -> str:
    """`1.23x`, or `-` where there is no ar run to compare with."""
    return f"{figures['speedup']:.2f}x" if "speedup" in figures else "-"


def _rate(value: float, spec: str) -> str:
    """A decode figure (tokens/step, tok/s) in `spec`, or `-` where no decode step ran (a one-token reply
    showed 0.00 tokens/step and 0.00 tok/s)."""
    return format(value, spec) if value else "-"


def print_categories(cats: Dict[str, Dict[str, Dict]], modes: List[str], out=None, what: str = "category"):
    out = out or sys.stdout
    shown = [m for m in modes if m != "ar"] or modes
    # whole names: cut to 22 characters, redrafter+tree0+lookup0 and +lookup4 headed two columns alike
    w, c = max([22, *map(len, shown)]), max([12, len(what), *map(len, cats)])
    print(f"{what:<{c}} " + " ".join(f"{m:>{w}}" for m in shown), file=out)
    print(f"{'':<{c}} " + " ".join(f"{'tok/step  speedup':>{w}}" for _ in shown), file=out)
    for cat, row in cats.items():
        cells = []
        for m in shown:
            v = row.get(m)
            cells.append(f"{_rate(v['tokens_per_step'], '.2f'):>{w - 10}} {_speedup(v):>9}" if v else f"{'-':>{w}}")
        print(f"{cat or '(none)':<{c}} " + " ".join(cells), file=out)  # (lines without one: a row with no name)


def print_table(results: List[Dict], summary: Dict, modes: List[str], out=None):
    out = out or sys.stdout
    # as wide as the names (Spec-Bench's "math_reasoning" was cut to 12; "redrafter+tree6@0.001" pushed the row out)
    kinds = [str(r["category"]) or "(none)" for r in results]  # (blank: the category table names it "(none)")
    c = max([12, *map(len, kinds)])
    v = max([16] + [len(variant_of(r)) for r in results] + [len(m) for m in modes])
    labels = [f"{r['question_id']}" + (f"/{r['turn']}" if "turn" in r else "") for r in results]
    q = max([9, *map(len, labels)])  # (a question_id past 9 characters pushed its row out too)
    print(f"{'question':>{q}} {'category':<{c}} {'mode':<{v}} {'new':>5} {'steps':>5} {'tok/step':>8} {'tok/s':>7}",
          file=out)
    for r, question, kind in zip(results, labels, kinds):
        print(
            f"{question:>{q}} {kind:<{c}} {variant_of(r):<{v}} {r['new_tokens']:>5} {r['steps']:>5} "
            f"{_rate(r['tokens_per_step'], '.2f'):>8} {_rate(r['tokens_per_second'], '.2f'):>7}",
            file=out,
        )
    print(file=out)
    for mode in modes:
        s = summary[mode]
        extra = ""
        if "packed_tokens_per_step" in s:
            extra = (f"  drafted/step {s['drafted_tokens_per_step']:.1f}  packed/step {s['packed_tokens_per_step']:.1f}"
                     f"  acceptance {s['acceptance_rate']:.2f}")
        if "parked_share" in s:
            c = s["controller"]
            extra += (f"  parked {s['parked_share']:.0%}  [cost: plain {c.get('plain_ms', 0):.1f} ms, verify 4/16/64 "
                      f"tokens {c.get('x4', 0):.2f}/{c.get('x16', 0):.2f}/{c.get('x64', 0):.2f}x one]")
        if "grafted_tokens_per_step" in s:
            extra += (f"  graph: aliases/step {s['aliases_per_step']:.2f}, grafted/step {s['grafted_tokens_per_step']:.2f}, "
                      f"accepted through grafts/step {s['graft_accepted_tokens_per_step']:.3f}")
        if "identical_to_ar" in s:
            extra += f"  identical_to_ar {s['identical_to_ar']}"
        print(
            f"{mode:<{v}} tok/s {_rate(s['tokens_per_second'], '.2f'):>7}  "
            f"tokens/step {_rate(s['tokens_per_step'], '.2f'):>5}  "
            f"speedup {_speedup(s):>6}  peak {s['peak_memory_mb']:.0f} MB{extra}",
            file=out,
        )


def plot(summary: Dict, results: List[Dict], path: Path):
    """Speedup and tokens/step against beam shape, and the accepted-length histogram of the
    fastest redrafter variant (matplotlib, written to `path`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RedrafterError("--plot needs matplotlib: pip install 'redrafter-mlx[bench]'") from e
    shapes = [m for m, v in summary.items() if "beam_width" in v]
    if not shapes:
        raise RedrafterError("--plot needs redrafter results (--modes ...,redrafter)")
    shapes.sort(key=lambda m: (summary[m]["beam_width"], summary[m]["beam_length"], summary[m].get("tree", 0),
                               summary[m].get("lookup", 0)))
    labels = [f"{summary[m]['beam_width']}x{summary[m]['beam_length']}"
              + (f" tree{summary[m]['tree']}@{summary[m].get('tree_min_prob', DEFAULT_MIN_PROB):g}" if summary[m].get("tree") else "")
              + (f"+{summary[m]['lookup']}" if summary[m].get("lookup") else "") for m in shapes]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    if all("speedup" in summary[m] for m in shapes):
        axes[0].bar(labels, [summary[m]["speedup"] for m in shapes], color="tab:blue")
        axes[0].axhline(1.0, color="grey", lw=1, ls="--")
        axes[0].set(title="speedup over ar (tokens/s)", xlabel="beams W x length L")
    else:  # no ar run (or one that timed no decode step) to compare with: the panel was empty, every bar 0
        axes[0].bar(labels, [summary[m]["tokens_per_second"] for m in shapes], color="tab:blue")
        axes[0].set(title="tokens/s (no ar run to compare with)", xlabel="beams W x length L")
    axes[1].bar(labels, [summary[m]["tokens_per_step"] for m in shapes], color="tab:green")
    axes[1].set(title="tokens per step", xlabel="beams W x length L")
    for ax in axes[:2]:
        ax.tick_params(axis="x", rotation=60)
    best = max(shapes, key=lambda m: summary[m].get("speedup", summary[m]["tokens_per_second"]))
    hist = defaultdict(int)
    for r in results:
        if variant_of(r) == best:
            for k, n in r.get("accepted_length_histogram", {}).items():
                hist[int(k)] += n
    ks = sorted(hist)
    axes[2].bar([str(k) for k in ks], [hist[k] for k in ks], color="tab:orange")
    axes[2].set(title=f"tokens emitted per step ({best})", xlabel="tokens (accepted drafts + 1)", ylabel="steps")
    asked = len({r['question_id'] for r in results})
    fig.suptitle(f"{asked} prompt{'' if asked == 1 else 's'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110, format=plot_format(Path(path)))
    plt.close(fig)


def plot_format(path: Path):
    """The image format --plot writes to `path`, by its extension: PNG without one (matplotlib wrote FILE.png,
    and the bench said it wrote FILE), None for one matplotlib cannot write."""
    from matplotlib.backend_bases import FigureCanvasBase

    ext = path.suffix[1:].lower()
    if not ext:
        return "png"
    return ext if ext in FigureCanvasBase.get_supported_filetypes() else None


def parse_shapes(text: str, what: str, minimum: int = 1) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < minimum:
        kind = "positive integers" if minimum == 1 else f"integers >= {minimum}"
        raise argparse.ArgumentTypeError(f"{what} must be a comma-separated list of {kind}, not {text!r}")
    # each once: a value given twice ran two variants of one name, whose rows merged and whose --turns
    # conversations took both variants' replies (turn 2 then read as not identical to ar)
    return list(dict.fromkeys(values))


def parse_probs(text: str, what: str) -> List[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or not all(0.0 < v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"{what} must be a comma-separated list of numbers in (0, 1], not {text!r}")
    return list(dict.fromkeys(values))  # each once, as parse_shapes




def parse_args(argv=None):
    p = cli.Parser(
        prog="redrafter-bench",
        description="Measure plain (ar) and ReDrafter decoding speed on Spec-Bench-format prompts.",
        epilog="example: redrafter-bench --model smollm2-135m --limit 10 --modes ar,redrafter --json bench.json "
        "(the shipped prompts; --prompts FILE.jsonl for your own, e.g. MT-Bench's question.jsonl from FastChat)",
    )
    cli.add_version(p)
    p.add_argument("--model", default=None,
                   help=f"registry name, local path or hub id (default: {default_model_name()})")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the one found beside the model)")
    p.add_argument("--prompts", type=cli.path, default=SHIPPED_PROMPTS, metavar="FILE.jsonl",
                   help="JSONL file of questions: Spec-Bench lines ({\"question_id\", \"category\", \"turns\": [...]}; "
                        "the first turn of each, unless --turns) or one-turn lines ({\"prompt\": ...}) (default: the "
                        "16 prompts shipped with the package that redrafter-train holds out, none of them in the "
                        "shipped drafter's data: 8 tasks written for the package and 8 GSM8K questions)")
    p.add_argument("--limit", type=cli.positive, default=None, metavar="N",
                   help="only the first N questions (default: all; 6 with --tune)")
    p.add_argument("--turns", type=cli.positive, default=1, metavar="N",
                   help="run each question as a conversation of its first N turns, as Spec-Bench runs MT-Bench "
                   "(--turns 2): each mode answers every turn after its own earlier replies, so later turns can "
                   "draw on the conversation (default: 1, the first turn alone)")
    p.add_argument("--max-tokens", type=cli.positive, default=256, metavar="N",
                   help="longest reply per turn in tokens (default: 256)")
    p.add_argument("--modes", default="ar", metavar="MODE[,MODE...]", help=f"comma-separated, from {', '.join(MODES)} (default: ar); "
                   "auto = the adaptive controller, which sizes each step's draft to this machine's measured cost "
                   "(and decodes plainly where drafting does not pay); redrafter = the same, with the drafter "
                   "required, when no drafting option below is given, else fixed drafting with those options; "
                   "mlx-lm = mlx-lm's own generate_step on the same model, as a reference for plain decoding. The "
                   "drafting options below shape the redrafter column only (auto stays adaptive), so they need it. Each "
                   "adaptive column learns on a controller of its own, from the same measured cost curve")
    p.add_argument("--no-drafter", action="store_true",
                   help="leave the model's drafter out: auto drafts from the context alone (prompt lookup); "
                   "not with --modes redrafter, which needs the drafter")
    p.add_argument("--beam-width", type=cli.positive, default=None, metavar="W",
                   help="beams drafted per step (default: the tuned shape for this model and device, else 4)")
    p.add_argument("--beam-length", type=cli.positive, default=None, metavar="L",
                   help="tokens per beam, counting the base model's own (default: tuned, else 4)")
    p.add_argument("--grid", action="store_true", help="run redrafter for every shape in --widths x --lengths")
    p.add_argument("--widths", type=lambda t: parse_shapes(t, "--widths"), default=None, metavar="W[,W...]",
                   help="beam widths --grid runs (default: 1,2,4,8)")
    p.add_argument("--lengths", type=lambda t: parse_shapes(t, "--lengths"), default=None, metavar="L[,L...]",
                   help="beam lengths --grid runs (default: 3,4,5)")
    p.add_argument("--lookup", type=lambda t: parse_shapes(t, "--lookup", minimum=0), default=None, metavar="N[,N...]",
                   help="tokens of the context-lookup beam added to the drafter's, doubling while copies are taken "
                   f"whole, up to {MAX_GROWTH}x (0 = none); a comma-separated list runs each (default: tuned, else "
                   f"{DEFAULT_LOOKUP})")
    p.add_argument("--tree", type=lambda t: parse_shapes(t, "--tree", minimum=0), default=None, metavar="N[,N...]",
                   help="draft a dynamic tree of up to N nodes (W wide, L - 1 deep, unlikely nodes dropped) "
                   f"instead of W x L beams (0 = beams); a comma-separated list runs each (default: tuned with the "
                   f"shape, else {DEFAULT_TREE})")
    p.add_argument("--tree-min-prob", type=lambda t: parse_probs(t, "--tree-min-prob"), default=None,
                   metavar="P[,P...]",
                   help="drop tree nodes whose path probability (the drafter's) is below P: lower drafts more nodes, "
                   f"accepts more and verifies more; a comma-separated list runs each (default: tuned, else {DEFAULT_MIN_PROB})")
    p.add_argument("--graph", type=parse_graph, default=None, metavar="K[,K...]",
                   help="graph drafting (GSD, graph.py) for auto and redrafter: K = GSD's k-gram length (0: match "
                   "the token alone) with the context graph (drafted nodes get what followed their last tokens in "
                   "the context), gsdK = GSD alone, none = the tree; a comma-separated list runs each, e.g. "
                   "none,gsd1,1 (fixed drafting needs --tree)")
    p.add_argument("--tune", action="store_true", help="measure this machine's cost curve again (auto's cost "
                   "model, cached beside the model), run the grid (with ar) on the first 6 questions unless "
                   "--limit, and store the fastest lossless fixed shape in the model folder for fixed drafting on "
                   "this device (auto needs no tuning)")
    p.add_argument("--plot", type=cli.writable_file, default=None, metavar="FILE.png",
                   help="write a PNG of speedup and tokens/step per fixed drafting variant, and the fastest one's "
                   "histogram of tokens emitted per step (another format where the name ends in .svg, .pdf, ...; "
                   "needs matplotlib: pip install 'redrafter-mlx[bench]')")
    p.add_argument("--temperature", type=cli.temperature, default=0.0, metavar="T",
                   help="0 = greedy (default), where every mode's output must equal ar's and the table says whether "
                   "it does; above 0, sampled")
    p.add_argument("--top-p", type=cli.probability, default=1.0, metavar="P",
                   help="nucleus sampling mass, with --temperature above 0, in (0, 1] (default: 1)")
    p.add_argument("--seed", type=cli.seed, default=None,
                   help="sampling seed, with --temperature above 0, 0 to 2**64 - 1 (default: 0)")
    p.add_argument("--weight-format", default="auto", choices=WEIGHT_FORMATS,
                   help="auto = the fastest for this device (default); stored = as in the file (e.g. 4-bit); or "
                   "float32, float16, bfloat16")
    p.add_argument("--json", type=cli.writable_file, default=None, metavar="FILE",
                   help="write all results here (from once the model is loaded, rewritten after each question, so a run stopped by Ctrl-C, SIGTERM or a time limit keeps the questions it finished; "
                   "\"complete\" says whether all ran; one stopped before then writes nothing and says so)")
    args = p.parse_args(argv)
    args.modes = list(dict.fromkeys(m.strip() for m in args.modes.split(",") if m.strip()))  # each once
    # the report is written before the first question: --json q.jsonl --prompts q.jsonl replaced the prompts with it
    outputs = [(flag, path) for flag, path in (("--json", args.json), ("--plot", args.plot)) if path is not None]
    for i, (flag, path) in enumerate(outputs):
        for other, taken in [("--prompts", args.prompts), *outputs[:i]]:
            if path.resolve() == taken.expanduser().resolve():
                p.error(f"{flag} {path} is the file {other} names: {flag} would overwrite it; give another path")
    if args.tune and args.temperature > 0:  # it was set to 0, saying nothing
        p.error("--tune measures greedy decoding (the fastest lossless shape): drop --temperature")
    greedy = cli.sampling_error(args.temperature, args.top_p, args.seed)
    if greedy:
        p.error(greedy)
    if args.seed is None:
        args.seed = 0
    if args.tune:
        args.grid = True
        args.modes = list(dict.fromkeys(["ar", "redrafter", *args.modes]))
        args.temperature = 0.0
        if args.limit is None:
            args.limit = 6
    unused = [flag for flag, value in (("--widths", args.widths), ("--lengths", args.lengths)) if value is not None]
    if unused and not args.grid:  # they were ignored, saying nothing
        p.error(f"{' and '.join(unused)} shape{'' if len(unused) > 1 else 's'} the grid, and --grid is not given: add "
                "--grid, or give one shape with --beam-width W --beam-length L")
    single = [flag for flag, value in (("--beam-width", args.beam_width), ("--beam-length", args.beam_length))
              if value is not None]
    if single and args.grid:  # the grid ran --widths x --lengths, ignoring them, saying nothing
        p.error(f"{'--tune runs the grid, ' if args.tune else '--grid runs '}every shape in --widths x --lengths, so "
                f"{' and '.join(single)} would be ignored: give --widths W[,W...] and --lengths L[,L...] instead")
    args.widths = args.widths or [1, 2, 4, 8]
    args.lengths = args.lengths or [3, 4, 5]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"unknown mode(s) {', '.join(bad) or '(none)'}; choose from {', '.join(MODES)}")
    args.fixed = args.grid or fixed_drafting(args.beam_width, args.beam_length, args.lookup, args.tree,
                                             args.tree_min_prob)
    if args.tree_min_prob is not None and (args.tree is not None and not any(args.tree) or args.tree is None and (
            args.grid or args.beam_width is not None or args.beam_length is not None)):  # (the floor was dropped,
        # saying nothing)
        p.error(cli.FLOOR_WITH_BEAMS)
    if args.graph and args.tune:
        # (it said "--tune stores a tree shape", which told no one why)
        p.error("--tune measures fixed trees and stores the fastest; --graph drafting is not tuned: run --tune "
                "without --graph")
    graphs = args.graph and any(k is not None for k, _ in args.graph)
    shaped = args.grid or args.beam_width is not None or args.beam_length is not None  # the tree then defaults to 0
    if graphs and args.fixed and "redrafter" in args.modes and (
            0 in (args.tree or []) or (args.tree is None and shaped)):
        p.error("--graph drafts a dynamic tree: give --tree N with N > 0")
    if args.graph and not {"auto", "redrafter"} & set(args.modes):  # (--graph none: ignored, saying nothing)
        p.error("--graph applies to --modes auto and redrafter")
    if args.plot and not (args.fixed and "redrafter" in args.modes):
        p.error("--plot draws fixed drafting shapes against each other: add --grid (or --beam-width, --beam-length, "
                "--tree) and --modes ...,redrafter")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # it was said after the whole run
        p.error("--plot needs matplotlib: pip install 'redrafter-mlx[bench]'")
    if args.plot and plot_format(args.plot) is None:  # matplotlib's ValueError, a traceback after the whole run
        from matplotlib.backend_bases import FigureCanvasBase

        p.error(f"--plot {args.plot}: matplotlib writes no {args.plot.suffix!r} files; end the name in .png (or "
                + ", ".join("." + ext for ext in sorted(FigureCanvasBase.get_supported_filetypes()) if ext != "png")
                + ")")
    for w in ([args.beam_width] if args.beam_width is not None else args.widths if args.grid else [None]):
        for length in ([args.beam_length] if args.beam_length is not None else args.lengths if args.grid else [None]):
            too_big = cli.draft_size_error(w, length, max(args.tree or [0]) or None, max(args.lookup or [0]) or None)
            if too_big:
                p.error(too_big)
    bad_drafter = cli.drafter_error(args.drafter, args.no_drafter)
    if bad_drafter:
        p.error(bad_drafter)
    drafter_flag = "--drafter" if args.drafter is not None else "--no-drafter" if args.no_drafter else None
    if drafter_flag and not {"auto", "redrafter"} & set(args.modes):  # --drafter was not even loaded (--no-drafter:
        # no drafter is, ignored saying nothing)
        p.error(f"--modes {','.join(args.modes)} decodes plainly and drafts nothing: drop {drafter_flag}, or add auto "
                "or redrafter to --modes")
    if args.grid and "redrafter" not in args.modes:
        p.error("--grid runs fixed drafting shapes, in --modes ...,redrafter: add that mode")
    if args.fixed and not args.grid and "redrafter" not in args.modes:  # they were ignored, saying nothing
        p.error("the drafting options (--beam-width, --beam-length, --lookup, --tree, --tree-min-prob) shape --modes "
                "redrafter, and --modes " + ",".join(args.modes) + " has no redrafter column ('auto' is adaptive): "
                + ("drop them (without the drafter, 'auto' drafts the context's copy as it pays)" if args.no_drafter
                   else "add redrafter to --modes, or drop them"))
    if args.no_drafter and args.tune:
        p.error("--tune measures drafting shapes, which need the drafter: drop --no-drafter")
    if args.no_drafter and "redrafter" in args.modes:  # as the API and python -m redrafter_mlx refuse it
        p.error("--modes redrafter needs the drafter: drop --no-drafter, or use --modes auto, which drafts from the "
                "context alone without one")
    return args


def main(argv=None):
    args = parse_args(argv)
    return cli.run("redrafter-bench", lambda: _bench(args))


def _bench(args) -> int:
    stop = cli.Stop()  # from the start: SIGTERM while the model loaded ended the process, saying nothing
    try:
        return _measure(args, stop)
    except KeyboardInterrupt:
        if stop.began:  # (after the questions: their report is written)
            raise
        # the --json file is left as it was: an earlier run's report stayed there, "complete": true, saying nothing,
        # as if this run's (stopped while its model loaded or its cost curve was measured)
        said = ""
        if args.json:
            said = f"; nothing written to {args.json}" + (" (the file there is an earlier run's)"
                                                          if args.json.exists() else "")
        # on a line of its own (a download's progress bar may hold the last one, or the terminal's "^C"), but no blank
        # one under a bar closed since, as cli.run's own message
        print(cli.after_ctrl_c() + f"redrafter-bench: {stop.why} before the first question began{said}",
              file=sys.stderr)
        return stop.status
    finally:
        stop.restore()


def _measure(args, stop) -> int:
    from .loader import load

    try:
        prompts = read_prompts(args.prompts, args.limit, args.turns)
        if args.limit and len(prompts) < args.limit:  # (said nothing: only the first line's count showed it)
            # (--tune's own 6 were said as "--limit 6", an option not given)
            asked = f"--tune runs the first {args.limit} questions" if args.tune else f"--limit {args.limit}"
            print(f"redrafter-bench: note: {asked}, and {args.prompts} holds {len(prompts)} question"
                  f"{'' if len(prompts) == 1 else 's'}: all of them run", file=sys.stderr)
        progress = lambda s: print(s, file=sys.stderr)  # noqa: E731
        loaded = load(args.model, drafter=args.drafter, weight_format=args.weight_format,
                      use_drafter=not args.no_drafter and bool({"auto", "redrafter"} & set(args.modes)),
                      progress=progress)
        if "redrafter" in args.modes and loaded.drafter is None:
            what = "--tune" if args.tune else "--modes redrafter"
            raise RedrafterError(f"{what} needs a drafter and none was found for {loaded.name}: pass --drafter PATH "
                                 f"(or train one: {train_drafter(loaded.name)})"
                                 + ("" if args.tune else ", or use --modes auto, which drafts from the context alone"))
        folder = model_folder(loaded.path)
        if args.tune and unwritable_ancestor(folder / TUNED_FILE) is not None:  # it failed after the whole tune
            raise RedrafterError(f"--tune stores the fastest shape in the model folder {folder}, which cannot be "
                                 "written: tune a copy of the model in a folder you can write")
        for q in prompts:  # one past the context ended the run there, the questions before it left unreported
            n = len(loaded.tokenizer.prompt_ids(q["prompt"]))
            if n >= loaded.context_length:
                raise RedrafterError(f"question {q['question_id']!r} of {args.prompts} has a first turn of {n} tokens, "
                                     f"and {loaded.name} has a context of {loaded.context_length}: shorten it or leave "
                                     "it out")
    except RedrafterError as e:
        print(f"redrafter-bench: error: {e}", file=sys.stderr)
        return 2
    if args.tree_min_prob is not None and args.tree is None and not drafting(loaded).tree:  # none tuned here
        print(f"redrafter-bench: error: {cli.FLOOR_WITH_BEAMS} (no tree is tuned for {loaded.name} on this device)",
              file=sys.stderr)
        return 2
    graphed = args.graph and any(k is not None for k, _ in args.graph)
    if graphed and args.fixed and "redrafter" in args.modes and args.tree is None and not drafting(loaded).tree:
        # (generate refused it in the warm-up, after the cost model was measured, in the API's words)
        print(f"redrafter-bench: error: --graph drafts a dynamic tree, and the redrafter column drafts W x L beams (no "
              f"tree is tuned for {loaded.name} on this device): add --tree N (N > 0 nodes)", file=sys.stderr)
        return 2
    first = None
    if {"auto", "redrafter"} & set(args.modes) or args.tune:  # measured (or read) before any timing starts
        from .control import Controller, controller, controller_key
        from .costs import cost_model

        if args.tune:
            loaded.controllers.clear()
            costs = cost_model(loaded, progress, refresh=True)
            # the controller on this curve: controller() read it back from the cache, and measured it a second
            # time where no cache folder can be written (REDRAFTER_CACHE read-only)
            key = controller_key(loaded, not args.no_drafter)
            loaded.controllers[key] = Controller(costs, loaded.drafter is not None)
        first = controller(loaded, not args.no_drafter, progress, args.temperature > 0)
    # (the tree too: a tree asked for where plain decoding was tuned fastest, L = 1, drafts at the default length)
    # The grid's shapes are not the tuned one, so its tree is DEFAULT_TREE, as with --beam-width: the tuned tree ran
    # at every shape of a grid named as beams, and a --tune after one that stored a tree never measured beams again
    tree = max(args.tree) if args.tree else DEFAULT_TREE if args.grid else None
    d = drafting(loaded, args.beam_width or None, args.beam_length or None, tree)
    args.beam_width, args.beam_length = d.beam_width, d.beam_length
    # Variants: (name, mode, (W, L, lookup, tree, tree_min_prob)); with --grid, redrafter runs once
    # per shape, and once per --lookup, --tree and --tree-min-prob value.
    args.lookup = args.lookup or [d.lookup]
    args.tree = args.tree or [d.tree]
    args.tree_min_prob = args.tree_min_prob or [d.tree_min_prob]
    variants = []
    graphs = args.graph or [(None, True)]
    suffix = (lambda g: "+" + graph_name(g)) if args.graph else (lambda g: "")
    for mode in args.modes:
        if mode == "redrafter" and not args.fixed:  # no drafting option: the adaptive controller, named as asked
            variants += [("redrafter" + suffix(g), "auto", None, g) for g in graphs]
            continue
        if mode == "auto":
            variants += [("auto" + suffix(g), "auto", None, g) for g in graphs]
            continue
        if mode != "redrafter":
            variants.append((mode, mode, None, (None, True)))
            continue
        shapes = [(w, n) for w in args.widths for n in args.lengths] if args.grid else [(args.beam_width, args.beam_length)]
        for w, n in shapes:
            for t, c in product(args.tree, args.lookup):
                for p in args.tree_min_prob if t else args.tree_min_prob[:1]:  # the floor only matters to a tree
                    name = ((f"redrafter@{w}x{n}" if args.grid else "redrafter") + (f"+tree{t}" if len(args.tree) > 1 else "")
                            + (f"@{p:g}" if t and len(args.tree_min_prob) > 1 else "")
                            + (f"+lookup{c}" if len(args.lookup) > 1 else ""))
                    variants += [(name + suffix(g), mode, (w, n, c, t, p), g) for g in graphs]
    names = [v[0] for v in variants]
    own = own_controllers(loaded, first, [name for name, mode, _, _ in variants if mode == "auto"], not args.no_drafter,
                         args.temperature > 0)
    shared = loaded.controllers
    shape_text = (f"grid W in {args.widths} x L in {args.lengths}" if args.grid else f"W={args.beam_width} L={args.beam_length}"
                  if args.fixed else "adaptive drafting" + (" without the drafter" if loaded.drafter is None else "")
                  if {"auto", "redrafter"} & set(args.modes) else "no drafting")  # (ar, mlx-lm: it said adaptive)
    # (a model without a drafter: it said "drafter None", and "adaptive drafting" of auto drafting from the context
    # alone, as if with one)
    drafter = loaded.drafter_path or ("none (--no-drafter)" if args.no_drafter else "none found" if {
        "auto", "redrafter"} & set(args.modes) else "none (not needed)")
    print(f"model {loaded.name} ({loaded.weight_format}) on {loaded.device}; drafter {drafter}; "
          f"{len(prompts)} prompt{'' if len(prompts) == 1 else 's'}, modes {','.join(args.modes)}, {shape_text}",
          file=sys.stderr)
    twin = mlx_lm_twin(loaded) if "mlx-lm" in args.modes else None
    if args.json:  # from the start, so a run stopped before its first question leaves no earlier run's report there
        write_report(args.json, loaded, args, [], variants, complete=False)
    stop.began = True
    results = []
    done = 0  # questions every variant has run on; only those are reported
    try:
        try:  # (stopped here, it said "cancelled" and a SIGTERM ended it saying nothing: as in the first question)
            for name, mode, shape, graph in variants:  # warm-up: first calls pay for kernel set-up
                loaded.controllers = own.get(name, shared)
                if mode == "mlx-lm":
                    run_mlx_lm(loaded, twin, "Hello", argparse.Namespace(**{**vars(args), "max_tokens": 8}))
                else:
                    run_one(loaded, "Hello", mode, argparse.Namespace(**{**vars(args), "max_tokens": 8}), shape, graph)
        finally:
            loaded.controllers = shared  # a failed warm-up leaves the model with its own controllers
        for q in prompts:
            rows = []
            talk = {name: [] for name in names}  # each variant's conversation so far: its own replies
            for turn, asked in enumerate(q["turns"], 1):
                turn_rows = []
                for name, mode, shape, graph in variants:
                    prompt = talk[name] + [{"role": "user", "content": asked}] if turn > 1 else asked
                    loaded.controllers = own.get(name, shared)
                    try:
                        r = (run_mlx_lm(loaded, twin, prompt, args) if mode == "mlx-lm"
                             else run_one(loaded, prompt, mode, args, shape, graph))
                    except ContextLengthError:
                        if turn == 1:
                            raise
                        # in our words: the error's advice is the chat's ("shorten the conversation or start a new
                        # chat"), which a bench user cannot follow
                        n = len(loaded.tokenizer.prompt_ids(prompt))
                        print(f"  q{q['question_id']} turn {turn} {name}: the conversation has {n} tokens and "
                              f"{loaded.name} has a context of {loaded.context_length}; this question's turns from "
                              "here are left out (a smaller --max-tokens leaves room for more)", file=sys.stderr)
                        turn_rows = None
                        break
                    talk[name] += [{"role": "user", "content": asked},
                                   {"role": "assistant", "content": loaded.tokenizer.decode(r["tokens"])}]
                    r = {"question_id": q["question_id"], "category": q["category"],
                         **({"turn": turn} if args.turns > 1 else {}), **r}
                    if name != mode:
                        r["variant"] = name
                    turn_rows.append(r)
                    # as the table: "-" where no decoding step ran (a one-token reply said "1 tokens, 0.00 tok/step,
                    # 0.00 tok/s" above the table's "-")
                    print(f"  q{q['question_id']}" + (f" turn {turn}" if args.turns > 1 else "") + f" {name}: "
                          f"{r['new_tokens']} token{'' if r['new_tokens'] == 1 else 's'}, "
                          f"{_rate(r['tokens_per_step'], '.2f')} tok/step, {_rate(r['tokens_per_second'], '.2f')} tok/s",
                          file=sys.stderr)
                if turn_rows is None:  # every variant's row of a turn, or none: the figures stay comparable
                    break
                rows += turn_rows
            results += rows
            done += 1
            if args.json and done < len(prompts):  # a run stopped later keeps what it finished
                write_report(args.json, loaded, args, results, variants, complete=False)
    except KeyboardInterrupt:
        if not done:
            print(cli.after_ctrl_c() + f"redrafter-bench: {stop.why} before the first question finished; nothing to "
                  "report"
                  + (f" ({args.json} holds no results, \"complete\": false)" if args.json else ""), file=sys.stderr)
            return stop.status
        print(cli.after_ctrl_c() + f"redrafter-bench: {stop.why} after {done} of {len(prompts)} questions; reporting "
              "those",
              file=sys.stderr)
    except RedrafterError as e:
        print(f"redrafter-bench: error: {e}", file=sys.stderr)
        return 2
    finally:
        stop.restore()
        loaded.controllers = shared
    interrupted = done < len(prompts)
    summary = summarize(results, names, args.temperature == 0.0)
    categories = per_category(results, names)
    if args.json:  # first: a --plot or --tune that fails below left it "complete": false, short of the last question
        write_report(args.json, loaded, args, results, variants, not interrupted, summary, categories)
    print_table(results, summary, names)
    print()
    print_categories(categories, names)
    if args.turns > 1:
        print()
        print_categories(per_turn(results, names), names, what="turn")
    if args.plot:
        try:
            plot(summary, results, args.plot)
        except RedrafterError as e:
            print(f"redrafter-bench: error: {e}", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.tune and interrupted:
        print("redrafter-bench: interrupted, so no shape is stored", file=sys.stderr)
    elif args.tune:
        best = best_shape(summary)
        if best is None:
            print("redrafter-bench: no beam shape reproduced ar's output; nothing stored", file=sys.stderr)
            return 1
        width, length, plain = tuned_default(summary, best)
        chosen = {} if plain else best  # plain decoding stores the defaults beside W=1 L=1
        tree = chosen.get("tree", 0)
        path = save_beam_shape(loaded, width, length, tree=tree, lookup=chosen.get("lookup", DEFAULT_LOOKUP),
                               tree_min_prob=chosen.get("tree_min_prob", DEFAULT_MIN_PROB),
                               note=lambda text: print(f"redrafter-bench: note: {text}", file=sys.stderr), measured={
            "tokens_per_second": best["tokens_per_second"], "speedup": best.get("speedup"),
            "tokens_per_step": best["tokens_per_step"], "prompts": str(args.prompts), "questions": len(prompts),
            "max_tokens": args.max_tokens, "fastest_shape": [best["beam_width"], best["beam_length"]],
            "plain_is_faster": plain})
        measured = summary["ar"]["new_tokens"]
        if measured < TUNE_MIN_TOKENS:
            print(f"redrafter-bench: note: the tune measured {measured} tokens of plain decoding, too few to tell "
                  f"shapes apart reliably (fewer than {TUNE_MIN_TOKENS}; the default tune measures 6 questions of up "
                  "to 256 tokens): the stored shape is a rough guess", file=sys.stderr)
        # (whose entry it is: a load of this model in another weight format, e.g. "auto" after a tune with
        # --weight-format stored, does not use it, and nothing had said so)
        whose = f" for {loaded.name} with {loaded.weight_format} weights on this machine"
        if plain:
            print(f"plain decoding beat every beam shape on this device (best W={best['beam_width']} "
                  f"L={best['beam_length']}: {best.get('speedup', 0):.2f}x over ar); W=1 L=1 (plain decoding) "
                  f"stored in {path}{whose}")
        else:
            # with its lookup length and tree floor, stored beside it (which of --lookup 0,8 was, it did not say)
            print(f"fastest shape W={best['beam_width']} L={best['beam_length']}"
                  + (f" tree {tree} (floor {best.get('tree_min_prob', DEFAULT_MIN_PROB):g})" if tree else "")
                  + f", lookup {best.get('lookup', DEFAULT_LOOKUP)} ({best.get('speedup', 0):.2f}x over ar) stored in "
                  f"{path}{whose}")
    return stop.status if interrupted else 0


def format_of(description: str) -> str:
    """The weight format that loads weights as `description` (Loaded.weight_format: "float32",
    "4-bit (group 32)") says they were: a float dtype by its name, quantized weights as stored."""
    return description if description in FLOAT_FORMATS else "stored"


def settings(args, loaded, variants) -> Dict:
    """The report's "settings": the options the run ran with. The drafting options are fixed
    drafting's (the redrafter column's, tuned values filled in), so they are null where no column
    drafts a fixed shape (an adaptive run's showed the tuned W=4 L=4 it never used); --widths and
    --lengths are the grid's, null without --grid; seed null when greedy. weight_format: the one the model was loaded
    with ("float32", "stored"), which replay loads again ("auto" can resolve otherwise there)."""
    # (not args.fixed: parse_args's own note of whether a drafting option was given, which "columns" says per column)
    out = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "fixed"}
    fixed = any(shape is not None for _, _, shape, _ in variants)
    for key in ("beam_width", "beam_length", "lookup", "tree", "tree_min_prob"):
        if not fixed or args.grid and key in ("beam_width", "beam_length"):
            out[key] = None
    if not args.grid:
        out["widths"] = out["lengths"] = None
    if args.temperature == 0.0:  # greedy: nothing was drawn (it said "seed": 0, the sampling default)
        out["seed"] = None
    out["weight_format"] = format_of(loaded.weight_format)
    return out


def columns(variants) -> Dict[str, Dict]:
    """What each column (variant) ran: {name: {"mode"}}, "auto" for the adaptive controller (the
    redrafter column too when no drafting option is given), with fixed drafting's beam_width,
    beam_length, lookup, tree (and tree_min_prob) and graph drafting's graph and context_graph."""
    out = {}
    for name, mode, shape, (k, context_graph) in variants:
        column = {"mode": mode}
        if shape is not None:
            width, length, lookup, tree, min_prob = shape
            column.update(beam_width=width, beam_length=length, lookup=lookup, tree=tree,
                          **({"tree_min_prob": min_prob} if tree else {}))
        if k is not None:
            column.update(graph=k, context_graph=context_graph)
        out[name] = column
    return out


def write_report(path: Path, loaded, args, results: List[Dict], variants: List[tuple], complete: bool = True,
                 summary: Dict = None, categories: Dict = None):
    """The --json report, replaced atomically: a reader (or a run stopped mid-write) never sees
    half a file. complete: False while questions are still to run, or after an interruption.
    variants: (name, mode, shape, graph) of each column, as _bench runs them."""
    # a local model or drafter by its absolute path: replay loads what "model" names, and a relative one (--model
    # tiny) was not found from another folder, or named another model there
    local = not loaded.resolved.entry and Path(loaded.name).expanduser().exists()
    names = [v[0] for v in variants]
    report = {
        "model": str(loaded.path) if local else loaded.name,
        "device": loaded.device,
        "weight_format": loaded.weight_format,
        "drafter": str(Path(loaded.drafter_path).resolve()) if loaded.drafter_path else None,
        "settings": settings(args, loaded, variants),
        "columns": columns(variants),
        "complete": complete,
        "results": results,
        "summary": summary if summary is not None else summarize(results, names, args.temperature == 0.0),
        "categories": categories if categories is not None else per_category(results, names),
        **({"turns": per_turn(results, names)} if args.turns > 1 else {}),
    }
    write_json(path, report)


def tuned_default(summary: Dict, best: Dict):
    """(W, L, plain): the shape --tune stores, given the fastest lossless variant `best`.
    L=1 is plain decoding, stored when ar was at least as fast as every shape."""
    ar = summary.get("ar")
    if ar is not None and ar["tokens_per_second"] >= best["tokens_per_second"]:
        return 1, 1, True
    return best["beam_width"], best["beam_length"], False


def best_shape(summary: Dict) -> Dict:
    """The fastest redrafter variant whose greedy outputs equal ar's (None if there is none)."""
    ok = [v for v in summary.values() if "beam_width" in v and v.get("identical_to_ar", True)]
    return max(ok, key=lambda v: v["tokens_per_second"], default=None)


if __name__ == "__main__":
    sys.exit(main())
