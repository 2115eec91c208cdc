"""Files written whole or not at all.

A JSON file the library writes (the cost-model cache, `beam_shape.json`, a bench report, a
training run's state) goes to a hidden temporary file beside it and is then renamed over it:
a reader, or a run stopped mid-write, sees the old file or the new one, never half of one.
A folder (a drafter, a converted model) is written into a staging folder beside its place
(`staging_folder`) and then put in place by `replace_folder`.
"""

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional


def write_json(path: Path, data: Any, indent: Optional[int] = 1) -> Path:
    """Replace `path` with `data` as JSON, atomically (a temp file in the same folder, then
    `os.replace`). On any failure the old file is left as it was and the temp file removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=indent))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def unwritable_ancestor(target: Path) -> Optional[Path]:
    """The nearest existing path above `target` when it is not a folder that can be written (so
    `target` cannot be made), else None: checked before long work whose result would go there."""
    above = next((p for p in Path(target).parents if p.exists()), None)
    if above is not None and (not above.is_dir() or not os.access(above, os.W_OK)):
        return above
    return None


def staging_folder(target: Path, tag: str = "") -> Path:
    """A hidden folder beside `target` to write into and then rename to it, with the permissions a
    folder made by `mkdir` would have (`tempfile.mkdtemp` makes it private to its owner, which the
    renamed result would keep: a model or drafter no one else could read)."""
    target = Path(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{tag}", dir=target.parent))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o777 & ~mask)
    return tmp


@contextlib.contextmanager
def signals_held():
    """Hold Ctrl-C (SIGINT) and SIGTERM until the block ends, then deliver them to the handlers
    in place before it: a few renames that must all happen or none. Only the main thread
    receives signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    # (a handler installed outside Python reads as None and cannot be put back: left alone)
    before = {s: h for s in (signal.SIGINT, signal.SIGTERM) if (h := signal.getsignal(s)) is not None}
    for s in before:
        signal.signal(s, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)


def replace_folder(new: Path, target: Path) -> Path:
    """Rename the finished folder `new` (beside `target`, e.g. from `staging_folder`) to `target`,
    replacing what is there. That takes two renames, the old folder aside and the new one in:
    Ctrl-C or SIGTERM is held until both are done and the old folder is deleted (between the
    renames it left no folder in place), and a failing second rename puts the old folder back."""
    new, target = Path(new), Path(target)
    with signals_held():
        if not (target.exists() or target.is_symlink()):
            os.rename(new, target)
            return target
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, aside / "old")
        try:
            os.rename(new, target)
        except BaseException:
            os.rename(aside / "old", target)
            raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
    return target
