"""Foundation: KV cache, tree-masked forward, loading (folder, GGUF, quantized), tokenizer, errors."""

import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from helpers import tiny_model, write_folder, write_gguf

from redrafter_mlx import generate, load
from redrafter_mlx.cache import Cache, KVCache
from redrafter_mlx.errors import (
    ContextLengthError,
    CorruptModelError,
    EmptyPromptError,
    ModelNotFoundError,
    NetworkError,
    UnsupportedModelError,
)
from redrafter_mlx.generate import PromptCache
from redrafter_mlx.sampling import Sampler, apply_top_p


# ---- cache -----------------------------------------------------------------------------

def _kv(start, n):
    k = mx.arange(start, start + n, dtype=mx.float32).reshape(1, 1, n, 1) * mx.ones((1, 2, n, 3))
    return k, -k


def test_cache_append_rewind_commit_and_growth():
    c = KVCache()
    c.step = 4  # force several growths
    for s in range(0, 10, 3):
        c.update_and_fetch(*_kv(s, 3))
    assert c.offset == 12 and c.capacity >= 12
    assert np.array_equal(np.array(c.keys[0, 0, :12, 0]), np.arange(12))
    c.rewind(2)
    assert c.offset == 10
    k, v = c.update_and_fetch(*_kv(100, 5))  # a "tree" of 5 tokens at [10, 15)
    assert k.shape == (1, 2, 15, 3)
    c.commit(10, [0, 2, 4])  # keep tokens 100, 102, 104, in order
    assert c.offset == 13
    assert np.array_equal(np.array(c.keys[0, 1, :13, 0]), list(range(10)) + [100, 102, 104])
    assert np.array_equal(np.array(c.values[0, 1, 10:13, 2]), [-100, -102, -104])
    with pytest.raises(ValueError):
        c.rewind(14)
    with pytest.raises(ValueError):
        c.commit(12, [0, 1, 2])


def test_cache_trim_to_repairs_partial_layers():
    cache = Cache(3)
    for c in cache:
        c.update_and_fetch(*_kv(0, 4))
    cache[0].update_and_fetch(*_kv(4, 2))  # an interrupted forward: only layer 0 advanced
    cache.trim_to(4)
    assert [c.offset for c in cache] == [4, 4, 4]


# ---- model -----------------------------------------------------------------------------

@pytest.mark.parametrize("traditional", [False, True])
def test_tree_mask_and_positions_equal_separate_sequences(traditional):
    model = tiny_model(rope_traditional=traditional)
    prefix = [3, 14, 15, 92, 65]
    branches = [[7, 8, 9], [7, 8, 2], [4, 1, 6]]  # share "7 8"; the last shares nothing
    # Packed trie: 7, 8, 9, 2, 4, 1, 6 with parents and depths
    tokens = [7, 8, 9, 2, 4, 1, 6]
    parent = [-1, 0, 1, 1, -1, 4, 5]
    depth = [0, 1, 2, 2, 0, 1, 2]
    T = len(tokens)
    mask = np.zeros((T, T), bool)
    for i in range(T):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    cache = model.make_cache()
    model(mx.array([prefix]), cache)
    logits, hidden = model(mx.array([tokens]), cache, positions=mx.array(len(prefix) + np.array(depth)),
                           mask=mx.array(mask))
    where = {(0, 0): 0, (0, 1): 1, (0, 2): 2, (1, 2): 3, (2, 0): 4, (2, 1): 5, (2, 2): 6}
    for b, branch in enumerate(branches):
        ref_logits, ref_hidden = model(mx.array([prefix + branch]))
        for d in range(3):
            i = where.get((b, d), where.get((0, d)) if b == 1 else None)
            assert np.allclose(np.array(logits[0, i]), np.array(ref_logits[0, len(prefix) + d]), atol=1e-4)
            assert np.allclose(np.array(hidden[0, i]), np.array(ref_hidden[0, len(prefix) + d]), atol=1e-4)


