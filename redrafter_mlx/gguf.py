"""Read a llama-architecture GGUF file: config, weights and tokenizer, all from the file.

The file is read here, not by mx.load (see _read_tensors): its header walked and checked
(check_layout), its metadata in mx.load's form, its tensors with numpy: Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K and Q5_K as MLX affine-quantized triplets (`.weight` packed uint32, `.scales`,
`.biases`; group size 32), exactly llama.cpp's values. The rest renames: GGUF tensor names ->
Hugging Face / mlx-lm names (a lookup table, one place), GGUF keys -> a config.json-style dict.

GGUF stores the Q and K projections permuted for interleaved rotary embeddings, so a
model read from GGUF runs with `rope_traditional=True`.
"""

import re
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import mlx.core as mx
import numpy as np

from .errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError
from .files import refuse_lfs_pointer
from .tokenizer import check_gguf_tokenizer

GGUF_GROUP_SIZE = 32

# GGUF tensor name -> HF / mlx-lm name; "{}" is the layer number. Unknown names fail loudly.
TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "blk.{}.attn_norm": "model.layers.{}.input_layernorm",
    "blk.{}.attn_q": "model.layers.{}.self_attn.q_proj",
    "blk.{}.attn_k": "model.layers.{}.self_attn.k_proj",
    "blk.{}.attn_v": "model.layers.{}.self_attn.v_proj",
    "blk.{}.attn_output": "model.layers.{}.self_attn.o_proj",
    "blk.{}.ffn_norm": "model.layers.{}.post_attention_layernorm",
    "blk.{}.ffn_gate": "model.layers.{}.mlp.gate_proj",
    "blk.{}.ffn_up": "model.layers.{}.mlp.up_proj",
    "blk.{}.ffn_down": "model.layers.{}.mlp.down_proj",
    "rope_freqs": None,  # Llama-3 rope scaling factors: recomputed from the config
}

# GGUF metadata key (after "<arch>.") -> config.json key.
CONFIG_KEYS = {
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "attention.key_length": "head_dim",
}

SUPPORTED_ARCHITECTURES = ("llama",)


def _value(v: Any) -> Any:
    if isinstance(v, mx.array):
        return v.item() if v.ndim == 0 else v.tolist()
    return v


def _rename(name: str) -> str:
    base, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "scales", "biases", "bias"):
        base, suffix = name, ""
    m = re.match(r"blk\.(\d+)\.(.+)$", base)
    key, layer = (f"blk.{{}}.{m.group(2)}", m.group(1)) if m else (base, None)
    if key not in TENSOR_NAMES:
        raise UnsupportedModelError(f"unknown GGUF tensor {name!r}: not a llama-architecture weight")
    target = TENSOR_NAMES[key]
    if target is None:
        return None
    target = target.format(layer) if layer is not None else target
    return f"{target}.{suffix}" if suffix else target


# GGUF metadata value types: fixed sizes in bytes (8: string, 9: array, read apart)
_VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
# ggml tensor types (ggml.h's ggml_type): id -> (name, bytes per block, values per block)
GGML_TYPES = {
    0: ("F32", 4, 1), 1: ("F16", 2, 1), 2: ("Q4_0", 18, 32), 3: ("Q4_1", 20, 32), 6: ("Q5_0", 22, 32),
    7: ("Q5_1", 24, 32), 8: ("Q8_0", 34, 32), 9: ("Q8_1", 36, 32), 10: ("Q2_K", 84, 256), 11: ("Q3_K", 110, 256),
    12: ("Q4_K", 144, 256), 13: ("Q5_K", 176, 256), 14: ("Q6_K", 210, 256), 15: ("Q8_K", 292, 256),
    16: ("IQ2_XXS", 66, 256), 17: ("IQ2_XS", 74, 256), 18: ("IQ3_XXS", 98, 256), 19: ("IQ1_S", 50, 256),
    20: ("IQ4_NL", 18, 32), 21: ("IQ3_S", 110, 256), 22: ("IQ2_S", 82, 256), 23: ("IQ4_XS", 136, 256),
    24: ("I8", 1, 1), 25: ("I16", 2, 1), 26: ("I32", 4, 1), 27: ("I64", 8, 1), 28: ("F64", 8, 1),
    29: ("IQ1_M", 56, 256), 30: ("BF16", 2, 1), 34: ("TQ1_0", 54, 256), 35: ("TQ2_0", 66, 256),
    39: ("MXFP4", 17, 32),
}
_MAX_DIMS = 4  # GGML_MAX_DIMS
# The types read (see _read_tensors). mx.load failed on the others inside MLX ("gguf_tensor_to_f16
# failed", said as a damaged file), took a file for a truncated one (Q8_1, IQ1_S) or dropped their
# tensors (TQ2_0, MXFP4).
READ_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


