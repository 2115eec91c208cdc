"""Draft-head training: distillation data round trip, loss goes down, checkpoints resume exactly."""

import io
import json
import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from redrafter_mlx.distill import (clean_task, distill, generate_batch, interleave, length_batches, read_prompts, read_shards,
                                   self_instruct)
from redrafter_mlx.loader import new_model
from redrafter_mlx.train import accepted_drafts, train


class TinyTokenizer:
    eos_token_ids = [1]

    def prompt_ids(self, prompt, system=None):
        return [2 + (ord(c) % 40) for c in prompt]


class TinyLoaded:
    def __init__(self, model):
        self.model = model
        self.tokenizer = TinyTokenizer()
        self.context_length = 512


def tiny_model(seed=0):
    return new_model(dict(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=48, tie_word_embeddings=True,
                          rms_norm_eps=1e-5), seed)


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    out = tmp_path_factory.mktemp("distill")
    model = talkative_model()  # (tiny_model's replies are token 37 alone: argmax checks on them could not fail)
    prompts = [f"question number {i} about {w}" for i, w in enumerate(["cats", "dogs", "rivers", "maths"] * 4)]
    n = distill(TinyLoaded(model), prompts, out, batch_size=5, max_tokens=24, progress=False)
    assert n == len(prompts)
    return model, out, list(read_shards(out))


def test_batched_distillation_equals_greedy_decoding():
    model = talkative_model()  # (tiny_model repeats one token per row)
    prompts = [[3, 4, 5], [7, 8, 9, 10, 11, 12], [5]]
    rows = generate_batch(model, prompts, 10, eos=[])
    for p, (reply, hidden, greedy) in zip(prompts, rows):
        assert greedy == reply
        ids = list(p)
        for t in reply:
            logits, h = model(mx.array([ids]))
            assert int(mx.argmax(logits[0, -1])) == t
            assert np.allclose(np.array(h[0, -1]), hidden[len(ids) - len(p)].astype(np.float32), atol=2e-2)
            ids.append(t)


def test_batched_distillation_drops_finished_rows_without_changing_the_others():
    model = talkative_model()  # (tiny_model repeats one token per row)
    prompts = [[3, 4, 5], [7, 8, 9, 10, 11, 12], [5], [9, 9, 2, 30], [40, 41], [6, 6, 6]]  # 6: finished rows run on a while
    full = generate_batch(model, prompts, 12, eos=[])
    # an end token that some rows write early and others later or never: rows leave the batch mid-run
    stop = full[1][0][2]
    ended = generate_batch(model, prompts, 12, eos=[stop])
    cut = [r.index(stop) if stop in r else len(r) for r, _, _ in full]
    assert min(cut) < max(cut)
    for (reply, hidden, _), (ref, ref_hidden, _), n in zip(ended, full, cut):
        assert reply == ref[:n]
        assert np.allclose(hidden.astype(np.float32), ref_hidden[:n].astype(np.float32), atol=2e-2)


def test_length_batches_keep_rows_and_padded_tokens_within_bounds():
    lengths = [300, 40, 41, 1550, 45, 260, 42, 43, 44, 310, 700]
    batches = length_batches(lengths, batch_size=4, budget=1100)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))  # each prompt once
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths)  # similar lengths together
    for b in batches:
        assert len(b) <= 4
        assert len(b) * max(lengths[i] for i in b) <= 1100 or len(b) == 1  # a lone prompt over budget still runs
    assert [len(b) for b in batches] == [4, 3, 2, 1, 1]  # 40-43 | 44 45 260 (4 x 300 > 1100) | 300 310 | 700 | 1550
    assert length_batches([], 4, 100) == []


def talkative_model():
    """A tiny model whose greedy replies differ from prompt to prompt and change token within a reply, some
    ending early at the end token (1): tiny_model's greedy reply is token 37, 24 times, for every prompt."""
    model = new_model(dict(model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=48, tie_word_embeddings=False,
                           rms_norm_eps=1e-5), 2)
    model.lm_head.weight = model.lm_head.weight * 4  # sharper: greedy choices far from ties
    mx.eval(model.parameters())
    return model


def test_distill_round_trip_and_resume(tmp_path, monkeypatch):
    """What distill writes is what read_shards gives back, array for array: the prompts' ids, the replies, the
    hidden states that predicted them (float16, bit for bit) and the greedy tokens. (It checked shapes and
    dtypes alone, of replies that were all token 37 24 times: a shard that stored the replies reversed, or
    another row's hidden states, passed.)"""
    import importlib

    distill_module = importlib.import_module("redrafter_mlx.distill")
    model = talkative_model()
    prompts = [f"question number {i} about {w}" for i, w in enumerate(["cats", "dogs", "rivers", "maths"] * 4)]
    written, real = [], distill_module.write_shard
    monkeypatch.setattr(distill_module, "write_shard",
                        lambda out, index, rows: written.extend(dict(r) for r in rows) or real(out, index, rows))
    out = tmp_path / "d"
    assert distill(TinyLoaded(model), prompts, out, batch_size=5, max_tokens=24, progress=False) == 16
    got = list(read_shards(out))
    assert len(got) == len(written) == 16
    for s, w in zip(got, written):
        assert s["prompt"].dtype == s["reply"].dtype == s["greedy"].dtype == np.int32
        assert s["hidden"].dtype == np.float16 and s["hidden"].shape == (len(s["reply"]), 32)
        assert s["prompt"].tolist() == list(w["prompt"]) and s["reply"].tolist() == list(w["reply"])
        assert np.array_equal(s["hidden"], w["hidden"])
        assert s["greedy"].tolist() == s["reply"].tolist() == list(w["greedy"])  # greedy decoding: its own argmax
    # the test's premise: replies that tell a reversal, a swap of rows and an early end apart
    replies = [s["reply"].tolist() for s in got]
    assert len({tuple(r) for r in replies}) > 8 and any(r != r[::-1] for r in replies)
    assert any(len(r) < 24 for r in replies) and any(len(r) == 24 for r in replies)
    # every prompt answered once, under its own ids; replies stop before the end token (1), within max_tokens
    tok = TinyTokenizer()
    assert sorted(s["prompt"].tolist() for s in got) == sorted(tok.prompt_ids(p) for p in prompts)
    assert all(len(r) <= 24 and 1 not in r for r in replies)
    # in one batch of 16 (padded otherwise, rows ending at other steps), the same replies
    monkeypatch.setattr(distill_module, "write_shard", real)
    assert distill(TinyLoaded(model), prompts, tmp_path / "one", batch_size=16, max_tokens=24, progress=False) == 16
    assert sorted((s["prompt"].tolist(), s["reply"].tolist()) for s in read_shards(tmp_path / "one")) == \
        sorted((s["prompt"].tolist(), s["reply"].tolist()) for s in got)
    shards = sorted(out.glob("shard-*.npz"))
    # A second run over the same prompts answers nothing new.
    assert distill(TinyLoaded(model), prompts + ["one more"], out, batch_size=5, max_tokens=24, progress=False) == 1
    assert len(sorted(out.glob("shard-*.npz"))) == len(shards) + 1
    assert [s["prompt"].tolist() for s in read_shards(out)][-1] == tok.prompt_ids("one more")


def test_a_prompt_given_twice_is_answered_once(tmp_path, capsys):
    """A prompt repeated in a file, or a file given twice, was answered for each copy: the same greedy reply was
    distilled again (time) and weighed double in training."""
    prompts = ["say cats", "say dogs", "say cats", "say rivers", "say dogs"]
    assert distill(TinyLoaded(tiny_model()), prompts, tmp_path, batch_size=8, max_tokens=4, progress=False) == 3
    assert "distill: 2 of 5 prompts repeat earlier ones, and are answered once" in capsys.readouterr().err
    got = [s["prompt"].tolist() for s in read_shards(tmp_path)]
    tok = TinyTokenizer()
    assert sorted(got) == sorted(tok.prompt_ids(p) for p in ["say cats", "say dogs", "say rivers"])
    assert len((tmp_path / "done.txt").read_text().split()) == 3


def test_ctrl_c_as_a_shard_is_written_keeps_its_prompts_done(tmp_path, monkeypatch, ctrl_c_raises):
    """A shard and its prompts' keys in done.txt are written together: Ctrl-C right after the
    shard was renamed into place left its keys out, and a resumed run answered the batch again."""
    import os
    import signal

    from redrafter_mlx.distill import write_shard

    replace = os.replace

    def interrupted(src, dst):
        replace(src, dst)
        if Path(dst).name.startswith("shard-"):
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(os, "replace", interrupted)
    sample = {"key": "k1", "prompt": [1, 2], "reply": [3, 4], "hidden": np.zeros((2, 8), np.float16)}
    with pytest.raises(KeyboardInterrupt):
        write_shard(tmp_path, 0, [sample, {**sample, "key": "k2"}])
    assert (tmp_path / "shard-00000.npz").is_file()
    assert (tmp_path / "done.txt").read_text().split() == ["k1", "k2"]


def test_self_instruct_progress_moves_within_a_batch(tmp_path, monkeypatch):
    """Its bar counts tasks, known at a batch's end: it stood at 0 for the whole first batch (a minute for the
    default model on the 2-core CPU, more for a larger one). It says how far the batch is."""
    import tqdm

    said = []

    class Bar(tqdm.tqdm):
        def set_postfix_str(self, s="", refresh=True):
            super().set_postfix_str(s, refresh)
            said.append((self.n, s))

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    loaded = TinyLoaded(tiny_model(1))
    loaded.tokenizer = WordTokenizer()
    seeds = ["Write a poem about the sea.", "Sort these numbers: 3, 1, 2.", "Explain photosynthesis.", "Name a color."]
    self_instruct(loaded, seeds, 4, tmp_path / "si.jsonl", batch_size=8)
    assert said and said[0] == (0, "batch 1: 8 of up to 64 tokens"), said


def test_distill_progress_bar_moves_within_a_batch(tmp_path, monkeypatch):
    """One batch of replies can take minutes: the bar advances per decoding step, never past the
    prompts answered so far, and lands on the exact count at each batch's end."""
    import tqdm

    seen = []

    class Bar(tqdm.tqdm):
        def update(self, n=1):
            super().update(n)
            seen.append(self.n)

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    prompts = [f"question {i} about {w}" for i, w in enumerate(["cats", "dogs", "rivers"] * 2)]
    assert distill(TinyLoaded(tiny_model()), prompts, tmp_path / "d", batch_size=3, max_tokens=12,
                   progress=True) == 6
    partial = [n for n in seen if n != int(n)]
    assert partial, "the bar only moved at batch ends"
    assert all(b >= a for a, b in zip(seen, seen[1:])) and max(seen) == 6 and seen[-1] == 6
    assert 3 in seen and all(n <= 3 for n in seen[: seen.index(3)])  # the first batch's 3 prompts, then the second's


def test_distill_skips_prompts_over_max_prompt_tokens_and_answers_them_later(tmp_path, capsys):
    model = tiny_model()
    prompts = ["short one", "a prompt of middling size", "a much longer prompt that goes over the limit we set"]
    lengths = [len(TinyTokenizer().prompt_ids(p)) for p in prompts]  # 9, 25, 52
    out = tmp_path / "d"
    assert distill(TinyLoaded(model), prompts, out, batch_size=4, max_tokens=8, progress=False,
                   max_prompt_tokens=30) == 2
    assert "skipped 1 of 3 prompts longer than 30 tokens" in capsys.readouterr().err
    assert sorted(len(s["prompt"]) for s in read_shards(out)) == lengths[:2]
    # resumed, it said "skipped 1 of 1 prompts", of the one left, and drew an empty 0/0 bar: it says it once
    assert distill(TinyLoaded(model), prompts, out, batch_size=4, max_tokens=8, max_prompt_tokens=30) == 0
    err = capsys.readouterr().err
    assert err == "distill: skipped 1 of 3 prompts longer than 30 tokens (2 answered before; none left to answer)\n"
    # not marked done: a run without the limit answers just the skipped one
    assert distill(TinyLoaded(model), prompts, out, batch_size=4, max_tokens=8, progress=False) == 1
    assert sorted(len(s["prompt"]) for s in read_shards(out)) == lengths


def test_distill_refuses_prompts_that_are_all_too_long(tiny_model_dir, tmp_path, capsys):
    """Prompts every one of them longer than the context leaves (or --max-prompt-tokens) were all skipped, and the run
    ended with status 0: "answered 0 prompts", an --out with no shards. A run answering one said "1 prompts"."""
    from redrafter_mlx.distill import main
    from redrafter_mlx.errors import RedrafterError

    prompts = ["a much longer prompt that goes over the limit we set", "another one, also over the limit we set"]
    with pytest.raises(RedrafterError, match="^every one of the 2 prompts is longer than 30 tokens .chat template "
                                             "included; --max-prompt-tokens.: none to answer; give shorter prompts, or "
                                             "a larger --max-prompt-tokens$"):
        distill(TinyLoaded(tiny_model()), prompts, tmp_path / "a", max_tokens=8, max_prompt_tokens=30, progress=False)
    with pytest.raises(RedrafterError, match="^every one of the 2 prompts is longer than 7 tokens .chat template "
                                             "included; the model's context of 512 tokens less replies of up to 504.: "
                                             "none to answer; give shorter prompts, or a smaller --max-tokens$"):
        distill(TinyLoaded(tiny_model()), prompts, tmp_path / "a", max_tokens=504, progress=False)
    assert not list((tmp_path / "a").glob("shard-*"))
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "word " * 600}) + "\n")
    assert main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "o"),
                 "--max-tokens", "4"]) == 2
    assert "error: the one prompt is longer than" in capsys.readouterr().err
    data.write_text(json.dumps({"prompt": "hi"}) + "\n")
    assert main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "o"),
                 "--max-tokens", "4"]) == 0
    assert f"answered 1 prompt into {tmp_path / 'o'}\n" in capsys.readouterr().err


