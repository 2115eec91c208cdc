"""redrafter-mlx: fast, lossless LLM inference on MLX with Recurrent Drafting (ReDrafter).

    from redrafter_mlx import load, generate, stream
    m = load("smollm2-135m")                       # registry name, local path or hub id
    out = generate(m, "What is MLX?", max_tokens=64)
    print(out.text, out.stats.tokens_per_second)
    for ev in stream(m, [{"role": "user", "content": "Hi"}], mode="redrafter"):
        print(ev.text, end="", flush=True)
"""

from . import _platform  # noqa: F401  (must come before the first `import mlx.core`)
from .errors import (  # noqa: F401
    ContextLengthError,
    CorruptModelError,
    DrafterMismatchError,
    EmptyPromptError,
    InvalidPromptError,
    ModelNotFoundError,
    NetworkError,
    RedrafterError,
    RedrafterWarning,
    SettingError,
    UnsupportedModelError,
)
from .generate import Event, Generation, PromptCache, generate, stream  # noqa: F401
from .stats import RunStats, StepStats  # noqa: F401

__version__ = "0.1.0"

# What `from redrafter_mlx import *` gives: without it, the modules imported on the way (tree_search,
# costs, ...) and not `load`, which is imported on first use (below).
__all__ = [
    "load", "LoadedModel", "generate", "stream", "PromptCache", "Event", "Generation", "RunStats", "StepStats",
    "RedrafterError", "RedrafterWarning", "ContextLengthError", "CorruptModelError", "DrafterMismatchError",
    "EmptyPromptError", "InvalidPromptError", "ModelNotFoundError", "NetworkError", "SettingError", "UnsupportedModelError",
]

# `load` and `LoadedModel` come from loader.py, which imports mlx-lm and through it transformers
# (3-4 s on a 2-core CPU): imported on first use, so that `import redrafter_mlx`, and every
# command line's `--help` and option errors, answer at once.
_LAZY = {"load": "loader", "LoadedModel": "loader"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
