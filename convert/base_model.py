"""Base model -> MLX weights, config and tokenizer: a Hugging Face checkpoint of a supported family (mlx-lm builds it) or a llama GGUF.

Hugging Face folders go through mlx-lm's own utilities: `load_model` (lazy, strict, never
`trust_remote_code`), `quantize_model`, `save_model`, `save_config`. mlx-lm reads only
`model*.safetensors`, so `pytorch_model*.bin` shards are first rewritten as safetensors in
a staging folder inside the (temporary) output folder, read with torch's weights-only loader.

GGUF files are read and validated by the library (`redrafter_mlx.gguf.read_gguf`,
`redrafter_mlx.loader.build_model`). Their quantization is kept (the per-layer block mlx-lm
writes, e.g. {"group_size": 32, "bits": 4, "model.embed_tokens": {"group_size": 32, "bits": 8}},
and `rope_traditional: true` because GGUF permutes Q/K) with every tensor as stored in the
file, unless a dtype is asked for: then the library dequantizes them.

Every tensor is materialized once, under a progress bar; then mlx-lm writes the shards, with no
progress of its own, after a status line saying how much it writes.
"""

import contextlib
import io
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map

from redrafter_mlx.config import DRAFTER_MODEL_TYPE, ModelArgs
from redrafter_mlx.errors import CorruptModelError, ModelNotFoundError, RedrafterError, UnsupportedModelError, one_line
from redrafter_mlx.registry import refuse_gguf_folder, refuse_gguf_without_suffix
from redrafter_mlx.tokenizer import is_token_id

from .checkpoint import _torch, load_safetensors, pytorch_to_safetensors, read_json, weight_files
from .output import ConversionError
from .tokenizer import save_gguf_tokenizer, save_hf_tokenizer, write_generation_config

DTYPES = ("float16", "bfloat16", "float32")
STAGING = ".pytorch-as-safetensors"


@dataclass
class BaseSource:
    """A base model source, opened far enough to know its architecture."""

    path: Path
    kind: str  # "hf" or "gguf"
    config: Dict[str, Any]
    args: ModelArgs


def check_architecture(config: Dict[str, Any], where: str) -> ModelArgs:
    """Refuse anything redrafter_mlx cannot run, before any work is done: a family mlx-lm
    does not build, or one that cannot verify a draft tree."""
    from redrafter_mlx.loader import model_classes

    if config.get("model_type") == DRAFTER_MODEL_TYPE:  # it said "... lacks num_hidden_layers"
        raise UnsupportedModelError(f"{where} is a drafter's, not a base model's: give its folder as --drafter, "
                                    "and the model it is for as --model (or --base)")
    needed = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")
    text = config.get("text_config") or {}
    # (a list here failed as "TypeError: unhashable type: 'list'" or "AttributeError: 'list' object has no
    # attribute 'get'", with the hint of a bug)
    for key, value, kind in (("model_type", config.get("model_type") or "", str), ("text_config", text, dict)):
        if not isinstance(value, kind):
            raise CorruptModelError(f"{where}: {key} must be {'a string' if kind is str else 'an object'}, "
                                    f"not {value!r}")
    # (a null counts as missing: it passed here and failed as "config.json lacks hidden_size", naming no folder)
    missing = ", ".join(k for k in needed if config.get(k) is None and text.get(k) is None)
    if missing:
        raise CorruptModelError(f"{where} is not a model config mlx-lm can build (it lacks {missing})")
    model_classes(config, where)
    return ModelArgs.from_config(config)


def check_options(base: BaseSource, dtype: Optional[str], quantize: bool):
    """Refuse what config.json alone rules out, before any work: they came once the drafter had been converted and
    hashed and the tokenizer written."""
    if base.kind != "hf":
        return
    if base.config.get("model_file") is not None:  # mlx-lm said "Pass trust_remote_code=True", an option not here
        raise UnsupportedModelError(f"{base.path}: config.json's model_file asks to build the model by running "
                                    f"{base.config['model_file']!r} from the checkpoint, which this converter "
                                    "never does")
    if quantize and dtype is None and base.config.get("quantization"):
        raise ConversionError(f"{base.path} is already quantized; convert it without --quantize, or give --dtype "
                              "too to dequantize it first and quantize it again")