def test_distill_resumed_with_every_prompt_answered_says_so(tmp_path, capsys):
    """A run resumed after its last batch (Ctrl-C as it ended, or the same command again) said only "answered 0
    prompts": it says every prompt was answered before, and answers none again."""
    prompts = ["short one", "a prompt of middling size", "a third prompt"]
    out = tmp_path / "d"
    assert distill(TinyLoaded(tiny_model()), prompts, out, batch_size=4, max_tokens=8, progress=False) == 3
    capsys.readouterr()
    assert distill(TinyLoaded(tiny_model()), prompts, out, batch_size=4, max_tokens=8, progress=False) == 0
    assert capsys.readouterr().err == f"distill: all 3 prompts were answered before, in {out}: none left to answer\n"
    assert len(list(read_shards(out))) == 3


def test_distill_refuses_replies_that_leave_no_room_for_a_prompt(tiny_model_dir, tmp_path, capsys):
    """--max-tokens as long as the context skipped every prompt ("skipped 2 of 2 prompts longer than -77 tokens")
    and ended with status 0, "answered 0 prompts"."""
    from redrafter_mlx.distill import main
    from redrafter_mlx.errors import RedrafterError

    with pytest.raises(RedrafterError, match="replies of up to 511 tokens leave no room for a prompt in the model's "
                                             "context of 512 tokens: give --max-tokens 510 or less$"):
        distill(TinyLoaded(tiny_model()), ["hello"], tmp_path / "a", max_tokens=511, progress=False)
    assert distill(TinyLoaded(tiny_model()), ["h"], tmp_path / "a", max_tokens=510, progress=False) == 1  # (1 token)
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"instruction": "hello"}) + "\n")
    assert main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "o"),
                 "--max-tokens", "5000"]) == 2
    assert "replies of up to 5000 tokens leave no room for a prompt" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_distill_seed_reaches_the_self_instruct_tasks(tiny_model_dir, tmp_path, monkeypatch):
    """--self-instruct's tasks are sampled: they were drawn from seed 0 whatever --seed said (and --seed without
    --temperature was refused, though self-instruct would sample with it)."""
    from redrafter_mlx import distill as distill_module

    seeds = []
    monkeypatch.setattr(distill_module, "self_instruct", lambda *a, seed=0, **k: seeds.append(seed) or ["Name a sea."])
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"say {w}"}) + "\n" for w in ("a", "b", "c")))
    for extra, seed in (([], 0), (["--seed", "7"], 7), (["--seed", "8", "--temperature", "0.5"], 8)):
        assert distill_module.main(["--model", str(tiny_model_dir), "--data", str(data), "--out",
                                    str(tmp_path / f"o{seed}"), "--max-tokens", "2", "--self-instruct", "1",
                                    *extra]) == 0
        assert seeds[-1] == seed


def test_distill_cli_rejects_a_non_positive_max_prompt_tokens(tmp_path, capsys, monkeypatch):
    from redrafter_mlx import loader
    from redrafter_mlx.distill import main

    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"instruction": "hello"}) + "\n")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "o"), "--data", str(data), "--max-prompt-tokens", "0"])
    assert "argument --max-prompt-tokens: must be at least 1, not 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # greedy replies use no seed: it was taken, saying nothing
        main(["--out", str(tmp_path / "o"), "--data", str(data), "--seed", "3"])
    assert "--seed applies to sampling" in capsys.readouterr().err
    # --backfill-greedy answers no prompts: the options that choose and answer them were ignored, saying nothing
    for extra in (["--data", str(data)], ["--self-instruct", "4"], ["--limit", "2"], ["--temperature", "0.8"],
                  ["--max-tokens", "5"], ["--batch-size", "3"]):  # (these two were still ignored)
        with pytest.raises(SystemExit):
            main(["--out", str(tmp_path / "o"), "--backfill-greedy", *extra])
        err = capsys.readouterr().err
        assert f"answering no prompts: drop {extra[0]}" in err and len(err.strip().splitlines()) == 1
    # a folder with no shards: it loaded the model, then said "added greedy tokens to 0 shards"
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model for a folder with no shards"))
    assert main(["--out", str(tmp_path / "none"), "--backfill-greedy"]) == 2
    assert f"no distillation shards in {tmp_path / 'none'} to add greedy tokens to" in capsys.readouterr().err


def test_distill_refuses_what_would_answer_nothing_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """An --offset past every prompt loaded the model, made --out and said "answered 0 prompts"; --self-instruct
    with too few prompts to write tasks from was refused only after the model had loaded (and --out was made)."""
    from redrafter_mlx import loader
    from redrafter_mlx.distill import main

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"say {w}"}) + "\n" for w in ("a", "b")))
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model"))
    out = tmp_path / "o"
    for extra, said in ((["--offset", "2"], "--offset 2 skips all 2 prompts: give a smaller one"),
                        (["--offset", "9", "--self-instruct", "5"],
                         "--offset 9 skips all 7 prompts (with the 5 new tasks): give a smaller one"),
                        (["--self-instruct", "5"], "2 prompts to write new tasks from: give at least 3")):
        assert main(["--out", str(out), "--data", str(data), *extra]) == 2
        assert said in capsys.readouterr().err
        assert not out.exists()


def test_distill_refuses_new_tasks_that_offset_and_limit_leave_unanswered(tmp_path, capsys, monkeypatch):
    """--self-instruct N wrote N tasks, which join the prompts as one more file, interleaved: --limit (or --offset)
    took a share of them, and the rest were written (minutes of sampling) and never answered, saying nothing,
    where --help said the tasks are answered too. Refused before the model loads; limits that take them all pass."""
    from redrafter_mlx import distill as distill_module
    from redrafter_mlx import loader
    from redrafter_mlx.errors import RedrafterError

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"say {w}"}) + "\n" for w in "abcde"))
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model"))
    out = tmp_path / "o"
    tail = "would be written and never answered: give "
    for extra, said in ((["--limit", "4", "--self-instruct", "3"],  # a T1 b T2 | T3 c d e
                         "--limit takes 2 of the 3 new tasks (the prompts are interleaved across the files and the "
                         f"tasks), and the other 1 {tail}a larger --limit, or --self-instruct 2"),
                        (["--limit", "1", "--self-instruct", "3"], f"the other 3 {tail}a larger --limit, or no --self"),
                        (["--offset", "2", "--self-instruct", "3"], "--offset takes 2 of the 3 new tasks"),
                        (["--offset", "1", "--limit", "2", "--self-instruct", "2"],  # a | T1 b | T2 c d e
                         "--offset and --limit take 1 of the 2 new tasks (the prompts are interleaved across the "
                         f"files and the tasks), and the other 1 {tail}an --offset and --limit that take them all")):
        assert distill_module.main(["--out", str(out), "--data", str(data), *extra]) == 2
        assert said in capsys.readouterr().err, extra
        assert not out.exists()

    def reached(*a, **k):
        raise RedrafterError("past the checks")

    monkeypatch.setattr(distill_module, "same_source", reached)
    for extra in (["--limit", "6", "--self-instruct", "3"], ["--offset", "1", "--limit", "3", "--self-instruct", "2"],
                  ["--limit", "2"], ["--self-instruct", "3"]):
        assert distill_module.main(["--out", str(out), "--data", str(data), *extra]) == 2
        assert "past the checks" in capsys.readouterr().err, extra


def test_a_path_after_an_equals_sign_has_its_tilde_expanded(tmp_path, capsys, monkeypatch):
    """No shell expands "~" in `--out=~/runs`: distill made a folder named "~" in the current one, and
    `--prompts=~/q.jsonl`, `--data=~/p.jsonl` were not found. Each path option of the training tools and the bench
    now expands it, as --work, --json and --drafter did."""
    from redrafter_mlx import autotrain, bench, loader
    from redrafter_mlx import train as train_module
    from redrafter_mlx.distill import main

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model"))
    (tmp_path / "p.jsonl").write_text(json.dumps({"instruction": "hello"}) + "\n")
    assert main(["--data=~/p.jsonl", "--out=~/o", "--offset", "1"]) == 2  # read: refused for its one prompt
    assert "--offset 1 skips all 1 prompts" in capsys.readouterr().err
    (tmp_path / "d").mkdir()
    assert train_module.main(["--data=~/d", "--out=~/t", "--eval-prompts=~/p.jsonl"]) == 2
    assert "p.jsonl:1 is not a Spec-Bench line" in capsys.readouterr().err  # (read, before the data)
    assert train_module.main(["--data=~/d", "--out=~/t"]) == 2
    assert f"no distillation shards in {tmp_path / 'd'}" in capsys.readouterr().err
    assert not (tmp_path / "~").exists()
    assert bench.parse_args(["--prompts=~/q.jsonl"]).prompts == tmp_path / "q.jsonl"
    args = autotrain.parse_args(["--prompts=~/p.jsonl", "--eval-prompts=~/e.jsonl"])
    assert (args.prompts, args.eval_prompts) == ([tmp_path / "p.jsonl"], tmp_path / "e.jsonl")


def test_replays_results_path_has_its_tilde_expanded(tmp_path, capsys, monkeypatch):
    """replay's positional results path was a plain Path: "~/b.json" (quoted, or from a script) was looked for in a
    folder named "~" of the current one, and not found. It expands "~" as the other tools' paths do."""
    from redrafter_mlx import replay

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "b.json").write_text("{not json")
    assert replay.main(["~/b.json"]) == 2
    err = capsys.readouterr().err
    assert "not found" not in err and str(tmp_path / "home" / "b.json") in err


