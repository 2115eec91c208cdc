"""`python -m convert`: tiny checkpoints built here, converted, and checked against their source.

- A random transformers LlamaForCausalLM (tiny config) saved as safetensors and as sharded
  `.bin`: the MLX model's fp32 logits match PyTorch's on the same tokens (and mlx-lm loads
  the folder too).
- A random Apple-format drafter written from a small torch module that follows the paper's
  equations: after conversion its draft logits match the torch reference.
- A 4-bit conversion loads and generates (ReDrafter output equal to plain decoding).
- The default GGUF model converts to a folder that redrafter_mlx and mlx-lm both load, with
  the same greedy tokens.
- Bad inputs: one `python -m convert: error:` line, exit code != 0, no output folder left behind.

Tests that need torch skip without it (`pip install 'redrafter-mlx[convert]'`); one tiny
safetensors checkpoint written with MLX keeps the converter covered without torch.
"""

import fnmatch
import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from convert.cli import main as convert_main
from convert.output import OutputFolder
from convert.tokenizer import VICUNA_SYSTEM
from redrafter_mlx import generate, load
from redrafter_mlx.config import DrafterArgs
from redrafter_mlx.drafter import Drafter, new_drafter, save_drafter
from redrafter_mlx.loader import new_model

from helpers import ctrl_c_as_renamed_to, piped, write_shards

H, V, LAYERS = 64, 128, 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
TOKENS = [1, 40, 71, 80, 80, 83, 3, 90, 100, 45, 60, 61, 62, 9]
ERROR = "python -m convert: error: "  # how every error line begins, as the other tools' "PROG: error: "


# ---- helpers ------------------------------------------------------------------------------

def run_convert(capsys, *argv):
    """Run the CLI in-process: (exit code, stderr lines)."""
    rc = convert_main([*map(str, argv), "--quiet"])
    err = capsys.readouterr().err
    return rc, [line for line in err.splitlines() if line.strip()]


def assert_clean_failure(rc, lines, out: Path, *needles):
    assert rc != 0
    assert len(lines) == 1 and lines[0].startswith(ERROR), lines
    for n in needles:
        assert n in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def write_tokenizer(folder: Path):
    """A character-level tokenizer with a chat template, saved the Hugging Face way."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(folder))


def torch_llama(seed=0):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=5000.0,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper logits than the tiny init gives
        model.lm_head.weight.mul_(20)
    return model


class AppleDrafter:
    """Apple's drafter as a torch module (the paper's equations, Apple's tensor names)."""

    def __new__(cls, hidden, vocab, exit_dim, layers, seed=0):
        torch = pytest.importorskip("torch")
        nn = torch.nn

        class ResBlock(nn.Module):
            def __init__(self, dim):
                super().__init__()
                self.linear = nn.Linear(dim, dim, bias=True)

            def forward(self, x):
                return x + nn.functional.silu(self.linear(x))

        class Drafter(nn.Module):
            def __init__(self):
                super().__init__()
                if exit_dim != 2 * hidden:
                    self.input_proj = nn.Linear(2 * hidden, exit_dim, bias=True)
                self.lm_head = nn.Sequential(*[ResBlock(exit_dim) for _ in range(layers)],
                                             nn.Linear(exit_dim, vocab, bias=False))
                self.rnn_u = nn.Linear(hidden, hidden, bias=True)
                self.rnn_w = nn.Linear(hidden, hidden, bias=False)

            def forward(self, h, embs):
                """h (H,), embs (K, H) -> logits (K, V): s_k = silu(W e_k + U s_{k-1} + b); head on [h, s_k]."""
                s = torch.zeros_like(h)
                out = []
                for e in embs:
                    s = nn.functional.silu(self.rnn_w(e) + self.rnn_u(s))
                    x = torch.cat([h, s])
                    if hasattr(self, "input_proj"):
                        x = self.input_proj(x)
                    out.append(self.lm_head(x))
                return torch.stack(out)

        torch.manual_seed(seed)
        d = Drafter().eval()
        with torch.no_grad():
            d.lm_head[-1].weight.mul_(10)
        return d


def write_drafter(folder: Path, module, config: dict, fmt="safetensors", rename=None):
    import torch

    folder.mkdir(parents=True)
    state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
    if rename:
        state = {rename(k): v for k, v in state.items()}
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))
    elif fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        torch.save(state, folder / "model.pt")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_numpy_drafter(folder: Path, hidden, vocab, exit_dim, layers, config=None, rename=None, seed=0):
    """An Apple-format drafter (random weights) written with MLX alone, no torch."""
    rng = np.random.default_rng(seed)
    w = {"rnn_u.weight": (hidden, hidden), "rnn_u.bias": (hidden,), "rnn_w.weight": (hidden, hidden),
         f"lm_head.{layers}.weight": (vocab, exit_dim)}
    for i in range(layers):
        w.update({f"lm_head.{i}.linear.weight": (exit_dim, exit_dim), f"lm_head.{i}.linear.bias": (exit_dim,)})
    if exit_dim != 2 * hidden:
        w.update({"input_proj.weight": (exit_dim, 2 * hidden), "input_proj.bias": (exit_dim,)})
    arrays = {(rename(k) if rename else k): mx.array(rng.normal(size=shape).astype(np.float32) * 0.1)
              for k, shape in w.items()}
    folder.mkdir(parents=True)
    mx.save_safetensors(str(folder / "model.safetensors"), arrays)
    (folder / "config.json").write_text(json.dumps(config if config is not None else {
        "hidden_size": hidden, "vocab_size": vocab, "exit_dim": exit_dim, "num_draft_layers": layers, "rnn": True}))
    return folder


