"""Per-device default beam shape: what `redrafter-bench --tune` measured, read back by `load()`.

The fastest beam shape depends on the machine (Apple found 1-3 beams best on M1 Max / M2 Ultra
and 50+ on an H100), so it is stored per device in a small JSON file:

    {"cpu (x86_64, OpenBLAS)": {"beam_width": 4, "beam_length": 6, "tree": 16, "lookup": 8,
                                "tree_min_prob": 0.2, "tokens_per_second": ..., ...}}

`tree` > 0: draft a dynamic tree of that many nodes, W wide and L - 1 deep (tree_search.py),
dropping nodes whose path probability is below `tree_min_prob`; `lookup`: the context-lookup
beam's length (lookup.py). `drafting()` is the one rule for which of these a call uses.

Lookup order: `beam_shape.json` in the model folder (the GGUF file's folder for a single file:
written by --tune on this machine), then the one shipped in the drafter folder, then
DEFAULT_SHAPE. A shape stored for another device is not used.

--tune stores its entry under `device_keys()[0]`: the machine as the cost curve keys it
(`costs.machine_key`: on a CPU its model and the cores this process may use, since a model folder
can be shared with another machine), the weight format (stored 4-bit weights cost ~k times one
token to verify k on a CPU, where float weights cost ~2x) and the model it measured
(`model_label`: a GGUF file's name, or the folder's safetensors weights), since one folder can hold
several models (GGUF files of two quantizations, a GGUF beside safetensors) and each has its own
entry. An entry under the machine and format alone (one --tune wrote before it named the model),
else under the device's description alone (a shipped drafter's, or an older --tune's), is read
where no entry for the exact machine, format and model is stored.

A shape is measured with one drafter: --tune stores the drafter's digest (`drafter_digest`) with
its entry and in its key, so a tune with another drafter (`--tune --drafter PATH`) keeps this
one's entry. Where this model was tuned here with other drafters only (the one redrafter-train or
the converter has since put in MODEL/drafter replaced the one tuned), or an older entry names
another drafter's digest, none is used, with a note: the drafter's own file, else the defaults,
apply until --tune runs again. An entry without a digest in the drafter's own folder (a
shipped drafter's) is that drafter's. One in the model folder (a hand-written one, or one --tune
wrote before digests were stored) is used only where it can be told to be this drafter's
(`untraced`): the drafter it names, where it names one still there, is this one, else this
one is the drafter installed for the model (loader.find_drafter); and this drafter's files
are no newer than the entry's measured_at (a drafter put in its place since is another).
"""

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from ._platform import device_description
from .costs import drafter_digest, machine_key
from .errors import one_line
from .files import update_json
from .tree_search import DEFAULT_MIN_PROB

DEFAULT_SHAPE = (4, 4)  # (beam width W, beam length L counting the base model's token)
DEFAULT_LOOKUP = 8  # tokens of the context-lookup beam (lookup.py) added to the drafter's; 0 = none
DEFAULT_TREE = 0  # draft nodes of a dynamic tree (tree_search.py) instead of W x L beams; 0 = beams
FILE = "beam_shape.json"


def parse_shapes(text: str) -> List[Tuple[int, int]]:
    """'4x5,8x5' -> [(4, 5), (8, 5)] (beam width x beam length); an argparse `type=`, so a
    bad value stops the command at once with a message that says what is wrong."""
    shapes = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            w, n = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a beam shape is WxL, e.g. 4x3, not {part!r}") from None
        if w < 1 or n < 1:
            raise argparse.ArgumentTypeError(f"beam width and length must be >= 1, not {part!r}")
        shapes.append((w, n))
    if not shapes:
        raise argparse.ArgumentTypeError(f"no beam shape in {text!r}: give WxL, e.g. 4x3")
    return list(dict.fromkeys(shapes))  # each once: a list runs (or evaluates) each shape


def model_folder(path: Path) -> Path:
    path = Path(path)
    return path if path.is_dir() else path.parent


class Tuned(NamedTuple):
    """What `redrafter-bench --tune` stored for a device (lookup / tree_min_prob None: not stored)."""

    beam_width: int
    beam_length: int
    tree: int = 0
    lookup: Optional[int] = None
    tree_min_prob: Optional[float] = None


def model_label(path: Optional[Path]) -> str:
    """Which model of its folder an entry is for: a GGUF file's name, or "safetensors" for a model
    folder's own weights (a folder can hold both, and GGUF files of several quantizations)."""
    path = Path(path) if path is not None else None
    return path.name if path is not None and path.is_file() else "safetensors"


def device_keys(weight_format: Optional[str] = None, model: Optional[Path] = None,
                drafter: Optional[str] = None) -> List[str]:
    """The keys an entry for this device is read under, the first the one --tune writes: the
    machine (costs.machine_key) and, where known, the weight format, the model (model_label) and
    the drafter's digest (drafter_digest); then the machine and format alone (--tune's before it
    named the model and the drafter); then the device's description alone (the shipped drafters'
    entries, and --tune's before it named the machine)."""
    machine = machine_key() + (f" | {weight_format}" if weight_format else "")
    keys = [f"{machine} | {model_label(model)}" + (f" | drafter {drafter}" if drafter else "")] if model is not None \
        else []
    return [*keys, machine, device_description()]


