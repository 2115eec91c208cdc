"""What the command lines share: options that check their range while they parse, so a bad value is
refused at once, in the flag's own words, before any model loads; and one way to end a command on a
user error: one line on stderr, never a traceback.

    p.add_argument("--max-tokens", type=cli.positive, default=256)
    ...
    return cli.run("redrafter-bench", lambda: body(args))
"""

import argparse
import contextlib
import math
import os
import re
import signal
import sys
import threading
import warnings
from typing import Callable, Optional

from .errors import RedrafterError, RedrafterWarning, compact, compact_digits
from .graph import MAX_GRAPH_K, graph_k_error  # noqa: F401  (graph.py's, as the library checks graph=K; kept here too)
from .sampling import SEED_MAX


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: argparse printed its whole usage block (10-20 lines for these
    tools) before the line that says what is wrong."""

    hint = ""  # said after an error's message where a command knows a likelier cause (a prompt read as an option)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{self.hint} (options: {self.prog} --help)\n")


_INTEGER = re.compile(r"\s*([+-]?)(\d(?:_?\d)*)\s*")  # what int() reads in base 10
ECHO = 60  # longest option text a message echoes whole


def _integer_text(text: str):
    """(negative, digits) of the base-10 integer `text` writes (underscores and leading zeros, which int()'s digit
    limit counts, left out), or None where it writes none."""
    found = _INTEGER.fullmatch(text)
    return None if found is None else (found.group(1) == "-", found.group(2).replace("_", "").lstrip("0") or "0")


class _TooManyDigits(argparse.ArgumentTypeError):
    """An integer of more digits than int() reads (sys.get_int_max_str_digits: 4300): `negative`, and `shown`,
    the value as errors.compact writes it. The message echoed every digit, and said it was no integer."""

    def __init__(self, negative: bool, digits: str):
        self.negative, self.shown = negative, compact_digits(negative, digits)
        limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
        super().__init__(f"expected an integer of at most {limit} digits, not {self.shown}")


def _shown(text: str) -> str:
    """`text` as a message echoes it: quoted, but an integer's digits past 20 as errors.compact writes them,
    and other text past ECHO characters cut short."""
    integer = _integer_text(text)
    if integer is None:  # other text past ECHO characters: its start and its length (5000 x's were echoed whole)
        return repr(text) if len(text) <= ECHO else f"{text[:ECHO // 2]!r}... ({len(text)} characters)"
    return compact_digits(*integer) if len(integer[1]) > 20 else repr(text)


def _parse(kind, text: str):
    try:
        value = kind(text)
    except ValueError:
        integer = _integer_text(text) if kind is int else None
        if integer is not None:  # an integer past the digits Python reads (4300)
            try:  # (the limit counts leading zeros: 000...01 is 1)
                return int(("-" if integer[0] else "") + integer[1])
            except ValueError:
                raise _TooManyDigits(*integer) from None
        raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, not "
                                         f"{_shown(text)}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, not {_shown(text)}")
    return value


def integer(minimum: int = 0, maximum: Optional[int] = None, named: Optional[str] = None) -> Callable[[str], int]:
    """An argparse type: an integer in [minimum, maximum]. named: the maximum in the words --help gives it
    ("2**64 - 1" for a seed, which the error wrote out as 18446744073709551615)."""

    def parse(text: str) -> int:
        span = f"at least {minimum}" if maximum is None else f"from {minimum} to {named or maximum}"
        try:
            value = _parse(int, text)
        except _TooManyDigits as e:  # below any minimum, or above a maximum: said as any value out of range is
            if e.negative or maximum is not None:
                raise argparse.ArgumentTypeError(f"must be {span}, not {e.shown}") from None
            raise
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {span}, not {compact(value)}")
        return value

    parse.__name__ = "integer"
    return parse


positive = integer(1)
non_negative = integer(0)
seed = integer(0, SEED_MAX, "2**64 - 1")


def number(minimum: float = 0.0, maximum: Optional[float] = None, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number >= minimum (> minimum with `above`) and <= maximum."""

    def parse(text: str) -> float:
        value = _parse(float, text)
        if value < minimum or (above and value == minimum) or (maximum is not None and value > maximum):
            low = f"{'above' if above else 'at least'} {minimum:g}"
            span = low if maximum is None else f"{low} and at most {maximum:g}"
            raise argparse.ArgumentTypeError(f"must be {span}, not {value:g}")
        return value

    parse.__name__ = "number"
    return parse


