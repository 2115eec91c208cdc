"""Files written whole or not at all.

A JSON file the library writes (the cost-model cache, `beam_shape.json`, a bench report, a
training run's state) goes to a hidden temporary file beside it and is then renamed over it:
a reader, or a run stopped mid-write, sees the old file or the new one, never half of one.
A folder (a drafter, a converted model) is written into a staging folder beside its place
(`staging_folder`) and then put in place by `replace_folder`. Those hidden folders carry the host
and process that made them, so what a process killed beyond Python's reach (SIGKILL, the OOM
killer, a power cut) left beside a folder is cleared the next time it is written or looked for
(`tidy`): a half-written staging folder is deleted, and an old folder set aside by
`replace_folder` goes back in place if nothing replaced it.

A JSON file several processes add entries to (the cost-model cache, `beam_shape.json`) is
changed by `update_json`, which holds a lock on its folder from reading it to replacing it: two
processes that each read the file, added their entry and wrote it back kept only one of the
entries. One found damaged is renamed aside (NAME.damaged) before a new one is written.

A model folder the converter wrote (`python -m convert`) describes its drafter in its manifest.json:
whatever puts another drafter into MODEL/drafter (the converter, redrafter-train) makes that entry
name it (`model_manifest_of`, `record_drafter`).

A text file the user names (a prompt file, a bench report to replay, a chat template) is read by
`read_text_file`, which says a missing, folder, unreadable or not-UTF-8 path one way in every tool.
"""

import contextlib
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

try:
    import fcntl
except ImportError:  # (Windows: no advisory locks; writes stay atomic, a concurrent update can lose an entry)
    fcntl = None

from .errors import CorruptModelError, RedrafterError, json_kind, one_line


