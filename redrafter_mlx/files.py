"""Files written whole or not at all.

A JSON file the library writes (the cost-model cache, `beam_shape.json`, a bench report, a
training run's state) goes to a hidden temporary file beside it and is then renamed over it:
a reader, or a run stopped mid-write, sees the old file or the new one, never half of one.
"""

import json
import os
import tempfile
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
