"""Packaging: what pyproject.toml declares against what the dependencies and the repository hold.

An editable install (the README's commands, CI) runs from the source folders, so a file or package
that pyproject.toml leaves out of the wheel, or a Python version a dependency does not install on, shows
only to a user who runs `pip install .` or installs a built wheel; these tests read the declarations."""

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

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


def package_dirs():
    """{package name: its source folder} as [tool.setuptools] declares them."""
    tool = PYPROJECT["tool"]["setuptools"]
    mapped = tool.get("package-dir", {})
    return {name: REPO / mapped.get(name, name.replace(".", "/")) for name in tool["packages"]}


def repository_files(folder: Path):
    """The files under `folder` that git tracks (every file but caches where git is not there)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", str(folder)], cwd=REPO, capture_output=True, check=True)
        return [REPO / name for name in out.stdout.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def test_every_python_folder_is_a_listed_package():
    # `packages` is an explicit list: a new subpackage left out of it works in the editable install that the
    # README's commands and CI use, and is missing from `pip install .` and the wheel (ImportError there).
    dirs = package_dirs()
    listed = {d.resolve() for d in dirs.values()}
    for init in REPO.glob("*/__init__.py"):  # top-level packages (python -m convert, the chat's app)
        if init.parent.name != "tests":
            assert init.parent.resolve() in listed, f"{init.parent.name}/ is not in [tool.setuptools] packages"
    for folder in dirs.values():
        for sub in folder.rglob("*.py"):
            assert sub.parent.resolve() in listed, (
                f"{sub.parent.relative_to(REPO)} holds Python files but is not in [tool.setuptools] packages")


def test_package_data_covers_every_shipped_file():
    # Data files reach the wheel only through [tool.setuptools.package-data] globs (no MANIFEST.in):
    # a file they miss (a new prompt set, a drafter file, a stylesheet) is there in a checkout and
    # absent from an installed wheel. Each file belongs to the deepest listed package holding it.
    dirs = {name: folder.resolve() for name, folder in package_dirs().items()}
    globs = PYPROJECT["tool"]["setuptools"].get("package-data", {})
    missing = []
    for folder in set(dirs.values()):
        for path in repository_files(folder):
            if path.suffix == ".py":
                continue
            path = path.resolve()
            name, home = max(((n, d) for n, d in dirs.items() if d in path.parents), key=lambda nd: len(nd[1].parts))
            if home != folder:
                continue  # checked with its own package
            if not any(path in set(p.resolve() for p in home.glob(g)) for g in globs.get(name, [])):
                missing.append(f"{path.relative_to(REPO)} (package {name})")
    assert not missing, f"not in [tool.setuptools.package-data], so not in the wheel: {missing}"


def lowest_version(specifier):
    """The least version a SpecifierSet's `>=` clauses allow, or None."""
    floors = [Version(s.version) for s in specifier if s.operator == ">="]
    return max(floors) if floors else None


def test_mlx_floor_is_not_below_mlx_lms():
    # mlx-lm 0.32.2 needs mlx >= 0.32.2, but asks for it on macOS alone (elsewhere through its extras, which we do
    # not use): our `mlx[cpu]>=0.32` let an environment that held mlx 0.32.0 or 0.32.1 keep it under mlx-lm 0.32.2.
    needed = [Requirement(r) for r in metadata.requires("mlx-lm") or []]
    needed = [r for r in needed if r.name == "mlx" and (r.marker is None or r.marker.evaluate({"extra": ""})
                                                        or r.marker.evaluate({"extra": "", "platform_system": "Darwin"}))]
    assert needed, "mlx-lm no longer names mlx: read its metadata again"
    floor = max(lowest_version(r.specifier) for r in needed)
    ours = [Requirement(line) for line in PYPROJECT["project"]["dependencies"]]
    ours = [r for r in ours if r.name == "mlx"]
    assert ours
    for req in ours:
        assert lowest_version(req.specifier) >= floor, f"{req} allows an mlx below mlx-lm's {floor}"