def open_base(path: Path) -> BaseSource:
    if path.is_file():
        if path.suffix != ".gguf":
            refuse_gguf_without_suffix(path)
            raise ModelNotFoundError(f"{path} is a file but not a .gguf model: pass a .gguf file or a checkpoint folder")
        from redrafter_mlx.gguf import read_gguf_config

        # (its header alone: every tensor was read here, minutes for a large file, before a drafter that does not
        # fit it was refused; convert_gguf reads them)
        config = read_gguf_config(path)
        return BaseSource(path, "gguf", config, check_architecture(config, path.name))
    refuse_gguf_folder(path, "--model")  # (read_json said "has no config.json: not a model folder", no more)
    config = read_json(path / "config.json", "model")
    if (path / "generation_config.json").is_file():
        # it is copied as is: a damaged one was, and redrafter_mlx.load then refused the converted folder
        generation = read_json(path / "generation_config.json", "model")
        ids = generation.get("eos_token_id")
        bad = [i for i in (ids if isinstance(ids, list) else [ids]) if i is not None and not is_token_id(i)]
        if bad:  # (as redrafter_mlx.load checks it: that refused the folder written, after all the work)
            raise CorruptModelError(f"{path / 'generation_config.json'}: eos_token_id holds {bad[0]!r}, not a token id")
    args = check_architecture(config, str(path / "config.json"))
    if weight_files(path)[0] == "pytorch":
        _torch()  # (said before any work: it came once the drafter and the tokenizer were converted)
    return BaseSource(path, "hf", config, args)


def _materialize(model: nn.Module, report, desc: str) -> int:
    """Evaluate every parameter (reading, casting, quantizing happen here), one bar step each."""
    params = tree_flatten(model.parameters())
    bar = report.bar(total=len(params), desc=desc)
    try:
        for name, value in params:
            try:
                mx.eval(value)
            except Exception as e:
                raise CorruptModelError(f"cannot read tensor {name}: {one_line(e)}") from e
            bar.update(1)
    finally:
        bar.close()
    return len(params)


def _cast(model: nn.Module, dtype: str):
    target = getattr(mx, dtype)
    model.update(tree_map(lambda v: v.astype(target) if mx.issubdtype(v.dtype, mx.floating) else v, model.parameters()))


GROUP_SIZES = (128, 64, 32)  # --q-group-size's choices


def _check_group_size(model: nn.Module, group_size: int, report):
    """mlx-lm quantizes only the layers whose input width is a multiple of the group size and keeps the rest as
    they are, saying nothing: `--model smollm2-135m --quantize --q-group-size 128` (hidden size 576) gave a
    float16 model but for its 30 down projections, with a config saying 4-bit. Refused where another group size
    quantizes every layer; else a note says how many stay unquantized."""
    widths = [m.weight.shape[-1] for _, m in model.named_modules() if hasattr(m, "to_quantized") and "weight" in m]
    left = sorted(set(w for w in widths if w % group_size))
    if not left:
        return
    kept = sum(1 for w in widths if w % group_size)
    why = f"unquantized (input width {', '.join(map(str, left))}, not a multiple of --q-group-size {group_size})"
    fits = next((g for g in GROUP_SIZES if all(w % g == 0 for w in widths)), None)
    if fits is not None:
        raise ConversionError(f"{kept} of {len(widths)} layers would stay {why}: use --q-group-size {fits}, which "
                              "quantizes every layer")
    report.note(f"{kept} of {len(widths)} layers stay {why}")