class Layout(NamedTuple):
    architecture: str  # general.architecture ("" when absent)
    tensors: List[Tuple[str, List[int], int, int]]  # (name, dims in ggml order (row length first), type id, offset)
    data: int  # where the data section starts; a tensor's offset counts from here
    meta: Dict[str, Any]  # the metadata in mx.load's form (see _decode)


def check_layout(path) -> Layout:
    """Walk a GGUF file's header (counts, strings, metadata values, tensor infos) and check each
    piece lies inside the file, every tensor has 1 to 4 dimensions, a type ggml knows and rows of
    whole blocks, and its data fits after its offset. MLX's reader (mx.load, read_gguf's before
    _read_tensors) trusts them: a damaged header crashed the process (a segmentation fault, or an
    assertion's abort) instead of raising.
    Raises CorruptModelError; returns the metadata and the tensor table."""
    import mmap
    import struct

    path = Path(path)
    refuse_lfs_pointer(path)  # it said "damaged: no GGUF magic" of a repository cloned without git-lfs
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size < 24:
            raise CorruptModelError(f"{path} is not a GGUF file: {size} bytes")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return _walk(buf, size, path, struct)
        finally:
            buf.close()


def _walk(buf, size: int, path: Path, struct) -> Layout:
    pos = 0

    def bad(what: str, at: Optional[int] = None, short: bool = False):
        at = pos if at is None else at  # a header field: where the walk stands; a tensor's data: where it lies
        # short: what a file cut short gives (an interrupted download said only "damaged")
        raise CorruptModelError(f"{path} is damaged (not a GGUF file that can be read safely): {what} at byte {at}"
                                + (f" ({size} bytes: cut short by an interrupted download or copy? download it again)"
                                   if short else ""))

    def take(fmt: str):
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > size:
            bad("the file ends inside its header", short=True)
        out = struct.unpack_from(fmt, buf, pos)
        pos += n
        return out[0] if len(out) == 1 else out

    def skip_string():
        nonlocal pos
        n = take("<Q")
        if n > size - pos:
            bad(f"a string of {n} bytes")
        pos += n

    def read_string(limit: int) -> bytes:  # a key or a tensor's name (the vocabulary's strings are only skipped)
        start = pos
        skip_string()
        return bytes(buf[start + 8 : min(pos, start + 8 + limit)])

    def skip_value(kind: int, depth: int = 0):
        nonlocal pos
        if kind in _VALUE_SIZES:
            if pos + _VALUE_SIZES[kind] > size:
                bad("the file ends inside its metadata", short=True)
            pos += _VALUE_SIZES[kind]
        elif kind == 8:
            skip_string()
        elif kind == 9 and depth < 4:
            inner, count = take("<I"), take("<Q")
            if inner in _VALUE_SIZES:
                if count * _VALUE_SIZES[inner] > size - pos:
                    bad(f"an array of {count} values")
                pos += count * _VALUE_SIZES[inner]
            else:
                if count > (size - pos) // 8:
                    bad(f"an array of {count} values")
                for _ in range(count):
                    skip_value(inner, depth + 1)
        else:
            bad(f"a metadata value of unknown type {kind}")

    if bytes(buf[:4]) != b"GGUF":
        bad("no GGUF magic")
    pos = 4
    version = take("<I")
    if version not in (2, 3):
        bad(f"GGUF version {version} (2 and 3 are read)")
    n_tensors, n_values = take("<Q"), take("<Q")
    if n_tensors > size // 24 or n_values > size // 13:  # the smallest tensor info and key-value pair
        bad(f"{n_tensors} tensors and {n_values} metadata values in {size} bytes", short=True)
    alignment, meta = 32, {}
    for _ in range(n_values):
        key = read_string(1 << 16)
        kind = take("<I")
        start = pos
        skip_value(kind)
        value = _decode(kind, bytes(buf[start:pos]))
        if key == b"general.alignment" and kind == 4:
            alignment = int(value.item())
            if alignment == 0 or alignment & (alignment - 1):
                bad(f"an alignment of {alignment}")
        if value is not None:  # (an array of arrays: mx.load refused those)
            meta[key.decode("utf-8", "replace")] = value
    infos = []
    for _ in range(n_tensors):
        name = read_string(80).decode("utf-8", "replace")
        n_dims = take("<I")
        if not 1 <= n_dims <= _MAX_DIMS:
            bad(f"a tensor of {n_dims} dimensions")
        dims = [take("<Q") for _ in range(n_dims)]
        kind, offset = take("<I"), take("<Q")
        infos.append((name, dims, kind, offset))
    data = pos + (-pos) % alignment
    spans = []
    for name, dims, kind, offset in infos:
        count = 1
        for d in dims:
            count *= d
        if kind not in GGML_TYPES:
            bad(f"tensor {name!r} of type {kind}, no ggml type this loader knows (or a type newer than it)",
                min(data + offset, size))
        type_name, block_bytes, block_values = GGML_TYPES[kind]
        need = count // block_values * block_bytes
        if count > 2**48 or dims[0] % block_values:  # ggml: each row is whole blocks
            bad(f"tensor {name!r} of shape {dims}, not whole blocks of its type {type_name}", min(data + offset, size))
        if data + offset + need > size:
            bad(f"tensor {name!r} of shape {dims} and type {type_name} at data offset {offset}, past the end of "
                "the file", min(data + offset, size), short=True)
        if offset % alignment:
            bad(f"tensor {name!r} at data offset {offset}, not a multiple of the alignment {alignment}", data + offset)
        spans.append((offset, need, name))
    # Writers lay tensors out one after another, each padded to the alignment. A tensor whose type
    # or offset was changed reads another's bytes, or leaves bytes no tensor uses: MLX loaded such
    # a file as garbage weights without a word (GGUF has no checksum).
    spans.sort()
    for (offset, need, name), (after, _, name_after) in zip(spans, spans[1:]):
        if not 0 <= after - (offset + need) < alignment:
            what = "overlaps" if after < offset + need else "leaves unused bytes before"
            bad(f"tensor {name!r} (data offset {offset}, {need} bytes) {what} tensor {name_after!r} at data offset "
                f"{after} (a tensor's type or offset changed?)", data + offset)
    arch = meta.get("general.architecture", "")
    return Layout(arch if isinstance(arch, str) else "", infos, data, meta)


