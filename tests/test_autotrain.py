"""redrafter-train end to end on a tiny model: interrupted in distillation and in training,
resumed, installed where load() finds it, and not overwriting a drafter as good without --force."""

import json
import re
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from redrafter_mlx import autotrain, distill, load, train


@pytest.fixture
def tiny_budget(monkeypatch):
    monkeypatch.setitem(autotrain.BUDGETS, "tiny", autotrain.Budget(
        self_instruct=2, prompts=10, max_tokens=8, steps=8, eval_prompts=2, eval_tokens=8, minutes_cpu=0))


@pytest.fixture
def drafting_drafter(monkeypatch):
    """The evaluation reads the new drafter as one that drafts (1.5 tokens/step at the fixed tree where it read
    less), for tests of what a run does once a drafter is worth installing: the tiny model's drafter, trained 8
    steps on 10 replies (80 steps did no better), drafts nothing right on the held-out prompts, and before the
    fixed tree left out the context's copies (test_the_evaluation_counts_the_drafters_own_drafts...), those copies
    alone had it installed."""
    real = autotrain.measure

    def drafts(*a, **kw):
        results = real(*a, **kw)
        row = results["fixed 4x5 (new)"]
        row["tokens_per_step"] = max(row["tokens_per_step"], 1.5)
        return results

    monkeypatch.setattr(autotrain, "measure", drafts)


def interrupt_after(monkeypatch, module, name, calls):
    real = getattr(module, name)
    seen = []

    def wrapper(*a, **kw):
        out = real(*a, **kw)
        seen.append(1)
        if len(seen) == calls:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(module, name, wrapper)


def tiny_run(model_dir, tmp_path):
    """The work folder and redrafter-train's arguments for 12 short patterned prompts at the tiny budget."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"task {i}: say {'ab' * (i % 4 + 1)}"}) + "\n"
                               for i in range(12)))
    work = tmp_path / "work"
    return work, ["--model", str(model_dir), "--budget", "tiny", "--prompts", str(prompts), "--work", str(work),
                  "--batch-size", "4"]


def test_train_command_resumes_installs_and_keeps_a_better_drafter(tiny_model_dir, tmp_path, tiny_budget,
                                                                   drafting_drafter, monkeypatch, capsys):
    work, argv = tiny_run(tiny_model_dir, tmp_path)

    with monkeypatch.context() as m:  # killed after the first batch of replies
        interrupt_after(m, distill, "write_shard", 1)
        assert autotrain.main(argv) == 130
    assert "interrupted" in capsys.readouterr().err
    answered = (work / "distill" / "done.txt").read_text().split()
    assert 0 < len(answered) < 10

    with monkeypatch.context() as m:  # killed after the third training checkpoint (step 6 of 8)
        interrupt_after(m, train, "save_checkpoint", 3)
        assert autotrain.main(argv) == 130
    assert len((work / "distill" / "done.txt").read_text().split()) == 10  # the rest answered, none twice
    assert json.loads((work / "train" / "checkpoint" / "state.json").read_text())["step"] == 6

    autotrain.main(argv)
    steps = [json.loads(line)["step"] for line in (work / "train" / "train_log.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert steps == list(range(1, 9))  # resumed after step 6, not started over
    home = tiny_model_dir / "drafter"
    manifest = json.loads((home / "manifest.json").read_text())
    assert manifest["data"]["replies"] == 10 and manifest["training"]["steps"] == 8
    # the command as given (called otherwise than as redrafter-train, it was "--model M --budget B" alone)
    assert manifest["command"] == "redrafter-train " + " ".join(argv)
    assert manifest["evaluation"]["results"]["auto (new)"]["identical_to_ar"]
    assert "held-out" in (home / "README.md").read_text().lower()
    out = capsys.readouterr().out
    assert "speedup" in out and f"installed {home}" in out
    loaded = load(str(tiny_model_dir))
    assert loaded.drafter is not None and loaded.drafter_path == home

    # Run again: the drafter in place is this one, so it stays unless --force. (It was said "not installed: the drafter
    # in place drafts as many tokens per step; the new one is at WORK/train/drafter", of the drafter installed.)
    stamp = (home / "manifest.json").stat().st_mtime_ns
    autotrain.main(argv)
    out = capsys.readouterr().out
    assert "already installed: the drafter in place is this one" in out and "not installed" not in out, out
    # and measured once, not twice over as the new drafter and the one in place
    assert "fixed 4x5 (in place)" not in json.loads((work / "state.json").read_text())["evaluation"]
    assert (home / "manifest.json").stat().st_mtime_ns == stamp
    before = (home / "manifest.json").read_text()
    autotrain.main(argv + ["--force"])
    out = capsys.readouterr().out
    assert "installed" in out and (home / "manifest.json").stat().st_mtime_ns != stamp
    assert not list(tiny_model_dir.glob(".drafter.*"))  # no half-written folders left beside it
    # the drafter it replaced is kept beside it, and said (it was deleted), and load() still uses the new one
    assert (tiny_model_dir / "drafter.previous" / "manifest.json").read_text() == before
    assert f"; the drafter it replaces is kept at {tiny_model_dir / 'drafter.previous'} (put it back" in out, out
    assert load(str(tiny_model_dir)).drafter_path == home

    # the drafter in place left without its config.json (load() refuses it now, where it passed it over): not
    # "already installed" (its weights are this run's), but replaced
    (home / "config.json").unlink()
    autotrain.main(argv)
    assert "already installed" not in capsys.readouterr().out
    assert load(str(tiny_model_dir)).drafter_path == home


def test_a_drafter_none_of_whose_drafts_were_accepted_is_not_installed(tiny_model_dir, tmp_path, tiny_budget,
                                                                       monkeypatch, capsys):
    """With no drafter in place, a new one that drafted 1.0 tokens/step (no draft ever accepted: decoding only
    slowed) was installed; it is kept aside, said in one line, unless --force."""
    real = autotrain.measure

    def useless(*a, **kw):  # the real evaluation, with the new drafter's drafts all rejected
        results = real(*a, **kw)
        results["fixed 4x5 (new)"]["tokens_per_step"] = 1.0
        return results

    monkeypatch.setattr(autotrain, "measure", useless)
    work, argv = tiny_run(tiny_model_dir, tmp_path)
    autotrain.main(argv)  # returns: an outcome, not an error (as when the drafter in place is kept)
    said = [line for line in capsys.readouterr().out.splitlines() if "installed" in line]
    assert len(said) == 1 and said[0].startswith("not installed: none of the new drafter's drafts were accepted")
    assert "1.0 tokens/step" in said[0] and "--force installs it" in said[0]
    assert not (tiny_model_dir / "drafter").exists() and load(str(tiny_model_dir)).drafter is None
    assert json.loads((work / "state.json").read_text())["installed"] is None
    assert (work / "train" / "best" / "config.json").is_file() or (work / "train" / "drafter" / "config.json").is_file()
    autotrain.main(argv + ["--force"])
    assert f"installed {tiny_model_dir / 'drafter'}" in capsys.readouterr().out
    assert load(str(tiny_model_dir)).drafter is not None


def test_the_evaluation_counts_the_drafters_own_drafts_not_the_context_copies(tiny_kit, tiny_loaded):
    """The fixed tree that compares drafters (and decides "none of its drafts were accepted") ran with the context's
    copy decoding adds by default, so on replies that repeat their prompt a drafter that drafts nothing right read
    well over 1.0 tokens/step and was installed. It drafts the drafter's beams alone now."""
    from redrafter_mlx.drafter import Drafter, DrafterArgs
    from redrafter_mlx.generate import generate

    m = tiny_loaded
    drafter = Drafter(DrafterArgs(hidden_size=m.model.args.hidden_size, vocab_size=m.model.args.vocab_size))
    prompts = [line["prompt"] for line in map(json.loads, autotrain.EVAL_PROMPTS.read_text().splitlines())][:2]
    results = autotrain.measure(m, {"new": (None, drafter)}, prompts, 8)
    # the random drafter's own drafts: none accepted
    assert results["fixed 4x5 (new)"]["tokens_per_step"] == 1.0 and results["fixed 4x5 (new)"]["identical_to_ar"]
    # the same shape with the copy takes the tiny model's repetitions (what the evaluation had counted)
    m.drafter, steps, tokens = drafter, 0, 0
    for p in prompts:
        g = generate(m, p, mode="redrafter", beam_width=4, beam_length=5, max_tokens=8)
        steps, tokens = steps + g.stats.steps, tokens + g.stats.step_tokens + g.stats.end_tokens
    assert tokens / steps > 1.5, tokens / steps