# ---- fixtures -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlx_ckpt(tmp_path_factory):
    """A Hugging Face-style checkpoint written with MLX alone (no torch): (folder, source model)."""
    config = dict(model_type="llama", hidden_size=H, num_hidden_layers=1, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=V, tie_word_embeddings=True, rms_norm_eps=1e-5)
    model = new_model(config, 3)
    src = tmp_path_factory.mktemp("mlx") / "checkpoint"
    src.mkdir()
    mx.save_safetensors(str(src / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (src / "config.json").write_text(json.dumps(config))
    write_tokenizer(src)
    return src, model


@pytest.fixture(scope="module")
def llama():
    return torch_llama()


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory, llama):
    """The same tiny model as a safetensors folder and as a sharded pytorch_model-*.bin folder."""
    import torch

    root = tmp_path_factory.mktemp("hf")
    st = root / "safetensors"
    llama.save_pretrained(str(st))
    write_tokenizer(st)
    pt = root / "bin"
    pt.mkdir()
    state = llama.state_dict()
    keys = sorted(state)
    shards = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
    weight_map = {}
    for i, names in enumerate(shards, 1):
        name = f"pytorch_model-{i:05d}-of-00002.bin"
        torch.save({k: state[k].contiguous() for k in names}, pt / name)
        weight_map.update({k: name for k in names})
    (pt / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copy(st / "config.json", pt / "config.json")
    write_tokenizer(pt)
    return {"safetensors": st, "bin": pt}


@pytest.fixture(scope="module")
def apple_drafter(tmp_path_factory):
    module = AppleDrafter(H, V, exit_dim=96, layers=2, seed=1)
    folder = tmp_path_factory.mktemp("drafter") / "apple"
    config = {"model_type": "recurrent_drafting_drafter", "hidden_size": H, "vocab_size": V, "exit_dim": 96,
              "num_draft_layers": 2, "num_lookback_tokens": -1, "rnn": True, "emb_norm": False}
    return module, write_drafter(folder, module, config)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, hf_dirs, apple_drafter):
    """The safetensors model and the Apple drafter, converted to fp32."""
    out = tmp_path_factory.mktemp("out") / "model"
    rc = convert_main(["--model", str(hf_dirs["safetensors"]), "--drafter", str(apple_drafter[1]),
                       "--dtype", "float32", "--out", str(out), "--quiet"])
    assert rc == 0
    return out


def torch_logits_hidden(llama, tokens):
    import torch

    with torch.no_grad():
        out = llama(torch.tensor([tokens]), output_hidden_states=True)
    return out.logits[0].numpy(), out.hidden_states[-1][0].numpy()


# ---- base model ---------------------------------------------------------------------------

def test_help_shows_examples():
    proc = subprocess.run([sys.executable, "-m", "convert", "--help"], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0
    assert "examples:" in proc.stdout and "--quantize" in proc.stdout and "--drafter" in proc.stdout
    # what an interrupted conversion leaves, and what --force does to a link, are said there
    text = " ".join(proc.stdout.split())
    assert "an error, Ctrl-C, SIGTERM or SIGHUP leaves nothing" in text and "the link stays" in text
    assert "weights' dtype, the drafter's too" in text
    assert "model*.safetensors or pytorch_model*.bin" in text  # (it said *.safetensors: other names are not read)
    assert "a GGUF is first dequantized, to --dtype or else float16" in text  # (it said float16, whatever --dtype)
    assert "pytorch_model.bin or model.pt, or a hub id of one" in text  # (--drafter org/name is fetched too)


@pytest.mark.parametrize("option", ["--model", "--drafter", "--base", "--out", "--chat-template"])
def test_an_empty_argument_is_named(tmp_path, capsys, monkeypatch, mlx_ckpt, option):
    """An option given as "" (`--model "$MODEL"` with the variable unset) was read as the folder you are in, or as
    not given: `--out ""` said the current folder "already exists", `--model ""` "nothing to convert: give --model",
    and `--chat-template ""` was ignored, converting with the checkpoint's own template."""
    monkeypatch.chdir(tmp_path)
    args = {"--model": mlx_ckpt[0], "--out": tmp_path / "out"}
    if option in ("--drafter", "--base"):
        args = {"--drafter": tmp_path / "d", "--base": mlx_ckpt[0], "--out": tmp_path / "out"}
    args[option] = ""
    with pytest.raises(SystemExit) as e:
        convert_main([str(a) for pair in args.items() for a in pair])
    assert e.value.code == 2
    assert f"{ERROR}{option} is empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_safetensors_checkpoint_logits_match_pytorch(converted, llama):
    files = sorted(p.name for p in converted.iterdir())
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "manifest.json",
                 "generation_config.json", "drafter"):
        assert name in files
    assert "chat_template" in json.loads((converted / "tokenizer_config.json").read_text())
    m = load(str(converted), weight_format="float32")
    logits, hidden = m.model(mx.array([TOKENS]))
    want_logits, want_hidden = torch_logits_hidden(llama, TOKENS)
    np.testing.assert_allclose(np.array(logits[0]), want_logits, atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(np.array(hidden[0]), want_hidden, atol=2e-4, rtol=1e-4)
    assert m.tokenizer.prompt_ids("hi") == m.tokenizer.hf.encode("<user>hi<assistant>", add_special_tokens=False)

    manifest = json.loads((converted / "manifest.json").read_text())
    assert manifest["base"]["format"] == "safetensors" and manifest["base"]["dtype"] == "float32"
    assert manifest["base"]["quantization"] is None
    assert len(manifest["base"]["sha256"]["model.safetensors"]) == 64
    assert manifest["drafter"]["config"]["exit_dim"] == 96
    assert "mlx-lm" in manifest["versions"]


def test_mlx_lm_loads_the_output(converted, llama):
    from mlx_lm import load as mlx_lm_load

    model, _ = mlx_lm_load(str(converted))
    want, _ = torch_logits_hidden(llama, TOKENS)
    np.testing.assert_allclose(np.array(model(mx.array([TOKENS]))[0]), want, atol=2e-4, rtol=1e-4)


def test_sharded_bin_checkpoint_logits_match_pytorch(tmp_path, capsys, hf_dirs, llama):
    out = tmp_path / "from-bin"
    rc, lines = run_convert(capsys, "--model", hf_dirs["bin"], "--dtype", "float32", "--chat-template", "vicuna",
                            "--out", out)
    assert rc == 0, lines
    assert not (out / ".pytorch-as-safetensors").exists()
    m = load(str(out), weight_format="float32", use_drafter=False)
    logits, _ = m.model(mx.array([TOKENS]))
    want, _ = torch_logits_hidden(llama, TOKENS)
    np.testing.assert_allclose(np.array(logits[0]), want, atol=2e-4, rtol=1e-4)
    text = m.tokenizer.hf.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                              tokenize=False)
    assert text == f"<s>{VICUNA_SYSTEM} USER: hi ASSISTANT:"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["base"]["format"] == "pytorch"
    assert set(manifest["base"]["sha256"]) >= {"pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"}


def test_reading_bin_files_says_what_it_reads(tmp_path, capsys, hf_dirs):
    """.bin shards are read whole by torch before the bar counts a tensor of them: a single pytorch_model.bin of a
    7B model sat minutes at "reading .bin: 0 tensor", saying neither what nor how much. A line says so first."""
    rc = convert_main(["--model", str(hf_dirs["bin"]), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 0, err
    size = sum(f.stat().st_size for f in hf_dirs["bin"].glob("pytorch_model-*.bin")) / 1e6
    assert f"[convert] reading 2 .bin files ({size:.1f} MB) with torch, each whole before its tensors are counted, " \
           "and rewriting them as safetensors" in err.splitlines(), err


def test_quantized_conversion_loads_and_generates(tmp_path, capsys, hf_dirs, apple_drafter):
    out = tmp_path / "q4"
    rc, lines = run_convert(capsys, "--model", hf_dirs["safetensors"], "--drafter", apple_drafter[1], "--quantize",
                            "--q-bits", "4", "--q-group-size", "32", "--out", out)
    assert rc == 0, lines
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    m = load(str(out), weight_format="stored")
    assert m.weight_format.startswith("4-bit (group 32)")
    assert m.drafter is not None
    ar = generate(m, TOKENS, mode="ar", max_tokens=12)
    rd = generate(m, TOKENS, mode="redrafter", max_tokens=12, beam_width=3, beam_length=3)
    assert len(ar.tokens) == 12 and rd.tokens == ar.tokens


def test_a_dtype_dequantizes_a_quantized_folder(tmp_path, capsys, mlx_ckpt):
    """`--dtype float32` of a 4-bit MLX folder (an mlx-community model, or one converted with --quantize) cast the
    scales and kept the 4-bit weights, with a manifest saying "dtype": "float32": the option half ignored. A dtype
    dequantizes it, as it does a GGUF's."""
    q4 = tmp_path / "q4"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--quantize", "--out", q4)
    assert rc == 0, lines
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", q4, "--dtype", "float32", "--out", out)
    assert rc == 0, lines
    weights = mx.load(str(out / "model.safetensors"))
    assert not [k for k in weights if k.endswith((".scales", ".biases"))]
    assert {v.dtype for v in weights.values()} == {mx.float32}
    assert "quantization" not in json.loads((out / "config.json").read_text())
    assert json.loads((out / "manifest.json").read_text())["base"]["quantization"] is None
    stored = mx.load(str(q4 / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    expected = mx.dequantize(stored[f"{name}.weight"], stored[f"{name}.scales"], stored[f"{name}.biases"], 64, 4)
    assert mx.allclose(weights[f"{name}.weight"], expected.astype(mx.float32)).item()
    rc, lines = run_convert(capsys, "--model", q4, "--out", tmp_path / "kept")  # without a dtype it stays 4-bit
    assert rc == 0 and json.loads((tmp_path / "kept" / "config.json").read_text())["quantization"]["bits"] == 4


def test_a_dtype_with_quantize_requantizes_a_quantized_folder(tmp_path, capsys, mlx_ckpt):
    """`--dtype X --quantize` of a quantized folder was refused ("already quantized; convert it without
    --quantize"), though a dtype dequantizes one: it is dequantized to that dtype, then quantized as asked (a note
    says the two quantizations' errors add up); --quantize alone is still refused, saying how to requantize."""
    q4 = tmp_path / "q4"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--quantize", "--out", q4)
    assert rc == 0, lines
    out = tmp_path / "q8"
    rc, lines = run_convert(capsys, "--model", q4, "--dtype", "float32", "--quantize", "--q-bits", "8",
                            "--q-group-size", "32", "--out", out)
    assert rc == 0, lines
    assert len(lines) == 1 and "already quantized" in lines[0] and "the unquantized model" in lines[0], lines
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    assert json.loads((out / "manifest.json").read_text())["base"]["quantization"]["bits"] == 8
    stored, weights = mx.load(str(q4 / "model.safetensors")), mx.load(str(out / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    was = mx.dequantize(stored[f"{name}.weight"], stored[f"{name}.scales"], stored[f"{name}.biases"], 64, 4)
    now = mx.dequantize(weights[f"{name}.weight"], weights[f"{name}.scales"], weights[f"{name}.biases"], 32, 8)
    assert weights[f"{name}.scales"].shape[-1] == 128 // 32  # (intermediate size 128)
    assert mx.allclose(now, was, atol=float(mx.abs(was).max()) / 100).item()
    m = load(str(out), weight_format="stored")
    assert m.weight_format.startswith("8-bit (group 32)")
    again = tmp_path / "again"
    rc, lines = run_convert(capsys, "--model", q4, "--quantize", "--out", again)
    assert_clean_failure(rc, lines, again, "already quantized", "give --dtype too")


@pytest.mark.parametrize("refused", ["quantized", "model_file"])
def test_a_base_model_refused_by_its_config_is_refused_before_any_work(tmp_path, capsys, mlx_ckpt, refused):
    """A quantized folder given --quantize, and a config.json whose model_file asks to run code, were refused only
    once the drafter had been converted and hashed and the tokenizer written (minutes for a large drafter)."""
    src = tmp_path / "src"
    if refused == "quantized":
        assert run_convert(capsys, "--model", mlx_ckpt[0], "--quantize", "--out", src)[0] == 0
        argv = ["--quantize"]
    else:
        shutil.copytree(mlx_ckpt[0], src)
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "model_file": "custom.py"}))
        argv = []
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    out = tmp_path / "out"
    rc = convert_main(["--model", str(src), "--drafter", str(drafter), *argv, "--out", str(out)])
    lines = capsys.readouterr().err.splitlines()
    assert rc == 2 and lines[-1].startswith(ERROR), lines
    assert ("already quantized" if refused == "quantized" else "model_file") in lines[-1]
    assert not [line for line in lines if line.startswith(("[convert] drafter", "[convert] tokenizer"))], lines
    assert not out.exists()


def write_awq(src: Path, mlx_ckpt, bits=4, group=32):
    """The MLX checkpoint as AutoAWQ writes one (random packed weights; config.json's quantization_config)."""
    shutil.copytree(mlx_ckpt[0], src)
    rng = np.random.default_rng(0)
    weights = {}
    for name, v in tree_flatten(mlx_ckpt[1].parameters()):
        if name.endswith("proj.weight"):
            o, i = v.shape
            prefix = name[: -len(".weight")]
            weights[f"{prefix}.qweight"] = mx.array(rng.integers(0, 2**31 - 1, (i, o // 8)).astype(np.int32))
            weights[f"{prefix}.qzeros"] = mx.array(rng.integers(0, 2**31 - 1, (i // group, o // 8)).astype(np.int32))
            weights[f"{prefix}.scales"] = mx.array((rng.random((i // group, o)) * 0.01).astype(np.float16))
        else:
            weights[name] = v
    mx.save_safetensors(str(src / "model.safetensors"), weights)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": True}
    (src / "config.json").write_text(json.dumps(config))
    return src


def test_quantize_refuses_an_awq_checkpoint(tmp_path, capsys, mlx_ckpt):
    """An AutoAWQ/GPTQ checkpoint (config.json's quantization_config, which mlx-lm loads as quantized layers) took
    --quantize --q-bits 8 and kept its 4-bit layers, quantizing only the embeddings: the option half ignored."""
    src = write_awq(tmp_path / "awq", mlx_ckpt)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--quantize", "--q-bits", "8", "--out", out)
    assert_clean_failure(rc, lines, out, "already quantized (awq)", "without --quantize")
    rc, lines = run_convert(capsys, "--model", src, "--out", out)  # as it is, it converts
    assert rc == 0, lines
    # ... into MLX's own 4-bit layers that compute what the AWQ checkpoint does (it checked the exit status alone)
    converted = load(str(out), weight_format="stored", use_drafter=False)
    assert converted.weight_format.startswith("4-bit (group 32)")
    assert not [k for k in mx.load(str(out / "model.safetensors")) if k.endswith((".qweight", ".qzeros"))]
    ids = mx.array([TOKENS])
    want, _ = load(str(src), weight_format="stored", use_drafter=False).model(ids)
    assert mx.array_equal(converted.model(ids)[0], want).item()


def test_a_quantization_mlx_lm_cannot_read_is_named(tmp_path, capsys, mlx_ckpt):
    """An 8-bit AWQ checkpoint said "the tensors do not fit config.json: Only bits=8 is supported for AutoAWQ/GPTQ
    models" (mlx-lm's message names the bits it was given)."""
    src = write_awq(tmp_path / "awq", mlx_ckpt, bits=8)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, "its awq quantization", "4-bit awq only, and this one is 8-bit",
                         "convert the unquantized model")
    assert "do not fit" not in lines[0]


def test_safetensors_without_torch(tmp_path, capsys, mlx_ckpt):
    """A checkpoint and a drafter written by MLX alone (no torch anywhere): the drafter in this
    project's own format (shared head, draft vocabulary) is packed in; both match their sources."""
    src, src_model = mlx_ckpt
    drafter = new_drafter(src_model.args, lm_head="shared", seed=4)
    drafter.set_draft_vocab([3, 5, 7, 40, 41])
    save_drafter(drafter, tmp_path / "ours")
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--drafter", tmp_path / "ours", "--out", out)
    assert rc == 0, lines
    m = load(str(out), weight_format="float32")
    got, h = m.model(mx.array([TOKENS]))
    want, _ = src_model(mx.array([TOKENS]))
    assert mx.allclose(got, want, atol=1e-5).item()
    s = mx.ones((1, H))
    assert m.drafter.args.draft_vocab_size == 5
    assert mx.allclose(m.drafter.draft_logits(h[:, -1], s, m.model), drafter.draft_logits(h[:, -1], s, src_model),
                       atol=1e-5).item()


def test_drafter_that_cannot_run_is_refused(tmp_path, capsys, mlx_ckpt):
    """A drafter whose draft vocabulary holds a negative id (it crashed the process at the first
    draft) or whose embedding scale is not finite: convert refuses it as loading does, and writes
    nothing (it used to write the folder)."""
    src, src_model = mlx_ckpt
    drafter = new_drafter(src_model.args, lm_head="shared", seed=4)
    drafter.set_draft_vocab([3, -5, 7])
    save_drafter(drafter, tmp_path / "negative")
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--drafter", tmp_path / "negative", "--out", out)
    assert_clean_failure(rc, lines, out, "draft_vocab", "outside the vocabulary")
    drafter.set_draft_vocab(None)
    save_drafter(drafter, tmp_path / "nan", {"embed_scale": float("nan")})
    rc, lines = run_convert(capsys, "--model", src, "--drafter", tmp_path / "nan", "--out", out)
    assert_clean_failure(rc, lines, out, "embed_scale")


def test_interrupted_conversion_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with OutputFolder(tmp_path / "out") as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


# ---- drafter ------------------------------------------------------------------------------

def drafter_reference_check(m, module, llama, tokens=TOKENS, k=3):
    """Draft logits of the converted drafter vs the torch module, from torch's own h and embeddings."""
    import torch

    _, hidden = torch_logits_hidden(llama, tokens)
    t = 5
    h = hidden[t]
    embs = llama.model.embed_tokens.weight.detach().numpy()[tokens[t + 1: t + 1 + k]]
    with torch.no_grad():
        want = module(torch.tensor(h), torch.tensor(embs)).numpy()
    got = m.drafter(mx.array(h)[None, None], mx.array(embs)[None, None], m.model)[0, 0]
    np.testing.assert_allclose(np.array(got), want, atol=2e-4, rtol=1e-4)
    # The same through MLX's own hidden state and embeddings.
    mh = m.model.hidden(mx.array([tokens]))[0, t]
    me = m.model.embed(mx.array(tokens[t + 1: t + 1 + k]))
    got2 = m.drafter(mh[None, None], me[None, None], m.model)[0, 0]
    np.testing.assert_allclose(np.array(got2), want, atol=5e-4, rtol=1e-3)


def test_apple_drafter_logits_match_torch_reference(converted, apple_drafter, llama):
    m = load(str(converted), weight_format="float32")
    assert m.drafter_path == converted / "drafter"
    assert m.drafter.args.exit_dim == 96 and m.drafter.args.num_draft_layers == 2
    drafter_reference_check(m, apple_drafter[0], llama)
    # the checkpoint names no base family: the one it was converted with is recorded (it was left "", so
    # another family of the same sizes took the drafter without a word)
    assert json.loads((converted / "drafter" / "config.json").read_text())["base_model_type"] == "llama"


VARIANTS = {
    # TensorRT-LLM's alternative names, and a config with fields left out (inferred from shapes).
    "bin-lm_heads": ("bin", lambda k: k.replace("lm_head.", "lm_heads.").replace("input_proj.", "input_projs."),
                     {"rnn": True}),
    "pt-0-prefix": ("pt", lambda k: k.replace("lm_head.", "0."), {"hidden_size": H, "exit_dim": -1}),
    "safetensors-drafter-prefix": ("safetensors", lambda k: "drafter." + k, {"vocab_size": V}),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_drafter_alone_in_other_formats(tmp_path, capsys, converted, llama, variant):
    fmt, rename, config = VARIANTS[variant]
    module = AppleDrafter(H, V, exit_dim=2 * H, layers=1, seed=2)
    src = write_drafter(tmp_path / "src", module, config, fmt=fmt, rename=rename)
    out = tmp_path / "drafter"
    rc, lines = run_convert(capsys, "--drafter", src, "--base", converted, "--out", out)
    assert rc == 0, lines
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    m = load(str(converted), drafter=str(out), weight_format="float32")
    assert m.drafter.args.num_draft_layers == 1 and "input_proj" not in m.drafter
    drafter_reference_check(m, module, llama)
    if variant == "pt-0-prefix":  # the closing hint runs the drafter with its base model, not alone
        assert convert_main(["--drafter", str(src), "--base", str(converted), "--out", str(tmp_path / "again")]) == 0
        assert f"--model {converted} --drafter {tmp_path / 'again'}" in capsys.readouterr().err


def test_hashing_the_inputs_has_a_progress_bar(tmp_path, mlx_ckpt):
    """Hashing every input for the manifest (minutes for a 70B model) ran under one status line, no bar."""
    from convert.cli import Reporter, _check_args, build_parser, run

    bars = []

    class Recording(Reporter):
        def bar(self, total=None, desc="", unit="tensor", unit_scale=False):
            record = {"desc": desc, "total": total, "done": 0}
            bars.append(record)

            class Bar:
                def update(self, n=1):
                    record["done"] += n

                def close(self):
                    pass

            return Bar()

    parser = build_parser()
    args = parser.parse_args(["--model", str(mlx_ckpt[0]), "--out", str(tmp_path / "out")])
    _check_args(parser, args)
    out = run(args, Recording(quiet=True))
    hashed = json.loads((out / "manifest.json").read_text())["base"]["sha256"]
    size = sum((mlx_ckpt[0] / name).stat().st_size for name in hashed)
    assert [(b["total"], b["done"]) for b in bars if b["desc"] == "hashing"] == [(size, size)]


def test_the_command_to_try_quotes_paths_with_spaces(tmp_path, capsys, mlx_ckpt):
    """The closing 'try it' command is pasted into a shell: a folder named 'my model' gave two arguments."""
    import shlex

    base = tmp_path / "base model"
    shutil.copytree(mlx_ckpt[0], base)
    out = tmp_path / "my drafter"
    src = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    assert convert_main(["--drafter", str(src), "--base", str(base), "--out", str(out)]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "try it: " in line]
    argv = shlex.split(said[-1].split("try it: ", 1)[1])
    assert argv[argv.index("--model") + 1] == str(base) and argv[argv.index("--drafter") + 1] == str(out)


def test_the_command_to_try_leaves_out_a_drafter_load_finds(tmp_path, capsys, mlx_ckpt):
    """A drafter converted into MODEL/drafter, where load(MODEL) looks, was still given to try as
    `--model MODEL --drafter MODEL/drafter`; the command is the shorter one there (and keeps --drafter elsewhere)."""
    import shlex

    model = tmp_path / "model"
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--out", model)[0] == 0
    src = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)

    def tried(*argv):
        assert convert_main([*map(str, argv)]) == 0
        said = [line for line in capsys.readouterr().err.splitlines() if "try it: " in line]
        return shlex.split(said[-1].split("try it: ", 1)[1])

    assert tried("--drafter", src, "--base", model, "--out", model / "drafter") == [
        "python", "-m", "redrafter_mlx", "--model", str(model), "Hello!"]
    assert "--drafter" in tried("--drafter", src, "--base", model, "--out", tmp_path / "elsewhere")


# ---- the default GGUF model ---------------------------------------------------------------

def test_a_quantized_gguf_says_its_bits_per_weight(tmp_path, capsys):
    """`--model X.gguf --quantize` said "Quantized model with 0.000 bits per weight." (mlx-lm measured the
    library's wrapper, not the model in it)."""
    import re

    from helpers import tiny_model, write_gguf

    gguf = write_gguf(tmp_path / "tiny.gguf", tiny_model())
    rc = convert_main(["--model", str(gguf), "--quantize", "--q-group-size", "32", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 0, err
    said = re.search(r"Quantized model with ([0-9.]+) bits per weight", err)
    assert said and 4 < float(said.group(1)) < 16, err
    assert "note:" not in err  # (a float GGUF: quantized once)


def test_quantizing_a_quantized_gguf_says_the_errors_add_up(tmp_path, capsys):
    """`--model X.Q4_1.gguf --quantize` dequantized the file's 4-bit weights and quantized them again, saying
    nothing of it, as it now says of a quantized folder given --dtype and --quantize."""
    from redrafter_mlx import registry

    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", registry.resolve(None).path, "--quantize", "--out", out)
    assert rc == 0 and len(lines) == 1, lines
    assert "is already quantized: it is dequantized to float16 and quantized again" in lines[0], lines


def test_reading_a_gguf_is_said_first(tmp_path, capsys):
    """A GGUF is read whole before the first status line (its layers, hidden size, ...): minutes of silence for a
    large one. That step is said before it starts."""
    from helpers import tiny_model, write_gguf

    gguf = write_gguf(tmp_path / "tiny.gguf", tiny_model())
    rc = convert_main(["--model", str(gguf), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 0, err
    lines = err.splitlines()
    assert lines[0].startswith(f"[convert] base model: {gguf} (gguf, 2 layers"), err  # (from its header, at once)
    assert lines[1] == f"[convert] reading {gguf} ({gguf.stat().st_size / 1e6:.1f} MB)", err


def test_a_drafter_that_does_not_fit_a_gguf_is_refused_before_its_tensors_are_read(tmp_path, capsys, monkeypatch):
    """`--model X.gguf --drafter D` read every tensor of the file (minutes and gigabytes for a large one) before D
    was found to be another model's; the drafter is checked against the GGUF's header."""
    import redrafter_mlx.gguf
    from helpers import tiny_config, tiny_model, write_gguf

    config = tiny_config()
    gguf = write_gguf(tmp_path / "tiny.gguf", tiny_model())
    read = []
    monkeypatch.setattr(redrafter_mlx.gguf, "_read_tensors", lambda *args: read.append(1))
    other = write_numpy_drafter(tmp_path / "other", config["hidden_size"], config["vocab_size"] + 8,
                                exit_dim=2 * config["hidden_size"], layers=1)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", gguf, "--drafter", other, "--out", out)
    assert_clean_failure(rc, lines, out, "vocab")
    assert read == []


def test_gguf_folder_loads_in_both_and_matches_mlx_lm(tmp_path, capsys):
    from mlx_lm import load as mlx_lm_load
    from mlx_lm.generate import generate_step

    from redrafter_mlx import registry

    gguf = registry.resolve(None).path
    out = tmp_path / "smollm2"
    rc, lines = run_convert(capsys, "--model", gguf, "--out", out)
    assert rc == 0, lines
    config = json.loads((out / "config.json").read_text())
    assert config["rope_traditional"] is True
    assert config["quantization"]["bits"] == 4 and config["quantization"]["model.embed_tokens"]["bits"] == 8
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "chat_template" in tok_config

    prompt = [{"role": "user", "content": "Name a color."}]
    # Stored weights: the folder gives exactly what loading the GGUF itself gives.
    ours = load(str(out), weight_format="stored", use_drafter=False)
    direct = load(str(gguf), weight_format="stored", use_drafter=False)
    ids = ours.tokenizer.prompt_ids(prompt)
    assert ids == direct.tokenizer.prompt_ids(prompt)
    assert ours.tokenizer.eos_token_ids == direct.tokenizer.eos_token_ids
    got, want = dict(tree_flatten(ours.model.parameters())), dict(tree_flatten(direct.model.parameters()))
    assert got.keys() == want.keys() and all(mx.array_equal(got[k], want[k]).item() for k in got)
    del ours, direct, got, want

    # Greedy tokens: ours (float32, fast on any device) and mlx-lm's own generation on the folder.
    ours = load(str(out), weight_format="float32", use_drafter=False)
    ours_tokens = generate(ours, ids, mode="ar", max_tokens=8).tokens
    model, tokenizer = mlx_lm_load(str(out))
    assert tokenizer.apply_chat_template(prompt, add_generation_prompt=True) == ids
    theirs = [int(token) for (token, _), _ in zip(generate_step(mx.array(ids), model, max_tokens=8), range(8))]
    assert theirs[: len(ours_tokens)] == ours_tokens


# ---- bad inputs ---------------------------------------------------------------------------

def test_a_gguf_in_a_folder_or_without_its_suffix_is_named(tmp_path, capsys):
    """A folder holding a .gguf (no config.json), as --model or as a drafter's --base, said "has no config.json: not a
    model folder", and a GGUF file without its suffix (M.GGUF, a download saved under another name) "a file but not a
    .gguf model"."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "m.gguf").write_bytes(b"GGUF" + bytes(60))  # (named, never read)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", folder, "--out", out)
    assert_clean_failure(rc, lines, out, "has no config.json", f"it holds m.gguf: give --model {folder / 'm.gguf'}")
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)  # the folder as a drafter's --base
    rc, lines = run_convert(capsys, "--drafter", drafter, "--base", folder, "--out", out)
    assert_clean_failure(rc, lines, out, "has no config.json", f"it holds m.gguf: give --base {folder / 'm.gguf'}")
    (tmp_path / "M.GGUF").write_bytes(b"GGUF" + bytes(60))
    rc, lines = run_convert(capsys, "--model", tmp_path / "M.GGUF", "--out", out)
    assert_clean_failure(rc, lines, out, "is a GGUF file without the .gguf suffix: rename it to M.gguf")


def test_missing_config(tmp_path, capsys, mlx_ckpt):
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    (src / "config.json").unlink()
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, "config.json")


def test_zero_attention_heads_is_the_config_s_fault(tmp_path, capsys, mlx_ckpt):
    """It read "cannot load the tokenizer ...: integer modulo by zero"."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, "config.json", "num_attention_heads 0")
    assert "tokenizer" not in lines[0]


def test_a_config_transformers_refuses_is_not_blamed_on_the_tokenizer(tmp_path, capsys, mlx_ckpt):
    """transformers reads config.json to choose the tokenizer class: a size written as a string said "cannot load
    the tokenizer in ...: Validation error for field 'hidden_size':", naming the wrong file and cutting off why."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "hidden_size": str(H)}))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, str(src / "config.json"), "hidden_size")
    assert "tokenizer" not in lines[0]


@pytest.mark.parametrize("key, value", [("model_type", ["llama"]), ("text_config", [1])])
def test_a_config_field_of_the_wrong_kind_is_named(tmp_path, capsys, mlx_ckpt, key, value):
    """A list as model_type or text_config failed as "TypeError: unhashable type: 'list'" or "AttributeError: 'list'
    object has no attribute 'get'", with the hint that the tool has a bug."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, key: value}))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"{src / 'config.json'}: {key} must be")


@pytest.mark.parametrize("change, said", [({"quantization_config": {"bits": 4}}, "KeyError: 'quant_method'"),
                                          ({"intermediate_size": 0}, "ZeroDivisionError")])
def test_a_config_mlx_lm_cannot_build_is_not_called_unreadable(tmp_path, capsys, mlx_ckpt, change, said):
    """Values mlx-lm cannot build a model from said "cannot read <folder>: 'quant_method'" (or "float division by
    zero"), as if a file were unreadable."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"{src}: mlx-lm cannot build the model from its config.json", said)


def test_a_config_that_asks_to_run_code_is_refused_without_a_missing_option(tmp_path, capsys, mlx_ckpt):
    """mlx-lm's model_file (a Python file that builds the model) said "the tensors do not fit config.json: ... Pass
    trust_remote_code=True if you trust this model", an option the converter does not have."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_file": "custom.py"}))
    (src / "custom.py").write_text("raise SystemExit('ran')\n")
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, "model_file", "'custom.py'", "never does")
    assert "trust_remote_code" not in lines[0] and "do not fit" not in lines[0]


def test_a_null_size_in_the_config_names_the_file(tmp_path, capsys, mlx_ckpt):
    """"hidden_size": null said "config.json lacks hidden_size" beside a drafter's config.json, naming no folder."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "hidden_size": None}))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"{src / 'config.json'} is not a model config", "lacks hidden_size")


def test_truncated_safetensors(tmp_path, mlx_ckpt):
    """Through the real command line: exit code, one line, no traceback, no output."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "convert", "--model", str(src), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr
    assert_clean_failure(proc.returncode, lines, out, "model.safetensors")


@pytest.mark.parametrize("size", [0, 40, "half"])
def test_a_cut_off_bin_is_called_damaged(tmp_path, capsys, mlx_ckpt, size):
    """A .bin cut off mid-download said "cannot read ...: [Errno 22] Invalid argument" (or "EOFError")."""
    torch = pytest.importorskip("torch")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(mlx_ckpt[0] / "config.json", src)
    write_tokenizer(src)
    full = tmp_path / "full.bin"
    torch.save({k: torch.from_numpy(np.array(v)) for k, v in tree_flatten(mlx_ckpt[1].parameters())}, full)
    data = full.read_bytes()
    (src / "pytorch_model.bin").write_bytes(data[: len(data) // 2 if size == "half" else size])
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"cannot read {src / 'pytorch_model.bin'}: a damaged or incomplete file")


def test_a_safetensors_file_the_index_does_not_list_is_refused(tmp_path, capsys, mlx_ckpt):
    """mlx-lm reads every model*.safetensors: a stale model.safetensors beside an index's shards was mixed
    into the converted weights (in glob order), while the manifest listed the shards alone."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = dict(tree_flatten(mlx_ckpt[1].parameters()))
    write_shards(src, weights, index={})
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)  # the index and its shards alone convert
    assert rc == 0, lines
    mx.save_safetensors(str(src / "model.safetensors"), {k: mx.zeros_like(v) for k, v in weights.items()})
    rc, lines = run_convert(capsys, "--model", src, "--out", tmp_path / "again")
    assert_clean_failure(rc, lines, tmp_path / "again", "model.safetensors beside the shards", "Remove")


@pytest.mark.parametrize("index", [None, {}])
def test_a_shard_missing_is_refused_in_the_words_load_uses(tmp_path, capsys, mlx_ckpt, index):
    """model-00001-of-00002.safetensors without its second shard and without an index: load() refused the folder,
    the converter took it (open_base). With an index naming the missing shard, the two said it in words of their
    own ("lacks X, which ... lists" and "is missing weight shard(s) listed in ..."): one function says both."""
    from redrafter_mlx.errors import CorruptModelError

    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src, ignore=shutil.ignore_patterns("model.safetensors"))
    write_shards(src, dict(tree_flatten(mlx_ckpt[1].parameters())), index=index)
    (src / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CorruptModelError) as loaded:
        load(str(src), use_drafter=False)
    said = str(loaded.value)
    assert said.startswith(f"{src} lacks model-00002-of-00002.safetensors, ") and "interrupted download" in said
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, said)


@pytest.mark.parametrize("weight_map, said", [(["model.safetensors"], "it is a list"),
                                               ({"model.norm.weight": None}, "'model.norm.weight': None"),
                                               ({"model.norm.weight": "/etc/passwd"}, "'/etc/passwd'")])
def test_a_malformed_weight_index_is_named(tmp_path, capsys, mlx_ckpt, weight_map, said):
    """A weight_map that is a list, or names no file, failed as "AttributeError: 'list' object has no attribute
    'values'" or "TypeError: unsupported operand type(s) for /", with the hint that the tool has a bug."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, "model.safetensors.index.json is not a weight index", said)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_whole_model_file_beside_shards_without_an_index_is_refused(tmp_path, capsys, mlx_ckpt, fmt):
    """model.safetensors (or pytorch_model.bin) beside shards of another download, with no index: every file was
    read, the tensors of one overwriting the other's in glob order (exit 0, the weights of either)."""
    weights = dict(tree_flatten(mlx_ckpt[1].parameters()))
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src, ignore=shutil.ignore_patterns("model.safetensors"))
    if fmt == "safetensors":
        mx.save_safetensors(str(src / "model.safetensors"), weights)
        mx.save_safetensors(str(src / "model-00001-of-00001.safetensors"),
                            {k: mx.zeros_like(v) for k, v in weights.items()})
        single = "model.safetensors"
    else:
        torch = pytest.importorskip("torch")
        state = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
        torch.save(state, src / "pytorch_model.bin")
        torch.save({k: torch.zeros_like(v) for k, v in state.items()}, src / "pytorch_model-00001-of-00001.bin")
        single = "pytorch_model.bin"
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"holds both {single} and shards", "no index")


def test_drafter_for_another_base_model(tmp_path, capsys, mlx_ckpt):
    src = write_numpy_drafter(tmp_path / "d", 48, V, exit_dim=96, layers=1)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", src, "--out", out)
    assert_clean_failure(rc, lines, out, "hidden size 48", f"hidden size {H}", "leave --drafter out")
    assert "--no-drafter" not in lines[0]  # a decoding flag convert does not have


def test_a_drafter_alone_for_another_base_model_says_to_give_its_base(tmp_path, capsys, mlx_ckpt):
    """With --base, the advice was "leave --drafter out", which leaves nothing to convert."""
    out = tmp_path / "out"
    other = tmp_path / "qwen"
    save_drafter(Drafter(DrafterArgs(hidden_size=H, vocab_size=V, base_model_type="qwen3")), other)
    for src, why in ((write_numpy_drafter(tmp_path / "d", 48, V, exit_dim=96, layers=1), "hidden size 48"),
                     (other, "'qwen3' base model, not this 'llama' one")):
        rc, lines = run_convert(capsys, "--drafter", src, "--base", mlx_ckpt[0], "--out", out)
        assert_clean_failure(rc, lines, out, why, f"give --base the model it was trained for (not {mlx_ckpt[0]})")
        assert "leave --drafter out" not in lines[0]


@pytest.mark.parametrize("alone", [False, True])
def test_a_damaged_drafter_file_is_named_by_its_path(tmp_path, capsys, mlx_ckpt, alone):
    """Base and drafter both hold a model.safetensors: "cannot read model.safetensors" did not say whose."""
    src = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--base" if alone else "--model", mlx_ckpt[0], "--drafter", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"cannot read {src / 'model.safetensors'}")


def test_existing_output_folder_is_refused(tmp_path, capsys, mlx_ckpt):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", out)
    assert rc != 0 and len(lines) == 1 and "already exists" in lines[0] and "--force" in lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    # --force replaces a model or drafter folder only: a typo of --out deleted a source tree whole
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", out, "--force")
    assert rc != 0 and len(lines) == 1 and "replaces only a model or drafter folder" in lines[0], lines
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    (out / "config.json").write_text("{}")  # an earlier model's folder
    (out / ".git").mkdir()
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", out, "--force")
    assert rc != 0 and "replaces only" in lines[0], lines  # a repository's root is never one
    (out / ".git").rmdir()
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", out, "--force")
    assert rc == 0, lines
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


class _RunsCode:
    """Unpickling this calls Path.touch(marker): what a malicious checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("where", ["drafter", "base"])
def test_pickle_that_is_not_weights_only_is_refused(tmp_path, capsys, mlx_ckpt, where):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "code-ran"
    out = tmp_path / "out"
    if where == "drafter":
        src = tmp_path / "d"
        src.mkdir()
        (src / "config.json").write_text(json.dumps({"hidden_size": H, "vocab_size": V}))
        torch.save({"rnn_u.weight": torch.zeros(H, H), "evil": _RunsCode(marker)}, src / "model.pt")
        argv = ["--model", mlx_ckpt[0], "--drafter", src]
    else:
        src = tmp_path / "m"
        src.mkdir()
        shutil.copy(mlx_ckpt[0] / "config.json", src)
        write_tokenizer(src)
        torch.save({"model.norm.weight": torch.ones(H), "evil": _RunsCode(marker)}, src / "pytorch_model.bin")
        argv = ["--model", src]
    rc, lines = run_convert(capsys, *argv, "--out", out)
    assert_clean_failure(rc, lines, out, "not a weights-only checkpoint")
    assert not marker.exists()


@pytest.mark.parametrize("where", ["drafter", "base"])
def test_a_file_that_is_no_pickle_is_called_damaged_not_code(tmp_path, capsys, mlx_ckpt, where):
    """torch's weights-only reader fails on stray bytes as it fails on code: an HTML error page saved as
    pytorch_model.bin was refused as 'loading it would run code stored in the file'."""
    pytest.importorskip("torch")
    out = tmp_path / "out"
    src = tmp_path / "src"
    src.mkdir()
    if where == "drafter":
        (src / "config.json").write_text(json.dumps({"hidden_size": H, "vocab_size": V}))
        name, argv = "model.pt", ["--model", mlx_ckpt[0], "--drafter", src]
    else:
        shutil.copy(mlx_ckpt[0] / "config.json", src)
        write_tokenizer(src)
        name, argv = "pytorch_model.bin", ["--model", src]
    (src / name).write_bytes(b"<!DOCTYPE html><html>502 Bad Gateway</html>\n")
    rc, lines = run_convert(capsys, *argv, "--out", out)
    assert_clean_failure(rc, lines, out, str(src / name), "not a PyTorch checkpoint, or a damaged one")
    assert "run code" not in lines[0]


LFS_POINTER = (b"version https://git-lfs.github.com/spec/v1\noid sha256:"
               b"4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 1048576\n")


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin", "tokenizer.json", "drafter"])
def test_a_git_lfs_pointer_is_named_as_one(tmp_path, capsys, mlx_ckpt, name):
    """A repository cloned without git-lfs holds pointers where the weights belong: they failed as
    'Invalid json header length', as a pickle that would run code, or as a tokenizer that is not JSON."""
    out = tmp_path / "out"
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    argv = ["--model", src]
    if name == "pytorch_model.bin":
        (src / "model.safetensors").unlink()
    if name == "drafter":
        drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
        pointer = drafter / "model.safetensors"
        argv += ["--drafter", drafter]
    else:
        pointer = src / name
    pointer.write_bytes(LFS_POINTER)
    rc, lines = run_convert(capsys, *argv, "--out", out)
    assert_clean_failure(rc, lines, out, f"{pointer} is a Git LFS pointer", "git lfs pull")


@pytest.mark.parametrize("swap", ["model-as-drafter", "drafter-as-model", "drafter-as-base"])
def test_a_model_and_a_drafter_given_the_wrong_way_round_are_named(tmp_path, capsys, mlx_ckpt, swap):
    """A base model given as --drafter said "unknown tensor(s) in the drafter checkpoint: lm_head.weight,
    model.embed_tokens.weight, ..."; a drafter given as --model or --base said its config "lacks num_hidden_layers"."""
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1, config={
        "model_type": "recurrent_drafting_drafter", "hidden_size": H, "vocab_size": V, "rnn": True})
    model = mlx_ckpt[0]
    out = tmp_path / "out"
    if swap == "model-as-drafter":
        argv = ["--model", model, "--drafter", model]
        needles = [f"{model / 'config.json'} is a 'llama' model's config, not a drafter's", "--model"]
    else:
        flag = "--model" if swap == "drafter-as-model" else "--base"
        argv = [flag, drafter] + (["--drafter", drafter] if flag == "--base" else [])
        needles = [f"{drafter / 'config.json'} is a drafter's, not a base model's", "--drafter"]
    rc, lines = run_convert(capsys, *argv, "--out", out)
    assert_clean_failure(rc, lines, out, *needles)


def test_a_drafter_size_written_as_a_string_is_shown_as_one(tmp_path, capsys, mlx_ckpt):
    """It said "config.json says hidden_size=64, but its tensors give hidden_size=64"."""
    src = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1, config={"hidden_size": str(H)})
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"says hidden_size='{H}', but its tensors give hidden_size={H}")


def test_unknown_drafter_tensor(tmp_path, capsys, mlx_ckpt):
    src = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1, config={"hidden_size": H},
                              rename=lambda k: k.replace("rnn_w.", "rnn_x."))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", src, "--out", out)
    assert_clean_failure(rc, lines, out, "unknown tensor", "rnn_x.weight")


def test_shape_mismatch(tmp_path, capsys, mlx_ckpt):
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    config["intermediate_size"] = 96
    (src / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, "shape")


def test_unsupported_architecture(tmp_path, capsys, mlx_ckpt):
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    for model_type, why in (("made_up_arch", "unsupported architecture 'made_up_arch'"),
                            ("rwkv7", "'rwkv7' is not supported: its recurrent layers")):
        config["model_type"] = model_type
        (src / "config.json").write_text(json.dumps(config))
        out = tmp_path / "out"
        rc, lines = run_convert(capsys, "--model", src, "--out", out)
        assert_clean_failure(rc, lines, out, why)


def test_a_drafter_alone_for_an_unsupported_base_is_refused_as_the_base_is(tmp_path, capsys, mlx_ckpt):
    """`--drafter D --base B` read B's sizes only: a drafter for an rwkv7 base was written, exit 0."""
    src = tmp_path / "src"
    src.mkdir()
    config = json.loads((mlx_ckpt[0] / "config.json").read_text())
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    for model_type, why in (("made_up_arch", "unsupported architecture 'made_up_arch'"),
                            ("rwkv7", "'rwkv7' is not supported: its recurrent layers")):
        (src / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
        out = tmp_path / "out"
        rc, alone = run_convert(capsys, "--model", src, "--out", out)
        assert_clean_failure(rc, alone, out, why)
        rc, lines = run_convert(capsys, "--drafter", drafter, "--base", src, "--out", out)
        assert_clean_failure(rc, lines, out, why)
        assert lines == alone
    (src / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "hidden_size"}))
    rc, lines = run_convert(capsys, "--drafter", drafter, "--base", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"{src / 'config.json'} is not a model config", "lacks hidden_size")


def test_a_config_without_a_field_the_architecture_needs_names_it(tmp_path, capsys, mlx_ckpt):
    """It said "ModelArgs.__init__() missing 1 required positional argument: 'num_attention_heads'"."""
    src = tmp_path / "src"
    shutil.copytree(mlx_ckpt[0], src)
    config = json.loads((src / "config.json").read_text())
    del config["num_attention_heads"]
    (src / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, "config.json lacks num_attention_heads")
    assert "__init__" not in lines[0]


def test_bin_without_torch_says_what_to_install(tmp_path, capsys, monkeypatch, mlx_ckpt):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if the [convert] extra were not installed
    src = tmp_path / "m"
    src.mkdir()
    shutil.copy(mlx_ckpt[0] / "config.json", src)
    write_tokenizer(src)
    (src / "pytorch_model.bin").write_bytes(b"not read")
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, "needs PyTorch", "redrafter-mlx[convert]")


def test_bin_without_torch_is_refused_before_any_work(tmp_path, capsys, monkeypatch, mlx_ckpt):
    """A .bin checkpoint without torch was refused only when its weights were read: after the drafter and the
    tokenizer were converted, and for a hub id (lmsys/vicuna-7b-v1.3, .bin shards only) after its 13 GB were
    downloaded."""
    import huggingface_hub

    src = tmp_path / "m"
    src.mkdir()
    shutil.copy(mlx_ckpt[0] / "config.json", src)
    write_tokenizer(src)
    (src / "pytorch_model.bin").write_bytes(b"not read")
    run_convert(capsys, "--model", mlx_ckpt[0], "--out", tmp_path / "warm")  # (transformers imported with torch)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if the [convert] extra were not installed
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    out = tmp_path / "out"
    rc = convert_main(["--model", str(src), "--drafter", str(drafter), "--out", str(out)])
    lines = capsys.readouterr().err.splitlines()
    assert rc != 0 and lines[-1].startswith(f"{ERROR}reading .bin/.pt checkpoints needs PyTorch"), lines
    assert not [line for line in lines if line.startswith(("[convert] drafter", "[convert] tokenizer"))], lines
    assert not out.exists()
    hub = tmp_path / "snapshot"  # what the first fetch (no .bin files) gives of a repository of .bin shards
    hub.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, hub / name)
    (hub / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"x": "pytorch_model-1.bin"}}))
    asked = []

    def snapshot_download(repo, allow_patterns=None, **kw):
        asked.append(allow_patterns)
        return str(hub)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    rc, lines = run_convert(capsys, "--model", "org/model", "--out", out)
    assert_clean_failure(rc, lines, out, "needs PyTorch")
    assert len(asked) == 1 and not any(p.endswith(".bin") for p in asked[0]), asked