def _same_folder(a, b) -> bool:
    return a is not None and b is not None and Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def untraced(entry: Dict[str, Any], drafter_path: Optional[Path], own_drafter: Optional[Path]) -> Optional[str]:
    """Why an entry without a drafter digest cannot be told to be the drafter at `drafter_path`'s
    (a few words for a note), or None where it can: the drafter it names (an absolute path, still
    there) is this one, or it names none still there and this one is `own_drafter`, the drafter
    installed for the model; and this drafter's files are no newer than its measured_at."""
    named = entry.get("drafter")
    named = Path(named) if isinstance(named, str) and Path(named).is_absolute() else None
    if named is not None and (named / "config.json").is_file():
        if not _same_folder(named, drafter_path):
            return f"with another drafter (the one at {named})"
    elif not _same_folder(drafter_path, own_drafter):
        return f"with no record of its drafter, and {drafter_path} is not the drafter installed for this model"
    try:
        then = time.mktime(time.strptime(str(entry["measured_at"]), "%Y-%m-%d %H:%M:%S"))
        written = max((Path(drafter_path) / f).stat().st_mtime for f in ("config.json", "model.safetensors"))
    except (KeyError, ValueError, OverflowError, OSError):
        return None  # (no time stored: a hand-written entry)
    if written > then + 1.0:  # (measured_at is to the second)
        return f"before the drafter at {drafter_path} was written (it has no record of its drafter's digest)"
    return None


def read_tuned(folder: Optional[Path], device: Optional[str] = None, weight_format: Optional[str] = None,
               drafter: Optional[str] = None, note: Optional[Callable[[str], None]] = None,
               model: Optional[Path] = None,
               untraced_why: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None) -> Optional[Tuned]:
    """The Tuned entry stored for `device` (default: this one, under the first of
    device_keys(weight_format, model, drafter) the file holds) in folder/beam_shape.json, or None;
    tree is 0 (beams) when not stored.
    `drafter`: the digest of the drafter it is for (drafter_digest); an entry measured with
    another one, or none where the model was tuned here with other drafters only, is None, said to
    `note`. `untraced_why`: for an entry without a digest, why it
    cannot be taken for this drafter's (see `untraced`), None where it can; the entry is then None,
    said to `note`."""
    if folder is None or not (Path(folder) / FILE).is_file():
        return None
    path = Path(folder) / FILE
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object of entries")
        keys = [device] if device else device_keys(weight_format, model, drafter)
        found = next((k for k in keys if k in data), None)
        entry = data[found] if found is not None else None
        why = None
        # This model tuned here with other drafters only (each has an entry of its own): an older entry (one
        # keyed by the machine alone) is not this drafter's either.
        mine = keys[0] if not device and model is not None and drafter else None
        others = [v for k, v in data.items() if mine and k != mine and isinstance(v, dict)
                  and k.startswith(mine.rsplit(" | drafter ", 1)[0] + " | drafter ")]
        if mine and found != mine and others:
            then = others[-1].get("drafter")
            why = "with another drafter" + (f" (the one then at {then})" if then else "")
        elif entry and drafter is not None and "drafter_digest" in entry and entry["drafter_digest"] != drafter:
            why = f"with another drafter (the one then at {entry['drafter']})" if entry.get("drafter") \
                else "with no drafter"
        elif entry and "drafter_digest" not in entry and untraced_why is not None:
            why = untraced_why(entry)
        if why:
            if note:
                note(f"the beam shape in {path} was tuned for this device {why}: not used; run "
                     "redrafter-bench --tune again to tune it for this drafter")
            return None
        if entry:
            w, n, tree = int(entry["beam_width"]), int(entry["beam_length"]), int(entry.get("tree") or 0)
            lookup = entry.get("lookup")
            lookup = int(lookup) if lookup is not None and int(lookup) >= 0 else None
            p = entry.get("tree_min_prob")
            p = float(p) if p is not None and 0.0 < float(p) <= 1.0 else None
            # more than generate drafts: every fixed-drafting call failed, naming a shape or tree never given
            from .generate import MAX_DRAFT_TOKENS  # (generate imports this module)

            drafts = {f"{w} x {n} beams": w * (n - 1), f"a tree of {tree} nodes": tree, f"lookup {lookup}": lookup or 0}
            too_big = next((what for what, size in drafts.items() if size > MAX_DRAFT_TOKENS), None)
            if too_big:
                raise ValueError(f"{too_big}: drafts are limited to {MAX_DRAFT_TOKENS} tokens a step")
            if w >= 1 and n >= 1 and tree >= 0:
                return Tuned(w, n, tree, lookup, p)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        # a damaged or unreadable file means "not tuned", never a failed load (a file the user cannot read
        # failed every load of the model with PermissionError); said, as a hand-edited file gone wrong is
        if note:
            what = f"KeyError: {e}" if isinstance(e, KeyError) else one_line(e)
            note(f"cannot read the beam shape in {path} ({what}): not used; run redrafter-bench --tune again to "
                 "store it anew")
    return None