def test_train_command_refuses_mt_bench_and_missing_prompt_files(tiny_model_dir, tmp_path, capsys):
    bench = tmp_path / "mt_bench.jsonl"
    bench.write_text(json.dumps({"prompt": "x"}) + "\n")
    for argv, said in ((["--prompts", str(bench), "--work", str(tmp_path / "w")], "MT-Bench"),
                       (["--eval-prompts", str(bench)],
                        f"error: {re.escape(str(bench))}: MT-Bench is the benchmark: .* nor choose which one is installed"),
                       (["--prompts", str(tmp_path / "none.jsonl")],
                        "prompt file .*none.jsonl not found: give a JSONL file")):
        assert autotrain.main(["--model", str(tiny_model_dir), *argv]) == 2  # a user error's status (it was 1)
        err = capsys.readouterr().err
        assert re.search(said, err) and err.startswith("redrafter-train: error: ") and err.count("\n") == 1, err


def test_shipped_prompts_are_there_and_not_mt_bench():
    groups = autotrain.shipped_groups()
    assert [len(g) for g in groups] == [167, 1200]
    evals = autotrain.read_prompt_files([autotrain.EVAL_PROMPTS])[0]
    assert len(evals) == 16 and not set(evals) & {p for g in groups for p in g}
    assert "Apache" in (autotrain.DATA / "README.md").read_text() and "MIT" in (autotrain.DATA / "README.md").read_text()


