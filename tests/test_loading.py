"""load(): Hugging Face folders (float and mlx-community quantized) and GGUF files the tests
write themselves, weight formats, and the registry's default model."""

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from redrafter_mlx import generate, load
from redrafter_mlx import _platform
from redrafter_mlx._platform import on_cpu
from redrafter_mlx.gguf import quantization_from_weights, read_gguf
from redrafter_mlx.loader import build_model

IDS = [[5, 9, 77, 100, 3, 266, 200, 42]]


def logits_of(model, ids=IDS):
    return np.array(model(mx.array(ids))[0].astype(mx.float32))


def assert_close(a, b, atol):
    err = float(np.abs(np.asarray(a) - np.asarray(b)).max())
    assert err <= atol, f"max abs difference {err} > {atol}"


def greedy_direct(model, ids, n):
    """Greedy continuation computed without a cache: argmax of a full forward pass each step."""
    ids, out = list(ids), []
    for _ in range(n):
        t = int(mx.argmax(model(mx.array([ids]))[0][0, -1]))
        out.append(t)
        ids.append(t)
    return out


def float_dtypes(model):
    from mlx.utils import tree_flatten

    return {v.dtype for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)}


def rounded_copy(tiny_kit, model, dtype, seed):
    """The same model with its matrices rounded to `dtype` and computed in float32."""
    ref = tiny_kit.model(seed=seed)
    w = {k: v.astype(dtype).astype(mx.float32) if v.ndim == 2 else v for k, v in tiny_kit.weights(model).items()}
    ref.load_weights(list(w.items()), strict=True)
    return ref


# ---- Hugging Face folder ---------------------------------------------------------------

def test_folder_loads_and_computes_what_was_written(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "tiny", model)
    lines = []
    m = load(str(path), progress=lines.append)
    assert lines and any("tiny" in line for line in lines)
    assert m.path == path.resolve() and m.name == str(path)
    assert m.args == model.args and not m.model.config["rope_traditional"]
    assert m.weight_format == "float32" and float_dtypes(m.model) == {mx.float32}
    assert m.context_length == 1024 and m.drafter is None
    assert m.info["source_quantization"] is None and m.info["load_seconds"] > 0
    assert tiny_kit.token_id("<|im_end|>") in m.tokenizer.eos_token_ids
    assert_close(logits_of(m.model), logits_of(model), 1e-6)
    g = generate(m, "the cat", max_tokens=8)
    assert g.tokens == greedy_direct(model, g.prompt_tokens, 8)