MAX_DRAFT_TOKENS = 1024  # generate.MAX_DRAFT_TOKENS (a test checks they agree; this module stays light)


def draft_size_error(beam_width: Optional[int], beam_length: Optional[int], tree: Optional[int],
                     lookup: Optional[int]) -> Optional[str]:
    """What generate would refuse of the drafting options given (None: not given), said while parsing:
    it was said after the model had loaded (seconds here, minutes for a large model)."""
    if beam_width is not None and beam_length is not None and beam_width * (beam_length - 1) > MAX_DRAFT_TOKENS:
        return f"beams of {compact(beam_width)} x {compact(beam_length)} tokens draft " \
               f"{compact(beam_width * (beam_length - 1))} tokens a step; " \
               f"at most {MAX_DRAFT_TOKENS}"
    for flag, value in (("--beam-width", beam_width), ("--beam-length", beam_length), ("--tree", tree),
                        ("--lookup", lookup)):
        if value is not None and value > MAX_DRAFT_TOKENS + (flag == "--beam-length"):
            return f"{flag} {compact(value)}: drafts are limited to {MAX_DRAFT_TOKENS} tokens a step"
    return None


FLOOR_WITH_BEAMS = "--tree-min-prob is the dynamic tree's floor, and these options draft W x L beams: add --tree N " \
                   "(N > 0 nodes), or drop it"


def unused_drafting_error(mode: str, no_drafter: bool, drafter: Optional[str], beam_width: Optional[int],
                          beam_length: Optional[int], lookup: Optional[int], tree: Optional[int],
                          tree_min_prob: Optional[float], graph: Optional[int]) -> Optional[str]:
    """Drafting options that nothing would use, said while parsing (they ran, ignored, saying nothing;
    `--graph` with beams was refused after the model had loaded). None: options given are used."""
    shaping = [flag for flag, value in (("--beam-width", beam_width), ("--beam-length", beam_length), ("--tree", tree),
                                        ("--tree-min-prob", tree_min_prob), ("--graph", graph)) if value is not None]
    if mode == "ar":
        # (--no-drafter too: none is loaded anyway; redrafter-bench refuses it with --modes ar)
        given = shaping + [flag for flag, value in (("--lookup", lookup), ("--drafter", drafter),
                                                    ("--no-drafter", no_drafter or None)) if value is not None]
        if given:
            return f"--mode ar decodes plainly and drafts nothing: drop {', '.join(given)}, or use --mode auto"
    if no_drafter and shaping:
        return (f"{', '.join(shaping)} shape{'s' if len(shaping) == 1 else ''} the drafter's drafts, and --no-drafter "
                "leaves it out: drop " + ("it" if len(shaping) == 1 else "them")
                + " (without the drafter, --lookup N drafts the context's copy alone)")
    fixed = any(value is not None for value in (beam_width, beam_length, lookup, tree, tree_min_prob))
    beams = tree == 0 or (tree is None and (beam_width is not None or beam_length is not None))  # no tree then
    if graph is not None and fixed and beams:
        return "--graph drafts a dynamic tree, and these options draft W x L beams: add --tree N (N > 0 nodes)"
    if tree_min_prob is not None and beams:
        return FLOOR_WITH_BEAMS
    return None