def test_new_prompts_start_afresh_and_long_eval_prompts_are_left_out(tiny_model_dir, tmp_path, tiny_budget, capsys,
                                                                     tiny_kit, monkeypatch):
    """A second run in the same work folder on other prompts must not resume the first run's replies
    and drafter (it had trained 0 steps and installed the old weights); evaluation prompts longer than
    the model's context are left out instead of failing after training; fewer than 3 prompts is refused."""
    work = tmp_path / "work"

    def prompts(name, word):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"{word} {i}: say {'ab' * (i % 4 + 1)}"}) + "\n"
                                for i in range(12)))
        return path

    evals = tmp_path / "eval.jsonl"
    evals.write_text(json.dumps({"prompt": "word " * 600}) + "\n" + json.dumps({"prompt": "say hi"}) + "\n")
    argv = ["--model", str(tiny_model_dir), "--budget", "tiny", "--work", str(work), "--batch-size", "4",
            "--eval-prompts", str(evals)]
    autotrain.main(argv + ["--prompts", str(prompts("a", "task"))])
    err = capsys.readouterr().err
    assert "1 of 2 prompts are longer than the context" in err and "starting afresh" not in err
    autotrain.main(argv + ["--prompts", str(prompts("b", "chore")), "--force"])
    assert "holds a run on other prompts, another model or other settings" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (work / "train" / "train_log.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert steps == list(range(1, 9))  # trained anew, not resumed at step 8
    manifest = json.loads((tiny_model_dir / "drafter" / "manifest.json").read_text())
    assert "b.jsonl" in manifest["data"]["prompts"] and manifest["data"]["replies"] == 10
    # the same prompts and work folder, another model: its replies, not the first model's
    other = tiny_kit.write_folder(tmp_path / "other-model", tiny_kit.model(seed=2))
    other_argv = [str(other) if a == str(tiny_model_dir) else a for a in argv]
    # --force: 8 steps on 10 replies teach this model's drafter nothing that "say hi" accepts (1.0 tokens/step)
    autotrain.main(other_argv + ["--prompts", str(prompts("b", "chore")), "--force"])
    assert "another model or other settings (--budget, --weight-format): starting afresh" in capsys.readouterr().err
    assert (other / "drafter" / "model.safetensors").read_bytes() != \
        (tiny_model_dir / "drafter" / "model.safetensors").read_bytes()
    # the same prompts, model and work folder, another weight format (or budget): not the first run's replies
    autotrain.main(other_argv + ["--prompts", str(prompts("b", "chore")), "--weight-format", "float16", "--force"])
    assert "starting afresh" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (work / "train" / "train_log.jsonl").read_text().splitlines()
             if '"loss"' in line]
    assert steps == list(range(1, 9))  # trained anew, not resumed at step 8
    two = tmp_path / "two.jsonl"
    two.write_text(json.dumps({"prompt": "x"}) + "\n" + json.dumps({"prompt": "y"}) + "\n")
    assert autotrain.main(argv + ["--prompts", str(two)]) == 2 and "give at least 3" in capsys.readouterr().err

    # every file given seeds self-instruct: two prompts first and twelve after were refused (the first file's alone)
    class Checked(Exception):
        pass

    def resolve(*a, **k):
        raise Checked

    from redrafter_mlx import registry

    monkeypatch.setattr(registry, "resolve", resolve)  # the seeds passed: stop before the model loads
    with pytest.raises(Checked):
        autotrain.main(argv + ["--prompts", str(two), str(prompts("a", "task"))])


def test_a_drafter_place_that_cannot_be_written_is_refused_first(tmp_path):
    from redrafter_mlx.errors import RedrafterError

    blocked = tmp_path / "model.gguf"
    blocked.write_text("not a folder")
    with pytest.raises(RedrafterError, match="cannot be written"):
        autotrain._check_installable(blocked / "drafter")
    autotrain._check_installable(tmp_path / "model" / "drafter")  # a folder that can be made is fine
    assert not (tmp_path / "model").exists()  # and the check makes nothing


def test_a_work_folder_that_cannot_be_one_is_refused_before_loading(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """It was refused after the model had loaded, with "run the same command again to resume"."""
    from redrafter_mlx import loader

    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model for a bad --work"))
    (tmp_path / "file").write_text("x")
    for work, said in ((tmp_path / "file", "is a file, not a folder"),
                       (tmp_path / "file" / "below", "cannot make the folder")):
        with pytest.raises(SystemExit):
            autotrain.main(["--model", str(tiny_model_dir), "--work", str(work)])
        err = capsys.readouterr().err
        assert "argument --work" in err and said in err and "again" not in err, err


def test_a_run_refused_after_parsing_leaves_no_work_folder(tiny_model_dir, tmp_path, capsys):
    """--work was made while parsing: a run then refused (too few prompts; evaluation prompts too long for the
    context, found once the model has loaded) left an empty folder behind. It is made when the work starts."""
    two = tmp_path / "two.jsonl"
    two.write_text(json.dumps({"prompt": "x"}) + "\n" + json.dumps({"prompt": "y"}) + "\n")
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "word " * 600}) + "\n")
    work = tmp_path / "new" / "work"
    # one prompt three times passed as three (README: fewer than 3 different training prompts are refused)
    thrice = tmp_path / "thrice.jsonl"
    thrice.write_text(3 * (json.dumps({"prompt": "say hi"}) + "\n"))
    for argv, said in ((["--prompts", str(two)], "give at least 3"), (["--eval-prompts", str(long)], "leaves room"),
                       (["--prompts", str(thrice)], "1 prompt (2 more repeat it) to write new tasks from: give at "
                                                    "least 3 different ones")):
        assert autotrain.main(["--model", str(tiny_model_dir), "--work", str(work), *argv]) == 2
        assert said in capsys.readouterr().err
        assert not (tmp_path / "new").exists()


