"""Shared fixtures: tiny random Llama models the tests write themselves, and the default model.

- `tiny_kit` (session): builders for tiny models, tokenizers, model folders and GGUF files
  (see `TinyKit`). Everything is generated here, nothing is downloaded.
- `tiny_model_dir` (function): a Hugging Face-style folder (config.json, model.safetensors with
  HF names, tokenizer files with a chat template) for `tiny_kit.model(seed=0)`.
- `tiny_loaded` (function): `load(tiny_model_dir)`, a fresh LoadedModel a test may modify.
- `default_model` (session): `load("smollm2-135m")`; skipped when it cannot be fetched.
- `shared_data` (session): the repository's sibling folder ../shared/data (may be absent).
"""

import json
import sys
from pathlib import Path

import pytest

import redrafter_mlx  # noqa: F401  first, before any test module imports mlx.core (loads OpenBLAS; see _platform)

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py stays importable

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# ChatML, the template family of SmolLM2 and many instruct models.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Merges over GPT-2 byte-level characters. Besides a few English ones, they make some tokens
# hold part of a multi-byte character: "é" whole, the first two of the three bytes of "日",
# and "🙂" split in two two-byte tokens, so detokenization must wait for the missing bytes.
MERGE_TEXTS = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("1", "2")]
MERGE_BYTES = [(b"\xc3", b"\xa9"), (b"\xe6", b"\x97"), (b"\xf0", b"\x9f"), (b"\x99", b"\x82")]

