"""Packaging: what pyproject.toml declares against what the dependencies and the repository hold.

An editable install (the README's commands, CI) runs from the source folders, so a file or package
that pyproject.toml leaves out of the wheel, or a Python version no dependency installs on, shows
only to a user who runs `pip install .` or installs a built wheel; these tests read the declarations."""

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def lowest_python(spec: str):
    """(major, minor) of the `>=X.Y` bound in a Requires-Python specifier, or None."""
    m = re.search(r">=\s*(\d+)\.(\d+)", spec or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def test_requires_python_is_not_below_any_dependency():
    # requires-python = ">=3.10" while mlx-lm 0.32 needs 3.11: on Python 3.10, `pip install -e .` failed with
    # "No matching distribution found for mlx-lm<0.33,>=0.32.2" instead of naming the Python version.
    ours = lowest_python(PYPROJECT["project"]["requires-python"])
    assert ours is not None
    for line in PYPROJECT["project"]["dependencies"]:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue  # not installed on this platform
        theirs = lowest_python(metadata.metadata(req.name).get("Requires-Python"))
        if theirs is not None:
            assert ours >= theirs, f"{req.name} needs Python >= {theirs}, pyproject.toml says {ours}"
