"""Apple's ReDrafter checkpoint -> this project's drafter folder (redrafter_mlx.drafter).

Input: a folder with config.json and `model.safetensors`, `pytorch_model.bin` or `model.pt`
(or one of those files, with config.json beside it). Apple's tensor names are the ones
redrafter_mlx uses (`rnn_u.*`, `rnn_w.weight`, `input_proj.*`, `lm_head.{i}.linear.*`,
`lm_head.{N}.weight`); the variants TensorRT-LLM's converter accepts are renamed:
`input_projs.*` -> `input_proj.*`, `lm_heads.{i}.*` and a leading `0.{i}.*` -> `lm_head.{i}.*`.
A `drafter.` / `module.` prefix (a checkpoint of the whole training wrapper) is dropped.

Apple's config.json fields (`hidden_size`, `vocab_size`, `exit_dim`, `num_draft_layers`,
`rnn`; -1 = unset) are checked against the tensor shapes; missing ones are inferred from
them. The result is validated against the base model (hidden size, vocabulary) and written
with `redrafter_mlx.drafter.save_drafter`. A drafter already in this project's format is
accepted too (checked and rewritten, its tuned beam_shape.json kept), so a trained or shipped one
can be packed into a model folder.
"""

import dataclasses
import re
import shutil
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import mlx.core as mx
from mlx.utils import tree_flatten

from redrafter_mlx.config import DRAFTER_MODEL_TYPE, DrafterArgs
from redrafter_mlx.drafter import Drafter, check_args, check_compatible, check_draft_vocab, drafter_args, save_drafter
from redrafter_mlx.errors import CorruptModelError, ModelNotFoundError, one_line
from redrafter_mlx.tuning import FILE as TUNED

from .checkpoint import DRAFTER_FILES, load_tensors, read_json

RENAMES = [
    (re.compile(r"^(?:drafter|module)\."), ""),
    (re.compile(r"^input_projs\."), "input_proj."),
    (re.compile(r"^lm_heads\."), "lm_head."),
    (re.compile(r"^0\.(\d+)\."), r"lm_head.\1."),
]
KNOWN = re.compile(
    r"^(rnn_u\.(weight|bias)|rnn_w\.weight|input_proj\.(weight|bias)|lm_head\.\d+\.(linear\.weight|linear\.bias|weight))$"
)


def find_checkpoint(src: Path) -> Tuple[Path, Path]:
    """(config.json, weights file) of an Apple drafter folder or file."""
    if src.is_file():
        folder, weights = src.parent, src
    else:
        folder = src
        found = [folder / n for n in DRAFTER_FILES if (folder / n).is_file()]
        if not found:
            raise ModelNotFoundError(f"no drafter weights in {folder}: expected one of {', '.join(DRAFTER_FILES)}")
        weights = found[0]
    config = folder / "config.json"
    if not config.is_file():
        raise ModelNotFoundError(f"drafter {src} has no config.json beside its weights")
    return config, weights


def rename(name: str) -> str:
    for pattern, repl in RENAMES:
        name = pattern.sub(repl, name, count=1)
    return name


def normalize(weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
    out = {}
    for k, v in weights.items():
        new = rename(k)
        if new in out:
            raise CorruptModelError(f"drafter checkpoint holds {new!r} twice (as {k!r} and another name)")
        out[new] = v
    unknown = sorted(k for k, new in ((k, rename(k)) for k in weights) if not KNOWN.match(new))
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise CorruptModelError(f"unknown tensor(s) in the drafter checkpoint: {', '.join(unknown[:5])}{more}")
    return out


def _set(value) -> bool:
    return value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0)