def test_train_refuses_a_reload_every_past_the_last_step(tmp_path, capsys):
    """--reload-every N with N >= --steps never re-read the data, saying nothing."""
    from redrafter_mlx import train as train_module

    (tmp_path / "d").mkdir()
    with pytest.raises(SystemExit) as e:
        train_module.main(["--data", str(tmp_path / "d"), "--out", str(tmp_path / "t"), "--steps", "200",
                           "--reload-every", "500"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--reload-every 500 re-reads --data every 500 steps, and --steps 200 ends before " \
        "the first re-read: give a smaller N, or drop it" in err, err
    assert train_module.main(["--data", str(tmp_path / "d"), "--out", str(tmp_path / "t"), "--steps", "200",
                              "--reload-every", "100"]) == 2  # (parsed: then no shards in d)
    assert "no distillation shards" in capsys.readouterr().err


def test_train_refuses_a_warmup_as_long_as_the_run(patterned, tmp_path, capsys, monkeypatch):
    """--warmup W with W >= --steps S was accepted: the learning rate rose to the last step and never decayed. It is
    refused while parsing (and by train()); given no --warmup, a short run warms up for a fifth of its steps, not
    50 (which left --steps 10 in warm-up throughout), as redrafter-train's budgets do."""
    from redrafter_mlx import autotrain
    from redrafter_mlx import train as train_module
    from redrafter_mlx.errors import SettingError

    (tmp_path / "d").mkdir()
    for warmup in ("200", "500"):
        with pytest.raises(SystemExit) as e:
            train_module.main(["--data", str(tmp_path / "d"), "--out", str(tmp_path / "t"), "--steps", "200",
                               "--warmup", warmup])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and f"error: --warmup {warmup} is not fewer than --steps " \
            "200: the learning rate would warm up to the last step and never decay; give a --warmup under 200" in err
    for argv in (["--steps", "200", "--warmup", "199"], ["--steps", "10"]):  # parsed: then no shards in d
        assert train_module.main(["--data", str(tmp_path / "d"), "--out", str(tmp_path / "t"), *argv]) == 2
        assert "no distillation shards" in capsys.readouterr().err
    model, data = patterned
    with pytest.raises(SettingError, match="warmup 3 is not fewer than steps 3"):
        train(model, data, tmp_path / "api", steps=3, warmup=3, progress=False)
    assert not (tmp_path / "api").exists()
    schedules = []
    real = train_module.lr_schedule
    monkeypatch.setattr(train_module, "lr_schedule", lambda *a: schedules.append(a) or real(*a))
    train(model, data, tmp_path / "short", steps=10, batch=8, draft_vocab=0, progress=False)
    assert schedules == [(1e-3, 2, 10)]
    assert [train_module.default_warmup(s) for s in (1, 4, 10, 249, 250, 1000)] == [0, 0, 2, 49, 50, 50]
    assert all(train_module.default_warmup(b.steps) < b.steps for b in autotrain.BUDGETS.values())


def test_train_refuses_beam_shapes_decoding_would_refuse_while_parsing(tmp_path, capsys):
    """--beam-shapes 2000x5 was refused by decoding (over the 1024 tokens a step drafts may hold) only when the
    evaluation came, after the whole training run."""
    from redrafter_mlx import train as train_module

    (tmp_path / "d").mkdir()
    (tmp_path / "q.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(SystemExit) as e:
        train_module.main(["--data", str(tmp_path / "d"), "--out", str(tmp_path / "t"), "--eval-prompts",
                           str(tmp_path / "q.jsonl"), "--beam-shapes", "4x5,2000x5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--beam-shapes 2000x5: beams of 2000 x 5 tokens draft 8000 tokens a step; at most " \
        "1024" in err, err


@pytest.mark.parametrize("command", ["distill", "train"])
def test_an_out_that_is_a_file_is_refused_while_parsing(tmp_path, capsys, command):
    """distill --out FILE said "File exists: FILE" (Python's words) after the model had loaded; train the same."""
    import importlib

    main = importlib.import_module(f"redrafter_mlx.{command}").main
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"instruction": "hello"}) + "\n")
    for out, said in ((data, f"--out {data} is a file: give a folder (a new one, or a stopped run's to resume it)"),
                      (data / "run", f"--out {data / 'run'} cannot be made: {data} is not a folder you can write")):
        with pytest.raises(SystemExit) as e:
            main(["--out", str(out), "--data", str(data if command == "distill" else tmp_path)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err
        assert "File exists" not in err


def test_sampled_distillation_is_seeded_and_differs_from_greedy(samples, tmp_path):
    model, _, greedy = samples
    prompts = [f"question number {i} about {w}" for i, w in enumerate(["cats", "dogs", "rivers", "maths"] * 4)]
    runs = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        distill(TinyLoaded(model), prompts, tmp_path / name, batch_size=5, max_tokens=24, progress=False,
                temperature=1.0, seed=seed)
        runs.append(sorted((s["prompt"].tolist(), s["reply"].tolist()) for s in read_shards(tmp_path / name)))
    assert runs[0] == runs[1] and runs[0] != runs[2]  # the seed decides
    assert runs[0] != sorted((s["prompt"].tolist(), s["reply"].tolist()) for s in greedy)  # sampled, not greedy
    for s in read_shards(tmp_path / "a"):
        assert s["hidden"].shape == (len(s["reply"]), 32)
        # the greedy token at each position of a sampled reply: the argmax of its hidden state
        assert s["greedy"].shape == s["reply"].shape
        if len(s["reply"]):
            assert (np.argmax(np.array(model.logits(mx.array(s["hidden"].astype(np.float32)))), -1) == s["greedy"]).mean() > 0.9
    assert any((s["greedy"] != s["reply"]).any() for s in read_shards(tmp_path / "a"))
    assert all((s["greedy"] == s["reply"]).all() for s in greedy)


class WordTokenizer(TinyTokenizer):
    """ids 2..9 are line breaks, the others short words."""
    vocab_size = 48

    def encode(self, text):
        return [10 + (ord(c) % 38) for c in text]

    def decode(self, ids):
        return "".join("\n" if 2 <= i <= 9 else f"w{i} " for i in ids if i != 1)


def test_self_instruct_writes_new_tasks_and_resumes(tmp_path):
    loaded = TinyLoaded(tiny_model(1))
    loaded.tokenizer = WordTokenizer()
    seeds = ["Write a poem about the sea.", "Sort these numbers: 3, 1, 2.", "Explain photosynthesis.", "Name a color."]
    path = tmp_path / "si.jsonl"
    first = self_instruct(loaded, seeds, 4, path, batch_size=8, progress=False)
    assert len(first) == 4 and len(set(first)) == 4
    assert not set(first) & set(seeds)
    assert all(t.startswith("w") and "\n" not in t for t in first)
    # A rerun asking for more keeps what is on disk and appends.
    more = self_instruct(loaded, seeds, 7, path, batch_size=8, progress=False)
    assert more[:4] == first and len(more) == 7
    assert [json.loads(l)["instruction"] for l in path.read_text().splitlines()] == more
    assert clean_task("3. Task: Name three rivers in Europe.") == "Name three rivers in Europe."
    assert clean_task("Here's a new task for you") == "" and clean_task("short") == ""


def test_a_self_instruct_line_cut_short_does_not_stop_every_later_run(tmp_path):
    """A task line cut short (a full disk, a killed process) stopped every later run with a JSONDecodeError
    traceback; it is dropped, and the tasks after it are whole lines."""
    loaded = TinyLoaded(tiny_model(1))
    loaded.tokenizer = WordTokenizer()
    seeds = ["Write a poem about the sea.", "Sort these numbers: 3, 1, 2.", "Explain photosynthesis.", "Name a color."]
    path = tmp_path / "si.jsonl"
    first = self_instruct(loaded, seeds, 2, path, batch_size=8, progress=False)
    with open(path, "a") as f:
        f.write('{"instruction": "Cut sh')
    more = self_instruct(loaded, seeds, 4, path, batch_size=8, progress=False)
    assert more[:2] == first and len(more) == 4
    assert [json.loads(line)["instruction"] for line in path.read_text().splitlines()] == more


def test_mt_bench_is_refused(tmp_path):
    for name in ("mt_bench.jsonl", "MT-Bench.jsonl", "mtbench_16.jsonl", "my_MT_bench.jsonl"):  # (only the first was)
        f = tmp_path / name
        f.write_text(json.dumps({"turns": ["x"]}) + "\n")
        with pytest.raises(ValueError, match="MT-Bench is the benchmark"):
            read_prompts([f])
    # under FastChat's name for it (question.jsonl, in Spec-Bench's too, or in HuggingFaceH4's rows) it trained
    for row in ({"question_id": 81, "category": "writing", "turns": ["Compose a travel blog post."]},
                {"question_id": 160, "category": "humanities", "prompt": ["Explain a theory.", "Now simpler."]}):
        f = tmp_path / "question.jsonl"
        f.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["a"]}) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(ValueError, match=f"line 2 is MT-Bench question {row['question_id']} "
                                             f"\\({row['category']}\\): MT-Bench is the benchmark"):
            read_prompts([f])
    f.write_text(json.dumps({"question_id": 161, "category": "translation", "turns": ["Translate: hallo"]}) + "\n")
    assert read_prompts([f]) == ["Translate: hallo"]  # Spec-Bench's other tasks are not MT-Bench
    assert interleave([["a", "b", "c"], ["x"]]) == ["a", "x", "b", "c"]


def test_a_damaged_shard_is_named(tmp_path):
    from redrafter_mlx.errors import RedrafterError

    np.savez(tmp_path / "shard-00000.npz", prompt_0=np.arange(3), reply_0=np.arange(4), hidden_0=np.zeros((4, 8)))
    assert len(list(read_shards(tmp_path))) == 1
    data = (tmp_path / "shard-00000.npz").read_bytes()
    (tmp_path / "shard-00001.npz").write_bytes(data[: len(data) // 2])  # a disk that filled up, a copy cut short
    with pytest.raises(RedrafterError, match="shard-00001.npz is damaged"):
        list(read_shards(tmp_path))


def test_a_file_that_is_no_shard_says_what_a_shard_is(tmp_path):
    """A shard-*.npz that is not a .npz archive (text, random bytes, a .npy renamed) was "damaged (ValueError: This
    file contains pickled (object) data. If you trust the file you can load it unsafely using the `allow_pickle=`
    keyword argument or pickle.load().)", numpy's advice, which means nothing to our user (a .npy one was a
    TypeError traceback). One line now names the file and says what a shard is; reading and backfilling alike."""
    from redrafter_mlx.distill import backfill_greedy
    from redrafter_mlx.errors import RedrafterError

    shard = tmp_path / "shard-00000.npz"
    expected = "a .npz archive of prompt_N, reply_N and hidden_N arrays, as redrafter-distill writes"
    npy = tmp_path / "a.npy"
    np.save(npy, np.arange(3))
    objects = tmp_path / "objects.npz"
    np.savez(objects, prompt_0=np.array([object()], dtype=object), reply_0=np.arange(3), hidden_0=np.zeros((3, 8)))
    for data, why in ((b"hello, not a shard\n", f"not {expected}"), (bytes(range(256)) * 2, f"not {expected}"),
                      (npy.read_bytes(), f"not {expected}"), (b"", f"empty; expected {expected}"),
                      (objects.read_bytes(), f"it holds Python objects, not arrays of numbers; expected {expected}")):
        shard.write_bytes(data)
        for read in (lambda: list(read_shards(tmp_path)), lambda: backfill_greedy(None, tmp_path)):
            with pytest.raises(RedrafterError) as e:
                read()
            assert str(e.value) == f"{shard} is damaged ({why}): delete it (its replies are then left out) or distil " \
                                   "into a fresh folder", str(e.value)


def test_a_run_after_a_damaged_shard_was_deleted_writes_over_no_other_shard(tmp_path):
    """The next shard's number was the count of shards: with shard 0 deleted (as a damaged one is, on the
    error's advice), new replies went to shard-00001.npz over the last batch's, whose prompts done.txt still
    listed as answered, so they were lost for good."""
    model = tiny_model()
    prompts = [f"question {i} about {w}" for i, w in enumerate(["cats", "dogs", "rivers"] * 2)]
    assert distill(TinyLoaded(model), prompts, tmp_path, batch_size=3, max_tokens=6, progress=False) == 6
    assert sorted(f.name for f in tmp_path.glob("shard-*.npz")) == ["shard-00000.npz", "shard-00001.npz"]
    kept = [s["reply"].tolist() for s in read_shards(tmp_path)][3:]  # shard 1's
    (tmp_path / "shard-00000.npz").unlink()
    assert distill(TinyLoaded(model), prompts + ["one more"], tmp_path, batch_size=3, max_tokens=6,
                   progress=False) == 1
    assert sorted(f.name for f in tmp_path.glob("shard-*.npz")) == ["shard-00001.npz", "shard-00002.npz"]
    assert [s["reply"].tolist() for s in read_shards(tmp_path)][:3] == kept


def test_prompt_rows_of_the_wrong_shape_and_lone_surrogates(tmp_path):
    """A lone surrogate (JSON "\\ud800", common in scraped data) failed in distill's hash or the
    tokenizer; instances that are not a list failed with a KeyError."""
    from redrafter_mlx.distill import read_prompt_files
    from redrafter_mlx.errors import RedrafterError

    f = tmp_path / "p.jsonl"
    f.write_text('{"instruction": "Say hi \\ud800"}\n{"instruction": "Add", "instances": [{"input": "1 2"}]}\n')
    assert read_prompts([f]) == ["Say hi ?", "Add\n\n1 2"]
    f.write_text('{"instruction": "ok"}\n{"instruction": "x", "instances": {"a": 1}}\n')
    with pytest.raises(RedrafterError, match="line 2 is not an alpaca, self-instruct, GSM8K or Spec-Bench row: "
                       "'instances' is a list of .input, output. objects$"):  # it ended in "row: 0"
        read_prompt_files([f])
    # rows with none of the keys were skipped, saying nothing; a list row leaked an AttributeError
    f.write_text('{"instruction": "ok"}\n{"text": "lost"}\n')
    with pytest.raises(RedrafterError, match="line 2 .*none of instruction, question, prompt, turns .it has text"):
        read_prompt_files([f])
    f.write_text('{"instruction": "ok"}\n["a list"]\n')
    with pytest.raises(RedrafterError, match="line 2 .*a row is a JSON object, not a list") as e:
        read_prompt_files([f])
    assert "AttributeError" not in str(e.value)
    for line, what in (("null", "null"), ('"a prompt"', "a string"), ("5", "a number")):  # (null was "a NoneType")
        f.write_text(line + "\n")
        with pytest.raises(RedrafterError, match=f"line 1 .*a row is a JSON object, not {what}$"):
            read_prompt_files([f])
    f.write_text('{"question_id": 1, "turns": ["First turn", "second"]}\n{"instruction": ""}\n')  # Spec-Bench
    assert read_prompts([f]) == ["First turn"]
    f.write_text('{"question": 5}\n')
    with pytest.raises(RedrafterError, match="'question' is text, not a number$"):  # (it said "not int")
        read_prompt_files([f])
    # bytes that are not UTF-8 were said in Python's words ("'utf-8' codec can't decode byte 0x8b in position 1")
    import gzip

    f.write_bytes(gzip.compress(b'{"prompt": "hi"}\n'))
    with pytest.raises(RedrafterError, match=r"p.jsonl is not UTF-8 text: it is gzip-compressed, so "
                                             r"uncompress it first \(gunzip\)$"):
        read_prompt_files([f])
    f.write_bytes('{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(RedrafterError, match=r"p.jsonl is not UTF-8 text: byte 15 is 0xe9: "
                                             r"save it as UTF-8$"):  # (it said "byte 15 is b'\xe9'")
        read_prompt_files([f])
    f.write_bytes('{"prompt": "hi"}\n'.encode("utf-16"))  # (Windows Notepad's "Unicode")
    with pytest.raises(RedrafterError, match=r"p.jsonl is not UTF-8 text: it is UTF-16 text: save it "
                                             r"as UTF-8$"):
        read_prompt_files([f])
    f.write_text('{"instruction": "ok"}\nnot json\n')  # it said "line 1 column 1", the bad line's own
    with pytest.raises(RedrafterError, match=r"p.jsonl: line 2 is not JSON: Expecting value \(column 1\)$"):
        read_prompt_files([f])


def test_a_prompt_that_is_not_text_is_said_in_json_s_words(tmp_path):
    """A prompt given as a list of messages was "a prompt is text, not list"; one as an alpaca 'input' (or an
    instance's) went into the prompt in Python's words ("Say\\n\\n[{'role': 'user', 'content': 'hi'}]") and the
    model was asked that."""
    from redrafter_mlx.distill import read_prompt_files
    from redrafter_mlx.errors import RedrafterError

    messages = [{"role": "user", "content": "hi"}]
    f = tmp_path / "p.jsonl"
    for row, said in (({"prompt": messages}, "'prompt' is a list of messages"),
                      ({"turns": [messages]}, "the first of 'turns' is a list of messages"),
                      ({"instruction": "Say", "input": messages}, "'input' is a list of messages"),
                      ({"prompt": messages, "input": "x"}, "'prompt' is a list of messages"),
                      ({"instruction": {"text": "hi"}}, "'instruction' is text, not an object$"),
                      ({"question": True}, "'question' is text, not true or false$"),
                      ({"instruction": "Say", "instances": [{"input": ["a", "b"]}]},
                       "the first instance's 'input' is text, not a list$")):
        f.write_text(json.dumps(row) + "\n")
        with pytest.raises(RedrafterError) as e:
            read_prompt_files([f])
        assert re.search(said, str(e.value)) and "{'" not in str(e.value), str(e.value)
    # one JSON document over several lines (alpaca_data.json, an indented array) was "line 1 is not JSON: Expecting
    # value (column 2)", as if damaged
    for document, said in (([{"instruction": "Say hi", "input": ""}], r"one JSON array, not JSONL .*`jq -c '\.\[\]' "),
                           ({"prompt": "Say hi"}, r"one JSON object over several lines, not JSONL .*`jq -c \. ")):
        f.write_text(json.dumps(document, indent=4))
        with pytest.raises(RedrafterError, match=f"p.jsonl: the file is {said}"):
            read_prompt_files([f])
    f.write_text(json.dumps([{"instruction": "Say hi"}]) + "\n")  # on one line too
    with pytest.raises(RedrafterError, match="the file is one JSON array"):
        read_prompt_files([f])
    # a 'turns' that is not a list: the row was skipped, saying nothing (the file's other prompts read on)
    for turns, what in (("Say hi", "a string"), (None, "null")):
        f.write_text(json.dumps({"turns": turns}) + "\n" + json.dumps({"prompt": "ok"}) + "\n")
        with pytest.raises(RedrafterError, match=f"line 1 .*: 'turns' is a list of questions, not {what}$"):
            read_prompt_files([f])
    f.write_text(json.dumps({"prompt": messages}) + "\n")
    with pytest.raises(RedrafterError, match=r"\(\{role, content\}, as HuggingFaceH4's sets write\), not text: give "
                                             "the user message's text$"):
        read_prompt_files([f])


def test_a_json_array_of_prompts_over_several_lines_is_said_to_be_one(tmp_path):
    """prompts.json holding ["...", "..."], indented, was "line 1 is not JSON: Expecting value (column 2)" to distill,
    redrafter-train and the bench, as if damaged (an array of objects was said to be one, with the jq that mends it)."""
    import shutil
    import subprocess

    from redrafter_mlx import bench
    from redrafter_mlx.distill import read_prompt_files
    from redrafter_mlx.errors import RedrafterError

    f = tmp_path / "prompts.json"
    for document, said in ((["Tell me a joke", "Write a poem"], r"one JSON array of strings, not JSONL \(a JSON object a "
                            r"line\): `jq -c '\.\[\] \| \{prompt: \.\}' " + re.escape(str(f)) + "` writes them one a line$"),
                           ([{"prompt": "a"}, "b"], r"one JSON array over several lines, not JSONL \(a JSON object a "
                                                    r"line\)$")):
        f.write_text(json.dumps(document, indent=2) + "\n")
        for reader in (lambda: read_prompt_files([f]), lambda: bench.read_prompts(f)):
            with pytest.raises(RedrafterError, match=said) as e:
                reader()
            assert "not JSON:" not in str(e.value)
    f.write_text(json.dumps(["Tell me a joke", "Write a poem"], indent=2) + "\n")
    if shutil.which("jq"):  # the command said writes lines the readers take
        mended = tmp_path / "prompts.jsonl"
        mended.write_text(subprocess.run(["jq", "-c", ".[] | {prompt: .}", str(f)], capture_output=True, text=True,
                                         check=True).stdout)
        assert read_prompt_files([mended]) == [["Tell me a joke", "Write a poem"]]
    f.write_text('["Tell me a joke"]\n')  # one line: said of its line, as before
    with pytest.raises(RedrafterError, match="line 1 .*a row is a JSON object, not a list$"):
        read_prompt_files([f])


def test_a_prompt_of_zero_false_an_empty_list_or_null_is_refused_as_five_is(tmp_path):
    """{"prompt": 5} and {"question": true} were refused, but {"prompt": 0}, {"question": false}, {"prompt": []} and
    {"prompt": null} (an 'input' of 0 too) were skipped (or left out), saying nothing: a file of them "held no
    prompts", of lines that each have one. A null or "" field still gives way to the next one (a merged file)."""
    from redrafter_mlx.distill import read_prompt_files
    from redrafter_mlx.errors import RedrafterError

    f = tmp_path / "p.jsonl"
    for row, said in (({"prompt": 0}, "'prompt' is text, not a number"),
                      ({"question": False}, "'question' is text, not true or false"),
                      ({"prompt": []}, "'prompt' is text, not a list"),
                      ({"instruction": {}}, "'instruction' is text, not an object"),
                      ({"prompt": None}, "'prompt' is text, not null"),
                      ({"instruction": None, "question": None}, "'instruction' is text, not null"),
                      ({"instruction": "Add", "input": 0}, "'input' is text, not a number"),
                      ({"instruction": "Add", "instances": [{"input": False}]},
                       "the first instance's 'input' is text, not true or false")):
        f.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps(row) + "\n")
        with pytest.raises(RedrafterError, match=f"p.jsonl: line 2 is not an alpaca, .* row: {said}$"):
            read_prompt_files([f])
    f.write_text("".join(json.dumps(row) + "\n" for row in (
        {"instruction": None, "input": None, "question": "Merged?"}, {"prompt": "", "question": "Blank first?"},
        {"instruction": "Add", "input": None, "instances": [{"input": "1 2"}]}, {"prompt": "   "},
        {"prompt": None, "turns": ["Spec?"]})))
    assert read_prompt_files([f]) == [["Merged?", "Blank first?", "Add\n\n1 2", "Spec?"]]


@pytest.fixture(scope="module")
def patterned():
    """Replies with a learnable rule (next = 5 * current + 3 mod 40) and random hidden states."""
    rng = np.random.default_rng(0)
    data = []
    for _ in range(30):
        t = [int(rng.integers(2, 40))]
        for _ in range(30):
            t.append((5 * t[-1] + 3) % 40 + 2)
        data.append({"prompt": np.array([2, 3], np.int32), "reply": np.array(t, np.int32),
                     "hidden": rng.normal(size=(len(t), 32)).astype(np.float16)})
    return tiny_model(), data


def _losses(log: io.StringIO):
    return [json.loads(line)["loss"] for line in log.getvalue().splitlines() if "loss" in json.loads(line)]


def test_a_held_out_share_that_leaves_nothing_to_train_on_is_said(patterned, tmp_path):
    """--val-fraction 1 held every reply out, and training said "none of the 0 replies has 2 tokens or more to
    learn from: distil longer replies"."""
    from redrafter_mlx.errors import RedrafterError

    model, data = patterned
    with pytest.raises(RedrafterError, match=f"all {len(data)} replies are held out for validation at a share of "
                                             r"1.0, and none is left to train on: hold out a smaller share"):
        train(model, data, tmp_path / "run", depth=2, steps=2, batch=8, draft_vocab=32, progress=False,
              val_every=1, val_fraction=1.0)


def test_a_damaged_checkpoint_is_said_in_one_line(patterned, tmp_path, capsys):
    """A checkpoint whose state.json is not JSON (or has no step), or whose optimizer file is gone, stopped every
    later run with a traceback from inside json or MLX."""
    from redrafter_mlx import train as train_module
    from redrafter_mlx.errors import RedrafterError

    model, data = patterned
    run = tmp_path / "run"
    train(model, data, run, depth=2, steps=2, batch=8, draft_vocab=32, progress=False, save_every=1)
    (run / "checkpoint" / "optimizer.safetensors").unlink()
    with pytest.raises(RedrafterError, match=f"^the checkpoint {run / 'checkpoint'} is damaged \\(.*\\): delete it to "
                                             "train from the start$"):
        train(model, data, run, depth=2, steps=4, batch=8, draft_vocab=32, progress=False)
    (run / "checkpoint" / "state.json").write_text('{"step": 2}')
    with pytest.raises(RedrafterError, match="is damaged \\(its state.json holds no RNG state\\)"):
        train(model, data, run, depth=2, steps=4, batch=8, draft_vocab=32, progress=False)
    for text, why in (("garbage", "state.json is not valid JSON"), ('{"rng": 1}', "its state.json holds no step")):
        (run / "checkpoint" / "state.json").write_text(text)
        with pytest.raises(RedrafterError, match=why):
            train(model, data, run, depth=2, steps=4, batch=8, draft_vocab=32, progress=False)
        (tmp_path / "d").mkdir(exist_ok=True)
        assert train_module.main(["--data", str(tmp_path / "d"), "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"python -m redrafter_mlx.train: error: the checkpoint {run / 'checkpoint'} is damaged")
        assert why in err and len(err.splitlines()) == 1, err


def test_training_reduces_loss(patterned, tmp_path):
    model, data = patterned
    log = io.StringIO()
    train(model, data, tmp_path / "run", depth=3, steps=60, batch=64, lr=3e-3, warmup=5, draft_vocab=32,
          progress=False, log=log, save_every=1000)
    losses = _losses(log)
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5])


def test_resume_gives_the_same_next_losses(patterned, tmp_path):
    model, data = patterned
    kw = dict(depth=3, batch=32, lr=3e-3, warmup=2, draft_vocab=0, progress=False)
    straight = io.StringIO()
    train(model, data, tmp_path / "a", steps=6, save_every=100, log=straight, **kw)
    first, second = io.StringIO(), io.StringIO()
    train(model, data, tmp_path / "b", steps=3, save_every=3, log=first, **kw)
    train(model, data, tmp_path / "b", steps=6, save_every=3, log=second, **kw)  # resumes at step 3
    assert len(_losses(second)) == 3
    assert np.allclose(_losses(first) + _losses(second), _losses(straight), rtol=1e-4)


def test_ctrl_c_while_a_checkpoint_is_saved_leaves_the_previous_one_whole(patterned, tmp_path, monkeypatch):
    """The drafter, the optimizer and the step were written in place one after another: Ctrl-C before the
    step left step 2's state beside step 4's weights, and the resumed run trained steps 3-4 again on them."""
    from redrafter_mlx import train as train_module

    model, data = patterned
    kw = dict(depth=3, batch=32, lr=3e-3, warmup=2, draft_vocab=0, progress=False, save_every=2)
    straight = io.StringIO()
    train(model, data, tmp_path / "a", steps=6, log=straight, **kw)
    write_json, saves = train_module.write_json, []

    def interrupted(path, *a, **k):  # Ctrl-C as the second checkpoint's step is written
        saves.append(path)
        if len(saves) == 2:
            raise KeyboardInterrupt
        return write_json(path, *a, **k)

    monkeypatch.setattr(train_module, "write_json", interrupted)
    first = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        train(model, data, tmp_path / "b", steps=6, log=first, **kw)
    monkeypatch.undo()
    ckpt = tmp_path / "b" / "checkpoint"
    assert json.loads((ckpt / "state.json").read_text())["step"] == 2
    assert not [p.name for p in (tmp_path / "b").iterdir() if p.name.startswith(".")]  # no staging folder left
    second = io.StringIO()
    train(model, data, tmp_path / "b", steps=6, log=second, **kw)  # resumes at step 2
    assert np.allclose(_losses(first)[:2] + _losses(second), _losses(straight), rtol=1e-4)


def test_reload_follows_a_growing_data_folder(patterned, tmp_path):
    """A run can re-read its (growing) data and resume on more data than it started with;
    the draft vocabulary follows the data at hand."""
    model, data = patterned
    calls = []

    def reload():
        calls.append(1)
        return data

    log = io.StringIO()
    kw = dict(depth=3, batch=16, lr=3e-3, warmup=1, draft_vocab=8, progress=False)
    d = train(model, data[:5], tmp_path / "r", steps=4, save_every=2, log=log, reload=reload, reload_every=2, **kw)
    assert len(calls) == 1 and '"reload": 30' in log.getvalue()
    d2 = train(model, data, tmp_path / "r", steps=6, save_every=2, log=io.StringIO(), draft_vocab=16,
               depth=3, batch=16, lr=3e-3, warmup=1, progress=False)  # resume with a bigger vocabulary
    assert d.draft_vocab.size == 8 and d2.draft_vocab.size == 16


def test_too_few_seed_prompts_are_counted_in_words():
    """One seed prompt was "1 prompts to write new tasks from"."""
    from redrafter_mlx.distill import check_seeds
    from redrafter_mlx.errors import RedrafterError

    for seeds, said in ((["a"], "1 prompt to write new tasks from: give at least 3"),
                        (["a", "b"], "2 prompts to write new tasks from"), ([], "0 prompts to write"),
                        # the same prompt three times passed: the model was shown one task three times over
                        (["a", "a", "a"], r"1 prompt \(2 more repeat it\) to write new tasks from: give at least 3 "
                                          "different ones"),
                        (["a", "b", "a", "b"], r"2 prompts \(2 more repeat them\) to write")):
        with pytest.raises(RedrafterError, match=f"^{said}"):
            check_seeds(seeds)
    check_seeds(["a", "b", "c"])
    check_seeds(["a", "b", "a", "c"])


def test_beam_shapes_help_says_the_lookup_beam_is_drafted_beside_them(capsys, monkeypatch):
    """The evaluation decodes each WxL with generate's default context-lookup beam beside the beams (an "1x3" row read
    4.29 tokens/step, past the 3 its help's "W beams of L tokens" allow), which the help did not say."""
    from redrafter_mlx import train as train_module

    monkeypatch.setenv("COLUMNS", "400")  # (argparse breaks lines at hyphens too)
    with pytest.raises(SystemExit):
        train_module.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "beside the context-lookup beam decoding drafts by default" in text
    assert "so a step can take more than L tokens" in text


def test_eval_helpers(tmp_path):
    from redrafter_mlx.train import eval_prompts, parse_shapes

    assert parse_shapes("4x5, 8X6") == [(4, 5), (8, 6)]
    f = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": c, "turns": [f"q{i}", "again"]} for i, c in enumerate("aaabbc")]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [q["prompt"] for q in eval_prompts(f, 2)] == ["q0", "q1", "q3", "q4", "q5"]


def test_eval_prompts_say_what_shape_a_row_has(tmp_path, capsys, monkeypatch):
    """train --eval-prompts with a HuggingFaceH4-style row ('prompt' a list of messages) said "is not a Spec-Bench
    line with 'turns' (or a line with 'prompt'): it has none", of a row that has a 'prompt'."""
    import redrafter_mlx.loader as loader
    import redrafter_mlx.train as train_module

    f = tmp_path / "h4.jsonl"
    f.write_text(json.dumps({"prompt_id": "x", "prompt": [{"role": "user", "content": "Hi"}]}) + "\n")
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded a model before checking the prompts"))
    assert train_module.main(["--out", str(tmp_path / "o"), "--data", str(tmp_path), "--eval-prompts", str(f)]) == 2
    err = capsys.readouterr().err
    assert "h4.jsonl:1" in err and "'prompt' is a list of messages" in err and "give the user message's text" in err
    assert "it has none" not in err
    for row, said in (({"prompt": 5}, "'prompt' is a number, and a question is a string"),
                      ({"text": "Hi"}, "it has neither (its keys: text)"),
                      # said of file line 2 as "Expecting ',' delimiter: line 1 column 15 (char 14)", the line's own
                      ('{"prompt": "x"', "h4.jsonl:2 is not a Spec-Bench line with 'turns' (or a line with 'prompt'): "
                                         "not JSON: Expecting ',' delimiter (column 15)\n")):
        f.write_text(json.dumps({"prompt": "ok"}) + "\n" + (row if isinstance(row, str) else json.dumps(row)) + "\n")
        assert train_module.main(["--out", str(tmp_path / "o"), "--data", str(tmp_path), "--eval-prompts", str(f)]) == 2
        assert said in capsys.readouterr().err


def test_a_list_of_messages_is_said_alike_by_the_bench_and_distill(tmp_path):
    """A prompt given as HuggingFaceH4's rows give it (a list of {role, content}) was "a question is a string" to the
    bench (and train's --eval-prompts) and "a prompt is text" to distill: one check, one wording."""
    from redrafter_mlx import bench
    from redrafter_mlx.distill import read_prompt_files
    from redrafter_mlx.errors import RedrafterError

    f = tmp_path / "h4.jsonl"
    f.write_text(json.dumps({"prompt_id": "x", "prompt": [{"role": "user", "content": "Hi"}]}) + "\n")
    said = "'prompt' is a list of messages ({role, content}, as HuggingFaceH4's sets write), not text: give the user " \
           "message's text"
    for reader in (lambda: bench.read_prompts(f), lambda: read_prompt_files([f])):
        with pytest.raises(RedrafterError) as e:
            reader()
        assert str(e.value).endswith(said), str(e.value)


def test_evaluation_counts_the_end_token_a_step_stopped_at(monkeypatch):
    """train's evaluation left out the end-of-turn token a step emitted, which RunStats.tokens_per_step and
    redrafter-train count: replies that ended early read as under 1 token a step (0.917 for MT-Bench coding)."""
    import importlib
    from types import SimpleNamespace

    from redrafter_mlx.stats import RunStats
    from redrafter_mlx.train import evaluate, evaluate_shapes

    stats = RunStats(step_tokens=10, end_tokens=1, steps=11, decode_seconds=1.0)  # plain-like: 1 token a step
    monkeypatch.setattr(importlib.import_module("redrafter_mlx.generate"), "generate", lambda *a, **k: SimpleNamespace(stats=stats))
    assert evaluate(None, ["q"], 4, 5)["tokens_per_step"] == stats.tokens_per_step == 1.0
    said = io.StringIO()
    rows = evaluate_shapes(None, [{"prompt": "q", "category": "coding"}], [(4, 5)], out=said, progress=False)
    assert rows[0]["tokens_per_step"] == rows[0]["per_category"]["coding"] == 1.0
    assert json.loads(said.getvalue()) == rows[0]


def test_evaluation_after_training_shows_its_progress(monkeypatch, capsys):
    """train --eval-prompts decoded every question at every shape (5 minutes on the 2-core CPU) showing nothing
    until each shape's line."""
    import importlib
    from types import SimpleNamespace

    from redrafter_mlx.stats import RunStats
    from redrafter_mlx.train import evaluate_shapes

    stats = RunStats(step_tokens=10, end_tokens=1, steps=11, decode_seconds=1.0)
    monkeypatch.setattr(importlib.import_module("redrafter_mlx.generate"), "generate", lambda *a, **k: SimpleNamespace(stats=stats))
    questions = [{"prompt": "q", "category": "coding"}, {"prompt": "r", "category": "math"}]
    rows = evaluate_shapes(None, questions, [(1, 3), (4, 5)], out=io.StringIO())
    err = capsys.readouterr().err
    assert len(rows) == 2 and "evaluate" in err and "4/4" in err and "shape=4x5" in err, err


def test_an_evaluation_stopped_at_a_later_shape_keeps_the_rows_done(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """train --eval-prompts wrote eval.jsonl after the last beam shape: Ctrl-C during the last one lost every row."""
    import importlib

    from redrafter_mlx import train as train_module
    from redrafter_mlx.drafter import new_drafter, save_drafter
    from redrafter_mlx.loader import load

    save_drafter(new_drafter(load(str(tiny_model_dir), use_drafter=False).model.args), tmp_path / "d")
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Say hi"]}) + "\n")
    module = importlib.import_module("redrafter_mlx.generate")
    real = module.generate

    def stopped_at_the_second_shape(loaded, prompt, **kw):
        if kw.get("beam_width") == 2:
            raise KeyboardInterrupt
        return real(loaded, prompt, **kw)

    monkeypatch.setattr(module, "generate", stopped_at_the_second_shape)
    assert train_module.main(["--model", str(tiny_model_dir), "--eval-only", "--eval-drafter", str(tmp_path / "d"),
                              "--eval-prompts", str(questions), "--out", str(tmp_path / "out"), "--beam-shapes",
                              "1x3,2x3", "--eval-max-tokens", "4"]) == 130
    rows = [json.loads(line) for line in (tmp_path / "out" / "eval.jsonl").read_text().splitlines()]
    assert [(r["beam_width"], r["beam_length"]) for r in rows] == [(1, 3)]


def test_eval_only_with_another_models_drafter_names_this_commands_options(tiny_kit, tiny_model_dir, tmp_path, capsys):
    """--eval-drafter of a drafter trained for another model said "use the drafter trained for this model (or
    --no-drafter)": this command has no --no-drafter."""
    from redrafter_mlx import train as train_module
    from redrafter_mlx.drafter import new_drafter, save_drafter

    save_drafter(new_drafter(tiny_kit.model(seed=0, hidden_size=48).args), tmp_path / "d")
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"prompt": "Say hi"}) + "\n")
    assert train_module.main(["--model", str(tiny_model_dir), "--eval-only", "--eval-drafter", str(tmp_path / "d"),
                              "--eval-prompts", str(questions), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "hidden size 48" in err and ("give --eval-drafter the drafter trained for this model, or --model the model "
                                        "it was trained for") in err and "--no-drafter" not in err, err


def test_held_out_validation_keeps_the_best(patterned, tmp_path):
    from redrafter_mlx.drafter import load_drafter
    from redrafter_mlx.train import is_held_out

    model, data = patterned
    held = [is_held_out(s, 0.2) for s in data]
    assert 0 < sum(held) < len(data) and held == [is_held_out(s, 0.2) for s in data]  # stable
    log = io.StringIO()
    train(model, data, tmp_path / "v", depth=3, steps=20, batch=32, lr=3e-3, warmup=2, draft_vocab=0,
          progress=False, log=log, save_every=10, val_every=5, val_fraction=0.2, save_dtype=mx.float16)
    vals = [json.loads(line) for line in log.getvalue().splitlines() if "val_loss" in line]
    assert [v["step"] for v in vals] == [5, 10, 15, 20] and vals[-1]["val_loss"] < vals[0]["val_loss"]
    for v in vals:
        assert v["val_accepted_drafts"] == pytest.approx(accepted_drafts(v["val_acc"]))
    best = json.loads((tmp_path / "v" / "best" / "config.json").read_text())["training"]
    assert best["val_accepted_drafts"] == max(v["val_accepted_drafts"] for v in vals)
    weights = mx.load(str(tmp_path / "v" / "best" / "model.safetensors"))
    assert weights["rnn_u.weight"].dtype == mx.float16  # saved in the requested dtype ...
    trained = mx.load(str(tmp_path / "v" / "checkpoint" / "drafter" / "model.safetensors"))
    assert trained["rnn_u.weight"].dtype == mx.float32  # ... while training went on in float32
    load_drafter(tmp_path / "v" / "best", model)


def test_held_out_scores_go_to_stderr_with_the_progress(patterned, tmp_path, capsys):
    """They went to stdout (tqdm.write's default), among the results redrafter-train prints there."""
    model, data = patterned
    train(model, data, tmp_path / "run", depth=3, steps=2, batch=16, lr=3e-3, warmup=1, draft_vocab=16,
          progress=False, save_every=100, val_every=2, val_fraction=0.2)
    out, err = capsys.readouterr()
    assert out == "" and "step 2: held-out loss" in err


def test_resume_on_new_data_does_not_keep_an_incomparable_best(patterned, tmp_path):
    """A best score measured on another held-out set must not block saving the new run's best."""
    model, data = patterned
    kw = dict(depth=3, batch=32, lr=3e-3, warmup=2, draft_vocab=0, progress=False, save_every=5, val_every=5,
              val_fraction=0.2)
    run = tmp_path / "n"
    train(model, data, run, steps=10, log=io.StringIO(), **kw)
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    state["best_accepted_drafts"] = 99.0  # unbeatable, as if measured on an easier held-out set
    (run / "checkpoint" / "state.json").write_text(json.dumps(state))
    train(model, data, run, steps=15, log=io.StringIO(), **kw)  # same data: the stored best stands
    assert json.loads((run / "best" / "config.json").read_text())["training"]["step"] <= 10
    more = data + [{**s, "reply": (s["reply"] + 1) % 40 + 2} for s in data[:10]]  # a different held-out set
    train(model, more, run, steps=20, log=io.StringIO(), **kw)
    assert json.loads((run / "best" / "config.json").read_text())["training"]["step"] == 20


def test_accepted_drafts():
    assert accepted_drafts([1.0, 1.0, 1.0]) == 3.0
    assert accepted_drafts([0.5, 0.5]) == pytest.approx(0.75)
    assert accepted_drafts([0.0, 1.0]) == 0.0


def test_soft_targets_are_the_base_models_distribution_over_the_draft_vocabulary(samples):
    """soft=1: the loss is the cross-entropy from the base model's softmax (over the draft
    vocabulary, from the hidden states that predicted the targets) to the head's."""
    from redrafter_mlx.config import DrafterArgs
    from redrafter_mlx.drafter import Drafter
    from redrafter_mlx.train import PositionData, loss_fn

    model, _, data = samples
    vocab = list(range(1, 48, 2))
    d = Drafter(DrafterArgs(hidden_size=32, vocab_size=48, lm_head="shared"))
    d.set_draft_vocab(vocab)
    mx.eval(d.parameters())
    h = mx.random.normal((3, 32))
    assert np.allclose(np.array(d.vocab_logits(h, model)), np.array(model.logits(h))[:, vocab], atol=1e-5)

    pd = PositionData(data, depth=2)
    h, inputs, targets, teacher = pd.batch(np.arange(len(pd)))
    whole = (targets >= 0).all(axis=1)  # windows that do not run past their reply's end
    h, inputs, targets, teacher = h[whole], inputs[whole], targets[whole], teacher[whole]
    assert len(h) > 50
    remap = np.full(48, -1, np.int32)
    remap[vocab] = np.arange(len(vocab))
    soft_loss, _ = loss_fn(d, model, mx.array(h), mx.array(inputs), mx.array(targets), mx.array(remap),
                           mx.array(teacher), soft=1.0)
    want, state = 0.0, mx.zeros((len(h), 32))
    emb = model.embed(mx.array(inputs))
    for k in range(2):
        state = d.update_state(emb[:, k], state)
        student = np.array(nn.log_softmax(d.draft_logits(mx.array(h), state, model)))
        p = np.exp(np.array(nn.log_softmax(model.logits(mx.array(teacher[:, k]))[:, vocab])))
        want += float(np.mean(-(p * student).sum(-1)))
    assert abs(soft_loss.item() - want) < 1e-3 * max(1.0, abs(want))
    # the hidden state that predicted each target is the teacher: its greedy token is the (greedy) reply token
    for k in range(2):
        assert (np.argmax(np.array(model.logits(mx.array(teacher[:, k]))), -1) == targets[:, k]).mean() > 0.95


def test_training_on_soft_targets_reduces_loss(patterned, tmp_path):
    model, data = patterned
    log = io.StringIO()
    train(model, data, tmp_path / "soft", depth=3, steps=60, batch=64, lr=3e-3, warmup=5, draft_vocab=32,
          progress=False, log=log, save_every=1000, soft=0.5)
    losses = _losses(log)
    assert np.mean(losses[-10:]) < 0.8 * np.mean(losses[:5])


def test_greedy_targets_replace_sampled_tokens_as_targets_only():
    from redrafter_mlx.train import PositionData

    h = np.zeros((6, 32), np.float16)
    sample = {"prompt": np.array([2]), "reply": np.array([5, 6, 7, 8, 9, 10]), "hidden": h,
              "greedy": np.array([5, 16, 7, 18, 9, 20])}
    _, inputs, targets, _ = PositionData([sample], depth=2).batch(np.array([0, 3]))
    assert inputs.tolist() == [[5, 6], [8, 9]] and targets.tolist() == [[6, 7], [9, 10]]
    _, inputs, targets, _ = PositionData([sample], depth=2, greedy_targets=True).batch(np.array([0, 3]))
    assert inputs.tolist() == [[5, 6], [8, 9]] and targets.tolist() == [[16, 7], [9, 20]]
    _, _, targets, _ = PositionData([sample], depth=2, greedy_targets=True).batch(np.array([4]))
    assert targets.tolist() == [[20, -1]]  # the window stops at the reply's end


def test_backfill_adds_the_greedy_tokens_an_older_sampled_run_lacks(samples, tmp_path):
    from redrafter_mlx.distill import backfill_greedy

    model, _, _ = samples
    prompts = [f"question number {i} about {w}" for i, w in enumerate(["cats", "dogs", "rivers", "maths"] * 4)]
    distill(TinyLoaded(model), prompts, tmp_path, batch_size=5, max_tokens=24, progress=False, temperature=1.0, seed=1)
    new = list(read_shards(tmp_path))
    for shard in tmp_path.glob("shard-*.npz"):  # as written before greedy tokens were stored
        with np.load(shard) as z:
            old = {k: z[k] for k in z.files if not k.startswith("greedy")}
        np.savez(shard, **old)
    assert all((s["greedy"] == s["reply"]).all() for s in read_shards(tmp_path))
    assert backfill_greedy(model, tmp_path) == len(list(tmp_path.glob("shard-*.npz")))
    back = list(read_shards(tmp_path))
    assert all((a["greedy"] == b["greedy"]).mean() > 0.9 for a, b in zip(new, back) if len(a["reply"]))
    assert any((b["greedy"] != b["reply"]).any() for b in back)
    assert backfill_greedy(model, tmp_path) == 0  # done once


def test_training_refuses_data_it_cannot_use(patterned, tmp_path, capsys, monkeypatch):
    """Data distilled from another model (other hidden size), replies too short to learn from, and
    bad options are refused with one line, the evaluation prompts before any model loads."""
    from redrafter_mlx import loader
    from redrafter_mlx import train as train_module
    from redrafter_mlx.errors import RedrafterError

    model, data = patterned
    other = [dict(s, hidden=s["hidden"][:, :16]) for s in data]
    with pytest.raises(RedrafterError, match="16 dimensions but this base model has 32"):
        train(model, other, tmp_path / "a", steps=1, progress=False)
    # the same width but another vocabulary (Llama-3-8B and Mistral-7B are both 4096 wide): an IndexError, or a crash
    bigger = [dict(s, reply=np.where(np.arange(len(s["reply"])) == 1, 100_000, s["reply"])) for s in data]
    with pytest.raises(RedrafterError, match="token id 100000 but this base model's vocabulary"):
        train(model, bigger, tmp_path / "v", steps=1, progress=False)
    short = [dict(s, reply=s["reply"][:1], hidden=s["hidden"][:1]) for s in data]
    with pytest.raises(RedrafterError, match="2 tokens or more"):
        train(model, short, tmp_path / "b", steps=1, progress=False)
    for flag, value in (("--lr", "nan"), ("--lr", "0"), ("--soft", "5"), ("--weight-decay", "-1")):
        with pytest.raises(SystemExit):
            train_module.main(["--out", str(tmp_path / "c"), "--data", str(tmp_path), flag, value])
        assert f"argument {flag}" in capsys.readouterr().err
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded a model before checking the prompts"))
    assert train_module.main(["--out", str(tmp_path / "d"), "--data", str(tmp_path),
                              "--eval-prompts", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
    # --eval-only without prompts loaded the model, did nothing and exited 0; a missing drafter was not said
    for argv, said in ((["--eval-only"], "--eval-only evaluates a drafter on --eval-prompts"),
                       (["--eval-only", "--eval-prompts", "q.jsonl", "--eval-drafter", str(tmp_path / "none")],
                        "no drafter there"),
                       (["--eval-only", "--eval-prompts", "q.jsonl"],  # OUT/drafter: said after loading the model
                        f"--eval-only evaluates {tmp_path / 'e' / 'drafter'}, and no drafter is there")):
        with pytest.raises(SystemExit):
            train_module.main(["--out", str(tmp_path / "e"), *argv])
        assert said in capsys.readouterr().err
        assert not (tmp_path / "e").exists()
    # options that nothing would use ran, ignored, saying nothing: evaluation settings without --eval-prompts
    # (trained, evaluated nothing), training settings with --eval-only, --val-fraction without --val-every
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    for argv, said in ((["--data", str(tmp_path), "--beam-shapes", "8x5"],
                        "--beam-shapes applies to the evaluation on --eval-prompts FILE: give it, or drop it"),
                       (["--data", str(tmp_path), "--eval-max-tokens", "5", "--eval-drafter", str(drafter)],
                        "--eval-drafter, --eval-max-tokens apply to the evaluation on --eval-prompts FILE: give it, "
                        "or drop them"),
                       (["--eval-only", "--eval-prompts", "q.jsonl", "--data", str(tmp_path), "--steps", "3"],
                        "--eval-only trains nothing: drop --data, --steps"),
                       (["--data", str(tmp_path), "--val-fraction", "0.5"],
                        "--val-fraction is the share held out for validation every --val-every N steps"),
                       # (accepted: it read the data, loaded the model, then said every reply was held out)
                       (["--data", str(tmp_path), "--val-every", "5", "--val-fraction", "1"],
                        "--val-fraction 1 holds every reply out for validation, leaving none to train on: give a "
                        "share under 1"),
                       # (it trained OUT/drafter, then evaluated the other drafter, into OUT/eval.jsonl)
                       (["--data", str(tmp_path), "--eval-prompts", "q.jsonl", "--eval-drafter", str(drafter)],
                        f"--eval-drafter {drafter} is evaluated with --eval-only: a training run evaluates the drafter "
                        f"it trains ({tmp_path / 'e' / 'drafter'}); add --eval-only to evaluate {drafter} alone, or "
                        "drop --eval-drafter"),
                       (["--data", str(tmp_path), str(tmp_path / "." )],  # (its replies were trained on twice)
                        f"--data {tmp_path}: given twice; give each distillation folder once")):
        with pytest.raises(SystemExit) as stopped:
            train_module.main(["--out", str(tmp_path / "e"), *argv])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and said in err and err.count("\n") == 1, err
    # (--help said nothing of --val-every, whose absence the parser refuses it for)
    with pytest.raises(SystemExit):
        train_module.main(["--help"])
    assert "--val-fraction VAL_FRACTION with --val-every N: share" in " ".join(capsys.readouterr().out.split())
    # given at their defaults they change nothing, and are not refused (as --beam-shapes 4x5 with no evaluation)
    assert train_module.main(["--out", str(tmp_path / "e"), "--data", str(tmp_path), "--beam-shapes", "4x5",
                              "--val-fraction", "0.05"]) == 2  # (past parsing, to tmp_path's missing shards)
    assert "no distillation shards" in capsys.readouterr().err


def test_greedy_targets_on_replies_with_no_greedy_tokens_is_refused(patterned, tmp_path, capsys, monkeypatch):
    """--greedy-targets on greedy replies, or on sampled ones whose shards predate the greedy tokens (read back as the
    reply's own), trained on the replies' tokens as without it, saying nothing; said before the model loads."""
    from redrafter_mlx import loader
    from redrafter_mlx import train as train_module
    from redrafter_mlx.distill import write_shard

    _, data = patterned
    data = [dict(s, key=f"k{i}") for i, s in enumerate(data)]
    for folder in ("greedy", "sampled"):
        (tmp_path / folder).mkdir()
    write_shard(tmp_path / "greedy", 0, [dict(s, greedy=s["reply"]) for s in data])
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model before checking the data"))
    assert train_module.main(["--out", str(tmp_path / "o"), "--data", str(tmp_path / "greedy"), "--greedy-targets"]) == 2
    assert "--greedy-targets predicts the base model's greedy token where a sampled reply differs from it, and no " \
           "reply in --data does" in capsys.readouterr().err
    # a sampled reply with greedy tokens of its own passes the check (to the model's load)
    sampled = dict(data[0], greedy=np.where(np.arange(len(data[0]["reply"])) == 3, 7, data[0]["reply"]).astype(np.int32))
    write_shard(tmp_path / "sampled", 0, [sampled, *data[1:]])
    with pytest.raises(pytest.fail.Exception, match="loaded the model"):
        train_module.main(["--out", str(tmp_path / "p"), "--data", str(tmp_path / "sampled"), "--greedy-targets"])


def test_self_instruct_needs_three_seeds(tmp_path):
    from redrafter_mlx.errors import RedrafterError

    with pytest.raises(RedrafterError, match="at least 3"):
        self_instruct(None, ["a", "b"], 4, tmp_path / "t.jsonl")


def test_a_resumed_log_drops_the_steps_after_the_checkpoint(tmp_path):
    """A run stopped between checkpoints had logged steps that the resumed run trains and logs again."""
    from redrafter_mlx.train import open_log

    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "state.json").write_text(json.dumps({"step": 6}))
    rows = [{"step": i, "loss": 1.0} for i in range(1, 11)] + [{"note": "no step"}]
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with open_log(tmp_path) as log:
        log.write(json.dumps({"step": 7, "loss": 0.5}) + "\n")
    kept = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r.get("step") for r in kept] == [1, 2, 3, 4, 5, 6, None, 7]
    with open_log(tmp_path / "fresh") as log:  # no log, no checkpoint yet
        log.write("{}\n")
    assert (tmp_path / "fresh" / "train_log.jsonl").read_text() == "{}\n"


def test_a_log_line_cut_short_does_not_stop_every_later_run(patterned, tmp_path):
    """A train_log.jsonl whose last line was cut short (a full disk, a killed process) stopped every later run, and
    redrafter-train's report, with a JSONDecodeError traceback; the line is dropped."""
    from redrafter_mlx.autotrain import held_out_accuracy
    from redrafter_mlx.train import open_log

    model, data = patterned
    kw = dict(depth=3, batch=16, lr=3e-3, warmup=1, draft_vocab=16, progress=False, save_every=2, val_every=2,
              val_fraction=0.2)
    with open_log(tmp_path) as log:
        train(model, data, tmp_path, steps=2, log=log, **kw)
    with open(tmp_path / "train_log.jsonl", "a") as f:
        f.write('{"step": 3, "lo')
    assert held_out_accuracy(tmp_path)["step"] == 2
    with open_log(tmp_path) as log:
        train(model, data, tmp_path, steps=4, log=log, **kw)
    steps = [json.loads(line)["step"] for line in (tmp_path / "train_log.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert steps == [1, 2, 3, 4]


def test_ctrl_c_while_training_says_which_checkpoint_resumes(tmp_path):
    """`train` said only "cancelled" on Ctrl-C; it names the checkpoint's step the same command resumes from."""
    from redrafter_mlx.train import _says_where_it_stopped

    ckpt = tmp_path / "checkpoint"
    with pytest.raises(KeyboardInterrupt, match="before the first checkpoint"):
        with _says_where_it_stopped(ckpt, 400):
            raise KeyboardInterrupt
    ckpt.mkdir()
    (ckpt / "state.json").write_text(json.dumps({"step": 50}))
    with pytest.raises(KeyboardInterrupt, match=f"{ckpt} holds step 50 of 400: run the same command again"):
        with _says_where_it_stopped(ckpt, 400):
            raise KeyboardInterrupt


def test_a_checkpoint_of_another_run_is_refused_not_resumed(patterned, tmp_path):
    """A checkpoint of another drafter shape, depth or base model was resumed as if it were this run's:
    silently (another model of the same width, another --depth) or with a traceback from inside MLX
    (another --exit-dim or --layers). Other data is not a reason: a run may re-read a growing folder."""
    from redrafter_mlx.errors import RedrafterError

    model, data = patterned
    kw = dict(batch=16, lr=3e-3, warmup=1, draft_vocab=16, progress=False, save_every=2)
    run, here = tmp_path / "run", {"name": "a", "weights": "0123"}
    train(model, data, run, depth=3, steps=2, model=here, **kw)
    for change, said in ((dict(exit_dim=16), "exit_dim 64 there, 16 here"),
                         (dict(layers=2), "num_draft_layers 1 there, 2 here"),
                         (dict(depth=2), "depth 3 there, 2 here"),
                         (dict(model={"name": "b", "weights": "4567"}), "model a there, b here"),
                         (dict(model={"name": "a", "weights": "4567"}), "other weights in a now")):
        with pytest.raises(RedrafterError, match=f"{run / 'checkpoint'} is the checkpoint of another run "
                                                 rf"\({said}\): give the same --model"):
            train(model, data, run, steps=4, **{"depth": 3, "model": here, **kw, **change})
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 2  # left as it was
    # the same weights under another name, on other data, or with no model named: resumed
    train(model, data[:20], run, depth=3, steps=3, model={"name": "./a", "weights": "0123"}, **kw)
    train(model, data, run, depth=3, steps=4, **kw)
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 4
    # a checkpoint from before the depth and model were recorded resumes at any depth
    state = json.loads((run / "checkpoint" / "state.json").read_text())
    (run / "checkpoint" / "state.json").write_text(json.dumps({k: state[k] for k in ("step", "rng")}))
    train(model, data, run, depth=2, steps=6, model=here, **kw)
    assert json.loads((run / "checkpoint" / "state.json").read_text())["step"] == 6


def test_train_command_refuses_a_checkpoint_for_another_model(patterned, tiny_kit, tiny_model_dir, tmp_path, capsys):
    """The command records its model's weights in the checkpoint: a copy of them resumes it, another model does not."""
    import shutil

    from redrafter_mlx import train as train_module
    from redrafter_mlx.distill import write_shard

    _, data = patterned  # 32 wide, token ids below 42: data the tiny model folder can learn
    (tmp_path / "data").mkdir()
    write_shard(tmp_path / "data", 0, [dict(s, key=str(i)) for i, s in enumerate(data)])
    argv = ["--data", str(tmp_path / "data"), "--out", str(tmp_path / "run"), "--batch", "16", "--draft-vocab", "16",
            "--save-every", "1"]
    assert train_module.main(["--model", str(tiny_model_dir), "--steps", "1", *argv]) == 0
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")  # the same weights elsewhere, touched since
    assert train_module.main(["--model", str(copy), "--steps", "2", *argv]) == 0
    other = tiny_kit.write_folder(tmp_path / "other", tiny_kit.model(seed=2))
    capsys.readouterr()
    assert train_module.main(["--model", str(other), "--steps", "3", *argv]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(said) == 1 and f"(model {copy} there, {other} here)" in said[0], said  # the run that saved last
    assert json.loads((tmp_path / "run" / "checkpoint" / "state.json").read_text())["step"] == 2


def test_steps_below_the_checkpoints_are_refused_before_loading(tmp_path, capsys, monkeypatch):
    """--steps 3 on a checkpoint at step 6 trained nothing and saved the checkpoint's drafter as a 3-step one,
    saying nothing."""
    from redrafter_mlx import loader
    from redrafter_mlx import train as train_module
    from redrafter_mlx.distill import write_shard

    class Loading(Exception):
        pass

    def load(*a, **k):
        raise Loading

    monkeypatch.setattr(loader, "load", load)
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / "state.json").write_text(json.dumps({"step": 6}))
    write_shard(tmp_path / "run", 0, [{"key": "k", "prompt": [2], "reply": [3, 4], "hidden": np.zeros((2, 32), np.float16)}])
    argv = ["--out", str(tmp_path / "run"), "--data", str(tmp_path / "run")]
    assert train_module.main([*argv, "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert err == (f"python -m redrafter_mlx.train: error: {tmp_path / 'run' / 'checkpoint'} holds step 6, past "
                   "--steps 3: give --steps 6 or more to resume it, or another --out to start anew\n")
    for steps in ("6", "7"):  # done (the same command again) or more to train: on to loading the model
        with pytest.raises(Loading):
            train_module.main([*argv, "--steps", steps])


def test_validation_with_nothing_held_out_says_so(patterned, tmp_path, capsys):
    """--val-every on data too small to hold a reply out validated nothing and kept no best drafter, saying
    nothing; held-out replies too short to validate on stopped training with a message about training data."""
    from redrafter_mlx.train import is_held_out

    model, data = patterned
    few = [s for s in data if not is_held_out(s, 0.05)][:2]
    assert any(is_held_out(s, 0.05) for s in data)
    kw = dict(depth=3, batch=16, lr=3e-3, warmup=1, draft_vocab=16, progress=False, save_every=100, val_every=2)
    log = io.StringIO()
    reloads = iter([few, data])  # still nothing held out at the first reload (not said again), then some
    train(model, few, tmp_path / "few", steps=6, val_fraction=0.05, log=log, reload=lambda: next(reloads),
          reload_every=2, **kw)
    err = capsys.readouterr().err  # (and step 6's held-out scores)
    assert [line for line in err.splitlines() if line.startswith("validation")] == [
        "validation: none of the 2 replies is held out at a share of 0.05, so nothing is validated and no best "
        "drafter kept: give more replies or a larger share (--val-fraction)"]
    vals = [json.loads(line)["step"] for line in log.getvalue().splitlines() if "val_loss" in line]
    assert vals == [6]  # none before the second reload brought replies to hold out
    cut = [dict(s, reply=s["reply"][:1], hidden=s["hidden"][:1]) for s in data]  # held out by their own hash
    short = [c for c in cut if is_held_out(c, 0.2)] + [s for s in data if not is_held_out(s, 0.2)]
    assert len(short) > len(data) // 2
    train(model, short, tmp_path / "short", steps=2, val_fraction=0.2, log=io.StringIO(), **kw)
    n = sum(is_held_out(c, 0.2) for c in cut)
    assert f"validation: the {n} held-out replies are under 2 tokens, so nothing" in capsys.readouterr().err
    assert not (tmp_path / "short" / "best").exists()


def test_checkpoint_state_is_strict_json_and_old_files_still_resume(patterned, tmp_path):
    """state.json held -Infinity (no best held-out score yet), which jq and strict parsers refuse; now null."""
    model, data = patterned

    def strict(path):
        def refuse(name):
            raise ValueError(f"not JSON: {name}")

        return json.loads(path.read_text(), parse_constant=refuse)

    kw = dict(depth=3, batch=16, lr=3e-3, warmup=1, draft_vocab=16, progress=False, save_every=2, log=io.StringIO())
    state = tmp_path / "run" / "checkpoint" / "state.json"
    train(model, data, tmp_path / "run", steps=2, **kw)
    assert strict(state)["best_accepted_drafts"] is None
    train(model, data, tmp_path / "run", steps=4, val_every=4, val_fraction=0.2, **kw)  # resumed: a best at step 4
    assert strict(state)["best_accepted_drafts"] == json.loads((tmp_path / "run" / "best" / "config.json").read_text())[
        "training"]["val_accepted_drafts"]
    old = strict(state)
    state.write_text(json.dumps({**old, "best_accepted_drafts": -float("inf")}))  # as written before
    assert "-Infinity" in state.read_text()
    train(model, data, tmp_path / "run", steps=6, val_every=2, val_fraction=0.2, **kw)
    assert strict(state)["step"] == 6 and (tmp_path / "run" / "best" / "config.json").is_file()


def test_data_that_is_no_distillation_folder_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    """A missing --data folder, a prompts file given as --data, or a folder without shards was said after the model
    had loaded (minutes for a large one), the first two as "no distillation shards"."""
    from redrafter_mlx import loader
    from redrafter_mlx import train as train_module

    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model for --data it cannot use"))
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    (tmp_path / "empty").mkdir()
    out = ["--out", str(tmp_path / "run")]
    for data in (tmp_path / "none", tmp_path / "prompts.jsonl"):
        with pytest.raises(SystemExit) as stopped:
            train_module.main(["--data", str(data), *out])
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--data {data}: not a folder; give the --out folder of" in err, err
    assert train_module.main(["--data", str(tmp_path / "empty"), *out]) == 2
    assert capsys.readouterr().err == (f"python -m redrafter_mlx.train: error: no distillation shards in "
                                       f"{tmp_path / 'empty'}\n")
    assert not (tmp_path / "run").exists()
    # one without shards beside one with some (a train --out given as data) was left out, saying nothing, and the
    # other's replies trained alone
    from redrafter_mlx.distill import write_shard

    (tmp_path / "replies").mkdir()
    write_shard(tmp_path / "replies", 0, [{"key": "k", "prompt": [1, 2], "reply": [3, 4],
                                           "hidden": np.zeros((2, 32), np.float16)}])
    assert train_module.main(["--data", str(tmp_path / "replies"), str(tmp_path / "empty"), *out]) == 2
    assert capsys.readouterr().err == (f"python -m redrafter_mlx.train: error: no distillation shards in "
                                       f"{tmp_path / 'empty'} (the other --data folder would train without it): give "
                                       "the --out folders of python -m redrafter_mlx.distill\n")
    assert not (tmp_path / "run").exists()


def test_distilling_into_another_runs_folder_is_refused(tiny_kit, tiny_model_dir, tmp_path, capsys):
    """The same --out with another --model (or --temperature) skipped every prompt already answered, said "answered
    0 prompts", and left the first model's replies to train the second model's drafter."""
    import shutil

    from redrafter_mlx.distill import main

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in ("hi", "bye")))
    out = tmp_path / "run"
    argv = ["--data", str(data), "--out", str(out), "--max-tokens", "4"]
    assert main(["--model", str(tiny_model_dir), *argv]) == 0
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")  # the same weights elsewhere: the same source
    assert main(["--model", str(copy), *argv, "--limit", "3"]) == 0
    other = tiny_kit.write_folder(tmp_path / "other", tiny_kit.model(seed=2))
    capsys.readouterr()
    for extra, said in ((["--model", str(other)], f"(model {tiny_model_dir} there, {other} here)"),
                        (["--model", str(copy), "--temperature", "0.5"], "(--temperature 0.0 there, 0.5 here)")):
        assert main([*extra, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{out} holds the replies of another run {said}" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["done.txt", "shard-00000.npz", "source.json"]


def test_distilling_into_a_run_of_another_weight_format_is_refused(tiny_model_dir, tmp_path, capsys):
    """source.json did not record --weight-format: a run resumed with another one went on into the same shards,
    replies and hidden states computed in both formats mixed. The format the load made is recorded, and another one
    is refused (one the same load makes, "auto" for "float32" on a CPU, is not another); a record from before it
    was kept takes this run's."""
    from redrafter_mlx.distill import main

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in ("hi", "bye", "yes")))
    out = tmp_path / "run"
    argv = ["--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--max-tokens", "4"]
    assert main([*argv, "--limit", "1"]) == 0
    record = json.loads((out / "source.json").read_text())
    assert (record["weight_format"], record["weight_format_option"]) == ("float32", "float32")
    capsys.readouterr()
    assert main([*argv, "--limit", "2", "--weight-format", "float16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} holds replies computed with float32 weights, and --weight-format " \
        "float16 loads float16 ones: give --weight-format float32 to add to them, or another --out" in err, err
    assert len(list(out.glob("shard-*.npz"))) == 1 and json.loads((out / "source.json").read_text()) == record
    assert main([*argv, "--limit", "2", "--weight-format", "auto"]) == 0  # (float32 weights: the same format)
    del record["weight_format"], record["weight_format_option"]  # (a record from before the format was kept)
    (out / "source.json").write_text(json.dumps(record))
    assert main([*argv, "--limit", "2", "--weight-format", "bfloat16"]) == 0
    assert json.loads((out / "source.json").read_text())["weight_format"] == "bfloat16"
    assert main([*argv, "--weight-format", "float32"]) == 2


def test_backfilling_greedy_tokens_with_another_model_is_refused(tiny_kit, tiny_model_dir, tmp_path, capsys):
    """--backfill-greedy loaded whatever --model said and added its greedy tokens to another model's sampled replies
    (of the same width: saying nothing). The model (and weight format) source.json records is required."""
    from redrafter_mlx.distill import main

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in ("hi", "bye")))
    out = tmp_path / "run"
    assert main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--max-tokens", "4",
                 "--temperature", "0.5"]) == 0
    other = tiny_kit.write_folder(tmp_path / "other", tiny_kit.model(seed=2))
    capsys.readouterr()
    assert main(["--model", str(other), "--out", str(out), "--backfill-greedy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} holds the replies of another run (model {tiny_model_dir} there, {other} " \
        "here): give the --model they came from to add its greedy tokens to them" in err, err
    assert main(["--model", str(tiny_model_dir), "--out", str(out), "--backfill-greedy", "--weight-format",
                 "float16"]) == 2
    assert "holds replies computed with float32 weights" in capsys.readouterr().err
    assert main(["--model", str(tiny_model_dir), "--out", str(out), "--backfill-greedy"]) == 0


def test_backfilling_a_damaged_shard_is_one_line(tiny_model_dir, tmp_path, capsys):
    """--backfill-greedy read each shard with nothing around it: one cut short (a full disk, a copy stopped) ended in
    a BadZipFile traceback, where training says in one line which shard is damaged and what to do."""
    from redrafter_mlx.distill import main

    out = tmp_path / "run"
    out.mkdir()
    (out / "shard-00000.npz").write_bytes(b"PK\x03\x04 cut short")
    assert main(["--model", str(tiny_model_dir), "--out", str(out), "--backfill-greedy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / 'shard-00000.npz'} is damaged (" in err and "delete it" in err, err


def test_training_on_data_distilled_from_another_model_is_refused(tiny_kit, tiny_model_dir, tmp_path, capsys):
    """The README says a mismatch is refused, but only another width or vocabulary was: a model of the same shape
    trained on the other model's replies, saying nothing. distill's record of its model now says which."""
    import shutil

    from redrafter_mlx import train as train_module
    from redrafter_mlx.distill import main as distill_main

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in ("hi", "bye", "yes")))
    assert distill_main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "d"),
                         "--max-tokens", "6"]) == 0
    other = tiny_kit.write_folder(tmp_path / "other", tiny_kit.model(seed=2))  # the same shape, other weights
    argv = ["--data", str(tmp_path / "d"), "--out", str(tmp_path / "run"), "--steps", "1", "--batch", "8",
            "--draft-vocab", "16"]
    capsys.readouterr()
    assert train_module.main(["--model", str(other), *argv]) == 2
    err = capsys.readouterr().err
    assert err == (f"python -m redrafter_mlx.train: error: {tmp_path / 'd'} was distilled from {tiny_model_dir}, not "
                   f"{other}: train with the model the data was distilled from (--model)\n")
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")  # the same weights elsewhere
    assert train_module.main(["--model", str(copy), *argv]) == 0


def test_a_distillation_record_of_the_wrong_shape_is_said_in_json_s_words(tmp_path):
    """A JSON file that must hold an object (a distillation record, a config) was "expected a JSON object, found
    list" (or "found NoneType"), Python's names."""
    from redrafter_mlx.errors import CorruptModelError
    from redrafter_mlx.files import read_json_object

    for text, found in (("[1]", "a list"), ("null", "null"), ('"abc"', "a string"), ("3", "a number")):
        (tmp_path / "source.json").write_text(text)
        with pytest.raises(CorruptModelError, match=f"source.json is not a distillation record: expected a JSON "
                                                    f"object, found {found}$"):
            read_json_object(tmp_path / "source.json", "distillation record")


def test_self_instruct_says_when_it_wrote_fewer_tasks_than_asked(tmp_path, monkeypatch, capsys):
    """A model that keeps writing the same task gives fewer new tasks than asked: the bar stopped short (1/2) and
    the run went on answering the prompts, saying nothing of it."""
    import redrafter_mlx.distill as distill_module

    loaded = TinyLoaded(tiny_model(1))
    loaded.tokenizer = WordTokenizer()
    same = [20, 21, 22, 23, 24, 25]  # "w20 w21 ... w25": the same task every time
    monkeypatch.setattr(distill_module, "generate_batch", lambda model, prompts, *a, **k: [(same, None, None)
                                                                                          for _ in prompts])
    seeds = ["Write a poem about the sea.", "Sort these numbers: 3, 1, 2.", "Explain photosynthesis.", "Name a color."]
    tasks = self_instruct(loaded, seeds, 3, tmp_path / "si.jsonl", batch_size=4, progress=False)
    assert len(tasks) == 1
    err = capsys.readouterr().err
    assert "wrote 1 new task of the 3 asked in 12 tries" in err, err


def stderr_when_it_fails(capsys, fn, error=OSError) -> str:
    """What is on stderr when `fn` raises `error`, where a command then says its error (after the bar, if one was
    open, is closed)."""
    with pytest.raises(error):
        fn()
    return capsys.readouterr().err


def test_an_error_while_distilling_or_training_closes_the_bar_first(tmp_path, capsys, monkeypatch):
    """An error in the loop (a full disk writing a shard or a checkpoint) left the bar open: the command's error was
    said on the bar's line, and the bar drawn again after it, distill's at a count not reached (6/6 of 3 answered)."""
    from redrafter_mlx import distill as distill_module
    from redrafter_mlx import train as train_module

    real, calls = distill_module.write_shard, []

    def full_at_the_second(*a, **k):
        if calls:
            raise OSError(28, "No space left on device")
        calls.append(real(*a, **k))

    monkeypatch.setattr(distill_module, "write_shard", full_at_the_second)
    prompts = [f"question {i} about {w}" for i, w in enumerate(["cats", "dogs", "rivers"] * 2)]
    out = tmp_path / "d"
    err = stderr_when_it_fails(capsys, lambda: distill(TinyLoaded(tiny_model()), prompts, out, batch_size=3,
                                                       max_tokens=12, progress=True))
    assert err.endswith("\n") and "3/6" in err.rstrip("\n").rsplit("\r", 1)[-1], repr(err)

    monkeypatch.setattr(train_module, "save_checkpoint", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full")))
    samples = list(read_shards(out))
    err = stderr_when_it_fails(capsys, lambda: train(tiny_model(), samples, tmp_path / "run", steps=3, batch=8,
                                                     save_every=1, draft_vocab=0))
    assert err.endswith("\n") and "1/3" in err.rstrip("\n").rsplit("\r", 1)[-1], repr(err)

    loaded = TinyLoaded(tiny_model(1))
    loaded.tokenizer = WordTokenizer()
    monkeypatch.setattr(distill_module, "generate_batch", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full")))
    seeds = ["Write a poem about the sea.", "Sort these numbers.", "Explain photosynthesis."]
    err = stderr_when_it_fails(capsys, lambda: self_instruct(loaded, seeds, 2, tmp_path / "si.jsonl", batch_size=2))
    assert err.endswith("\n") and "0/2" in err.rstrip("\n").rsplit("\r", 1)[-1], repr(err)


def test_a_full_disk_in_distill_and_train_says_the_work_is_kept(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """A full disk while distill wrote a shard, or train a checkpoint, ended in one line that said nothing of the
    work kept, where Ctrl-C says the same command goes on from it (as redrafter-train says of its stages)."""
    from redrafter_mlx import distill as distill_module
    from redrafter_mlx import train as train_module

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"task {i}: say {'ab' * (i % 4 + 1)}"}) + "\n" for i in range(6)))
    out = tmp_path / "d"
    real, calls = distill_module.write_shard, []

    def full_at_the_second(*a, **k):
        if calls:
            raise OSError(28, "No space left on device", str(out / "shard-00001.npz"))
        calls.append(real(*a, **k))

    monkeypatch.setattr(distill_module, "write_shard", full_at_the_second)
    argv = ["--model", str(tiny_model_dir), "--data", str(data), "--out", str(out), "--batch-size", "3",
            "--max-tokens", "6"]
    assert distill_module.main(argv) == 1
    err = capsys.readouterr().err.split("\n")[-2]
    assert err == (f"python -m redrafter_mlx.distill: error: No space left on device: {out / 'shard-00001.npz'}; "
                   f"run the same command again to answer the rest (the replies written so far are kept in {out})"), err
    monkeypatch.setattr(distill_module, "write_shard", real)
    assert distill_module.main(argv) == 0  # it does: the first batch's replies are not answered again
    assert len(list(read_shards(out))) == 6

    def mlx_full(*a, **k):
        raise RuntimeError("[save_safetensors] Unable to write 1441433 bytes to file.")

    monkeypatch.setattr(train_module, "save_checkpoint", mlx_full)
    assert train_module.main(["--model", str(tiny_model_dir), "--data", str(out), "--out", str(tmp_path / "run"),
                              "--steps", "2", "--batch", "8", "--draft-vocab", "0"]) == 1
    err = capsys.readouterr().err.split("\n")[-2]
    assert err == ("python -m redrafter_mlx.train: error: Unable to write 1441433 bytes to file: is the disk full, or "
                   "the folder not writable? (then run the same command again to resume from the last checkpoint)"), err