def _quantize(model: nn.Module, config: Dict[str, Any], bits: int, group_size: int, report):
    from mlx_lm.utils import quantize_model

    _check_group_size(model, group_size, report)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # mlx-lm prints a bits-per-weight line
        model, config = quantize_model(model, config, group_size, bits)
    for line in printed.getvalue().splitlines():
        report.say(line.replace("[INFO] ", "").strip())
    return model, config


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _check_space(model: nn.Module, dest: Path):
    """Refuse a disk without room for the weights before the long part (reading, casting, quantizing every tensor):
    the write failed at the very end, "is the disk full", after minutes of work. (`dest`: the staging folder; .bin
    shards rewritten there are deleted before the write.)"""
    need = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    try:
        staged = sum(f.stat().st_size for f in (dest / STAGING).glob("*") if f.is_file())
        free = shutil.disk_usage(dest).free + staged
    except OSError:  # a file system that does not say: the write will tell
        return
    if need > free:
        raise ConversionError(f"the weights need {_size(need)} and {dest.parent} has {_size(free)} free: make room "
                              "or choose another --out")


def _save(model: nn.Module, config: Dict[str, Any], dest: Path, report):
    from mlx_lm.utils import make_shards, save_config, save_model

    # mlx-lm writes the shards with no word of progress: minutes for a large model, after the bar has ended,
    # looked like a hang.
    weights = dict(tree_flatten(model.parameters()))
    size, files = sum(v.nbytes for v in weights.values()), len(make_shards(weights))
    del weights
    wait = "; no progress is shown, this can take minutes" if size >= 1e9 else ""
    report.say(f"writing the weights ({_size(size)} in {files} file{'s' if files > 1 else ''}{wait})")
    save_model(dest, model, donate_model=True)
    save_config(config, config_path=dest / "config.json")


