"""Train a ReDrafter draft head, base model frozen, on the replies python -m redrafter_mlx.distill kept.

    python -m redrafter_mlx.train --model smollm2-135m --data runs/distill --out runs/drafter \
        --depth 4 --steps 2000 --batch 512 --draft-vocab 8192

Loss (ReDrafter paper, section 3.4): at reply position i, with h_i the base model's hidden
state that predicted reply token r_i, the head whose recurrent state has consumed the
embeddings of r_i .. r_{i+k} predicts r_{i+k+1}, for k = 0 .. depth-1; the loss is the sum
of these cross-entropies over reply tokens (the data holds replies only). With a draft
vocabulary (the most frequent reply tokens), the softmax runs over that vocabulary only,
the same one drafting uses, which makes training and drafting several times cheaper;
targets outside it are skipped (they can never be drafted).

AdamW with linear warmup and cosine decay; checkpoints (drafter + optimizer + step + RNG)
every --save-every steps into --out/checkpoint, resumed automatically; a progress bar with
loss and per-depth top-1 accuracy; at the end the drafter is saved to --out/drafter and,
with --eval-prompts, real ReDrafter decoding reports tokens/step.
"""

import contextlib
import hashlib
import json
import math
import shutil
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from . import _platform  # noqa: F401

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from . import cli  # noqa: E402
from .config import DrafterArgs  # noqa: E402
from .drafter import Drafter, load_drafter, save_drafter  # noqa: E402
from .errors import CorruptModelError, RedrafterError, SettingError, one_line  # noqa: E402
from .files import one_run_in, read_json_object, replace_folder, staging_folder, write_json  # noqa: E402
from .tuning import parse_shapes  # noqa: E402


class PositionData:
    """All (hidden, following tokens) training positions of a distillation folder.

    greedy_targets: predict the base model's greedy token at each position (the sample's
    "greedy" ids) instead of the reply token itself. The same for greedy replies; for sampled
    ones it is what greedy verification accepts, while the inputs stay the sampled tokens
    (the contexts the reply actually went through)."""

    def __init__(self, samples: List[dict], depth: int, greedy_targets: bool = False):
        hs, toks, starts, best = [], [], [], []
        offset = 0
        for s in samples:
            n = len(s["reply"])
            if n < 2:
                continue
            hs.append(s["hidden"])
            toks.append(np.asarray(s["reply"], dtype=np.int32))
            if greedy_targets:
                best.append(np.asarray(s.get("greedy", s["reply"]), dtype=np.int32))
            starts.append(np.arange(offset, offset + n - 1))  # positions with at least one target
            offset += n
        if not hs:
            raise RedrafterError(f"none of the {len(samples)} replies has 2 tokens or more to learn from: distil "
                                 "longer replies (distill --max-tokens)")
        self.hidden = np.concatenate(hs).astype(np.float32)  # (N, H)
        self.tokens = np.concatenate([np.concatenate(toks), np.full(depth + 1, -1, np.int32)])  # padded with -1
        self.targets = np.concatenate([np.concatenate(best), np.full(depth + 1, -1, np.int32)]) if best else self.tokens
        self.positions = np.concatenate(starts)
        # a position's window must not run into the next reply
        ends = np.concatenate([np.full(len(t), o + len(t)) for t, o in zip(toks, np.cumsum([0] + [len(t) for t in toks[:-1]]))])
        self.end = ends  # (N,) exclusive end of each position's reply
        self.depth = depth

    def __len__(self):
        return len(self.positions)

    def batch(self, idx: np.ndarray):
        """h (B, H), inputs (B, K) = r_i..r_{i+K-1}, targets (B, K) = r_{i+1}..r_{i+K} (-1 = none),
        and the base model's hidden states that predicted the targets, (B, K, H) (the teacher's
        view of each target, for soft targets; rows past the reply's end are arbitrary)."""
        pos = self.positions[idx]
        K = self.depth
        window = pos[:, None] + np.arange(K + 1)[None, :]  # (B, K+1)
        inside = window < self.end[pos][:, None]
        toks = np.where(inside, self.tokens[window], -1)
        targets = np.where(inside, self.targets[window], -1)[:, 1:]
        teacher = self.hidden[np.minimum(window[:, 1:], len(self.hidden) - 1)]  # (B, K, H)
        return self.hidden[pos], np.maximum(toks[:, :K], 0), targets, teacher


def _reply_key(sample: dict) -> bytes:
    return np.asarray(sample["reply"][:32], dtype=np.int32).tobytes()


def is_held_out(sample: dict, fraction: float) -> bool:
    """A stable train/held-out split: by a hash of the reply's first tokens."""
    return zlib.crc32(_reply_key(sample)) % 10000 < fraction * 10000


def held_out_key(samples: List[dict]) -> str:
    """Names a held-out set, so that a resumed run knows whether its best score is comparable."""
    crc = 0
    for s in samples:
        crc = zlib.crc32(_reply_key(s), crc)
    return f"{len(samples)}:{crc:08x}"


def frequent_tokens(samples: List[dict], size: int, always=()) -> List[int]:
    counts = Counter()
    for s in samples:
        counts.update(np.asarray(s["reply"]).tolist())
    ids = [t for t, _ in counts.most_common(size)]
    for t in always:
        if t not in ids:
            ids.append(int(t))
    return sorted(ids[: max(size, len(always))])