def test_gqa_and_quantized_model_run():
    import mlx.nn as nn

    model = tiny_model(num_attention_heads=8, num_key_value_heads=2, hidden_size=64)
    ref, _ = model(mx.array([[1, 2, 3]]))
    nn.quantize(model, group_size=32, bits=8)
    q, _ = model(mx.array([[1, 2, 3]]))
    assert q.shape == ref.shape and np.allclose(np.array(q), np.array(ref), atol=0.05)


# ---- loading ---------------------------------------------------------------------------

def test_folder_and_gguf_load_and_agree(tmp_path):
    model = tiny_model()
    ids = mx.array([[5, 9, 77, 100, 3]])
    want, _ = model(ids)
    folder = load(str(write_folder(tmp_path / "f", model)))
    gguf = load(str(write_gguf(tmp_path / "m.gguf", model)))
    assert gguf.model.config["rope_traditional"] and not folder.model.config["rope_traditional"]
    for m in (folder, gguf):
        got, _ = m.model(ids)
        assert np.allclose(np.array(got), np.array(want), atol=1e-4)
    assert folder.tokenizer.prompt_ids("the cat") == gguf.tokenizer.prompt_ids("the cat")
    a, b = generate(folder, "the cat", max_tokens=12), generate(gguf, "the cat", max_tokens=12)
    assert a.tokens == b.tokens and len(a.tokens) > 0


@pytest.mark.parametrize("fmt,dtype", [("float16", mx.float16), ("bfloat16", mx.bfloat16), ("float32", mx.float32)])
def test_weight_formats(tmp_path, fmt, dtype):
    m = load(str(write_folder(tmp_path / "f")), weight_format=fmt)
    assert m.model.decoder.norm.weight.dtype == dtype and m.weight_format == fmt


