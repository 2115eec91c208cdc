"""Write distillation data for draft heads: the base model's own replies to prompts (greedy, or sampled with
--temperature), with its hidden states, for python -m redrafter_mlx.train to train on.

    python -m redrafter_mlx.distill --model smollm2-135m --out runs/distill \
        --data ../shared/data/alpaca_1000.jsonl ../shared/data/seed_tasks.jsonl \
        ../shared/data/gsm8k_train_questions.jsonl --limit 1500 --max-tokens 256

The ReDrafter paper trains on the base model's own outputs (about +10% tokens/step over
dataset text): the head learns what *this* model writes. Prompts are wrapped in the chat
template and answered greedily in batches (left padding, per-row positions, a padding-aware
mask; rows that finished are dropped from the batch, a quarter at a time, so long replies
do not keep finished ones running; prompts of similar length share a batch, and a batch of
long prompts holds fewer of them, within a padded-token budget; `--max-prompt-tokens` skips the
few very long prompts, whose prefill is slow on a CPU). Each finished batch is one shard `shard-NNNNN.npz`
holding, per sample, the prompt and reply ids, the base model's final hidden states for
the reply positions (float16) and, for sampled replies, its greedy token at each of them:
all that training needs, the base model never runs again. A `done.txt` lists the
prompt keys already answered, so an interrupted run resumes where it stopped.
MT-Bench is evaluation data: files whose name holds mt_bench, MT-Bench or mtbench (any case), and MT-Bench
questions in any file, are refused.
"""

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import _platform  # noqa: F401

import mlx.core as mx  # noqa: E402

from . import cli  # noqa: E402
from .errors import RedrafterError, json_kind, one_line  # noqa: E402
from .config import WEIGHT_FORMATS  # noqa: E402
from .files import (json_document, messages_instead_of_text, one_run_in, read_text_file, signals_held,  # noqa: E402
                    write_json)


MT_BENCH = "MT-Bench is the benchmark: it must not train a drafter, nor choose which one is installed (measure the " \
           "result on it with redrafter-bench)"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


def mt_bench_question(row) -> bool:
    """A row of MT-Bench (question ids 81-160 in its eight categories), whatever the file is called:
    FastChat names it question.jsonl, and Spec-Bench's question.jsonl holds it too."""
    qid = row.get("question_id") if isinstance(row, dict) else None
    return isinstance(qid, int) and 81 <= qid <= 160 and row.get("category") in MT_BENCH_CATEGORIES


def _text(value, name: str) -> str:
    """A row's field `name` as a prompt's text; a TypeError in JSON's words otherwise (a list or an object was
    said as "not list", or, as an alpaca 'input', went into the prompt in Python's words: "[{'role': ...}]")."""
    if isinstance(value, str):
        return value
    raise TypeError(messages_instead_of_text(value, name) or f"{name} is text, not {json_kind(value)}")


def read_prompts(paths: Sequence[Path]) -> List[str]:
    """User messages from alpaca ({instruction, input}), self-instruct seeds ({instruction,
    instances}), GSM8K ({question}), {prompt} and Spec-Bench ({turns}: the first) JSONL files, in
    file order. A row with none of those keys, or whose prompt is not text (null, 0, a list), is an
    error that names its line (such rows were skipped, saying nothing); a row whose prompt is blank
    is skipped. MT-Bench, by the file's name
    or a row's question id and category, is refused. A file that is missing, a folder, unreadable
    or not UTF-8 is a RedrafterError (`read_text_file`)."""
    out = []
    for path in paths:
        if re.search(r"mt[-_ ]?bench", Path(path).name, re.IGNORECASE):  # (MT-Bench.jsonl, mtbench_16.jsonl passed)
            # (read_prompt_files names the file: it was named twice, and "for training" of --eval-prompts)
            raise ValueError(MT_BENCH)
        text = read_text_file(path, "prompt file", "give a JSONL file")
        document = json_document(text, path)
        if document:
            raise ValueError(f"the file is {document}")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:  # its own "line 1" is the line's, not the file's
                raise ValueError(f"line {n} is not JSON: {e.msg} (column {e.colno})") from e
            if mt_bench_question(row):  # (under another name it trained the drafter on the benchmark)
                raise ValueError(f"line {n} is MT-Bench question {row['question_id']} ({row['category']}): {MT_BENCH}")
            try:
                if not isinstance(row, dict):
                    raise TypeError(f"a row is a JSON object, not {json_kind(row)}")
                keys = ("instruction", "question", "prompt", "turns")
                if not any(k in row for k in keys):
                    raise KeyError(f"none of {', '.join(keys)} (it has {', '.join(map(str, row)) or 'no keys'})")
                turns = row.get("turns")
                # the first field that holds something: a null or "" one gives way to the next (a merged file's
                # {"instruction": null, "question": "..."}), and one of another type is said (0, false and [] were
                # skipped, saying nothing, where 5, true and ["a"] were refused)
                given = [k for k in keys[:3] if row.get(k) is not None]
                key = next((k for k in given if row[k] != ""), None)
                if key is None and not given and "turns" not in row:  # every field null: it was skipped, saying nothing
                    raise TypeError(f"'{next(k for k in keys if k in row)}' is text, not null")
                if key is None and "turns" in row and not isinstance(turns, list):  # (skipped, saying nothing)
                    raise TypeError(f"'turns' is a list of questions, not {json_kind(turns)}")
                text = _text(row[key], f"'{key}'") if key else (
                    _text(turns[0], "the first of 'turns'") if isinstance(turns, list) and turns else "")
                instances = row.get("instances")
                if instances and not (isinstance(instances, list) and isinstance(instances[0], dict)):
                    raise TypeError("'instances' is a list of {input, output} objects")  # it said "row: 0"
                extra, name = row.get("input"), "'input'"  # (an 'input' of 0 or false was left out, saying nothing)
                if extra in (None, "") and instances:
                    extra, name = instances[0].get("input"), "the first instance's 'input'"
                extra = "" if extra in (None, "") else _text(extra, name)
                text = f"{text}\n\n{extra}" if extra else text
            except (AttributeError, KeyError, IndexError, TypeError) as e:
                why = e.args[0] if isinstance(e, KeyError) and e.args else e
                raise ValueError(f"line {n} is not an alpaca, self-instruct, GSM8K or Spec-Bench row: {why}") from e
            # a lone surrogate ("\ud800" in scraped JSON) is not text the tokenizer or a hash can take
            text = text.encode("utf-8", "replace").decode("utf-8")
            if text.strip():
                out.append(text.strip())
    return out


