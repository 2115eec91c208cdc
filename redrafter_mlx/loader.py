"""load(name) -> LoadedModel: base model, tokenizer, (drafter), and what they are.

Loading follows mlx-lm's fixed order: config -> args -> module -> sanitize -> quantize ->
load_weights(strict) -> mx.eval. Sources: a GGUF file (config, weights and tokenizer all
inside) or a Hugging Face / MLX folder (config.json, *.safetensors, tokenizer files, optional
mlx-community `quantization` block, optional `drafter/`).

Weight format ("dtype"): "auto" picks what runs fastest on the device in use. On the CPU
that is float32: MLX's quantized CPU kernels cost time linear in the number of tokens, so
they leave no room for verifying many draft tokens at once, while float32 matmuls run on
BLAS (OpenBLAS when present). On a GPU the stored (e.g. 4-bit) weights are kept.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

from . import registry
from ._platform import device_description, on_cpu
from .config import LlamaArgs
from .errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError
from .gguf import read_gguf
from .llama import Model
from .tokenizer import Tokenizer
from .tuning import find_tuned

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
WEIGHT_FORMATS = ("auto", "stored", *DTYPES)


@dataclass
class LoadedModel:
    model: Model
    tokenizer: Tokenizer
    args: LlamaArgs
    name: str
    path: Path
    weight_format: str  # e.g. "float32" or "4-bit (group 32)"
    drafter: Any = None  # a redrafter_mlx.drafter.Drafter when one was found
    drafter_path: Optional[Path] = None
    info: Dict[str, Any] = field(default_factory=dict)
    beam_shape: Optional[Tuple[int, int]] = None  # (W, L) tuned for this device (see tuning.py), if any
    tree: Optional[int] = None  # dynamic-tree node budget tuned with beam_shape (0: W x L beams)
    lookup: Optional[int] = None  # context-lookup length tuned with it (None: tuning.DEFAULT_LOOKUP)
    tree_min_prob: Optional[float] = None  # the tree's path-probability floor tuned with it
    controllers: Dict[int, Any] = field(default_factory=dict)  # adaptive controllers (control.py), per drafter

    @property
    def context_length(self) -> int:
        return int(self.args.max_position_embeddings)

    @property
    def device(self) -> str:
        return device_description()


def _resolve_format(weight_format: str) -> str:
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight format must be one of {', '.join(WEIGHT_FORMATS)}, not {weight_format!r}")
    if weight_format == "auto":
        return "float32" if on_cpu() else "stored"
    return weight_format


def _dequantize_all(weights: Dict[str, mx.array], quant: Dict[str, Any]) -> Dict[str, mx.array]:
    out = {}
    for k, v in weights.items():
        if k.endswith((".scales", ".biases")) and k.rsplit(".", 1)[0] + ".weight" in weights:
            continue
        prefix = k[: -len(".weight")] if k.endswith(".weight") else None
        if prefix and prefix + ".scales" in weights:
            q = quant.get(prefix, quant) if isinstance(quant.get(prefix), dict) else quant
            v = mx.dequantize(
                v, weights[prefix + ".scales"], weights.get(prefix + ".biases"), group_size=q["group_size"], bits=q["bits"]
            )
        out[k] = v
    return out


def _describe_quant(quant: Dict[str, Any]) -> str:
    overrides = sorted({(v["bits"], v["group_size"]) for k, v in quant.items() if isinstance(v, dict)})
    text = f"{quant['bits']}-bit (group {quant['group_size']})"
    if overrides:
        text += ", " + ", ".join(f"{b}-bit (group {g})" for b, g in overrides) + " in places"
    return text


def build_model(config: Dict[str, Any], weights: Dict[str, mx.array], weight_format: str = "stored") -> Tuple[Model, str]:
    """Instantiate, (de)quantize and load weights strictly. Returns (model, format description)."""
    args = LlamaArgs.from_dict(config)
    if "tie_word_embeddings" not in config:  # some configs omit it: the weights tell
        args.tie_word_embeddings = not any(k.startswith("lm_head.") for k in weights)
    model = Model(args)
    weights = model.sanitize(weights)
    quant = config.get("quantization") or {}
    fmt = _resolve_format(weight_format)
    if fmt in DTYPES:
        if quant:
            weights = _dequantize_all(weights, quant)
        dtype = DTYPES[fmt]
        weights = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}
        description = fmt
    elif quant:
        if "bits" not in quant or "group_size" not in quant:
            raise UnsupportedModelError(f"unsupported quantization block in config: {quant}")

        def predicate(path, module):
            if f"{path}.scales" not in weights:
                return False
            q = quant.get(path)
            return q if isinstance(q, dict) else {"group_size": quant["group_size"], "bits": quant["bits"]}

        nn.quantize(model, class_predicate=predicate)
        # A GPU keeps activations in the scales' dtype (GGUF stores norms in float32, scales in
        # float16): only norms are cast. MLX's CPU kernels are slow in float16 (default model:
        # 5.3 s per token in float16, 0.2 s in float32), so the CPU casts scales, biases and
        # norms to float32 and computes in float32 around the packed weights.
        cpu = on_cpu()
        act = mx.float32 if cpu else next(v.dtype for k, v in weights.items() if k.endswith(".scales"))
        weights = {
            k: v.astype(act) if mx.issubdtype(v.dtype, mx.floating) and (cpu or v.ndim == 1) else v
            for k, v in weights.items()
        }
        description = _describe_quant(quant)
    else:
        description = str(next(iter(weights.values())).dtype).replace("mlx.core.", "")
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise CorruptModelError(f"weights do not fit the model config: {str(e).splitlines()[0]}") from e
    mx.eval(model.parameters())
    return model, description


def _load_folder(path: Path) -> Tuple[Dict[str, Any], Dict[str, mx.array], Tokenizer]:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelNotFoundError(f"{path} has no config.json: not a model folder")
    try:
        config = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CorruptModelError(f"{cfg_path} is not valid JSON: {e}") from e
    files = sorted(path.glob("*.safetensors"))
    if not files:
        hint = " (a PyTorch checkpoint: convert it with `python -m convert`)" if list(path.glob("*.bin")) else ""
        raise ModelNotFoundError(f"{path} has no *.safetensors weights{hint}")
    weights = {}
    for f in files:
        try:
            weights.update(mx.load(str(f)))
        except Exception as e:
            raise CorruptModelError(f"cannot read {f.name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    eos = []
    gen = path / "generation_config.json"
    if gen.is_file():
        ids = json.loads(gen.read_text()).get("eos_token_id")
        eos = ids if isinstance(ids, list) else [ids] if ids is not None else []
    ids = config.get("eos_token_id")
    eos += ids if isinstance(ids, list) else [ids] if ids is not None else []
    return config, weights, Tokenizer.from_folder(path, eos)


def load(
    name: Optional[str] = None,
    *,
    drafter: Optional[str] = None,
    weight_format: str = "auto",
    use_drafter: bool = True,
    progress: Optional[Callable[[str], None]] = None,
) -> LoadedModel:
    """Load a model by registry name, local path (.gguf or folder) or hub id.

    drafter: a drafter folder that overrides the one found beside the model.
    weight_format: "auto" (fastest for the device), "stored" (as in the file, e.g. 4-bit),
        "float32", "float16" or "bfloat16".
    progress: called with short status lines (fetch, load) for UIs.
    """
    t0 = time.perf_counter()
    resolved = registry.resolve(name, progress)
    if progress:
        progress(f"loading {resolved.path.name}")
    if resolved.kind == "gguf":
        config, weights, meta = read_gguf(resolved.path)
        tokenizer = Tokenizer.from_gguf_metadata(meta)
    else:
        config, weights, tokenizer = _load_folder(resolved.path)
    model, description = build_model(config, weights, weight_format)
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        args=model.args,
        name=resolved.name,
        path=resolved.path,
        weight_format=description,
        info={"source_quantization": config.get("quantization"), "load_seconds": 0.0},
    )
    if use_drafter:
        drafter_path = Path(drafter) if drafter else find_drafter(resolved)
        if drafter_path is not None:
            if progress:
                progress(f"loading drafter {drafter_path}")
            from .drafter import load_drafter

            loaded.drafter = load_drafter(drafter_path, loaded.model)
            loaded.drafter_path = drafter_path
            tuned = find_tuned(resolved.path, drafter_path)
            if tuned:
                loaded.beam_shape, loaded.tree = tuned[:2], tuned.tree
                loaded.lookup, loaded.tree_min_prob = tuned.lookup, tuned.tree_min_prob
    loaded.info["load_seconds"] = time.perf_counter() - t0
    return loaded


def find_drafter(resolved: "registry.ResolvedModel") -> Optional[Path]:
    """A drafter beside the model: <folder>/drafter, <file>.drafter/, or the shipped one."""
    candidates = []
    if resolved.kind == "folder":
        candidates.append(resolved.path / "drafter")
    else:
        candidates.append(resolved.path.with_suffix(".drafter"))
    shipped = registry.shipped_drafter(resolved.entry)
    if shipped:
        candidates.append(shipped)
    for c in candidates:
        if (c / "config.json").is_file():
            return c
    return None