def test_a_hub_model_of_one_bin_file_without_torch_is_refused_before_its_download(tmp_path, capsys, monkeypatch,
                                                                                  mlx_ckpt):
    """A hub repository whose weights are one pytorch_model.bin (no index to tell) was downloaded whole (gigabytes)
    before the "needs PyTorch" error; a repository with no .bin either is still fetched and named as having no
    weights, and torch installed fetches the .bin as before."""
    import huggingface_hub
    from huggingface_hub.file_download import DryRunFileInfo

    hub = tmp_path / "snapshot"  # what the first fetch (no .bin files) gives
    hub.mkdir()
    shutil.copy(mlx_ckpt[0] / "config.json", hub / "config.json")
    write_tokenizer(hub)
    on_hub = ["config.json", "pytorch_model.bin"]
    asked = []

    def snapshot_download(repo, allow_patterns=None, dry_run=False, **kw):
        asked.append((allow_patterns, dry_run))
        fetched = [name for name in on_hub if any(fnmatch.fnmatch(name, p) for p in allow_patterns)]
        if dry_run:
            return [DryRunFileInfo("c0", 1, name, str(hub / name), False, True) for name in fetched]
        for name in fetched:
            if not (hub / name).exists():
                (hub / name).write_bytes(b"not read")
        return str(hub)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setitem(sys.modules, "torch", None)  # as if the [convert] extra were not installed
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", "org/model", "--out", out)
    assert_clean_failure(rc, lines, out, "needs PyTorch")
    assert not [p for p, dry_run in asked if not dry_run and any(n.endswith(".bin") for n in p)], asked
    on_hub.remove("pytorch_model.bin")
    (hub / "pytorch_model.bin").unlink(missing_ok=True)
    rc, lines = run_convert(capsys, "--model", "org/model", "--out", out)
    assert_clean_failure(rc, lines, out, "has no weights")