def key_of(prompt: str) -> str:
    return hashlib.sha1(prompt.encode()).hexdigest()[:16]


def generate_batch(
    model, prompts: List[List[int]], max_tokens: int, eos: Sequence[int], temperature: float = 0.0,
    on_step: Optional[Callable[[], None]] = None,
) -> List[Tuple[List[int], np.ndarray]]:
    """Replies to a batch of prompt ids: greedy, or sampled at `temperature` (mx.random state);
    `on_step()` is called after each decoding step (a progress bar's tick).
    Returns per row (reply ids, hidden (n, H) f16, greedy ids), where hidden[i] is the base
    model's final hidden state at the position *before* reply token i (the state that
    predicted it): the last prompt token, then reply tokens; greedy[i] is that state's
    argmax token (equal to reply[i] when decoding greedily)."""
    B = len(prompts)
    T = max(len(p) for p in prompts)
    pad = np.array([T - len(p) for p in prompts])
    tokens = np.zeros((B, T), dtype=np.int32)
    for i, p in enumerate(prompts):
        tokens[i, pad[i]:] = p
    valid = np.arange(T)[None, :] >= pad[:, None]  # (B, S) keys that are real tokens
    causal = np.tril(np.ones((T, T), dtype=bool))
    mask = causal[None, None] & valid[:, None, None, :]  # (B, 1, T, T)
    # Padding rows attend to themselves only, to keep their softmax finite.
    mask |= np.eye(T, dtype=bool)[None, None]
    positions = np.maximum(np.arange(T)[None, :] - pad[:, None], 0)
    cache = model.make_cache()
    h = model.hidden(mx.array(tokens), cache, positions=mx.array(positions), mask=mx.array(mask))[:, -1]  # (B, H)
    pos = np.array([len(p) for p in prompts])
    eos = set(eos)
    replies = [[] for _ in range(B)]
    hiddens = [[] for _ in range(B)]
    greedy = [[] for _ in range(B)]
    rows = np.arange(B)  # the original row of each row still in the batch
    live = np.ones(B, dtype=bool)  # rows still writing (finished ones run on, ignored, until dropped)
    for _ in range(max_tokens):
        logits = model.logits(h)  # (b, V)
        best = mx.argmax(logits, axis=-1)  # (b,)
        nxt = mx.random.categorical(logits.astype(mx.float32) / temperature, axis=-1) if temperature > 0 else best
        h_np = np.array(h.astype(mx.float16))
        nxt_np, best_np = np.array(nxt), np.array(best)
        for j in np.flatnonzero(live):
            if int(nxt_np[j]) in eos:
                live[j] = False
                continue
            replies[rows[j]].append(int(nxt_np[j]))
            hiddens[rows[j]].append(h_np[j])
            greedy[rows[j]].append(int(best_np[j]))
        if on_step is not None:
            on_step()
        if not live.any():
            break
        if (~live).sum() * 4 >= len(rows):  # a quarter finished: drop them (copying the cache costs a step)
            keep = np.flatnonzero(live)
            cache.keep_rows(keep)
            rows, valid, pos, live = rows[keep], valid[keep], pos[keep], live[keep]
            nxt = nxt[mx.array(keep)]
        b = len(rows)
        valid = np.concatenate([valid, np.ones((b, 1), dtype=bool)], axis=1)
        step_mask = valid[:, None, None, :]  # (b, 1, 1, S)
        h = model.hidden(nxt.reshape(b, 1), cache, positions=mx.array(pos.reshape(b, 1)), mask=mx.array(step_mask))[:, -1]
        pos = pos + 1
    return [(r, np.stack(hs) if hs else np.zeros((0, h.shape[-1]), np.float16), g)
            for r, hs, g in zip(replies, hiddens, greedy)]