def loss_fn(drafter: Drafter, base, h, inputs, targets, remap, teacher=None, soft: float = 0.0):
    """Sum over depths of the mean cross-entropy; also per-depth top-1 accuracy on the targets.

    soft > 0 mixes in distillation from the base model's own distribution (Hinton et al.):
    (1 - soft) * CE(target token) + soft * CE(softmax of the base logits over the draft
    vocabulary, computed from `teacher` (B, K, H), the hidden states that predicted the
    targets). The full distribution says more per position than its sampled token, and its
    argmax is the greedy token even where a sampled reply took another one."""
    emb = base.embed(inputs).astype(h.dtype)  # (B, K, H)
    state = mx.zeros_like(h)
    losses, hits = [], []
    for k in range(inputs.shape[1]):
        state = drafter.update_state(emb[:, k], state)
        logits = drafter.draft_logits(h, state, base).astype(mx.float32)  # (B, V_draft)
        tgt = remap[mx.maximum(targets[:, k], 0)]  # draft-vocab index, -1 when outside
        valid = (targets[:, k] >= 0) & (tgt >= 0)
        ce = nn.losses.cross_entropy(logits, mx.maximum(tgt, 0), reduction="none")
        n = mx.maximum(valid.sum(), 1)
        loss = (ce * valid).sum() / n
        if soft > 0:
            p = mx.softmax(mx.stop_gradient(drafter.vocab_logits(teacher[:, k], base)).astype(mx.float32), axis=-1)
            soft_ce = -(p * nn.log_softmax(logits, axis=-1)).sum(axis=-1)  # (B,)
            present = targets[:, k] >= 0
            loss = (1 - soft) * loss + soft * (soft_ce * present).sum() / mx.maximum(present.sum(), 1)
        losses.append(loss)
        hits.append(((mx.argmax(logits, axis=-1) == tgt) & valid).sum() / n)
    return sum(losses), mx.stack(hits)


def accepted_drafts(acc) -> float:
    """Expected accepted draft tokens per step of one greedy beam whose depth-k draft is right
    with probability acc[k] given the earlier ones: acc[0] + acc[0] acc[1] + ..."""
    return float(np.sum(np.cumprod(acc)))


def save_copy(drafter: Drafter, path: Path, dtype=None, extra_config: dict = None):
    """Save the drafter (cast to `dtype`, if given) without touching the one being trained."""
    copy = Drafter(drafter.args)
    copy.update(drafter.parameters())
    if dtype is not None:
        copy.set_dtype(dtype)  # floating parameters only
    save_drafter(copy, path, extra_config)


