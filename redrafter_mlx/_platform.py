"""Backend set-up that must happen before the first `import mlx.core`.

The Linux `mlx[cpu]` wheel links a reference BLAS. Where the system has OpenBLAS
(Debian: `libopenblas0-pthread`), loading it with RTLD_GLOBAL before MLX resolves its
BLAS symbols makes float32 matmuls about 10x faster (measured: a 16x576x49152 matmul,
310 ms -> 26 ms, identical results). On macOS MLX uses Accelerate/Metal and this is a
no-op. Set REDRAFTER_NO_OPENBLAS=1 to keep the bundled BLAS.

Order matters: once `mlx.core` is loaded its BLAS calls are bound to the bundled library,
and loading OpenBLAS later changes nothing (measured: a 13-token forward of the default
model takes 1.6 s instead of 0.08 s). So `import redrafter_mlx` before `mlx.core`, or start
Python with LD_PRELOAD=libopenblas.so.0; a script that gets the order wrong is warned.
"""

import ctypes
import ctypes.util
import os
import sys
import warnings

OPENBLAS_LOADED = False


def _load_openblas() -> bool:
    if not sys.platform.startswith("linux") or os.environ.get("REDRAFTER_NO_OPENBLAS"):
        return False
    for name in ("libopenblas.so.0", "libopenblas.so"):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            return True
        except OSError:
            continue
    return False


def _late_import_check() -> bool:
    """mlx.core came first: OpenBLAS only counts if it was preloaded; otherwise warn when it
    could have been used (Linux CPU, library present, not opted out)."""
    if "openblas" in os.environ.get("LD_PRELOAD", ""):
        return True
    if not sys.platform.startswith("linux") or os.environ.get("REDRAFTER_NO_OPENBLAS"):
        return False
    import mlx.core as mx

    if mx.default_device().type == mx.DeviceType.cpu and ctypes.util.find_library("openblas"):
        warnings.warn(
            "mlx.core was imported before redrafter_mlx, so MLX keeps its slow reference BLAS on this "
            "CPU (float32 matmuls ~10x slower): import redrafter_mlx first, or run with "
            "LD_PRELOAD=libopenblas.so.0 (REDRAFTER_NO_OPENBLAS=1 silences this)",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


OPENBLAS_LOADED = _load_openblas() if "mlx.core" not in sys.modules else _late_import_check()


def device_description() -> str:
    """A short human description of where MLX runs, e.g. 'cpu (OpenBLAS)' or 'gpu (NVIDIA H100)'."""
    import mlx.core as mx

    dev = mx.default_device()
    kind = "gpu" if dev.type == mx.DeviceType.gpu else "cpu"
    try:
        info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
        name = info.get("device_name") or info.get("architecture") or ""
    except Exception:
        name = ""
    if kind == "cpu":
        import platform

        name = platform.machine() + (", OpenBLAS" if OPENBLAS_LOADED else "")
    return f"{kind} ({name})" if name else kind


def on_cpu() -> bool:
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.cpu