def infer_args(config: Dict[str, Any], weights: Dict[str, mx.array], where="drafter config.json") -> DrafterArgs:
    """DrafterArgs from config.json (`where`), checked against (and completed from) the tensor shapes."""
    blocks = sorted(int(m.group(1)) for k in weights if (m := re.match(r"lm_head\.(\d+)\.linear\.weight$", k)))
    n = len(blocks)
    if blocks != list(range(n)):
        raise CorruptModelError(f"drafter residual blocks are not numbered 0..{n - 1}: {blocks}")
    final = weights.get(f"lm_head.{n}.weight")
    if final is None:
        raise CorruptModelError(f"drafter checkpoint has no output layer lm_head.{n}.weight")
    vocab, exit_dim = final.shape
    rnn = "rnn_u.weight" in weights or "rnn_w.weight" in weights
    if rnn:
        if "rnn_w.weight" not in weights or "rnn_u.weight" not in weights or "rnn_u.bias" not in weights:
            raise CorruptModelError("drafter checkpoint has an incomplete RNN (needs rnn_u.weight, rnn_u.bias, rnn_w.weight)")
        hidden = weights["rnn_w.weight"].shape[-1]
    elif "input_proj.weight" in weights:
        hidden = weights["input_proj.weight"].shape[-1] // 2
    else:
        hidden = exit_dim // 2
    inferred = {"hidden_size": hidden, "vocab_size": vocab, "exit_dim": exit_dim, "num_draft_layers": n, "rnn": rnn}
    for key, value in inferred.items():
        stated = config.get(key)
        if _set(stated) and stated != value:
            raise CorruptModelError(  # (repr: a string "64" said "says hidden_size=64, but its tensors give 64")
                f"{where} says {key}={stated!r}, but its tensors give {key}={value!r}"
            )
    if "input_proj.weight" not in weights and exit_dim != 2 * hidden:
        raise CorruptModelError(
            f"drafter exit_dim {exit_dim} differs from 2 x hidden_size ({2 * hidden}) but the checkpoint has no input_proj"
        )
    return DrafterArgs(**inferred)


def convert_drafter(src: Path, dest: Path, base_args=None, dtype: Optional[str] = None, report=None,
                    advice: Optional[str] = None) -> Dict[str, Any]:
    """Convert a drafter into `dest` (a folder that must not exist yet). Returns manifest info.
    `advice` ends the error for a drafter that does not fit `base_args` (default: for a drafter given with --model).

    A drafter already in this project's format (its config has `lm_head`, e.g. one written by
    redrafter_mlx.train) goes through the same checks and is rewritten as is.
    """
    config_path = (src.parent if src.is_file() else src) / "config.json"
    # A base model's folder given as --drafter said "unknown tensor(s) in the drafter checkpoint: lm_head.weight, ..."
    # (or, sharded, "no drafter weights").
    kind = read_json(config_path, "drafter").get("model_type") if config_path.is_file() else None
    if kind not in (None, "", DRAFTER_MODEL_TYPE):
        raise CorruptModelError(f"{config_path} is a {kind!r} model's config, not a drafter's: give --drafter the "
                                "ReDrafter head's folder (a base model goes to --model)")
    config_path, weights_path = find_checkpoint(src)
    config = read_json(config_path, "drafter")
    if "lm_head" in config:
        args = drafter_args(config, config_path)
        weights = load_tensors(weights_path)
    else:
        weights = normalize(load_tensors(weights_path))
        args = infer_args(config, weights, config_path)
        check_args(args, config_path)
    if base_args is not None:
        check_compatible(args, base_args, f"the drafter {src}",
                         advice or "convert the drafter trained for this model, or leave --drafter out")
        # Apple's checkpoints do not say their base's family: recorded here, the drafter is refused later
        # beside another family of the same sizes (Vicuna's with Mistral-7B: 4096 wide, 32000 tokens)
        args = dataclasses.replace(args, base_model_type=args.base_model_type or base_args.model_type)
    drafter = Drafter(args)
    try:
        drafter.load_weights(list(weights.items()), strict=True)
        check_draft_vocab(drafter)
    except ValueError as e:
        raise CorruptModelError(f"drafter tensors in {weights_path} do not fit {config_path}: {one_line(e)}") from e
    if dtype:
        drafter.set_dtype(getattr(mx, dtype))  # floating parameters only
    params = tree_flatten(drafter.parameters())
    bar = report.bar(total=len(params), desc="drafter") if report else None
    try:
        for _, v in params:
            mx.eval(v)
            if bar:
                bar.update(1)
    finally:
        if bar:
            bar.close()
    save_drafter(drafter, dest)
    files = [config_path, weights_path]
    tuned = config_path.parent / TUNED
    if tuned.is_file():
        # The beam shape `redrafter-bench --tune` found for it (this repository's shipped drafters have one), which
        # load() reads from the drafter's folder: left behind, the converted model drafted with the untuned default.
        shutil.copy(tuned, dest / TUNED)
        files.append(tuned)
    return {
        "source": str(src),
        "files": files,
        "config": args.to_dict(),
        "dtype": str(drafter.lm_head[-1].weight.dtype).replace("mlx.core.", ""),
    }
