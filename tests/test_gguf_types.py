"""GGUF tensor types: tiny llama GGUF files whose matrices are llama.cpp's quantized blocks (random
but well-formed bytes), loaded through `load()` and compared with a numpy reference of llama.cpp's
dequantization (ggml-quants.c, `dequantize_row_*`); damaged tensors and types the loader cannot
read fail with a one-line error that names them."""

import struct

import mlx.core as mx
import numpy as np
import pytest

from redrafter_mlx import load
from redrafter_mlx.errors import CorruptModelError, RedrafterError, UnsupportedModelError

# name -> (ggml type id, bytes per block, values per block)
TYPES = {"F32": (0, 4, 1), "F16": (1, 2, 1), "Q4_0": (2, 18, 32), "Q4_1": (3, 20, 32), "Q5_0": (6, 22, 32),
         "Q5_1": (7, 24, 32), "Q8_0": (8, 34, 32), "Q8_1": (9, 36, 32), "Q2_K": (10, 84, 256),
         "Q3_K": (11, 110, 256), "Q4_K": (12, 144, 256), "Q5_K": (13, 176, 256), "Q6_K": (14, 210, 256),
         "Q8_K": (15, 292, 256), "IQ1_S": (19, 50, 256), "IQ4_NL": (20, 18, 32), "IQ4_XS": (23, 136, 256),
         "BF16": (30, 2, 1), "TQ2_0": (35, 66, 256), "MXFP4": (39, 17, 32)}
# where each block keeps its float16 scales (random bytes there could be inf or NaN)
SCALE_BYTES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q8_1": [0, 2],
               "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ1_S": [0],
               "IQ4_NL": [0], "IQ4_XS": [0], "TQ2_0": [64]}


def raises(exc, fn, *words):
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert isinstance(info.value, RedrafterError) and "\n" not in msg, msg
    for w in words:
        assert str(w).lower() in msg.lower(), f"{w!r} not in {msg!r}"
    return msg


# ---- a GGUF writer for any tensor type -----------------------------------------------------