def test_asking_the_hub_what_it_holds_draws_no_progress_bar(capsys, monkeypatch):
    """The converter and load() ask the hub which files a repository holds (GGUF files, .bin weights: hub_files) with a
    dry run of snapshot_download, which drew "[dry-run] Fetching 2 files: 100%": a bar for files never fetched, above an
    error that said to download one. The real snapshot_download here, on a hub of one repository faked below it."""
    import inspect
    from types import SimpleNamespace

    from huggingface_hub import _snapshot_download as hub
    from huggingface_hub.file_download import DryRunFileInfo
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    from redrafter_mlx.registry import hub_files

    files = ["README.md", "model-Q4_0.gguf", "model-Q8_0.gguf"]
    monkeypatch.setattr(hub.HfApi, "repo_info", lambda self, **kw: SimpleNamespace(sha="a" * 40))
    monkeypatch.setattr(hub.HfApi, "list_repo_tree", lambda self, **kw: [RepoFile(path=f, size=1, oid="b" * 40)
                                                                          for f in files])
    fields = inspect.signature(DryRunFileInfo).parameters
    monkeypatch.setattr(hub, "hf_hub_download", lambda repo, filename, **kw: DryRunFileInfo(
        **{name: filename if name == "filename" else None for name in fields}))
    hidden = are_progress_bars_disabled()
    enable_progress_bars()  # (as a terminal's run has them; HF_HUB_DISABLE_PROGRESS_BARS would hide the bar)
    try:
        assert hub_files("org/model-GGUF", ["*.gguf"]) == files[1:]
    finally:
        if hidden:
            disable_progress_bars()
    assert capsys.readouterr().err == ""


