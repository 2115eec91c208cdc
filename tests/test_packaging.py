"""Packaging: what pyproject.toml declares against what the dependencies and the repository hold.

An editable install (the README's commands, CI) runs from the source folders, so a file or package
that pyproject.toml leaves out of the wheel, or a Python version a dependency does not install on, shows
only to a user who runs `pip install .` or installs a built wheel; these tests read the declarations."""

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
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


def repository_files(folder: Path, untracked: bool = False):
    """The files under `folder` that git tracks, and with `untracked` those it does not ignore either (every file
    but caches, builds and dot-folders where git is not there)."""
    others = ["--others", "--exclude-standard"] if untracked else []
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", *others, "--", str(folder)], cwd=REPO,
                             capture_output=True, check=True)
        return [REPO / name for name in out.stdout.decode().split("\0") if name and (REPO / name).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = ("__pycache__", "build", "dist")
        return [p for p in folder.rglob("*") if p.is_file() and p.suffix != ".pyc" and not any(
            part in skip or part.startswith(".") or part.endswith(".egg-info") for part in p.relative_to(REPO).parts)]


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


# The Apache License 2.0 as apache.org and GitHub give it (11,357 bytes; apache.org's copy adds a leading blank line).
APACHE_2_SHA256 = "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4"


def test_license_file_is_the_apache_license_pyproject_names():
    # pyproject.toml said `license = "Apache-2.0"` while the repository held no LICENSE: the wheel and the sdist
    # named a license without carrying its text, which the Apache License itself asks redistributions to include.
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"].get("license-files") == ["LICENSE"]
    text = (REPO / "LICENSE").read_bytes()
    assert text.startswith(b"                                 Apache License\n")
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256, "LICENSE is not the unmodified Apache License 2.0"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel) that setuptools builds from a copy of the checkout (git's files, untracked ones included)."""
    need = next(Requirement(r) for r in PYPROJECT["build-system"]["requires"] if Requirement(r).name == "setuptools")
    have = metadata.version("setuptools")
    assert need.specifier.contains(have), (
        f"building needs {need} (pyproject's build-system); this environment has setuptools {have}: "
        "pip install -e '.[test]'")
    root = tmp_path_factory.mktemp("build")
    src, out = root / "src", root / "dist"
    for path in repository_files(REPO, untracked=True):
        dest = src / path.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    # (the output folder is read before setuptools rewrites sys.argv for its commands)
    code = "import sys; out = sys.argv[1]; from setuptools import build_meta as b; b.build_sdist(out); b.build_wheel(out)"
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=src, capture_output=True, text=True)
    assert done.returncode == 0, f"building failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return sdist, wheel


def test_wheel_and_sdist_carry_the_license(built):
    sdist, wheel = built
    license_text = (REPO / "LICENSE").read_bytes()
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        assert f"{info}/licenses/LICENSE" in names, f"the wheel holds no {info}/licenses/LICENSE"
        assert whl.read(f"{info}/licenses/LICENSE") == license_text
        meta = whl.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    assert "License-File: LICENSE" in meta.splitlines()
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        member = tar.extractfile(f"{top}/LICENSE")
        assert member is not None and member.read() == license_text, f"the sdist holds no {top}/LICENSE"


def test_the_wheel_holds_every_package_file_as_the_checkout_has_it(built):
    """The tests above read pyproject.toml's declarations; the wheel built from them went unchecked past its
    LICENSE, so a wheel missing a module or a data file (an exclude-package-data, a package-dir that maps a
    package elsewhere, a build backend's own rule) passed them all. Every file of every listed package, modules
    and data, is in the built wheel at its import path, byte for byte; nothing outside those packages is; and
    every console script names a function its wheel's module defines."""
    import ast
    import configparser

    _, wheel = built
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        held = {n: whl.read(n) for n in names if not n.startswith(f"{info}/")}
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    prefixes = {name: name.replace(".", "/") for name in package_dirs()}
    want = {}
    for name, folder in package_dirs().items():
        for path in repository_files(folder):
            want[f"{prefixes[name]}/{path.relative_to(folder).as_posix()}"] = path.read_bytes()
    assert any(n.endswith(".tcss") for n in want) and any(n.endswith(".jsonl") for n in want)  # data files too
    missing = sorted(n for n in want if n not in held)
    assert missing == [], f"in the checkout's packages, not in the wheel: {missing}"
    changed = sorted(n for n in want if held[n] != want[n])
    assert changed == [], f"in the wheel with other content than the checkout's: {changed}"
    outside = sorted(n for n in held if not any(n.startswith(p + "/") for p in prefixes.values()))
    assert outside == [], f"in the wheel, outside the listed packages: {outside}"
    scripts = configparser.ConfigParser()
    scripts.read_string(entry_points)
    assert dict(scripts["console_scripts"]) == PYPROJECT["project"]["scripts"]
    for target in PYPROJECT["project"]["scripts"].values():
        module, function = target.split(":")
        source = held[module.replace(".", "/") + ".py"]
        defined = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
        assert function in defined, f"{target}: the wheel's {module} defines no {function}()"


def test_the_sdist_holds_every_package_file_as_the_checkout_has_it(built):
    """`pip install redrafter-mlx-X.tar.gz` builds its wheel from the sdist, whose files were left unchecked past
    its LICENSE: every file of every listed package, and pyproject.toml, is in it at its repository path, byte
    for byte."""
    sdist, _ = built
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        held = {m.name[len(top) + 1:]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    want = {path.relative_to(REPO).as_posix(): path.read_bytes()
            for folder in package_dirs().values() for path in repository_files(folder)}
    want["pyproject.toml"] = (REPO / "pyproject.toml").read_bytes()
    missing = sorted(n for n in want if n not in held)
    assert missing == [], f"in the checkout's packages, not in the sdist: {missing}"
    changed = sorted(n for n in want if held[n] != want[n])
    assert changed == [], f"in the sdist with other content than the checkout's: {changed}"
