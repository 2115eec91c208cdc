"""`python -m convert`: see convert/cli.py (and `python -m convert --help` for examples)."""

import signal
import sys

from . import PROG

STOPPING = ("SIGTERM", "SIGHUP")  # (convert.output.STOPPING: that module imports mlx, which is what takes the time)


def _stopped(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _main():
    """convert.cli's main, imported (mlx and the rest: a second or more) with SIGTERM and SIGHUP stopping it as
    they do later, said in the same line and exit status: one there ended the process saying nothing, and Ctrl-C
    there showed a traceback."""
    installed = [s for s in (getattr(signal, name) for name in STOPPING if hasattr(signal, name))
                 if signal.getsignal(s) == signal.SIG_DFL]
    for s in installed:
        signal.signal(s, _stopped)
    try:
        from .cli import main
    except KeyboardInterrupt as e:
        name = e.args[0] if len(e.args) == 1 and e.args[0] in STOPPING else "SIGINT"
        print(f"{PROG}: error: cancelled; nothing was written", file=sys.stderr)
        return 128 + getattr(signal, name)
    finally:
        for s in installed:  # (main installs its own)
            signal.signal(s, signal.SIG_DFL)
    return main()


if __name__ == "__main__":
    sys.exit(_main())