def context_graph_error(no_context_graph: bool, graph_given: bool) -> Optional[str]:
    """--no-context-graph without graph drafting, ignored saying nothing (the chat mirrors it)."""
    if no_context_graph and not graph_given:
        return "--no-context-graph applies to graph drafting: add --graph K, or drop it"
    return None


def sampling_error(temperature: float, top_p: float, seed: Optional[int] = None) -> Optional[str]:
    """--top-p or --seed with greedy decoding (--temperature 0), where they change nothing and were
    ignored, saying nothing (the chat mirrors it for --top-p)."""
    given = [flag for flag, on in (("--top-p", top_p != 1.0), ("--seed", seed is not None)) if on]
    if temperature == 0.0 and given:
        return (f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to sampling, and --temperature 0 "
                "decodes greedily: add --temperature T above 0, or drop " + ("them" if len(given) > 1 else "it"))
    return None


def drafter_error(path: Optional[str], no_drafter: bool) -> Optional[str]:
    """What is wrong with --drafter PATH (and --no-drafter), said while parsing: the two together
    were ignored, and a folder with no drafter was said after the model loaded."""
    from pathlib import Path

    if path is not None and no_drafter:
        return "--drafter PATH and --no-drafter ask for opposite things: give one"
    if path is not None and not (Path(path).expanduser() / "config.json").is_file():
        from .config import drafter_inside

        return f"--drafter {path}: no drafter there (a folder with config.json and the weights){drafter_inside(path)}"
    return None


def run_folder_error(flag: str, path) -> Optional[str]:
    """What keeps PATH from being the folder a long run writes into and resumes from, said while parsing: a
    file there failed after the model had loaded, in Python's words ("File exists")."""
    from pathlib import Path

    from .files import unwritable_ancestor

    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{flag} {path} is a file: give a folder (a new one, or a stopped run's to resume it), or move the " \
               "file away"
    above = None if path.exists() else unwritable_ancestor(path)
    if above is not None:
        return f"{flag} {path} cannot be made: {above} is not a folder you can write"
    # a folder that is there but cannot be written (as work_folder checks --work): it failed after the model had
    # loaded, "No such file or directory: OUT/.source.json...", and said to run the same command again
    if path.is_dir() and unwritable_ancestor(path / "out") is not None:
        return f"{flag} {path} is a folder you cannot write: give one you can"
    return None


def temperature(text: str) -> float:
    """An argparse type: a sampling temperature, a finite number >= 0 (0 = greedy)."""
    value = _parse(float, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 = greedy), not {value:g}")
    return value


def probability(text: str) -> float:
    """An argparse type: a probability in (0, 1] (top-p, a tree's floor)."""
    value = _parse(float, text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], not {value:g}")
    return value


def path(text: str):
    """An argparse type: a path, with "~" expanded as a shell does for a word of its own. In `--out=~/runs` no shell
    expands it: distill made a folder named "~" in the current one, and `--prompts=~/q.jsonl` was not found."""
    from pathlib import Path

    return Path(text).expanduser()


def writable_file(text: str):
    """An argparse type: a file path whose folder exists and can be written, checked before a long run
    whose results would otherwise be lost at the end. For a symbolic link, the folder of the file it
    names: the results are written there (`files.write_json` keeps the link)."""
    from pathlib import Path

    if text == "-":  # (the usual "standard output": a file named "-" was written in the current folder)
        raise argparse.ArgumentTypeError("'-' is not standard output here: the results are written to a file; give "
                                         "its path (./- for a file of that name)")
    path = Path(text).expanduser()
    folder = (Path(os.path.realpath(path)) if path.is_symlink() else path).parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder, not a file")
    if path.exists() and not path.is_file():  # the file written beside it replaced it: /dev/stdout, as root
        raise argparse.ArgumentTypeError(f"{path} is not a regular file (a device, a pipe or a terminal), and the "
                                         "results are written to a file that replaces it: give a file's path")
    if _open_file_link(path):  # /dev/stdout > log: the log was replaced by the report, what it held and the table lost
        raise argparse.ArgumentTypeError(f"{path} names a file the command has open (its standard output, say), and "
                                         "the results are written to a file that replaces it: give a file's path")
    if not folder.is_dir():  # (a file there had been said as "folder X does not exist", though X exists)
        raise argparse.ArgumentTypeError(f"{folder} is a file, not a folder" if folder.exists() else
                                         f"folder {folder} does not exist")
    # A file is made there and removed, as the results are written (a temporary file renamed): os.access
    # passes everything for root, and a folder such as /proc then lost a whole run at its first write.
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"folder {folder} cannot be written ({e.strerror or e})") from None
    return path