def test_mlx_community_quantized_folder(tmp_path):
    path = write_folder(tmp_path / "q", quantize=(4, 32), hidden_size=64, intermediate_size=128)
    stored = load(str(path), weight_format="stored")
    assert "4-bit" in stored.weight_format
    assert type(stored.model.decoder.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
    deq = load(str(path), weight_format="float32")
    ids = mx.array([[1, 2, 3, 4]])
    assert np.allclose(np.array(stored.model(ids)[0]), np.array(deq.model(ids)[0]), atol=1e-3)
    assert len(generate(stored, "the", max_tokens=5).tokens) > 0


# ---- tokenizer -------------------------------------------------------------------------

def test_detokenizer_never_splits_multibyte_characters(tmp_path):
    m = load(str(write_folder(tmp_path / "f")))
    text = "naïve café — 日本語のテキスト 🙂🚀 ok"
    ids = m.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # byte-level: multi-byte characters span several tokens
    detok = m.tokenizer.detokenizer()
    deltas = [detok.add([i]) for i in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_chat_template_multi_turn_and_empty_prompt(tmp_path):
    m = load(str(write_folder(tmp_path / "f")))
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"}]
    text = m.tokenizer.decode(m.tokenizer.prompt_ids(msgs))
    assert text.count("<|im_start|>") == 4 and text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>system\nbe brief<|im_end|>" in m.tokenizer.decode(m.tokenizer.prompt_ids("x", system="be brief"))
    for bad in ["", "   ", [], [{"role": "user", "content": " "}]]:
        with pytest.raises(EmptyPromptError):
            generate(m, bad)


# ---- generation ------------------------------------------------------------------------

def test_sampling_seeded_and_top_p(tmp_path):
    m = load(str(write_folder(tmp_path / "f")))
    a = generate(m, "the cat", max_tokens=20, temperature=1.0, seed=7).tokens
    b = generate(m, "the cat", max_tokens=20, temperature=1.0, seed=7).tokens
    c = generate(m, "the cat", max_tokens=20, temperature=1.0, seed=8).tokens
    assert a == b and a != c
    logits = mx.log(mx.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = np.isfinite(np.array(apply_top_p(logits, 0.75)))[0]
    assert kept.tolist() == [True, True, False, False]
    assert np.isfinite(np.array(apply_top_p(logits, 0.85)))[0].tolist() == [True, True, True, False]
    with pytest.raises(ValueError):
        Sampler(temperature=-1)


def test_eos_max_tokens_context_and_cancel(tmp_path):
    m = load(str(write_folder(tmp_path / "f")))
    free = generate(m, "the cat", max_tokens=40)
    assert free.finish_reason == "length" and len(free.tokens) == 40
    m.tokenizer.eos_token_ids = [free.tokens[10]]
    cut = free.tokens.index(free.tokens[10])
    stopped = generate(m, "the cat", max_tokens=40)
    assert stopped.finish_reason == "eos" and stopped.tokens == free.tokens[:cut]
    m.tokenizer.eos_token_ids = []
    prompt = m.tokenizer.prompt_ids("the cat")
    m.args.max_position_embeddings = len(prompt) + 10
    ctx = generate(m, "the cat", max_tokens=40)
    assert ctx.finish_reason == "context" and ctx.tokens == free.tokens[:11]
    with pytest.raises(ContextLengthError, match="context"):
        generate(m, "the cat " * 20)
    m.args.max_position_embeddings = 512
    pc = PromptCache(m.model)
    n = {"calls": 0}

    def stop():
        n["calls"] += 1
        return n["calls"] > 5

    part = generate(m, "the cat", max_tokens=40, prompt_cache=pc, should_stop=stop)
    assert part.finish_reason == "cancelled" and part.tokens == free.tokens[: len(part.tokens)]
    assert pc.cache.offset == len(pc.ids)
    assert generate(m, "the cat", max_tokens=40, prompt_cache=pc).tokens == free.tokens


# ---- errors ----------------------------------------------------------------------------

def test_unknown_name_lists_known_models():
    with pytest.raises(ModelNotFoundError, match="smollm2-135m"):
        load("no-such-model")


def test_missing_and_bad_paths(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="safetensors"):
        load(str(tmp_path))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ModelNotFoundError, match="not a .gguf"):
        load(str(tmp_path / "notes.txt"))


def test_corrupt_and_unsupported(tmp_path):
    path = write_folder(tmp_path / "f")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptModelError):
        load(str(path))
    path = write_folder(tmp_path / "g")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "mamba"}))
    with pytest.raises(UnsupportedModelError, match="mamba"):
        load(str(path))
    (path / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(CorruptModelError, match="do not fit"):
        load(str(path))
    gguf = write_gguf(tmp_path / "m.gguf", tiny_model(), arch="gpt2")
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        load(str(gguf))
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises((CorruptModelError, UnsupportedModelError)):
        load(str(tmp_path / "bad.gguf"))


def test_concurrent_updates_of_a_json_file_keep_every_entry(tmp_path):
    """Two processes measuring a cost curve (or tuning) at once each read the file, added their
    entry and replaced it: the one that wrote last dropped the other's. update_json holds the
    folder's lock from read to replace; the first update here waits inside its change until the
    second has started, which without the lock read the file before the first was written."""
    import threading

    from redrafter_mlx.files import update_json

    path = tmp_path / "cost_model.json"
    update_json(path, lambda d: {**d, "old": 0})
    inside, done = threading.Event(), []

    def slow(d):
        inside.set()
        time.sleep(0.5)
        return {**d, "a": 1}

    first = threading.Thread(target=lambda: done.append(update_json(path, slow)))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=lambda: done.append(update_json(path, lambda d: {**d, "b": 2})))
    second.start()
    first.join(10)
    second.join(10)
    assert len(done) == 2 and json.loads(path.read_text()) == {"old": 0, "a": 1, "b": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost_model.json"]


def test_a_folder_held_for_a_run_can_have_its_json_files_updated_by_the_same_thread(tmp_path):
    """flock does not know a process already holds a folder: `redrafter-train --work` in the model's folder (or the
    GGUF's) held it for the run, then waited forever on itself to cache the cost curve there (update_json). The
    thread that holds a folder goes on with its updates; another thread still waits its turn, and another run is
    refused (in the holding thread too)."""
    import threading

    from redrafter_mlx.errors import RedrafterError
    from redrafter_mlx.files import one_run_in, update_json

    done, other, inside, release = [], [], threading.Event(), threading.Event()

    def run():
        with one_run_in(tmp_path, "busy"):
            done.append(update_json(tmp_path / "c.json", lambda d: {**d, "a": 1}))
            try:
                with one_run_in(tmp_path, "busy"):
                    done.append("a second run")
            except RedrafterError:
                pass
            inside.set()
            release.wait(10)

    runner = threading.Thread(target=run, daemon=True)  # (a daemon: where it hangs, the test still ends)
    runner.start()
    assert inside.wait(10) and done == [tmp_path / "c.json"]  # (it waited on itself here, forever)
    waiting = threading.Thread(target=lambda: other.append(update_json(tmp_path / "d.json", lambda d: {"b": 2})),
                               daemon=True)
    waiting.start()
    waiting.join(0.5)
    assert other == []  # another thread waits for the run to end
    with pytest.raises(RedrafterError, match="busy"):
        with one_run_in(tmp_path, "busy"):
            pass
    release.set()
    runner.join(10)
    waiting.join(10)
    assert other and json.loads((tmp_path / "d.json").read_text()) == {"b": 2}


def test_a_damaged_json_file_is_kept_beside_the_new_one(tmp_path):
    """update_json replaced a damaged file (a cost cache, beam_shape.json: not JSON, not an object, not UTF-8)
    with a new one, and every entry a repair could have saved went with it, without a word. The damaged file is
    renamed aside, to the first free NAME.damaged, NAME.damaged-2, ..., and the note says where."""
    from redrafter_mlx.files import update_json

    path = tmp_path / "cost_model.json"
    said = []
    update_json(path, lambda d: {**d, "a": 1}, note=said.append)
    assert said == [] and json.loads(path.read_text()) == {"a": 1}  # (a missing file is no damage)
    damages = ['{"a": 1, "b": [2,', "[1, 2]", b"\xff{}"]
    for n, damage in enumerate(damages, start=1):
        (path.write_bytes if isinstance(damage, bytes) else path.write_text)(damage)
        update_json(path, lambda d: {**d, "c": 3}, note=said.append)
        assert json.loads(path.read_text()) == {"c": 3}
        aside = tmp_path / ("cost_model.json.damaged" + (f"-{n}" if n > 1 else ""))
        assert len(said) == n and f"{path} was damaged (" in said[-1] and f"kept as {aside.name} beside it" in said[-1]
    assert "expected a JSON object, found a list" in said[1] and "not valid JSON" in said[2]
    assert (tmp_path / "cost_model.json.damaged").read_text() == damages[0]
    assert (tmp_path / "cost_model.json.damaged-2").read_text() == damages[1]
    assert (tmp_path / "cost_model.json.damaged-3").read_bytes() == damages[2]
    update_json(path, lambda d: {**d, "d": 4})  # (no one to tell: still kept)
    assert json.loads(path.read_text()) == {"c": 3, "d": 4}
    path.write_text("nul")
    update_json(path, lambda d: {**d, "e": 5})
    assert (tmp_path / "cost_model.json.damaged-4").read_text() == "nul"


def test_a_relative_cache_folder_does_not_follow_the_current_folder(monkeypatch, tmp_path):
    """A relative XDG_CACHE_HOME was used from whatever folder the process was in (the XDG spec says to ignore
    it), and a relative REDRAFTER_CACHE moved with a chdir: a model fetched once was fetched again, a cost curve
    measured again, into a new folder beside the user's files. REDRAFTER_CACHE is taken from the folder it was
    first read in."""
    from pathlib import Path

    from redrafter_mlx import registry

    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDRAFTER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "rel/xdg")
    assert registry.cache_dir() == tmp_path / "home" / ".cache" / "redrafter-mlx"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert registry.cache_dir() == tmp_path / "xdg" / "redrafter-mlx"
    monkeypatch.setenv("REDRAFTER_CACHE", "rel-cache-for-this-test")
    first = registry.cache_dir()
    assert first == tmp_path / "rel-cache-for-this-test"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert registry.cache_dir() == first