def test_an_error_in_train_s_evaluation_closes_its_bar_first(capsys, monkeypatch):
    """An error while train evaluated (a full disk writing eval.jsonl) left the bar open: the command's error was
    said on the bar's line."""
    from redrafter_mlx import train as train_module

    def evaluate(loaded, prompts, width, length, max_tokens, on_reply):
        for _ in prompts:
            on_reply()
        return {"tokens": 4, "end_tokens": 0, "steps": 2}

    def full(row):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_module, "evaluate", evaluate)
    questions = [{"prompt": "a", "category": "x"}, {"prompt": "b", "category": "y"}]
    err = stderr_when_it_fails(capsys, lambda: train_module.evaluate_shapes(None, questions, [(4, 5), (2, 3)], 8,
                                                                           record=full))
    assert err.endswith("\n") and "2/4" in err.rstrip("\n").rsplit("\r", 1)[-1], repr(err)


def test_ctrl_c_in_distill_s_self_instruct_says_the_tasks_are_kept(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """Ctrl-C while distill --self-instruct wrote its new tasks said only "cancelled", as if they were lost; they are
    kept in OUT/self_instruct.jsonl, and the same command goes on (as Ctrl-C while answering says)."""
    from redrafter_mlx import distill as distill_module

    def stopped(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(distill_module, "self_instruct", stopped)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"task number {i}"}) + "\n" for i in range(4)))
    out = tmp_path / "d"
    assert distill_module.main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(out),
                                "--self-instruct", "2", "--max-tokens", "6"]) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"python -m redrafter_mlx.distill: cancelled; the new tasks written so far are in "
                   f"{out / 'self_instruct.jsonl'}: the same command writes the rest and answers the prompts"), err