def default_warmup(steps: int) -> int:
    """Warm-up steps when none are given: 50, or a fifth of the steps when that is fewer (redrafter-train's budgets
    too). A fixed 50 left a run of 50 steps or fewer in warm-up to its end, never decaying."""
    return min(50, steps // 5)


def warmup_error(warmup: int, steps: int) -> Optional[str]:
    """Why `warmup` does not fit a run of `steps` steps, or None: the learning rate would rise to its last step (or
    stop short of its peak) and never decay."""
    if warmup >= steps:
        return (f"--warmup {warmup} is not fewer than --steps {steps}: the learning rate would warm up to the last "
                f"step and never decay; give a --warmup under {steps} (or none: {default_warmup(steps)} for "
                f"{steps} steps)")
    return None


def lr_schedule(peak: float, warmup: int, total: int):
    warm = optim.linear_schedule(peak * 0.01, peak, max(warmup, 1))
    cos = optim.cosine_decay(peak, max(total - warmup, 1), end=peak * 0.05)
    return optim.join_schedules([warm, cos], [max(warmup, 1)])


def save_checkpoint(folder: Path, drafter: Drafter, opt, step: int, rng: np.random.Generator, extra: dict = None):
    """The drafter, optimizer state, step and RNG, written into a staging folder that then replaces
    `folder` whole. (Written in place one file after another, Ctrl-C between them left a new
    drafter beside the previous checkpoint's step: the resumed run trained those steps again on
    weights that had already had them.)"""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging_folder(folder)
    try:
        save_drafter(drafter, tmp / "drafter")
        state = dict(tree_flatten(opt.state))
        mx.save_safetensors(str(tmp / "optimizer.safetensors"), {k: v for k, v in state.items() if isinstance(v, mx.array)})
        meta = {"step": step, "rng": rng.bit_generator.state, **(extra or {})}
        write_json(tmp / "state.json", meta, indent=None)
        replace_folder(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _damaged(ckpt: Path, why) -> RedrafterError:
    return RedrafterError(f"the checkpoint {ckpt} is damaged ({why}): delete it to train from the start")


def read_state(ckpt: Path) -> dict:
    """CKPT/state.json: the step, RNG and records of a checkpoint. A damaged one (not JSON, no step) is a
    RedrafterError that says what to do: it stopped every later run with a traceback from inside json."""
    try:
        state = read_json_object(Path(ckpt) / "state.json", "checkpoint's state")
    except CorruptModelError as e:
        raise _damaged(ckpt, e) from e
    if isinstance(state.get("step"), bool) or not isinstance(state.get("step"), int):
        raise _damaged(ckpt, "its state.json holds no step")
    return state


def checkpoint_step(ckpt: Path) -> int:
    """The step the checkpoint folder `ckpt` holds (0: none yet)."""
    return read_state(ckpt)["step"] if (ckpt / "state.json").is_file() else 0


def log_row(line: str) -> Optional[dict]:
    """One train_log.jsonl row; None for a line that is not a JSON object (cut short)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def open_log(out: Path):
    """OUT/train_log.jsonl for appending, without the rows of steps after OUT's checkpoint: a
    stopped run logged them, and the resumed run trains and logs those steps again (a log read
    as 215 rows for 200 steps)."""
    path = Path(out) / "train_log.jsonl"
    if path.is_file():
        done = checkpoint_step(Path(out) / "checkpoint")
        rows = [line for line in path.read_text().splitlines() if line.strip()]
        # a line cut short (a full disk, a killed process) is dropped: it stopped every later run with a traceback
        kept = [line for line in rows if (row := log_row(line)) is not None and row.get("step", 0) <= done]
        if len(kept) < len(rows):
            path.write_text("".join(line + "\n" for line in kept))
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a")


def weights_fingerprint(path: Path, samples: int = 64, size: int = 4096) -> str:
    """A digest of a model's weight files (a GGUF file, or a folder's *.safetensors) by content: each
    file's name, size and `samples` pieces of `size` bytes spread over it (hashing gigabytes whole
    would take a while). A copy of the same weights elsewhere, or touched since, keeps its
    fingerprint (costs.model_files_digest, by path and modification time, would not)."""
    path = Path(path)
    digest = hashlib.sha256()
    for f in [path] if path.is_file() else sorted(path.glob("*.safetensors")):
        n = f.stat().st_size
        digest.update(f"{f.name}:{n};".encode())
        with open(f, "rb") as fh:
            for i in range(samples):
                fh.seek(max(n - size, 0) * i // max(samples - 1, 1))
                digest.update(fh.read(size))
    return digest.hexdigest()[:16]


SHAPE_FIELDS = ("hidden_size", "vocab_size", "exit_dim", "num_draft_layers", "lm_head", "rnn")  # a drafter config's


def check_same_run(folder: Path, args: DrafterArgs, depth: int, model: Optional[dict] = None):
    """Refuse to resume the checkpoint `folder` for a drafter of another shape, depth or base model
    (`model`: the base model's name and `weights_fingerprint`, when both runs recorded one): it was
    resumed as if it were this run's, silently (another model of the same width, another --depth) or
    with a traceback from inside MLX (another --exit-dim or --layers). Data is not compared: a run
    may re-read a growing data folder (--reload-every)."""
    here = vars(args)
    try:
        saved = vars(DrafterArgs.from_dict(read_json_object(folder / "drafter" / "config.json", "drafter config")))
    except (OSError, TypeError):  # missing, or not a drafter's config: load_checkpoint says so
        saved = here
    meta = read_state(folder)
    diffs = [f"{k} {saved[k]} there, {here[k]} here" for k in SHAPE_FIELDS if saved[k] != here[k]]
    if meta.get("depth", depth) != depth:
        diffs.append(f"depth {meta['depth']} there, {depth} here")
    there = meta.get("model")
    if there and model and there["weights"] != model["weights"]:  # the same weights under another name are the same
        diffs.append(f"model {there['name']} there, {model['name']} here" if there["name"] != model["name"]
                     else f"other weights in {model['name']} now")
    if diffs:
        raise RedrafterError(f"{folder} is the checkpoint of another run ({'; '.join(diffs)}): give the same --model, "
                             "--depth, --exit-dim and --layers to resume it, or another --out to start a new one")


def load_checkpoint(folder: Path, drafter: Drafter, opt):
    d = load_drafter(folder / "drafter")
    params = d.parameters()
    params.pop("draft_vocab", None)  # the caller sets the vocabulary from its data
    drafter.update(params)
    meta = read_state(folder)
    if "rng" not in meta:
        raise _damaged(folder, "its state.json holds no RNG state")
    try:  # (an RNG state of another kind, a missing or cut optimizer file: tracebacks from numpy and MLX)
        rng = np.random.default_rng()
        rng.bit_generator.state = meta["rng"]
        state = mx.load(str(folder / "optimizer.safetensors"))
    except (RuntimeError, ValueError, TypeError, KeyError) as e:
        raise _damaged(folder, one_line(e)) from e
    opt.state = tree_unflatten(list(state.items()))
    return meta["step"], rng, meta


def train(
    base,
    samples: List[dict],
    out: Path,
    *,
    depth: int = 4,
    steps: int = 1000,
    batch: int = 512,
    lr: float = 1e-3,
    warmup: Optional[int] = None,
    weight_decay: float = 0.0,
    exit_dim: Optional[int] = None,
    layers: int = 1,
    draft_vocab: int = 8192,
    eos_ids=(),
    save_every: int = 200,
    seed: int = 0,
    progress: bool = True,
    log=None,
    reload=None,
    reload_every: int = 0,
    val_every: int = 0,
    val_fraction: float = 0.05,
    val_positions: int = 4096,
    save_dtype=None,
    soft: float = 0.0,
    greedy_targets: bool = False,
    model: Optional[dict] = None,
    val_advice: str = "give more replies or a larger share (--val-fraction)",
) -> Drafter:
    """Train (or resume) a 'shared'-head drafter for `base` on distillation samples.

    reload: optional callable returning the samples again (a distillation folder that is still
    growing); called every `reload_every` steps. The draft vocabulary always follows the data
    at hand (for lm_head='shared' it only picks rows of the base model's output embedding, so
    it can change between runs without touching the trained weights).

    val_every: every N steps, the loss and per-depth accuracy on held-out replies (a stable
    `val_fraction` of them, chosen by a hash of their tokens; accuracy counts agreement with
    the base model's greedy token, which for sampled replies may differ from the reply's) is
    logged, and the drafter with
    the most expected accepted drafts so far (`accepted_drafts` of the held-out accuracies) is
    saved to out/best in `save_dtype` (small data overfits fast; held-out loss keeps rising
    from overconfident misses well after top-1 accuracy has stopped improving, so accuracy,
    which is what decoding rewards, decides).

    model: names the base model ({"name", "weights": `weights_fingerprint`}) in the checkpoint; a
    checkpoint of another drafter shape, depth or named model is refused (`check_same_run`).

    val_advice: what the caller's user can do when nothing can be validated (in the caller's options).

    warmup: linear warm-up steps, fewer than `steps` (a SettingError otherwise); None: `default_warmup(steps)`."""
    from tqdm import tqdm

    if warmup is None:
        warmup = default_warmup(steps)
    elif warmup >= steps:  # (the schedule never left its warm-up, saying nothing)
        raise SettingError(f"warmup {warmup} is not fewer than steps {steps}: the learning rate would warm up to the "
                           "last step and never decay")
    out = Path(out)
    widths = sorted({int(np.shape(s["hidden"])[-1]) for s in samples})
    if widths != [base.args.hidden_size]:
        raise RedrafterError(f"the distilled hidden states have {' or '.join(map(str, widths))} dimensions but this base "
                             f"model has {base.args.hidden_size}: train with the model the data was distilled from "
                             "(--model)")
    top = max((int(np.max(s[k])) for s in samples for k in ("reply", "greedy") if k in s and np.size(s[k])), default=-1)
    if top >= base.args.vocab_size:  # same width, another vocabulary: an IndexError, or a crash inside MLX
        raise RedrafterError(f"the distilled replies hold token id {top} but this base model's vocabulary has "
                             f"{base.args.vocab_size}: train with the model the data was distilled from (--model)")
    mx.random.seed(seed)
    args = DrafterArgs(hidden_size=base.args.hidden_size, vocab_size=base.args.vocab_size, exit_dim=exit_dim,
                       num_draft_layers=layers, lm_head="shared", embed_scale=getattr(base.args, "embed_scale", 1.0),
                       base_model_type=getattr(base.args, "model_type", ""))
    drafter = Drafter(args)

    val = {"data": None, "best": -math.inf, "key": None, "said": False}

    def use_data(samples):
        vocab = frequent_tokens(samples, draft_vocab, eos_ids) if draft_vocab else list(range(args.vocab_size))
        drafter.set_draft_vocab(vocab if draft_vocab else None)
        remap = np.full(args.vocab_size, -1, np.int32)
        remap[np.array(vocab)] = np.arange(len(vocab))
        if val_every:
            held = [is_held_out(s, val_fraction) for s in samples]
            val_samples = [s for s, v in zip(samples, held) if v]
            samples = [s for s, v in zip(samples, held) if not v]
            if not samples:  # (it said "none of the 0 replies has 2 tokens or more ...: distil longer replies")
                raise RedrafterError(f"all {len(held)} replies are held out for validation at a share of "
                                     f"{val_fraction}, and none is left to train on: hold out a smaller share "
                                     "(train --val-fraction), or distil more replies")
            # held-out accuracy is agreement with the greedy token: what greedy decoding accepts
            usable = any(len(s["reply"]) >= 2 for s in val_samples)
            val["data"] = PositionData(val_samples, depth, greedy_targets=True) if usable else None
            val["key"] = held_out_key(val_samples)
            if not usable and not val["said"]:  # it validated nothing, saying nothing (said again after a reload)
                why = (f"the {len(val_samples)} held-out replies are under 2 tokens" if val_samples else
                       f"none of the {len(held)} replies is held out at a share of {val_fraction}")
                print(f"validation: {why}, so nothing is validated and no best drafter kept: {val_advice}",
                      file=sys.stderr)
            val["said"] = not usable
        return PositionData(samples, depth, greedy_targets), mx.array(remap)

    def validate():
        vd = val["data"]
        idx = np.unique(np.linspace(0, len(vd) - 1, min(val_positions, len(vd))).astype(np.int64))
        losses, hits, weights = [], [], []
        for b in range(0, len(idx), 1024):
            h, i, t, th = (mx.array(a) for a in vd.batch(idx[b : b + 1024]))
            loss, hit = loss_fn(drafter, base, h, i, t, remap, th, soft)
            losses.append(loss.item())
            hits.append(np.array(hit))
            weights.append(len(idx[b : b + 1024]))
        return float(np.average(losses, weights=weights)), np.average(hits, axis=0, weights=weights).tolist()

    opt = optim.AdamW(learning_rate=lr_schedule(lr, warmup, steps), weight_decay=weight_decay)
    ckpt = out / "checkpoint"
    step, rng = 0, np.random.default_rng(seed)
    meta = {}
    if (ckpt / "state.json").is_file():
        check_same_run(ckpt, args, depth, model)
        step, rng, meta = load_checkpoint(ckpt, drafter, opt)
    data, remap = use_data(samples)  # after a resume too: the vocabulary follows the data
    if meta.get("held_out") == val["key"] and meta.get("best_accepted_drafts") is not None:  # (None: none yet)
        val["best"] = meta["best_accepted_drafts"]  # a best score on another held-out set (new data) does not count
    base.freeze()
    # reads `remap` when called: after a reload, the new data's
    value_and_grad = nn.value_and_grad(drafter, lambda h, i, t, th: loss_fn(drafter, base, h, i, t, remap, th, soft))

    def train_step(h, i, t, th):
        (loss, hits), grads = value_and_grad(h, i, t, th)
        opt.update(drafter, grads)
        return loss, hits

    bar = tqdm(total=steps, initial=step, desc="train", disable=not progress)
    t0 = time.perf_counter()
    try:  # closed however the loop ends: an error (a full disk at a checkpoint) was said on the bar's line
        while step < steps:
            if reload is not None and reload_every and step % reload_every == 0 and step > 0:
                samples = reload()
                data, remap = use_data(samples)
                val["best"] = -math.inf  # a new held-out set: not comparable with the old one
                if log:
                    log.write(json.dumps({"step": step, "reload": len(samples), "positions": len(data)}) + "\n")
            idx = rng.integers(0, len(data), size=batch)
            h, inputs, targets, teacher = (mx.array(a) for a in data.batch(idx))
            loss, hits = train_step(h, inputs, targets, teacher)
            mx.eval(loss, hits, drafter.parameters(), opt.state)
            step += 1
            acc = " ".join(f"{a:.2f}" for a in np.array(hits).tolist())
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=acc)
            bar.update(1)
            if log:
                log.write(json.dumps({"step": step, "loss": loss.item(), "acc": np.array(hits).tolist(),
                                      "seconds": time.perf_counter() - t0}) + "\n")
                log.flush()
            if val_every and val["data"] is not None and (step % val_every == 0 or step == steps):
                vloss, vacc = validate()
                score = accepted_drafts(vacc)
                if log:
                    log.write(json.dumps({"step": step, "val_loss": vloss, "val_acc": vacc,
                                          "val_accepted_drafts": score}) + "\n")
                    log.flush()
                # on stderr with the bar (tqdm's default, stdout, put progress among redrafter-train's results)
                bar.write(f"step {step}: held-out loss {vloss:.3f} acc {' '.join(f'{a:.2f}' for a in vacc)}"
                          f" accepted drafts {score:.3f}", file=sys.stderr)
                if score > val["best"]:
                    val["best"] = score
                    save_copy(drafter, out / "best", save_dtype, {"training": {
                        "step": step, "val_loss": vloss, "val_acc": vacc, "val_accepted_drafts": score}})
            if step % save_every == 0 or step == steps:
                # no best yet is null: -Infinity, which Python wrote and reads back, is not JSON (jq refused the file)
                best = val["best"] if val["best"] > -math.inf else None
                save_checkpoint(ckpt, drafter, opt, step, rng, {"best_accepted_drafts": best, "held_out": val["key"],
                                                                "depth": depth, "model": model})
    finally:
        bar.close()
    return drafter


def evaluate(loaded, prompts: List[str], width: int, length: int, max_tokens: int = 128,
             on_reply=None) -> Dict[str, float]:
    """Real ReDrafter decoding (greedy) of `prompts`; tokens/step = tokens emitted by decode
    steps, the end-of-turn token a step stopped at included, / decode steps (the prefill's first
    token is not counted), as RunStats.tokens_per_step: without the end tokens a reply that ended
    early read as under 1 token a step (0.917 for MT-Bench coding at 16 tokens). `on_reply()` is
    called after each reply (a progress bar's tick)."""
    from .generate import generate

    steps = tokens = ends = 0
    seconds = 0.0
    for p in prompts:
        g = generate(loaded, p, mode="redrafter", max_tokens=max_tokens, beam_width=width, beam_length=length)
        steps += g.stats.steps
        tokens += g.stats.step_tokens
        ends += g.stats.end_tokens
        seconds += g.stats.decode_seconds
        if on_reply is not None:
            on_reply()
    return {"tokens_per_step": (tokens + ends) / max(steps, 1), "steps": steps, "tokens": tokens, "end_tokens": ends,
            "tokens_per_second": tokens / max(seconds, 1e-9)}


def eval_prompts(path: Path, per_category: int) -> List[dict]:
    """The first `per_category` questions (first turns) of each category of a JSONL file of Spec-Bench lines
    ({"turns": [...], "category": ...}) or one-turn {"prompt": ...} lines (their "source" the category where
    they have none), as redrafter-bench --prompts reads them (bench.read_prompts)."""
    from .bench import read_prompts

    taken: Dict[str, int] = {}
    out = []
    for q in read_prompts(Path(path)):
        if taken.get(q["category"], 0) < per_category:
            taken[q["category"]] = taken.get(q["category"], 0) + 1
            out.append(q)
    return out


def evaluate_shapes(loaded, questions: List[dict], shapes, max_tokens: int = 128, out=sys.stderr,
                    progress: bool = True, record=None) -> List[dict]:
    """tokens/step per beam shape (W, L), overall and per category; one JSON line per shape, and a
    progress bar over the replies (16 questions at two shapes took 5 minutes on a CPU, showing nothing).
    `record(row)` is called as each shape's row is done (a run stopped later keeps it)."""
    from tqdm import tqdm

    results = []
    bar = tqdm(total=len(shapes) * len(questions), desc="evaluate", unit="reply", disable=not progress)
    try:  # closed however the loop ends: an error (a full disk at eval.jsonl) was said on the bar's line
        for width, length in shapes:
            per_cat: Dict[str, List[int]] = {}
            t0 = time.perf_counter()
            bar.set_postfix(shape=f"{width}x{length}")
            for cat in dict.fromkeys(q["category"] for q in questions):
                r = evaluate(loaded, [q["prompt"] for q in questions if q["category"] == cat], width, length, max_tokens,
                             on_reply=lambda: bar.update(1))
                per_cat[cat] = [r["tokens"] + r["end_tokens"], r["steps"]]
            tokens = sum(t for t, _ in per_cat.values())
            steps = sum(n for _, n in per_cat.values())
            row = {"beam_width": width, "beam_length": length, "questions": len(questions), "max_tokens": max_tokens,
                   "tokens_per_step": round(tokens / max(steps, 1), 3),
                   "per_category": {c: round(t / max(n, 1), 3) for c, (t, n) in per_cat.items()},
                   "seconds": round(time.perf_counter() - t0, 1)}
            bar.write(json.dumps(row), file=out)  # (above the bar, when both go to the terminal)
            if record is not None:
                record(row)
            results.append(row)
    finally:
        bar.close()
    return results


def main(argv=None):
    p = cli.Parser(prog="python -m redrafter_mlx.train", description=__doc__.split("\n\n")[0])
    cli.add_version(p)
    p.add_argument("--model", default=None,
                   help="the base model the head drafts for, the one --data was distilled from (registry name, "
                        "local path or hub id; default: smollm2-135m)")
    p.add_argument("--data", type=cli.path, nargs="+", metavar="DIR",
                   help="the --out folders of python -m redrafter_mlx.distill (one or more); required unless "
                        "--eval-only")
    p.add_argument("--out", type=cli.path, required=True,
                   help="run folder: checkpoints (a stopped run resumes from them), train_log.jsonl, eval.jsonl, and "
                        "the trained drafter in OUT/drafter (give it to the other commands as --drafter, or put it in "
                        "MODEL/drafter, where they find it by themselves)")
    p.add_argument("--depth", type=cli.positive, default=4,
                   help="draft tokens predicted per position (beam length - 1; default: 4)")
    p.add_argument("--steps", type=cli.positive, default=1000, help="optimizer steps in all, resumed ones included "
                   "(default: 1000)")
    p.add_argument("--batch", type=cli.positive, default=512, help="positions per step (default: 512)")
    p.add_argument("--lr", type=cli.number(0, above=True), default=1e-3,
                   help="peak learning rate, cosine-decayed (default: 1e-3)")
    p.add_argument("--warmup", type=cli.non_negative, default=None,
                   help="linear warm-up steps, fewer than --steps (default: 50, or a fifth of --steps when that is "
                        "fewer)")
    p.add_argument("--weight-decay", type=cli.number(0), default=0.0, help="AdamW weight decay (default: 0)")
    p.add_argument("--val-every", type=cli.non_negative, default=0, metavar="N",
                   help="held-out loss and accuracy every N steps; the most accurate drafter -> OUT/best "
                        "(default: 0, none)")
    p.add_argument("--val-fraction", type=cli.probability, default=0.05,
                   help="with --val-every N: share of the replies held out for validation, in (0, 1) "
                        "(default: 0.05)")
    p.add_argument("--soft", type=cli.number(0, 1), default=0.0, metavar="A",
                   help="weight of the base model's own distribution as target, from 0 to 1 (0: the reply tokens "
                        "only; 1: the distribution only; default: 0)")
    p.add_argument("--greedy-targets", action="store_true",
                   help="predict the base model's greedy token at each position of sampled replies (stored by "
                        "distill --temperature), not the sampled one")
    p.add_argument("--exit-dim", type=cli.positive, default=None,
                   help="width of the head's residual blocks (default: 2 x the base model's hidden size)")
    p.add_argument("--layers", type=cli.positive, default=1, help="residual blocks (default: 1)")
    p.add_argument("--draft-vocab", type=cli.non_negative, default=8192, metavar="N",
                   help="draft from the N tokens most frequent in the replies (0 = the whole vocabulary; default: 8192)")
    p.add_argument("--save-every", type=cli.positive, default=200, metavar="N",
                   help="checkpoint every N steps (default: 200)")
    p.add_argument("--reload-every", type=cli.non_negative, default=0, metavar="N",
                   help="re-read --data every N steps (a distillation run still adding shards; default: 0, never)")
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"],
                   help="the saved drafter's weights (default: float16)")
    p.add_argument("--eval-only", action="store_true",
                   help="train nothing: evaluate --eval-drafter (default: OUT/drafter) on --eval-prompts")
    p.add_argument("--eval-drafter", type=cli.path, default=None, metavar="DIR",
                   help="with --eval-only, the drafter folder to evaluate (default: OUT/drafter; a training run "
                        "evaluates the drafter it saves there)")
    p.add_argument("--eval-prompts", type=cli.path, default=None, metavar="FILE.jsonl",
                   help="questions to report tokens/step on after training (or with --eval-only), as "
                        "redrafter-bench --prompts takes them: JSONL of Spec-Bench lines ({\"turns\": [...], "
                        "\"category\": ...}; the first turn is asked) or one-turn {\"prompt\": ...} lines (their "
                        "'source' the category where they have none)")
    p.add_argument("--eval-per-category", type=cli.positive, default=2, metavar="N",
                   help="questions taken from each category of --eval-prompts, the first in the file (lines with no "
                        "category are one; default: 2)")
    p.add_argument("--eval-max-tokens", type=cli.positive, default=128, metavar="N",
                   help="tokens per evaluated reply (default: 128)")
    p.add_argument("--beam-shapes", type=parse_shapes, default="4x5", metavar="WxL[,WxL...]",
                   help="the beam shapes (W beams of L tokens) the --eval-prompts evaluation decodes with, e.g. "
                        "4x5,8x5, each beside the context-lookup beam decoding drafts by default (the tuned length, "
                        "else 8), so a step can take more than L tokens (default: 4x5)")
    args = p.parse_args(argv)
    if not args.eval_only and args.data is None:
        p.error("--data is required for training")
    not_folders = [str(folder) for folder in args.data or () if not folder.is_dir()]
    if not args.eval_only and not_folders:  # said after the model had loaded, as "no distillation shards"
        p.error(f"--data {' '.join(not_folders)}: not a folder; give the --out folder of python -m redrafter_mlx.distill")
    twice = [str(folder) for i, folder in enumerate(args.data or ()) if folder.resolve() in
             {f.resolve() for f in args.data[:i]}]
    if twice:  # its replies were read once per mention, and trained on as many times
        p.error(f"--data {' '.join(twice)}: given twice; give each distillation folder once")
    bad_out = cli.run_folder_error("--out", args.out)
    if bad_out:
        p.error(bad_out)
    if args.eval_only and args.eval_prompts is None:  # it loaded the model, did nothing and exited 0
        p.error("--eval-only evaluates a drafter on --eval-prompts FILE: give them")
    unused = _unused_options(p, args)
    if unused:
        p.error(unused)
    if args.val_fraction == 1.0:  # (its type takes (0, 1]: the run failed after loading the data and the model)
        p.error("--val-fraction 1 holds every reply out for validation, leaving none to train on: give a share "
                "under 1")
    if args.eval_drafter is not None and not args.eval_only:  # (it trained, then evaluated another drafter)
        p.error(f"--eval-drafter {args.eval_drafter} is evaluated with --eval-only: a training run evaluates the "
                f"drafter it trains ({args.out / 'drafter'}); add --eval-only to evaluate {args.eval_drafter} alone, "
                "or drop --eval-drafter")
    bad_warmup = None if args.eval_only or args.warmup is None else warmup_error(args.warmup, args.steps)
    if bad_warmup:  # (accepted, the learning rate never left its warm-up)
        p.error(bad_warmup)
    for width, length in args.beam_shapes:  # (refused by decoding after the whole training run)
        too_big = cli.draft_size_error(width, length, None, None)
        if too_big:
            p.error(f"--beam-shapes {width}x{length}: {too_big}")
    if args.eval_drafter is not None and not (args.eval_drafter / "config.json").is_file():
        p.error(f"--eval-drafter {args.eval_drafter}: no drafter there (a folder with config.json and the weights)")
    if args.eval_only and args.eval_drafter is None and not (args.out / "drafter" / "config.json").is_file():
        # (said after the model had loaded, leaving an empty --out behind)
        p.error(f"--eval-only evaluates {args.out / 'drafter'}, and no drafter is there: give --eval-drafter PATH, or "
                "the --out of a finished training run")
    # a full disk while writing a checkpoint said nothing of the work kept (Ctrl-C says where it stopped)
    resume = None if args.eval_only else "run the same command again to resume from the last checkpoint"
    return cli.run("python -m redrafter_mlx.train", lambda: _train(args), resume=resume)