def test_hub_id_without_network(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises((NetworkError, ModelNotFoundError), match="no-such-org/no-such-model"):
        load("no-such-org/no-such-model")


def test_json_files_are_replaced_whole_or_not_at_all(tmp_path):
    from redrafter_mlx.files import write_json

    path = tmp_path / "beam_shape.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2, "b": [1, 2]})
    assert json.loads(path.read_text()) == {"a": 2, "b": [1, 2]}
    with pytest.raises(TypeError):  # not JSON: the old file stays, no temp file is left behind
        write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 2, "b": [1, 2]}
    (tmp_path / "taken.json").mkdir()  # the rename fails after the temp file was written: it is removed
    with pytest.raises(OSError):
        write_json(tmp_path / "taken.json", {"a": 3})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beam_shape.json", "taken.json"]


def test_a_temp_json_file_a_killed_process_left_is_cleared_by_the_next_write(tmp_path):
    """write_json's `.NAME.PID.tmp` stayed beside the file after a SIGKILL mid-write (the OOM killer, `kill -9`), and
    nothing cleared it: one more each time. The next write of that file clears one a process on this host that is
    gone left; a live process's, another host's and another file's are kept."""
    import os
    import signal
    import subprocess
    import sys

    from redrafter_mlx import files

    path = tmp_path / "costs.json"
    killed = subprocess.run([sys.executable, "-c", "import os, sys; from redrafter_mlx import files; "
                             "os.replace = lambda *a: os.kill(os.getpid(), 9); "
                             f"files.write_json(sys.argv[1], {{'a': 1}})", str(path)], capture_output=True,
                            env={**os.environ, "PYTHONPATH": str(Path(files.__file__).parents[1])})
    assert killed.returncode == -signal.SIGKILL, killed
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".costs.json.")]
    assert len(left) == 1 and left[0].is_file(), left  # what the killed write left (the test's premise)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kept = [tmp_path / f".costs.json.@{files._host()}-{alive.pid}-tmp",  # a write still going on
                tmp_path / ".costs.json.@otherhost-1234567-tmp",  # another host's (that PID means nothing here)
                tmp_path / f".other.json.@{files._host()}-1234567-tmp"]  # another file's
        for p in kept:
            p.write_text("{")
        files.write_json(path, {"a": 2})
        assert json.loads(path.read_text()) == {"a": 2}
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["costs.json", *(p.name for p in kept)])
    finally:
        alive.kill()
        alive.wait()