def test_a_hub_drafter_fetches_only_the_weights_it_reads(tmp_path, capsys, monkeypatch, mlx_ckpt):
    """A hub drafter was fetched with all of model.safetensors, pytorch_model.bin and model.pt (the first alone is
    read), and one stored as .bin was refused for want of torch only as it was read: after the base model given as
    a hub id had been downloaded (gigabytes). Without torch it is refused before any download."""
    import huggingface_hub
    from huggingface_hub.file_download import DryRunFileInfo

    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    hubs = {"org/model": mlx_ckpt[0], "org/drafter": tmp_path / "drafter-snapshot"}
    on_hub = ["config.json", "model.safetensors", "pytorch_model.bin"]
    asked = []

    def snapshot_download(repo, allow_patterns=None, dry_run=False, **kw):
        asked.append((repo, allow_patterns, dry_run))
        if repo == "org/model":
            return str(hubs[repo])
        fetched = [name for name in on_hub if any(fnmatch.fnmatch(name, p) for p in allow_patterns)]
        if dry_run:
            return [DryRunFileInfo("c0", 1, name, str(hubs[repo] / name), False, True) for name in fetched]
        hubs[repo].mkdir(exist_ok=True)
        for name in fetched:
            if not (hubs[repo] / name).exists():
                shutil.copy(drafter / name, hubs[repo] / name) if (drafter / name).exists() else \
                    (hubs[repo] / name).write_bytes(b"not read")
        return str(hubs[repo])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", "org/model", "--drafter", "org/drafter", "--out", out)
    assert rc == 0, lines
    assert not (hubs["org/drafter"] / "pytorch_model.bin").exists()  # (model.safetensors is the one read)
    shutil.rmtree(hubs["org/drafter"])
    on_hub.remove("model.safetensors")
    monkeypatch.setitem(sys.modules, "torch", None)  # as if the [convert] extra were not installed
    asked.clear()
    out = tmp_path / "out2"
    rc, lines = run_convert(capsys, "--model", "org/model", "--drafter", "org/drafter", "--out", out)
    assert_clean_failure(rc, lines, out, "needs PyTorch")
    assert not [a for a in asked if a[0] == "org/model"], asked
    assert not (hubs["org/drafter"] / "pytorch_model.bin").exists()
    asked.clear()  # a local --model that is not there is named before the hub drafter is fetched
    rc, lines = run_convert(capsys, "--model", tmp_path / "missing", "--drafter", "org/drafter", "--out", out)
    assert_clean_failure(rc, lines, out, "not found")
    assert asked == []


@pytest.mark.parametrize("flag", ["--model", "--base"])
def test_a_hub_repository_of_gguf_files_is_named_as_one(tmp_path, capsys, monkeypatch, flag):
    """A hub id whose repository holds GGUF files (org/Model-GGUF) said "<a hub cache folder> has no config.json: not
    a model folder", naming neither the repository nor what to give instead."""
    import huggingface_hub
    from huggingface_hub.file_download import DryRunFileInfo

    hub = tmp_path / "snapshot"  # what the fetch of JSON and safetensors files gives: nothing but a README's JSON
    hub.mkdir()
    on_hub = ["README.md", "model-Q4_K_M.gguf", "model-Q8_0.gguf"]

    def snapshot_download(repo, allow_patterns=None, dry_run=False, **kw):
        fetched = [name for name in on_hub if any(fnmatch.fnmatch(name, p) for p in allow_patterns)]
        if dry_run:
            return [DryRunFileInfo("c0", 1, name, str(hub / name), False, True) for name in fetched]
        assert not fetched, fetched
        return str(hub)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    argv = ["--model", "org/Model-GGUF"] if flag == "--model" else [
        "--drafter", write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1), "--base", "org/Model-GGUF"]
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, *argv, "--out", out)
    assert_clean_failure(rc, lines, out, "org/Model-GGUF holds GGUF files (model-Q4_K_M.gguf, model-Q8_0.gguf), not a "
                         "model folder", "hf download org/Model-GGUF model-Q4_K_M.gguf --local-dir DIR",
                         f"give that file as {flag}")


