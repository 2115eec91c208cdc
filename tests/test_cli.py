"""The command lines' shared pieces (redrafter_mlx/cli.py): options checked while parsing, and one
line on stderr, never a traceback, for what a user can fix."""

import argparse
import errno
import json
import os
import sys

from pathlib import Path

import pytest

from redrafter_mlx import bench, cli, errors
from redrafter_mlx.errors import CorruptModelError


def parse(kind, text):
    p = argparse.ArgumentParser(prog="t")
    p.add_argument("--x", type=kind)
    return p.parse_args(["--x", text]).x


def test_typed_options(capsys):
    assert parse(cli.positive, "3") == 3 and parse(cli.non_negative, "0") == 0
    assert parse(cli.seed, str(2**64 - 1)) == 2**64 - 1
    assert parse(cli.temperature, "0.7") == 0.7 and parse(cli.probability, "1") == 1.0
    for kind, text, said in ((cli.positive, "0", "must be at least 1, not 0"),
                             (cli.positive, "x", "expected an integer, not 'x'"),
                             # --help says 2**64 - 1; the error wrote it out, 18446744073709551615
                             (cli.seed, str(2**64), f"must be from 0 to 2**64 - 1, not {2**64}"),
                             (cli.seed, "-1", "must be from 0 to 2**64 - 1, not -1"),
                             (cli.temperature, "-1", "must be >= 0"),
                             (cli.temperature, "inf", "expected a finite number"),
                             (cli.probability, "0", "must be in (0, 1]")):
        with pytest.raises(SystemExit):
            parse(kind, text)
        assert f"argument --x: {said}" in capsys.readouterr().err



@pytest.mark.skipif(not hasattr(sys, "set_int_max_str_digits"), reason="Python's int digit limit (3.11 and later)")
def test_integers_past_pythons_digit_limit_are_echoed_short(capsys):
    """An integer of more than 4300 digits (what int() reads) was "expected an integer, not '111...'", every
    digit echoed and said to be no integer. It is said as errors.compact writes a huge int, as out of range
    where it is, and leading zeros (which the limit counts) are read past."""
    from redrafter_mlx.errors import compact

    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(4300)
    try:
        past = "expected an integer of at most 4300 digits, not"
        for kind, text, said in ((cli.positive, "1" * 4301, f"{past} 1.11e+4300"),
                                 (cli.non_negative, f" +{'9' * 5000} ", f"{past} 1e+5000"),
                                 (cli.positive, "-" + "1" * 4301, "must be at least 1, not -1.11e+4300"),
                                 (cli.seed, "1_" + "2" * 4400, "must be from 0 to 2**64 - 1, not 1.22e+4400"),
                                 (cli.temperature, "1" * 400, "expected a finite number, not 1.11e+399")):
            with pytest.raises(SystemExit):
                parse(kind, text)
            err = capsys.readouterr().err
            assert f"argument --x: {said}\n" in err and len(err) < 200, err[:300]
        assert parse(cli.non_negative, "0" * 5000 + "7") == 7
        assert parse(cli.positive, "0" * 1000 + "1" * 4000) == int("1" * 4000)
        sys.set_int_max_str_digits(0)
        for n in (10**5000, -(4 * 10**4400 - 4), 123456789 * 10**4400, 99999 * 10**4300, 10**25, -(2**64)):
            assert errors.compact_digits(n < 0, str(abs(n))) == compact(n), n
    finally:
        sys.set_int_max_str_digits(limit)


def test_long_text_that_is_no_number_is_echoed_short(capsys):
    """Option text that is no number was echoed whole: "--max-tokens" given 5000 x's made a 5000-character message."""
    for kind, text in ((cli.positive, "x" * 5000), (cli.temperature, "warm" * 1000)):
        with pytest.raises(SystemExit):
            parse(kind, text)
        err = capsys.readouterr().err
        assert f"{text[:30]!r}... ({len(text)} characters)" in err and len(err) < 200, err[:300]
    with pytest.raises(SystemExit):  # short text is echoed whole, as before
        parse(cli.positive, "x" * 60)
    assert repr("x" * 60) in capsys.readouterr().err


def test_writable_file(tmp_path, capsys):
    assert parse(cli.writable_file, str(tmp_path / "r.json")) == tmp_path / "r.json"
    # /proc: os.access passed it for root, and the run was lost at its first write
    proc = [(Path("/proc/r.json"), "folder /proc cannot be written")] if Path("/proc/self").is_dir() else []  # Linux
    for path, said in ((tmp_path / "missing" / "r.json", "does not exist"), (tmp_path, "is a folder"), *proc):
        with pytest.raises(SystemExit):
            parse(cli.writable_file, str(path))
        assert said in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # the probe is gone
    # a link is written through (its target replaced, the link kept): the target's folder is the one checked
    (tmp_path / "r.json").symlink_to(tmp_path / "missing" / "r.json")
    with pytest.raises(SystemExit):
        parse(cli.writable_file, str(tmp_path / "r.json"))
    assert f"folder {tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    # a file where the folder should be: it was said as "folder F does not exist", though F exists
    (tmp_path / "r.json").unlink()
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit):
        parse(cli.writable_file, str(tmp_path / "f" / "r.json"))
    assert f"{tmp_path / 'f'} is a file, not a folder" in capsys.readouterr().err