TRAINING_OPTIONS = ("data", "depth", "steps", "batch", "lr", "warmup", "weight_decay", "val_every", "val_fraction",
                    "soft", "greedy_targets", "exit_dim", "layers", "draft_vocab", "save_every", "reload_every",
                    "dtype")
EVAL_OPTIONS = ("eval_drafter", "eval_per_category", "eval_max_tokens", "beam_shapes")


def _unused_options(p, args) -> Optional[str]:
    """Options given (set to other than their default) that nothing would use: they ran, ignored, saying
    nothing (--beam-shapes without --eval-prompts trained and evaluated nothing; --steps with --eval-only)."""
    defaults = vars(p.parse_args(["--out", str(args.out)]))  # (string defaults gone through their types)

    def given(names):
        return ["--" + name.replace("_", "-") for name in names if getattr(args, name) != defaults[name]]

    if args.eval_only and given(TRAINING_OPTIONS):
        return f"--eval-only trains nothing: drop {', '.join(given(TRAINING_OPTIONS))}"
    unused = given(EVAL_OPTIONS)
    if args.eval_prompts is None and unused:
        return (f"{', '.join(unused)} appl{'ies' if len(unused) == 1 else 'y'} to the evaluation on --eval-prompts "
                f"FILE: give it, or drop {'it' if len(unused) == 1 else 'them'}")
    if args.reload_every >= args.steps:  # (it never re-read the data, saying nothing)
        return f"--reload-every {args.reload_every} re-reads --data every {args.reload_every} steps, and --steps " \
               f"{args.steps} ends before the first re-read: give a smaller N, or drop it"
    if not args.val_every and given(["val_fraction"]):
        return "--val-fraction is the share held out for validation every --val-every N steps: give --val-every N, " \
               "or drop it"
    return None