def test_a_work_folder_holding_someone_elses_train_folder_is_refused_not_emptied(tiny_model_dir, tmp_path, capsys,
                                                                                  monkeypatch):
    """`--work .` in a project with its own train/ folder: "starting afresh" deleted it (no data_key.txt there,
    so it read as another run's work). A folder no run made is refused before the model loads, and kept."""
    from redrafter_mlx import loader

    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model for a --work it must refuse"))
    project = tmp_path / "project"
    (project / "train").mkdir(parents=True)
    (project / "train" / "data.csv").write_text("mine\n")
    (project / "state.json").write_text('{"mine": 1}')
    assert autotrain.main(["--model", str(tiny_model_dir), "--work", str(project)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "train/, state.json, which redrafter-train did not write" in err
    assert (project / "train" / "data.csv").read_text() == "mine\n" and (project / "state.json").is_file()
    # an earlier run's folder (state.json with its figures, from before data_key.txt) is its own, and no refusal
    autotrain._check_work_folder(project / "absent")
    (project / "state.json").write_text('{"seconds": {}}')
    autotrain._check_work_folder(project)


def test_help_names_the_default_model(capsys):
    """--model's default was "the registry default", a name --help gave nowhere (redrafter-bench names it)."""
    from redrafter_mlx.registry import default_model_name

    with pytest.raises(SystemExit):
        autotrain.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"GGUF file or hub id (default: {default_model_name()})" in text and "registry default" not in text


def test_a_foreign_work_folder_is_said_in_the_grammar_of_its_count(tmp_path):
    """One entry that no run made was said "holds train/, ... would delete them"."""
    from redrafter_mlx.errors import RedrafterError

    (tmp_path / "train").mkdir()
    with pytest.raises(RedrafterError, match=r"holds train/, which redrafter-train did not write, and a run there "
                                             r"would delete it: "):
        autotrain._check_work_folder(tmp_path)
    (tmp_path / "state.json").write_text("{}")
    with pytest.raises(RedrafterError, match=r"holds train/, state.json, which .* would delete them: "):
        autotrain._check_work_folder(tmp_path)


def test_a_drafter_place_that_cannot_be_written_is_refused_before_loading(tiny_model_dir, tmp_path, capsys,
                                                                          monkeypatch):
    """It was checked after the model had loaded (minutes for a large model)."""
    from redrafter_mlx import loader

    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model before checking its drafter place"))
    monkeypatch.setattr(autotrain, "unwritable_ancestor", lambda path: path.parent)
    assert autotrain.main(["--model", str(tiny_model_dir), "--work", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be written" in err, err


def test_a_full_disk_while_mlx_writes_is_one_line(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """MLX's writes fail with a RuntimeError, which redrafter-train let out as a traceback."""
    def full(args):
        raise RuntimeError("[save_safetensors] Unable to write 1441433 bytes to file.")

    monkeypatch.setattr(autotrain, "run", full)
    assert autotrain.main(["--model", str(tiny_model_dir), "--work", str(tmp_path / "work")]) == 1
    assert capsys.readouterr().err == ("redrafter-train: error: Unable to write 1441433 bytes to file: is the disk "
                                       "full, or the folder not writable? (then run the same command again to resume)\n")

    def denied(args):  # an OS error (a folder that cannot be written) says the same: the stages done are kept
        raise PermissionError(13, "Permission denied", str(tmp_path / "work" / "distill"))

    monkeypatch.setattr(autotrain, "run", denied)
    assert autotrain.main(["--model", str(tiny_model_dir), "--work", str(tmp_path / "work")]) == 1
    assert capsys.readouterr().err == (f"redrafter-train: error: Permission denied: {tmp_path / 'work' / 'distill'}; "
                                       "run the same command again to resume\n")

    def bug(args):
        raise RuntimeError("something else")

    monkeypatch.setattr(autotrain, "run", bug)
    with pytest.raises(RuntimeError, match="something else"):  # a bug keeps its traceback
        autotrain.main(["--model", str(tiny_model_dir), "--work", str(tmp_path / "work")])


def test_evaluation_prompts_that_are_training_prompts_are_left_out(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The same file as --prompts and --eval-prompts evaluated the drafter on replies it had learned: the inflated
    tokens/step decided whether it replaced the drafter in place (the README promises never the training ones)."""
    from redrafter_mlx import loader

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"task {i}"}) + "\n" for i in range(5)))
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model for no evaluation prompts"))
    assert autotrain.main(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--eval-prompts",
                           str(prompts)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"every evaluation prompt in {prompts} is a training prompt too" in err
    kept = autotrain._held_out(["task 1", "say hi", "task 4", "say bye"], [["task 0", "task 1"], ["task 4"]], "e.jsonl")
    assert kept == ["say hi", "say bye"]
    assert "evaluation: 2 of 4 prompts in e.jsonl are training prompts too, and are left out" in capsys.readouterr().err


def test_ctrl_c_is_said_on_a_line_of_its_own(tiny_model_dir, capsys, monkeypatch):
    """The interrupted stage's progress bar is left mid-line, and the message ran on after it
    ("distill:  20%|██  | 29/143 [...]redrafter-train: interrupted; ...")."""
    import sys

    def interrupted(args):
        print("\rdistill:  20%|##  | 29/143", end="", file=sys.stderr)
        raise KeyboardInterrupt

    monkeypatch.setattr(autotrain, "run", interrupted)
    assert autotrain.main(["--model", str(tiny_model_dir)]) == 130
    assert capsys.readouterr().err.endswith("29/143\nredrafter-train: interrupted; run the same command again to "
                                            "resume\n")


def test_a_model_without_a_chat_template_is_noted(tiny_model_dir, tmp_path, capsys):
    """Its prompts reach it as plain text to continue, and the drafter is trained on that, which the run did
    not say. (Stopped at the evaluation prompts, which leave no room in its context.)"""
    (tiny_model_dir / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tiny_model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "word " * 600}) + "\n")
    assert autotrain.main(["--model", str(tiny_model_dir), "--work", str(tmp_path / "w"), "--eval-prompts",
                           str(long)]) == 2
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert notes == [f"redrafter-train: note: {tiny_model_dir} has no chat template, so the prompts reach it as plain "
                     "text to continue (as chat messages will): for a chat model, give it one (python -m convert "
                     "--chat-template)"], notes
    # python -m redrafter_mlx.distill said nothing of it
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "say hi"}) + "\n")
    assert distill.main(["--model", str(tiny_model_dir), "--data", str(prompts), "--out", str(tmp_path / "d"),
                         "--max-tokens", "4"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert notes == [f"distill: note: {tiny_model_dir} has no chat template, so the prompts reach it as plain text to continue "
                     "(as chat messages will): for a chat model, give it one (python -m convert --chat-template)"], notes


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, a folder no one can write in")
def test_a_work_or_out_folder_where_nothing_can_be_written_is_refused_while_parsing(tiny_model_dir, tmp_path, capsys,
                                                                                      monkeypatch):
    """Writability was asked of os.access, which passes everything for root: --work /proc/x loaded the model and
    then failed with "No such file or directory ...; run the same command again to resume" (distill and train's
    --out the same). A folder is made there and removed instead."""
    from redrafter_mlx import distill as distill_module
    from redrafter_mlx import loader
    from redrafter_mlx import train as train_module
    from redrafter_mlx.files import unwritable_ancestor

    assert unwritable_ancestor(Path("/proc/redrafter-x/y")) == Path("/proc")
    before = sorted(tmp_path.iterdir())
    assert unwritable_ancestor(tmp_path / "a" / "b") is None and sorted(tmp_path.iterdir()) == before  # no probe left
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded the model for a folder it cannot write"))
    for argv in (["--work", "/proc/redrafter-x"], ["--work", "/proc"]):
        with pytest.raises(SystemExit) as stopped:
            autotrain.main(["--model", str(tiny_model_dir), *argv])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and "argument --work" in err and "again" not in err, err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    for main, data in ((distill_module.main, prompts), (train_module.main, tmp_path)):
        with pytest.raises(SystemExit) as stopped:
            main(["--model", str(tiny_model_dir), "--data", str(data), "--out", "/proc/redrafter-x"])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and "--out /proc/redrafter-x cannot be made: /proc is not a folder you can write" \
            in err, err
        with pytest.raises(SystemExit) as stopped:  # one that is there (it loaded the model and then failed)
            main(["--model", str(tiny_model_dir), "--data", str(data), "--out", "/proc"])
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and "--out /proc is a folder you cannot write" in err, err


def test_a_reader_gone_from_the_report_ends_quietly(tiny_model_dir, capsys, monkeypatch):
    """`redrafter-train ... | head -1`: the finished run said "error: Broken pipe; run the same command again to
    resume", which would have done the evaluation again for nothing."""
    def gone(manifest, out=None):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(autotrain, "run", lambda args: {})
    monkeypatch.setattr(autotrain, "report", gone)
    assert autotrain.main(["--model", str(tiny_model_dir)]) == 1 and capsys.readouterr().err == ""


def test_a_prompt_list_cut_short_does_not_stop_every_later_run(tiny_model_dir, tmp_path, tiny_budget, capsys):
    """prompts.json was written in place: cut short (Ctrl-C, a full disk), every later run of the command ended in
    a JSONDecodeError traceback. It is written whole or not at all, and one cut short is chosen again."""
    work, argv = tiny_run(tiny_model_dir, tmp_path)
    autotrain.main(argv)
    # (10 replies hold none out for validation: the advice named --val-fraction, an option of train, not of this command)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("validation:")]
    assert said and said[0].endswith("no best drafter kept: give more prompts (--prompts)"), said
    chosen = json.loads((work / "prompts.json").read_text())
    (work / "prompts.json").write_text(json.dumps(chosen)[:50])
    autotrain.main(argv)
    again = json.loads((work / "prompts.json").read_text())  # from the tasks kept (and any more written now)
    assert again["key"] == chosen["key"] and again["tasks"][: len(chosen["tasks"])] == chosen["tasks"]
    assert not [p.name for p in work.iterdir() if p.name.startswith(".")]
    # JSON of another shape (a hand edit) ended in an AttributeError traceback ('list' object has no attribute 'get')
    (work / "prompts.json").write_text("[1, 2]")
    autotrain.main(argv)
    assert json.loads((work / "prompts.json").read_text())["key"] == chosen["key"]



def test_the_module_command_exits_with_the_status_main_returns(tmp_path):
    """`python -m redrafter_mlx.autotrain` (the README's other spelling of redrafter-train) ends with main's status,
    as the console script does: a user error is status 2 in one line, not 0."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "redrafter_mlx.autotrain", "--prompts", str(tmp_path / "none.jsonl")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out
    said = f"prompt file {tmp_path / 'none.jsonl'} not found: give a JSONL file"
    assert out.stderr == f"redrafter-train: error: {said}\n", out.stderr


def test_the_evaluation_says_when_it_measures_this_machine(monkeypatch, capsys):
    """auto's first reply calibrates the cost model where the machine and model were never measured (minutes on a
    fresh CUDA GPU): the other commands print a status line, redrafter-train's evaluation bar stood still, silent."""
    import importlib
    from types import SimpleNamespace

    from redrafter_mlx.stats import RunStats

    def generate(loaded, prompt, mode, max_tokens, progress=None, **kw):
        if progress is not None:
            progress("measuring this machine's verification cost (once)")
        return SimpleNamespace(stats=RunStats(step_tokens=4, steps=4, decode_seconds=1.0), tokens=[1, 2, 3, 4])

    monkeypatch.setattr(importlib.import_module("redrafter_mlx.generate"), "generate", generate)
    results = autotrain.measure(SimpleNamespace(drafter=None), {"new": ("path", object())}, ["a", "b"], 8)
    assert results["auto (new)"]["identical_to_ar"]
    said = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if "measuring" in line]
    assert said and set(said) == {"measuring this machine's verification cost (once)"}, said


def test_the_default_work_folder_of_a_local_model_is_its_own(tiny_model_dir, tmp_path, monkeypatch):
    """`--model .` worked in the cache's train/ folder itself, shared by every model trained that way (each run of
    another model deleted the last one's work, "starting afresh"); `--model ..` was refused for a --work it was not
    given. A local model's work folder is named by its full path, however it is typed."""
    from redrafter_mlx import registry

    monkeypatch.setenv("REDRAFTER_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tiny_model_dir)
    (tiny_model_dir / "sub").mkdir()
    works = {autotrain.default_work(registry.resolve(name), name) for name in (".", str(tiny_model_dir), "../" +
                                                                                tiny_model_dir.name)}
    assert len(works) == 1
    work = works.pop()
    assert work.parent == registry.cache_dir() / "train" and work.name.endswith(tiny_model_dir.name)
    monkeypatch.chdir(tiny_model_dir / "sub")
    assert autotrain.default_work(registry.resolve(".."), "..") == work
    assert autotrain.model_label(registry.resolve(".."), "..") == str(tiny_model_dir.resolve())  # (the manifest's)
    hub = registry.ResolvedModel("org/name", tmp_path / "hub" / "snapshots" / "abc")  # (a registry name or hub id)
    assert autotrain.model_label(hub, "org/name") == "org/name" and autotrain.default_work(hub, "org/name").name == \
        "org--name"
    assert autotrain._safe("..") == autotrain._safe(".") == "model" and autotrain._safe("org/name") == "org--name"


def test_replies_that_differ_from_plain_decoding_are_said(capsys):
    """The evaluation checks that every decoding gives plain decoding's replies, and a difference (a broken
    promise: greedy output is lossless) was kept in the manifest alone."""
    same = {"tokens_per_step": 2.0, "tokens_per_second": 10.0, "speedup": 1.2, "identical_to_ar": True}
    results = {"ar": dict(same, tokens_per_step=1.0), "auto (new)": same, "fixed 4x5 (new)": same}
    manifest = {"evaluation": {"results": results}, "installed": "/m/drafter", "model": "m", "kept_at": "/w/train/best"}
    autotrain.report(manifest)
    assert "warning" not in capsys.readouterr().out
    results["auto (new)"] = dict(same, identical_to_ar=False)
    autotrain.report(manifest)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ("warning: auto (new) gave replies that differ from plain decoding on the held-out prompts, which "
                      "greedy decoding must never do: please report it"), out


@pytest.mark.skipif(sys.platform == "win32", reason="advisory locks (fcntl)")
def test_a_second_run_in_the_same_folder_is_refused_while_the_first_works(tiny_model_dir, tmp_path, capsys):
    """Two runs at once in one work folder (the same model from two terminals) wrote their replies over each
    other's (shards numbered from the count at each one's start) and their steps into the same checkpoint."""
    work = tmp_path / "work"
    work.mkdir()
    with autotrain.one_run_in(work, "busy"):  # the first run, still working
        assert autotrain.main(["--model", str(tiny_model_dir), "--work", str(work)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert err[-1] == (f"redrafter-train: error: another redrafter-train is working in {work}: let it finish (or "
                           "stop it: the work is kept), or give this run another --work"), err
        assert sorted(p.name for p in work.iterdir()) == []  # nothing of the first run's touched
    with autotrain.one_run_in(work, "busy"):  # once it has ended, the folder is free
        pass
    # distill and train hold their --out the same way
    from redrafter_mlx import distill as distill_module
    from redrafter_mlx import train as train_module

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in ("a", "b", "c")))
    with autotrain.one_run_in(work, "busy"):
        assert distill_module.main(["--model", str(tiny_model_dir), "--data", str(prompts), "--out", str(work),
                                    "--max-tokens", "4"]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"python -m redrafter_mlx.distill: error: another distill is writing into {work}: let it finish (or stop "
            "it: its replies are kept), or give another --out")
        assert sorted(p.name for p in work.iterdir()) == []
    assert distill_module.main(["--model", str(tiny_model_dir), "--data", str(prompts), "--out", str(work),
                                "--max-tokens", "4"]) == 0
    with autotrain.one_run_in(work, "busy"):
        assert train_module.main(["--model", str(tiny_model_dir), "--data", str(work), "--out", str(tmp_path / "t"),
                                  "--steps", "1", "--batch", "8"]) == 0  # (another folder: not held)
        assert train_module.main(["--model", str(tiny_model_dir), "--data", str(work), "--out", str(work),
                                  "--steps", "1", "--batch", "8"]) == 2
        assert capsys.readouterr().err.splitlines()[-1] == (
            f"python -m redrafter_mlx.train: error: another training run is working in {work}: let it finish (or stop "
            "it: its checkpoint is kept), or give another --out")
        assert not (work / "checkpoint").exists()


def _installed_manifest(command="redrafter-train --model M"):
    """What `run` hands `install` (readme() reads these)."""
    return {"model": "M", "budget": "tiny", "command": command, "machine": "cpu", "finished": "now",
            "data": {"prompts": "p", "replies": 1, "tokens": 1}, "training": {"steps": 1, "depth": 4, "draft_vocab": 8},
            "held_out": None, "seconds": {"train": 1.0},
            "evaluation": {"prompts": 1, "max_tokens": 8, "results": {}}}


def test_an_installed_drafter_is_named_by_the_converted_model_s_manifest(tiny_model_dir, tiny_kit, tmp_path, capsys):
    """redrafter-train put its drafter into MODEL/drafter and left MODEL/manifest.json (the converter's) naming the
    drafter converted with the model, hashes and all (the converter updates it when it converts a drafter there).
    The entry now names the drafter installed, in the same moment; a manifest the converter did not write is left
    alone."""
    from convert.cli import main as convert_main
    from redrafter_mlx.drafter import new_drafter, save_drafter
    from redrafter_mlx.registry import sha256_of

    args = tiny_kit.model(seed=0).args
    old, new = tmp_path / "old", tmp_path / "work" / "train" / "best"
    save_drafter(new_drafter(args, lm_head="shared", seed=1), old)
    trained = new_drafter(args, lm_head="shared", seed=2)
    trained.set_dtype(mx.float16)  # (as redrafter-train saves it)
    save_drafter(trained, new)
    model = tmp_path / "model"
    assert convert_main(["--model", str(tiny_model_dir), "--drafter", str(old), "--out", str(model), "--quiet"]) == 0
    before = json.loads((model / "manifest.json").read_text())
    assert before["drafter"]["source"] == str(old)

    autotrain.install(new, model / "drafter", _installed_manifest())
    after = json.loads((model / "manifest.json").read_text())
    entry = after["drafter"]
    assert entry["source"] == str(new) and entry["command"] == "redrafter-train --model M"
    assert entry["sha256"]["model.safetensors"] == sha256_of(model / "drafter" / "model.safetensors")
    assert entry["config"] == json.loads((model / "drafter" / "config.json").read_text())
    # every field the converter's entry has (its dtype was missing)
    assert before["drafter"]["dtype"] == "float32" and entry["dtype"] == "float16"
    assert set(before["drafter"]) <= set(entry), set(before["drafter"]) - set(entry)
    assert {k: v for k, v in after.items() if k != "drafter"} == {k: v for k, v in before.items() if k != "drafter"}
    assert capsys.readouterr().err == ""
    assert load(str(model)).drafter_path == model / "drafter"
    # a model folder the converter did not write: its manifest.json is not ours to change
    (model / "manifest.json").write_text('{"tool": "something else", "drafter": null}')
    autotrain.install(old, model / "drafter", _installed_manifest())
    assert (model / "manifest.json").read_text() == '{"tool": "something else", "drafter": null}'


def test_a_replaced_drafter_is_kept_beside_it_and_never_loaded(tiny_kit, tmp_path, monkeypatch):
    """`--force`, or a new drafter that drafts more, deleted the drafter in place for good. It is moved to
    `<home>.previous` (here beside a GGUF file: NAME.drafter.previous), replacing an older one there; load() does
    not take it for the model's drafter, and a swap that fails leaves both where they were."""
    import filecmp
    import os

    from redrafter_mlx import registry
    from redrafter_mlx.drafter import new_drafter, save_drafter

    gguf = tiny_kit.write_gguf(tmp_path / "m.gguf", tiny_kit.model(seed=0))
    home = registry.resolve(str(gguf)).drafter_home
    assert home == tmp_path / "m.drafter"
    sources = []
    for seed in (1, 2, 3):
        sources.append(tmp_path / f"trained-{seed}")
        save_drafter(new_drafter(tiny_kit.model(seed=0).args, lm_head="shared", seed=seed), sources[-1])

    def holds(folder, source):
        return filecmp.cmp(folder / "model.safetensors", source / "model.safetensors", shallow=False)

    assert autotrain.install(sources[0], home, _installed_manifest()) is None  # nothing was there
    assert autotrain.install(sources[1], home, _installed_manifest()) == tmp_path / "m.drafter.previous"
    assert holds(home, sources[1]) and holds(tmp_path / "m.drafter.previous", sources[0])
    assert autotrain.install(sources[2], home, _installed_manifest()) == tmp_path / "m.drafter.previous"
    assert holds(home, sources[2]) and holds(tmp_path / "m.drafter.previous", sources[1])  # the older one replaced
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".m", "m."))) == [
        "m.drafter", "m.drafter.previous", "m.gguf"]  # nothing hidden left beside them
    assert load(str(gguf)).drafter_path == home
    rename = os.rename

    def failing_into_place(a, b):  # the new drafter's rename (putting the old one back goes on)
        if Path(b) == home and Path(a).name.startswith(".m.drafter.new-"):
            raise OSError(28, "No space left on device")
        return rename(a, b)

    with monkeypatch.context() as m:
        m.setattr(os, "rename", failing_into_place)
        with pytest.raises(OSError):
            autotrain.install(sources[0], home, _installed_manifest())
    assert holds(home, sources[2]) and holds(tmp_path / "m.drafter.previous", sources[1])
    import shutil

    shutil.rmtree(home)
    assert load(str(gguf)).drafter is None  # the backup is not the model's drafter


def test_ctrl_c_as_a_drafter_is_installed_still_names_it_in_the_model_manifest(tiny_model_dir, tiny_kit, tmp_path,
                                                                                 monkeypatch, ctrl_c_raises):
    """Ctrl-C is held while the drafter is renamed into MODEL/drafter: the manifest is updated in the same moment,
    and the interruption comes after both."""
    from helpers import ctrl_c_as_renamed_to

    from convert.cli import main as convert_main
    from redrafter_mlx.drafter import new_drafter, save_drafter

    new = tmp_path / "best"
    save_drafter(new_drafter(tiny_kit.model(seed=0).args, lm_head="shared", seed=2), new)
    model = tmp_path / "model"
    assert convert_main(["--model", str(tiny_model_dir), "--out", str(model), "--quiet"]) == 0
    ctrl_c_as_renamed_to(monkeypatch, model / "drafter")
    with pytest.raises(KeyboardInterrupt):
        autotrain.install(new, model / "drafter", _installed_manifest())
    assert (model / "drafter" / "model.safetensors").is_file()
    assert json.loads((model / "manifest.json").read_text())["drafter"]["source"] == str(new)


def test_prompt_files_from_a_pipe_are_read(tiny_model_dir, tmp_path, capsys):
    """A prompt file given by process substitution (`--prompts <(head -4 p.jsonl)`: /dev/fd/63, a pipe, not a
    regular file) was "no prompt file at /dev/fd/63" in distill --data and redrafter-train's --prompts and
    --eval-prompts. It is read like a file (once: a pipe cannot be read again)."""
    from helpers import piped

    from redrafter_mlx import distill as distill_module

    rows = "".join(json.dumps({"prompt": f"say {w}"}) + "\n" for w in ("a", "b"))
    with piped(rows) as path:
        assert distill_module.main(["--model", str(tiny_model_dir), "--data", str(path), "--out",
                                    str(tmp_path / "d"), "--max-tokens", "2"]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == f"answered 2 prompts into {tmp_path / 'd'}"
    with piped(rows) as path:  # read: two prompts are too few to write new tasks from (before any model loads)
        assert autotrain.main(["--model", str(tiny_model_dir), "--prompts", str(path)]) == 2
    assert "error: 2 prompts to write new tasks from: give at least 3" in capsys.readouterr().err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(rows)
    with piped(rows) as path:
        assert autotrain.main(["--model", str(tiny_model_dir), "--prompts", str(prompts), "--eval-prompts",
                               str(path)]) == 2
    assert f"error: every evaluation prompt in {path} is a training prompt too" in capsys.readouterr().err
    with piped("") as path:
        assert autotrain.main(["--model", str(tiny_model_dir), "--prompts", str(path)]) == 2
    assert f"error: {path} holds no prompts" in capsys.readouterr().err
    assert autotrain.main(["--model", str(tiny_model_dir), "--prompts", str(tmp_path)]) == 2  # (was "no prompt file")
    assert capsys.readouterr().err == f"redrafter-train: error: prompt file {tmp_path} is a folder: give a JSONL file\n"


def test_a_damaged_work_state_begins_its_figures_again(tmp_path):
    """WORK/state.json (the stage times and figures of a run) that is not a JSON object with its times stopped every
    later run with a traceback from inside json; its figures are begun again."""
    for text in ("garbage", "[]", '{"seconds": 5}'):
        (tmp_path / "state.json").write_text(text)
        log = autotrain.Log(tmp_path)
        assert log.state == {"seconds": {}}
        log.stage(1, "self-instruct", "tasks")
        log.done(replies=3)
        assert json.loads((tmp_path / "state.json").read_text())["replies"] == 3
    (tmp_path / "state.json").write_text('{"seconds": {"distill": 2.0}, "replies": 4}')
    assert autotrain.Log(tmp_path).state == {"seconds": {"distill": 2.0}, "replies": 4}


def test_a_drafter_in_place_that_does_not_load_is_not_said_replaced_when_it_stays(tiny_model_dir, tmp_path,
                                                                                  tiny_budget, monkeypatch, capsys):
    """A drafter in place that does not load was said "so it is replaced" before the evaluation; a new drafter none
    of whose drafts were accepted was then not installed, and the damaged one stayed."""
    real = autotrain.measure

    def useless(*a, **kw):
        results = real(*a, **kw)
        results["fixed 4x5 (new)"]["tokens_per_step"] = 1.0
        return results

    monkeypatch.setattr(autotrain, "measure", useless)
    (tiny_model_dir / "drafter").mkdir()
    (tiny_model_dir / "drafter" / "config.json").write_text('{"x": 1}')
    work, argv = tiny_run(tiny_model_dir, tmp_path)
    autotrain.main(argv)
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1].startswith("not installed: none of the new drafter's drafts were accepted")
    assert (tiny_model_dir / "drafter" / "config.json").read_text() == '{"x": 1}'  # the damaged one stays
    said = [line for line in captured.err.splitlines() if "does not load" in line]
    assert len(said) == 1 and "is replaced" not in said[0] and "not compared" in said[0], said


def test_the_manifest_times_the_evaluation_it_reports(tiny_model_dir, tmp_path, tiny_budget, capsys):
    """Every run evaluates again, and its time was added to the earlier runs' evaluations: a run again with --force
    (every stage done) recorded the sum of both as the time the evaluation took, in manifest.json and README.md."""
    work, argv = tiny_run(tiny_model_dir, tmp_path)
    assert autotrain.main(argv) == 0
    state = json.loads((work / "state.json").read_text())
    state["seconds"]["evaluate"] = 6000.0  # an earlier evaluation of 100 minutes
    (work / "state.json").write_text(json.dumps(state))
    assert autotrain.main(argv + ["--force"]) == 0
    manifest = json.loads((tiny_model_dir / "drafter" / "manifest.json").read_text())
    assert manifest["seconds"]["evaluate"] < 600, manifest["seconds"]
    assert "evaluate 100." not in (tiny_model_dir / "drafter" / "README.md").read_text()


def test_a_stage_stopped_by_ctrl_c_keeps_the_time_it_ran(tiny_model_dir, tmp_path, tiny_budget, drafting_drafter,
                                                          monkeypatch, capsys):
    """A stage's time was recorded only when it finished: the minutes a distillation ran before Ctrl-C were missing
    from the time the installed drafter's manifest says it took, the resumed run's alone counted."""
    import time

    work, argv = tiny_run(tiny_model_dir, tmp_path)
    real = distill.write_shard

    def slow_then_stopped(*a, **kw):
        time.sleep(1.5)  # a first batch of replies that took a while
        real(*a, **kw)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(distill, "write_shard", slow_then_stopped)
        assert autotrain.main(argv) == 130
    assert json.loads((work / "state.json").read_text())["seconds"]["distill"] >= 1.5
    assert autotrain.main(argv) == 0
    assert json.loads((tiny_model_dir / "drafter" / "manifest.json").read_text())["seconds"]["distill"] >= 1.5


def test_an_error_in_the_evaluation_closes_its_bar_first(monkeypatch, capsys):
    """An error while evaluating (a prompt decoding refuses, a full disk) left the bar open: the command's error was
    said on the bar's line, and the bar drawn again after it (distill and train close theirs)."""
    import importlib
    from types import SimpleNamespace

    from redrafter_mlx.errors import RedrafterError
    from redrafter_mlx.stats import RunStats

    calls = []

    def generate(loaded, prompt, mode, max_tokens, progress=None, **kw):
        calls.append(1)
        if len(calls) == 3:  # the warm-up, the first reply, then an error
            raise RedrafterError("refused")
        return SimpleNamespace(stats=RunStats(step_tokens=4, steps=4, decode_seconds=1.0), tokens=[1, 2, 3, 4])

    monkeypatch.setattr(importlib.import_module("redrafter_mlx.generate"), "generate", generate)
    try:
        autotrain.measure(SimpleNamespace(drafter=None), {"new": ("path", object())}, ["a", "b"], 8)
    except RedrafterError:  # what is on stderr when the command says its error (the bar still held)
        err = capsys.readouterr().err
    else:
        pytest.fail("no error")
    assert err.endswith("\n") and "1/6" in err.rstrip("\n").rsplit("\r", 1)[-1], repr(err)


def test_the_work_option_names_the_settings_that_start_it_afresh(capsys, monkeypatch):
    """--work's help said "other settings" start the folder afresh, deleting the earlier run's work: which ones was
    left to guess (--batch-size, --eval-prompts and --force resume it; --budget and --weight-format do not)."""
    monkeypatch.setenv("COLUMNS", "1000")  # (argparse wraps at hyphens: "--eval-" / "prompts")
    with pytest.raises(SystemExit):
        autotrain.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    said = help_text[help_text.index("--work DIR folder"):]
    assert "another model, --budget or --weight-format starts it afresh" in said
    assert "another --batch-size, --eval-prompts or --force resumes it" in said