# GGUF metadata value type -> numpy dtype (8: string, 9: array)
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
          10: np.uint64, 11: np.int64, 12: np.float64}


def _decode(kind: int, raw: bytes) -> Any:
    """One metadata value (its bytes, already bounds-checked) as mx.load gave it: a number as a 0-d
    mx array, an array of numbers as a 1-d one (float64 as float32), a string as str, an array of
    strings as a list; None for an array of arrays."""
    import struct

    if kind in _NUMPY:
        a = np.frombuffer(raw, _NUMPY[kind])
        return mx.array(a.astype(np.float32) if kind == 12 else a)[0]
    if kind == 8:
        return raw[8:].decode("utf-8", "replace")
    inner, count = struct.unpack_from("<IQ", raw)
    if inner in _NUMPY:
        a = np.frombuffer(raw, _NUMPY[inner], count, 12)
        return mx.array(a.astype(np.float32) if inner == 12 else a)
    if inner != 8:
        return None
    out, at = [], 12
    for _ in range(count):
        n = struct.unpack_from("<Q", raw, at)[0]
        out.append(raw[at + 8 : at + 8 + n].decode("utf-8", "replace"))
        at += 8 + n
    return out


def check_types(path: Path, layout: Layout) -> None:
    """Refuse, by name, tensors of a type this loader cannot read (before any tensor is read)."""
    types = [(name, GGML_TYPES[kind][0]) for name, _, kind, _ in layout.tensors]
    unread = [(name, kind) for name, kind in types if kind not in READ_TYPES]
    if unread:
        name, kind = unread[0]
        more = f" (and {len(unread) - 1} more: {', '.join(sorted({k for _, k in unread[1:]}))})" if unread[1:] else ""
        raise UnsupportedModelError(
            f"{path.name}: tensor {name!r} is {kind}{more}, a GGUF type this loader cannot read (it reads "
            f"{', '.join(READ_TYPES)}): use a Q4_K_M, Q4_0 or Q8_0 GGUF of the model, or its Hugging Face folder")


