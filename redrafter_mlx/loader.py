"""load(name) -> LoadedModel: base model, tokenizer, (drafter), and what they are.

Loading follows mlx-lm's fixed order: config -> args -> module -> sanitize -> quantize ->
load_weights(strict) -> mx.eval. Sources: a GGUF file (config, weights and tokenizer all
inside) or a Hugging Face / MLX folder (config.json, *.safetensors, tokenizer files, optional
mlx-community `quantization` block, optional `drafter/`).

Weight format ("dtype"): "auto" picks what runs fastest on the device in use. On a CPU with a
fast BLAS (MKL or OpenBLAS, _platform.py) that is float32: MLX's quantized CPU kernels cost
time linear in the number of tokens, so they leave no room for verifying many draft tokens at
once, while float32 matmuls run on the BLAS. On a CPU without one, quantized weights stay as
stored (faster than float32 on the reference BLAS). On a GPU the stored (e.g. 4-bit) weights
are kept.
"""

import contextlib
import inspect
import io
import json
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Set, Tuple

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import registry
from ._platform import device_description, fast_cpu_blas, on_cpu
from .base_model import TreeModel, check_supported, self_check
from .config import DRAFTER_MODEL_TYPE, FLOAT_FORMATS, WEIGHT_FORMATS, ModelArgs, check_head_counts
from .errors import (CorruptModelError, ModelNotFoundError, RedrafterError, RedrafterWarning, SettingError,
                     UnsupportedModelError, json_kind, one_line)
from .files import read_json_object, refuse_lfs_pointer, refuse_missing_shards, refuse_mixed_weights, tidy
from .gguf import read_gguf
from .tokenizer import Tokenizer, is_token_id
from .tuning import find_tuned

DTYPES = {name: getattr(mx, name) for name in FLOAT_FORMATS}
# config.json sizes every family's model args take as whole numbers (shapes)
SIZE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_attention_heads",
             "num_key_value_heads", "head_dim", "max_position_embeddings")