def next_shard_index(out: Path) -> int:
    """One past the highest shard number in `out`. (The count of shards was used: after a damaged shard was
    deleted, as read_shards advises, the next batch was written over the last shard, losing its replies
    while done.txt still listed them as answered.)"""
    numbers = [int(f.stem[len("shard-"):]) for f in out.glob("shard-*.npz") if f.stem[len("shard-"):].isdigit()]
    return max(numbers, default=-1) + 1


def write_shard(out: Path, index: int, samples: List[dict]):
    arrays = {}
    for j, s in enumerate(samples):
        arrays[f"prompt_{j}"] = np.array(s["prompt"], dtype=np.int32)
        arrays[f"reply_{j}"] = np.array(s["reply"], dtype=np.int32)
        arrays[f"hidden_{j}"] = s["hidden"]
        if s.get("greedy") is not None and list(s["greedy"]) != list(s["reply"]):  # sampled replies only
            arrays[f"greedy_{j}"] = np.array(s["greedy"], dtype=np.int32)
    arrays["greedy_checked"] = np.array(1)  # greedy tokens are stored wherever they differ from the reply
    # The shard and its prompts' keys in done.txt go in together: Ctrl-C between them made a
    # resumed run answer the batch again (its samples then twice in the data).
    def record():
        with open(out / "done.txt", "a") as f:
            f.writelines(s["key"] + "\n" for s in samples)

    _save_shard(out / f"shard-{index:05d}.npz", arrays, then=record)


def _save_shard(path: Path, arrays: dict, then=None):
    """Write a shard atomically: a hidden temp file, then a rename (and `then()`, with Ctrl-C and
    SIGTERM held from the rename to its end)."""
    tmp = path.with_name("." + path.name)
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    with signals_held():
        os.replace(tmp, path)
        if then is not None:
            then()


def _samples_in(files) -> int:
    return sum(1 for k in files if k.startswith("reply_"))


def read_shards(out: Path) -> Iterator[dict]:
    """Samples back from disk: dicts with prompt, reply (int32), hidden (float16, (n, H)) and
    greedy (int32, the base model's argmax at each reply position; the reply itself when it
    was decoded greedily or the shard predates this field)."""
    for shard in sorted(Path(out).glob("shard-*.npz")):
        with _damaged_shard_said(shard):
            with _load_shard(shard) as z:
                samples = []
                for j in range(_samples_in(z.files)):
                    reply = z[f"reply_{j}"]
                    greedy = z[f"greedy_{j}"] if f"greedy_{j}" in z.files else reply
                    samples.append({"prompt": z[f"prompt_{j}"], "reply": reply, "hidden": z[f"hidden_{j}"],
                                    "greedy": greedy})
        yield from samples


SHARD_FORM = "a .npz archive of prompt_N, reply_N and hidden_N arrays, as redrafter-distill writes"


def _load_shard(shard: Path):
    """np.load of a shard, which is a .npz archive: a .npy file (which np.load returns as an array) is not one."""
    z = np.load(shard)
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError("not a .npz archive")
    return z


def _why_damaged(shard: Path, e: BaseException) -> str:
    """What is wrong with a shard that could not be read and what a shard is, in our words: of a file that is not a
    .npz archive at all, numpy's own said it held "pickled (object) data" that `allow_pickle=` would load, which
    means nothing here."""
    try:
        with open(shard, "rb") as f:
            head = f.read(4)
    except OSError:
        head = None
    if head and not head.startswith(b"PK"):  # (every zip file begins so: a .npz is one)
        return f"not {SHARD_FORM}"
    if head == b"":
        why = "empty"
    elif isinstance(e, ValueError) and "allow_pickle" in str(e):  # an array of Python objects in the archive
        why = "it holds Python objects, not arrays of numbers"
    else:
        why = f"{type(e).__name__}: {one_line(e)}"
    return f"{why}; expected {SHARD_FORM}"


@contextlib.contextmanager
def _damaged_shard_said(shard: Path):
    """A shard that cannot be read is a RedrafterError naming it and what a shard is (shards are written whole: one
    cut short is damage)."""
    import zipfile

    try:
        yield
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise RedrafterError(f"{shard} is damaged ({_why_damaged(shard, e)}): delete it (its replies are then left "
                             "out) or distil into a fresh folder") from e


def backfill_greedy(model, out: Path, chunk: int = 2048) -> int:
    """Add the greedy tokens to the shards of a sampled run written before they were stored:
    argmax of the base model's logits from each stored hidden state. Shards are rewritten
    atomically, one at a time. Returns the number of shards changed."""
    changed = 0
    for shard in sorted(Path(out).glob("shard-*.npz")):
        with _damaged_shard_said(shard), _load_shard(shard) as z:  # (a BadZipFile traceback)
            arrays = {k: z[k] for k in z.files}
        n = _samples_in(arrays)
        if n == 0 or "greedy_checked" in arrays:
            continue
        for j in range(n):
            hidden = arrays[f"hidden_{j}"]
            best = [np.array(mx.argmax(model.logits(mx.array(hidden[i : i + chunk].astype(np.float32))), axis=-1))
                    for i in range(0, len(hidden), chunk)]
            best = np.concatenate(best).astype(np.int32) if best else np.zeros(0, np.int32)
            if not np.array_equal(best, arrays[f"reply_{j}"]):
                arrays[f"greedy_{j}"] = best
        arrays["greedy_checked"] = np.array(1)
        _save_shard(shard, arrays)
        changed += 1
    return changed