def _k_scales(s: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's twelve bytes (n, 12) -> eight 6-bit scales and eight 6-bit mins (n, 8)
    (llama.cpp's get_scale_min_k4)."""
    scale = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | (s[:, 0:4] >> 6 << 4)], axis=1)
    low = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | (s[:, 4:8] >> 6 << 4)], axis=1)
    return scale.astype(np.float32), low.astype(np.float32)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (groups, 32) -> MLX's packing (groups, 4 * bits) bytes: value i in bits
    bits*i .. bits*i + bits-1 of the group's little-endian bit stream."""
    if bits == 8:
        return codes
    if bits == 4:
        return codes[:, 0::2] | (codes[:, 1::2] << 4)
    v = (codes.reshape(-1, 4, 8).astype(np.uint64) << (5 * np.arange(8, dtype=np.uint64))).sum(axis=-1)  # 8 x 5 bits
    return np.ascontiguousarray(v[..., None].view(np.uint8)[..., :5]).reshape(len(codes), 20)


def _groups(kind: str, b: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks (n, bytes) -> (packed codes (groups, 4 * bits) bytes, scales (groups,), biases
    (groups,)), each value = scale * code + bias: llama.cpp's dequantize_row_* in MLX's affine
    form, exactly.

    32-value blocks start with d (and m) in float16: Q4_0 / Q4_1 hold 16 bytes of nibbles (low:
    values 0-15, high: 16-31), value d * (code - 8) or d * code + m; Q5_0 / Q5_1 put 4 bytes of fifth
    bits before them, value d * (code - 16) or d * code + m; Q8_0 holds 32 int8, value d * q.
    Q4_K / Q5_K (256 values, eight groups): d and dmin in float16, twelve bytes of 6-bit (scale,
    min) pairs, (Q5_K: 32 bytes holding bit g of each value of group g,) 128 bytes of nibbles, each
    32 the low nibbles of one group and the high nibbles of the next; value = d*scale_g * code -
    dmin*min_g, kept in float32 (the products are not float16 numbers)."""
    n = len(b)
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        d = _f16(b[:, 0:2])[:, 0]
        if kind == "Q8_0":
            return b[:, 2:] ^ np.uint8(128), d, d * np.float16(-128)  # int8 + 128
        at = 4 if kind in ("Q4_1", "Q5_1") else 2
        bias = _f16(b[:, 2:4])[:, 0] if kind in ("Q4_1", "Q5_1") else d * np.float16(-8 if kind == "Q4_0" else -16)
        if kind in ("Q4_0", "Q4_1"):  # values 2k, 2k+1: byte k's nibbles (k < 8), or byte k-8's high ones
            even, odd = b[:, at::2], b[:, at + 1 :: 2]
            return np.concatenate([(even & 15) | (odd << 4), (even >> 4) | (odd & 0xF0)], axis=1), d, bias
        if kind in ("Q5_0", "Q5_1"):
            high = (np.ascontiguousarray(b[:, at : at + 4]).view(np.uint32) >> np.arange(32, dtype=np.uint32)) & 1
            at += 4
        nib = b[:, at:]
        codes = np.concatenate([nib & 15, nib >> 4], axis=1) | (high.astype(np.uint8) << 4)
        return _pack(codes, 5), d, bias
    d = _f16(b[:, 0:2]).astype(np.float32)  # (n, 1)
    dmin = _f16(b[:, 2:4]).astype(np.float32)
    scale, low = _k_scales(b[:, 4:16])
    nib = b[:, -128:].reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    codes = (nib & 15).reshape(n, 8, 32)
    if kind == "Q5_K":
        codes |= ((b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1) << 4
    return _pack(codes.reshape(n * 8, 32), AFFINE_TYPES[kind]), (d * scale).reshape(-1), (-dmin * low).reshape(-1)


def _dense(kind: str, b: np.ndarray) -> mx.array:
    """Q6_K, Q3_K and Q2_K blocks (n, bytes) -> values (n, 256) in float32 (llama.cpp's
    dequantize_row_*): their 16-value groups are not an MLX quantization. In MLX: numpy took 4x as
    long as mx.load.

    Q6_K: 128 bytes of low nibbles, 64 of 2-bit high parts, 16 int8 scales, d; value = d * scale *
    (q - 32). Q3_K: 32 bytes whose bit j is clear where value 32j + l is 4 less, 64 bytes of 2-bit q,
    twelve bytes of sixteen 6-bit scales (low nibbles, then 2-bit high parts), d; value = d *
    (scale - 32) * (q - 4 * (bit clear)). Q2_K: 16 bytes of 4-bit (scale, min) pairs, 64 bytes of
    2-bit q, d, dmin; value = d * scale * q - dmin * min."""
    n, b = len(b), mx.array(b)

    def f32(x, dtype=mx.float16):
        return mx.view(mx.contiguous(x), dtype).astype(mx.float32)

    shifts = mx.array([0, 2, 4, 6], dtype=mx.uint8).reshape(1, 1, 4, 1)
    if kind == "Q6_K":
        scale = f32(b[:, 192:208], mx.int8) * f32(b[:, 208:210])  # (n, 16)
        low = (b[:, :128].reshape(n, 2, 1, 64) >> mx.array([0, 4], dtype=mx.uint8).reshape(1, 1, 2, 1)) & 15
        high = (b[:, 128:192].reshape(n, 2, 1, 32) >> shifts) & 3
        q = (low.reshape(n, 2, 4, 32) | (high << 4)).astype(mx.float32) - 32  # value 128*half + 32*quarter + l
        return (scale.reshape(n, 16, 1) * q.reshape(n, 16, 16)).reshape(n, 256)
    if kind == "Q3_K":
        s = b[:, 96:108]
        low = (s[:, :8].reshape(n, 1, 8) >> mx.array([0, 4], dtype=mx.uint8).reshape(1, 2, 1)) & 15  # scales 0-7, 8-15
        high = (s[:, 8:].reshape(n, 1, 4) >> shifts.reshape(1, 4, 1)) & 3  # scale i: byte 8 + i % 4, bits 2 * (i // 4)
        scale = ((low.reshape(n, 16) | (high.reshape(n, 16) << 4)).astype(mx.float32) - 32) * f32(b[:, 108:110])
        q = ((b[:, 32:96].reshape(n, 2, 1, 32) >> shifts) & 3).astype(mx.float32)  # value 128*half + 32*j + l
        clear = ((b[:, :32].reshape(n, 1, 32) >> mx.arange(8, dtype=mx.uint8).reshape(1, 8, 1)) & 1) == 0
        q = q.reshape(n, 8, 32) - 4 * clear.astype(mx.float32)  # bit j of byte l: value 32j + l
        return (scale.reshape(n, 16, 1) * q.reshape(n, 16, 16)).reshape(n, 256)
    scale = (b[:, :16] & 15).astype(mx.float32) * f32(b[:, 80:82])
    mins = (b[:, :16] >> 4).astype(mx.float32) * f32(b[:, 82:84])
    q = ((b[:, 16:80].reshape(n, 2, 1, 32) >> shifts) & 3).astype(mx.float32)
    return (scale.reshape(n, 16, 1) * q.reshape(n, 16, 16) - mins.reshape(n, 16, 1)).reshape(n, 256)


# Types read as MLX's affine triplets (group size 32): their bits; Q4_K and Q5_K with float32 scales.
AFFINE_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}


def _check_finite(path: Path, name: str, type_name: str, finite: np.ndarray, groups_per_block: int) -> None:
    """A quantized block whose float16 scales are inf or NaN (a damaged byte: GGUF has no checksum)
    made its weights NaN without a word, and the model then generated garbage."""
    bad = np.flatnonzero(~finite)
    if len(bad):
        raise CorruptModelError(f"{path} is damaged: tensor {name!r} ({type_name}) has scales that are not finite "
                                f"numbers in {len(bad)} of its groups, the first in block {bad[0] // groups_per_block}")


def _read_tensors(path: Path, layout: Layout) -> Dict[str, mx.array]:
    """Every tensor, with GGUF names: F32, F16 and BF16 as they are, the affine types as MLX's
    quantized triplets (`name`, `<name without .weight>.scales`, `.biases`, as mx.load named them),
    Q6_K, Q3_K and Q2_K dequantized to float16 (as mx.load gave Q6_K and Q2_K).

    mx.load is not used: its reader (gguflib, MLX 0.32) gave each second 32-value group of a Q4_K
    block the first one's scale and minimum (garbage weights), turned BF16 into float16 (inf past
    65504), and cannot read Q5_0, Q5_1, Q5_K or Q3_K."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out: Dict[str, mx.array] = {}
    with np.errstate(invalid="ignore", over="ignore"):  # a damaged scale's inf or NaN: _check_finite says it
        for name, dims, kind, offset in layout.tensors:
            type_name, block_bytes, block_values = GGML_TYPES[kind]
            count = int(np.prod(dims))
            start = layout.data + offset
            raw = data[start : start + count // block_values * block_bytes]
            shape = [int(x) for x in reversed(dims)]
            if type_name in ("F32", "F16"):
                out[name] = mx.array(raw.view(np.float32 if type_name == "F32" else np.float16).reshape(shape))
            elif type_name == "BF16":
                out[name] = mx.view(mx.array(raw.view(np.uint16)), mx.bfloat16).reshape(shape)
            elif type_name in AFFINE_TYPES:
                packed, scales, biases = _groups(type_name, raw.reshape(-1, block_bytes))
                _check_finite(path, name, type_name, np.isfinite(scales) & np.isfinite(biases), block_values // 32)
                base = name[: -len(".weight")] if name.endswith(".weight") else name
                words = np.ascontiguousarray(packed).view(np.uint32)  # (groups, bits)
                out[name] = mx.array(words.reshape(*shape[:-1], -1))
                out[f"{base}.scales"] = mx.array(scales.reshape(*shape[:-1], -1))
                out[f"{base}.biases"] = mx.array(biases.reshape(*shape[:-1], -1))
            else:  # Q6_K, Q3_K, Q2_K
                values = _dense(type_name, raw.reshape(-1, block_bytes))
                _check_finite(path, name, type_name, np.array(mx.all(mx.isfinite(values), axis=1)), 1)
                out[name] = values.astype(mx.float16).reshape(shape)
    del data
    return out


def _open(path) -> Layout:
    """The checked header of a GGUF file of a supported architecture, its tensor types and tokenizer ones this
    reader takes (a Llama-2 file's SentencePiece tokenizer was said after reading every tensor)."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {path}")
    layout = check_layout(path)
    kind = layout.meta.get("general.type")
    if kind == "adapter":  # it said "unknown GGUF tensor 'blk.0.attn_q.weight.lora_a'"
        raise UnsupportedModelError(f"{path.name} is a LoRA adapter (general.type adapter), not a model: load the "
                                    "model it adapts, with the adapter merged into it (llama.cpp's llama-export-lora)")
    arch = layout.architecture  # before the tensors: a qwen2 file's Q5_0 tensors are not its problem
    if not arch.strip():  # it said "GGUF architecture '' is not supported", of a file that names none
        held = layout.meta.get("general.architecture")
        what = ("its metadata has no general.architecture, which every GGUF model holds" if held is None else
                f"its general.architecture holds {repr(held) if isinstance(held, str) else 'a value that is not text'}, not a "
                "name such as 'llama'")
        raise CorruptModelError(f"{path.name}: the GGUF file names no architecture ({what}): it is damaged or not a "
                                "model; write it again, or load the model's Hugging Face folder or hub id (org/name) "
                                "instead")
    if arch not in SUPPORTED_ARCHITECTURES:  # (it said no more: not that the model's folder loads)
        import importlib.util

        runs = bool(re.fullmatch(r"\w+", arch)) and importlib.util.find_spec(f"mlx_lm.models.{arch}") is not None
        raise UnsupportedModelError(
            f"{path.name}: GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            ": load the model's Hugging Face folder or hub id (org/name) instead"
            + (f", which mlx-lm's {arch} model runs" if runs else ", if mlx-lm has a model for it")
        )
    check_types(path, layout)
    check_gguf_tokenizer(layout.meta)
    return layout


def _config(path: Path, layout: Layout, names) -> Dict[str, Any]:
    """The config in config.json form from the metadata and the tensors' HF `names` (quantization aside)."""
    arch, meta = layout.architecture, layout.meta
    # mlx-lm's llama module runs it; rms_norm_eps is required there, llama.cpp may omit it.
    config: Dict[str, Any] = {"model_type": "llama", "rope_traditional": True, "rms_norm_eps": 1e-5}
    for key, name in CONFIG_KEYS.items():
        if f"{arch}.{key}" in meta:
            config[name] = _value(meta[f"{arch}.{key}"])
            if isinstance(config[name], (str, list)):  # it failed in mlx-lm, as "config.json does not describe ..."
                raise CorruptModelError(f"{path.name}: GGUF metadata {arch}.{key} holds {config[name]!r:.40}, not a "
                                        "number")
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in meta:
        config["vocab_size"] = len(meta["tokenizer.ggml.tokens"])
    scaling_type = _value(meta.get(f"{arch}.rope.scaling.type", "")) if f"{arch}.rope.scaling.type" in meta else ""
    if "rope_freqs.weight" in names or scaling_type == "llama3":
        # llama.cpp writes Llama-3 scaling as precomputed factors; the parameters are Llama-3.1's.
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": float(_value(meta.get(f"{arch}.rope.scaling.factor", 8.0))),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": int(
                _value(meta.get(f"{arch}.rope.scaling.original_context_length", 8192))
            ),
        }
    elif scaling_type == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(_value(meta[f"{arch}.rope.scaling.factor"]))}
    config["tie_word_embeddings"] = "lm_head.weight" not in names
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size") if k not in config]
    if missing:
        raise CorruptModelError(f"{path.name}: GGUF metadata lacks {', '.join(missing)}")
    return config


