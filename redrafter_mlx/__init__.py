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
    ModelNotFoundError,
    NetworkError,
    RedrafterError,
    SettingError,
    UnsupportedModelError,
)
from .generate import Event, Generation, PromptCache, generate, stream  # noqa: F401
from .loader import LoadedModel, load  # noqa: F401
from .stats import RunStats, StepStats  # noqa: F401

__version__ = "0.1.0"
