"""The output folder: written whole or not at all, with a manifest of what went in.

`OutputFolder` stages everything in a hidden temporary folder beside the target (same
filesystem, so the final step is a rename). On success the staging folder is renamed to the
target (with `force`, an existing target is moved aside first and removed after); on any
failure, Ctrl-C, SIGTERM or SIGHUP it is deleted. Either way no half-written model is ever left
where a loader would find it.

The manifest (`manifest.json`) records the sources, the sha256 of every input file, the
dtype, the quantization and the versions of the tools that wrote the folder.
"""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

from redrafter_mlx.errors import RedrafterError
from redrafter_mlx.files import CONVERTER, replace_folder, signals_held, staging_folder, unwritable_ancestor, utc_now

MANIFEST = "manifest.json"


class ConversionError(RedrafterError):
    """A conversion that cannot go on (bad arguments, an existing output, ...)."""


class CancelledAfterWriting(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP came while the finished folder was renamed into place: it was held until
    the renames were done, so the output is whole."""

    def __init__(self, target: Path, signal_name: str):
        super().__init__(f"{signal_name} after {target} was written")
        self.target, self.signal_name = target, signal_name


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def _replaceable(folder: Path) -> bool:
    """May `--force` delete `folder`: empty, or a model or drafter folder (what this converter, mlx-lm or a
    training run writes: config.json or the manifest at the top) that is not a repository's root?"""
    try:
        names = {p.name for p in folder.iterdir()}
    except OSError:  # unreadable: not one to delete either
        return False
    return not names or (bool(names & {MANIFEST, "config.json"}) and ".git" not in names)


class OutputFolder:
    """Context manager: `with OutputFolder(target, force) as tmp: write into tmp`."""

    def __init__(self, target, force: bool = False):
        # absolute, so "." or ".." name a folder that can be renamed (and the staging folder a name)
        self.path = Path(os.path.abspath(Path(target).expanduser()))  # as given: where loaders will find it
        self.target = self.path  # where it is written
        if self.path.is_symlink():
            # A link is followed, as `cp` or a shell's `>` would: the model goes where the link points (the disk it
            # was made to put it on) and the link stays. It replaced the link itself: the model landed beside the
            # link, and the folder it pointed to kept the old model.
            self.target = Path(os.path.realpath(self.path))
            if self.target.is_symlink():
                raise ConversionError(f"output {self.path} is a symbolic link that leads to itself (a loop)")
        self.force = force
        self.tmp: Optional[Path] = None
        self.made: List[Path] = []  # the folders above the target this run created (removed on failure)
        self.then: List[Callable[[], None]] = []  # run as the output is put in place, with signals held
        self._installed: List[int] = []  # the signals this folder turned into exceptions
        if self.target.exists() or self.target.is_symlink():
            if not self.target.is_dir():
                raise ConversionError(f"output {self.shown} exists and is not a folder")
            if not force:
                raise ConversionError(f"output folder {self.shown} already exists (use --force to replace it)")
            if _inside(Path.cwd(), self.target):
                raise ConversionError(f"--force would delete the folder you are in ({self.target}): "
                                      "choose another output folder")
        above = unwritable_ancestor(self.target)  # checked before any long work
        if above is not None:
            raise ConversionError(f"cannot create the output folder {self.shown}: {above} is not a folder you can "
                                  "write")

    @property
    def shown(self) -> str:
        """The output as the user named it, and where it is written when that differs (a link)."""
        return str(self.path) if self.target == self.path else f"{self.path} (a link to {self.target})"

    def protect(self, source: Path):
        """Refuse an output that replacing would delete `source` with."""
        if self.target.exists() and _inside(Path(source), self.target):
            raise ConversionError(f"--force would delete the input {source}: choose another output folder")

    def keep_drafter(self, replaced: bool = False):
        """Refuse to replace a model folder with one without a drafter, when the old one has one (`replaced`: a
        --drafter is given to replace it): `--force` deleted MODEL/drafter with the rest, a drafter redrafter-train
        had spent hours on included, without a word. Likewise MODEL/drafter.previous, the drafter redrafter-train
        keeps when it installs a new one, whatever --drafter says."""
        if not self.force:
            return
        old = self.target / "drafter"
        if not replaced and (old / "config.json").is_file():
            raise ConversionError(f"--force would delete the drafter in {old} with the folder, and no --drafter is "
                                  f"given: to keep it, move it out of {self.shown} and give it as --drafter; to drop "
                                  "it, remove it first")
        kept = self.target / "drafter.previous"
        if (kept / "config.json").is_file():
            raise ConversionError(f"--force would delete the earlier drafter redrafter-train kept in {kept} with the "
                                  f"folder: to keep it, move it out of {self.shown}; to drop it, remove it first")

    def _check_replaceable(self):
        if self.target.is_dir() and not _replaceable(self.target):
            # `--out src --force` deleted a source tree whole (a typo away from the intended folder)
            raise ConversionError(f"--force replaces only a model or drafter folder (one holding {MANIFEST} or "
                                  f"config.json), and {self.shown} is not one: remove it yourself or choose "
                                  "another output folder")

    def __enter__(self) -> Path:
        self._check_replaceable()  # (after protect(): an input's message first)
        try:
            missing = [a for a in self.target.parents if not a.exists()]
            self.target.parent.mkdir(parents=True, exist_ok=True)
            self.made = missing  # deepest first
            self.tmp = staging_folder(self.target, "partial-")
        except OSError as e:  # the constructor checked the folder above; what is left: /proc, a full disk, a race
            raise ConversionError(f"cannot create the output folder {self.shown}: {e.strerror or e}") from e
        if threading.current_thread() is threading.main_thread():
            # Turn SIGTERM and SIGHUP into an exception so the staging folder is cleaned up: a closed terminal or a
            # dropped ssh session (SIGHUP) killed the process and left a hidden, half-written model (gigabytes).
            for s in STOPPING:
                if signal.getsignal(s) == signal.SIG_DFL:
                    signal.signal(s, _raise_on_signal)
                    self._installed.append(s)
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                self._commit()
        finally:
            try:
                # (signals held: a second Ctrl-C or SIGTERM, pressed as the first seemed to do nothing, stopped the
                # deletion and left a hidden, half-deleted model; it is delivered once the folder is gone)
                if self.tmp is not None and self.tmp.exists():
                    with signals_held():
                        shutil.rmtree(self.tmp, ignore_errors=True)
                        for folder in self.made:  # what mkdir made above the target, if nothing else is in it
                            try:
                                folder.rmdir()
                            except OSError:
                                break
            finally:
                for s in self._installed:
                    signal.signal(s, signal.SIG_DFL)
                self._installed = []
        return False

    def _commit(self):
        # The target may have appeared during the work (another conversion, a folder made by hand): it was
        # replaced and deleted whatever it held, without --force or a --force check of what it is.
        if self.target.exists() or self.target.is_symlink():
            if not self.force or not self.target.is_dir():
                hint = "" if self.force else " (use --force to replace it)"
                raise ConversionError(f"output {self.shown} appeared while converting (another conversion to it?): "
                                      f"it was left as it is{hint}")
            self._check_replaceable()
        try:
            with signals_held():  # (a file outside the output that describes it changes with it)
                replace_folder(self.tmp, self.target)
                for step in self.then:
                    step()
        except KeyboardInterrupt as e:  # a signal held through the renames, delivered after them
            if self.tmp.exists():
                raise
            self.tmp = None
            raise CancelledAfterWriting(self.target, signal_name(e)) from e
        self.tmp = None


# Signals that stop a conversion (besides Ctrl-C), raised as KeyboardInterrupt(their name) while it writes
STOPPING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _raise_on_signal(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def signals_stop():
    """SIGTERM and SIGHUP raised as KeyboardInterrupt(their name) inside the block, where they are at their defaults
    (in the main thread): from a conversion's start, where the output folder's handlers are not installed yet (a
    signal as the model was read or fetched ended the process saying nothing)."""
    installed = []
    if threading.current_thread() is threading.main_thread():
        for s in STOPPING:
            if signal.getsignal(s) == signal.SIG_DFL:
                signal.signal(s, _raise_on_signal)
                installed.append(s)
    try:
        yield
    finally:
        for s in installed:
            signal.signal(s, signal.SIG_DFL)


def signal_name(e: KeyboardInterrupt) -> str:
    """"SIGTERM" or "SIGHUP" for what _raise_on_signal raised, else "Ctrl-C"."""
    return e.args[0] if len(e.args) == 1 and e.args[0] in {s.name for s in STOPPING} else "Ctrl-C"


def exit_code(name: str) -> int:
    """128 + the number of the signal `signal_name` gave, as a shell reports a process it stopped."""
    return 128 + (signal.SIGINT if name == "Ctrl-C" else getattr(signal, name))


def sha256_of(path: Path, chunk: int = 1 << 20, progress: Optional[Callable[[int], Any]] = None) -> str:
    """`progress(n)` is called with the bytes read, block by block."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            if progress:
                progress(len(block))
    return h.hexdigest()


def describe_inputs(files: Iterable[Path], root: Optional[Path] = None,
                    progress: Optional[Callable[[int], Any]] = None) -> Dict[str, str]:
    """{file name (relative to root): sha256} for the files a conversion read."""
    out = {}
    for f in sorted(set(Path(p) for p in files)):
        name = str(f.relative_to(root)) if root is not None and _inside(f, root) else f.name
        out[name] = sha256_of(f, progress=progress)
    return out


def tool_versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("redrafter-mlx", "mlx", "mlx-lm", "transformers", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


TOOL = CONVERTER


def write_manifest(folder: Path, base: Optional[Dict[str, Any]], drafter: Optional[Dict[str, Any]], **extra):
    manifest = {
        "tool": TOOL,
        "versions": tool_versions(),
        "created": utc_now(),
        "base": base,
        "drafter": drafter,
    }
    manifest.update(extra)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
