"""Checkpoint files in, MLX arrays out: locating sources, listing shards, reading tensors.

- Sources are local folders/files or Hugging Face hub ids (fetched with huggingface-hub,
  JSON/tokenizer/weight files only: never code).
- `.safetensors` files are read by MLX itself (no torch needed).
- `.bin` / `.pt` files are pickles. They are read only with `torch.load(..., weights_only=True)`,
  which refuses anything but tensors and plain containers, so a checkpoint can never run
  code here. torch is an optional dependency (`pip install 'redrafter-mlx[convert]'`).
"""

import errno
import json
import pickle
from pathlib import Path
from typing import Dict, List, Tuple

import mlx.core as mx

from redrafter_mlx import registry
from redrafter_mlx.errors import CorruptModelError, ModelNotFoundError, NetworkError
from redrafter_mlx.files import refuse_lfs_pointer, refuse_missing_shards, refuse_mixed_weights

from .output import ConversionError

HUB_PATTERNS = ["*.json", "model*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
HUB_PYTORCH_PATTERNS = ["pytorch_model*.bin"]
DRAFTER_FILES = ("model.safetensors", "pytorch_model.bin", "model.pt")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def is_hub_id(source: str) -> bool:
    """Would `resolve` fetch `source` from the hub (not a local path, nor a registry name)?"""
    parts = source.split("/")
    return (len(parts) == 2 and all(parts) and not source.startswith((".", "/", "~"))
            and not Path(source).expanduser().exists() and source not in registry.known_models())


def resolve(source: str, what: str, drafter: bool = False, config_only: bool = False) -> Path:
    """A local path as is; a model's registry name (`smollm2-135m`) as the file or folder it names;
    otherwise an `org/name` hub id fetched into the hub cache (its config.json alone with `config_only`)."""
    path = Path(source).expanduser()
    if path.exists():
        return path.resolve()
    if not drafter:
        if source in registry.known_models():
            return registry.resolve(source).path
    if not is_hub_id(source):
        raise ModelNotFoundError(f"{what} {source!r} not found: not a local path, nor a Hugging Face hub id (org/name)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise ModelNotFoundError(f"{source!r} looks like a hub id, but huggingface-hub is not installed") from e
    # (a drafter's model.safetensors first: its pytorch_model.bin and model.pt came too, unread)
    patterns = ["config.json"] if config_only else ["*.json", DRAFTER_FILES[0]] if drafter else HUB_PATTERNS
    try:
        folder = Path(snapshot_download(source, allow_patterns=patterns))
        if drafter and not (folder / DRAFTER_FILES[0]).is_file():
            pickles = list(DRAFTER_FILES[1:])
            try:
                _torch()
            except ConversionError:
                if registry.hub_files(source, pickles):  # (refused as it was read, after the base model's download)
                    raise
            folder = Path(snapshot_download(source, allow_patterns=patterns + pickles))
        if not drafter and not (folder / "config.json").is_file():  # (said "<a hub cache folder> has no config.json")
            registry.refuse_gguf_repository(source, registry.hub_files(source, ["config.json", "*.gguf"]),
                                            f"give that file as {'--base' if config_only else '--model'}")
        if not drafter and not config_only and not list(folder.glob("model*.safetensors")):
            try:
                _torch()
            except ConversionError:
                # said before the .bin weights are fetched: lmsys/vicuna-7b-v1.3's 13 GB came first, and a single
                # pytorch_model.bin (no index to tell) is asked of the hub
                if ((folder / "pytorch_model.bin.index.json").is_file()
                        or registry.hub_files(source, HUB_PYTORCH_PATTERNS)):
                    raise
            folder = Path(snapshot_download(source, allow_patterns=patterns + HUB_PYTORCH_PATTERNS))
    except (ConversionError, ModelNotFoundError):
        raise
    except Exception as e:
        kind = type(e).__name__
        if "RepositoryNotFound" in kind or "404" in str(e):
            raise ModelNotFoundError(f"no {what} {source!r} on the Hugging Face hub, nor a local path") from e
        raise NetworkError(f"{what} {source!r} is not a local path, and it could not be fetched from the Hugging Face "
                           f"hub ({kind}): {_first_line(e)}") from e
    return folder


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise ModelNotFoundError(f"{path.parent} has no {path.name}: not a {what} folder")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptModelError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise CorruptModelError(f"{path} does not hold a JSON object")
    return data


def _shards_from_index(folder: Path, index_name: str) -> List[Path]:
    index = read_json(folder / index_name, "checkpoint")
    weight_map = index.get("weight_map") or {}
    # (a list or a null shard name failed as "AttributeError: 'list' object has no attribute 'values'" or
    # "TypeError: unsupported operand type(s) for /", read as a bug)
    if not isinstance(weight_map, dict):
        bad = f"it is a {type(weight_map).__name__}"
    else:
        bad = next((f"{k!r}: {n!r}" for k, n in weight_map.items()
                    if not isinstance(n, str) or not n or Path(n).name != n), None)
    if bad:
        raise CorruptModelError(f"{folder / index_name} is not a weight index: its weight_map must map each tensor "
                                f"to the file name of a shard in the folder ({bad})")
    names = sorted(set(weight_map.values()))
    if not names:
        raise CorruptModelError(f"{folder / index_name} lists no weight files")
    refuse_missing_shards(folder, [], index_name, names)  # (as load() says it)
    return [folder / n for n in names]


def weight_files(folder: Path) -> Tuple[str, List[Path]]:
    """("safetensors" | "pytorch", shard files) of a Hugging Face checkpoint folder.

    safetensors (the names mlx-lm reads, `model*.safetensors`) win over `pytorch_model*.bin`.
    """
    if (folder / "model.safetensors.index.json").is_file():
        shards = _shards_from_index(folder, "model.safetensors.index.json")
        refuse_mixed_weights(folder, sorted(folder.glob("model*.safetensors")), "model.safetensors",
                             "model.safetensors.index.json", [p.name for p in shards])
        return "safetensors", shards
    files = sorted(folder.glob("model*.safetensors"))
    if files:  # (model-00001-of-00003.safetensors with the others missing was converted as the whole model)
        refuse_missing_shards(folder, files)
        refuse_mixed_weights(folder, files, "model.safetensors")
        return "safetensors", files
    if (folder / "pytorch_model.bin.index.json").is_file():
        return "pytorch", _shards_from_index(folder, "pytorch_model.bin.index.json")
    files = sorted(folder.glob("pytorch_model*.bin"))
    if files:
        refuse_missing_shards(folder, files)
        refuse_mixed_weights(folder, files, "pytorch_model.bin")
        return "pytorch", files
    others = sorted(p.name for p in folder.glob("*.safetensors")) + sorted(p.name for p in folder.glob("*.pt*"))
    hint = f" (found {', '.join(others[:3])})" if others else ""
    raise ModelNotFoundError(
        f"{folder} has no weights: expected model*.safetensors or pytorch_model*.bin{hint}"
    )


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ConversionError(
            "reading .bin/.pt checkpoints needs PyTorch: pip install 'redrafter-mlx[convert]' "
            "(or convert the checkpoint to safetensors)"
        ) from e
    return torch


def _unpickler_said(e: Exception) -> str:
    """What torch's weights-only unpickler met, from its long message ("Unsupported operand 103")."""
    text = str(e)
    return text.split("WeightsUnpickler error:", 1)[-1].strip()


def _names_code(e: Exception) -> bool:
    """Did torch's weights-only unpickler stop at a Python object the file names (a function or
    class: loading it would run code), rather than at bytes that are no pickle at all?"""
    said = _unpickler_said(e)
    return "GLOBAL" in said or "allowlist" in said


def torch_state_dict(path: Path) -> Dict[str, "object"]:
    """Tensors of a `.bin`/`.pt` pickle, loaded with weights_only=True (never runs its code)."""
    refuse_lfs_pointer(path)
    torch = _torch()
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if not _names_code(e):  # torch's weights-only reader says this of any byte it cannot parse too
            said = _unpickler_said(e).splitlines()
            raise CorruptModelError(f"{path} is not a PyTorch checkpoint, or a damaged one "
                                    f"({said[0] if said else type(e).__name__})") from e
        raise ConversionError(
            f"{path} is not a weights-only checkpoint: loading it would run code stored in the file, "
            "which this tool never does (re-save it as a plain state dict or as safetensors)"
        ) from e
    except Exception as e:
        # A cut-off file fails as EOFError, a zip reader's RuntimeError or "[Errno 22] Invalid argument", which
        # read as if the command had been given a bad argument.
        damaged = isinstance(e, (EOFError, RuntimeError)) or (isinstance(e, OSError) and e.errno == errno.EINVAL)
        hint = "a damaged or incomplete file: " if damaged else ""
        raise CorruptModelError(f"cannot read {path}: {hint}{_first_line(e)}") from e
    # Training scripts sometimes wrap the state dict.
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict) and not torch.is_tensor(obj.get(key)):
            obj = obj[key]
            break
    if not isinstance(obj, dict):
        raise CorruptModelError(f"{path} holds a {type(obj).__name__}, not a dictionary of tensors")
    bad = [k for k, v in obj.items() if not torch.is_tensor(v)]
    if bad:
        raise CorruptModelError(f"{path} holds entries that are not tensors: {', '.join(map(str, bad[:5]))}")
    return obj


def torch_to_mx(t) -> mx.array:
    """A CPU torch tensor as an MLX array of the same dtype (bfloat16 included)."""
    torch = _torch()
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return mx.array(t.view(torch.int16).numpy()).view(mx.bfloat16)
    return mx.array(t.numpy())


def load_safetensors(path: Path) -> Dict[str, mx.array]:
    refuse_lfs_pointer(path)
    try:
        return mx.load(str(path))
    except Exception as e:
        raise CorruptModelError(f"cannot read {path}: {_first_line(e)}") from e


def load_tensors(path: Path) -> Dict[str, mx.array]:
    """All tensors of one file (.safetensors, .bin or .pt) as MLX arrays."""
    if path.suffix == ".safetensors":
        return load_safetensors(path)
    return {k: torch_to_mx(v) for k, v in torch_state_dict(path).items()}


def pytorch_to_safetensors(files: List[Path], dest: Path, progress=None) -> List[Path]:
    """Rewrite `.bin` shards as `model-XXXXX-of-YYYYY.safetensors` in dest (what mlx-lm reads).

    `progress(n)` is called once per tensor written.
    """
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for i, f in enumerate(files, 1):
        state = torch_state_dict(f)
        arrays = {}
        for k in list(state):
            arrays[k] = torch_to_mx(state.pop(k))
            if progress:
                progress(1)
        name = dest / (f"model-{i:05d}-of-{len(files):05d}.safetensors" if len(files) > 1 else "model.safetensors")
        mx.save_safetensors(str(name), arrays, metadata={"format": "mlx"})
        out.append(name)
        del arrays, state
    return out
