"""Backend set-up that must happen before the first `import mlx.core`.

The Linux `mlx[cpu]` wheel links a slow reference BLAS, but its CPU backend calls the standard
`cblas_*` symbols, so a fast BLAS loaded with RTLD_GLOBAL before MLX binds them takes over.
In order of preference:

- **Intel oneMKL**, the `mkl` wheel from PyPI (a dependency of this package on Linux x86_64,
  so `pip install` alone gets it): `libmkl_rt` finds its own threading and kernel layers;
- **the system OpenBLAS** (Debian: `libopenblas0-pthread`), e.g. on Linux aarch64.

Measured on the 2-core x86_64 CPU (mlx 0.32, mkl 2026.2), a (k x 576) @ (576 x 49152)
float32 matmul, the default model's output layer, in ms:

    k                    1      4     16     64
    MKL                 2.25   4.26   7.59   16.3
    system OpenBLAS     4.63   8.44  17.95   59.2
    MLX's own BLAS     19.0   75.0  300     1183

Results agree with the bundled BLAS to float32 rounding. On macOS MLX uses Accelerate and
Metal, and this module does nothing. `REDRAFTER_BLAS=mkl|openblas|mlx` picks one (`mlx`: keep
the bundled BLAS); `REDRAFTER_NO_OPENBLAS=1` is the same as `mlx`.

Order matters: once `mlx.core` is loaded its BLAS calls are bound to the bundled library,
and loading another later changes nothing (measured: a 13-token forward of the default
model takes 1.6 s instead of 0.08 s). So `import redrafter_mlx` before `mlx.core`, or start
Python with LD_PRELOAD set to the library; a script that gets the order wrong is warned.
"""

import ctypes
import ctypes.util
import glob
import os
import site
import sys
import warnings
from typing import Optional

CHOICES = ("mkl", "openblas", "mlx")


def _wanted() -> str:
    if os.environ.get("REDRAFTER_NO_OPENBLAS"):
        return "mlx"
    want = os.environ.get("REDRAFTER_BLAS", "").strip().lower()
    if want not in (*CHOICES, "auto", ""):
        warnings.warn(f"REDRAFTER_BLAS={want!r} is not one of auto, {', '.join(CHOICES)}: using auto", RuntimeWarning,
                      stacklevel=2)
    return want if want in CHOICES else "auto"


def mkl_library() -> Optional[str]:
    """Path of the pip-installed `libmkl_rt` (in the environment's lib/ folder), or None."""
    folders = [os.path.join(sys.prefix, "lib"), os.path.join(site.getuserbase(), "lib")]
    for folder in folders:
        found = sorted(glob.glob(os.path.join(folder, "libmkl_rt.so*")))
        if found:
            return found[-1]
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("mkl")
    except (ImportError, PackageNotFoundError):
        return None
    for f in dist.files or ():
        if f.name.startswith("libmkl_rt.so"):
            path = str(dist.locate_file(f))
            if os.path.exists(path):
                return path
    return None


def _load(path: str) -> bool:
    try:
        # Lazy binding: MKL's layers refer to each other, and its runtime loads them itself.
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | os.RTLD_LAZY)
        return True
    except OSError:
        return False


def _load_fast_blas() -> Optional[str]:
    """Load the preferred fast BLAS; its name ("MKL", "OpenBLAS") or None."""
    want = _wanted()
    if not sys.platform.startswith("linux") or want == "mlx":
        return None
    if want in ("auto", "mkl"):
        path = mkl_library()
        if path and _load(path):
            return "MKL"
    if want in ("auto", "openblas"):
        for name in ("libopenblas.so.0", "libopenblas.so"):
            if _load(name):
                return "OpenBLAS"
    if want != "auto":  # asked for by name and not found: MLX's own BLAS was used, saying nothing (3-4x slower)
        where = "pip install mkl" if want == "mkl" else "Debian: apt-get install libopenblas0-pthread"
        warnings.warn(f"REDRAFTER_BLAS={want}: no {'MKL' if want == 'mkl' else 'OpenBLAS'} library found ({where}); "
                      "using MLX's own BLAS, several times slower on the CPU", RuntimeWarning, stacklevel=2)
    return None


def _late_import_check() -> Optional[str]:
    """mlx.core came first: a fast BLAS only counts if it was preloaded; otherwise warn when one
    could have been used (Linux CPU, library present, not opted out)."""
    preload = os.environ.get("LD_PRELOAD", "")
    if "mkl" in preload:
        return "MKL"
    if "openblas" in preload:
        return "OpenBLAS"
    if not sys.platform.startswith("linux") or _wanted() == "mlx":
        return None
    import mlx.core as mx

    if mx.default_device().type == mx.DeviceType.cpu and (mkl_library() or ctypes.util.find_library("openblas")):
        warnings.warn(
            "mlx.core was imported before redrafter_mlx, so MLX keeps its slow reference BLAS on this "
            "CPU (float32 matmuls ~10x slower): import redrafter_mlx first, or start Python with "
            "LD_PRELOAD set to libmkl_rt or libopenblas (REDRAFTER_BLAS=mlx silences this)",
            RuntimeWarning,
            stacklevel=3,
        )
    return None


FAST_BLAS: Optional[str] = _load_fast_blas() if "mlx.core" not in sys.modules else _late_import_check()


def device_description() -> str:
    """A short human description of where MLX runs, e.g. 'cpu (x86_64, MKL)' or 'gpu (NVIDIA H100)'."""
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

        name = platform.machine() + (f", {FAST_BLAS}" if FAST_BLAS else "")
    return f"{kind} ({name})" if name else kind


def on_cpu() -> bool:
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.cpu


def fast_cpu_blas() -> bool:
    """Whether float32 matmuls on the CPU run on a fast BLAS: one loaded here, or macOS's Accelerate."""
    return FAST_BLAS is not None or sys.platform == "darwin"