def _open_file_link(path) -> bool:
    """Whether `path` reaches its file through a process's open-file links (/proc/PID/fd/N, /dev/fd/N:
    Linux's /dev/stdout is one): a regular file there is whatever the shell redirected to, not a path."""
    for _ in range(40):  # (a loop of links: the check above already found the path missing or not)
        try:
            folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        except OSError:
            return False
        if re.fullmatch(r"/proc/(self|thread-self|\d+)(/task/\d+)?/fd|/dev/fd", folder):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return False


def work_folder(text: str):
    """An argparse type: a folder for a long run's work. A path that cannot be one is refused before
    any model loads (it was said after the load, with advice to run the command again); a missing
    one is made when the work starts, not here (a run that stopped at a user error found later,
    such as too few prompts, left an empty folder behind)."""
    from pathlib import Path

    from .files import unwritable_ancestor

    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a file, not a folder")
    above = None if path.exists() else unwritable_ancestor(path)
    if above is not None:
        raise argparse.ArgumentTypeError(f"cannot make the folder {path}: {above} is not a folder you can write")
    if path.is_dir() and unwritable_ancestor(path / "work") is not None:  # (a real probe: root passes os.access)
        raise argparse.ArgumentTypeError(f"folder {path} cannot be written")
    return path


def describe(error: OSError) -> str:
    """An OS error as one line: what failed and on which path."""
    what = error.strerror or str(error) or type(error).__name__
    where = " -> ".join(str(f) for f in (error.filename, error.filename2) if f is not None)
    return f"{what}: {where}" if where else what


def write_failure(error: BaseException) -> Optional[str]:
    """MLX's own file writes (`mx.save_safetensors`, `mx.save`) fail with a RuntimeError, not an
    OSError: a full disk read "RuntimeError: [write] Unable to write 1441433 bytes to file." as a
    bug. That error as one line with what to check; None for any other error."""
    text = str(error)
    if isinstance(error, RuntimeError) and text.startswith(("[write]", "[save_safetensors]", "[save]")):
        return f"{text.split('] ', 1)[-1].rstrip('.')}: is the disk full, or the folder not writable?"
    return None


class _LineAfterCtrlC:
    """Standard error while a command runs, watching whether its line was ended since Ctrl-C. The terminal echoes
    "^C" where the cursor is (after a progress bar's half-drawn line, or at a line's start), and the message that
    follows ran on after it: `run` puts the message on a line of its own. A progress bar closed on the way out
    ends its line (tqdm writes its last state and a newline), and the line put before the message then left a
    blank one under the bar."""

    def __init__(self, stream):
        self.stream = stream
        self.line_ended = False  # what was written last ended its line, and no Ctrl-C ("^C") came after it

    def ctrl_c(self, signum, frame):
        self.line_ended = False
        signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as ever

    def write(self, text):
        if text:
            self.line_ended = text.endswith("\n")
        return self.stream.write(text)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding...: the stream's own
        return getattr(self.stream, name)