def write_json(path: Path, data: Any, indent: Optional[int] = 1) -> Path:
    """Replace `path` with `data` as JSON, atomically (a temp file in the same folder, then
    `os.replace`). On any failure the old file is left as it was and the temp file removed. The
    temp file carries the host and process (`.NAME.@HOST-PID-tmp`), so one a killed process left
    (SIGKILL, the OOM killer: it was never cleared, one more each time) is cleared by the next
    write of the file (`tidy`). A symbolic link is written through: its target is replaced and the
    link kept (a cache file linked to a shared one was replaced by a file of its own, the link lost).
    The file keeps its permissions (the new one had the umask's: a file kept private was made
    readable by all, or a shared one private to the last writer)."""
    path = Path(path)
    real = _through_link(path)
    tidy(real)
    tmp = real.with_name(f".{real.name}.{_owner()}tmp")  # (beside the file renamed over: on its file system)
    try:
        tmp.write_text(json.dumps(data, indent=indent))
        with contextlib.suppress(FileNotFoundError):  # (a new file: the umask's)
            os.chmod(tmp, os.stat(real).st_mode & 0o7777)
        os.replace(tmp, real)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _through_link(path: Path) -> Path:
    """The file a symbolic link `path` names (the one to replace), else `path`."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


_held = threading.local()  # .folders: the (device, inode) of the folders this thread holds with folder_lock


@contextlib.contextmanager
def folder_lock(folder: Path, busy: Optional[str] = None):
    """An exclusive advisory lock (flock) on `folder` for the block, released when the block or its
    process ends: processes that update a file in it take turns. With `busy`, the folder is held for
    one long run instead of waited for: another process holding it is a RedrafterError saying `busy`
    (a second run at once in the same folder, the same command from another terminal, had worked side
    by side, writing its shards and checkpoints over the first one's). Where the folder cannot be
    locked (no flock, a file system without it) the block runs unlocked. Without `busy`, a thread that
    holds the folder already goes on (flock does not know it: `redrafter-train --work` in a model folder,
    held for the run, waited forever on itself to cache the cost curve there); with it, a second run is a
    second run, refused in the same thread too."""
    try:
        st = os.stat(folder)
        key = (st.st_dev, st.st_ino)
    except OSError:
        key = None
    held = getattr(_held, "folders", None)
    if held is None:
        held = _held.folders = set()
    if busy is None and key is not None and key in held:
        yield
        return
    fd = None
    if fcntl is not None:
        try:
            fd = os.open(folder, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if busy is not None else 0))
        except OSError as e:
            if fd is not None:
                os.close(fd)
            fd = None
            if busy is not None and isinstance(e, BlockingIOError):
                raise RedrafterError(busy) from None
    mine = fd is not None and key is not None
    if mine:
        held.add(key)
    try:
        yield
    finally:
        if mine:
            held.discard(key)
        if fd is not None:
            os.close(fd)  # (closing the descriptor releases the lock)


def one_run_in(folder: Path, busy: str):
    """Hold `folder` for one long run: `folder_lock` with `busy` as the error where another holds it."""
    return folder_lock(folder, busy)


def update_json(path: Path, change: Callable[[Dict[str, Any]], Dict[str, Any]], indent: Optional[int] = 1,
                note: Optional[Callable[[str], None]] = None) -> Path:
    """Replace the JSON object in `path` with change(it) ({} where the file is missing), under a lock
    on its folder from the read to the atomic replace, so that entries other processes add meanwhile
    are kept. A file there that cannot be read, is not JSON or not an object is renamed aside first
    (`set_aside`) and `note` told where (it had been replaced, and every entry a repair could have
    saved lost, saying nothing). Makes the folder; raises OSError where it cannot be written. A
    symbolic link is updated through (`write_json`): the lock is on its target's folder, and a
    damaged target is what is set aside."""
    given = path = Path(path)
    path = _through_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(path.parent):
        data, why = {}, None
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(data, dict):
                    why = f"expected a JSON object, found {json_kind(data)}"
            except ValueError as e:  # not JSON, or not UTF-8
                why = f"not valid JSON: {one_line(e)}"
            except OSError as e:  # (one its owner alone can read)
                why = f"cannot be read: {e.strerror or one_line(e)}"
        if why is not None:
            aside = set_aside(path)
            if note:
                note(f"{path} was damaged ({why}): kept as {aside.name} beside it, and a new one written")
            data = {}
        write_json(path, change(data), indent=indent)
    return given


def set_aside(path: Path) -> Path:
    """Rename `path` to the first free NAME.damaged, NAME.damaged-2, ... beside it; returns the new path."""
    n = 1
    while True:
        aside = path.with_name(f"{path.name}.damaged" + (f"-{n}" if n > 1 else ""))
        if not (aside.exists() or aside.is_symlink()):
            os.rename(path, aside)
            return aside
        n += 1


CONVERTER = "python -m convert"  # the "tool" of the manifest.json the converter writes in a model folder


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def model_manifest_of(drafter_folder: Path) -> Optional[Path]:
    """The manifest of the model folder `drafter_folder` is the drafter of (`MODEL/drafter`, where
    redrafter_mlx.load looks), when the converter wrote that model; else None."""
    path = Path(drafter_folder).parent / "manifest.json"
    if Path(drafter_folder).name != "drafter" or not (path.parent / "config.json").is_file():
        return None
    try:
        return path if json.loads(path.read_text()).get("tool") == CONVERTER else None
    except (OSError, ValueError, AttributeError):  # none, unreadable, or not an object: not ours to change
        return None


def record_drafter(manifest: Path, drafter: Dict[str, Any]) -> Optional[str]:
    """Make the model manifest's `drafter` entry describe the drafter now in MODEL/drafter (it went on
    naming the drafter converted with the model). Returns why it could not, or None."""
    try:
        data = json.loads(manifest.read_text())
        data["drafter"] = {**drafter, "created": utc_now()}
        write_json(manifest, data, indent=2)
    except (OSError, ValueError, TypeError) as e:
        return f"{manifest} still describes the drafter that was there before ({one_line(e)})"
    return None


def why_not_utf8(e: UnicodeDecodeError) -> str:
    """Why bytes read whole (`e.object`, a file's) are not UTF-8 text, and what to do: Python's words were
    "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"."""
    head = e.object[:2]
    if head == b"\x1f\x8b":
        return "it is gzip-compressed, so uncompress it first (gunzip)"
    if head in (b"\xff\xfe", b"\xfe\xff"):  # (Windows Notepad's "Unicode")
        return "it is UTF-16 text: save it as UTF-8"
    return f"byte {e.start} is 0x{e.object[e.start]:02x}: save it as UTF-8"


def read_text_file(path, role: str, advice: str, error: type = RedrafterError) -> str:
    """The text of a file the user named (`role`: "prompt file", "chat template", ...), read once and whole,
    a byte-order mark dropped. Not `is_file`: a pipe is read like a file (`--prompts <(head -4 q.jsonl)`,
    /dev/fd/63, was "not found"), once, as a pipe can only be. A path that is missing, a folder, cannot be
    read or is not UTF-8 text is an `error` (a RedrafterError) of one line: the role, the path, what is
    wrong, and, where the path is wrong, `advice` ("give a JSONL file"). Each tool had its own checks and
    words for the same four things ("no prompt file at X", "prompt file X not found", ...)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise error(f"{role} {path} is a folder: {advice}")
        if not path.exists():
            raise error(f"{role} {path} not found: {advice}")
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{role} {path} is not UTF-8 text: {why_not_utf8(e)}") from e
    except OSError as e:  # (not "[Errno 13] Permission denied: ...")
        raise error(f"{role} {path} cannot be read: {e.strerror or one_line(e)}") from e


def json_document(text: str, path) -> Optional[str]:
    """What a file meant to be JSONL (a JSON object a line) is when it is one JSON document over its lines instead,
    with the jq command that writes it as JSONL where there is one; None otherwise. (Read line by line,
    alpaca_data.json, one indented array, failed as if damaged: "line 1 is not JSON: Expecting value (column 2)".)"""
    body = text.lstrip()
    if not body.startswith(("[", "{")):
        return None
    try:
        json.loads(body.split("\n", 1)[0])
        first_line = True  # the first line is JSON alone
    except ValueError:
        first_line = False
    if body.startswith("{") and first_line:  # an object on the first line: JSONL (its other lines are read one by one)
        return None
    try:
        whole = json.loads(text)
    except ValueError:
        return None
    quoted = shlex.quote(str(path))
    if isinstance(whole, list) and whole and all(isinstance(row, dict) for row in whole):
        return f"one JSON array, not JSONL (a JSON object a line): `jq -c '.[]' {quoted}` writes its items one a line"
    if isinstance(whole, dict):
        return f"one JSON object over several lines, not JSONL (a JSON object a line): `jq -c . {quoted}` writes " \
               "it on one"
    if first_line:  # an array on its first line alone: a line that is a list of other things, said of its line
        return None
    # an array over several lines (`whole` is a list here): a list of prompts ["...", "..."] was "line 1 is not
    # JSON", as if damaged
    if whole and all(isinstance(row, str) for row in whole):
        return f"one JSON array of strings, not JSONL (a JSON object a line): `jq -c '.[] | {{prompt: .}}' {quoted}` " \
               "writes them one a line"
    return "one JSON array over several lines, not JSONL (a JSON object a line)"


def messages_instead_of_text(value, name: str) -> Optional[str]:
    """Where `value`, a row's field `name` that holds a prompt's text, is a list of chat messages instead, as
    HuggingFaceH4's sets write it: why, in words, for an error; None otherwise. (The bench and distill said it
    two ways: "a question is a string", "a prompt is text".)"""
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        return f"{name} is a list of messages ({{role, content}}, as HuggingFaceH4's sets write), not text: give " \
               "the user message's text"
    return None


def read_json_object(path: Path, what: str) -> Dict[str, Any]:
    """A JSON file that must hold an object (a model's or drafter's config); a CorruptModelError
    that names it otherwise, bytes that are not UTF-8 included."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, or not UTF-8 (a UnicodeDecodeError)
        raise CorruptModelError(f"{path} is not valid JSON: {one_line(e)}") from e
    if not isinstance(data, dict):
        # (in JSON's words: "found str" was Python's)
        raise CorruptModelError(f"{path} is not a {what}: expected a JSON object, found {json_kind(data)}")
    return data


LFS_POINTER = b"version https://git-lfs.github.com/spec/"  # what `git clone` without git-lfs leaves


def refuse_lfs_pointer(path: Path):
    """A weights or tokenizer file that is a Git LFS pointer (a repository cloned without git-lfs) is named as one:
    read as weights, it failed as 'Invalid json header length' or as a damaged pickle."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(LFS_POINTER))
    except OSError:
        return  # the reader itself says why
    if head == LFS_POINTER:
        raise CorruptModelError(f"{path} is a Git LFS pointer, not the file itself: run `git lfs pull` in {path.parent} "
                                "(or download the model with huggingface-hub)")


def refuse_missing_shards(folder: Path, files: Iterable[Path], index: Optional[str] = None,
                          listed: Iterable[str] = ()):
    """A weight shard missing from `folder` (an interrupted download or copy) is refused, naming it: with `index`,
    one of `listed` (the shards the index names) that is not there; without, one of a numbered set
    (model-00001-of-00003.safetensors, pytorch_model-00001-of-00002.bin) that `files` (the weight files there) do
    not complete. load() and the converter both say it so (mlx-lm said "Missing 11 parameters" of the weights; the
    converter took a folder of unindexed shards with some missing and converted what was there)."""
    if index is not None:
        missing = sorted({n for n in listed if not (folder / n).is_file()})
        what = f"which {index} lists"
    else:
        names = {f.name for f in files}
        numbered = [m for n in names if (m := re.fullmatch(r"(model|pytorch_model)-(\d+)-of-(\d+)\.(safetensors|bin)", n))]
        missing = sorted({f"{m[1]}-{i:0{len(m[2])}d}-of-{m[3]}.{m[4]}" for m in numbered
                          for i in range(1, min(int(m[3]), 9999) + 1)} - names)
        what = "a shard of its weights"
    if missing:
        raise CorruptModelError(f"{folder} lacks {', '.join(missing[:3])}{' and more' if len(missing) > 3 else ''}, "
                                f"{what} (an interrupted download or copy?)")


def refuse_mixed_weights(folder: Path, files: List[Path], single: str, index: Optional[str] = None,
                         listed: Iterable[str] = ()):
    """Weight files of two downloads in one folder: mlx-lm reads every model*.safetensors (the
    converter every file it finds), so a stale whole-model file beside shards, or a shard `index`
    does not list, was mixed into the weights, the last read winning, without a word. `files`:
    the weight files there; `single`: the whole-model file's name; `listed`: the index's shards."""
    if index is not None:
        listed = set(listed)
        stray = sorted(f.name for f in files if f.name not in listed)
        if stray:
            raise CorruptModelError(
                f"{folder} holds {', '.join(stray[:3])}{' ...' if len(stray) > 3 else ''} beside the shards "
                f"{index} lists: from another download? Remove the files that do not belong (they would be read "
                "together)")
    elif len(files) > 1 and any(f.name == single for f in files):
        others = [f.name for f in files if f.name != single]
        raise CorruptModelError(f"{folder} holds both {single} and shards ({', '.join(others[:2])}"
                                f"{' ...' if len(others) > 2 else ''}) and no index to say which is the model: "
                                "remove the one from another download")


def unwritable_ancestor(target: Path) -> Optional[Path]:
    """The nearest existing path above `target` when it is not a folder that can be written (so
    `target` cannot be made), else None: checked before long work whose result would go there."""
    above = next((p for p in Path(target).parents if p.exists()), None)
    if above is None:
        return None
    if not above.is_dir() or not os.access(above, os.W_OK):
        return above
    # os.access passes everything for root: /proc passed, and a run then failed after the model had loaded
    # ("No such file or directory", and "run the same command again to resume"). A folder made there and removed:
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=above))
    except OSError:
        return above
    return None