# config.json keys the families' model args take as numbers, and as true/false
NUMBER_KEYS = ("rope_theta", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
BOOL_KEYS = ("tie_word_embeddings", "rope_traditional", "attention_bias", "mlp_bias")


@dataclass
class LoadedModel:
    model: TreeModel
    tokenizer: Tokenizer
    args: ModelArgs
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
    controllers: Dict[Any, Any] = field(default_factory=dict)  # adaptive controllers (control.py), per drafter, greedy / sampled
    tree_ok: bool = True  # the load-time self-check passed: speculation is lossless on this model
    resolved: Any = None  # the registry.ResolvedModel the name resolved to (find_drafter(resolved): its drafter)

    @property
    def context_length(self) -> int:
        return int(self.args.max_position_embeddings)

    @property
    def device(self) -> str:
        return device_description()

    def __repr__(self) -> str:
        # The dataclass's own repr printed the drafter's module tree over several lines, the controllers and the
        # registry entry (1.7 KB for the default model, at a prompt's `>>> m`): what tells one model from another.
        drafter = None if self.drafter is None else str(self.drafter_path or type(self.drafter).__name__)
        context = getattr(self.args, "max_position_embeddings", None)
        return (f"LoadedModel(name={self.name!r}, path={str(self.path)!r}, weight_format={self.weight_format!r}, "
                f"drafter={drafter!r}, context_length={context!r}" + ("" if self.tree_ok else ", tree_ok=False") + ")")


def _resolve_format(weight_format: str, quantized: bool = True) -> str:
    """"auto": a GPU keeps the stored weights. The CPU computes in float32 where a fast BLAS runs
    it (_platform.py). Without one, stored quantized weights are faster than float32 on MLX's
    reference BLAS (default model: 8.3-10.5 tok/s against 4.9), but an unquantized float16
    model stays float32 (MLX's float16 CPU kernels are ~25x slower)."""
    if weight_format not in WEIGHT_FORMATS:
        raise SettingError(f"weight format must be one of {', '.join(WEIGHT_FORMATS)}, not {weight_format!r}")
    if weight_format == "auto":
        if not on_cpu():
            return "stored"
        return "stored" if quantized and not fast_cpu_blas() else "float32"
    return weight_format


def _describe_quant(quant: Dict[str, Any]) -> str:
    overrides = sorted({(v["bits"], v["group_size"]) for k, v in quant.items() if isinstance(v, dict)})
    text = f"{quant['bits']}-bit (group {quant['group_size']})"
    if overrides:
        text += ", " + ", ".join(f"{b}-bit (group {g})" for b, g in overrides) + " in places"
    return text


def _leading_bytes(path: Path, name: str, limit: int = 1 << 16) -> Tuple[str, tuple, bytes]:
    """A safetensors tensor's dtype, shape and first `limit` bytes, read from the file's header and data without
    loading the tensor (an embedding is gigabytes)."""
    import struct

    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        info = json.loads(f.read(size))[name]
        start, end = info["data_offsets"]
        f.seek(8 + size + start)
        return info["dtype"], tuple(info["shape"]), f.read(min(end - start, limit))


def _config_problem(e: BaseException) -> str:
    """What mlx-lm's model args said of a config, in a config's words: a field it needs and does not find said
    "ModelArgs.__init__() missing 1 required positional argument: 'hidden_size'", a key inside a block just "'factor'"
    (the converter said "lacks hidden_size" of the same file)."""
    if isinstance(e, TypeError) and "required" in str(e):
        missing = re.findall(r"'(\w+)'", str(e))
        if missing:
            return f"it lacks {', '.join(missing)}"
    if isinstance(e, KeyError) and e.args:
        return f"it lacks {e.args[0]!r}, a key mlx-lm reads (in a block such as rope_scaling)"
    return one_line(e)


def _misfit(text: str) -> bool:
    return any(w in text for w in ("parameters not in model", "Missing", "Expected shape"))


def _classes_quietly(config: Dict[str, Any], printed: Optional[io.StringIO] = None):
    """mlx-lm's _get_classes(config), what its model modules print on import kept in `printed` instead of stdout
    (olmo's module prints, then exits: SystemExit, for the caller to take)."""
    from mlx_lm.utils import _get_classes

    with contextlib.redirect_stdout(io.StringIO() if printed is None else printed):
        return _get_classes(config)


def model_classes(config: Dict[str, Any], where: str = "config.json"):
    """mlx-lm's (Model, ModelArgs) classes for a config (read from `where`, which errors name), refusing
    what cannot verify trees."""
    model_type = config.get("model_type")
    if not model_type:
        raise UnsupportedModelError(f"{where} has no model_type: not a model mlx-lm can build")
    if model_type == DRAFTER_MODEL_TYPE:  # it said "unsupported architecture ...: mlx-lm has no model for it"
        raise UnsupportedModelError(f"{where} is a drafter's, not a base model's: load its base model and pass this "
                                    "folder as its drafter (drafter=PATH, --drafter PATH)")
    check_supported(str(model_type), config)
    check_head_counts(config, where)
    printed = io.StringIO()
    try:
        return _classes_quietly(config, printed)
    except SystemExit as e:
        # mlx-lm's olmo module prints "To run olmo install ai2-olmo: ..." and exits the process when that
        # package is missing: a chat or a script calling load() ended there, with no error to catch.
        said = " ".join(printed.getvalue().split()) or "it exited"
        raise UnsupportedModelError(f"{model_type!r} cannot be loaded: mlx-lm's model for it needs a package that "
                                    f"is not installed ({said})") from e
    except ValueError as e:
        missing = e.__cause__.name if isinstance(e.__cause__, ModuleNotFoundError) else None
        if missing and not missing.startswith("mlx_lm.models."):  # its module exists, a package it imports does not
            raise UnsupportedModelError(f"{model_type!r} cannot be loaded: mlx-lm's model for it imports {missing}, "
                                        f"which is not installed (pip install {missing.split('.')[0]})") from e
        raise UnsupportedModelError(
            f"unsupported architecture {model_type!r}: mlx-lm {_mlx_lm_version()} has no model for it"
            + _close_model_type(str(model_type))
        ) from e


def _close_model_type(model_type: str) -> str:
    """' (did you mean 'llama'?)' for a model_type that is almost one mlx-lm has ('Llama', 'llamma'), else ''."""
    import difflib
    import pkgutil

    import mlx_lm.models
    from mlx_lm.utils import MODEL_REMAPPING

    known = sorted({m.name for m in pkgutil.iter_modules(mlx_lm.models.__path__) if not m.name.startswith("_")}
                   | set(MODEL_REMAPPING))
    close = difflib.get_close_matches(model_type.lower().replace("-", "_"), known, n=1, cutoff=0.8)
    return f" (did you mean {close[0]!r}?)" if close and close[0] != model_type else ""


def _mlx_lm_version() -> str:
    from importlib.metadata import version

    return version("mlx-lm")


def config_overrides(config: Dict[str, Any]) -> Dict[str, Any]:
    """Config keys to add before mlx-lm reads a config: transformers >= 5 writes rope settings
    as {"rope_parameters": {"rope_theta", "rope_type", ...}}, which mlx-lm's model args
    (as pinned) read as rope_theta / rope_scaling."""
    out = {}
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" not in config and "rope_theta" in rope:
            out["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default" and "rope_scaling" not in config:
            out["rope_scaling"] = rope
    return out


def _quantized(model: nn.Module) -> bool:
    return any(hasattr(m, "scales") for _, m in model.named_modules())


def stored_quantization(model: nn.Module, quant: Any) -> Optional[Dict[str, Any]]:
    """The quantization `model`'s layers hold, in mlx-lm's config form ({"group_size", "bits"} and per-layer
    overrides), or None: `quant` (the config's block) where it says the same. mlx-lm reads each layer's bits and
    group size from the weights, so a block that says otherwise, or one beside unquantized weights, was reported
    as the format ("8-bit (group 32)" of 4-bit weights; "stored 4-bit" in the chat of a float32 model)."""
    layers = {path: (m.bits, m.group_size) for path, m in model.named_modules()
              if hasattr(m, "scales") and hasattr(m, "bits")}
    if not layers:
        return None
    if isinstance(quant, dict) and "bits" in quant and "group_size" in quant:
        said = {path: (q["bits"], q["group_size"]) if isinstance(q := quant.get(path), dict) and "bits" in q
                and "group_size" in q else (quant["bits"], quant["group_size"]) for path in layers}
        if said == layers:
            return quant
    pairs = list(layers.values())
    bits, group = max(sorted(set(pairs)), key=pairs.count)
    out: Dict[str, Any] = {"group_size": group, "bits": bits}
    out.update({path: {"group_size": g, "bits": b} for path, (b, g) in sorted(layers.items()) if (b, g) != (bits, group)})
    return out


def _set_format(model: nn.Module, config: Dict[str, Any], weight_format: str) -> str:
    """Bring a loaded mlx-lm model to the weight format asked for; returns its description."""
    from mlx.utils import tree_flatten, tree_unflatten

    quantized = _quantized(model)
    fmt = _resolve_format(weight_format, quantized)
    if fmt in DTYPES:
        if quantized:
            from mlx_lm.utils import dequantize_model

            # To float32, dequantize in float32 (the scales' dtype decides): llama.cpp's own
            # arithmetic for GGUF blocks, one rounding fewer, and fast on a CPU, where MLX computes
            # float16 in software (the default model's build: 3-6 s in float16, 1.8 s in float32).
            for _, module in model.named_modules():
                if fmt == "float32" and getattr(module, "mode", "affine") == "affine" and hasattr(module, "scales"):
                    for key in ("scales", "biases"):
                        if key in module and mx.issubdtype(module[key].dtype, mx.floating):
                            module[key] = module[key].astype(mx.float32)
            model = dequantize_model(model)
        model.set_dtype(DTYPES[fmt])
        return fmt
    if not quantized:
        return str(next(v.dtype for _, v in tree_flatten(model.parameters()))).replace("mlx.core.", "")
    # A GPU keeps activations in the scales' dtype (GGUF stores norms in float32, scales in
    # float16): only vectors (norms) are cast. MLX's CPU kernels are slow in float16 (default
    # model: 5.3 s per token in float16, 0.2 s in float32), so the CPU casts scales, biases and
    # norms to float32 and computes in float32 around the packed weights.
    params = tree_flatten(model.parameters())
    cpu = on_cpu()
    act = mx.float32 if cpu else next(v.dtype for k, v in params if k.endswith(".scales"))
    cast = [(k, v.astype(act)) for k, v in params
            if mx.issubdtype(v.dtype, mx.floating) and (cpu or v.ndim == 1) and v.dtype != act]
    if cast:
        model.update(tree_unflatten(cast))
    quant = config.get("quantization") or {}
    return _describe_quant(quant) if "bits" in quant and "group_size" in quant else "quantized"


def build_model(config: Dict[str, Any], weights: Dict[str, mx.array], weight_format: str = "stored") -> Tuple[TreeModel, str]:
    """mlx-lm's model for `config` with `weights` (HF / mlx-lm names; quantized triplets per
    `config["quantization"]`), loaded strictly and brought to `weight_format`. Returns
    (tree model, format description)."""
    model_class, args_class = model_classes(config)
    config = {**config, **config_overrides(config)}
    try:
        model = model_class(args_class.from_dict(config))
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise CorruptModelError(f"config.json does not describe a {config['model_type']} model: {_config_problem(e)}") from e
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    quant = config.get("quantization") or {}
    if quant:
        if "bits" not in quant or "group_size" not in quant:
            raise UnsupportedModelError(f"unsupported quantization block in config: {quant}")

        def predicate(path, module):
            if f"{path}.scales" not in weights or not hasattr(module, "to_quantized"):
                return False
            q = quant.get(path)
            return q if isinstance(q, dict) else {"group_size": quant["group_size"], "bits": quant["bits"]}

        nn.quantize(model, class_predicate=predicate)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise CorruptModelError(f"weights do not fit the model config: {one_line(e)}") from e
    description = _set_format(model, config, weight_format)
    mx.eval(model.parameters())
    return TreeModel(model, config), description


def new_model(config: Dict[str, Any], seed: int = 0) -> TreeModel:
    """An mlx-lm model of `config`'s family with random weights (for tests and tools)."""
    model_class, args_class = model_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return TreeModel(model, config)


def _refuse_folder_without_config(path: Path) -> NoReturn:
    """A folder without config.json is refused, naming what to pass where it holds one: a .gguf file (a downloaded
    GGUF's folder), or a model folder inside it."""
    registry.refuse_gguf_folder(path)
    try:
        inner = sorted(d for d in path.iterdir() if d.is_dir() and d.name != "drafter"
                       and (d / "config.json").is_file()
                       and DRAFTER_MODEL_TYPE not in (d / "config.json").read_text(errors="replace"))
    except OSError:  # (an unreadable folder: the error below is what there is to say)
        inner = []
    if inner:  # an archive unpacked into a folder of its own, a folder of models: "not a model folder", no more
        raise ModelNotFoundError(f"{path} has no config.json: not a model folder, but {inner[0].name}/ in it is "
                                 f"one{f' (and {len(inner) - 1} more)' if len(inner) > 1 else ''}: pass {inner[0]}")
    try:  # the weights there, config.json left out of a copy: "not a model folder" said nothing of what to do
        weights = next(path.glob("*.safetensors"), None)
    except OSError:
        weights = None
    if weights is not None:
        raise ModelNotFoundError(f"{path} has no config.json, beside the weights in {weights.name}: copy the model's "
                                 "config.json into it")
    raise ModelNotFoundError(f"{path} has no config.json: not a model folder (one holds config.json, *.safetensors "
                             "weights and tokenizer files: give that folder)")


def _weight_files(path: Path) -> List[Path]:
    """The model*.safetensors files mlx-lm reads in `path`, refusing a folder without them, one missing a shard,
    and one mixing the weights of two downloads."""
    files = sorted(path.glob("model*.safetensors"))  # what mlx-lm reads (Mistral's repos add consolidated.safetensors)
    others = sorted(f.name for f in path.glob("*.safetensors"))
    if not files and others:  # mlx-lm said "No safetensors found", of a folder with some
        raise ModelNotFoundError(f"{path} has no model*.safetensors weights, the files mlx-lm reads, but "
                                 f"{', '.join(others[:3])}: rename the model's weights to model.safetensors")
    if not files:
        # (without a .bin there it said "has no *.safetensors weights", no more: a copy that left them out, say)
        hint = (" (a PyTorch checkpoint: convert it with `python -m convert`)" if list(path.glob("*.bin")) else
                ": copy the model's weights into it (model.safetensors, or all its model-*-of-*.safetensors shards)")
        raise ModelNotFoundError(f"{path} has no *.safetensors weights{hint}")
    index = path / "model.safetensors.index.json"
    if index.is_file():  # a shard missing read as weights that "do not fit the model config: Missing parameters"
        shards = read_json_object(index, "safetensors index").get("weight_map")
        listed = [f for f in shards.values() if isinstance(f, str)] if isinstance(shards, dict) else []
        refuse_missing_shards(path, files, index.name, listed)
        if isinstance(shards, dict) and shards:
            refuse_mixed_weights(path, files, "model.safetensors", index.name, shards.values())
    else:
        # Without an index, shards are named model-00001-of-00003.safetensors: one missing read as weights that
        # "do not fit the model config: Missing 11 parameters"
        refuse_missing_shards(path, files)
        refuse_mixed_weights(path, files, "model.safetensors")
    return files


def _expected(key: str, value: Any) -> Optional[str]:
    """What config.json's `key` must hold where `value` is not that (null aside), else None."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key in BOOL_KEYS:  # "false" (text) is true in Python; 0 failed in MLX's rope, transformers refuses both
        return None if isinstance(value, bool) else "true or false"
    if key in NUMBER_KEYS:  # an int is fine: mlx-lm's own defaults are such (rope_theta: float = 10000)
        return None if number else "a number"
    if key == "max_position_embeddings":  # 4096.0 is read with int(); 0 and out-of-range values where it is read
        return None if number and float(value).is_integer() else "a whole number"
    whole = isinstance(value, int) and not isinstance(value, bool)  # 32.0 failed in MLX ("normal(): incompatible ...")
    if key == "head_dim":  # 0: not given (llama: head_dim or hidden_size // heads)
        return None if whole and value >= 0 else "a whole number of 0 or more"
    return None if whole and value >= 1 else "a whole number above 0"


def _fields(args_class: Any) -> Optional[Dict[str, bool]]:
    """The fields of an mlx-lm model args class (what from_dict reads), each with whether its family takes null for
    it (an optional field, or code that fills it in: glm's head_dim `or hidden_size // heads`, gear's
    num_key_value_heads `is None`; qwen2's asserts it is not), or None where they cannot be told."""
    try:
        params = inspect.signature(args_class).parameters
    except (TypeError, ValueError):
        return None
    try:
        source = inspect.getsource(inspect.getmodule(args_class))
    except (OSError, TypeError):
        source = ""
    return {k: p.default is None or "Optional" in str(p.annotation) or "None" in str(p.annotation)
            or re.search(rf"\b{k}\s+(or\b|is\s+None\b|==\s*None\b)", source) is not None for k, p in params.items()}


def _refuse_wrong_types(cfg_path: Path, config: Dict[str, Any], args_class: Any = None) -> None:
    """A size, number or true/false key (SIZE_KEYS, NUMBER_KEYS, BOOL_KEYS) of another type: "rope_theta": "10000.0",
    "hidden_size": 32.0, "rms_norm_eps": null, "tie_word_embeddings": "yes", failed inside mlx-lm or MLX (at the
    first forward, in the tokenizer's transformers) in their words, naming no key, or went through ("false" is true).
    Keys the family's model args (`args_class`) do not read are let be, as mlx-lm ignores them, but for sizes given as
    text, true/false or a fraction; null passes where its field is optional (mlx-lm defaults it). A text_config is
    judged by the model args of its model_type (a vision-language wrapper's text model), null passing where those
    are not known; rope_parameters' rope_theta where it is the one read (config_overrides)."""
    fields = _fields(args_class)
    blocks = [("", config, fields)]
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in config:
        blocks.append(("rope_parameters.", {"rope_theta": rope["rope_theta"]}, fields))
    text = config.get("text_config")
    if isinstance(text, dict):
        inner = None
        if fields is not None and "text_config" not in fields:
            inner = {}  # not read: sizes alone, as at the top
        elif isinstance(text.get("model_type"), str):
            try:
                inner = _fields(_classes_quietly(text)[1])
            except (ValueError, KeyError, ImportError, SystemExit):
                pass  # (model_classes says what of it)
        blocks.append(("text_config.", text, inner))
    for where, block, read in blocks:
        for key in (*SIZE_KEYS, *NUMBER_KEYS, *BOOL_KEYS):
            if key not in block:
                continue
            value = block[key]
            if read is not None and key not in read and not (key in SIZE_KEYS and (
                    isinstance(value, (str, bool)) or isinstance(value, float) and not value.is_integer())):
                continue  # a key this family does not read
            if value is None and (read is None or read.get(key, True) or key == "max_position_embeddings"):
                continue  # (the context's null is read as not given, and mlx-lm reads it for rope scaling alone)
            expected = _expected(key, value)
            if expected:
                if value is None or isinstance(value, int) and not isinstance(value, bool) and key not in BOOL_KEYS:
                    kind = ""
                elif isinstance(value, float) and value.is_integer() and key in SIZE_KEYS:
                    kind = " (written with a decimal point)"
                else:
                    kind = f" ({json_kind(value)})"
                raise CorruptModelError(f"{cfg_path}: {where}{key} is {one_line(json.dumps(value), 80)}{kind}; "
                                        f"{expected} is expected")


def _refuse_bad_quantization_block(cfg_path: Path, config: Dict[str, Any]) -> None:
    """An mlx-community `quantization` block without whole-number bits and group_size."""
    quant = config.get("quantization")
    if quant is not None and not (isinstance(quant, dict) and all(
            isinstance(quant.get(k), int) and not isinstance(quant.get(k), bool) and quant[k] > 0
            for k in ("bits", "group_size"))):
        # mlx-lm failed on it: "config.json ... does not describe a llama model: 'bits'" (or "string indices ...")
        raise CorruptModelError(f"{cfg_path}: its quantization block ({one_line(json.dumps(quant), 80)}) does not give "
                                'bits and group_size as whole numbers, as mlx-lm writes them ({"group_size": 64, '
                                '"bits": 4}): use the config.json written with these weights')


def _tensor_names(files: List[Path]) -> Tuple[Set[str], Dict[str, Path]]:
    """The tensor names in the weight files (their headers alone), and the files holding lm_head.weight and
    model.embed_tokens.weight; a file that cannot be read is refused, named as a Git LFS pointer or as cut short
    where it is one."""
    from safetensors import safe_open

    names, where = set(), {}
    for f in files:
        try:
            with safe_open(str(f), framework="numpy") as fh:
                keys = list(fh.keys())
            names.update(keys)
            where.update((k, f) for k in keys if k in ("lm_head.weight", "model.embed_tokens.weight"))
        except Exception as e:  # safetensors raises its own error types
            refuse_lfs_pointer(f)  # it said "Invalid json header length"
            cut = any(w in str(e) for w in ("not fully covered", "header too small", "invalid header length"))
            # a damaged header (not cut short) was said in the reader's words alone, no file named, nothing to do
            damaged = "os error" not in str(e)  # (an unreadable file: Permission denied (os error 13))
            raise CorruptModelError(f"cannot read {f.name}: {one_line(e)}" + (
                f" ({f} is cut short or damaged: an interrupted download or copy? download it again)" if cut else
                f" ({f} is damaged: download or copy it again)" if damaged else "")) from e
    return names, where


def _refuse_model_file(cfg_path: Path, config: Dict[str, Any]) -> None:
    if config.get("model_file") is not None:  # mlx-lm said "Pass trust_remote_code=True", an option load() has not
        raise UnsupportedModelError(f"{cfg_path} names a model file of its own ({config['model_file']!r}): this tool "
                                    "runs mlx-lm's model classes and never a model folder's own code; drop model_file "
                                    "from config.json where its model_type is a family mlx-lm has")


def _refuse_quantization_config_without_its_weights(path: Path, config: Dict[str, Any], names: Set[str]) -> None:
    """A quantization_config saying AWQ or GPTQ beside weights that are not (no .qweight tensors)."""
    cfg_path = path / "config.json"
    text_config = config.get("text_config") or {}
    qconfig = config.get("quantization_config", text_config.get("quantization_config"))
    method = qconfig.get("quant_method") if isinstance(qconfig, dict) else None
    if method in ("awq", "gptq") and "quantization" not in config and not any(n.endswith(".qweight") for n in names):
        # mlx-lm's AutoAWQ/GPTQ reader failed on it with an UnboundLocalError (a traceback)
        raise CorruptModelError(f"{cfg_path} says its weights are {method.upper()}-quantized (quantization_config), "
                                f"but the weights in {path.name} hold no .qweight tensors: use the config.json written "
                                "with these weights (without quantization_config if they are not quantized)")


def check_folder(path: Path, config: Dict[str, Any]) -> Tuple[Set[str], Dict[str, Path]]:
    """Refuse, with a one-line error, what mlx-lm's load_model would fail on unclearly (or with a traceback) in model
    folder `path`, whose config.json holds `config`: the weights missing, a shard missing, two downloads' weights
    mixed, a family mlx-lm cannot build or that cannot verify trees, sizes, numbers and true/false values of
    another type, a bad quantization block, an unreadable weight file, a model_file, an AWQ/GPTQ config without
    such weights. Nothing is loaded: tensors are read by their headers. Returns the tensor names in the weights,
    and the files holding lm_head.weight and model.embed_tokens.weight."""
    cfg_path = path / "config.json"
    files = _weight_files(path)
    _, args_class = model_classes(config, str(cfg_path))  # refuses unsupported families before reading any weights
    _refuse_wrong_types(cfg_path, config, args_class)
    _refuse_bad_quantization_block(cfg_path, config)
    names, where = _tensor_names(files)
    _refuse_model_file(cfg_path, config)
    _refuse_quantization_config_without_its_weights(path, config, names)
    return names, where


def _load_folder(path: Path, weight_format: str, progress: Optional[Callable[[str], None]] = None
                 ) -> Tuple[Dict[str, Any], TreeModel, str, Tokenizer]:
    """A Hugging Face / mlx-community folder, built by mlx-lm's own loading (config, sanitize,
    quantization), after checks that give one-line errors."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        _refuse_folder_without_config(path)  # (it raises)
    config = read_json_object(cfg_path, "model config")
    gen = path / "generation_config.json"  # optional; mlx-lm reads it too
    generation = read_json_object(gen, "generation config") if gen.is_file() else {}
    names, where = check_folder(path, config)
    overrides = config_overrides(config)
    text_config = config.get("text_config") or {}
    if "tie_word_embeddings" not in config and "tie_word_embeddings" not in text_config:
        # Some configs omit it: the weights tell (an lm_head of its own means untied; internlm2 calls it `output`).
        overrides["tie_word_embeddings"] = not any(n.split(".")[-2:-1] == ["lm_head"] or n.split(".")[0] == "output"
                                                   for n in names)
    tied = config.get("tie_word_embeddings", text_config.get("tie_word_embeddings"))
    own_head = False  # an lm_head.weight that is not the embedding, beside a config that says they are tied
    if tied is True and len(where) == 2:
        own_head = len({_leading_bytes(where[k], k) for k in ("lm_head.weight", "model.embed_tokens.weight")}) > 1
    from mlx_lm.utils import load_model

    try:
        model, config = load_model(path, lazy=True, strict=True, model_config=overrides)
    except (ValueError, FileNotFoundError, RuntimeError, KeyError, TypeError, AttributeError) as e:
        text = one_line(e)
        if _misfit(text) and "scales" in text and not config.get("quantization"):
            # it said only "Received 32 parameters not in model: lm_head.biases, lm_head.scales, ..."
            raise CorruptModelError(f"the weights in {path.name} are quantized (they hold .scales and .biases) but its "
                                    "config.json has no quantization block (bits, group_size): use the config.json "
                                    f"written with these weights: {text}") from e
        if tied is True and re.search(r"Received \d+ parameters not in model: lm_head\.weight\.?$", text):
            # phi3, starcoder2, ...: it said only "weights do not fit the model config: Received 1 parameters ..."
            raise CorruptModelError(f"{cfg_path} says tie_word_embeddings true, but the weights in {path.name} have an "
                                    "lm_head of their own: set tie_word_embeddings to false") from e
        missing = re.search(r"Missing \d+ parameters: ([^ ]+(?:, [^ ]+)*?)\.?$", text)
        if (missing and all(n.strip().startswith("lm_head.") for n in missing[1].split(","))
                and not any(n.startswith("lm_head.") for n in names)):
            # it said only "Missing 1 parameters: lm_head.weight."
            raise CorruptModelError(f"{cfg_path} says tie_word_embeddings false, but the weights in {path.name} have "
                                    "no lm_head of their own (the output layer is the input embedding): set "
                                    "tie_word_embeddings to true") from e
        if _misfit(text):
            raise CorruptModelError(f"weights do not fit the model config: {text}") from e
        if "safetensors" in text:
            raise CorruptModelError(f"cannot read the weights in {path.name}: {text}") from e
        raise CorruptModelError(f"config.json in {path.name} does not describe a {config['model_type']} model: "
                                f"{_config_problem(e)}") from e
    if own_head:  # mlx-lm (as transformers) drops an lm_head the config says is tied: it was ignored, saying nothing
        message = (f"{cfg_path} says tie_word_embeddings true, so the lm_head.weight in {path.name}, which is not the "
                   "input embedding, is not used (as in transformers): if the model was trained with its own output "
                   "layer, set tie_word_embeddings to false")
        warnings.warn(message, RedrafterWarning, stacklevel=3)
        if progress:  # (as the self-check's warning: the chat shows these lines, not warnings)
            progress(message)
    quant = stored_quantization(model, config.get("quantization"))
    config = {k: v for k, v in config.items() if k != "quantization"}
    if quant:
        config["quantization"] = quant
    try:
        description = _set_format(model, config, weight_format)
        mx.eval(model.parameters())
    except (ValueError, RuntimeError) as e:
        raise CorruptModelError(f"cannot read the weights in {path.name}: {one_line(e)}") from e
    eos = []
    for where, source in (("generation_config.json", generation), ("config.json", config)):
        ids = source.get("eos_token_id")
        ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
        bad = [i for i in ids if not is_token_id(i)]
        if bad:  # 2.5 became token 2
            raise CorruptModelError(f"{where} in {path.name}: eos_token_id holds {bad[0]!r}, not a token id")
        eos += ids
    return config, TreeModel(model, config), description, Tokenizer.from_folder(path, eos)


def load(
    name: Optional[str] = None,
    *,
    drafter: Optional[str] = None,
    weight_format: str = "auto",
    use_drafter: bool = True,
    progress: Optional[Callable[[str], None]] = None,
) -> LoadedModel:
    """Load a model by registry name, local path (.gguf or folder) or hub id.

    name: a registry name, a path or a hub id; None (the default) loads the registry's default
        model (smollm2-135m).
    drafter: a drafter folder that overrides the one found beside the model; None (the default):
        the one found beside it, if any.
    use_drafter: True (the default) loads a drafter; False loads none (mode "auto" then drafts
        from the context alone).
    weight_format: "auto" (the default: fastest for the device), "stored" (as in the file, e.g.
        4-bit), "float32", "float16" or "bfloat16".
    progress: a function (str) -> None, called with short status lines (fetch, load, what is
        off about the model) for UIs; None (the default): nothing is told.
    """
    t0 = time.perf_counter()
    if name is not None and not isinstance(name, (str, os.PathLike)):
        raise SettingError(f"a model is a registry name, a path or a hub id, not {type(name).__name__}")
    if isinstance(name, str) and not name.strip():  # "" loaded the default model, saying nothing
        raise SettingError("the model name is empty: give a registry name, a path or a hub id (None: the default)")
    if drafter is not None and not isinstance(drafter, (str, os.PathLike)):
        raise SettingError(f"a drafter is a folder's path, not {type(drafter).__name__}")
    if isinstance(drafter, str) and not drafter.strip():  # "" took the drafter found beside the model, saying nothing
        raise SettingError("the drafter path is empty: give a drafter folder (None: the one found beside the model; "
                           "use_drafter=False: none)")
    if not isinstance(use_drafter, (bool, np.bool_)):  # "no" was taken as True, as stream refuses it
        raise SettingError(f"use_drafter must be True or False, not {use_drafter!r}")
    if drafter is not None and not use_drafter:  # the drafter given was dropped, saying nothing
        raise SettingError("drafter=PATH loads that drafter and use_drafter=False loads none: give one of them")
    if progress is not None and not callable(progress):  # it failed inside, "'int' object is not callable"
        raise SettingError(f"progress must be a function (str) -> None or None, not {type(progress).__name__}")
    _resolve_format(weight_format)  # a bad format fails before any work
    resolved = registry.resolve(os.fspath(name) if name is not None else None, progress)
    if progress:
        progress(f"loading {resolved.path.name}")
    try:
        if resolved.kind == "gguf":
            config, weights, meta = read_gguf(resolved.path)
            tokenizer = Tokenizer.from_gguf_metadata(meta)
            tokenizer.check_chat_template(f"the chat template in {resolved.path.name} (tokenizer.chat_template)")
            model, description = build_model(config, weights, weight_format)
        else:
            config, model, description, tokenizer = _load_folder(resolved.path, weight_format, progress)
    except RedrafterError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, AttributeError) as e:
        # a value the files' checks let through that mlx-lm or the tokenizer cannot use (0 attention
        # heads, a rope_theta in quotes, an eos id "x", a GGUF token table shorter than its types)
        raise CorruptModelError(f"cannot build {resolved.path.name} from its files: {type(e).__name__}: "
                                f"{one_line(e)} (a damaged or hand-edited config or tokenizer?)") from e
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        args=model.args,
        name=resolved.name,
        path=resolved.path,
        weight_format=description,
        info={"source_quantization": config.get("quantization"), "load_seconds": 0.0},
        resolved=resolved,
    )
    try:
        loaded.tree_ok, loaded.info["self_check_error"] = self_check(model)
    except (ValueError, TypeError) as e:  # the first forward: e.g. a rope_theta given as a string
        raise CorruptModelError(f"{resolved.path.name} loads but cannot run: {type(e).__name__}: {one_line(e)} "
                                "(a damaged or hand-edited config?)") from e
    except RuntimeError as e:  # mlx-lm's code for another backend: bitnet's Metal kernels on a CPU (a traceback)
        raise UnsupportedModelError(f"{resolved.path.name} loads but cannot run on this device "
                                    f"({device_description()}): {one_line(e)}") from e
    message = _end_token_problem(resolved, tokenizer, getattr(model.args, "vocab_size", None),
                                 meta if resolved.kind == "gguf" else None)
    if message:  # replies ran on to max_tokens, saying nothing of why
        warnings.warn(message, RedrafterWarning, stacklevel=2)
        if progress:
            progress(message)
    if not loaded.tree_ok:
        message = (f"speculation off for {resolved.name}: a draft tree verified on it disagrees with plain "
                   f"decoding (relative logit error {loaded.info['self_check_error']:.2g}); decoding plainly")
        warnings.warn(message, RedrafterWarning, stacklevel=2)
        if progress:
            progress(message)
    if use_drafter:
        drafter_path = drafter if drafter else find_drafter(resolved)
        if drafter_path is not None:
            try:
                attach_drafter(loaded, drafter_path, progress)
            except RedrafterError as e:
                if drafter:
                    raise
                # found, not asked for: the error named a folder the user never gave, and no way past it
                raise type(e)(f"{e} (the drafter found for {resolved.name}; use_drafter=False, --no-drafter on the "
                              "command line, loads the model without it)") from e
    loaded.info["load_seconds"] = time.perf_counter() - t0
    return loaded


def _end_token_problem(resolved: "registry.ResolvedModel", tokenizer: Tokenizer, vocab: Any,
                       meta: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """What to warn of a model's end tokens, or None: none named, or ids named outside the model's vocabulary (the
    model never emits them: a config from another model, or a damaged one). Those are dropped from the tokenizer's
    stop set. Warned, not refused: the model runs as it should, and it still stops at the end tokens it names
    within its vocabulary (llama.cpp, too, ignores such an id with a warning); with none left, replies run on to
    max_tokens, as with none named. `meta`: a GGUF's metadata (its ids outside its token table never reach the
    tokenizer)."""
    named: Dict[int, str] = {}  # id -> where the model's files name it
    if meta is not None:
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
            value = meta.get(key)
            value = value.item() if hasattr(value, "item") else value
            if is_token_id(value):
                named.setdefault(int(value), key)
    else:
        for name in ("generation_config.json", "config.json"):
            f = resolved.path / name
            ids = read_json_object(f, "model config").get("eos_token_id") if f.is_file() else None
            for i in ids if isinstance(ids, list) else [ids]:
                if is_token_id(i):
                    named.setdefault(int(i), f"eos_token_id in {name}")
    outside = sorted({i for i in [*named, *tokenizer.eos_token_ids] if is_token_id(vocab) and i >= vocab})
    if outside:
        tokenizer.eos_token_ids = [i for i in tokenizer.eos_token_ids if i < vocab]
        of_tokenizer = "the tokenizer's end token"
        said = ", ".join(f"{i} ({named.get(i, of_tokenizer)})" for i in outside[:3])
        return (f"{resolved.name} names end-of-sequence token id{'s' if len(outside) > 1 else ''} {said}"
                f"{' and more' if len(outside) > 3 else ''} outside its vocabulary of {vocab} tokens (ids 0 to "
                f"{vocab - 1}), which the model never emits (a config from another model, or a damaged one?): "
                + ("ignored" if tokenizer.eos_token_ids else
                   "ignored, and it names no other end token: generation stops only at max_tokens"))
    if not tokenizer.eos_token_ids:
        where = ("no tokenizer.ggml.eos_token_id or eot_token_id in the GGUF" if meta is not None else
                 "no eos_token_id in config.json or generation_config.json, no eos_token in tokenizer_config.json")
        return (f"{resolved.name} names no end-of-sequence or end-of-turn token ({where}): "
                "generation stops only at max_tokens")
    return None


def attach_drafter(loaded: LoadedModel, drafter, progress: Optional[Callable[[str], None]] = None,
                   advice: Optional[str] = None) -> LoadedModel:
    """Load the drafter folder `drafter` for `loaded` (one loaded with use_drafter=False) as load(drafter=...)
    does: with the beam shape, tree, lookup and floor `redrafter-bench --tune` stored for this device (the
    model folder's, else the drafter's). A drafter that fails to load leaves `loaded` as it was. The chat
    loads its --drafter so, after the base model, that a bad drafter does not cost the model: attaching it
    by hand kept the tuned shape out. advice: what the error of a drafter that does not fit the model says to
    do (a command's own options; by default, the drafter for this model or --no-drafter)."""
    from .drafter import DRAFTER_ADVICE, load_drafter

    path = Path(drafter).expanduser()  # as --model's is: "--drafter=~/d" (no shell expands it) passed the CLI's check
    tidy(Path(os.path.abspath(path)))  # as a model folder's path is (registry.resolve)
    if progress:
        progress(f"loading drafter {path}")
    loaded.drafter = load_drafter(path, loaded.model, advice or DRAFTER_ADVICE)
    loaded.drafter_path = path
    own = find_drafter(loaded.resolved) if isinstance(loaded.resolved, registry.ResolvedModel) else None
    tuned = find_tuned(loaded.path, path, getattr(loaded, "weight_format", None), progress, own)
    if tuned:
        loaded.beam_shape, loaded.tree = tuned[:2], tuned.tree
        loaded.lookup, loaded.tree_min_prob = tuned.lookup, tuned.tree_min_prob
    return loaded


def find_drafter(resolved: "registry.ResolvedModel") -> Optional[Path]:
    """The model's drafter: the one installed at `resolved.drafter_home` (by redrafter-train),
    a hub snapshot's own drafter/ folder, or the one shipped for a registry model."""
    candidates = [resolved.drafter_home]
    if resolved.hub_folder:
        candidates.append(resolved.path / "drafter")
    shipped = registry.shipped_drafter(resolved.entry)
    if shipped:
        candidates.append(shipped)
    for c in candidates:
        tidy(c)  # a drafter set aside by a process killed while replacing it goes back first
        # one whose config.json is missing is found too, to be refused by name: the model loaded as if it had none,
        # "drafter: none", and the copy left incomplete went unsaid
        if (c / "config.json").is_file() or (c / "model.safetensors").is_file():
            return c
    return None