@contextlib.contextmanager
def _says_where_it_stopped(ckpt: Path, steps: int):
    """Ctrl-C while training: say which checkpoint the same command resumes from (it said "cancelled")."""
    try:
        yield
    except KeyboardInterrupt as e:
        done = checkpoint_step(ckpt)
        raise KeyboardInterrupt(
            f"cancelled; {ckpt} holds step {done} of {steps}: run the same command again to resume from there"
            if done else "cancelled before the first checkpoint (--save-every): the same command starts over") from e


def _check_data_source(folders: List[Path], model: Optional[str]):
    """Refuse data distilled from another model than --model, by the weights distill recorded in
    OUT/source.json (folders from before it was recorded are not checked): a model of the same width
    and vocabulary (a fine-tune, the base of an instruct model) trained on the other's replies, saying
    nothing."""
    from . import registry

    recorded = {f: read_json_object(f / "source.json", "distillation record") for f in folders
                if (f / "source.json").is_file()}
    if not recorded:
        return
    resolved = registry.resolve(model)
    weights = weights_fingerprint(resolved.path)
    for folder, source in recorded.items():
        if source.get("weights") != weights:
            raise RedrafterError(f"{folder} was distilled from {source.get('model')}, not {resolved.name}: train "
                                 "with the model the data was distilled from (--model)")