def test_a_registry_name_is_a_source(default_model):
    from convert.checkpoint import resolve

    assert resolve(default_model.name, "model") == default_model.path


def test_quiet_hides_the_hub_download_bars(tmp_path, capsys, monkeypatch, mlx_ckpt):
    """--quiet ("no progress bars or status lines") still showed huggingface-hub's download bars for a hub id."""
    import huggingface_hub
    from huggingface_hub.utils import are_progress_bars_disabled

    hidden = []

    def snapshot_download(repo, allow_patterns=None, **kw):
        hidden.append(are_progress_bars_disabled())
        return str(mlx_ckpt[0])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    rc, lines = run_convert(capsys, "--model", "org/model", "--out", tmp_path / "out")
    assert rc == 0 and lines == [], lines
    assert hidden == [True]
    assert not are_progress_bars_disabled()  # (as it was, for what runs next in the process)
    assert convert_main(["--model", "org/model", "--out", str(tmp_path / "shown")]) == 0
    assert hidden == [True, False]


def test_a_hub_base_for_a_drafter_fetches_its_config_alone(tmp_path, capsys, monkeypatch, mlx_ckpt):
    """`--drafter D --base org/model` reads only the base model's config.json, and fetched the whole repository
    for it: gigabytes of weights, minutes, before a drafter of a few hundred MB was converted."""
    import huggingface_hub

    hub = tmp_path / "snapshot"
    hub.mkdir()
    shutil.copy(mlx_ckpt[0] / "config.json", hub / "config.json")
    asked = []

    def snapshot_download(repo, allow_patterns=None, **kw):
        asked.append((repo, allow_patterns))
        return str(hub)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    rc, lines = run_convert(capsys, "--drafter", drafter, "--base", "org/model", "--out", tmp_path / "out")
    assert rc == 0, lines
    assert asked == [("org/model", ["config.json"])]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["drafter"]["checked_against"] == str(hub)


def test_a_gguf_base_for_a_drafter_is_checked_without_reading_its_weights(tmp_path, capsys, monkeypatch):
    """`--drafter D --base X.gguf` needs the base model's config alone, and read every tensor of the file for it (a
    70B GGUF's 40 GB, minutes, before a drafter of a few hundred MB was converted); its header is read alone."""
    import redrafter_mlx.gguf
    from helpers import tiny_config, tiny_model, write_gguf

    config = tiny_config()
    gguf = write_gguf(tmp_path / "tiny.gguf", tiny_model())
    read = []
    monkeypatch.setattr(redrafter_mlx.gguf, "_read_tensors", lambda *args: read.append(1))
    drafter = write_numpy_drafter(tmp_path / "d", config["hidden_size"], config["vocab_size"],
                                  exit_dim=2 * config["hidden_size"], layers=1)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--drafter", drafter, "--base", gguf, "--out", out)
    assert rc == 0, lines
    assert read == []
    assert json.loads((out / "config.json").read_text())["base_model_type"] == "llama"
    other = write_numpy_drafter(tmp_path / "other", config["hidden_size"], config["vocab_size"] + 8,
                                exit_dim=2 * config["hidden_size"], layers=1)
    rc, lines = run_convert(capsys, "--drafter", other, "--base", gguf, "--out", tmp_path / "out2")
    assert_clean_failure(rc, lines, tmp_path / "out2", "vocab")  # (still checked against it)


def test_an_output_that_cannot_be_made_is_refused_before_any_work(tmp_path):
    from convert.output import ConversionError

    (tmp_path / "file").write_text("x")
    with pytest.raises(ConversionError, match="is not a folder you can write"):
        OutputFolder(tmp_path / "file" / "out")


def test_force_never_deletes_the_model_a_drafter_is_checked_against(tmp_path, capsys, mlx_ckpt):
    """`--drafter D --base X --out X --force` (or the folder above X) would have replaced the base
    model with the drafter alone: it is refused as `--model X --out X --force` is."""
    model = tmp_path / "model"
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--out", model)[0] == 0
    before = sorted(p.name for p in model.iterdir())
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    for out in (model, tmp_path):
        rc, lines = run_convert(capsys, "--drafter", drafter, "--base", model, "--out", out, "--force")
        assert rc != 0 and len(lines) == 1 and "--force would delete the input" in lines[0], lines
        assert sorted(p.name for p in model.iterdir()) == before
    assert run_convert(capsys, "--drafter", drafter, "--base", model, "--out", tmp_path / "d2")[0] == 0


@pytest.mark.parametrize("force", [False, True])
def test_a_signal_as_the_output_is_renamed_in_says_it_is_whole(tmp_path, capsys, monkeypatch, mlx_ckpt, force,
                                                              ctrl_c_raises):
    """Ctrl-C during the final renames is held until they are done: the output is whole, and the
    message says so (it said "nothing was written")."""
    import os
    import signal

    from redrafter_mlx import files

    out = tmp_path / "model"
    if force:
        out.mkdir()
        (out / "old.txt").write_text("old")
        (out / "manifest.json").write_text("{}")  # an earlier conversion
    rename = os.rename

    def rename_and_press_ctrl_c(a, b):
        if Path(b) == out:
            signal.raise_signal(signal.SIGINT)
        return rename(a, b)

    monkeypatch.setattr(files.os, "rename", rename_and_press_ctrl_c)
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", out, *(["--force"] if force else []))
    assert rc == 130 and len(lines) == 1 and f"{out} is whole" in lines[0], lines
    assert (out / "manifest.json").is_file() and not (out / "old.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    monkeypatch.undo()
    assert load(str(out)).model.args.hidden_size == H


def test_a_broken_chat_template_is_refused_before_any_work(tmp_path, capsys, mlx_ckpt):
    """It was written into the model, and then every chat with it failed."""
    out = tmp_path / "out"
    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% if %}")
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--chat-template", tmp_path / "bad.jinja", "--out", out)
    assert_clean_failure(rc, lines, out, "not a valid Jinja template", "line 2")
    (tmp_path / "latin1.jinja").write_bytes("{{ 'café' }}".encode("latin-1"))
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--chat-template", tmp_path / "latin1.jinja",
                            "--out", out)
    assert_clean_failure(rc, lines, out, "not UTF-8")
    assert "UnicodeDecodeError" not in lines[0]


def test_a_chat_template_from_a_pipe_is_read(tmp_path, capsys, mlx_ckpt):
    """`--chat-template <(curl ... | jq -r .chat_template)` (a pipe, /dev/fd/63) was refused as "neither a built-in
    template (vicuna) nor a file": the check was for a regular file. A pipe is read like a file, once."""
    with piped("{% for m in messages %}[{{ m['content'] }}]{% endfor %}") as path:
        rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--chat-template", path, "--out", tmp_path / "out")
    assert rc == 0, lines
    config = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert config["chat_template"] == "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--chat-template", tmp_path, "--out", tmp_path / "o2")
    assert_clean_failure(rc, lines, tmp_path / "o2", f"chat template {tmp_path} is a folder: give a Jinja file")


def test_an_empty_chat_template_is_refused(tmp_path, capsys, mlx_ckpt):
    """An empty --chat-template (a command in `<(...)` that failed and wrote nothing, `touch`ed file) replaced the
    checkpoint's template with "": every chat message then reached the model as bare text, under a note blaming
    the checkpoint for having no template."""
    (tmp_path / "empty.jinja").write_text(" \n")
    for spec in (tmp_path / "empty.jinja", "/dev/null"):
        rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--chat-template", spec, "--out", tmp_path / "out")
        assert_clean_failure(rc, lines, tmp_path / "out", f"--chat-template {spec} is empty")


def test_a_json_file_as_chat_template_is_refused(tmp_path, capsys, mlx_ckpt):
    """A tokenizer_config.json given as --chat-template (where many models keep their template) was taken as the
    template itself: every chat prompt was then that JSON text, with the messages filled in."""
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "</s>"}, indent=2))
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--chat-template", config, "--out", tmp_path / "out")
    assert_clean_failure(rc, lines, tmp_path / "out", f"--chat-template {config} is a JSON file, not a Jinja "
                         f"template: give the template itself (jq -r .chat_template {config} > chat_template.jinja)")


@pytest.mark.parametrize("force", [False, True])
def test_an_output_that_appears_during_the_work_is_left_alone(tmp_path, force):
    """The output folder was checked at the start only: one made meanwhile (by hand, by another conversion) was
    replaced at the end and what it held deleted, without --force, or with --force though it is no model folder."""
    from convert.output import ConversionError

    out = tmp_path / "out"
    with pytest.raises(ConversionError, match="appeared while converting" if not force else "replaces only a model"):
        with OutputFolder(out, force=force) as tmp:
            (tmp / "config.json").write_text("{}")
            out.mkdir()
            (out / "notes.txt").write_text("mine")
    assert (out / "notes.txt").read_text() == "mine" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_failed_conversion_leaves_no_folders_it_made(tmp_path, capsys, mlx_ckpt):
    src = write_numpy_drafter(tmp_path / "d", 48, V, exit_dim=96, layers=1)  # for another model
    (tmp_path / "kept").mkdir()
    out = tmp_path / "kept" / "new" / "deeper" / "model"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", src, "--out", out)
    assert rc != 0 and "hidden size 48" in lines[0]
    assert [p.name for p in (tmp_path / "kept").iterdir()] == []


