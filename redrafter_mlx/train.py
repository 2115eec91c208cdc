"""Train a ReDrafter draft head on distillation data (see distill.py), base model frozen.

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

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from . import _platform  # noqa: F401

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from .config import DrafterArgs  # noqa: E402
from .drafter import Drafter, load_drafter, save_drafter  # noqa: E402


class PositionData:
    """All (hidden, following tokens) training positions of a distillation folder."""

    def __init__(self, samples: List[dict], depth: int):
        hs, toks, starts = [], [], []
        offset = 0
        for s in samples:
            n = len(s["reply"])
            if n < 2:
                continue
            hs.append(s["hidden"])
            toks.append(np.asarray(s["reply"], dtype=np.int32))
            starts.append(np.arange(offset, offset + n - 1))  # positions with at least one target
            offset += n
        self.hidden = np.concatenate(hs).astype(np.float32)  # (N, H)
        self.tokens = np.concatenate([np.concatenate(toks), np.full(depth + 1, -1, np.int32)])  # padded with -1
        self.positions = np.concatenate(starts)
        # a position's window must not run into the next reply
        ends = np.concatenate([np.full(len(t), o + len(t)) for t, o in zip(toks, np.cumsum([0] + [len(t) for t in toks[:-1]]))])
        self.end = ends  # (N,) exclusive end of each position's reply
        self.depth = depth

    def __len__(self):
        return len(self.positions)

    def batch(self, idx: np.ndarray):
        """h (B, H), inputs (B, K) = r_i..r_{i+K-1}, targets (B, K) = r_{i+1}..r_{i+K} (-1 = none)."""
        pos = self.positions[idx]
        K = self.depth
        window = pos[:, None] + np.arange(K + 1)[None, :]  # (B, K+1)
        toks = self.tokens[window]
        toks = np.where(window < self.end[pos][:, None], toks, -1)
        return self.hidden[pos], np.maximum(toks[:, :K], 0), toks[:, 1:]


def frequent_tokens(samples: List[dict], size: int, always=()) -> List[int]:
    counts = Counter()
    for s in samples:
        counts.update(np.asarray(s["reply"]).tolist())
    ids = [t for t, _ in counts.most_common(size)]
    for t in always:
        if t not in ids:
            ids.append(int(t))
    return sorted(ids[: max(size, len(always))])


def loss_fn(drafter: Drafter, base, h, inputs, targets, remap):
    """Sum over depths of the mean cross-entropy; also per-depth accuracy (B, K) hits."""
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
        losses.append((ce * valid).sum() / n)
        hits.append(((mx.argmax(logits, axis=-1) == tgt) & valid).sum() / n)
    return sum(losses), mx.stack(hits)


def lr_schedule(peak: float, warmup: int, total: int):
    warm = optim.linear_schedule(peak * 0.01, peak, max(warmup, 1))
    cos = optim.cosine_decay(peak, max(total - warmup, 1), end=peak * 0.05)
    return optim.join_schedules([warm, cos], [max(warmup, 1)])


def save_checkpoint(folder: Path, drafter: Drafter, opt, step: int, rng: np.random.Generator):
    folder.mkdir(parents=True, exist_ok=True)
    save_drafter(drafter, folder / "drafter")
    state = dict(tree_flatten(opt.state))
    mx.save_safetensors(str(folder / "optimizer.tmp.safetensors"), {k: v for k, v in state.items() if isinstance(v, mx.array)})
    (folder / "optimizer.tmp.safetensors").replace(folder / "optimizer.safetensors")
    meta = {"step": step, "rng": rng.bit_generator.state}
    (folder / "state.tmp.json").write_text(json.dumps(meta))
    (folder / "state.tmp.json").replace(folder / "state.json")


def load_checkpoint(folder: Path, drafter: Drafter, opt):
    d = load_drafter(folder / "drafter")
    drafter.update(d.parameters())
    state = mx.load(str(folder / "optimizer.safetensors"))
    opt.state = tree_unflatten(list(state.items()))
    meta = json.loads((folder / "state.json").read_text())
    rng = np.random.default_rng()
    rng.bit_generator.state = meta["rng"]
    return meta["step"], rng


def train(
    base,
    samples: List[dict],
    out: Path,
    *,
    depth: int = 4,
    steps: int = 1000,
    batch: int = 512,
    lr: float = 1e-3,
    warmup: int = 50,
    weight_decay: float = 0.0,
    exit_dim: Optional[int] = None,
    layers: int = 1,
    draft_vocab: int = 8192,
    eos_ids=(),
    save_every: int = 200,
    seed: int = 0,
    progress: bool = True,
    log=None,
) -> Drafter:
    """Train (or resume) a 'shared'-head drafter for `base` on distillation samples."""
    from tqdm import tqdm

    out = Path(out)
    mx.random.seed(seed)
    args = DrafterArgs(hidden_size=base.args.hidden_size, vocab_size=base.args.vocab_size, exit_dim=exit_dim,
                       num_draft_layers=layers, lm_head="shared")
    drafter = Drafter(args)
    vocab = frequent_tokens(samples, draft_vocab, eos_ids) if draft_vocab else list(range(args.vocab_size))
    drafter.set_draft_vocab(vocab if draft_vocab else None)
    remap = np.full(args.vocab_size, -1, np.int32)
    remap[np.array(vocab)] = np.arange(len(vocab))
    remap = mx.array(remap)
    data = PositionData(samples, depth)
    opt = optim.AdamW(learning_rate=lr_schedule(lr, warmup, steps), weight_decay=weight_decay)
    ckpt = out / "checkpoint"
    step, rng = 0, np.random.default_rng(seed)
    if (ckpt / "state.json").is_file():
        step, rng = load_checkpoint(ckpt, drafter, opt)
    base.freeze()
    value_and_grad = nn.value_and_grad(drafter, lambda h, i, t: loss_fn(drafter, base, h, i, t, remap))

    def train_step(h, i, t):
        (loss, hits), grads = value_and_grad(h, i, t)
        opt.update(drafter, grads)
        return loss, hits

    bar = tqdm(total=steps, initial=step, desc="train", disable=not progress)
    t0 = time.perf_counter()
    while step < steps:
        idx = rng.integers(0, len(data), size=batch)
        h, inputs, targets = (mx.array(a) for a in data.batch(idx))
        loss, hits = train_step(h, inputs, targets)
        mx.eval(loss, hits, drafter.parameters(), opt.state)
        step += 1
        acc = " ".join(f"{a:.2f}" for a in np.array(hits).tolist())
        bar.set_postfix(loss=f"{loss.item():.3f}", acc=acc)
        bar.update(1)
        if log:
            log.write(json.dumps({"step": step, "loss": loss.item(), "acc": np.array(hits).tolist(),
                                  "seconds": time.perf_counter() - t0}) + "\n")
            log.flush()
        if step % save_every == 0 or step == steps:
            save_checkpoint(ckpt, drafter, opt, step, rng)
    bar.close()
    return drafter


def evaluate(loaded, prompts: List[str], width: int, length: int, max_tokens: int = 128) -> Dict[str, float]:
    from .generate import generate

    steps = tokens = 0
    for p in prompts:
        g = generate(loaded, p, mode="redrafter", max_tokens=max_tokens, beam_width=width, beam_length=length)
        steps += g.stats.steps
        tokens += g.stats.step_tokens
    return {"tokens_per_step": tokens / max(steps, 1), "steps": steps, "tokens": tokens}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m redrafter_mlx.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--data", type=Path, required=True, help="distillation folder from redrafter_mlx.distill")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--depth", type=int, default=4, help="draft tokens predicted per position (beam length - 1)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--exit-dim", type=int, default=None)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--draft-vocab", type=int, default=8192, help="0 = the whole vocabulary")
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--eval-prompts", type=Path, default=None, help="Spec-Bench JSONL to report tokens/step on")
    p.add_argument("--eval-limit", type=int, default=10)
    p.add_argument("--beam-width", type=int, default=4)
    p.add_argument("--beam-length", type=int, default=5)
    args = p.parse_args(argv)
    from .distill import read_shards
    from .loader import load

    loaded = load(args.model, use_drafter=False)
    samples = list(read_shards(args.data))
    if not samples:
        sys.exit(f"no distillation shards in {args.data}")
    print(f"{len(samples)} replies, {sum(len(s['reply']) for s in samples)} tokens", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "train_log.jsonl", "a") as log:
        drafter = train(loaded.model, samples, args.out, depth=args.depth, steps=args.steps, batch=args.batch,
                        lr=args.lr, warmup=args.warmup, exit_dim=args.exit_dim, layers=args.layers,
                        draft_vocab=args.draft_vocab, eos_ids=loaded.tokenizer.eos_token_ids,
                        save_every=args.save_every, log=log)
    drafter.set_dtype(mx.float16)
    save_drafter(drafter, args.out / "drafter")
    print(f"saved {args.out / 'drafter'}", file=sys.stderr)
    if args.eval_prompts:
        from .bench import read_prompts

        loaded.drafter = load_drafter(args.out / "drafter", loaded.model)
        prompts = [q["prompt"] for q in read_prompts(args.eval_prompts, args.eval_limit)]
        print(json.dumps(evaluate(loaded, prompts, args.beam_width, args.beam_length)), file=sys.stderr)


if __name__ == "__main__":
    main()