def _string(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _value(v) -> bytes:
    """A metadata value as `TinyKit.gguf_metadata` gives them: str, list of str, mx scalar or vector."""
    if isinstance(v, str):
        return struct.pack("<I", 8) + _string(v.encode())
    if isinstance(v, list):
        return struct.pack("<IIQ", 9, 8, len(v)) + b"".join(_string(s.encode()) for s in v)
    a = np.array(v)
    code = {np.uint32: 4, np.int32: 5, np.float32: 6, np.bool_: 7}[a.dtype.type]
    if a.ndim == 0:
        return struct.pack("<I", code) + a.tobytes()
    return struct.pack("<IIQ", 9, code, a.size) + a.tobytes()


def write_blocks_gguf(path, meta, tensors, alignment=32):
    """tensors: name -> (type name, shape in MLX order, raw bytes), laid out as llama.cpp does."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    head += b"".join(_string(k.encode()) + _value(v) for k, v in meta.items())
    data = b""
    for name, (kind, shape, raw) in tensors.items():
        data += b"\0" * (-len(data) % alignment)
        head += _string(name.encode()) + struct.pack("<I", len(shape))
        head += b"".join(struct.pack("<Q", d) for d in reversed(shape))  # ggml: the row length first
        head += struct.pack("<IQ", TYPES[kind][0], len(data))
        data += raw
    head += b"\0" * (-len(head) % alignment)
    path.write_bytes(head + data)
    return path


def random_blocks(kind, n_values, rng):
    _, size, per = TYPES[kind]
    blocks = rng.integers(0, 256, size=(n_values // per, size), dtype=np.uint8)
    for at in SCALE_BYTES.get(kind, []):
        blocks[:, at:at + 2] = rng.uniform(1e-4, 1e-3, size=(len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.tobytes()


def kquant_gguf(tiny_kit, path, kinds, seed=0):
    """A one-layer llama (hidden 256, so rows are whole 256-value super-blocks) whose matrices are
    random blocks of `kinds` (one type, or tensor name -> type); norms stay float32. Returns the
    path and the tensors' raw blocks {name: (type, shape, bytes)}."""
    model = tiny_kit.model(seed=seed, hidden_size=256, intermediate_size=256, num_hidden_layers=1)
    rng = np.random.default_rng(seed)
    tensors, blocks = {}, {}
    for name, v in tiny_kit.gguf_tensors(model).items():
        kind = kinds if isinstance(kinds, str) else kinds.get(name, "F32")
        if v.ndim == 2 and kind != "F32":
            blocks[name] = tensors[name] = (kind, v.shape, random_blocks(kind, v.size, rng))
        else:
            tensors[name] = ("F32", v.shape, np.array(v, dtype=np.float32).tobytes())
    return write_blocks_gguf(path, tiny_kit.gguf_metadata(model), tensors), blocks


# ---- damaged and unreadable tensors ------------------------------------------------------------

def test_a_k_quant_tensor_cut_short_or_retyped_is_an_error(tiny_kit, tmp_path):
    """check_layout knew the sizes of MLX's own types only: a K-quant tensor whose type byte changed
    read the next tensor's bytes, and loaded as garbage weights without a word."""
    path, _ = kquant_gguf(tiny_kit, tmp_path / "good.gguf", "Q4_K")
    good = path.read_bytes()
    at = good.find(b"blk.0.attn_q.weight") + len(b"blk.0.attn_q.weight")  # u32 dims, 2 x u64, u32 type
    assert struct.unpack_from("<I", good, at + 20) == (12,)
    for name, damage, words in (
            ("q6k", lambda b: b[: at + 20] + struct.pack("<I", 14) + b[at + 24:], ["blk.0.attn_q.weight", "overlaps"]),
            ("q5k", lambda b: b[: at + 20] + struct.pack("<I", 13) + b[at + 24:], ["blk.0.attn_q.weight", "overlaps"]),
            ("q2k", lambda b: b[: at + 20] + struct.pack("<I", 10) + b[at + 24:], ["blk.0.attn_q.weight", "unused"]),
            ("cut", lambda b: b[:-100], ["past the end of the file", "Q4_K"])):
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(damage(good))
        raises(CorruptModelError, lambda: load(str(bad), use_drafter=False), f"{name}.gguf", "damaged", *words)


@pytest.mark.parametrize("kind", ["Q5_0", "Q5_1", "Q3_K", "Q5_K", "Q8_K", "Q8_1", "IQ1_S", "IQ4_NL", "IQ4_XS",
                                  "TQ2_0", "MXFP4"])
def test_a_type_the_loader_cannot_read_is_named(tiny_kit, tmp_path, kind):
    """MLX failed on these with "gguf_tensor_to_f16 failed" (said as a damaged file), took a valid
    file for a truncated one (Q8_1, IQ1_S), or dropped the tensors without a word (TQ2_0, MXFP4)."""
    path, _ = kquant_gguf(tiny_kit, tmp_path / "m.gguf", {"blk.0.ffn_down.weight": kind, "blk.0.attn_v.weight": "Q4_0"})
    raises(UnsupportedModelError, lambda: load(str(path), use_drafter=False), "m.gguf", "'blk.0.ffn_down.weight'",
           f"is {kind}", "cannot read", "Q4_K")
    # A mixed file (Q4_K_M of a model whose rows are not whole 256-value blocks: Q5_0 and Q8_0 beside Q4_K)
    path, _ = kquant_gguf(tiny_kit, tmp_path / "mixed.gguf", {"blk.0.attn_q.weight": kind, "blk.0.attn_k.weight": "Q5_1",
                                                                "blk.0.ffn_up.weight": kind})
    raises(UnsupportedModelError, lambda: load(str(path), use_drafter=False), f"'blk.0.attn_q.weight' is {kind} (and 2 "
           f"more: {', '.join(sorted({kind, 'Q5_1'}))})")