def test_a_json_file_that_is_a_link_is_written_through_it(tmp_path):
    """write_json renamed its temp file over a symbolic link (a cost cache linked to a shared one): the link was
    replaced by a file of its own and the shared file never updated. The link's target is written; the link stays."""
    from redrafter_mlx.files import update_json, write_json

    (tmp_path / "shared").mkdir()
    (tmp_path / "model").mkdir()
    target, link = tmp_path / "shared" / "costs.json", tmp_path / "model" / "costs.json"
    target.write_text("{}")
    link.symlink_to(Path("..") / "shared" / "costs.json")
    assert write_json(link, {"a": 1}) == link
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1}
    update_json(link, lambda d: {**d, "b": 2})
    assert link.is_symlink() and json.loads(target.read_text()) == {"a": 1, "b": 2}
    target.write_text("{damaged")  # the damaged target is set aside, and the link still names the new one
    said = []
    update_json(link, lambda d: {**d, "c": 3}, note=said.append)
    assert link.is_symlink() and json.loads(target.read_text()) == {"c": 3}
    assert (tmp_path / "shared" / "costs.json.damaged").read_text() == "{damaged" and len(said) == 1
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["costs.json"]  # no temp file left on either side
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["costs.json", "costs.json.damaged"]


def test_a_json_file_keeps_its_permissions_when_replaced(tmp_path):
    """write_json's new file had the umask's permissions: a cache file kept private (0600) became readable by all,
    and a shared one (0644 under a 077 umask) private to the last process that wrote it."""
    import os
    import stat

    from redrafter_mlx.files import write_json

    path = tmp_path / "costs.json"
    mask = os.umask(0o022)
    try:
        write_json(path, {"a": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # a new file: the umask's
        for mode in (0o600, 0o664):
            path.chmod(mode)
            write_json(path, {"a": mode})
            assert stat.S_IMODE(path.stat().st_mode) == mode and json.loads(path.read_text()) == {"a": mode}
    finally:
        os.umask(mask)


def test_a_user_file_is_checked_one_way_in_each_tool(tmp_path, monkeypatch):
    """bench, distill, replay and convert's --chat-template each checked "is this a file I can read" their own way
    and in their own words ("no prompt file at X", "prompt file X not found", "neither a built-in template nor a
    file"), and replay said a file that is not UTF-8 in Python's words. One helper: one line naming the role, the
    path, what is wrong and (for a wrong path) what to give; a pipe is read like a file."""
    from helpers import piped

    from redrafter_mlx.errors import RedrafterError
    from redrafter_mlx.files import read_text_file

    class Refused(RedrafterError):
        pass

    def read(path, error=RedrafterError):
        return read_text_file(path, "prompt file", "give a JSONL file", error=error)

    f = tmp_path / "q.jsonl"
    with pytest.raises(RedrafterError, match=f"^prompt file {f} not found: give a JSONL file$"):
        read(f)
    with pytest.raises(Refused, match=f"^prompt file {tmp_path} is a folder: give a JSONL file$"):
        read(tmp_path, Refused)
    with piped("from a pipe") as path:
        assert read(path) == "from a pipe"
    f.write_bytes(b"\xef\xbb\xbfhi")  # (a byte-order mark is dropped)
    assert read(f) == "hi"
    import gzip

    for data, said in ((gzip.compress(b"hi"), r"it is gzip-compressed, so uncompress it first \(gunzip\)"),
                       ("hi".encode("utf-16"), "it is UTF-16 text: save it as UTF-8"),
                       (b"caf\xe9", "byte 3 is 0xe9: save it as UTF-8")):
        f.write_bytes(data)
        with pytest.raises(RedrafterError, match=f"^prompt file {f} is not UTF-8 text: {said}$"):
            read(f)
    f.write_text("hi")

    def refused(self, *a, **k):  # (the tests run as root, whom chmod does not stop)
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(f), "read_text", refused)
    with pytest.raises(RedrafterError, match=f"^prompt file {f} cannot be read: Permission denied$"):
        read(f)


def test_each_tool_says_a_missing_or_undecodable_file_alike(tmp_path):
    """The four readers of a user's file use the one check: a missing file and bytes that are not UTF-8 read alike
    in each (replay said "'utf-8' codec can't decode byte 0x8b ...", convert "not UTF-8 text (byte 1)")."""
    import gzip

    from convert.output import ConversionError
    from convert.tokenizer import read_chat_template
    from redrafter_mlx import bench, distill, replay
    from redrafter_mlx.errors import RedrafterError

    f = tmp_path / "f"
    readers = ((lambda: bench.read_prompts(f), "prompt file", "give a JSONL file"),
               (lambda: distill.read_prompt_files([f]), "prompt file", "give a JSONL file"),
               (lambda: replay.read_results(f), "results file", "give a redrafter-bench --json file"),
               (lambda: read_chat_template(str(f)), "chat template", r"give a Jinja file or a built-in template "
                                                                     r"\(vicuna\)"))
    for reader, role, advice in readers:
        f.unlink(missing_ok=True)
        with pytest.raises(RedrafterError, match=f"^{role} {f} not found: {advice}$"):
            reader()
        f.write_bytes(gzip.compress(b"{}"))
        with pytest.raises(RedrafterError, match=f"^{role} {f} is not UTF-8 text: it is gzip-compressed"):
            reader()
    f.unlink()
    with pytest.raises(ConversionError):
        read_chat_template(str(f))


def test_star_import_gives_the_public_api():
    """`from redrafter_mlx import *` gave the modules imported on the way (tree_search, costs, ...) and not
    `load`, which the package imports on first use: the README's `m = load(...)` then raised NameError."""
    import redrafter_mlx

    ns = {}
    exec("from redrafter_mlx import *", ns)
    assert {"load", "LoadedModel", "generate", "stream", "PromptCache", "RedrafterError", "SettingError"} <= set(ns)
    assert ns["load"] is redrafter_mlx.load and not {"tree_search", "costs", "generate_module"} & set(ns)
    assert callable(ns["generate"])  # the function, not the module of that name