def read_gguf_config(path) -> Dict[str, Any]:
    """The config of a GGUF file (config.json form, without its quantization) from its header alone, refusing what
    read_gguf would (tensor types, tokenizer): a drafter is checked against it before read_gguf reads every tensor
    (a 70B file's 40 GB)."""
    layout = _open(path)
    names = {n for n in (_rename(name) for name, *_ in layout.tensors) if n is not None}
    return _config(Path(path), layout, names | {name for name, *_ in layout.tensors})


def read_gguf(path) -> Tuple[Dict[str, Any], Dict[str, mx.array], Dict[str, Any]]:
    """Return (config dict in config.json form, weights with HF names, raw metadata)."""
    path = Path(path)
    layout = _open(path)
    tensors, meta = _read_tensors(path, layout), layout.meta
    weights = {}
    for name, arr in tensors.items():
        new = _rename(name)
        if new is not None:
            weights[new] = arr
    config = _config(path, layout, set(weights) | set(tensors))
    quant = quantization_from_weights(weights, GGUF_GROUP_SIZE)
    if quant:
        config["quantization"] = quant
    return config, weights, meta


def quantization_from_weights(weights: Dict[str, mx.array], group_size: int) -> Dict[str, Any]:
    """Per-layer quantization in mlx-lm's config form, inferred from packed shapes.

    For a layer with in_features n: packed weight width = n * bits / 32 and scales width =
    n / group_size, so bits = 32 * packed / (scales * group_size). The most common setting
    becomes the global one; the others are per-layer overrides keyed by module path.
    """
    per_layer = {}
    for k in weights:
        if k.endswith(".scales"):
            prefix = k[: -len(".scales")]
            packed = weights[prefix + ".weight"].shape[-1]
            groups = weights[k].shape[-1]
            bits = 32 * packed // (groups * group_size)
            per_layer[prefix] = {"group_size": group_size, "bits": int(bits)}
    if not per_layer:
        return {}
    bits_list = [v["bits"] for v in per_layer.values()]
    common = max(set(bits_list), key=bits_list.count)
    quant: Dict[str, Any] = {"group_size": group_size, "bits": common}
    for prefix, q in sorted(per_layer.items()):
        if q["bits"] != common:
            quant[prefix] = q
    return quant