def length_batches(lengths: Sequence[int], batch_size: int, budget: int) -> List[List[int]]:
    """Indices in order of length, cut into batches of at most `batch_size` rows whose padded
    size (rows x longest length) stays within `budget` tokens. Similar lengths share a batch
    (less padding), and the few longest prompts do not make one batch of `batch_size` huge
    rows: its (B, heads, T, T) prefill attention is what made such a batch slow."""
    batches, batch = [], []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batch and (len(batch) == batch_size or (len(batch) + 1) * lengths[i] > budget):
            batches.append(batch)
            batch = []
        batch.append(i)
    return batches + [batch] if batch else batches


def check_reply_room(loaded, max_tokens: int):
    """Refuse replies too long to leave a prompt room in the model's context: every prompt was skipped as "longer
    than -77 tokens", and the run ended saying it had answered 0."""
    if max_tokens > loaded.context_length - 2:
        raise RedrafterError(f"replies of up to {max_tokens} tokens leave no room for a prompt in the model's context "
                             f"of {loaded.context_length} tokens: give --max-tokens {loaded.context_length - 2} or "
                             "less")


def distill(loaded, prompts: List[str], out: Path, batch_size: int = 16, max_tokens: int = 256, progress=True,
            temperature: float = 0.0, seed: int = 0, batch_tokens: Optional[int] = None,
            max_prompt_tokens: Optional[int] = None) -> int:
    """Answer every prompt not yet in out/done.txt (greedily, or sampled at `temperature`),
    in batches of at most `batch_size` prompts and `batch_tokens` padded tokens (prompt plus
    `max_tokens`; default batch_size * (max_tokens + 128)). Prompts whose chat-template ids
    do not leave `max_tokens` in the context, or are longer than `max_prompt_tokens`, are
    skipped (with a count on stderr; every prompt, none answered before, is a RedrafterError). Returns the
    number answered now."""
    from tqdm import tqdm

    check_reply_room(loaded, max_tokens)
    mx.random.seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    done_file = out / "done.txt"
    done = set(done_file.read_text().split()) if done_file.exists() else set()
    unique = {}  # each prompt once, at its first place
    for p in prompts:
        unique.setdefault(key_of(p), p)
    if len(unique) < len(prompts):  # (each copy was answered, the same greedy reply trained on again and again)
        print(f"distill: {len(prompts) - len(unique)} of {len(prompts)} prompts repeat earlier ones, and are answered "
              "once", file=sys.stderr)
    todo = [(k, p) for k, p in unique.items() if k not in done]
    if unique and not todo:  # (a run resumed after its last batch said "answered 0 prompts", nothing more)
        print(f"distill: all {len(unique)} prompt{'s' if len(unique) > 1 else ''} were answered before, in {out}: "
              "none left to answer", file=sys.stderr)
        return 0
    index = next_shard_index(out)
    tok = loaded.tokenizer
    encoded = [(k, tok.prompt_ids(p)) for k, p in todo]
    limit = min(loaded.context_length - max_tokens - 1, max_prompt_tokens or loaded.context_length)
    kept = [(k, ids) for k, ids in encoded if len(ids) <= limit]
    if unique and not kept and len(todo) == len(unique):  # (said "skipped 2 of 2 prompts", "answered 0 prompts", status 0)
        by_flag = max_prompt_tokens is not None and max_prompt_tokens < loaded.context_length - max_tokens - 1
        why = "--max-prompt-tokens" if by_flag else \
            f"the model's context of {loaded.context_length} tokens less replies of up to {max_tokens}"
        what = f"every one of the {len(unique)} prompts" if len(unique) > 1 else "the one prompt"
        fix = "a larger --max-prompt-tokens" if by_flag else "a smaller --max-tokens"
        raise RedrafterError(f"{what} is longer than {limit} tokens (chat template included; {why}): none to answer; "
                             f"give shorter prompts, or {fix}")
    if len(kept) < len(encoded):  # of all the prompts: a resume said "skipped 3 of 3", of the 3 left
        before = len(unique) - len(todo)
        said = f" ({before} answered before{'' if kept else '; none left to answer'})" if before else ""
        print(f"distill: skipped {len(encoded) - len(kept)} of {len(unique)} prompt{'s' if len(unique) > 1 else ''} "
              f"longer than {limit} tokens{said}", file=sys.stderr)
    encoded = kept
    if not encoded:  # (a resume with nothing left to answer drew an empty 0/0 bar)
        return 0
    budget = batch_tokens or batch_size * (max_tokens + 128)
    batches = length_batches([len(ids) + max_tokens for _, ids in encoded], batch_size, budget)
    # a resumed run's bar starts at the prompts answered before, as self-instruct's and train's do (it began at 0 of
    # the ones left: "0/6" under redrafter-train's "10 prompts")
    before = len(unique) - len(todo)
    bar = tqdm(total=before + len(encoded), initial=before, desc="distill", unit="prompt", disable=not progress,
               bar_format="{l_bar}{bar}| {n:.0f}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]")
    produced, finished, t0 = 0, before, time.perf_counter()
    # the bar is closed however the loop ends, at the prompts answered: an error (a full disk) was said on the bar's
    # line, and the bar drawn again after it, at a count the replies being written had not reached (6/6 of 3)
    try:
        for b in batches:
            # The bar moves during a batch (a batch can take minutes): each decoding step is worth
            # len(b) / max_tokens prompts, and the batch's end sets the exact count.
            tick = len(b) / max_tokens
            rows = generate_batch(loaded.model, [encoded[i][1] for i in b], max_tokens, tok.eos_token_ids, temperature,
                                  on_step=lambda: bar.update(tick) if bar.n + tick < finished + len(b) else None)
            samples = [
                {"key": encoded[i][0], "prompt": encoded[i][1], "reply": r, "hidden": hs, "greedy": g}
                for i, (r, hs, g) in zip(b, rows)
            ]
            write_shard(out, index, samples)
            index += 1
            produced += sum(len(r) for r, _, _ in rows)
            finished += len(b)
            bar.update(finished - bar.n)
            bar.set_postfix(tok_s=f"{produced / (time.perf_counter() - t0):.0f}")
    finally:
        bar.n = finished
        bar.close()
    return len(encoded)