def test_run_ends_user_and_os_errors_with_one_line(capsys):
    def fails(e):
        def body():
            raise e
        return body

    assert cli.run("tool", lambda: None) == 0 and cli.run("tool", lambda: 3) == 3
    assert cli.run("tool", fails(CorruptModelError("x.gguf is truncated"))) == 2
    assert capsys.readouterr().err == "tool: error: x.gguf is truncated\n"
    assert cli.run("tool", fails(FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/no/such"))) == 1
    assert capsys.readouterr().err == "tool: error: No such file or directory: /no/such\n"
    assert cli.run("tool", fails(KeyboardInterrupt())) == 130
    assert "cancelled" in capsys.readouterr().err
    assert cli.run("tool", fails(KeyboardInterrupt("cancelled; resume with X"))) == 130  # where it stopped
    assert capsys.readouterr().err == "\ntool: cancelled; resume with X\n"
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        cli.run("tool", fails(ZeroDivisionError()))
    # MLX's writes fail with a RuntimeError: a full disk is one line too, and other RuntimeErrors stay bugs
    assert cli.run("tool", fails(RuntimeError("[write] Unable to write 1441433 bytes to file."))) == 1
    assert capsys.readouterr().err == ("tool: error: Unable to write 1441433 bytes to file: is the disk full, or "
                                       "the folder not writable?\n")
    with pytest.raises(RuntimeError):
        cli.run("tool", fails(RuntimeError("[matmul] shapes do not match")))
    # a command that keeps its work says how to go on after an OS error or a failed write (redrafter-train)
    assert cli.run("tool", fails(FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/no/such")),
                   resume="run it again") == 1
    assert capsys.readouterr().err == "tool: error: No such file or directory: /no/such; run it again\n"
    assert cli.run("tool", fails(RuntimeError("[write] Unable to write 1 bytes to file.")), resume="run it again") == 1
    assert capsys.readouterr().err.endswith("the folder not writable? (then run it again)\n")
    assert cli.run("tool", fails(CorruptModelError("x.gguf is truncated")), resume="run it again") == 2
    assert capsys.readouterr().err == "tool: error: x.gguf is truncated\n"  # a user error: fixed, not resumed


def test_a_closed_pipe_ends_quietly():
    """`python -m redrafter_mlx ... | head -c 1`: the reader left; no traceback, nothing more written."""
    import subprocess
    import sys

    code = ("import sys; from redrafter_mlx import cli\n"
            "def body():\n    for _ in range(2000): print('x' * 1000)\n"
            "sys.exit(cli.run('tool', body))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(1) == b"x"
    proc.stdout.close()  # the reader goes away mid-reply
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_help_does_not_import_mlx_lm():
    """`import redrafter_mlx` and every command line's `--help` answer without importing mlx-lm
    (and through it transformers, torch where installed: 3-4 s on a 2-core CPU before the help
    showed); `load` is imported on first use and is the loader's own."""
    import subprocess
    import sys

    code = ("import importlib, sys\n"
            "import redrafter_mlx\n"
            "assert 'mlx_lm' not in sys.modules, 'import redrafter_mlx imported mlx_lm'\n"
            "for name in ('redrafter_mlx.__main__', 'redrafter_mlx.bench', 'redrafter_mlx.train', "
            "'redrafter_mlx.distill', 'redrafter_mlx.autotrain', 'convert.cli'):\n"
            "    try:\n"
            "        importlib.import_module(name).main(['--help'])\n"
            "    except SystemExit as e:\n"
            "        assert e.code == 0, (name, e.code)\n"
            "    assert 'mlx_lm' not in sys.modules and 'transformers' not in sys.modules, name\n"
            "from redrafter_mlx import loader\n"
            "assert redrafter_mlx.load is loader.load and redrafter_mlx.LoadedModel is loader.LoadedModel\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.endswith("ok\n"), out.stderr[-2000:]


def test_the_library_does_not_import_the_command_lines_module():
    """generate.py (the API) and graph.py took GSD's k check (graph_k_error, MAX_GRAPH_K) from this module,
    and tuning.py its MAX_DRAFT_TOKENS: `import redrafter_mlx` loaded the command lines' layer. The check is
    graph.py's now (cli keeps the names); the library loads without cli."""
    import subprocess

    code = ("import sys\n"
            "import redrafter_mlx, redrafter_mlx.generate, redrafter_mlx.graph, redrafter_mlx.tuning, "
            "redrafter_mlx.loader\n"
            "assert 'redrafter_mlx.cli' not in sys.modules, 'the library imported redrafter_mlx.cli'\n"
            "from redrafter_mlx import cli, graph\n"
            "assert cli.graph_k_error is graph.graph_k_error and cli.MAX_GRAPH_K == graph.MAX_GRAPH_K\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.endswith("ok\n"), out.stderr[-2000:]


def test_bench_refuses_bad_options_before_loading(tmp_path, capsys, monkeypatch):
    from redrafter_mlx import loader

    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded a model for a bad option"))
    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"turns": ["hi"]}\n')
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    for argv, said in ((["--limit", "0"], "argument --limit: must be at least 1"),
                       (["--temperature", "-1"], "argument --temperature: must be >= 0"),
                       (["--beam-width", "0"], "argument --beam-width: must be at least 1"),
                       (["--json", str(tmp_path / "nowhere" / "r.json")], "argument --json: folder"),
                       (["--plot", str(tmp_path)], "argument --plot:"),
                       (["--modes", "redrafter", "--tree", "16,5000"], "--tree 5000: drafts are limited to 1024"),
                       (["--drafter", "d", "--no-drafter"], "--drafter PATH and --no-drafter"),
                       (["--grid"], "--grid runs fixed drafting shapes"),
                       (["--modes", "ar,auto", "--lookup", "8"], "has no redrafter column ('auto' is adaptive): add"),
                       (["--no-drafter", "--modes", "auto", "--lookup", "8"], "drop them (without the drafter"),
                       (["--beam-width", "2"], "--modes ar has no redrafter column"),
                       (["--grid", "--modes", "redrafter", "--widths", "1,300", "--lengths", "4,5"],
                        "beams of 300 x 5 tokens draft 1200"),
                       (["--top-p", "0.9"], "--top-p applies to sampling, and --temperature 0 decodes greedily"),
                       (["--seed", "3"], "--seed applies to sampling"),
                       (["--tune", "--temperature", "0.7"], "--tune measures greedy decoding"),
                       # the drafter was dropped, saying nothing (load() now refuses a drafter with use_drafter=False)
                       (["--drafter", str(drafter)], "--modes ar decodes plainly and drafts nothing"),
                       (["--drafter", str(drafter), "--modes", "ar,mlx-lm"], "drop --drafter, or add auto")):
        with pytest.raises(SystemExit):
            bench.main(["--prompts", str(prompts), *argv])
        assert said in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert bench.main(["--prompts", str(empty)]) == 2
    assert "holds no questions" in capsys.readouterr().err
    assert bench.main(["--prompts", str(tmp_path)]) == 2
    assert "is a folder: give a JSONL file" in capsys.readouterr().err  # it said "not found"


def test_bench_plot_without_matplotlib_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    """--plot without matplotlib (an install without the [bench] extra) ran the whole benchmark, a grid for
    an hour, and failed at its end: it is refused while parsing now."""
    import sys

    from redrafter_mlx import loader

    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded a model for a plot it cannot draw"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"turns": ["hi"]}\n')
    with pytest.raises(SystemExit):
        bench.main(["--prompts", str(prompts), "--modes", "ar,redrafter", "--grid", "--plot", str(tmp_path / "g.png")])
    assert "--plot needs matplotlib: pip install 'redrafter-mlx[bench]'" in capsys.readouterr().err


def test_main_cli_refuses_drafts_too_big_and_contradictions_before_loading(capsys, monkeypatch):
    """They were refused after the model had loaded (seconds here, minutes for a large model)."""
    from redrafter_mlx import __main__ as main_cli
    from redrafter_mlx import loader

    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded a model for a bad option"))
    for argv, said in ((["--beam-width", "100000", "--beam-length", "10"], "beams of 100000 x 10 tokens draft 900000"),
                       (["--tree", "5000"], "--tree 5000: drafts are limited to 1024 tokens a step"),
                       (["--lookup", "2000"], "--lookup 2000"),
                       (["--graph", "1025"], "--graph 1025: GSD's k-gram length is at most 1024 ("),
                       (["--drafter", "d", "--no-drafter"], "--drafter PATH and --no-drafter"),
                       (["--no-context-graph"], "--no-context-graph applies to graph drafting"),
                       (["--drafter", "no-such-folder"], "--drafter no-such-folder: no drafter there"),
                       (["--top-p", "0.9", "--seed", "1"], "--top-p and --seed apply to sampling, and --temperature 0 "
                                                            "decodes greedily: add --temperature T above 0, or drop them"),
                       (["--temperature", "0", "--seed", "0"], "--seed applies to sampling"),
                       # options nothing would use ran, ignored, saying nothing (the bench refused them)
                       (["--mode", "ar", "--beam-width", "4", "--lookup", "8"],
                        "--mode ar decodes plainly and drafts nothing: drop --beam-width, --lookup"),
                       (["--mode", "ar", "--graph", "1"], "drop --graph"),
                       # (redrafter-bench refused --no-drafter with --modes ar already)
                       (["--mode", "ar", "--no-drafter"], "--mode ar decodes plainly and drafts nothing: drop "
                                                          "--no-drafter, or use --mode auto"),
                       (["--mode", "redrafter", "--no-drafter"], "--mode redrafter needs the drafter: drop "
                                                                 "--no-drafter, or use --mode auto (the context "
                                                                 "alone) ("),
                       (["--no-drafter", "--tree", "8"], "--tree shapes the drafter's drafts, and --no-drafter"),
                       (["--no-drafter", "--beam-width", "4", "--graph", "0"], "--beam-width, --graph shape"),
                       (["--tree-min-prob", "0.5", "--beam-width", "2"], "--tree-min-prob is the dynamic tree's floor"),
                       (["--tree", "0", "--graph", "1"], "--graph drafts a dynamic tree"),
                       (["--mode", "redrafter", "--beam-width", "2", "--graph", "1"], "add --tree N"),
                       (["Explain", "MLX"], 'the prompt is one argument: quote it ("Explain MLX hi")'),
                       (["--bogus"], "unrecognized arguments: --bogus")):
        with pytest.raises(SystemExit):
            main_cli.main([*argv, "hi"])
        assert said in capsys.readouterr().err
    with pytest.raises(SystemExit):  # bytes that are not UTF-8 (surrogate escapes) were refused after loading
        main_cli.main(["\udcff\udcfe"])
    assert "the prompt is not UTF-8 text (at character 0)" in capsys.readouterr().err
    from redrafter_mlx.cli import unused_drafting_error

    # what is used passes: the copy alone without the drafter, a tree's floor, a graph on a tree, adaptive graphs
    for args in (("auto", True, None, None, None, 8, None, None, None), ("auto", False, None, 4, 5, None, 16, 0.2, 1),
                 ("redrafter", False, None, None, None, None, None, None, 0), ("ar", False, None, *[None] * 6)):
        assert unused_drafting_error(*args) is None, args


def test_main_cli_refuses_a_prompt_over_the_context_before_calibrating(tiny_kit, tmp_path, capsys, monkeypatch):
    """`python -m redrafter_mlx` with a prompt longer than the context ends on one line before the
    adaptive controller's first calibration (seconds on a model never run here), and a first
    adaptive call's calibration lines still reach stderr (stream's `progress`)."""
    import importlib

    from redrafter_mlx.__main__ import main

    gen = importlib.import_module("redrafter_mlx.generate")
    path = tiny_kit.write_folder(tmp_path / "short", tiny_kit.model(seed=0, max_position_embeddings=16))
    monkeypatch.setattr(gen, "controller", lambda *a, **k: pytest.fail("calibrated before checking the context"))
    assert main(["--model", str(path), "--max-tokens", "4", "a prompt that runs well past sixteen tokens"]) == 2
    err = capsys.readouterr().err
    assert "error: the prompt has" in err and "context of 16" in err and "Traceback" not in err

    real = importlib.import_module("redrafter_mlx.control").controller

    def calibrating(loaded, use_drafter=True, progress=None, sampled=False):
        progress("measuring this machine")
        return real(loaded, use_drafter, sampled=sampled)

    monkeypatch.setattr(gen, "controller", calibrating)
    assert main(["--model", str(tiny_kit.write_folder(tmp_path / "long", tiny_kit.model(seed=0))),
                 "--max-tokens", "4", "hi"]) == 0
    assert "[measuring this machine]" in capsys.readouterr().err


def test_main_cli_drops_a_byte_order_mark_from_standard_input(tiny_kit, tmp_path, capsys, monkeypatch):
    """`python -m redrafter_mlx - < prompt.txt` with a file that starts with a byte-order mark (Notepad's UTF-8)
    gave the model the mark as text, and a reply to another prompt; files the tools read drop it."""
    import io

    from redrafter_mlx import load
    from redrafter_mlx.__main__ import main

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))
    tok = load(str(path), use_drafter=False).tokenizer
    assert len(tok.prompt_ids("\ufeffhello")) != len(tok.prompt_ids("hello"))  # (the mark is tokens of its own)
    monkeypatch.setattr("sys.stdin", io.StringIO("\ufeffhello"))
    assert main(["--model", str(path), "--mode", "ar", "--max-tokens", "2", "-"]) == 0
    assert f"({len(tok.prompt_ids('hello'))} tokens)" in capsys.readouterr().err


def test_main_cli_cancelled_while_it_waits_for_the_prompt_on_standard_input(capsys, monkeypatch):
    """Ctrl-C while `python -m redrafter_mlx -` waited for the prompt (typed at the terminal, or a pipe not
    written yet) printed a traceback: it ends as a cancel anywhere else does, with one line and status 130."""
    from redrafter_mlx.__main__ import main

    class Waiting:
        def read(self):
            raise KeyboardInterrupt

    monkeypatch.setattr("sys.stdin", Waiting())
    assert main(["--mode", "ar", "-"]) == 130
    assert capsys.readouterr().err == "\npython -m redrafter_mlx: cancelled\n"


def test_main_cli_stopped_by_ctrl_c_while_decoding_prints_the_stats_line(tiny_kit, tmp_path, capsys, monkeypatch):
    """Ctrl-C while `python -m redrafter_mlx` decoded printed the reply so far and "cancelled", but no stats line
    (tokens, rates, prefill): the figures of the part it had given were lost. The line comes as at a normal end,
    "stop: cancelled" (a reply should_stop ends says so), and the status is 130 as before; Ctrl-C while the
    prompt is read (no reply yet) ends as before."""
    from redrafter_mlx.__main__ import main

    gen = sys.modules["redrafter_mlx.generate"]
    path = str(tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0)))
    real = gen.stream

    def ctrl_c_after(n):
        def stream(*a, **kw):
            events = real(*a, **kw)
            for _ in range(n):
                yield next(events)
            events.close()  # (as Ctrl-C inside the next step leaves it: rolled back)
            raise KeyboardInterrupt
        return stream

    argv = ["--model", path, "--mode", "ar", "--max-tokens", "20", "hi"]
    assert main(argv) == 0
    whole = capsys.readouterr()
    assert whole.err.count("\n[ar: ") == 1 and "stop: cancelled" not in whole.err
    monkeypatch.setattr(gen, "stream", ctrl_c_after(3))
    assert main(argv) == 130
    out = capsys.readouterr()
    assert 0 < len(out.out.rstrip("\n")) < len(whole.out.rstrip("\n")) and whole.out.startswith(out.out.rstrip("\n"))
    last = out.err.rstrip("\n").split("\n")[-1]
    assert last.startswith("[ar: 3 tokens, ") and "tok/s" in last and last.endswith("stop: cancelled]"), out.err
    monkeypatch.setattr(gen, "stream", ctrl_c_after(0))  # before the first token
    assert main(argv) == 130
    out = capsys.readouterr()
    assert out.out == "" and out.err.endswith("python -m redrafter_mlx: cancelled\n") and "stop:" not in out.err


def test_main_cli_labels_an_adaptive_redrafter_run_as_such(tiny_kit, tmp_path, capsys):
    """`--mode redrafter` with no drafting option runs the adaptive controller: its stats line said
    `[auto: ...`, the mode the user did not ask for."""
    from redrafter_mlx.__main__ import main
    from redrafter_mlx.drafter import new_drafter, save_drafter

    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "m", model)
    save_drafter(new_drafter(model.args, lm_head="shared", seed=1), path / "drafter")
    assert main(["--model", str(path), "--mode", "redrafter", "--max-tokens", "4", "hi"]) == 0
    assert "\n[redrafter, adaptive: 4 tokens" in capsys.readouterr().err
    assert main(["--model", str(path), "--mode", "redrafter", "--beam-width", "2", "--beam-length", "3", "--max-tokens", "4", "hi"]) == 0
    assert "\n[redrafter: 4 tokens" in capsys.readouterr().err
    # the prefill's token alone ran no decode step: its rates read "0.0 tok/s, 0.00 tokens/step"
    assert main(["--model", str(path), "--mode", "redrafter", "--max-tokens", "1", "hi"]) == 0
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("[redrafter, adaptive: 1 token, no decode step, prefill ") and "tok/s" not in last
    assert "verified/step" not in last and last.endswith("stop: length]")