@contextlib.contextmanager
def _watching_ctrl_c():
    """A `_LineAfterCtrlC` over sys.stderr while the block runs (read by after_ctrl_c), told of Ctrl-C by a SIGINT
    handler. Where Python's own handler is not the one in place (another thread, a handler the program set, SIGINT
    ignored), nothing is watched: the line is taken as not ended, as it was before."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    watch = sys.stderr = _LineAfterCtrlC(sys.stderr)
    signal.signal(signal.SIGINT, watch.ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if sys.stderr is watch:
            sys.stderr = watch.stream


def after_ctrl_c() -> str:
    """What a command's own message after Ctrl-C (or SIGTERM) starts with, inside `run`: "\n" where the line was
    not ended since Ctrl-C (the terminal's "^C", a bar left mid-line), nothing under a line ended since (a bar
    closed on the way out: a "\n" of its own left a blank line). `run`'s own rule for its message."""
    line = sys.stderr
    return "" if isinstance(line, _LineAfterCtrlC) and line.line_ended else "\n"


def run(prog: str, body: Callable[[], Optional[int]], resume: Optional[str] = None) -> int:
    """Run a command's body and return its exit status. A user error (`RedrafterError`) ends it
    with one line on stderr and status 2; an OS error (a path that cannot be read or written, a
    full disk) or MLX failing to write a file the same with status 1, followed by `resume` (how a
    command that keeps its work goes on, e.g. "run the same command again to resume") if given;
    Ctrl-C with 130 (and what the body said of where it stopped); output cut short by the reader
    (`... | head`) quietly, as other command-line tools do. Anything else is a bug and keeps its
    traceback. The library's warnings (RedrafterWarning) are not printed: load() tells the command's
    progress lines the same words (they had been printed twice, once with Python's warning header)."""
    with _watching_ctrl_c():
        return _run(prog, body, resume)


def _run(prog: str, body: Callable[[], Optional[int]], resume: Optional[str]) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RedrafterWarning)
            return body() or 0
    except RedrafterError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        try:  # the reader is gone: no more output, and no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 1
    except OSError as e:
        print(f"{prog}: error: {describe(e)}" + (f"; {resume}" if resume else ""), file=sys.stderr)
        return 1
    except RuntimeError as e:
        said = write_failure(e)
        if said is None:
            raise
        print(f"{prog}: error: {said}" + (f" (then {resume})" if resume else ""), file=sys.stderr)  # said ends in "?"
        return 1
    except KeyboardInterrupt as e:  # a body may say where it stopped and how to go on: KeyboardInterrupt(text)
        said = e.args[0] if e.args and isinstance(e.args[0], str) else "cancelled"
        # on a line of its own (after "^C", or a bar left mid-line), but no blank one under a bar closed since
        print(after_ctrl_c() + f"{prog}: {said}", file=sys.stderr)
        return 130


class Stop:
    """Ctrl-C (SIGINT) and SIGTERM (`kill`, a job's time limit) both stop a run the same way, as
    KeyboardInterrupt, so either reports what finished (redrafter-bench its questions, replay its
    figures). `status`: the exit status, 130 or 143 (128 + the signal), as a shell reports a
    process those signals end. Installed where a command's body starts; `restore` when it ends."""

    def __init__(self):
        self.why, self.status, self._previous = "interrupted", 130, None
        self.began = False  # (the bench's) the run began: its --json report is written (one stopped before leaves it)
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._terminated)

    def _terminated(self, signum, frame):
        self.why, self.status = "terminated (SIGTERM)", 128 + signal.SIGTERM
        raise KeyboardInterrupt

    def restore(self):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def versions() -> str:
    """`redrafter-mlx 0.1.0 (mlx 0.29.3, mlx-lm 0.28.2)`: what a bug report needs, read from the
    installed packages' metadata (cheap: nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"redrafter-mlx {of('redrafter-mlx')} (mlx {of('mlx')}, mlx-lm {of('mlx-lm')})"


def add_version(p: argparse.ArgumentParser):
    p.add_argument("--version", action="version", version=versions(), help="print the versions and exit")