def _trained_to(drafter: Path, steps: int) -> bool:
    """Does the drafter folder a training run saved record `steps` steps (its config's training record)?"""
    try:
        record = read_json_object(drafter / "config.json", "drafter config").get("training")
    except (OSError, RedrafterError):  # none, or unreadable: saved again from the checkpoint
        return False
    return isinstance(record, dict) and record.get("steps") == steps


def _best_note(out: Path) -> str:
    """'; the most accurate on the held-out replies is OUT/best (step N, ...)' when --val-every kept one, else ''."""
    best = out / "best" / "config.json"
    if not best.is_file():
        return ""
    record = json.loads(best.read_text()).get("training", {})
    return (f"; the most accurate on the held-out replies is {out / 'best'} (step {record.get('step')}, expected "
            f"accepted drafts {record.get('val_accepted_drafts', 0):.3f})")


def _train(args):
    from .distill import read_shards
    from .loader import load

    questions = eval_prompts(args.eval_prompts, args.eval_per_category) if args.eval_prompts else None  # before hours
    done = 0 if args.eval_only else checkpoint_step(args.out / "checkpoint")
    if done > args.steps:  # it saved the checkpoint's drafter as a --steps one, saying nothing
        raise RedrafterError(f"{args.out / 'checkpoint'} holds step {done}, past --steps {args.steps}: give --steps "
                             f"{done} or more to resume it, or another --out to start anew")
    finished = not args.eval_only and done == args.steps and _trained_to(args.out / "drafter", args.steps)
    if finished:  # (it trained nothing, and saved the checkpoint's drafter again with a new record: this run's time)
        print(f"{args.out / 'drafter'} is already trained to step {args.steps}: nothing to train (a larger --steps "
              f"trains it on; another --out starts anew){_best_note(args.out)}", file=sys.stderr)
        if questions is None:
            return
    latest = {}

    def samples_now():
        latest["samples"] = [s for folder in args.data for s in read_shards(folder)]
        return latest["samples"]

    training = not (args.eval_only or finished)
    if training:  # the data before the model: a folder with none was said after a load (minutes)
        # each folder: one without shards beside others that have some (a train --out, a distillation that wrote
        # none) was left out, saying nothing, and the others' replies trained alone
        empty = [str(folder) for folder in args.data if not any(folder.glob("shard-*.npz"))]
        if empty:
            raise RedrafterError(f"no distillation shards in {' '.join(empty)}" + (
                "" if len(empty) == len(args.data) else
                f" (the other --data folder{'s' if len(args.data) - len(empty) > 1 else ''} would train without "
                f"{'it' if len(empty) == 1 else 'them'}): give the --out folders of python -m redrafter_mlx.distill"))
        samples = samples_now()
        if not samples:
            raise RedrafterError(f"no distillation shards in {' '.join(map(str, args.data))}")
        if args.greedy_targets and all(np.array_equal(s["greedy"], s["reply"]) for s in samples):
            # (it trained on the replies' own tokens, as without it, saying nothing: read_shards gives a reply's own
            # tokens as its greedy ones where none are stored)
            raise RedrafterError("--greedy-targets predicts the base model's greedy token where a sampled reply "
                                 "differs from it, and no reply in --data does: they were answered greedily (drop "
                                 "it), or sampled by a distill that did not store greedy tokens yet (add them: "
                                 "python -m redrafter_mlx.distill --backfill-greedy --out DIR)")
        _check_data_source(args.data, args.model)
    loaded = load(args.model, use_drafter=False)
    args.out.mkdir(parents=True, exist_ok=True)
    if training:
        busy = f"another training run is working in {args.out}: let it finish (or stop it: its checkpoint is kept), " \
               "or give another --out"
        with one_run_in(args.out, busy):  # (two at once wrote their steps into one checkpoint)
            print(f"{len(samples)} replies, {sum(len(s['reply']) for s in samples)} tokens", file=sys.stderr)
            t0 = time.perf_counter()
            with open_log(args.out) as log, _says_where_it_stopped(args.out / "checkpoint", args.steps):
                drafter = train(loaded.model, samples, args.out, depth=args.depth, steps=args.steps, batch=args.batch,
                                lr=args.lr, warmup=args.warmup, weight_decay=args.weight_decay,
                                exit_dim=args.exit_dim, layers=args.layers,
                                draft_vocab=args.draft_vocab, eos_ids=loaded.tokenizer.eos_token_ids,
                                save_every=args.save_every, log=log, reload=samples_now, reload_every=args.reload_every,
                                val_every=args.val_every, val_fraction=args.val_fraction,
                                save_dtype=getattr(mx, args.dtype), soft=args.soft, greedy_targets=args.greedy_targets,
                                model={"name": loaded.name, "weights": weights_fingerprint(loaded.path)})
            save_copy(drafter, args.out / "drafter", getattr(mx, args.dtype), {"training": {
                "depth": args.depth, "steps": args.steps, "batch": args.batch, "lr": args.lr, "soft": args.soft,
                "greedy_targets": args.greedy_targets,
                "replies": len(latest["samples"]), "seconds_this_run": round(time.perf_counter() - t0)}})
            note = _best_note(args.out)  # (the most accurate drafter, which redrafter-train installs, went unsaid)
            print(f"saved {args.out / 'drafter'}" + (f" (step {args.steps}){note}" if note else ""), file=sys.stderr)
    if questions is not None:
        # (a drafter of another model was told "(or --no-drafter)", an option this command has not)
        loaded.drafter = load_drafter(args.eval_drafter or args.out / "drafter", loaded.model,
                                      "give --eval-drafter the drafter trained for this model, or --model the model "
                                      "it was trained for")
        with open(args.out / "eval.jsonl", "a") as f:  # each shape's row as it is done: Ctrl-C lost them all
            def record(row):
                f.write(json.dumps(row) + "\n")
                f.flush()

            evaluate_shapes(loaded, questions, args.beam_shapes, args.eval_max_tokens, record=record)


if __name__ == "__main__":
    sys.exit(main())