def test_main_cli_says_a_model_has_no_chat_template(tiny_kit, tmp_path, capsys):
    """A model without a chat template continued the prompt as plain text, and the command said nothing of it (the
    chat notes it): the reply read as the model ignoring the question."""
    import json

    from redrafter_mlx.__main__ import main

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))
    assert main(["--model", str(path), "--mode", "ar", "--max-tokens", "2", "hi"]) == 0
    assert "chat template" not in capsys.readouterr().err
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    for f in path.glob("chat_template*"):
        f.unlink()
    assert main(["--model", str(path), "--mode", "ar", "--max-tokens", "2", "--system", "Be brief.", "hi"]) == 0
    assert (f"[{path} has no chat template: the prompt reaches it as plain text to continue, not as a user turn, "
            "after the --system text]") in capsys.readouterr().err


def test_main_cli_says_the_fresh_seed_of_a_sampled_reply(tiny_kit, tmp_path, capsys):
    """Sampling without --seed drew a fresh seed that nothing printed, so a reply worth keeping could not be had
    again. The stats line says it, and --seed with it gives the same reply, in another mode too."""
    from redrafter_mlx.__main__ import main

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))
    common = ["--model", str(path), "--max-tokens", "12", "--temperature", "1.5"]
    assert main([*common, "--mode", "auto", "hi"]) == 0
    said = capsys.readouterr()
    seed = said.err.splitlines()[-1].split(", seed ")[1].split(" ")[0]
    assert f"(--seed {seed} gives this reply again)]" in said.err
    assert main([*common, "--mode", "ar", "--seed", seed, "hi"]) == 0
    again = capsys.readouterr()
    # (on the stats line, which is there: with it gone, the seed's absence said nothing)
    assert again.out == said.out and again.err.splitlines()[-1].startswith("[ar: ")
    assert ", seed " not in again.err  # (given: nothing to say)
    assert main(["--model", str(path), "--max-tokens", "3", "hi"]) == 0
    greedy = capsys.readouterr().err
    assert greedy.splitlines()[-1].startswith("[") and "tok" in greedy.splitlines()[-1]
    assert ", seed " not in greedy  # greedy: no draw