def test_a_load_clears_what_a_killed_convert_force_left_beside_the_folder(tiny_kit, tmp_path, monkeypatch):
    """A SIGKILLed `convert --force` (the output existed) leaves .NAME.partial-@HOST-PID-*: the next conversion
    deleted it, a load of the folder (or of a drafter folder given with drafter=) did not, while the README said
    it does. A partial of a process still running is its own: kept."""
    from redrafter_mlx.drafter import new_drafter, save_drafter

    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "tiny", model)
    drafter = tmp_path / "d"
    save_drafter(new_drafter(model.args), drafter)
    start = "import os, signal, sys; from convert.output import OutputFolder; "
    write = "[(OutputFolder(t, force=True).__enter__() / 'model.safetensors').write_text('half') for t in sys.argv[1:]]; "
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    running = subprocess.Popen([sys.executable, "-c", start + write + "print(flush=True); sys.stdin.read()", str(path)],
                               cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        running.stdout.readline()  # its partial is written
        killed = subprocess.run([sys.executable, "-c", start + write + "os.kill(os.getpid(), signal.SIGKILL)",
                                 str(path), str(drafter)], cwd=root)
        assert killed.returncode == -9
        partials = sorted(tmp_path.glob(".*.partial-@*"))
        assert len(partials) == 3
        m = load(str(path), drafter=str(drafter))
        assert m.drafter is not None
        left = list(tmp_path.glob(".*.partial-@*"))
        assert len(left) == 1 and left[0].name.startswith(".tiny.partial-@") and f"-{running.pid}-" in left[0].name
    finally:
        running.communicate("")
    monkeypatch.chdir(path)  # "." is the folder by its own name, as convert --out . names it
    load(".", use_drafter=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "tiny"]


def test_folder_generation_config_eos_ids(tiny_kit, tmp_path):
    path = tiny_kit.write_folder(tmp_path / "tiny", tiny_kit.model(seed=0))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    m = load(str(path))
    assert {7, 8, tiny_kit.token_id("<|im_end|>")} <= set(m.tokenizer.eos_token_ids)


def _folder_naming_no_end_token(tiny_kit, path, model):
    path = tiny_kit.write_folder(path, model, config_extra={"eos_token_id": None})
    for f in path.glob("*.json"):  # the tokenizer's specials renamed from the end-of-turn names the loader knows
        f.write_text(f.read_text().replace("<|im_end|>", "<|im_stop|>").replace("<|endoftext|>", "<|begin|>"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": None}))
    return path


def test_a_model_that_names_no_end_token_is_said_at_load(tiny_kit, tmp_path):
    """A model whose config and tokenizer name no end-of-sequence or end-of-turn token ran every reply on to
    max_tokens, saying nothing: the load warns (and tells progress=), and decoding is as it was."""
    import warnings

    model = tiny_kit.model(seed=0)
    path = _folder_naming_no_end_token(tiny_kit, tmp_path / "tiny", model)
    said = []
    with pytest.warns(RuntimeWarning, match="names no end-of-sequence or end-of-turn token .*no eos_token_id in "
                                            "config.json.*generation stops only at max_tokens"):
        m = load(str(path), use_drafter=False, progress=said.append)
    assert m.tokenizer.eos_token_ids == [] and sum("names no end-of-sequence" in s for s in said) == 1
    assert generate(m, "hi", max_tokens=4, mode="ar").finish_reason == "length"
    n = model.config["vocab_size"]  # a GGUF: no eos/eot/bos ids, no token marked special (control)
    gguf = tiny_kit.write_gguf(tmp_path / "m.gguf", model, meta_extra={"tokenizer.ggml.token_type": mx.array([1] * n, dtype=mx.int32)},
                               drop_meta=("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.bos_token_id"))
    with pytest.warns(RuntimeWarning, match="m.gguf names no end-of-sequence .*no tokenizer.ggml.eos_token_id"):
        assert load(str(gguf), use_drafter=False).tokenizer.eos_token_ids == []
    with warnings.catch_warnings():  # a model that names one: no warning
        warnings.filterwarnings("error", message=".*names no end-of-sequence")
        load(str(tiny_kit.write_folder(tmp_path / "ok", model)), use_drafter=False)
        load(str(tiny_kit.write_gguf(tmp_path / "ok.gguf", model)), use_drafter=False)


def test_a_command_line_says_a_load_warning_once(tiny_kit, tmp_path, capsys):
    """The command lines print load()'s progress lines, and the library warned the same words as well: Python's
    "FILE:LINE: RuntimeWarning: ..." header and the line again, above the same text in brackets."""
    import warnings

    from redrafter_mlx import RedrafterWarning
    from redrafter_mlx.__main__ import main

    path = _folder_naming_no_end_token(tiny_kit, tmp_path / "tiny", tiny_kit.model(seed=0))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert main(["--model", str(path), "--mode", "ar", "--max-tokens", "2", "hi"]) == 0
    assert not [w for w in warned if issubclass(w.category, RedrafterWarning)]
    assert capsys.readouterr().err.count("names no end-of-sequence") == 1
    with pytest.warns(RedrafterWarning, match="names no end-of-sequence"):  # the API still warns
        load(str(path), use_drafter=False)


def test_an_end_token_outside_the_vocabulary_is_said_and_ignored(tiny_kit, tmp_path):
    """An eos_token_id past the model's vocabulary (a config from another model) is a token the model never emits:
    nothing said so, and a model with no other end token ran every reply on to max_tokens. The load warns, naming the
    id and where it is named, and drops it from the stop set; with no other end token left, the one warning says
    that generation stops only at max_tokens."""
    import warnings

    model = tiny_kit.model(seed=0)
    n = model.config["vocab_size"]
    path = tiny_kit.write_folder(tmp_path / "tiny", model, config_extra={"eos_token_id": n + 5})
    said = []
    with pytest.warns(RuntimeWarning) as record:
        m = load(str(path), use_drafter=False, progress=said.append)
    [message] = [str(w.message) for w in record if "end-of-sequence" in str(w.message)]
    assert f"names end-of-sequence token id {n + 5} (eos_token_id in config.json) outside its vocabulary of {n} " \
           f"tokens (ids 0 to {n - 1})" in message and message.endswith(": ignored"), message
    assert said.count(message) == 1
    assert n + 5 not in m.tokenizer.eos_token_ids and tiny_kit.token_id("<|im_end|>") in m.tokenizer.eos_token_ids

    # no other end token: one warning, saying so (not a second one saying that none is named)
    for f in path.glob("*.json"):  # the tokenizer's specials renamed from the end-of-turn names the loader knows
        f.write_text(f.read_text().replace("<|im_end|>", "<|im_stop|>").replace("<|endoftext|>", "<|begin|>"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": None}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [n, n + 1]}))
    with pytest.warns(RuntimeWarning) as record:
        m = load(str(path), use_drafter=False)
    [message] = [str(w.message) for w in record if "end-of-sequence" in str(w.message)]
    assert f"token ids {n} (eos_token_id in generation_config.json), {n + 1} (eos_token_id in generation_config.json), " \
           f"{n + 5} (eos_token_id in config.json) outside" in message, message
    assert message.endswith("it names no other end token: generation stops only at max_tokens"), message
    assert m.tokenizer.eos_token_ids == []
    assert generate(m, "hi", max_tokens=4, mode="ar").finish_reason == "length"

    gguf = tiny_kit.write_gguf(tmp_path / "m.gguf", model, meta_extra={
        "tokenizer.ggml.eos_token_id": mx.array(n + 3, dtype=mx.uint32)})
    with pytest.warns(RuntimeWarning, match=f"m.gguf names end-of-sequence token id {n + 3} "
                                            r"\(tokenizer.ggml.eos_token_id\) outside its vocabulary"):
        load(str(gguf), use_drafter=False)
    with warnings.catch_warnings():  # ids inside the vocabulary: no warning
        warnings.filterwarnings("error", message=".*end-of-sequence")
        load(str(tiny_kit.write_folder(tmp_path / "ok", model, config_extra={"eos_token_id": n - 1})), use_drafter=False)


def test_tied_folder(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=1, tie_word_embeddings=True)
    m = load(str(tiny_kit.write_folder(tmp_path / "tied", model)))
    assert m.args.tie_word_embeddings and m.model.lm_head is None
    assert_close(logits_of(m.model), logits_of(model), 1e-6)


# internlm2 calls its untied head `output`: a config without the flag was taken as tied, and loading failed,
# "weights do not fit the model config: Received 1 parameters not in model: output.weight".
@pytest.mark.parametrize("tied,model_type", [(False, "llama"), (True, "llama"), (False, "internlm2")])
def test_config_without_tie_flag_follows_the_weights(tiny_kit, tmp_path, tied, model_type):
    model = tiny_kit.model(seed=2, tie_word_embeddings=tied, model_type=model_type)
    path = tiny_kit.write_folder(tmp_path / "t", model)
    config = json.loads((path / "config.json").read_text())
    del config["tie_word_embeddings"]
    (path / "config.json").write_text(json.dumps(config))
    m = load(str(path))
    assert m.args.tie_word_embeddings == tied
    assert_close(logits_of(m.model), logits_of(model), 1e-6)


def test_transformers5_rope_parameters(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=3, rope_theta=50000.0)
    path = tiny_kit.write_folder(tmp_path / "r", model)
    config = json.loads((path / "config.json").read_text())
    del config["rope_theta"]
    config["rope_parameters"] = {"rope_theta": 50000.0, "rope_type": "default"}
    (path / "config.json").write_text(json.dumps(config))
    m = load(str(path))
    assert m.model.model.args.rope_theta == 50000.0 and m.model.model.args.rope_scaling is None
    assert_close(logits_of(m.model), logits_of(model), 1e-6)


# ---- weight formats --------------------------------------------------------------------

@pytest.mark.parametrize("fmt,dtype,atol", [("float32", mx.float32, 1e-6), ("float16", mx.float16, 2e-2),
                                            ("bfloat16", mx.bfloat16, 1e-1), ("stored", mx.float32, 1e-6)])
def test_weight_formats_of_a_float32_folder(tiny_kit, tmp_path, fmt, dtype, atol):
    model = tiny_kit.model(seed=0)
    m = load(str(tiny_kit.write_folder(tmp_path / "f", model)), weight_format=fmt)
    assert float_dtypes(m.model) == {dtype}
    assert m.weight_format == str(dtype).replace("mlx.core.", "")
    assert_close(logits_of(m.model), logits_of(model), atol)


def test_weight_formats_of_a_float16_folder(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "h", model, dtype=mx.float16)
    stored = load(str(path), weight_format="stored")
    assert float_dtypes(stored.model) == {mx.float16} and stored.weight_format == "float16"
    as32 = load(str(path), weight_format="float32")
    assert float_dtypes(as32.model) == {mx.float32} and as32.weight_format == "float32"
    # float32 from float16 weights = the float16-rounded weights, computed exactly
    ref = tiny_kit.model(seed=0)
    w16 = {k: v.astype(mx.float16).astype(mx.float32) for k, v in tiny_kit.weights(model).items()}
    ref.load_weights(list(w16.items()), strict=True)
    assert_close(logits_of(as32.model), logits_of(ref), 1e-5)
    assert_close(logits_of(stored.model), logits_of(ref), 2e-2)


def test_auto_weight_format(tiny_kit, tmp_path, monkeypatch):
    path = tiny_kit.write_folder(tmp_path / "q", tiny_kit.model(seed=0, hidden_size=64, intermediate_size=128),
                                 quantize=(4, 32))
    m = load(str(path))  # "auto": float32 on a CPU with a fast BLAS, the stored 4-bit weights on a GPU
    fast = _platform.fast_cpu_blas()
    assert m.weight_format == ("float32" if on_cpu() and fast else "4-bit (group 32)")
    if on_cpu():
        # Without a fast BLAS the CPU keeps quantized weights as stored, but never leaves an
        # unquantized model in float16 (MLX's float16 CPU kernels are far slower than float32).
        from redrafter_mlx import loader

        monkeypatch.setattr(loader, "fast_cpu_blas", lambda: False)
        assert load(str(path)).weight_format == "4-bit (group 32)"
        f16 = tiny_kit.write_folder(tmp_path / "h", tiny_kit.model(seed=0, hidden_size=64, intermediate_size=128),
                                    dtype=mx.float16)
        assert load(str(f16)).weight_format == "float32"
        monkeypatch.setattr(loader, "fast_cpu_blas", lambda: True)
        assert load(str(path)).weight_format == "float32"


# ---- mlx-community quantized folders ---------------------------------------------------

def quantized_folder(tiny_kit, tmp_path, **quant):
    model = tiny_kit.model(seed=3, hidden_size=64, intermediate_size=128)
    path = tiny_kit.write_folder(tmp_path / "q", model, quantize=quant)  # quantizes `model` in place
    return model, path


def test_dequantized_in_float32(tiny_kit, tmp_path):
    """Float16 scales and biases (as mlx-community and GGUF store them), loaded as float32: each
    weight is scale * q + bias in float32, as llama.cpp computes it; dequantizing in float16 (as
    before) rounded each weight once more (~2e-4 of the largest)."""
    model = tiny_kit.model(seed=3, hidden_size=64, intermediate_size=128)
    path = tiny_kit.write_folder(tmp_path / "q", model, quantize=(4, 32), dtype=mx.float16)
    stored = mx.load(str(path / "model.safetensors"))
    w, scales, biases = (np.array(stored[f"model.layers.0.mlp.up_proj.{k}"]) for k in ("weight", "scales", "biases"))
    assert scales.dtype == np.float16
    q = (w[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF  # eight 4-bit values a word, low bits first
    q = q.reshape(w.shape[0], -1, 32).astype(np.float64)
    want = (q * scales[..., None].astype(np.float64) + biases[..., None].astype(np.float64)).reshape(w.shape[0], -1)
    got = np.array(load(str(path), weight_format="float32").model.layers[0].mlp.up_proj.weight)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()


def test_mlx_community_4bit_folder(tiny_kit, tmp_path):
    model, path = quantized_folder(tiny_kit, tmp_path, bits=4, group_size=32)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 4 and "model.layers.0.mlp.up_proj.scales" in mx.load(str(path / "model.safetensors"))
    stored = load(str(path), weight_format="stored")
    assert stored.weight_format == "4-bit (group 32)"
    assert stored.info["source_quantization"]["group_size"] == 32
    for mod in (stored.model.layers[0].mlp.up_proj, stored.model.layers[1].self_attn.k_proj, stored.model.lm_head):
        assert type(mod).__name__ == "QuantizedLinear" and mod.bits == 4 and mod.group_size == 32
    assert type(stored.model.decoder.embed_tokens).__name__ == "QuantizedEmbedding"
    assert_close(logits_of(stored.model), logits_of(model), 1e-5)  # the model that was written
    # Dequantized to float32: plain Linear layers computing the same function.
    deq = load(str(path), weight_format="float32")
    assert type(deq.model.layers[0].mlp.up_proj).__name__ == "Linear" and float_dtypes(deq.model) == {mx.float32}
    assert_close(logits_of(deq.model), logits_of(model), 1e-4)
    g = generate(stored, "the cat", max_tokens=6)
    assert g.tokens == greedy_direct(model, g.prompt_tokens, 6)


def test_mlx_community_mixed_precision_folder(tiny_kit, tmp_path):
    """Per-layer overrides (an 8-bit embedding) and a layer left in float (lm_head)."""
    overrides = {"model.embed_tokens": {"group_size": 32, "bits": 8}, "lm_head": False}
    model, path = quantized_folder(tiny_kit, tmp_path, bits=4, group_size=32, overrides=overrides)
    stored = load(str(path), weight_format="stored")
    assert stored.weight_format == "4-bit (group 32), 8-bit (group 32) in places"
    assert stored.model.decoder.embed_tokens.bits == 8 and stored.model.layers[0].self_attn.q_proj.bits == 4
    assert type(stored.model.lm_head).__name__ == "Linear"
    assert_close(logits_of(stored.model), logits_of(model), 1e-5)
    deq = load(str(path), weight_format="float32")
    assert_close(logits_of(deq.model), logits_of(model), 1e-4)


def test_the_format_reported_is_the_weights_not_a_config_block_that_disagrees(tiny_kit, tmp_path):
    """mlx-lm reads each layer's bits and group size from the weights: 4-bit weights under a block saying 8-bit
    group 64 ran as 4-bit but were reported as "8-bit (group 64)", and float weights under a block as quantized
    (info["source_quantization"], which the chat shows as the stored format)."""
    model, path = quantized_folder(tiny_kit, tmp_path, bits=4, group_size=32)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization": {"group_size": 64, "bits": 8}}))
    stored = load(str(path), weight_format="stored")
    assert stored.model.layers[0].mlp.up_proj.bits == 4 and stored.weight_format == "4-bit (group 32)"
    assert stored.info["source_quantization"] == {"group_size": 32, "bits": 4}
    plain = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0), config_extra={
        "quantization": {"group_size": 32, "bits": 4}})
    m = load(str(plain), weight_format="stored")
    assert m.weight_format == "float32" and m.info["source_quantization"] is None


def test_a_gguf_reached_through_a_link_to_a_file_without_the_suffix(tiny_kit, tmp_path):
    """The Hugging Face cache's snapshots link model.gguf to blobs/<hash>: the link was followed to its target, which
    has no .gguf suffix, and read as a folder ("blobs/<hash> has no config.json: not a model folder")."""
    (tmp_path / "blobs").mkdir()
    (tmp_path / "snapshots" / "rev").mkdir(parents=True)
    tiny_kit.write_gguf(tmp_path / "blobs" / "m.gguf", tiny_kit.model(seed=0)).rename(tmp_path / "blobs" / "0123abcd")
    link = tmp_path / "snapshots" / "rev" / "tiny.gguf"
    link.symlink_to(Path("..") / ".." / "blobs" / "0123abcd")
    m = load(str(link))
    assert m.resolved.kind == "gguf" and m.path.name == "tiny.gguf"
    assert m.resolved.drafter_home == link.with_suffix(".drafter")


def test_quantization_inferred_from_packed_shapes(tiny_kit):
    import mlx.nn as nn

    model = tiny_kit.model(seed=3, hidden_size=64, intermediate_size=128)
    nn.quantize(model, group_size=32, bits=4,
                class_predicate=lambda p, m: {"group_size": 32, "bits": 8} if p == "lm_head" else hasattr(m, "to_quantized"))
    quant = quantization_from_weights(tiny_kit.weights(model), 32)
    assert quant == {"group_size": 32, "bits": 4, "lm_head": {"group_size": 32, "bits": 8}}
    rebuilt, desc = build_model({**model.config, "quantization": quant}, tiny_kit.weights(model))
    assert desc == "4-bit (group 32), 8-bit (group 32) in places"
    assert_close(logits_of(rebuilt), logits_of(model), 1e-6)


# ---- GGUF --------------------------------------------------------------------------------

def test_gguf_loads_with_config_tokenizer_and_permuted_qk(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)  # half-split rope, as in HF checkpoints
    path = tiny_kit.write_gguf(tmp_path / "tiny.gguf", model)
    config, weights, meta = read_gguf(path)
    a = model.model.args
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "vocab_size"):
        assert config[key] == getattr(a, key), key
    assert config["rope_traditional"] is True and config["tie_word_embeddings"] is False
    assert config["rms_norm_eps"] == pytest.approx(a.rms_norm_eps) and config["rope_theta"] == pytest.approx(a.rope_theta)
    assert set(weights) == set(tiny_kit.weights(model)) and "quantization" not in config
    assert meta["general.architecture"] == "llama"

    m = load(str(path))
    assert m.model.config["rope_traditional"] and m.weight_format == "float32"
    # Interleaved (permuted) Q/K with traditional rope computes what the HF model computes.
    assert_close(logits_of(m.model), logits_of(model), 2e-5)
    h_ours = np.array(m.model(mx.array(IDS))[1])
    h_ref = np.array(model(mx.array(IDS))[1])
    assert_close(h_ours, h_ref, 2e-5)
    assert tiny_kit.token_id("<|im_end|>") in m.tokenizer.eos_token_ids
    g = generate(m, "the cat", max_tokens=8)
    assert g.tokens == greedy_direct(model, g.prompt_tokens, 8)


def test_gguf_and_folder_agree(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    folder = load(str(tiny_kit.write_folder(tmp_path / "f", model)))
    gguf = load(str(tiny_kit.write_gguf(tmp_path / "m.gguf", model)))
    msgs = [{"role": "user", "content": "naïve 日本 🙂"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "the cat"}]
    for prompt in ("the cat", msgs):
        assert gguf.tokenizer.prompt_ids(prompt) == folder.tokenizer.prompt_ids(prompt)
    assert gguf.tokenizer.eos_token_ids == folder.tokenizer.eos_token_ids
    a, b = generate(folder, msgs, max_tokens=10), generate(gguf, msgs, max_tokens=10)
    assert a.tokens == b.tokens and len(a.tokens) == 10 and a.text == b.text


def test_gguf_without_output_tensor_ties_embeddings(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=4, tie_word_embeddings=True)
    m = load(str(tiny_kit.write_gguf(tmp_path / "tied.gguf", model)))
    assert m.args.tie_word_embeddings
    assert_close(logits_of(m.model), logits_of(model), 2e-5)


def test_float16_gguf_weight_formats(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_gguf(tmp_path / "h.gguf", model, dtype=mx.float16)
    ref = rounded_copy(tiny_kit, model, mx.float16, seed=0)
    stored = load(str(path), weight_format="stored")
    assert stored.model.layers[0].self_attn.q_proj.weight.dtype == mx.float16
    assert stored.model.decoder.norm.weight.dtype == mx.float32  # GGUF keeps norms in float32
    as32 = load(str(path), weight_format="float32")
    assert float_dtypes(as32.model) == {mx.float32}
    assert_close(logits_of(as32.model), logits_of(ref), 2e-5)
    as16 = load(str(path), weight_format="float16")
    assert float_dtypes(as16.model) == {mx.float16}
    assert_close(logits_of(as16.model), logits_of(ref), 2e-2)
    assert_close(logits_of(stored.model), logits_of(ref), 2e-2)


def test_gguf_add_bos_token(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_gguf(tmp_path / "bos.gguf", model,
                               meta_extra={"tokenizer.ggml.add_bos_token": mx.array(True)})
    m = load(str(path))
    bos = tiny_kit.token_id("<|endoftext|>")
    assert m.tokenizer.encode("the")[0] == bos and m.tokenizer.encode("the", add_special_tokens=False)[0] != bos


# ---- the registry's default model ------------------------------------------------------

def test_default_model(default_model):
    m = default_model
    assert m.name == "smollm2-135m" and m.path.suffix == ".gguf"
    assert m.model.config["rope_traditional"] and m.args.hidden_size == 576 and m.args.num_hidden_layers == 30
    assert m.model.config["num_key_value_heads"] == 3 and m.args.tie_word_embeddings
    assert m.info["source_quantization"]["bits"] == 4
    assert m.info["source_quantization"]["model.embed_tokens"]["bits"] == 8
    assert m.weight_format == ("float32" if on_cpu() else "4-bit (group 32), 8-bit (group 32) in places")
    assert m.context_length == 8192
    im_end = m.tokenizer.hf.convert_tokens_to_ids("<|im_end|>")
    assert im_end in m.tokenizer.eos_token_ids
    g = generate(m, "What is the capital of France? Answer in one word.", mode="ar", max_tokens=16)
    assert "Paris" in g.text and g.finish_reason in ("eos", "length")


def test_default_model_stored_4bit(default_model):
    """The stored GGUF weights (4-bit linears, 8-bit embedding) give the dequantized model's
    greedy reply. On the CPU they compute in float32 (float16 CPU kernels are ~25x slower),
    on a GPU in the file's float16."""
    from mlx.utils import tree_flatten

    stored = load(str(default_model.path), weight_format="stored", use_drafter=False)
    layer = stored.model.decoder.layers[0]
    assert type(layer.mlp.up_proj).__name__ == "QuantizedLinear" and layer.mlp.up_proj.bits == 4
    assert stored.model.decoder.embed_tokens.bits == 8
    act = mx.float32 if on_cpu() else mx.float16
    floats = {v.dtype for _, v in tree_flatten(stored.model.parameters()) if mx.issubdtype(v.dtype, mx.floating)}
    assert floats == {act} and layer.mlp.up_proj.scales.dtype == act
    prompt = "What is the capital of France? Answer in one word."
    a = generate(stored, prompt, mode="ar", max_tokens=8)
    b = generate(default_model, prompt, mode="ar", max_tokens=8)
    assert a.tokens == b.tokens and "Paris" in a.text


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not (_platform.mkl_library() or ctypes.util.find_library("openblas")),
    reason="a fast BLAS is only swapped in on Linux with MKL or OpenBLAS installed",
)
def test_importing_mlx_before_redrafter_warns_about_the_slow_blas():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "REDRAFTER_NO_OPENBLAS", "REDRAFTER_BLAS")}
    strict = "import warnings; warnings.simplefilter('error')\n"

    def run(code):
        return subprocess.run([sys.executable, "-c", strict + code], capture_output=True, text=True, env=env)

    late = run("import mlx.core\nimport redrafter_mlx")
    assert late.returncode != 0 and "import redrafter_mlx first" in late.stderr
    first = run("import redrafter_mlx\nimport mlx.core\nfrom redrafter_mlx._platform import FAST_BLAS\n"
                "assert FAST_BLAS in ('MKL', 'OpenBLAS')")
    assert first.returncode == 0, first.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a fast BLAS is only swapped in on Linux")
@pytest.mark.parametrize("want,named", [("openblas", "OpenBLAS"), ("mkl", "MKL")])
def test_a_blas_asked_for_by_name_and_not_found_is_said(monkeypatch, want, named):
    """REDRAFTER_BLAS=openblas (or mkl) on a machine without that library used MLX's own BLAS, several times slower
    on the CPU, saying nothing."""
    import warnings

    monkeypatch.setenv("REDRAFTER_BLAS", want)
    monkeypatch.delenv("REDRAFTER_NO_OPENBLAS", raising=False)
    monkeypatch.setattr(_platform, "_load", lambda path: False)
    monkeypatch.setattr(_platform, "mkl_library", lambda: None)
    with pytest.warns(RuntimeWarning, match=f"REDRAFTER_BLAS={want}: no {named} library found"):
        assert _platform._load_fast_blas() is None
    monkeypatch.setenv("REDRAFTER_BLAS", "auto")  # (auto falls back quietly: macOS, and a machine with neither)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _platform._load_fast_blas() is None


def test_help_of_load_says_what_each_argument_means_and_its_default():
    """help(load) gave no default for any argument but name (drafter, use_drafter, weight_format, progress)."""
    from helpers import undocumented_settings

    assert undocumented_settings(load, skip=()) == {}