def test_force_never_replaces_the_folder_you_are_in(tmp_path, capsys, monkeypatch, mlx_ckpt):
    """`--out . --force` failed halfway (a folder cannot be renamed through ".") and left a hidden
    folder behind."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", ".", "--force")
    assert rc != 0 and len(lines) == 1 and "the folder you are in" in lines[0], lines
    assert list(here.iterdir()) == [] and [p.name for p in tmp_path.iterdir()] == ["here"]


def test_a_full_disk_is_one_line_and_nothing_is_written(tmp_path, capsys, monkeypatch, mlx_ckpt):
    """MLX fails a write with a RuntimeError ("[write] Unable to write N bytes to file."), and a full disk
    read as a bug: "error: RuntimeError: ... CONVERT_DEBUG=1 shows the traceback"."""
    import convert.checkpoint as checkpoint

    def full_disk(*args, **kwargs):
        raise RuntimeError("[write] Unable to write 1441433 bytes to file.")

    monkeypatch.setattr(checkpoint.mx, "save_safetensors", full_disk)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", out)
    assert_clean_failure(rc, lines, out, "Unable to write 1441433 bytes to file: is the disk full",
                         "(nothing was written)")
    assert "RuntimeError" not in lines[0] and "CONVERT_DEBUG" not in lines[0]
    assert list(tmp_path.iterdir()) == []  # no staging folder left either


def test_a_model_without_a_chat_template_is_noted(tmp_path, capsys, mlx_ckpt):
    """A checkpoint without a chat template (Vicuna, a base model) converted without --chat-template said nothing,
    and every chat message then went to the model as bare text. It is one note line, --quiet or not."""
    import shutil

    src = shutil.copytree(mlx_ckpt[0], tmp_path / "plain")
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    (src / "chat_template.jinja").unlink(missing_ok=True)
    rc, lines = run_convert(capsys, "--model", src, "--out", tmp_path / "out")
    assert rc == 0 and lines == [f"[convert] note: {src} has no chat template, so chat messages reach the model as "
                                 "plain text: for a chat model give --chat-template (vicuna, or a Jinja file)"], lines
    assert not load(str(tmp_path / "out")).tokenizer.has_chat_template
    rc, lines = run_convert(capsys, "--model", src, "--chat-template", "vicuna", "--out", tmp_path / "chat")
    assert rc == 0 and lines == [], lines
    assert load(str(tmp_path / "chat")).tokenizer.has_chat_template


def test_a_drafter_left_behind_is_noted(tmp_path, capsys, mlx_ckpt):
    """A converted model (with its drafter/) converted again without --drafter (to quantize it, say) gave a folder
    with no drafter, saying nothing: speculative decoding was then off for it. One note line names the drafter
    left behind and how to bring it along."""
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    model = tmp_path / "model"
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", drafter, "--out", model)[0] == 0
    rc, lines = run_convert(capsys, "--model", model, "--out", tmp_path / "again")
    assert rc == 0 and lines == [f"[convert] note: the drafter {model / 'drafter'} is not copied, so {tmp_path / 'again'} "
                                 f"loads without one: add --drafter {model / 'drafter'} to bring it along"], lines
    assert not (tmp_path / "again" / "drafter").exists()
    rc, lines = run_convert(capsys, "--model", model, "--drafter", model / "drafter", "--out", tmp_path / "with")
    assert rc == 0 and lines == [] and (tmp_path / "with" / "drafter" / "config.json").is_file(), lines


class Recording:
    """A Reporter that keeps what it was given, in order: ("say", text), ("bar", desc), ("close", desc)."""

    def __init__(self):
        self.events = []

    def say(self, text):
        self.events.append(("say", text))

    def note(self, text):
        self.events.append(("note", text))

    def bar(self, total=None, desc="", unit="tensor", unit_scale=False):
        events = self.events
        events.append(("bar", desc))

        class Bar:
            def update(self, n=1):
                pass

            def close(self):
                events.append(("close", desc))

        return Bar()


def test_writing_the_shards_is_said_before_it_starts(tmp_path, monkeypatch, mlx_ckpt):
    """After the "converting" bar ended, mlx-lm wrote the shards (minutes for a large model) with nothing on the
    screen: the conversion looked hung. A status line now says what it is doing, and how much."""
    import mlx_lm.utils

    save_model = mlx_lm.utils.save_model
    report = Recording()

    def recorded_save(*args, **kwargs):
        report.events.append(("save_model", ""))
        return save_model(*args, **kwargs)

    monkeypatch.setattr(mlx_lm.utils, "save_model", recorded_save)
    monkeypatch.setattr("convert.cli.Reporter", lambda quiet: report)
    assert convert_main(["--model", str(mlx_ckpt[0]), "--out", str(tmp_path / "out")]) == 0
    kinds = [kind for kind, _ in report.events]
    at = kinds.index("save_model")
    assert report.events[at - 2] == ("close", "converting")
    kind, said = report.events[at - 1]
    assert kind == "say" and said.startswith("writing the weights (") and said.endswith(" MB in 1 file)"), report.events


def _drafter_entry(manifest: Path):
    entry = dict(json.loads(manifest.read_text())["drafter"] or {})
    entry.pop("created", None)
    return entry


@pytest.mark.parametrize("had_drafter", [True, False])
def test_a_drafter_converted_into_a_model_folder_is_named_by_its_manifest(tmp_path, capsys, mlx_ckpt, had_drafter):
    """`--drafter D --base MODEL --out MODEL/drafter` left MODEL/manifest.json naming the drafter converted with
    the model (its source, config and sha256), or none: the folder described something it no longer held."""
    model = tmp_path / "model"
    old = write_numpy_drafter(tmp_path / "old", H, V, exit_dim=2 * H, layers=1, seed=1)
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], *(["--drafter", old] if had_drafter else []),
                            "--out", model)
    assert rc == 0, lines
    before = json.loads((model / "manifest.json").read_text())
    new = write_numpy_drafter(tmp_path / "new", H, V, exit_dim=2 * H, layers=2, seed=2)
    rc, lines = run_convert(capsys, "--drafter", new, "--base", model, "--out", model / "drafter",
                            *(["--force"] if had_drafter else []))
    assert rc == 0 and lines == [], lines
    after = json.loads((model / "manifest.json").read_text())
    entry = _drafter_entry(model / "manifest.json")
    assert entry == _drafter_entry(model / "drafter" / "manifest.json")
    assert entry["source"] == str(new) and entry["config"]["num_draft_layers"] == 2
    assert {k: v for k, v in after.items() if k != "drafter"} == {k: v for k, v in before.items() if k != "drafter"}
    assert sorted(p.name for p in model.iterdir() if p.name.startswith(".")) == []
    assert load(str(model)).drafter.args.num_draft_layers == 2


def test_a_drafter_converted_elsewhere_leaves_other_manifests_alone(tmp_path, capsys, mlx_ckpt):
    """Only MODEL/drafter is MODEL's drafter, and only a manifest this converter wrote is changed."""
    model = tmp_path / "model"
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--out", model)[0] == 0
    manifest = (model / "manifest.json").read_text()
    new = write_numpy_drafter(tmp_path / "new", H, V, exit_dim=2 * H, layers=1)
    assert run_convert(capsys, "--drafter", new, "--base", model, "--out", model / "other")[0] == 0
    assert (model / "manifest.json").read_text() == manifest
    (model / "manifest.json").write_text('{"tool": "something else", "drafter": null}')
    assert run_convert(capsys, "--drafter", new, "--base", model, "--out", model / "drafter")[0] == 0
    assert (model / "manifest.json").read_text() == '{"tool": "something else", "drafter": null}'


def test_a_drafter_that_fails_leaves_the_model_manifest_as_it_was(tmp_path, capsys, mlx_ckpt):
    model = tmp_path / "model"
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--out", model)[0] == 0
    manifest = (model / "manifest.json").read_text()
    other = write_numpy_drafter(tmp_path / "d", 48, V, exit_dim=96, layers=1)  # for another model
    rc, lines = run_convert(capsys, "--drafter", other, "--base", model, "--out", model / "drafter")
    assert_clean_failure(rc, lines, model / "drafter", "hidden size 48")
    assert (model / "manifest.json").read_text() == manifest


def test_ctrl_c_as_a_drafter_goes_into_a_model_folder_still_names_it(tmp_path, capsys, monkeypatch, mlx_ckpt,
                                                                       ctrl_c_raises):
    """Ctrl-C is held while the drafter is renamed in: the model's manifest is updated in the same moment."""
    model = tmp_path / "model"
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--out", model)[0] == 0
    new = write_numpy_drafter(tmp_path / "new", H, V, exit_dim=2 * H, layers=2)
    ctrl_c_as_renamed_to(monkeypatch, model / "drafter")
    rc, lines = run_convert(capsys, "--drafter", new, "--base", model, "--out", model / "drafter")
    assert rc == 130 and len(lines) == 1 and "is whole" in lines[0], lines
    assert _drafter_entry(model / "manifest.json")["source"] == str(new)


def test_force_on_a_linked_output_replaces_the_folder_it_links_to(tmp_path, capsys, mlx_ckpt):
    """`--out LINK --force` replaced the link itself with a real folder: the model landed beside the link (not on
    the disk it pointed to), the folder it pointed to kept the old model, and the link was gone. The link is now
    followed, as `cp` or a shell's `>` would, and stays."""
    (tmp_path / "big disk").mkdir()
    real = tmp_path / "big disk" / "vicuna"
    real.mkdir()
    (real / "config.json").write_text("{}")
    (real / "old.safetensors").write_text("old")
    (tmp_path / "models").mkdir()
    link = tmp_path / "models" / "vicuna"
    link.symlink_to(Path("..") / "big disk" / "vicuna")
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", link)
    assert rc != 0 and lines == [f"{ERROR}output folder {link} (a link to {real}) already exists (use --force to "
                                 "replace it)"], lines
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", link, "--force")
    assert rc == 0, lines
    assert link.is_symlink() and link.resolve() == real.resolve()
    assert not (real / "old.safetensors").exists() and (real / "model.safetensors").is_file()
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["vicuna"]  # no staging folder left by the link
    assert [p.name for p in (tmp_path / "big disk").iterdir()] == ["vicuna"]
    assert load(str(link)).model.args.hidden_size == H


def test_a_linked_output_gets_the_same_checks_as_the_folder_it_links_to(tmp_path, capsys, mlx_ckpt):
    """--force on a link to a folder that is no model's is refused as that folder is, a link to a folder not yet
    made makes it, and a link that loops is one line."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text("keep")
    link = tmp_path / "out"
    link.symlink_to(src)
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", link, "--force")
    assert rc != 0 and len(lines) == 1 and "replaces only a model or drafter folder" in lines[0], lines
    assert (src / "main.py").read_text() == "keep" and link.is_symlink()
    dangling = tmp_path / "later"
    dangling.symlink_to(tmp_path / "made" / "later")
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", dangling)
    assert rc == 0, lines
    assert dangling.is_symlink() and (tmp_path / "made" / "later" / "model.safetensors").is_file()
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", loop, "--force")
    assert rc != 0 and lines == [f"{ERROR}output {loop} is a symbolic link that leads to itself (a loop)"], lines
    # a link to a model's input is still refused by --force
    model_link = tmp_path / "to-input"
    model_link.symlink_to(mlx_ckpt[0])
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", model_link, "--force")
    assert rc != 0 and len(lines) == 1 and "--force would delete the input" in lines[0], lines
    assert (mlx_ckpt[0] / "model.safetensors").is_file()


def convert_in_child(setup: str, *argv):
    """`python -m convert ARGV --quiet` in a child process with SIGTERM and SIGHUP at their defaults, after the
    Python code `setup` ran there (a signal that the code under test failed to catch then kills the child, not
    pytest): (exit code, stderr lines)."""
    code = ("import signal, sys\n"
            "signal.signal(signal.SIGTERM, signal.SIG_DFL); signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
            "from convert.cli import main\n" + setup + "\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, *map(str, argv), "--quiet"], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=300)
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.startswith(ERROR)]


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_signal_while_the_shards_are_written_leaves_nothing(tmp_path, mlx_ckpt, name):
    """SIGHUP (the terminal closed, an ssh session dropped) killed the conversion where it stood: a hidden,
    half-written model (gigabytes) stayed beside the output until something next looked there. It is cleaned up
    as SIGTERM is, with the exit code a shell gives it (128 + the signal)."""
    import signal

    setup = f"""
import mlx_lm.utils
save_model = mlx_lm.utils.save_model
def save_then_signal(*args, **kwargs):
    save_model(*args, **kwargs)
    signal.raise_signal(signal.{name})
mlx_lm.utils.save_model = save_then_signal
"""
    out = tmp_path / "out"
    rc, lines = convert_in_child(setup, "--model", mlx_ckpt[0], "--out", out)
    assert rc == 128 + getattr(signal, name) and lines == [f"{ERROR}cancelled; nothing was written"], (rc, lines)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_signal_before_the_output_folder_is_made_says_so(tmp_path, mlx_ckpt, name):
    """The output folder turns SIGTERM and SIGHUP into a clean stop once it is made; one that came before (as the
    modules imported, the arguments were read or the model resolved, fetched or opened: the first second or more)
    ended the process saying nothing. It stops there as later, with nothing written."""
    import signal

    setup = f"""
from convert import checkpoint
resolve = checkpoint.resolve
def signal_then_resolve(*args, **kwargs):
    signal.raise_signal(signal.{name})
    return resolve(*args, **kwargs)
checkpoint.resolve = signal_then_resolve
"""
    out = tmp_path / "out"
    rc, lines = convert_in_child(setup, "--model", mlx_ckpt[0], "--out", out)
    assert rc == 128 + getattr(signal, name) and lines == [f"{ERROR}cancelled; nothing was written"], (rc, lines)
    assert list(tmp_path.iterdir()) == []
    # as `python -m convert` imports its modules, before main runs
    code = f"""import builtins, runpy, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_DFL); signal.signal(signal.SIGHUP, signal.SIG_DFL)
real = builtins.__import__
def importing(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 1 and name == "cli" and (globals or {{}}).get("__package__") == "convert":
        signal.raise_signal(signal.{name})
    return real(name, globals, locals, fromlist, level)
builtins.__import__ = importing
sys.argv = ["convert", "--model", {str(mlx_ckpt[0])!r}, "--out", {str(out)!r}, "--quiet"]
runpy.run_module("convert", run_name="__main__", alter_sys=True)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=300)
    assert (proc.returncode, proc.stderr) == (128 + getattr(signal, name), f"{ERROR}cancelled; nothing was written\n")
    assert list(tmp_path.iterdir()) == []


