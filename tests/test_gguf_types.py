"""GGUF tensor types: tiny llama GGUF files whose matrices are llama.cpp's quantized blocks (random
but well-formed bytes), loaded through `load()` and compared with a numpy reference of llama.cpp's
dequantization (ggml-quants.c, `dequantize_row_*`); damaged tensors and types the loader cannot
read fail with a one-line error that names them."""

import struct

import mlx.core as mx
import numpy as np
import pytest

from mlx.utils import tree_flatten

from redrafter_mlx import load
from redrafter_mlx.errors import CorruptModelError, RedrafterError, UnsupportedModelError
from redrafter_mlx.gguf import TENSOR_NAMES

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


def kquant_gguf(tiny_kit, path, kinds, seed=0, arch="llama"):
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
    return write_blocks_gguf(path, tiny_kit.gguf_metadata(model, arch), tensors), blocks


# ---- llama.cpp's dequantization (ggml-quants.c, dequantize_row_*), in numpy ---------------------

def _f16(b):
    return b.copy().view(np.float16).astype(np.float32)


def _k4_scales(s):
    """get_scale_min_k4: twelve bytes -> eight 6-bit scales and eight 6-bit mins."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], 1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], 1)
    return sc.astype(np.float32), mn.astype(np.float32)


def dequantize(kind, raw, shape):
    b = np.frombuffer(raw, np.uint8).reshape(-1, TYPES[kind][1])
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        o = 4 if kind in ("Q4_1", "Q5_1") else 2
        h = o + 4 if kind in ("Q5_0", "Q5_1") else o
        q = np.concatenate([b[:, h:] & 0xF, b[:, h:] >> 4], 1).astype(np.float32)  # y[j], y[j + 16]
        if h != o:  # qh: bit j (j < 16) and bit j + 16 are the fifth bits of y[j] and y[j + 16]
            qh = b[:, o:o + 4].copy().view(np.uint32)
            q += ((qh >> np.arange(32, dtype=np.uint32)) & 1) * 16
        d = _f16(b[:, 0:2])
        if kind in ("Q4_1", "Q5_1"):
            y = q * d + _f16(b[:, 2:4])
        else:
            y = (q - (8 if kind == "Q4_0" else 16)) * d
    elif kind == "Q8_0":
        y = b[:, 2:].view(np.int8).astype(np.float32) * _f16(b[:, 0:2])
    elif kind == "Q2_K":  # scales[16], qs[64], d, dmin
        d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
        y, i = [], 0
        for n in (0, 32):
            for shift in (0, 2, 4, 6):
                for half in (0, 16):
                    sc = b[:, i:i + 1]
                    i += 1
                    q = (b[:, 16 + n + half:16 + n + half + 16] >> shift) & 3
                    y.append(d * (sc & 0xF) * q - dmin * (sc >> 4))
        y = np.concatenate(y, 1)
    elif kind in ("Q4_K", "Q5_K"):  # d, dmin, scales[12], (Q5_K: qh[32],) qs[128]
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _k4_scales(b[:, 4:16])
        y = []
        for j in range(4):
            q = b[:, -128 + 32 * j:][:, :32].astype(np.float32)
            low, high = q % 16, q // 16
            if kind == "Q5_K":  # qh[l] & u1 (u1 = 1 << 2j) adds 16 to the low half, & u2 (2 << 2j) to the high
                qh = b[:, 16:48]
                low, high = low + ((qh & (1 << 2 * j)) > 0) * 16, high + ((qh & (2 << 2 * j)) > 0) * 16
            y.append(d * sc[:, 2 * j:2 * j + 1] * low - dmin * mn[:, 2 * j:2 * j + 1])
            y.append(d * sc[:, 2 * j + 1:2 * j + 2] * high - dmin * mn[:, 2 * j + 1:2 * j + 2])
        y = np.concatenate(y, 1)
    elif kind == "Q3_K":  # hmask[32], qs[64], scales[12], d
        d = _f16(b[:, 108:110])[:, 0]
        aux = b[:, 96:108].copy().view(np.uint32)  # the C code's kmask1/kmask2 shuffle of three words into four
        k1, k2 = np.uint32(0x03030303), np.uint32(0x0f0f0f0f)
        a0, a1, tmp = aux[:, 0], aux[:, 1], aux[:, 2]
        words = np.stack([(a0 & k2) | (((tmp >> 0) & k1) << 4), (a1 & k2) | (((tmp >> 2) & k1) << 4),
                          ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4), ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4)], 1)
        scales = words.astype(np.uint32).copy().view(np.int8).astype(np.float32)  # (n, 16)
        y, i, m = [], 0, 1
        for n in (0, 32):
            for shift in (0, 2, 4, 6):
                for half in (0, 16):
                    dl = d * (scales[:, i] - 32)
                    i += 1
                    q = ((b[:, 32 + n + half:48 + n + half] >> shift) & 3).astype(np.float32)
                    q -= np.where(b[:, half:half + 16] & m, 0, 4)
                    y.append(dl[:, None] * q)
                m <<= 1
        y = np.concatenate(y, 1)
    elif kind == "Q6_K":  # ql[128], qh[64], scales[16] (int8), d
        d, sc = _f16(b[:, 208:210]), b[:, 192:208].view(np.int8).astype(np.float32)
        y = np.zeros((len(b), 256), np.float32)
        for n in (0, 1):
            ql, qh, s = b[:, 64 * n:64 * n + 64], b[:, 128 + 32 * n:160 + 32 * n], sc[:, 8 * n:8 * n + 8]
            for l in range(32):
                for k, (low, shift) in enumerate(((ql[:, l] & 0xF, 0), (ql[:, l + 32] & 0xF, 2), (ql[:, l] >> 4, 4),
                                                  (ql[:, l + 32] >> 4, 6))):
                    q = (low | (((qh[:, l] >> shift) & 3) << 4)).astype(np.float32) - 32
                    y[:, 128 * n + l + 32 * k] = d[:, 0] * s[:, l // 16 + 2 * k] * q
    else:
        raise KeyError(kind)
    return y.reshape(shape)


def hf_name(gguf_name):
    """blk.0.attn_q.weight -> model.layers.0.self_attn.q_proj.weight (the loader's own table)."""
    (base, suffix), layer = gguf_name.rsplit(".", 1), None
    if base.startswith("blk."):
        _, layer, rest = base.split(".", 2)
        base = "blk.{}." + rest
    return f"{TENSOR_NAMES[base].format(layer)}.{suffix}"


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_quantized_gguf_weights_are_what_llama_cpp_computes(tiny_kit, tmp_path, kind):
    """Q4_K loaded as garbage (max error 80% of the largest weight): MLX's reader (gguflib) gave each
    second 32-value group of a block the first one's scale and minimum. Q4_K is read here now, as
    4-bit triplets with float32 scales: exact in float32. mx.load could not read Q5_0, Q5_1 and Q5_K;
    Q2_K and Q6_K arrive in float16, as they did from it."""
    path, blocks = kquant_gguf(tiny_kit, tmp_path / "m.gguf", kind)
    m = load(str(path), weight_format="float32", use_drafter=False)
    params = dict(tree_flatten(m.model.parameters()))
    tol = 1e-3 if kind in ("Q2_K", "Q3_K", "Q6_K") else 1e-6  # float16's rounding, or none
    for name, (_, shape, raw) in blocks.items():
        want, got = dequantize(kind, raw, shape), np.array(params[hf_name(name)])
        assert np.allclose(got, want, rtol=tol, atol=1e-7), (name, float(np.abs(got - want).max()))
    stored = load(str(path), weight_format="stored", use_drafter=False)
    bits = {"Q4_K": 4, "Q4_0": 4, "Q4_1": 4, "Q5_K": 5, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8}.get(kind)
    assert stored.weight_format == (f"{bits}-bit (group 32)" if bits else "float16"), stored.weight_format
    # The stored weights hold the same values (only the format was checked: scales or biases rounded or lost on
    # the way to the stored model went unseen). A GPU keeps float16 scales (or weights): their rounding.
    params = dict(tree_flatten(stored.model.parameters()))
    for name, (_, shape, raw) in blocks.items():
        key = hf_name(name)
        base = key[: -len(".weight")]
        if bits:
            scales = params[f"{base}.scales"]
            w = mx.dequantize(params[key], scales, params[f"{base}.biases"], group_size=32, bits=bits)
        else:
            w = scales = params[key]
        want, got = dequantize(kind, raw, shape), np.array(w.astype(mx.float32))
        tol = 1e-6 if scales.dtype == mx.float32 else 2e-3
        assert np.abs(got - want).max() <= tol * np.abs(want).max(), (name, float(np.abs(got - want).max()))


def test_a_q4_k_m_gguf_computes_what_its_float_weights_compute(tiny_kit, tmp_path):
    """Q4_K_M's mix (Q4_K, with Q6_K for the embeddings, output, attn_v and ffn_down) against a
    float32 GGUF of the reference dequantization: the same logits."""
    kinds = {name: "Q6_K" if any(k in name for k in ("token_embd", "output.", "attn_v", "ffn_down")) else "Q4_K"
             for name in ("token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                          "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_gate.weight",
                          "blk.0.ffn_up.weight", "blk.0.ffn_down.weight")}
    path, blocks = kquant_gguf(tiny_kit, tmp_path / "q4km.gguf", kinds)
    model = tiny_kit.model(seed=0, hidden_size=256, intermediate_size=256, num_hidden_layers=1)
    tensors = {name: ("F32", v.shape, np.array(v, dtype=np.float32).tobytes())
               for name, v in tiny_kit.gguf_tensors(model).items()}
    for name, (kind, shape, raw) in blocks.items():
        # float16 as MLX gives Q6_K: the comparison is then of the arithmetic, not of the rounding
        want = dequantize(kind, raw, shape)
        want = want.astype(np.float16) if kind == "Q6_K" else want
        tensors[name] = ("F32", shape, want.astype(np.float32).tobytes())
    ref = write_blocks_gguf(tmp_path / "f32.gguf", tiny_kit.gguf_metadata(model), tensors)
    a, b = (load(str(p), weight_format="float32", use_drafter=False) for p in (path, ref))
    ids = mx.array([[5, 9, 77, 100, 3, 200, 42]])
    la, lb = (np.array(x.model(ids)[0]) for x in (a, b))
    assert np.abs(la - lb).max() <= 1e-4 * np.abs(lb).max(), float(np.abs(la - lb).max())


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


@pytest.mark.parametrize("kind", ["Q8_K", "Q8_1", "IQ1_S", "IQ4_NL", "IQ4_XS", "TQ2_0", "MXFP4"])
def test_a_type_the_loader_cannot_read_is_named(tiny_kit, tmp_path, kind):
    """MLX failed on these with "gguf_tensor_to_f16 failed" (said as a damaged file), took a valid
    file for a truncated one (Q8_1, IQ1_S), or dropped the tensors without a word (TQ2_0, MXFP4)."""
    path, _ = kquant_gguf(tiny_kit, tmp_path / "m.gguf", {"blk.0.ffn_down.weight": kind, "blk.0.attn_v.weight": "Q4_0"})
    raises(UnsupportedModelError, lambda: load(str(path), use_drafter=False), "m.gguf", "'blk.0.ffn_down.weight'",
           f"is {kind}", "cannot read", "Q4_K")
    # Several such tensors: the first is named, the other types listed
    kinds = {"blk.0.attn_q.weight": kind, "blk.0.attn_k.weight": "IQ1_S", "blk.0.ffn_up.weight": kind}
    path, _ = kquant_gguf(tiny_kit, tmp_path / "mixed.gguf", kinds)
    raises(UnsupportedModelError, lambda: load(str(path), use_drafter=False), f"'blk.0.attn_q.weight' is {kind} (and 2 "
           f"more: {', '.join(sorted({kind, 'IQ1_S'}))})")


def test_bf16_weights_keep_their_values(tiny_kit, tmp_path):
    """MLX's reader turned BF16 into float16: a weight of 99840 became inf, one of 3e-7 lost its bits."""
    model = tiny_kit.model(seed=0)
    tensors = {}
    for name, v in tiny_kit.gguf_tensors(model).items():
        v = np.array(v, dtype=np.float32)
        if name == "blk.0.ffn_up.weight":
            v[0, :3] = [99840.0, 2.9988587e-07, -2.4914742e-05]  # each a bfloat16 value
        if v.ndim == 2:
            tensors[name] = ("BF16", v.shape, (v.view(np.uint32) >> 16).astype(np.uint16).tobytes())
        else:
            tensors[name] = ("F32", v.shape, v.tobytes())
    path = write_blocks_gguf(tmp_path / "bf16.gguf", tiny_kit.gguf_metadata(model), tensors)
    for fmt, dtype in (("stored", mx.bfloat16), ("float32", mx.float32)):
        m = load(str(path), weight_format=fmt, use_drafter=False)
        w = m.model.layers[0].mlp.up_proj.weight
        assert w.dtype == dtype
        assert np.array(w[0, :3].astype(mx.float32)).tolist() == pytest.approx([99840.0, 2.9988587e-07, -2.4914742e-05],
                                                                                 rel=1e-7)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma", "gemma3", "phi3", "mistral3", ""])
def test_a_gguf_of_another_architecture_is_refused_before_its_tensors(tiny_kit, tmp_path, arch):
    """The architecture was checked after MLX had read every tensor: a qwen2 Q4_K_M (Q5_0 and Q8_0
    beside Q4_K, its rows not being whole 256-value blocks) was refused for its Q5_0 tensors."""
    path, _ = kquant_gguf(tiny_kit, tmp_path / "m.gguf", {"blk.0.ffn_down.weight": "IQ4_XS"}, arch=arch)
    if not arch:  # (it had said "architecture '' is not supported")
        msg = raises(CorruptModelError, lambda: load(str(path), use_drafter=False), "m.gguf", "names no architecture")
    else:
        msg = raises(UnsupportedModelError, lambda: load(str(path), use_drafter=False), "m.gguf",
                     f"architecture {arch!r} is not supported", "supported: llama")
    assert "IQ4_XS" not in msg


def test_the_reader_gives_what_mx_load_gave_for_the_types_it_read_right(tiny_kit, tmp_path):
    """The GGUF reader replaced mx.load: for F32, F16, Q4_0, Q4_1 and Q8_0 tensors and every kind of
    metadata value the tests write, the same names, dtypes, shapes and values."""
    from redrafter_mlx.gguf import check_layout, read_gguf

    kinds = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q4_0", "blk.0.attn_k.weight": "Q4_1",
             "blk.0.ffn_up.weight": "Q8_0", "blk.0.ffn_down.weight": "F16"}
    path, _ = kquant_gguf(tiny_kit, tmp_path / "m.gguf", {k: v for k, v in kinds.items() if v != "F16"})
    model = tiny_kit.model(seed=1)
    f16 = tiny_kit.write_gguf(tmp_path / "h.gguf", model, dtype=mx.float16,
                              meta_extra={"tokenizer.ggml.add_bos_token": mx.array(True),
                                          "general.sizes": mx.array([1.5, 2.5], dtype=mx.float32)})
    for p in (path, f16):
        want_tensors, want_meta = mx.load(str(p), return_metadata=True)
        meta = check_layout(p).meta
        assert set(meta) == set(want_meta)
        for k, v in want_meta.items():
            if isinstance(v, mx.array):
                assert meta[k].dtype == v.dtype and meta[k].shape == v.shape and mx.array_equal(meta[k], v).item(), k
            else:
                assert type(meta[k]) is type(v) and meta[k] == v, k
        _, weights, _ = read_gguf(p)
        assert len(weights) == len(want_tensors)
        for name, w in want_tensors.items():
            got = weights[hf_name(name)]
            assert got.dtype == w.dtype and got.shape == w.shape and mx.array_equal(got, w).item(), name