def test_main_cli_says_a_floor_without_a_tree_in_its_flags_words(tiny_kit, tmp_path, capsys):
    """--tree-min-prob alone, where no tree is tuned, is refused once the model is loaded (a tuned tree
    would take it): the line said stream's "pass tree=N ... or leave tree_min_prob out", words of
    the Python API, to a command-line user."""
    from redrafter_mlx.__main__ import main
    from redrafter_mlx.drafter import new_drafter, save_drafter

    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "m", model)
    save_drafter(new_drafter(model.args, lm_head="shared", seed=1), path / "drafter")
    assert main(["--model", str(path), "--tree-min-prob", "0.5", "--max-tokens", "2", "hi"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("python -m redrafter_mlx: error: --tree-min-prob is the dynamic tree's floor")
    assert "add --tree N" in last and "tree=N" not in last
    assert main(["--model", str(path), "--tree-min-prob", "0.5", "--tree", "4", "--max-tokens", "2", "hi"]) == 0


def test_every_tool_says_a_bad_option_in_one_line(capsys):
    """argparse printed its usage block (10-20 lines) before the line that says what is wrong."""
    import importlib

    for module, prog in (("redrafter_mlx.__main__", "python -m redrafter_mlx"), ("redrafter_mlx.bench", "redrafter-bench"),
                         ("redrafter_mlx.replay", "python -m redrafter_mlx.replay"),
                         ("redrafter_mlx.autotrain", "redrafter-train"), ("redrafter_mlx.distill", "python -m redrafter_mlx.distill"),
                         ("redrafter_mlx.train", "python -m redrafter_mlx.train"), ("convert.cli", "python -m convert"),
                         ("app.__main__", "redrafter-chat")):
        with pytest.raises(SystemExit) as exit_:
            importlib.import_module(module).main(["--no-such-option"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, (module, err)
        assert err.startswith(f"{prog}: error: ") and err.rstrip().endswith(f"(options: {prog} --help)"), (module, err)


def test_replay_names_itself_as_its_help_does(tmp_path, capsys):
    """replay's errors after parsing began "replay: error:", where its option errors and --help say
    "python -m redrafter_mlx.replay", the command to type (every other tool names itself so)."""
    from redrafter_mlx import replay

    assert replay.main([str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.startswith("python -m redrafter_mlx.replay: error: results file ")


def test_replay_reads_its_results_from_a_pipe(tmp_path):
    """`replay <(cat bench.json)` gives a pipe (/dev/fd/63), not a regular file: it was "is not a file"."""
    from helpers import piped

    from redrafter_mlx import replay
    from redrafter_mlx.errors import RedrafterError

    report = {"results": [{"mode": "ar", "question_id": 1, "prompt_tokens": [1, 2], "tokens": [3]}], "settings": {}}
    with piped(json.dumps(report)) as path:
        rows, read = replay.read_results(path)
    assert [r["question_id"] for r in rows] == [1] and read["settings"] == {}
    with pytest.raises(RedrafterError, match=f"results file {tmp_path} is a folder: give a redrafter-bench --json "
                                             "file$"):
        replay.read_results(tmp_path)


def test_main_cli_refuses_drafter_options_for_a_model_without_a_drafter(tiny_kit, tmp_path, capsys):
    """--tree, --beam-width, ... on a model with no drafter decoded plainly ("[ar: ..."), the options
    dropped, saying nothing, where --no-drafter with them is refused while parsing. They are refused once
    the model is loaded (whether it has a drafter is known then); --lookup N alone drafts the copy."""
    from redrafter_mlx.__main__ import main

    path = tiny_kit.write_folder(tmp_path / "m", tiny_kit.model(seed=0))
    for given in (["--tree", "4"], ["--beam-width", "2", "--beam-length", "3"], ["--tree-min-prob", "0.5"],
                  ["--graph", "1"]):  # (--graph K: a graph of the drafter's nodes; it was ignored without one)
        assert main(["--model", str(path), *given, "--max-tokens", "2", "hi"]) == 2
        last = capsys.readouterr().err.splitlines()[-1]
        assert last.startswith(f"python -m redrafter_mlx: error: {given[0]}") and "has no drafter" in last, last
        assert f"(or train one: redrafter-train --model {path})" in last, last  # (--drafter PATH alone, it said)
    assert main(["--model", str(path), "--lookup", "2", "--max-tokens", "2", "hi"]) == 0
    err = capsys.readouterr().err
    assert "\n[redrafter: 2 tokens" in err
    # the status line said "drafter: none", and nothing of where one comes from
    assert f"; drafter: none (redrafter-train --model {path} trains one)]" in err, err
    assert main(["--model", str(path), "--mode", "ar", "--max-tokens", "2", "hi"]) == 0
    assert "; drafter: none]" in capsys.readouterr().err


def test_counts_of_train_and_distill_are_checked_as_the_other_options(capsys):
    """redrafter-train --batch-size and distill --max-prompt-tokens read "invalid int value: 'x'" and
    "--batch-size must be at least 1" (no value, no "argument"), where every other count says
    "argument --FLAG: expected an integer, not 'x'" or "must be at least 1, not 0"."""
    from redrafter_mlx import autotrain, distill

    for main, argv, said in ((autotrain.main, ["--batch-size", "x"], "argument --batch-size: expected an integer, not 'x'"),
                             (autotrain.main, ["--batch-size", "0"], "argument --batch-size: must be at least 1, not 0"),
                             (distill.main, ["--out", "o", "--data", "d", "--max-prompt-tokens", "x"],
                              "argument --max-prompt-tokens: expected an integer, not 'x'"),
                             (distill.main, ["--out", "o", "--data", "d", "--max-prompt-tokens", "0"],
                              "argument --max-prompt-tokens: must be at least 1, not 0")):
        with pytest.raises(SystemExit):
            main(argv)
        assert said in capsys.readouterr().err


def test_lookup_help_says_the_copy_grows(capsys):
    """A lookup copy taken whole doubles the next step, up to lookup.MAX_GROWTH x N (CopyLength); the
    library's and the bench's --help said "up to N tokens" (the chat's said so too, fixed before)."""
    import pytest

    from redrafter_mlx import __main__ as main_cli
    from redrafter_mlx import bench
    from redrafter_mlx.lookup import MAX_GROWTH

    for parse in (lambda: main_cli.main(["--help"]), lambda: bench.parse_args(["--help"])):
        with pytest.raises(SystemExit):
            parse()
        text = " ".join(capsys.readouterr().out.split())
        assert "doubling while copies are taken whole" in text and (f"up to {MAX_GROWTH}N" in text
                                                                     or f"up to {MAX_GROWTH}x" in text)


def test_main_cli_help_says_how_mode_redrafter_and_a_beam_length_of_1_draft(capsys):
    """--mode redrafter's help said only "needs a drafter", though it is adaptive without a drafting option and
    fixed with one; and nothing said that a beam length of 1 (given or tuned) decodes plainly in mode auto with a
    drafter, --lookup's copy left out (by design), where --mode redrafter drafts that copy alone."""
    from redrafter_mlx import __main__ as main_cli

    with pytest.raises(SystemExit):
        main_cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "redrafter = the same with the drafter required: adaptive, or the fixed drafting that drafting options " \
           "give;" in text
    assert "1 drafts no beams: mode auto with a drafter then decodes plainly, --lookup's copy left out (a tuned 1 " \
           "too: plain decoding measured fastest here), and --mode redrafter drafts the copy alone" in text
    assert "none in mode auto with a drafter and a beam length of 1: see --beam-length)" in text


def parsers(monkeypatch):
    """{prog: parser} of every command line, caught as its main() parses (nothing runs)."""
    import argparse
    import importlib

    class Caught(Exception):
        pass

    def catch(self, *args, **kwargs):
        raise Caught(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    found = {}
    for module in ("redrafter_mlx.__main__", "redrafter_mlx.bench", "redrafter_mlx.replay", "redrafter_mlx.autotrain",
                   "redrafter_mlx.distill", "redrafter_mlx.train", "app.__main__"):
        with pytest.raises(Caught) as caught:
            importlib.import_module(module).main([])
        found[caught.value.args[0].prog] = caught.value.args[0]
    return found


def test_every_tools_sampling_options_say_what_they_need_and_their_range(monkeypatch):
    """--top-p with --temperature 0 is refused by every tool, and only --seed's help said it needed --temperature
    above 0 (redrafter-bench's and python -m redrafter_mlx's --top-p did not); redrafter-bench's and distill's --seed
    gave no range. Every --top-p and --seed says both, and every option's help names its default where it has one."""
    helps = {prog: {a.option_strings[-1]: " ".join(a.help.split()) for a in p._actions if a.option_strings}
             for prog, p in parsers(monkeypatch).items()}
    assert len(helps) == 7
    for prog, options in helps.items():
        if "--top-p" in options:
            assert "with --temperature above 0" in options["--top-p"], prog
            assert "in (0, 1]" in options["--top-p"], prog  # (the chat's refused 0 and 1.5 without saying its range)
        if "--seed" in options:
            assert "0 to 2**64 - 1" in options["--seed"], prog
            assert "--temperature" in options["--seed"], prog
        if "--temperature" in options:
            assert "greedy" in options["--temperature"] and "default" in options["--temperature"], prog
    assert {prog for prog, options in helps.items() if "--top-p" in options} == {
        "python -m redrafter_mlx", "redrafter-bench", "redrafter-chat"}
    assert "(default: quick)" in helps["redrafter-train"]["--budget"]


def test_an_option_whose_help_names_n_shows_n_in_its_usage(monkeypatch):
    """Help that says "skip the first N prompts" beside a usage of `--offset OFFSET` leaves the reader to guess what
    N is (distill's --offset and --limit, train's --val-every, --draft-vocab, --save-every and --reload-every,
    redrafter-bench's --tree): the metavar is N (N[,N...] for a list)."""
    import re

    def names_n(text):  # (not another flag's "--tree N")
        return re.search(r"\bN\b", re.sub(r"-[\w-]+ N\b", "", text))

    naming = [(prog, a.option_strings[-1], a.metavar) for prog, p in parsers(monkeypatch).items() for a in p._actions
              if a.option_strings and a.help and a.nargs != 0 and names_n(a.help)]
    # (the rule finds the options it was written for: help reworded past it would leave nothing to check)
    assert {("python -m redrafter_mlx.distill", "--offset"), ("redrafter-bench", "--tree")} <= {o[:2] for o in naming}
    unnamed = [option for option in naming if "N" not in str(option[2] or "")]
    assert unnamed == []


def test_an_option_that_takes_a_list_shows_one_in_its_usage(monkeypatch):
    """redrafter-bench --tree-min-prob takes a comma-separated list of floors (one variant each), and its usage
    showed `--tree-min-prob P`, one number, beside `--tree N[,N...]`: an option whose help says it takes a
    comma-separated list shows a list in its usage (X[,X...]), or none at all (--modes, named by its own name)."""
    lists = [(prog, a.option_strings[-1], a.metavar) for prog, p in parsers(monkeypatch).items() for a in p._actions
             if a.option_strings and a.help and "comma-separated list" in " ".join(a.help.split())]
    # (the rule finds the options it was written for: help reworded past it would leave nothing to check)
    assert ("redrafter-bench", "--tree-min-prob") in {o[:2] for o in lists}
    listed = [option for option in lists if option[2] is not None and "," not in option[2]]
    assert listed == []


def test_every_option_with_a_default_names_it_in_its_help(monkeypatch):
    """python -m redrafter_mlx --mode (auto), distill's --self-instruct (0, none) and replay's --graph (none, the tree)
    gave no default, where every other option that has one names it: an option that takes a value and has a default other than None says "default"."""
    import argparse

    unnamed = [(prog, a.option_strings[-1]) for prog, p in parsers(monkeypatch).items() for a in p._actions
               if a.option_strings and a.nargs != 0 and a.default not in (None, argparse.SUPPRESS)
               and not isinstance(a, (argparse._StoreTrueAction, argparse._VersionAction, argparse._HelpAction))
               and "default" not in " ".join((a.help or "").split())]
    assert unnamed == []


def test_distills_help_opens_with_what_the_command_does(monkeypatch):
    """distill's --help opened "Distillation data for draft heads: ...", naming what it writes but neither that it
    writes it nor what for, where the other tools open with what they do ("Train a ReDrafter draft head ...")."""
    description = " ".join(parsers(monkeypatch)["python -m redrafter_mlx.distill"].description.split())
    assert description.startswith("Write distillation data for draft heads: the base model's own replies to prompts")
    assert description.endswith("for python -m redrafter_mlx.train to train on.")


def test_a_prompt_that_begins_like_an_option_is_told_to_go_after_dashes(capsys):
    """`python -m redrafter_mlx "-how do I exit vim?"` said only "argument -h/--help: ignored explicit argument
    'ow do I exit vim?'", nothing saying that a prompt beginning with '-' goes after --."""
    import shlex

    from redrafter_mlx import __main__ as main_cli

    for argv in (["-how do I exit vim?"], ["--max-tokens", "5", "-hello"]):
        with pytest.raises(SystemExit) as e:
            main_cli.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert f"a prompt that begins with '-' goes after --: python -m redrafter_mlx [OPTIONS] -- {shlex.quote(argv[-1])}" \
            in err
    with pytest.raises(SystemExit):
        main_cli.main(["--max-tokens", "0", "hi"])
    err = capsys.readouterr().err
    assert "argument --max-tokens: must be at least 1" in err
    assert "goes after --" not in err  # (no prompt that looks like an option: no hint)


def test_ctrl_c_is_said_on_a_line_of_its_own_with_no_blank_line_under_a_closed_bar(capsys, ctrl_c_raises):
    """The message after Ctrl-C began with a newline, to leave the line where the terminal echoed "^C" (or a bar
    left mid-line); under a progress bar closed on the way out (the commands close theirs however they end) it
    left a blank line. It is put only where the line was not ended since Ctrl-C."""
    import signal

    from helpers import closes_its_bar, leaves_its_bar, said_a_line_then_ctrl_c

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert cli.run("tool", closes_its_bar) == 130
    assert capsys.readouterr().err == "\rfetch 0/4\rfetch 1/4\rfetch 1/4\ntool: cancelled\n"
    assert cli.run("tool", leaves_its_bar) == 130
    assert capsys.readouterr().err == "\rfetch 1/4\ntool: cancelled\n"

    assert cli.run("tool", said_a_line_then_ctrl_c) == 130
    assert capsys.readouterr().err == "loading the model\n\ntool: cancelled\n"
    # the command's standard error and Python's own handler are back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and sys.stderr is not None
    assert type(sys.stderr).__name__ != "_LineAfterCtrlC"