# llama.cpp tensor names for HF names (the inverse of redrafter_mlx.gguf.TENSOR_NAMES).
GGUF_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
GGUF_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies hold)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def permute_for_gguf(w, n_heads: int):
    """HF (half-split rotary) Q/K rows -> GGUF's interleaved order (llama.cpp's convert `permute`)."""
    out, inp = w.shape
    return w.reshape(n_heads, 2, out // n_heads // 2, inp).swapaxes(1, 2).reshape(out, inp)


class _Config(dict):
    """Attribute access to a config dict, with Llama defaults."""

    def __getattr__(self, key):
        defaults = {"num_key_value_heads": self.get("num_attention_heads"), "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
        return self[key] if key in self else defaults[key]


class TinyKit:
    """Builders for tiny models. Defaults: hidden 32, 2 layers, 4 heads / 2 KV heads (GQA),
    untied output, vocabulary = the tiny byte-level tokenizer's (259 + merges)."""

    CHAT_TEMPLATE = CHAT_TEMPLATE
    SPECIALS = SPECIALS

    def __init__(self):
        self._hf = None

    # ---- tokenizer -------------------------------------------------------------------
    def hf_tokenizer(self):
        """A byte-level BPE `PreTrainedTokenizerFast` with ChatML specials and chat template."""
        if self._hf is None:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers
            from transformers import PreTrainedTokenizerFast

            b2u = bytes_to_unicode()
            vocab = {b2u[b]: b for b in range(256)}
            merges = list(MERGE_TEXTS) + [
                ("".join(b2u[c] for c in a), "".join(b2u[c] for c in b)) for a, b in MERGE_BYTES
            ]
            for a, b in merges:
                vocab.setdefault(a + b, len(vocab))
            tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|endoftext|>")
            hf.add_special_tokens({"additional_special_tokens": SPECIALS})
            hf.chat_template = CHAT_TEMPLATE
            self._hf = hf
        return self._hf

    @property
    def vocab_size(self) -> int:
        return len(self.hf_tokenizer())

    def token_id(self, token: str) -> int:
        return self.hf_tokenizer().convert_tokens_to_ids(token)

    # ---- models ----------------------------------------------------------------------
    def config(self, **kw) -> dict:
        """A tiny config.json: Llama unless model_type=... names another mlx-lm family."""
        cfg = dict(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=self.vocab_size,
                   max_position_embeddings=1024, tie_word_embeddings=False, rms_norm_eps=1e-5,
                   rope_theta=10000.0, rope_traditional=False)
        cfg.update(kw)
        return cfg

    def model(self, seed: int = 0, **kw):
        """A random tiny model (deterministic for a seed), built by mlx-lm for its config."""
        from redrafter_mlx.loader import new_model

        return new_model(self.config(**kw), seed)

    @staticmethod
    def weights(model):
        from mlx.utils import tree_flatten

        return dict(tree_flatten(model.parameters()))

    # ---- files -----------------------------------------------------------------------
    def write_folder(self, path, model=None, quantize=None, dtype=None, tokenizer=True, config_extra=None, **kw):
        """A Hugging Face / mlx-community style folder (config.json, model.safetensors, tokenizer).

        quantize: None, (bits, group_size), or {"bits", "group_size", "overrides": {module path:
        {"bits", "group_size"} or False}}: quantized in place with mlx-lm's quantize_model.
        dtype: cast floating weights before writing. config_extra: keys added to config.json."""
        import mlx.core as mx

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        model = model if model is not None else self.model(**kw)
        config = {k: v for k, v in model.config.items() if v is not None}
        if quantize:
            # mlx-lm's own quantizer writes the "quantization" block exactly as mlx-community has it.
            from mlx_lm.utils import quantize_model

            q = dict(quantize) if isinstance(quantize, dict) else {"bits": quantize[0], "group_size": quantize[1]}
            overrides = q.get("overrides", {})
            _, config = quantize_model(model.model, config, q["group_size"], q["bits"],
                                           quant_predicate=lambda p, m: overrides.get(p, True))
        weights = self.weights(model)
        if dtype is not None:
            weights = {k: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}
        if tokenizer:
            self.hf_tokenizer().save_pretrained(str(path))
            config["eos_token_id"] = self.token_id("<|im_end|>")
            config["bos_token_id"] = self.token_id("<|endoftext|>")
        config.update(config_extra or {})
        (path / "config.json").write_text(json.dumps(config, indent=1))
        mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
        return path

    def gguf_metadata(self, model, arch: str = "llama") -> dict:
        import mlx.core as mx

        a = _Config(model.config)
        hf = self.hf_tokenizer()
        vocab = hf.get_vocab()
        tokens = [None] * a.vocab_size
        for t, i in vocab.items():
            if i < a.vocab_size:
                tokens[i] = t
        types = []
        for i, t in enumerate(tokens):
            if t is None:
                tokens[i] = f"<unused{i}>"
                types.append(5)
            else:
                types.append(3 if t in SPECIALS else 1)
        merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(hf.backend_tokenizer.to_str())["model"]["merges"]]
        u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
        f32 = lambda v: mx.array(v, dtype=mx.float32)  # noqa: E731
        return {
            "general.architecture": arch,
            "general.name": "tiny",
            f"{arch}.embedding_length": u32(a.hidden_size),
            f"{arch}.block_count": u32(a.num_hidden_layers),
            f"{arch}.feed_forward_length": u32(a.intermediate_size),
            f"{arch}.attention.head_count": u32(a.num_attention_heads),
            f"{arch}.attention.head_count_kv": u32(a.num_key_value_heads),
            f"{arch}.attention.layer_norm_rms_epsilon": f32(a.rms_norm_eps),
            f"{arch}.rope.freq_base": f32(a.rope_theta),
            f"{arch}.context_length": u32(a.max_position_embeddings),
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "gpt2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": u32(vocab["<|im_end|>"]),
            "tokenizer.ggml.bos_token_id": u32(vocab["<|endoftext|>"]),
            "tokenizer.chat_template": CHAT_TEMPLATE,
        }

    def gguf_tensors(self, model, dtype=None) -> dict:
        """llama.cpp-named tensors of a half-split-rope model, Q/K permuted to GGUF's interleaved
        order. dtype (e.g. mx.float16) applies to matrices; norms stay float32 as llama.cpp does."""
        import mlx.core as mx
        import numpy as np

        a = _Config(model.config)
        out = {}
        for k, v in self.weights(model).items():
            base, suffix = k.rsplit(".", 1)
            if base in GGUF_GLOBAL:
                name = GGUF_GLOBAL[base]
            else:
                parts = base.split(".")
                layer, mod = parts[2], ".".join(parts[3:])
                name = f"blk.{layer}.{GGUF_LAYER[mod]}"
                if mod == "self_attn.q_proj":
                    v = mx.array(permute_for_gguf(np.array(v), a.num_attention_heads))
                elif mod == "self_attn.k_proj":
                    v = mx.array(permute_for_gguf(np.array(v), a.num_key_value_heads))
            if dtype is not None and v.ndim == 2:
                v = v.astype(dtype)
            out[f"{name}.{suffix}"] = v
        return out

    def write_gguf(self, path, model=None, arch: str = "llama", dtype=None, meta_extra=None, drop_meta=(), **kw):
        """A GGUF file (float32, or `dtype` matrices) with config and tokenizer in its metadata."""
        import mlx.core as mx

        model = model if model is not None else self.model(**kw)
        meta = self.gguf_metadata(model, arch)
        meta.update(meta_extra or {})
        for k in drop_meta:
            meta.pop(k, None)
        mx.save_gguf(str(path), self.gguf_tensors(model, dtype), meta)
        return Path(path)


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt for the test, as in a terminal: a shell starts a background job
    (`bash .ci/run &`) with SIGINT ignored, and a signal the code holds and then delivers again is
    then lost, so the tests that press Ctrl-C failed there."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def tiny_kit():
    return TinyKit()


@pytest.fixture
def tiny_model_dir(tiny_kit, tmp_path):
    return tiny_kit.write_folder(tmp_path / "tiny-model", tiny_kit.model(seed=0))


@pytest.fixture
def tiny_loaded(tiny_model_dir):
    from redrafter_mlx import load

    return load(str(tiny_model_dir), use_drafter=False)


@pytest.fixture(scope="session")
def shared_data():
    return SHARED_DATA


@pytest.fixture(scope="session")
def default_model():
    """The registry's default model, loaded once per session (weight_format "auto")."""
    from redrafter_mlx import load
    from redrafter_mlx.errors import NetworkError

    try:
        return load("smollm2-135m")
    except NetworkError as e:  # a fresh machine without network: nothing to test against
        pytest.skip(f"default model not cached and not downloadable: {e}")