# The tags of the hidden folders beside a target: staging folders (`staging_folder(target, tag)`: a drafter's
# "", autotrain's "new-", convert's "partial-") and the old folder `replace_folder` sets aside.
TAGS = ("", "new-", "partial-", "old-")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:40] or "host"


def _owner() -> str:
    """The part of a hidden folder's name that says which process made it: @HOST-PID-."""
    return f"@{_host()}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def tidy(target: Path) -> None:
    """Clear what a killed process left beside `target`: its hidden staging folders
    (`staging_folder`), old folders set aside (`replace_folder`) and `write_json`'s temp files,
    made on this host by a process that is gone. An old folder set aside goes back to `target`
    when nothing is there (the process died between `replace_folder`'s two renames); else it is
    deleted. What cannot be read or removed is left as it is."""
    target = Path(target)
    # Only `target`'s own: any tag matched `.NAME.x.old-@...`, the old folder of `NAME.x`, and deleted it.
    tags = "|".join(map(re.escape, TAGS))
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(?P<tag>{tags})@(?P<host>[A-Za-z0-9]+)-(?P<pid>\d+)-")
    host = _host()
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or m["host"] != host or int(m["pid"]) == os.getpid() or _alive(int(m["pid"])):
            continue
        try:
            if m["tag"] == "old-" and (entry / "old").is_dir() and not (target.exists() or target.is_symlink()):
                os.rename(entry / "old", target)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:  # (write_json's temp file: rmtree refused it, and it stayed)
                entry.unlink()
        except OSError:
            pass