def read_beam_shape(folder: Optional[Path], device: Optional[str] = None) -> Optional[Tuple[int, int]]:
    """The (W, L) stored for `device` (default: this one) in folder/beam_shape.json, or None."""
    tuned = read_tuned(folder, device)
    return tuned[:2] if tuned else None


def find_tuned(model_path: Path, drafter_path: Optional[Path], weight_format: Optional[str] = None,
               note: Optional[Callable[[str], None]] = None, own_drafter: Optional[Path] = None) -> Optional[Tuned]:
    """The Tuned entry for this device (and weight format) measured with this drafter: the model
    folder's file first, then the drafter's. own_drafter: the drafter installed for (or shipped
    with) the model, None where it has none (an entry in the model folder that records no digest
    is taken for that one's only: `untraced`)."""
    digest = drafter_digest(drafter_path)
    return (read_tuned(model_folder(model_path), weight_format=weight_format, drafter=digest, note=note,
                       model=model_path, untraced_why=lambda entry: untraced(entry, drafter_path, own_drafter))
            or read_tuned(drafter_path, weight_format=weight_format, drafter=digest, note=note))


class Drafting(NamedTuple):
    """How a redrafter call drafts: W beams of L tokens (or a tree of `tree` nodes, W wide and
    L - 1 deep, above `tree_min_prob`), plus a context-lookup beam of `lookup` tokens."""

    beam_width: int
    beam_length: int
    tree: int
    lookup: int
    tree_min_prob: float


def fixed_drafting(*settings) -> bool:
    """The one rule for adaptive vs fixed drafting: any drafting setting given (beam width or
    length, tree, lookup, tree_min_prob, draft top-k: not None) fixes the drafting; with none,
    modes auto and redrafter are adaptive (control.py)."""
    return any(v is not None for v in settings)


def drafting(loaded, beam_width: Optional[int] = None, beam_length: Optional[int] = None, tree: Optional[int] = None,
             lookup: Optional[int] = None, tree_min_prob: Optional[float] = None) -> Drafting:
    """The one rule for what a call leaves as None, shared by generate, the bench and the app:
    W and L: the tuned shape (`loaded.beam_shape`), else DEFAULT_SHAPE; tree: the budget tuned
    with the shape when the shape is the tuned one too (neither W nor L given), else
    DEFAULT_TREE; lookup and tree_min_prob: the tuned values, else DEFAULT_LOOKUP and
    tree_search.DEFAULT_MIN_PROB. A tuned L = 1 (plain decoding was fastest here) names no shape
    to draft with: a call that asks for the drafter (W or a tree given, L not) takes DEFAULT_SHAPE's
    (it decoded plainly, saying nothing)."""
    shape = getattr(loaded, "beam_shape", None) or DEFAULT_SHAPE
    if shape[1] == 1 and beam_length is None and (beam_width is not None or (tree or 0) > 0):
        shape = DEFAULT_SHAPE
    tuned_tree = getattr(loaded, "tree", None) if beam_width is None and beam_length is None else None
    tuned_lookup, tuned_p = getattr(loaded, "lookup", None), getattr(loaded, "tree_min_prob", None)
    return Drafting(
        shape[0] if beam_width is None else beam_width,
        shape[1] if beam_length is None else beam_length,
        tree if tree is not None else DEFAULT_TREE if tuned_tree is None else tuned_tree,
        lookup if lookup is not None else DEFAULT_LOOKUP if tuned_lookup is None else tuned_lookup,
        tree_min_prob if tree_min_prob is not None else DEFAULT_MIN_PROB if tuned_p is None else tuned_p,
    )


def save_beam_shape(loaded, width: int, length: int, measured: Dict[str, Any], tree: int = 0,
                    lookup: int = DEFAULT_LOOKUP, tree_min_prob: float = DEFAULT_MIN_PROB,
                    note: Optional[Callable[[str], None]] = None) -> Path:
    """Store (width, length), the dynamic-tree node budget (0: beams), the lookup length and the
    tree's probability floor for this machine, weight format, model file and drafter (device_keys()[0])
    in the model folder, keeping other entries (another model's in the same folder, or this one's
    with another drafter, among them).
    The file is replaced atomically (a damaged one kept beside it, and `note` told), and `loaded` adopts
    the values. Returns its path."""
    path = model_folder(loaded.path) / FILE
    entry = {
        "beam_width": int(width),
        "beam_length": int(length),
        "tree": int(tree),
        "lookup": int(lookup),
        "tree_min_prob": float(tree_min_prob),
        "drafter": str(loaded.drafter_path) if loaded.drafter_path else None,
        "drafter_digest": drafter_digest(loaded.drafter_path),  # (read_tuned: not used with another drafter)
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        **measured,
    }
    key = device_keys(getattr(loaded, "weight_format", None), Path(loaded.path), entry["drafter_digest"])[0]
    update_json(path, lambda data: {**data, key: entry}, note=note)
    loaded.beam_shape = (int(width), int(length))
    loaded.tree, loaded.lookup, loaded.tree_min_prob = int(tree), int(lookup), float(tree_min_prob)
    return path