def test_train_says_where_the_most_accurate_drafter_is(tiny_model_dir, tmp_path, capsys):
    """With --val-every the most accurate drafter goes to OUT/best (what redrafter-train installs), and the run ended
    saying only "saved OUT/drafter", the last step's."""
    from redrafter_mlx import distill as distill_module
    from redrafter_mlx import train as train_module

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"task {i}: say {'ab' * (i % 4 + 1)}"}) + "\n" for i in range(12)))
    out = tmp_path / "d"
    assert distill_module.main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(out),
                                "--max-tokens", "6"]) == 0
    run = tmp_path / "run"
    assert train_module.main(["--model", str(tiny_model_dir), "--data", str(out), "--out", str(run), "--steps", "4",
                              "--batch", "8", "--draft-vocab", "0", "--val-every", "2", "--val-fraction", "0.5"]) == 0
    assert (run / "best" / "config.json").is_file()
    said = capsys.readouterr().err.splitlines()[-1]
    assert said.startswith(f"saved {run / 'drafter'} (step 4); the most accurate on the held-out replies is "
                           f"{run / 'best'} (step "), said


def test_a_finished_training_run_run_again_says_so_and_keeps_its_record(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The same command again after every step was done trained nothing, and saved the checkpoint's drafter again
    with a new training record (seconds_this_run: the seconds of the run that did nothing). It says the drafter is
    already trained and leaves it, its record and the log as they were, without loading the model."""
    import os

    from redrafter_mlx import distill as distill_module
    from redrafter_mlx import loader
    from redrafter_mlx import train as train_module

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"task {i}: say {'ab' * (i % 4 + 1)}"}) + "\n" for i in range(12)))
    assert distill_module.main(["--model", str(tiny_model_dir), "--data", str(data), "--out", str(tmp_path / "d"),
                                "--max-tokens", "6"]) == 0
    run = tmp_path / "run"
    argv = ["--model", str(tiny_model_dir), "--data", str(tmp_path / "d"), "--out", str(run), "--steps", "2",
            "--batch", "8", "--draft-vocab", "0", "--val-every", "2", "--val-fraction", "0.5"]
    assert train_module.main(argv) == 0
    config = json.loads((run / "drafter" / "config.json").read_text())
    config["training"]["seconds_this_run"] = 834  # as a real run records its time
    (run / "drafter" / "config.json").write_text(json.dumps(config))
    kept = {f: (f.read_bytes(), os.stat(f).st_mtime_ns) for f in sorted(run.rglob("*")) if f.is_file()}
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model to train nothing"))
        assert train_module.main(argv) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"{run / 'drafter'} is already trained to step 2: nothing to train (a larger --steps trains "
                          f"it on; another --out starts anew); the most accurate on the held-out replies is "
                          f"{run / 'best'} (step 2, "), err
    assert err.count("\n") == 1, err
    assert {f: (f.read_bytes(), os.stat(f).st_mtime_ns) for f in sorted(run.rglob("*")) if f.is_file()} == kept
    # a larger --steps trains on from the checkpoint, as before
    assert train_module.main([*argv, "--steps", "3"]) == 0  # (the last --steps counts)
    assert json.loads((run / "drafter" / "config.json").read_text())["training"]["steps"] == 3


def test_a_resumed_distill_bar_counts_the_prompts_answered_before(tmp_path, monkeypatch):
    """Resumed, the bar began at 0 of the prompts left ("0/3" under redrafter-train's "6 prompts"); it starts at the
    ones answered before, of all, as self-instruct's and train's bars do."""
    import tqdm

    from redrafter_mlx import distill as distill_module

    prompts = [f"question {i} about {w}" for i, w in enumerate(["cats", "dogs", "rivers"] * 2)]
    out = tmp_path / "d"
    real, calls = distill_module.write_shard, []

    def stopped_after_the_first(*a, **k):
        if calls:
            raise KeyboardInterrupt
        calls.append(real(*a, **k))

    with monkeypatch.context() as m:
        m.setattr(distill_module, "write_shard", stopped_after_the_first)
        with pytest.raises(KeyboardInterrupt):
            distill(TinyLoaded(tiny_model()), prompts, out, batch_size=3, max_tokens=12, progress=False)
    bars = []

    class Bar(tqdm.tqdm):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            bars.append((self.n, self.total))

        def close(self):
            bars.append((self.n, self.total))
            super().close()

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    assert distill(TinyLoaded(tiny_model()), prompts, out, batch_size=3, max_tokens=12, progress=True) == 3
    assert bars[0] == (3, 6) and bars[-1] == (6, 6), bars