def staging_folder(target: Path, tag: str = "") -> Path:
    """A hidden folder beside `target` to write into and then rename to it, with the permissions a
    folder made by `mkdir` would have (`tempfile.mkdtemp` makes it private to its owner, which the
    renamed result would keep: a model or drafter no one else could read). What a killed process
    left beside `target` is cleared first (`tidy`)."""
    if tag not in TAGS:  # tidy clears only the tags it knows
        raise ValueError(f"staging folder tag {tag!r} is not one of {TAGS}")
    target = Path(target)
    tidy(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{tag}{_owner()}", dir=target.parent))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o777 & ~mask)
    return tmp


# (Windows has no SIGHUP)
HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def signals_held():
    """Hold Ctrl-C (SIGINT), SIGTERM and SIGHUP (a closed terminal, a dropped ssh session) until the
    block ends, then deliver them to the handlers in place before it: a few renames that must all
    happen or none. Only the main thread receives signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    # (a handler installed outside Python reads as None and cannot be put back: left alone)
    before = {s: h for s in HELD_SIGNALS if (h := signal.getsignal(s)) is not None}
    for s in before:
        signal.signal(s, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)


def replace_folder(new: Path, target: Path, keep: Optional[Path] = None) -> Path:
    """Rename the finished folder `new` (beside `target`, e.g. from `staging_folder`) to `target`,
    replacing what is there. That takes two renames, the old folder aside and the new one in:
    Ctrl-C or SIGTERM is held until both are done and the old folder is deleted (between the
    renames it left no folder in place), and a failing second rename puts the old folder back.
    With `keep` (a path beside `target`), the old folder goes there instead of being deleted,
    replacing an older folder there (set aside with it first, and put back where a rename fails:
    every rename that fails undoes the ones before it). Where the process dies between the renames,
    the old folder is in the hidden `.NAME.old-*` folder `tidy` puts back at `target`. Signals
    already held by the caller (`signals_held` around this and more) stay held until its block ends."""
    new, target = Path(new), Path(target)
    keep = None if keep is None else Path(keep)
    with signals_held():
        if not (target.exists() or target.is_symlink()):
            os.rename(new, target)
            return target
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-{_owner()}", dir=target.parent))
        try:
            older = keep is not None and (keep.exists() or keep.is_symlink())
            if older:
                os.rename(keep, aside / "older")
            try:
                os.rename(target, aside / "old")
                try:
                    os.rename(new, target)
                except BaseException:
                    os.rename(aside / "old", target)
                    raise
            except BaseException:
                if older:
                    os.rename(aside / "older", keep)
                raise
            if keep is not None:
                os.rename(aside / "old", keep)
        finally:
            shutil.rmtree(aside, ignore_errors=True)  # (the old folder, or with `keep` the older one, not kept)
    return target