@pytest.mark.parametrize("meta, words", [({"tokenizer.ggml.model": "llama"}, ["tokenizer model 'llama'"]),
                                         ({"tokenizer.ggml.pre": "qwen2"}, ["pre-tokenizer 'qwen2'"])])
def test_a_tokenizer_the_loader_cannot_build_is_refused_before_the_tensors_are_read(tiny_kit, tmp_path, monkeypatch,
                                                                                    meta, words):
    """A Llama-2, Mistral or TinyLlama GGUF (SentencePiece, tokenizer.ggml.model 'llama') was refused
    only after every tensor had been read: for an 8B file, a long wait and gigabytes for nothing."""
    from redrafter_mlx import gguf

    path = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0), meta_extra=meta)

    def read_tensors(*a):
        raise AssertionError("the tensors were read")

    monkeypatch.setattr(gguf, "_read_tensors", read_tensors)
    raises(UnsupportedModelError, lambda: load(str(path), use_drafter=False), *words)


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "Q4_0", "Q5_1", "Q8_0"])
def test_a_block_whose_scale_is_not_a_number_is_an_error(tiny_kit, tmp_path, kind):
    """A damaged float16 scale (inf or NaN; GGUF has no checksum) gave NaN weights without a word."""
    path, blocks = kquant_gguf(tiny_kit, tmp_path / "m.gguf", kind)
    good = path.read_bytes()
    _, size, _ = TYPES[kind]
    at = good.find(blocks["blk.0.attn_k.weight"][2]) + 3 * size + SCALE_BYTES[kind][-1]  # block 3's last scale
    for name, value in (("nan", 0x7E00), ("inf", 0xFC00)):
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(good[:at] + struct.pack("<H", value) + good[at + 2:])
        raises(CorruptModelError, lambda: load(str(bad), use_drafter=False), f"{name}.gguf", "damaged",
               f"'blk.0.attn_k.weight' ({kind})", "not finite", "in block 3")