def _quant_summary(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    q = config.get("quantization")
    if not q:
        return None
    summary = {k: v for k, v in q.items() if not isinstance(v, dict)}
    overrides = {k: v for k, v in q.items() if isinstance(v, dict)}
    if overrides:
        summary["per_layer"] = overrides
    return summary


def rope_overrides(config: Dict[str, Any]) -> Dict[str, Any]:
    """Transformers >= 5 writes `rope_parameters` ({"rope_theta", "rope_type", ...}) where
    mlx-lm's llama and redrafter_mlx read `rope_theta` / `rope_scaling`: spell both out."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict) or "rope_theta" not in params:
        return {}
    out = {"rope_theta": params["rope_theta"]}
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if scaling.get("rope_type", scaling.get("type", "default")) != "default":
        out["rope_scaling"] = scaling
    return out


def _load_hf(src: Path, dest: Path, config: Dict[str, Any], report):
    """mlx-lm's lazy model for a checkpoint folder (`.bin` shards rewritten first)."""
    from mlx_lm.utils import load_model

    kind, files = weight_files(src)
    model_dir = src
    if kind == "pytorch":
        staging = dest / STAGING
        need = sum(f.stat().st_size for f in files)  # (the tensors as stored: safetensors hold them alike)
        try:
            free = shutil.disk_usage(dest).free
        except OSError:  # a file system that does not say: the write will tell
            free = need
        if need > free:  # (checked after the copy, which had failed "is the disk full" minutes in)
            raise ConversionError(f"rewriting the .bin shards as safetensors needs {_size(need)} and {dest.parent} "
                                  f"has {_size(free)} free: make room or choose another --out")
        report.say(f"reading {len(files)} .bin file{'s' if len(files) > 1 else ''} ({_size(need)}) with torch, "
                   f"{'each' if len(files) > 1 else 'it'} whole before its tensors are counted, and rewriting "
                   f"{'them' if len(files) > 1 else 'it'} as safetensors")
        index = src / "pytorch_model.bin.index.json"
        total = len(read_json(index, "checkpoint").get("weight_map") or {}) if index.is_file() else None
        bar = report.bar(total=total, desc="reading .bin")
        try:
            pytorch_to_safetensors(files, staging, bar.update)
        finally:
            bar.close()
        for name in ("config.json", "generation_config.json"):
            if (src / name).is_file():
                shutil.copy(src / name, staging / name)
        model_dir = staging
    # Read every shard's header now: a truncated file fails here, by name (lazy, no data read).
    names = set()
    for f in sorted(model_dir.glob("model*.safetensors")):
        names.update(load_safetensors(f).keys())
    overrides = rope_overrides(config)
    if "tie_word_embeddings" not in config:
        # Transformers leaves the default out of config.json (False for Llama); mlx-lm assumes
        # True and would silently drop lm_head.weight. Decide from the tensors themselves.
        overrides["tie_word_embeddings"] = "lm_head.weight" not in names
    try:
        model, config = load_model(model_dir, lazy=True, strict=True, model_config=overrides, trust_remote_code=False)
    except FileNotFoundError as e:
        raise ModelNotFoundError(f"{src}: {one_line(e)}") from e
    except ValueError as e:
        text = one_line(e)
        quantized = config.get("quantization_config") or {}
        if isinstance(quantized, dict) and any(w in text for w in ("quant", "AWQ", "GPTQ", "g_idx")):
            # mlx-lm's refusal of a quantization it cannot read ("Only bits=8 is supported for AutoAWQ/GPTQ
            # models" of an 8-bit one) read as "the tensors do not fit config.json".
            method = quantized.get("quant_method", "?")
            if method in ("awq", "gptq") and quantized.get("bits", 4) != 4:
                text = f"mlx-lm reads 4-bit {method} only, and this one is {quantized.get('bits')}-bit"
            raise UnsupportedModelError(f"{src}: its {method} quantization (config.json's quantization_config) "
                                        f"cannot be converted: {text} (convert the unquantized model; --quantize "
                                        "quantizes it)") from e
        if "not supported" in text:
            raise UnsupportedModelError(f"{src}: {text}") from e
        raise CorruptModelError(f"{src}: the tensors do not fit config.json: {text}") from e
    except (RedrafterError, MemoryError):
        raise
    except Exception as e:
        # mlx-lm's ModelArgs without a field it needs: "__init__() missing 1 required ..."
        missing = re.findall(r"'(\w+)'", str(e)) if isinstance(e, TypeError) and "required" in str(e) else []
        if missing:
            raise CorruptModelError(f"{src}: config.json lacks {', '.join(missing)}") from e
        # Every shard's header was read above (and tensors are read lazily, later): what fails here is mlx-lm
        # building the model from config.json's values. It said "cannot read ...: 'quant_method'" of a
        # quantization_config without one, "cannot read ...: float division by zero" of intermediate_size 0.
        said = one_line(e)
        said = said if said == type(e).__name__ else f"{type(e).__name__}: {said}"
        raise CorruptModelError(f"{src}: mlx-lm cannot build the model from its config.json ({said})") from e
    return model, config, kind, files


def _note_requantized(report, already: str, dtype: str):
    report.note(f"{already}: it is dequantized to {dtype} and quantized again, which adds the new quantization's "
                "error to the old one's (quantizing the unquantized model gives a more faithful one)")


def convert_hf(base: BaseSource, dest: Path, dtype, quantize, q_bits, q_group_size, template, report) -> Dict[str, Any]:
    src = base.path
    report.say("tokenizer")
    tok = save_hf_tokenizer(src, dest, template, base.args.vocab_size)
    if tok["past"]:  # (said nothing: every prompt that used one was refused, "its tokenizer files do not belong")
        report.note(f"the tokenizer has {tok['size']} tokens, {len(tok['past'])} past the model's vocabulary of "
                    f"{base.args.vocab_size} ({', '.join(tok['past'][:3])}{', ...' if len(tok['past']) > 3 else ''}): "
                    "a prompt holding one is refused (is the tokenizer another model's?)")
    if (src / "generation_config.json").is_file():
        shutil.copy(src / "generation_config.json", dest / "generation_config.json")
    model, config, kind, files = _load_hf(src, dest, base.config, report)
    quantized = any(name.endswith(".scales") for name, _ in tree_flatten(model.parameters()))
    stored_as = base.config.get("quantization_config")
    method = stored_as.get("quant_method", "") if isinstance(stored_as, dict) else ""
    already = f"{src} is already quantized{f' ({method})' if method else ''}"
    if quantize and quantized and dtype is None:
        # An AWQ/GPTQ/compressed-tensors checkpoint (quantization_config) loads as quantized layers, which
        # --quantize left as they were: "--q-bits 8" gave a model 4-bit but for its embeddings.
        raise ConversionError(f"{already}; convert it without --quantize, or give --dtype too to dequantize it "
                              "first and quantize it again")
    dequantize = quantized and dtype is not None
    if quantize and dequantize:
        # (--dtype X --quantize was refused, though --dtype alone dequantizes: it is dequantized, then quantized)
        _note_requantized(report, already, dtype)
    if dtype is None:
        stated = config.get("torch_dtype") or config.get("dtype")
        dtype = stated if stated in DTYPES else None
    if dtype:
        _cast(model, dtype)
        for key in ("torch_dtype", "dtype"):
            if key in config:
                config[key] = dtype
    if dequantize:
        # A dtype asked of a quantized folder (mlx-community's 4-bit, AWQ/GPTQ) cast its scales and kept the packed
        # weights, under a manifest naming the dtype: it is dequantized (from the cast scales), as a GGUF is.
        from mlx_lm.utils import dequantize_model

        model = dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    if quantize:
        model, config = _quantize(model, config, q_bits, q_group_size, report)
    _check_space(model, dest)
    count = _materialize(model, report, "converting")
    shutil.rmtree(dest / STAGING, ignore_errors=True)
    _save(model, config, dest, report)
    inputs = [src / "config.json", *files, *tok["files"]]
    if (src / "generation_config.json").is_file():
        inputs.append(src / "generation_config.json")
    return {"format": kind, "files": inputs, "tensors": count, "dtype": dtype or "as stored",
            "quantization": _quant_summary(config), "chat_template": tok["chat_template"]}


def convert_gguf(base: BaseSource, dest: Path, dtype, quantize, q_bits, q_group_size, template, report) -> Dict[str, Any]:
    from redrafter_mlx.gguf import read_gguf
    from redrafter_mlx.loader import build_model

    report.say(f"reading {base.path} ({_size(base.path.stat().st_size)})")  # (minutes for a large one)
    config, weights, meta = read_gguf(base.path)
    report.say("tokenizer")
    tok = save_gguf_tokenizer(meta, dest, template)
    write_generation_config(dest, tok["bos_token_id"], tok["eos_token_id"])
    if quantize and dtype is None:
        dtype = "float16"
    if quantize and config.get("quantization"):  # (a Q4_1 file was requantized saying nothing)
        _note_requantized(report, f"{base.path} is already quantized", dtype)
    # build_model validates names and shapes strictly; with a dtype it also dequantizes. (mlx-lm's model in the
    # library's wrapper: mlx-lm's quantize_model measured the wrapper, "0.000 bits per weight")
    model = build_model(config, weights, dtype or "stored")[0].model
    if dtype:
        config.pop("quantization", None)
    else:
        # Keep the file's tensors bit for bit: build_model("stored") casts the float32 norms
        # to the scales' float16 (how redrafter_mlx runs them); the folder keeps float32, as
        # the GGUF has it, and each loader picks its own compute dtype.
        model.load_weights([(k, v) for k, v in model.sanitize(weights).items() if v.ndim == 1], strict=False)
    del weights
    if quantize:
        model, config = _quantize(model, config, q_bits, q_group_size, report)
    _check_space(model, dest)
    count = _materialize(model, report, "converting")
    _save(model, config, dest, report)
    return {"format": "gguf", "files": [base.path], "tensors": count, "dtype": dtype or "as stored",
            "quantization": _quant_summary(config), "chat_template": tok["chat_template"]}


def convert_base(base: BaseSource, dest: Path, dtype: Optional[str], quantize: bool, q_bits: int, q_group_size: int,
                 template: Optional[str], report) -> Dict[str, Any]:
    """Write the base model (weights, config.json, tokenizer, generation_config.json) into dest."""
    convert = convert_gguf if base.kind == "gguf" else convert_hf
    info = convert(base, dest, dtype, quantize, q_bits, q_group_size, template, report)
    return {"source": str(base.path), **info}