SELF_INSTRUCT = "Come up with a series of diverse tasks:\n{examples}\n{next}."  # continued as plain text
SEEDS_SHOWN = 3  # seed tasks in each self-instruct prompt


def check_seeds(seeds: Sequence[str]):
    """Self-instruct needs SEEDS_SHOWN different seed tasks or more (also checked before any model loads): a file of
    one prompt three times passed, and the model was shown the same task three times over."""
    distinct = len(set(seeds))
    if distinct < SEEDS_SHOWN:
        repeats = len(seeds) - distinct
        said = f" ({repeats} more repeat {'it' if distinct == 1 else 'them'})" if repeats else ""
        raise RedrafterError(f"{distinct} prompt{'' if distinct == 1 else 's'}{said} to write new tasks from: give at "
                             f"least {SEEDS_SHOWN} different ones (self-instruct shows the model {SEEDS_SHOWN} at a "
                             "time), and a few hundred for a useful drafter")


def clean_task(text: str) -> str:
    """The first non-empty line of a generated task, without numbering or quotes; '' if unusable."""
    for line in text.splitlines():
        line = line.strip().lstrip("0123456789.-*) ").strip().strip('"').strip()
        if line.lower().startswith(("task:", "new task:")):
            line = line.split(":", 1)[1].strip()
        if line.lower().startswith(("here", "sure", "i ")):
            return ""
        if line:
            return line if 15 <= len(line) <= 400 else ""
    return ""


