"""Builders for tiny models the tests write themselves (folders, GGUF files, tokenizers)."""

import contextlib
import json
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from redrafter_mlx.base_model import TreeModel as Model
from redrafter_mlx.loader import new_model

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_config(vocab=300, **kw) -> dict:
    """A tiny Llama config.json (any mlx-lm family with model_type=...)."""
    cfg = dict(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=512, tie_word_embeddings=False,
               rms_norm_eps=1e-5, rope_theta=10000.0, rope_traditional=False)
    cfg.update(kw)
    return cfg


def tiny_model(seed=0, **kw) -> Model:
    return new_model(tiny_config(**kw), seed)


def byte_level_tokenizer(vocab_size=300):
    """A byte-level BPE tokenizer (256 bytes + a few merges + chat specials) as a transformers
    fast tokenizer with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(sorted(byte_chars))}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    hf.add_special_tokens({"additional_special_tokens": SPECIALS})
    hf.chat_template = CHAT_TEMPLATE
    assert len(hf) <= vocab_size
    return hf


def write_folder(path: Path, model: Model = None, quantize=None, **kw) -> Path:
    """A Hugging Face-style folder: config.json, model.safetensors, tokenizer files."""
    path.mkdir(parents=True, exist_ok=True)
    model = model or tiny_model(**kw)
    config = {k: v for k, v in model.config.items() if v is not None}
    config["eos_token_id"] = None
    if quantize:
        import mlx.nn as nn

        nn.quantize(model, group_size=quantize[1], bits=quantize[0])
        config["quantization"] = {"group_size": quantize[1], "bits": quantize[0]}
    hf = byte_level_tokenizer(config["vocab_size"])
    hf.save_pretrained(str(path))
    config["eos_token_id"] = hf.convert_tokens_to_ids("<|im_end|>")
    (path / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


class _Config(dict):
    """Attribute access to a config dict, with Llama defaults."""

    def __getattr__(self, key):
        defaults = {"num_key_value_heads": self.get("num_attention_heads"), "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
        return self[key] if key in self else defaults[key]


def permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF (half-split rotary) Q/K rows -> GGUF's interleaved order (llama.cpp's convert permute)."""
    out, inp = w.shape
    return w.reshape(n_heads, 2, out // n_heads // 2, inp).swapaxes(1, 2).reshape(out, inp)


def write_gguf(path: Path, model: Model, arch="llama") -> Path:
    """A float32 GGUF of a (half-split rope) model, with llama.cpp's names, Q/K permutation
    and a byte-level BPE tokenizer in the metadata."""
    a = _Config(model.config)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    tensors = {}
    for k, v in tree_flatten(model.parameters()):
        v = np.array(v)
        if k in names:
            tensors[names[k]] = v
            continue
        layer, rest = k.split(".")[2], ".".join(k.split(".")[3:])
        mod = rest.rsplit(".", 1)[0]
        if mod == "self_attn.q_proj":
            v = permute_for_gguf(v, a.num_attention_heads)
        if mod == "self_attn.k_proj":
            v = permute_for_gguf(v, a.num_key_value_heads)
        tensors[f"blk.{layer}.{per_layer[mod]}.weight"] = v
    hf = byte_level_tokenizer(a.vocab_size)
    vocab = hf.get_vocab()
    tokens = [None] * a.vocab_size
    for t, i in vocab.items():
        tokens[i] = t
    types = [1] * a.vocab_size
    for i, t in enumerate(tokens):
        if t is None:
            tokens[i], types[i] = f"<unused{i}>", 5
        elif t in SPECIALS:
            types[i] = 3
    import json as _json

    merges = [" ".join(m) if isinstance(m, (list, tuple)) else m
              for m in _json.loads(hf.backend_tokenizer.to_str())["model"]["merges"]]
    meta = {
        "general.architecture": arch,
        f"{arch}.embedding_length": mx.array(a.hidden_size, dtype=mx.uint32),
        f"{arch}.block_count": mx.array(a.num_hidden_layers, dtype=mx.uint32),
        f"{arch}.feed_forward_length": mx.array(a.intermediate_size, dtype=mx.uint32),
        f"{arch}.attention.head_count": mx.array(a.num_attention_heads, dtype=mx.uint32),
        f"{arch}.attention.head_count_kv": mx.array(a.num_key_value_heads, dtype=mx.uint32),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(a.rms_norm_eps, dtype=mx.float32),
        f"{arch}.rope.freq_base": mx.array(a.rope_theta, dtype=mx.float32),
        f"{arch}.context_length": mx.array(a.max_position_embeddings, dtype=mx.uint32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": mx.array(vocab["<|im_end|>"], dtype=mx.uint32),
        "tokenizer.ggml.bos_token_id": mx.array(vocab["<|endoftext|>"], dtype=mx.uint32),
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    mx.save_gguf(str(path), {k: mx.array(v) for k, v in tensors.items()}, meta)
    return path


def write_shards(folder: Path, weights: dict, index: dict = None) -> dict:
    """Write `weights` as two safetensors shards in `folder`, and their model.safetensors.index.json
    (holding `index` beside its weight_map) unless index is None. Returns {shard name: tensor names}."""
    import json

    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        mx.save_safetensors(str(folder / shard), {k: weights[k] for k in keys})
    if index is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {**index, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    return shards


def undocumented_settings(fn, skip=("loaded", "prompt")) -> dict:
    """The settings of `fn` whose entry in its docstring is missing or does not say its default: {name: why}.
    An entry starts with the name and a colon ("seed: ...", or "beam_width/beam_length: ..." for two) and runs to
    the next entry; one for a setting with a default says it, with the word "default"."""
    import inspect
    import re

    doc = " ".join((fn.__doc__ or "").split())
    names = [n for n in inspect.signature(fn).parameters if n not in skip]
    every = [n for n in inspect.signature(fn).parameters]
    starts = sorted((m.start(), m.group(1)) for m in re.finditer(
        r"(?:^|(?<=[\s(]))((?:\w+/)*(?:" + "|".join(every) + r")(?:/\w+)*): ", doc))
    entries = {}
    for i, (at, label) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(doc)
        for name in label.split("/"):
            entries.setdefault(name, doc[at:end])
    required = {n for n, p in inspect.signature(fn).parameters.items() if p.default is inspect.Parameter.empty}
    return {n: ("no entry" if n not in entries else "no default said") for n in names
            if n not in entries or (n not in required and "default" not in entries[n])}


def ctrl_c_as_renamed_to(monkeypatch, target: Path):
    """Press Ctrl-C (SIGINT) as files.py renames something to `target`, then let the rename go on:
    what holds signals around a folder swap must finish it before the interrupt lands."""
    import os
    import signal

    from redrafter_mlx import files

    rename = os.rename

    def rename_and_press_ctrl_c(a, b):
        if Path(b) == Path(target):
            signal.raise_signal(signal.SIGINT)
        return rename(a, b)

    monkeypatch.setattr(files.os, "rename", rename_and_press_ctrl_c)


@contextlib.contextmanager
def piped(text: str):
    """A path that is a pipe holding `text`, as a shell's process substitution gives (`--prompts <(head -4 q.jsonl)`:
    /dev/fd/63, not a regular file); it can be read once."""
    import os

    r, w = os.pipe()
    try:
        os.write(w, text.encode())  # (small: the pipe's buffer holds it)
        os.close(w)
        yield Path(f"/dev/fd/{r}")
    finally:
        os.close(r)


# What a command may be doing when Ctrl-C comes, for the tests of the message said after it (cli.run's, the bench's):
# a newline goes before it only where the line was not ended since. Each takes and ignores any arguments, so that it
# can stand in for what it interrupts (a command's body, loader.load).

def closes_its_bar(*a, **k):
    """Ctrl-C within a progress bar ("fetch 1/4") closed on the way out: tqdm ends its line."""
    import signal

    from tqdm import tqdm

    bar = tqdm(total=4, desc="fetch", bar_format="{desc} {n}/{total}", mininterval=0)
    try:
        bar.update(1)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C
    finally:
        bar.close()


def leaves_its_bar(*a, **k):
    """Ctrl-C with a bar left mid-line ("\\rfetch 1/4", no newline)."""
    import signal
    import sys

    print("\rfetch 1/4", end="", file=sys.stderr)
    signal.raise_signal(signal.SIGINT)


def said_a_line_then_ctrl_c(*a, **k):
    """Ctrl-C after a whole line: the terminal echoes "^C" at the start of the next line."""
    import signal
    import sys

    print("loading the model", file=sys.stderr)
    signal.raise_signal(signal.SIGINT)