def test_a_second_signal_while_cleaning_up_still_leaves_nothing(tmp_path, mlx_ckpt):
    """A second SIGTERM or Ctrl-C (pressed again while nothing seemed to happen) that came while the staging folder
    was deleted stopped the deletion: a hidden, half-deleted model (gigabytes) stayed beside the output, under
    "cancelled; nothing was written". The cleanup holds signals until it is done."""
    setup = """
import shutil, mlx_lm.utils
from convert import output
save_model = mlx_lm.utils.save_model
def save_then_signal(*args, **kwargs):
    save_model(*args, **kwargs)
    signal.raise_signal(signal.SIGTERM)
mlx_lm.utils.save_model = save_then_signal
rmtree = shutil.rmtree
def signal_again(*args, **kwargs):
    signal.raise_signal(signal.SIGTERM)
    return rmtree(*args, **kwargs)
output.shutil.rmtree = signal_again
"""
    out = tmp_path / "out"
    rc, lines = convert_in_child(setup, "--model", mlx_ckpt[0], "--out", out)
    assert rc == 143 and lines == [f"{ERROR}cancelled; nothing was written"], (rc, lines)
    assert list(tmp_path.iterdir()) == []


def test_sighup_as_the_output_is_renamed_in_is_held(tmp_path, mlx_ckpt):
    """Like Ctrl-C and SIGTERM, SIGHUP waits for the renames that put the output in place (it could stop between
    them, with the old folder set aside and none in place)."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "manifest.json").write_text("{}")  # an earlier conversion
    setup = f"""
from redrafter_mlx import files
rename = files.os.rename
def rename_and_hang_up(a, b):
    if str(a) == {str(out)!r}:  # the old folder set aside: the new one is not in place yet
        signal.raise_signal(signal.SIGHUP)
    return rename(a, b)
files.os.rename = rename_and_hang_up
"""
    rc, lines = convert_in_child(setup, "--model", mlx_ckpt[0], "--out", out, "--force")
    assert rc == 129 and lines == [f"{ERROR}SIGHUP came as the output was renamed into place; {out} is whole"], \
        (rc, lines)
    assert (out / "model.safetensors").is_file() and [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_damaged_generation_config_is_refused_not_copied(tmp_path, capsys, mlx_ckpt):
    """generation_config.json is copied as is: a damaged one was, the conversion succeeded, and
    redrafter_mlx.load then refused the folder it had written."""
    src = shutil.copytree(mlx_ckpt[0], tmp_path / "src")
    (src / "generation_config.json").write_text('{"eos_token_id": 2,')
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"{src / 'generation_config.json'} is not valid JSON")


@pytest.mark.parametrize("eos", ['"</s>"', "[2, 2.5]", "-1", "true"])
def test_a_generation_config_with_a_bad_stop_token_is_refused(tmp_path, capsys, mlx_ckpt, eos):
    """A generation_config.json whose eos_token_id is no token id (a token's text, 2.5) was copied as is: the
    conversion succeeded, and loading the folder it wrote then failed ("eos_token_id holds '</s>', not a token
    id"), after all the work."""
    src = shutil.copytree(mlx_ckpt[0], tmp_path / "src")
    (src / "generation_config.json").write_text(f'{{"bos_token_id": 1, "eos_token_id": {eos}}}')
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"{src / 'generation_config.json'}: eos_token_id holds", "not a token id")


@pytest.mark.parametrize("name, data", [("tokenizer.json", b""), ("tokenizer_config.json", b"{oops"),
                                        ("special_tokens_map.json", b"\xff\xfe")])
def test_a_damaged_tokenizer_file_is_named(tmp_path, capsys, mlx_ckpt, name, data):
    """It said "cannot load the tokenizer in SRC: Expecting value: line 1 column 1 (char 0)", naming no file."""
    src = shutil.copytree(mlx_ckpt[0], tmp_path / "src")
    (src / name).write_bytes(data)
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"{src / name} is not valid JSON")


def test_a_tokenizer_that_asks_to_run_code_is_refused_as_such(tmp_path, capsys, mlx_ckpt):
    """A tokenizer_config.json naming a tokenizer class of the checkpoint's own code (auto_map) said "cannot load the
    tokenizer in SRC: The repository SRC contains custom code which must be executed to correctly load the model.",
    as if it were a step left to the user; the converter never runs it, and says so."""
    src = shutil.copytree(mlx_ckpt[0], tmp_path / "src")
    config = json.loads((src / "tokenizer_config.json").read_text())
    config.update(auto_map={"AutoTokenizer": ["tokenization_mine.MyTokenizer", None]}, tokenizer_class="MyTokenizer")
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    (src / "tokenization_mine.py").write_text("raise SystemExit('ran')\n")
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert_clean_failure(rc, lines, out, f"{src / 'tokenizer_config.json'}: its auto_map asks to build the tokenizer "
                         "by running 'tokenization_mine.MyTokenizer' from the checkpoint, which this converter never does")


def test_a_tokenizer_larger_than_the_model_s_vocabulary_is_noted(tmp_path, capsys, mlx_ckpt):
    """A tokenizer with ids past the model's embedding table (another model's tokenizer, put in by hand) converted
    saying nothing; every prompt that used one was then refused ("its tokenizer files do not belong to its
    weights"). A note names how many and the first of them."""
    from transformers import AutoTokenizer

    src = shutil.copytree(mlx_ckpt[0], tmp_path / "src")
    hf = AutoTokenizer.from_pretrained(str(src))
    hf.add_tokens([f"<extra_{i}>" for i in range(V + 2 - len(hf))])
    hf.save_pretrained(str(src))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", src, "--out", out)
    assert rc == 0 and len(lines) == 1, lines
    assert f"the tokenizer has {V + 2} tokens, 2 past the model's vocabulary of {V} (<extra_" in lines[0], lines


def test_force_without_a_drafter_never_deletes_the_one_in_the_folder(tmp_path, capsys, mlx_ckpt):
    """`--model SRC --out MODEL --force` deleted MODEL/drafter with the old folder (one redrafter-train installed
    there after hours of training included), and the new folder loaded without one, saying nothing."""
    model = tmp_path / "model"
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", drafter, "--out", model)[0] == 0
    before = sorted(p.name for p in (model / "drafter").iterdir())
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", model, "--force")
    assert rc != 0 and len(lines) == 1 and f"--force would delete the drafter in {model / 'drafter'}" in lines[0], \
        lines
    assert sorted(p.name for p in (model / "drafter").iterdir()) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # given a drafter, or with the old one removed, --force goes on
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", drafter, "--out", model, "--force")[0] == 0
    shutil.rmtree(model / "drafter")
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--out", model, "--force")[0] == 0
    assert not (model / "drafter").exists()


def test_force_never_deletes_the_drafter_redrafter_train_kept(tmp_path, capsys, mlx_ckpt):
    """redrafter-train keeps the drafter it replaces as MODEL/drafter.previous; `--force` deleted it with the old
    folder, with or without --drafter."""
    model = tmp_path / "model"
    drafter = write_numpy_drafter(tmp_path / "d", H, V, exit_dim=2 * H, layers=1)
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", drafter, "--out", model)[0] == 0
    (model / "drafter").rename(model / "drafter.previous")
    before = sorted(p.name for p in (model / "drafter.previous").iterdir())
    for given in ([], ["--drafter", str(drafter)]):
        rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], *given, "--out", model, "--force")
        assert rc != 0 and len(lines) == 1 and f"kept in {model / 'drafter.previous'}" in lines[0], lines
        assert sorted(p.name for p in (model / "drafter.previous").iterdir()) == before
    shutil.rmtree(model / "drafter.previous")
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", drafter, "--out", model, "--force")[0] == 0


def test_a_model_manifest_that_cannot_be_rewritten_is_a_note_not_a_failure(tmp_path, capsys, monkeypatch, mlx_ckpt):
    """The drafter is already in place when MODEL/manifest.json is rewritten: a failure there is said as a note (the
    conversion is done), not as "error: ... nothing was written"."""
    import errno

    from redrafter_mlx import files

    model = tmp_path / "model"
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--out", model)[0] == 0
    manifest = (model / "manifest.json").read_text()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_json", full_disk)
    new = write_numpy_drafter(tmp_path / "new", H, V, exit_dim=2 * H, layers=1)
    rc, lines = run_convert(capsys, "--drafter", new, "--base", model, "--out", model / "drafter")
    assert rc == 0 and lines == [f"[convert] note: {model / 'manifest.json'} still describes the drafter that was "
                                 "there before ([Errno 28] No space left on device)"], lines
    assert (model / "drafter" / "model.safetensors").is_file() and (model / "manifest.json").read_text() == manifest


def test_a_drafter_s_tuned_beam_shape_comes_along(tmp_path, capsys, mlx_ckpt):
    """README: `--drafter models/smollm2-135m/drafter` brings the shipped drafter along; its beam_shape.json (the
    shape `redrafter-bench --tune` found, which load() reads from the drafter's folder) was left behind, and the
    converted model drafted with the untuned default."""
    from redrafter_mlx.tuning import device_keys

    src = tmp_path / "ours"
    save_drafter(Drafter(DrafterArgs(hidden_size=H, vocab_size=V, base_model_type="llama")), src)
    (src / "beam_shape.json").write_text(json.dumps({device_keys()[-1]: {"beam_width": 3, "beam_length": 5}}))
    out = tmp_path / "model"
    assert run_convert(capsys, "--model", mlx_ckpt[0], "--drafter", src, "--out", out)[0] == 0
    assert load(str(out)).beam_shape == (3, 5)
    assert "beam_shape.json" in json.loads((out / "manifest.json").read_text())["drafter"]["sha256"]


def test_a_group_size_that_leaves_layers_unquantized_is_refused_or_noted(tmp_path, capsys, mlx_ckpt):
    """mlx-lm quantizes only the layers whose input width is a multiple of the group size, silently: with
    `--q-group-size 128`, a model of hidden size 576 (the default smollm2-135m) came out float16 but for its down
    projections, under a config saying 4-bit. Refused where another group size quantizes every layer; noted where
    none does."""
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--quantize", "--q-group-size", "128", "--out", out)
    assert_clean_failure(rc, lines, out, "7 of 8 layers would stay unquantized (input width 64, not a multiple of "
                         "--q-group-size 128): use --q-group-size 64")
    config = dict(model_type="llama", hidden_size=H, num_hidden_layers=1, intermediate_size=80, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=V, tie_word_embeddings=True, rms_norm_eps=1e-5)
    src = tmp_path / "odd"
    src.mkdir()
    mx.save_safetensors(str(src / "model.safetensors"), dict(tree_flatten(new_model(config, 3).parameters())))
    (src / "config.json").write_text(json.dumps(config))
    write_tokenizer(src)
    rc, lines = run_convert(capsys, "--model", src, "--quantize", "--q-group-size", "32", "--out", out)
    assert rc == 0 and lines == ["[convert] note: 1 of 8 layers stay unquantized (input width 80, not a multiple "
                                 "of --q-group-size 32)"], lines
    weights = mx.load(str(out / "model.safetensors"))
    assert "model.layers.0.mlp.down_proj.scales" not in weights and "model.layers.0.mlp.up_proj.scales" in weights


def test_a_disk_without_room_for_the_weights_is_refused_before_the_long_part(tmp_path, capsys, monkeypatch, mlx_ckpt):
    """A full disk failed the write at the very end ("is the disk full"), after minutes of reading and casting a
    large model: the room the weights need is checked before that."""
    import collections

    import convert.base_model

    materialized = []
    monkeypatch.setattr(convert.base_model, "_materialize", lambda *args: materialized.append(1))
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(convert.base_model.shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9 - 1000, 1000))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", mlx_ckpt[0], "--out", out)
    assert_clean_failure(rc, lines, out, "the weights need 0.2 MB and", "has 0.0 MB free")
    assert materialized == []


def test_a_disk_without_room_for_bin_shards_rewritten_is_refused_first(tmp_path, capsys, monkeypatch, hf_dirs):
    """.bin shards are first rewritten whole as safetensors in the output's staging folder: on a disk without room
    for that copy, the room was checked only after it, which had failed ("is the disk full") minutes in."""
    import collections

    import convert.base_model

    rewritten = []
    monkeypatch.setattr(convert.base_model, "pytorch_to_safetensors", lambda *args: rewritten.append(1))
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(convert.base_model.shutil, "disk_usage", lambda path: usage(10 ** 9, 10 ** 9 - 1000, 1000))
    out = tmp_path / "out"
    rc, lines = run_convert(capsys, "--model", hf_dirs["bin"], "--out", out)
    assert_clean_failure(rc, lines, out, "rewriting the .bin shards as safetensors needs 0.", "has 0.0 MB free")
    assert rewritten == []