def _shortened(task: str, limit: int = 160) -> str:
    """A seed task on one line, cut at a word boundary near `limit` characters: the batch is
    padded to its longest prompt, and prefill (~300 tokens/s on a 2-core CPU) dominates."""
    text = " ".join(task.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def _tasks_in(path: Path) -> List[str]:
    """The tasks a self-instruct file holds. A line cut short (a full disk, a killed process) is dropped, and the
    file rewritten without it: it stopped every later run with a JSONDecodeError traceback."""
    tasks, lines = [], [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for line in lines:
        try:
            task = json.loads(line)["instruction"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(task, str):
            tasks.append(task)
    if len(tasks) < len(lines):  # (appended to below: a line cut short would run into the next)
        path.write_text("".join(json.dumps({"instruction": t}) + "\n" for t in tasks))
    return tasks


def self_instruct(loaded, seeds: List[str], n: int, path: Path, batch_size: int = 16, seed: int = 0,
                  progress=True) -> List[str]:
    """Widen the prompt set (self-instruct, Wang et al. 2022): the base model writes new tasks,
    continuing a numbered list of SEEDS_SHOWN random seed tasks as plain text (no chat template),
    sampled at temperature 0.7 until the line ends. Tasks are appended to
    `path` as JSONL ({"instruction": ...}); a rerun keeps the ones there and writes the rest.
    Returns all n (or fewer, if the model keeps repeating itself) tasks."""
    from tqdm import tqdm

    check_seeds(seeds)
    path.parent.mkdir(parents=True, exist_ok=True)
    have = _tasks_in(path) if path.exists() else []
    seen = set(have) | set(seeds)
    rng = np.random.default_rng(seed + len(have))
    mx.random.seed(seed + len(have))
    tok = loaded.tokenizer
    bar = tqdm(total=n, initial=min(len(have), n), desc="self-instruct", unit="task", disable=not progress)
    tries = 0
    stops = list(tok.eos_token_ids) + [i for i in range(tok.vocab_size) if "\n" in tok.decode([i])]  # end of line
    try:  # closed however the loop ends: an error (a full disk) was said on the bar's line
        while len(have) < n and tries < 4 * n:
            picks = [rng.choice(len(seeds), size=SEEDS_SHOWN, replace=False) for _ in range(batch_size)]
            prompts = [
                tok.encode(SELF_INSTRUCT.format(
                    examples="\n".join(f"{j + 1}. {_shortened(seeds[i])}" for j, i in enumerate(p)), next=len(p) + 1))
                for p in picks
            ]
            # a batch can take minutes on a large model, and the tasks it wrote are counted at its end: the bar says
            # how far the batch is (it stood at 0 tasks, saying nothing, for the whole first batch)
            written = {"tokens": 0, "batch": tries // batch_size + 1}

            def tick():
                written["tokens"] += 1
                if written["tokens"] % 8 == 0:
                    bar.set_postfix_str(f"batch {written['batch']}: {written['tokens']} of up to 64 tokens")

            rows = generate_batch(loaded.model, prompts, 64, stops, temperature=0.7, on_step=tick)
            tries += batch_size
            new = []
            for reply, _, _ in rows:
                if len(reply) >= 64:  # ran on without ending its line: usually a loop
                    continue
                task = clean_task(tok.decode(reply))
                if task and task not in seen:
                    seen.add(task)
                    new.append(task)
            new = new[: n - len(have)]
            with open(path, "a") as f:
                for task in new:
                    f.write(json.dumps({"instruction": task}) + "\n")
            have += new
            bar.update(len(new))
    finally:
        bar.close()
    if len(have) < n:  # (the bar stopped short, 1/2, and the run went on saying nothing)
        print(f"self-instruct: the model wrote {len(have)} new task{'' if len(have) == 1 else 's'} of the {n} asked in "
              f"{tries} tries (the others repeated a task or a seed, or ran on without ending their line); the "
              "prompts are answered without the rest", file=sys.stderr)
    return have


def main(argv=None):
    p = cli.Parser(prog="python -m redrafter_mlx.distill", description=__doc__.split("\n\n")[0])
    cli.add_version(p)
    p.add_argument("--model", default=None,
                   help="the base model the drafter is for: registry name, local path or hub id "
                        "(default: smollm2-135m)")
    p.add_argument("--data", nargs="+", type=cli.path, metavar="FILE",
                   help="prompt JSONL files, lines with 'prompt', 'instruction' (alpaca, with its 'input'; "
                        "self-instruct seeds), 'question' (GSM8K) or Spec-Bench 'turns' (the first); MT-Bench is "
                        "refused (it is the benchmark); required unless --backfill-greedy")
    p.add_argument("--out", type=cli.path, required=True,
                   help="folder for the replies and hidden states (shards); a run stopped early resumes there (the same "
                        "--model, --temperature and --weight-format: another's is refused)")
    p.add_argument("--offset", type=cli.non_negative, default=0, metavar="N",
                   help="skip the first N prompts (interleaved across files and --self-instruct's new tasks; "
                        "default: 0)")
    p.add_argument("--limit", type=cli.positive, default=None, metavar="N",
                   help="use N prompts from --offset (interleaved across files and --self-instruct's new tasks; "
                        "default: all)")
    p.add_argument("--batch-size", type=cli.positive, default=16, metavar="N",
                   help="most prompts answered together (default: 16)")
    p.add_argument("--batch-tokens", type=cli.positive, default=None, metavar="N",
                   help="most padded tokens (prompt + --max-tokens) in a batch; long prompts go in smaller batches "
                        "(default: batch size x (max tokens + 128))")
    p.add_argument("--max-tokens", type=cli.positive, default=256, metavar="N",
                   help="longest reply, in tokens (default: 256)")
    p.add_argument("--max-prompt-tokens", type=cli.positive, default=None, metavar="N",
                   help="skip prompts of more than N tokens (chat template included): on a CPU the few very long "
                        "ones cost more than they teach (default: all that leave --max-tokens in the context)")
    p.add_argument("--weight-format", default="float32", choices=WEIGHT_FORMATS,
                   help="the base model's weights while distilling: auto = the fastest for this device, stored = as "
                        "in the file (e.g. 4-bit), or a dtype (default: float32)")
    p.add_argument("--self-instruct", type=cli.non_negative, default=0, metavar="N",
                   help="first have the model write N new tasks from the seed tasks (files named seed_tasks*, "
                        "else all --data) into OUT/self_instruct.jsonl, and answer them too, as one more file of "
                        "prompts: --offset and --limit count them, and must take them all (default: 0, none)")
    p.add_argument("--temperature", type=cli.temperature, default=0.0, metavar="T",
                   help="sample replies at T instead of greedy ones: more varied contexts, still the model's own "
                        "text (answers are keyed by prompt: use another --out than the greedy run; default: 0, greedy)")
    p.add_argument("--seed", type=cli.seed, default=None, metavar="N",
                   help="sampling seed of --temperature and of --self-instruct's new tasks, 0 to 2**64 - 1 "
                        "(default: 0)")
    p.add_argument("--backfill-greedy", action="store_true",
                   help="answer no prompts: only add the base model's greedy token at each reply position (what "
                        "training learns from sampled replies) to the shards of a sampled run in OUT written before "
                        "they were stored, then stop")
    args = p.parse_args(argv)
    unused = [flag for flag, given in (("--data", args.data), ("--offset", args.offset), ("--limit", args.limit),
                                       ("--batch-tokens", args.batch_tokens), ("--max-prompt-tokens", args.max_prompt_tokens),
                                       ("--self-instruct", args.self_instruct), ("--temperature", args.temperature),
                                       ("--seed", args.seed is not None),
                                       ("--batch-size", args.batch_size != p.get_default("batch_size")),
                                       ("--max-tokens", args.max_tokens != p.get_default("max_tokens"))) if given]
    if args.backfill_greedy and unused:  # they were ignored, saying nothing: backfilling answers no prompts
        p.error(f"--backfill-greedy only adds greedy tokens to the shards in --out, answering no prompts: drop "
                f"{', '.join(unused)}")
    if not args.backfill_greedy and not args.data:
        p.error("--data is required (prompt JSONL files)")
    bad_out = cli.run_folder_error("--out", args.out)
    if bad_out:
        p.error(bad_out)
    if args.seed is not None and args.temperature == 0.0 and not args.self_instruct:  # as the other commands refuse it
        p.error("--seed applies to sampling, and --temperature 0 answers greedily: add --temperature T above 0 "
                "(or --self-instruct N, whose tasks are sampled), or drop it")
    args.seed = 0 if args.seed is None else args.seed
    # a full disk while writing a shard said nothing of the replies kept (Ctrl-C says the same command answers the rest)
    resume = None if args.backfill_greedy else f"run the same command again to answer the rest (the replies written " \
                                               f"so far are kept in {args.out})"
    return cli.run("python -m redrafter_mlx.distill", lambda: _distill(args), resume=resume)


def _distill(args):
    from .loader import load

    if args.backfill_greedy:
        if not any(args.out.glob("shard-*.npz")):  # (it loaded the model and said "added greedy tokens to 0 shards")
            raise RedrafterError(f"no distillation shards in {args.out} to add greedy tokens to: give the --out of a "
                                 "sampled distillation run")
        # (another model's greedy tokens were added to the shards, saying nothing; the recorded temperature is
        # the sampled run's own)
        recorded = (args.out / "source.json").is_file()
        if recorded:
            same_source(args.out, args.model, None)
        loaded = load(args.model, weight_format=args.weight_format, use_drafter=False)
        if recorded:
            same_format(args.out, None, loaded.weight_format, args.weight_format)
        with one_run_in(args.out, _busy(args.out)):
            print(f"added greedy tokens to {backfill_greedy(loaded.model, args.out)} shards", file=sys.stderr)
        return
    per_file = read_prompt_files(args.data)
    total = sum(map(len, per_file)) + args.self_instruct
    if args.offset >= total:  # (it loaded the model and said "answered 0 prompts")
        raise RedrafterError(f"--offset {args.offset} skips all {total} prompts"
                             + (f" (with the {args.self_instruct} new tasks)" if args.self_instruct else "")
                             + ": give a smaller one")
    if args.self_instruct:  # the prompts taken are interleaved with the tasks: --limit took a share of them, and the
        # rest were written, minutes of sampling, and never answered, saying nothing
        marked = interleave([[False] * len(qs) for qs in per_file] + [[True] * args.self_instruct])[args.offset :]
        taken = sum(marked[: args.limit] if args.limit else marked)
        if taken < args.self_instruct:
            flags = " and ".join(flag for flag, given in (("--offset", args.offset), ("--limit", args.limit)) if given)
            fewer = f"--self-instruct {taken}" if taken else "no --self-instruct"
            raise RedrafterError(f"{flags} take{'' if ' and ' in flags else 's'} {taken} of the {args.self_instruct} "
                                 "new tasks (the prompts are interleaved across the files and the tasks), and the "
                                 f"other {args.self_instruct - taken} would be written and never answered: give "
                                 + (f"a larger --limit, or {fewer}" if not args.offset else "a smaller --offset"
                                    if not args.limit else "an --offset and --limit that take them all"))
    seeds = [q for f, qs in zip(args.data, per_file) if "seed_tasks" in Path(f).name for q in qs]
    seeds = seeds or [q for qs in per_file for q in qs]
    if args.self_instruct:  # (said after the model had loaded, as its docstring did not promise)
        check_seeds(seeds)
    source = same_source(args.out, args.model, args.temperature)  # before the model loads
    loaded = load(args.model, weight_format=args.weight_format, use_drafter=False)
    source = same_format(args.out, source, loaded.weight_format, args.weight_format)
    check_reply_room(loaded, args.max_tokens)  # (before --out is made)
    if not loaded.tokenizer.has_chat_template:  # (redrafter-train says so; this command said nothing)
        print(f"distill: note: {loaded.name} has no chat template, so the prompts reach it as plain text to continue "
              "(as chat messages will): for a chat model, give it one (python -m convert --chat-template)",
              file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    with one_run_in(args.out, _busy(args.out)):
        if source is not None:
            write_json(args.out / "source.json", source)
        if args.self_instruct:
            # (with --seed: its tasks were sampled from seed 0 whatever --seed said)
            try:
                tasks = self_instruct(loaded, seeds, args.self_instruct, args.out / "self_instruct.jsonl",
                                      args.batch_size, seed=args.seed)
            except KeyboardInterrupt as e:  # (it said "cancelled", as if the tasks written were lost)
                raise KeyboardInterrupt(f"cancelled; the new tasks written so far are in "
                                        f"{args.out / 'self_instruct.jsonl'}: the same command writes the rest and "
                                        "answers the prompts") from e
            per_file.append(tasks)
        prompts = interleave(per_file)[args.offset :]
        if args.limit:
            prompts = prompts[: args.limit]
        try:
            n = distill(loaded, prompts, args.out, args.batch_size, args.max_tokens, temperature=args.temperature,
                        seed=args.seed, batch_tokens=args.batch_tokens, max_prompt_tokens=args.max_prompt_tokens)
        except KeyboardInterrupt as e:  # (it said "cancelled")
            raise KeyboardInterrupt(f"cancelled; the replies written so far are in {args.out}: the same command "
                                    "answers the rest") from e
        print(f"answered {n} prompt{'' if n == 1 else 's'} into {args.out}", file=sys.stderr)  # (not "1 prompts")


def _busy(out: Path) -> str:
    return f"another distill is writing into {out}: let it finish (or stop it: its replies are kept), or give " \
           "another --out"


def same_source(out: Path, model: Optional[str], temperature: Optional[float]) -> Optional[dict]:
    """Refuse to add to `out` replies from another model or at another temperature (None: not compared): its
    prompts already answered were skipped, and the run said "answered 0 prompts" and left the first model's
    replies to train the second's drafter. Returns what a first run records in OUT/source.json (None: recorded
    already); a folder from before it was recorded is taken as this run's."""
    from . import registry
    from .files import read_json_object
    from .train import weights_fingerprint

    resolved = registry.resolve(model)
    here = {"model": resolved.name, "weights": weights_fingerprint(resolved.path), "temperature": temperature}
    record = out / "source.json"
    if not record.is_file():
        return here
    there = read_json_object(record, "distillation record")
    diffs = []
    if there.get("weights") != here["weights"]:  # the same weights under another name are the same
        diffs.append(f"model {there.get('model')} there, {here['model']} here" if there.get("model") != here["model"]
                     else f"other weights in {here['model']} now")
    if temperature is not None and there.get("temperature") != temperature:
        diffs.append(f"--temperature {there.get('temperature')} there, {temperature} here")
    if diffs and temperature is None:  # (--backfill-greedy)
        raise RedrafterError(f"{out} holds the replies of another run ({'; '.join(diffs)}): give the --model they "
                             "came from to add its greedy tokens to them")
    if diffs:
        raise RedrafterError(f"{out} holds the replies of another run ({'; '.join(diffs)}), whose prompts would count "
                             "as answered: give the same --model and --temperature to add to them, or another --out")
    return None


def same_format(out: Path, source: Optional[dict], weight_format: str, option: str) -> Optional[dict]:
    """Refuse to add to `out` replies (and hidden states) computed with the base model's weights in another format:
    a run resumed with another --weight-format went on into the same shards, mixing the two. `weight_format` is what
    the load made of --weight-format `option` ("float32", "4-bit (group 32)": "auto" and "float32" can be one).
    Returns the record to write (`source`, or the one there when it does not say its format yet) with the format in
    it, or None."""
    here = {"weight_format": weight_format, "weight_format_option": option}
    if source is not None:
        return {**source, **here}
    from .files import read_json_object

    there = read_json_object(out / "source.json", "distillation record")
    if there.get("weight_format") is None:  # recorded before the format was: taken as this run's
        return {**there, **here}
    if there["weight_format"] != weight_format:
        raise RedrafterError(f"{out} holds replies computed with {there['weight_format']} weights, and --weight-format "
                             f"{option} loads {weight_format} ones: give --weight-format "
                             f"{there.get('weight_format_option', there['weight_format'])} to add to them, or another "
                             "--out")
    return None


def read_prompt_files(paths: List[Path]) -> List[List[str]]:
    """The user messages of each prompt file (`read_prompts`); a file that is missing, is not
    JSONL, or holds no prompts is a RedrafterError that names it."""
    groups = []
    for path in paths:
        try:  # (a file that is missing, a folder, unreadable or not UTF-8 is a RedrafterError that names it)
            prompts = read_prompts([Path(path)])
        except (ValueError, AttributeError) as e:  # json.JSONDecodeError is a ValueError
            raise RedrafterError(f"{path}: {str(e).splitlines()[0]}") from e
        if not prompts:
            raise RedrafterError(f"{path} holds no prompts (JSONL lines with 'prompt', 'instruction', 'question' or "
                                 "'turns')")
        groups.append(prompts)
    return groups


def interleave(groups: List[List[str]]) -> List[str]:
    """Round-robin over the files, so a --limit takes from each of them."""
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


if __name__ == "__main__":
    sys.exit(main())
