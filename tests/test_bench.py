"""redrafter-bench: the JSON schema, beam-shape grid, per-category table, plot, and --tune
storing a per-device default shape that load() / stream() then use. Tiny random models only."""

import io
import json
import os
import re
import signal

import pytest

from redrafter_mlx import bench, generate, load
from redrafter_mlx._platform import on_cpu
from redrafter_mlx.drafter import new_drafter, save_drafter
from redrafter_mlx.errors import RedrafterError
from redrafter_mlx.tree_search import DEFAULT_MIN_PROB
from redrafter_mlx.tuning import DEFAULT_LOOKUP, DEFAULT_SHAPE, DEFAULT_TREE, FILE, drafting, read_beam_shape, read_tuned

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a haiku about the sea.", "again"]},
    {"question_id": 82, "category": "math", "turns": ["What is 12 times 12?"]},
    {"question_id": 83, "category": "writing", "turns": ["Describe a cat."]},
]


@pytest.fixture
def model_dir(tiny_kit, tmp_path):
    model = tiny_kit.model(seed=0)
    path = tiny_kit.write_folder(tmp_path / "tiny", model)
    save_drafter(new_drafter(model.args, lm_head="shared", seed=1), path / "drafter")
    return path


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return f


def run(capsys, *argv):
    rc = bench.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_schema_and_lossless_summary(model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "b.json"
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 12,
                      "--modes", "ar,redrafter", "--beam-width", 2, "--beam-length", 3, "--json", out)
    assert rc == 0
    report = json.loads(out.read_text())
    assert {"model", "device", "results", "summary", "categories"} <= set(report)
    rows = report["results"]
    assert [(r["question_id"], r["mode"]) for r in rows] == [(q["question_id"], m) for q in QUESTIONS
                                                             for m in ("ar", "redrafter")]
    for r in rows:
        for key in ("category", "prompt_tokens", "tokens", "new_tokens", "steps", "seconds",
                    "tokens_per_second", "tokens_per_step"):
            assert key in r
        assert r["new_tokens"] == len(r["tokens"]) > 0
    assert all((r["beam_width"], r["beam_length"]) == (2, 3) for r in rows if r["mode"] == "redrafter")
    assert (report["settings"]["beam_width"], report["settings"]["beam_length"]) == (2, 3)  # the redrafter column's
    assert report["settings"]["widths"] is None  # (no grid ran)
    assert report["columns"] == {"ar": {"mode": "ar"}, "redrafter": {"mode": "redrafter", "beam_width": 2,
                                                                      "beam_length": 3, "lookup": DEFAULT_LOOKUP,
                                                                      "tree": 0}}
    s = report["summary"]
    assert s["ar"]["speedup"] == pytest.approx(1.0) and s["ar"]["tokens_per_step"] == pytest.approx(1.0)
    assert s["redrafter"]["identical_to_ar"] is True and 1.0 <= s["redrafter"]["tokens_per_step"] <= 3.0
    assert set(report["categories"]) == {"writing", "math"}
    assert "writing" in text and "tok/step" in text


def test_grid_runs_every_shape_and_plots(model_dir, prompts, tmp_path, capsys):
    out, png = tmp_path / "g.json", tmp_path / "g.png"
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 2, "--max-tokens", 8,
                        "--modes", "ar,redrafter", "--grid", "--widths", "1,3", "--lengths", "2,4",
                        "--json", out, "--plot", png)
    assert rc == 0
    report = json.loads(out.read_text())
    s = report["summary"]
    # the grid's shapes, not the tuned (or default) single shape it never ran
    assert (report["settings"]["widths"], report["settings"]["lengths"]) == ([1, 3], [2, 4])
    assert (report["settings"]["beam_width"], report["settings"]["beam_length"]) == (None, None)
    assert report["columns"]["redrafter@3x2"]["beam_width"] == 3
    shapes = {k: (v["beam_width"], v["beam_length"]) for k, v in s.items() if k != "ar"}
    assert shapes == {"redrafter@1x2": (1, 2), "redrafter@1x4": (1, 4), "redrafter@3x2": (3, 2), "redrafter@3x4": (3, 4)}
    assert all(v["identical_to_ar"] for k, v in s.items() if k != "ar")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "redrafter@3x4" in text


def test_lookup_values_run_side_by_side(model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "l.json"
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 2, "--max-tokens", 10,
                      "--modes", "ar,redrafter", "--beam-width", 1, "--beam-length", 2, "--lookup", "0,4", "--json", out)
    assert rc == 0
    report = json.loads(out.read_text())
    s = report["summary"]
    assert {k: v.get("lookup") for k, v in s.items() if k != "ar"} == {"redrafter+lookup0": 0, "redrafter+lookup4": 4}
    assert all(v["identical_to_ar"] for k, v in s.items() if k != "ar")
    assert all("looked_up_tokens" in r for r in report["results"] if r["mode"] == "redrafter")
    assert "redrafter+lookup4" in text
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--lookup", "-1"])


def test_the_category_table_names_each_column_whole(capsys):
    # names were cut to 22 characters: redrafter+tree0+lookup0 and redrafter+tree0+lookup4 headed two columns alike
    names = ["ar", "redrafter+tree0+lookup0", "redrafter+tree0+lookup4"]
    cats = {"summarization": {"redrafter+tree0+lookup0": {"tokens_per_step": 1.5, "speedup": 1.2},
                              "redrafter+tree0+lookup4": {"tokens_per_step": 2.25, "speedup": 1.7}}}
    bench.print_categories(cats, names)
    header, _, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["category", "redrafter+tree0+lookup0", "redrafter+tree0+lookup4"]
    assert row.split() == ["summarization", "1.50", "1.20x", "2.25", "1.70x"]
    assert header.index("lookup4") + len("lookup4") == len(row)  # the last cell under its own name


def test_questions_without_a_category_have_a_named_row(capsys):
    """Questions without a category (lines with no "category") made a category-table row with no name."""
    bench.print_categories({"": {"auto": {"tokens_per_step": 1.5, "speedup": 1.2}}}, ["ar", "auto"])
    assert capsys.readouterr().out.splitlines()[2].split() == ["(none)", "1.50", "1.20x"]
    # and the per-question table left their category blank
    row = {"question_id": 7, "category": "", "mode": "auto", "new_tokens": 9, "steps": 4, "tokens_per_step": 2.25,
           "tokens_per_second": 10.0}
    bench.print_table([row], {"auto": {"tokens_per_second": 10.0, "tokens_per_step": 2.25, "peak_memory_mb": 1.0}},
                      ["auto"])
    assert capsys.readouterr().out.splitlines()[1].split() == ["7", "(none)", "auto", "9", "4", "2.25", "10.00"]


def test_graph_variants_run_side_by_side(model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "g.json"
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 2, "--max-tokens", 12,
                      "--modes", "ar,redrafter", "--beam-width", 3, "--beam-length", 4, "--tree", 6, "--lookup", 4,
                      "--graph", "none,gsd0,1", "--json", out)
    assert rc == 0
    s = json.loads(out.read_text())["summary"]
    assert set(s) == {"ar", "redrafter+tree", "redrafter+gsd0", "redrafter+graph1"}
    assert all(v["identical_to_ar"] for k, v in s.items() if k != "ar")
    assert (s["redrafter+gsd0"]["graph"], s["redrafter+gsd0"]["context_graph"]) == (0, False)
    assert "grafted_tokens_per_step" in s["redrafter+graph1"] and "graph" not in s["redrafter+tree"]
    assert "accepted through grafts" in text
    for bad in (["--graph", "x"], ["--graph", "-1"], ["--graph", "1", "--tune"], ["--graph", "1", "--tree", "0"],
                ["--graph", "1", "--beam-width", "2"], ["--graph", "none,1", "--grid"]):
        with pytest.raises(SystemExit):  # refused while parsing: a graph needs a dynamic tree
            bench.parse_args(["--prompts", "x", "--modes", "redrafter", *bad])
    assert bench.parse_args(["--prompts", "x", "--modes", "redrafter", "--graph", "none", "--beam-width", "2"])


def test_each_adaptive_column_learns_on_its_own_controller(model_dir, prompts, tmp_path, capsys, monkeypatch):
    """One controller shared by the auto columns made a column's figures depend on what ran beside it."""
    from redrafter_mlx.control import Controller, controller

    real, seen, asked = bench.run_one, [], []
    next_step = Controller.next_step

    def recording_next_step(self, *a, **k):  # which controller decides each step
        asked.append(self)
        return next_step(self, *a, **k)

    def recording(m, prompt, mode, args, shape=None, graph=(None, True)):
        ctl = controller(m, True)  # the controller generate() uses for this call
        asked.clear()
        r = real(m, prompt, mode, args, shape, graph)
        # (not its cost model's counts, which a step moves only where timings allow: under load a 10-token reply
        # could move none, and the test failed)
        seen.append((m, mode, graph[0], ctl, bool(asked) and all(a is ctl for a in asked)))
        return r

    monkeypatch.setattr(Controller, "next_step", recording_next_step)
    monkeypatch.setattr(bench, "run_one", recording)
    out = tmp_path / "a.json"
    rc, _, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 2, "--max-tokens", 10,
                   "--modes", "ar,auto", "--graph", "none,1", "--json", out)
    assert rc == 0
    report = json.loads(out.read_text())
    assert all(v["identical_to_ar"] for k, v in report["summary"].items() if k != "ar")
    # adaptive columns draft no fixed shape: the settings showed the tuned (default) W=4 L=4 they never used
    assert all(report["settings"][key] is None for key in ("beam_width", "beam_length", "lookup", "tree",
                                                            "tree_min_prob", "widths", "lengths"))
    assert report["columns"] == {"ar": {"mode": "ar"}, "auto+tree": {"mode": "auto"},
                                 "auto+graph1": {"mode": "auto", "graph": 1, "context_graph": True}}
    auto = [(g, ctl, moved) for _, mode, g, ctl, moved in seen if mode == "auto"]
    assert len(auto) == 2 * (1 + 2)  # two columns: the warm-up and two questions each
    assert all(moved for _, _, moved in auto)  # each call decided its steps on the controller recorded for it
    tree = {id(ctl) for g, ctl, _ in auto if g is None}
    graph = {id(ctl) for g, ctl, _ in auto if g == 1}
    assert len(tree) == len(graph) == 1 and tree != graph  # one per column, kept across its questions
    ctl_tree, ctl_graph = (next(ctl for g, ctl, _ in auto if g == k) for k in (None, 1))
    assert ctl_tree.costs is not ctl_graph.costs
    assert controller(seen[0][0], True) not in (ctl_tree, ctl_graph)  # the model's own controller is back


def test_a_failed_warm_up_gives_the_model_its_own_controllers_back(model_dir, prompts, capsys, monkeypatch):
    """The warm-up swapped in a column's controllers outside the try that restores the model's own."""
    seen = []

    def failing(m, prompt, mode, args, shape=None, graph=(None, True)):
        seen.append((m, m.controllers))
        raise RuntimeError("warm-up failed")

    monkeypatch.setattr(bench, "run_one", failing)
    with pytest.raises(RuntimeError, match="warm-up failed"):
        run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--modes", "auto")
    (m, during), = seen
    assert m.controllers is not during  # the column's own, swapped in for the call, is not left behind


def test_bench_options_refused_before_loading_and_a_run_without_ar(model_dir, prompts, capsys):
    """--plot draws fixed shapes: without them it failed after the whole run; --modes ar,ar ran ar
    twice; without ar the speedup read 0.00x."""
    for bad in (["--modes", "ar,auto"], ["--modes", "ar,redrafter"], ["--modes", "ar", "--grid"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--plot", "p.png", *bad])
    assert "--plot draws fixed drafting shapes" in capsys.readouterr().err
    assert bench.parse_args(["--prompts", "x", "--modes", "ar,auto,ar"]).modes == ["ar", "auto"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--modes", "ar", "--graph", "1"])
    assert "--graph applies to" in capsys.readouterr().err
    assert len(bench.read_prompts(prompts, turns=2)) >= 1
    assert capsys.readouterr().err.startswith("redrafter-bench: note: 2 of 3 questions have fewer than 2 turns")
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4,
                      "--modes", "auto")
    assert rc == 0 and "speedup      -" in text and "0.00x" not in text


def test_the_header_says_when_auto_runs_without_a_drafter(tiny_kit, prompts, tmp_path, capsys):
    """A model with no drafter: auto drafts from the context alone, and the run's first line said "drafter None;
    ... adaptive drafting", as if with one."""
    bare = tiny_kit.write_folder(tmp_path / "bare", tiny_kit.model(seed=0))
    rc, _, err = run(capsys, "--model", bare, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--modes", "ar,auto")
    assert rc == 0
    header = next(line for line in err.splitlines() if line.startswith("model "))
    assert "drafter none found;" in header and header.endswith("adaptive drafting without the drafter"), header
    rc, _, err = run(capsys, "--model", bare, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--modes", "ar")
    assert rc == 0 and "drafter none (not needed);" in err and "None" not in err


def test_redrafter_mode_needs_the_drafter_as_in_the_api(model_dir, prompts, capsys):
    """`--modes redrafter --no-drafter` ran the adaptive controller from the context alone, and so
    did --modes redrafter for a model without a drafter, where generate(mode="redrafter") and
    python -m redrafter_mlx --mode redrafter refuse both: now refused too (auto is the way)."""
    import shutil

    for extra in ([], ["--tree", "4"], ["--modes", "ar,auto,redrafter"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--modes", "redrafter", "--no-drafter", *extra])
        assert "--modes redrafter needs the drafter" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--tune", "--no-drafter"])
    assert "--tune measures drafting shapes, which need the drafter" in capsys.readouterr().err
    assert bench.parse_args(["--prompts", "x", "--modes", "ar,auto", "--no-drafter"]).no_drafter
    shutil.rmtree(model_dir / "drafter")
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4,
                     "--modes", "ar,redrafter")
    assert rc == 2 and "--modes redrafter needs a drafter and none was found" in err and "--modes auto" in err
    assert f"(or train one: redrafter-train --model {model_dir})" in err  # (--drafter PATH alone, it said)
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4,
                      "--modes", "ar,auto")
    assert rc == 0 and "auto" in text


def test_a_bench_report_given_as_the_prompts_is_named_so(tmp_path):
    """A --json report given as --prompts was "one JSON object over several lines, not JSONL" with a jq
    command that made it one line, which then "has neither 'turns' nor 'prompt'"."""
    report = {"model": "m", "settings": {"prompts": "/data/q.jsonl", "max_tokens": 8}, "results": [], "summary": {}}
    said = "is a redrafter-bench --json report, not a prompt file: give a JSONL file of questions, such as the one " \
           "its run read, /data/q.jsonl"
    for name, text in (("b.json", json.dumps(report, indent=1)), ("b.jsonl", json.dumps(report) + "\n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(RedrafterError, match=said):
            bench.read_prompts(tmp_path / name)
    # a JSONL file of questions, and one JSON object that is not a report, as before
    (tmp_path / "q.jsonl").write_text(json.dumps({"turns": ["hi"], "results": []}) + "\n")
    assert [q["prompt"] for q in bench.read_prompts(tmp_path / "q.jsonl")] == ["hi"]
    (tmp_path / "one.json").write_text(json.dumps({"turns": ["hi"]}, indent=1))
    with pytest.raises(RedrafterError, match="one JSON object over several lines"):
        bench.read_prompts(tmp_path / "one.json")


def test_prompt_files_that_would_have_failed_after_the_run(tmp_path):
    """Two questions with one id read as not identical to ar (results are matched by question); a
    category that is not a string failed in the tables after the whole run; a byte-order mark."""
    from redrafter_mlx.errors import RedrafterError

    path = tmp_path / "q.jsonl"
    for lines, said in (([{"question_id": 7, "turns": ["a"]}, {"question_id": 7, "turns": ["b"]}], "as line 1 does"),
                        ([{"turns": ["a"]}, {"question_id": 1, "turns": ["b"]}], "takes its line number"),
                        ([{"category": None, "turns": ["a"]}], "'category' must be a string, not null$"),
                        ([{"category": ["x"], "turns": ["a"]}], "'category' must be a string, not \\[\"x\"\\]$"),
                        ([{"question_id": [1], "turns": ["a"]}], "'question_id' must be"),
                        ([{"question_id": True, "turns": ["a"]}], "'question_id' must be .*, not true$"),
                        ([{"question_id": 1.5, "turns": ["a"]}], "must be a whole number or a string, not 1.5$"),
                        ([{"question": "a"}],  # (it said "it has none")
                         "not a Spec-Bench line with 'turns' .*: it has neither \\(its keys: question\\)$"),
                        ([["a"]], "a line is a JSON object, not a list$"),  # "list indices must be integers or ..."
                        ([None], "a line is a JSON object, not null$"),  # (Python's words: "not a NoneType")
                        ([5], "a line is a JSON object, not a number$"),
                        ([{"turns": {"a": 1}}], "'turns' must be a list of non-empty questions, not an object$"),
                        ([{"turns": "a"}], "'turns' must be a list of non-empty questions, not a string$"),
                        ([{"turns": ["\u200b"]}], "'turns' must be a list of non-empty questions$"),
                        # it stopped the run when the turn came up (a second turn: after that question's first)
                        ([{"turns": ["a", "b \ud800"]}],
                         "q.jsonl:1 .*turn 2 is not valid text: surrogates not allowed")):
        path.write_text("\n".join(json.dumps(x) for x in lines))
        with pytest.raises(RedrafterError, match=said):
            bench.read_prompts(path, turns=2)
    # one JSON document over several lines was "q.jsonl:1 is not a Spec-Bench line ...: Expecting value: line 1
    # column 2", as if damaged
    row = {"question_id": 1, "turns": ["a"]}
    for document, said in (([row], r"one JSON array, not JSONL .*`jq -c '\.\[\]' "),
                           (row, r"one JSON object over several lines, not JSONL .*`jq -c \. ")):
        path.write_text(json.dumps(document, indent=2))
        with pytest.raises(RedrafterError, match=f"prompt file {path} is {said}"):
            bench.read_prompts(path)
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"question_id": 3, "turns": ["hi"]}).encode())
    assert bench.read_prompts(path)[0]["question_id"] == 3
    path.write_bytes('{"turns": ["hi"]}\n'.encode("utf-16"))  # it said "'utf-8' codec can't decode byte 0xff ..."
    with pytest.raises(RedrafterError, match="^prompt file .*q.jsonl is not UTF-8 text: it is UTF-16 "
                                             "text: save it as UTF-8$"):
        bench.read_prompts(path)
    path.write_bytes(b'{"turns": ["caf\xe9"]}\n')
    with pytest.raises(RedrafterError, match="is not UTF-8 text: byte 15 is 0xe9: save it as UTF-8$"):
        bench.read_prompts(path)


def test_the_shipped_prompts_are_held_out_from_every_shipped_training_set():
    """Half of the bench's default prompts were self-instruct seed tasks, which the shipped drafter's
    distillation had answered (it answered all 175): the default figure was flattered on that half. None
    may be a shipped training prompt, nor (where the project's data lies beside the clone) a seed task or
    an Alpaca instruction the shipped drafter was distilled on."""
    from redrafter_mlx.autotrain import TRAIN_PROMPTS

    shipped = [q["prompt"] for q in bench.read_prompts(bench.SHIPPED_PROMPTS)]
    training = {json.loads(line)["prompt"] for line in TRAIN_PROMPTS.read_text().splitlines() if line.strip()}
    assert len(shipped) == 16 and not set(shipped) & training
    data = bench.SHIPPED_PROMPTS.parents[2].parent / "shared" / "data"
    if not data.is_dir():
        pytest.skip(f"{data} is not beside this clone")
    seen = [json.loads(line) for name in ("seed_tasks.jsonl", "alpaca_1000.jsonl")
            for line in (data / name).read_text().splitlines() if line.strip()]
    texts = [row["instruction"] for row in seen]
    assert not [p for p in shipped if any(t.strip() and t.strip() in p for t in texts)]


def test_the_shipped_prompts_are_the_default_and_one_turn_lines_read(tmp_path):
    """--prompts was required and only Spec-Bench lines ("turns") were read, so a fresh install had nothing
    the bench would take (MT-Bench is not shipped; the package's own prompts are {"prompt": ...} lines)."""
    args = bench.parse_args(["--max-tokens", "4"])
    assert args.prompts == bench.SHIPPED_PROMPTS
    shipped = bench.read_prompts(args.prompts, turns=2)
    assert len(shipped) == 16 and all(q["turns"] == [q["prompt"]] and q["category"] for q in shipped)
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "category": "chat", "source": "x"}) + "\n"
                    + json.dumps({"prompt": "two", "source": "gsm8k"}))
    assert [(q["question_id"], q["category"], q["turns"]) for q in bench.read_prompts(path)] == \
        [(1, "chat", ["hi"]), (2, "gsm8k", ["two"])]


def test_replay_of_ar_results_matches_real_decoding(model_dir, prompts, tmp_path, capsys, monkeypatch):
    from redrafter_mlx import replay

    out = tmp_path / "r.json"
    rc, _, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 16, "--modes", "ar,redrafter",
                   "--beam-width", 2, "--beam-length", 3, "--lookup", 4, "--tree", "0,3", "--json", out)
    assert rc == 0
    summary = json.loads(out.read_text())["summary"]
    assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3,1x2", "--lookup", "4",
                        "--tree", "0,3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for tree in (0, 3):  # columns: shape, tree, lookup, graph, tokens/step
        row = next(line.split() for line in lines if line.startswith("2x3") and line.split()[1] == str(tree))
        assert row[3] == "tree"
        assert float(row[4]) == pytest.approx(summary[f"redrafter+tree{tree}"]["tokens_per_step"], abs=1e-3)
        assert summary[f"redrafter+tree{tree}"]["tree"] == tree
    assert any(line.startswith("1x2") for line in lines) and any("writing" in line for line in lines)
    assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3", "--lookup", "4", "--tree", "3",
                        "--graph", "none,0,gsd0"]) == 0
    graphs = [line.split()[3] for line in capsys.readouterr().out.splitlines() if line.split()[:2] == ["2x3", "3"]]
    assert graphs == ["tree", "graph0", "gsd0"]
    assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3", "--lookup", "4", "--tree", "3",
                        "--context-ceiling", "0,8"]) == 0
    rows = {line.split()[3]: float(line.split()[4]) for line in capsys.readouterr().out.splitlines()
            if line.split()[:2] == ["2x3", "3"]}
    assert set(rows) == {"tree", "tree+ceil8"} and rows["tree+ceil8"] >= rows["tree"]
    with pytest.raises(SystemExit):  # the ceiling bounds fixed drafting
        replay.main([str(out), "--auto", "mkl", "--context-ceiling", "8"])
    with pytest.raises(SystemExit):  # a graph is drafted as a tree
        replay.main([str(out), "--tree", "0", "--graph", "1"])
    with pytest.raises(SystemExit):
        replay.main([str(out), "--tree", "3", "--graph", "one"])
    assert replay.main([str(tmp_path / "none.json")]) == 2
    assert "not found" in capsys.readouterr().err
    for bad in (["--shapes", "4by3"], ["--tree-min-prob", "2"], ["--tree-min-prob", "nan"], ["--limit", "0"],
                ["--limit", "-1"]):
        with pytest.raises(SystemExit):  # refused while parsing, before the model loads
            replay.main([str(out), *bad])
    capsys.readouterr()
    # drafts no decoding would run (--shapes 99999x99999 ran on) and options that were ignored, saying nothing
    for bad, said in ((["--shapes", "99999x99999"], "beams of 99999 x 99999 tokens draft"),
                      (["--shapes", "2x3", "--lookup", "100000"], "--lookup 100000: drafts are limited to 1024"),
                      (["--shapes", "2x3", "--tree", "5000"], "--tree 5000: drafts are limited"),
                      (["--auto", ","], "--auto takes one or more profiles"),
                      (["--auto", "mkl,m1"], "unknown cost profile 'm1' for --auto: pick cached or one of mkl"),
                      (["--auto", "mkl", "--lookup", "8", "--tree", "16"], "--lookup, --tree shape fixed drafting"),
                      (["--ceiling-every"], "--ceiling-every applies to --context-ceiling"),
                      (["--no-context-graph"], "--no-context-graph applies to graph drafting"),
                      (["--tree-min-prob", "0.1"], "--tree-min-prob is a dynamic tree's floor"),
                      (["--no-lookup-growth"], "--no-lookup-growth keeps fixed drafting's copy at --lookup N tokens: "
                                               "add --lookup N"),
                      (["--lookup", "0", "--no-lookup-growth"], "add --lookup N (N > 0)"),
                      (["--auto", "mkl", "--no-lookup-growth"], "--auto replays the controller, which sizes its own")):
        with pytest.raises(SystemExit):
            replay.main([str(out), *bad])
        assert said in capsys.readouterr().err
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe")
    (tmp_path / "rows.json").write_text('{"results": [{"mode": "ar", "question_id": 1}]}')
    (tmp_path / "ids.json").write_text('{"results": [{"mode": "ar", "prompt_tokens": [1], "tokens": ["a"]}]}')
    (tmp_path / "settings.json").write_text('{"settings": [], "results": []}')
    (tmp_path / "empty.json").write_text('{"results": [{"mode": "ar", "prompt_tokens": [], "tokens": []}]}')
    (tmp_path / "list.json").write_text('[1, 2]')  # it said "AttributeError: 'list' object has no attribute 'get'"
    (tmp_path / "other.json").write_text('{"questions": []}')  # and "KeyError: 'results'"
    assert replay.main([str(tmp_path / "binary.json")]) == 2  # (files.not_utf8 says what it is, in one line)
    err = capsys.readouterr().err
    assert "binary.json is not UTF-8 text" in err and err.count("\n") == 1, err
    for name, said in (("rows.json", "has no 'prompt_tokens' list"),
                       ("list.json", "it holds no 'results' list"), ("other.json", "it holds no 'results' list"),
                       ("ids.json", "'tokens' that are not token ids"), ("settings.json", "settings are not an object"),
                       ("empty.json", "has no 'prompt_tokens' list, or an empty one")):
        assert replay.main([str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert "is not a redrafter-bench --json file" in err and said in err and err.count("\n") == 1, err
    # another model's run: ids past this model's vocabulary crashed the process inside MLX
    report = json.loads(out.read_text())
    next(r for r in report["results"] if r["mode"] == "ar")["tokens"][0] = 100_000_000
    (tmp_path / "other.json").write_text(json.dumps(report))
    assert replay.main([str(tmp_path / "other.json"), "--model", str(model_dir), "--shapes", "2x3"]) == 2
    assert "token ids past" in capsys.readouterr().err
    # ... and said alone: notes came first that it was decoded by another model, and to pass its drafter
    (tmp_path / "other.json").write_text(json.dumps({**report, "model": "another-model",
                                                     "drafter": str(tmp_path / "another-model" / "drafter")}))
    assert replay.main([str(tmp_path / "other.json"), "--model", str(model_dir), "--shapes", "2x3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{replay.PROG}: error: ") and "token ids past" in err and err.count("\n") == 1, err
    # a file that names no model loaded the default one; one naming another model was replayed saying nothing
    report = json.loads(out.read_text())
    named = report.pop("model")
    (tmp_path / "nomodel.json").write_text(json.dumps(report))
    assert replay.main([str(tmp_path / "nomodel.json"), "--shapes", "2x3"]) == 2
    assert "names no model: pass --model" in capsys.readouterr().err
    (tmp_path / "renamed.json").write_text(json.dumps({**report, "model": named + "-other"}))
    assert replay.main([str(tmp_path / "renamed.json"), "--model", str(model_dir), "--shapes", "2x3", "--limit", "1"]) == 0
    assert f"was decoded by {named}-other, and {named} replays it" in capsys.readouterr().err
    # the outputs' weight format is the one replayed (a --weight-format stored run: its 4-bit weights)
    from redrafter_mlx import loader

    formats, real_load = [], loader.load

    def load_stub(*a, **k):
        formats.append(k.get("weight_format"))
        raise RedrafterError("stopped after the load's arguments")

    monkeypatch.setattr(loader, "load", load_stub)
    report = json.loads(out.read_text())
    assert report["settings"]["weight_format"] == bench.format_of(report["weight_format"]) != "auto"  # as loaded
    stored = tmp_path / "stored.json"
    # the format the outputs ran in, not the settings' "auto", which resolves per machine (a GPU's stored
    # weights were replayed in float32 on a CPU)
    for described, settings, loads in (("4-bit (group 32)", {"weight_format": "auto"}, "stored"),
                                       # (float16 on a CPU: software float16 is ~25x slower there)
                                       ("float16", {"weight_format": "auto"}, "float32" if on_cpu() else "float16"),
                                       (None, {"weight_format": "stored"}, "stored")):  # (a report without it)
        stored.write_text(json.dumps({**report, "weight_format": described, "settings": settings}))
        formats.clear()
        assert replay.main([str(stored), "--model", str(model_dir)]) == 2 and formats == [loads]
    monkeypatch.setattr(loader, "load", real_load)
    capsys.readouterr()
    # Ctrl-C during the second question: the first one's figures are printed, status 130
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    real = replay.replay
    monkeypatch.setattr(replay, "replay", interrupted)
    assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3"]) == 130
    captured = capsys.readouterr()
    assert "python -m redrafter_mlx.replay: cancelled; the figures below cover the first 1 of" in captured.err
    assert any(line.startswith("2x3") for line in captured.out.splitlines())


def test_replay_runs_a_config_given_twice_once(model_dir, prompts, tmp_path, capsys):
    """--shapes 2x3,2x3 (or --graph 1,gsd1 --no-context-graph, two names of gsd1) replayed the config twice
    and printed it twice; --auto mkl,mkl replayed both on one controller, which learned from each question
    twice, so its figures differed from --auto mkl's."""
    from redrafter_mlx import replay

    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 16, "--json", out)[0] == 0

    def table(*argv):
        assert replay.main([str(out), *argv]) == 0
        return [line.split() for line in capsys.readouterr().out.splitlines()  # the main table's rows
                if line.split()[:1] in (["2x3"], ["mkl"]) and len(line.split()) >= 10]

    assert len(table("--shapes", "2x3,2x3", "--tree", "3", "--graph", "1,gsd1", "--no-context-graph")) == 1
    assert table("--auto", "mkl,mkl") == table("--auto", "mkl")


def test_replay_auto_counts_the_replies_slower_than_plain_decoding(model_dir, prompts, tmp_path, capsys):
    """The controller is meant never to be slower than plain decoding, and --auto printed only totals, which
    hide a reply it made slower: it now says how many, and the slowest, per profile (epyc: a plain step
    cheaper than verifying one token, as measured)."""
    from redrafter_mlx import replay

    assert replay.slower_replies([("q1", 10, 1.0), ("q2", 10, 0.25), ("q3", 0, 0.0), ("q4", 4, 0.25)], 0.05) == \
        "2 of 3 replies slower than plain decoding (slowest: q1 0.50x, q4 0.80x)"
    assert replay.slower_replies([("q2", 10, 0.25)], 0.05) == "0 of 1 replies slower than plain decoding"
    costs = replay.profile_costs("epyc")
    assert costs.plain == pytest.approx(0.050) and costs.verify(1) == pytest.approx(0.059)
    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 16, "--json", out)[0] == 0
    questions = len(json.loads(out.read_text())["results"])
    assert replay.main([str(out), "--auto", "mkl,epyc"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "replies slower than plain decoding" in line]
    assert [line.split(":")[0] for line in said] == ["mkl tree", "epyc tree"]
    assert all(f" of {questions} replies" in line for line in said)


def test_replay_without_the_drafter_loads_none(model_dir, prompts, tmp_path, capsys):
    """replay --auto P --no-drafter loaded the drafter anyway: one beside the model that failed to load stopped
    it with "use_drafter=False, --no-drafter on the command line, loads the model without it", which it had
    been given; --drafter D with --no-drafter replayed without D, saying nothing, and a --drafter folder that is
    not there was said after the model had loaded."""
    from redrafter_mlx import replay

    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--json", out)[0] == 0
    for argv, said in ((["--auto", "mkl", "--no-drafter", "--drafter", str(model_dir / "drafter")],
                        "--drafter PATH and --no-drafter ask for opposite things"),
                       (["--drafter", str(tmp_path / "none")], "no drafter there")):
        with pytest.raises(SystemExit):
            replay.main([str(out), *argv])
        assert said in capsys.readouterr().err
    (model_dir / "drafter" / "model.safetensors").unlink()
    assert replay.main([str(out), "--auto", "mkl", "--no-drafter"]) == 0
    assert "mkl" in capsys.readouterr().out


def test_replay_says_when_the_bench_drafted_without_the_drafter(model_dir, prompts, tmp_path, capsys):
    """A report of redrafter-bench --no-drafter (auto drafting from the context alone) was replayed by --auto with
    the drafter found beside the model, saying nothing: another configuration than the bench's."""
    from redrafter_mlx import replay

    out = tmp_path / "b.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--json", out)[0] == 0
    report = json.loads(out.read_text())
    said = f"note: {out} is of a redrafter-bench run with --no-drafter, and the controller is replayed with {model_dir}'s " \
           "drafter: add --no-drafter to replay the bench's"
    assert replay.main([str(out), "--auto", "mkl"]) == 0 and said not in capsys.readouterr().err
    out.write_text(json.dumps({**report, "settings": {**report["settings"], "no_drafter": True}}))
    assert replay.main([str(out), "--auto", "mkl"]) == 0 and said in capsys.readouterr().err
    assert replay.main([str(out), "--auto", "mkl", "--no-drafter"]) == 0 and said not in capsys.readouterr().err


def test_replay_of_a_model_without_a_drafter_says_what_to_pass(tiny_kit, prompts, tmp_path, capsys):
    """It said "or --auto --no-drafter", which --auto refuses without a profile, to an --auto run too."""
    from redrafter_mlx import replay

    bare, out = tiny_kit.write_folder(tmp_path / "bare", tiny_kit.model(seed=0)), tmp_path / "b.json"
    assert run(capsys, "--model", bare, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--json", out)[0] == 0
    assert replay.main([str(out)]) == 2
    assert capsys.readouterr().err.rstrip().endswith("pass --drafter PATH (or --auto PROFILE --no-drafter to replay "
                                                     "the adaptive controller on the context copy alone)")
    assert replay.main([str(out), "--auto", "mkl"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("pass --drafter PATH, or --no-drafter to replay the controller "
                                                     "on the context copy alone")
    assert replay.main([str(out), "--auto", "mkl", "--no-drafter"]) == 0
    # a bench run with --drafter DIR names it in its report: "pass --drafter PATH" said nothing of it
    drafter = tmp_path / "my drafter"
    save_drafter(new_drafter(load(str(bare), use_drafter=False).args, lm_head="shared", seed=1), drafter)
    assert run(capsys, "--model", bare, "--drafter", drafter, "--prompts", prompts, "--limit", 1, "--max-tokens", 4,
               "--modes", "ar,auto", "--json", out)[0] == 0
    assert replay.main([str(out)]) == 2
    assert f"no drafter found for {bare}: pass --drafter '{drafter}' (the bench's) (or --auto PROFILE" in \
        capsys.readouterr().err
    assert replay.main([str(out), "--drafter", str(drafter), "--shapes", "2x3"]) == 0
    import shutil

    shutil.rmtree(drafter)  # (gone since: not offered)
    assert replay.main([str(out)]) == 2
    assert "pass --drafter PATH (or" in capsys.readouterr().err


def test_replay_finds_a_model_the_bench_named_by_a_relative_path(model_dir, prompts, tmp_path, capsys, monkeypatch):
    """The report named a local model and drafter as given (--model tiny), so replay from another folder said
    "unknown model 'tiny'" (or replayed another model of that name there, saying nothing)."""
    from redrafter_mlx import replay

    out = tmp_path / "r.json"
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "--model", "tiny", "--drafter", "tiny/drafter", "--prompts", prompts, "--limit", 1,
               "--max-tokens", 8, "--modes", "ar,auto", "--json", out)[0] == 0
    report = json.loads(out.read_text())
    assert (report["model"], report["drafter"]) == (str(model_dir.resolve()), str((model_dir / "drafter").resolve()))
    monkeypatch.chdir(tmp_path.parent)
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    assert "note" not in capsys.readouterr().err
    # the same model by a relative path: it said the report "was decoded by /.../tiny, and <name> replays it"
    assert replay.main([str(out), "--shapes", "2x3", "--model", os.path.join(tmp_path.name, "tiny")]) == 0
    assert "note" not in capsys.readouterr().err
    assert json.loads(out.read_text())["settings"]["model"] == "tiny"  # (the settings stay as given)
    # a model moved since: it said "unknown model ...", of a name the user never typed
    model_dir.rename(tmp_path / "moved")
    assert replay.main([str(out), "--shapes", "2x3"]) == 2
    assert f"{out} names the model {str(model_dir.resolve())!r}, which cannot be loaded here" in capsys.readouterr().err
    assert replay.main([str(out), "--shapes", "2x3", "--model", str(tmp_path / "moved")]) == 0
    capsys.readouterr()
    # a hub id not cached here, with no network: it said "could not reach the Hugging Face hub", not a word of --model
    from redrafter_mlx import loader
    from redrafter_mlx.errors import NetworkError

    def offline(*a, **k):
        raise NetworkError("could not reach the Hugging Face hub for 'org/name'")

    monkeypatch.setattr(loader, "load", offline)
    (tmp_path / "hub.json").write_text(json.dumps({**report, "model": "org/name"}))
    assert replay.main([str(tmp_path / "hub.json"), "--shapes", "2x3"]) == 2
    err = capsys.readouterr().err
    assert "hub.json names the model 'org/name', which cannot be loaded here (could not reach the Hugging Face" in err
    assert err.rstrip().endswith("pass --model, the model its outputs came from")


def test_replay_limit_counts_questions_of_a_turns_report(model_dir, prompts, tmp_path, capsys, monkeypatch):
    """replay --limit N took the first N rows, and a --turns report has a row per turn: --limit 1 replayed
    the first question's first turn alone."""
    from redrafter_mlx import replay

    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--turns", 2,
               "--json", out)[0] == 0
    assert replay.main([str(out), "--shapes", "2x3", "--limit", "1"]) == 0
    header, row = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("config")
                   or line.startswith("2x3 t0")]
    assert header == ["config", QUESTIONS[0]["category"], "turn", "1", "turn", "2"] and len(row) == 7
    # a --limit past the questions held ran them all, saying nothing (in the bench too)
    assert replay.main([str(out), "--shapes", "2x3", "--limit", "9"]) == 0
    assert f"note: --limit 9, and {out} holds {len(QUESTIONS)} questions: all of them are replayed" in \
        capsys.readouterr().err
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 2, "--modes", "ar",
                     "--limit", 9)
    assert rc == 0 and f"note: --limit 9, and {prompts} holds {len(QUESTIONS)} questions: all of them run" in err
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 2, "--modes", "ar",
                     "--limit", 1)
    assert rc == 0 and "note: --limit" not in err and " 1 prompt, modes ar" in err  # (it said "1 prompts")
    real, calls = replay.replay, []

    def stopping(*a, **kw):  # Ctrl-C in the third row: the second question's only turn
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(replay, "replay", stopping)
    assert replay.main([str(out), "--shapes", "2x3"]) == 130
    assert "cover the first 2 of 4 replies" in capsys.readouterr().err  # it said "questions" of the rows


def test_replay_stopped_by_sigterm_prints_what_it_replayed(model_dir, prompts, tmp_path, capsys):
    """`kill` (SIGTERM) ended a replay where it stood, saying nothing and printing none of the figures of the
    questions it had replayed (Ctrl-C printed them, status 130). It stops as Ctrl-C does, with status 143, in a
    child process with SIGTERM at its default, as a shell or a job's time limit starts it."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--json", out)[0] == 0
    code = """import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_DFL)
from redrafter_mlx import loader, replay
real, calls = {stub}, []
def terminated(*a, **kw):
    calls.append(1)
    if len(calls) == {at}:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(*a, **kw)
{stub} = terminated
sys.exit(replay.main(sys.argv[1:]))
"""
    for stub, at in (("replay.replay", 2), ("loader.load", 1)):  # in the second question, and as the model loads
        proc = subprocess.run([sys.executable, "-c", code.format(stub=stub, at=at), str(out), "--shapes", "2x3"],
                              capture_output=True, text=True, cwd=Path(__file__).parent.parent, timeout=300)
        assert proc.returncode == 143, (proc.returncode, proc.stderr)
        if stub == "replay.replay":
            assert ("python -m redrafter_mlx.replay: terminated (SIGTERM); the figures below cover the first 1 of "
                    f"{len(QUESTIONS)} questions") in proc.stderr
            assert any(line.startswith("2x3") for line in proc.stdout.splitlines())  # the table of what it replayed
        else:
            assert proc.stderr.strip().splitlines()[-1] == "python -m redrafter_mlx.replay: terminated (SIGTERM)"
            assert proc.stdout == ""


def test_replay_says_what_a_file_that_is_not_json_is(tmp_path):
    """A results file that is not one JSON document was "JSONDecodeError: Extra data: line 2 column 1 (char 95)"
    for the prompt file given in place of the report, and "Expecting value: line 1 column 1 (char 0)" for an
    empty one."""
    from redrafter_mlx import replay

    f = tmp_path / "x.json"
    cases = (("".join(json.dumps(q) + "\n" for q in QUESTIONS), "it is a JSONL prompt file (what redrafter-bench "
              "--prompts reads): give the report its --json writes"),
             (json.dumps({"prompt": "Hi"}) + "\n", "it is a JSONL prompt file"),  # one question: one JSON object
             ("", "it is empty"), ("\n \n", "it is empty"),
             ('{"results": [', "it is not JSON (Expecting value: line 1, column 14), cut short or damaged"),
             ('{"results": []}\n{"results": []}\n', "it is not JSON (Extra data: line 2, column 1)"))
    for text, said in cases:
        f.write_text(text)
        with pytest.raises(RedrafterError, match=re.escape(f"{f} is not a redrafter-bench --json file: {said}")) as e:
            replay.read_results(f)
        assert "JSONDecodeError" not in str(e.value) and "char " not in str(e.value)


def test_replay_of_a_run_without_ar_says_to_add_it(tmp_path):
    """A report without ar results said "run redrafter-bench with --modes ar", as if ar alone were needed."""
    from redrafter_mlx import replay

    f = tmp_path / "auto.json"
    f.write_text(json.dumps({"model": "m", "settings": {"temperature": 0.0}, "complete": True, "results": [
        {"mode": "auto", "question_id": 1, "prompt_tokens": [1, 2], "tokens": [3]}]}))
    with pytest.raises(RedrafterError) as e:
        replay.read_results(f)
    assert str(e.value) == f"{f} has no ar results: run redrafter-bench with ar among its --modes (e.g. --modes " \
                           "ar,auto)"


def test_replay_of_a_sampled_run_says_which_run_to_replay(tmp_path):
    """A sampled run's report was refused as "holds sampled outputs; replay needs greedy ones", which said
    nothing of the run that gives greedy ones."""
    from redrafter_mlx import replay

    f = tmp_path / "s.json"
    report = {"model": "m", "settings": {"temperature": 0.7, "seed": 3},
              "results": [{"mode": "ar", "question_id": 1, "prompt_tokens": [1, 2], "tokens": [3], "seed": 3}]}
    f.write_text(json.dumps(report))
    with pytest.raises(RedrafterError) as e:
        replay.read_results(f)
    assert str(e.value) == f"{f} holds sampled outputs (--temperature 0.7), and replay needs greedy ones: run " \
                           "redrafter-bench without --temperature (0, greedy, is the default) and replay its report"
    f.write_text(json.dumps({**report, "settings": {"temperature": 0.0, "seed": None}}))
    assert [r["tokens"] for r in replay.read_results(f)[0]] == [[3]]


def test_replay_category_columns_fit_long_names(capsys):
    """replay's per-category table cut nothing but made every column 18 wide: a longer category name pushed
    its cells and the next columns out from under their names."""
    from redrafter_mlx import replay

    cats = ["summarization_of_long_documents", "qa"]
    groups = [("category", cat) for cat in cats]
    replay.print_categories(["c"], {("c", g): {} for g in groups}, groups, "x", lambda config: config,
                            lambda config, tot: "1.00/2.0/3.0", 10)
    header, row = capsys.readouterr().out.splitlines()[2:4]
    for cat in cats:  # each cell ends where its name does
        end = header.index(cat) + len(cat)
        assert row[end - len("1.00/2.0/3.0"):end] == "1.00/2.0/3.0"



def test_replay_counts_a_question_without_a_category_once(model_dir, tmp_path, capsys, monkeypatch):
    """replay kept its totals under the group "", which a question without a category is too: such a
    question counted twice in the top row (another tokens/step than the bench's), and was left out of the
    per-category table, where redrafter-bench shows it as "(none)"."""
    from redrafter_mlx import replay

    f = tmp_path / "mixed.jsonl"
    f.write_text(json.dumps({"question_id": 1, "turns": ["Describe a cat."]}) + "\n"
                 + json.dumps({"question_id": 2, "category": "math", "turns": ["What is 12 times 12?"]}) + "\n")
    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", f, "--max-tokens", 4, "--json", out)[0] == 0
    # the uncategorised question: 4 tokens in 4 steps; the math one: 3 in 1
    counts = iter([(4, 4), (1, 3)])

    def scripted(*a, **k):
        steps, produced = next(counts)
        return {**dict.fromkeys(("packed", "looked_up", "drafter_rows", "aliases", "grafted", "graft_accepted",
                                 "ceiling_extra"), 0), "steps": steps, "produced": produced}

    monkeypatch.setattr(replay, "replay", scripted)
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert float(next(line for line in lines if line.startswith("2x3")).split()[4]) == pytest.approx(7 / 5, abs=1e-3)
    header = lines.index("per category: tokens/step / packed/step / drafter rows/step")
    assert lines[header + 1].split() == ["config", "(none)", "math"]
    assert lines[header + 2].split()[-2:] == ["1.00/0.0/0.0", "3.00/0.0/0.0"]
    # a file where no question has a category has no per-category table
    report = json.loads(out.read_text())
    out.write_text(json.dumps({**report, "results": [{**r, "category": ""} for r in report["results"]]}))
    counts = iter([(4, 4), (1, 3)])
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    assert "per category" not in capsys.readouterr().out


def test_replay_keeps_a_category_named_like_a_turn_a_category(model_dir, tmp_path, capsys, monkeypatch):
    """replay kept its categories and a --turns report's turns in one dict keyed by name: a category named
    "turn 1" was pooled with every question's first turn, one column for both."""
    from redrafter_mlx import replay

    f = tmp_path / "turns.jsonl"
    f.write_text(json.dumps({"question_id": 1, "category": "turn 1", "turns": ["Describe a cat.", "And a dog?"]})
                 + "\n" + json.dumps({"question_id": 2, "category": "math", "turns": ["What is 12 times 12?",
                                                                                  "And 13 times 13?"]}) + "\n")
    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", f, "--max-tokens", 4, "--turns", 2, "--json", out)[0] == 0
    # (steps, produced) of q1's turns, then q2's
    counts = iter([(4, 4), (1, 3), (2, 4), (1, 1)])

    def scripted(*a, **k):
        steps, produced = next(counts)
        return {**dict.fromkeys(("packed", "looked_up", "drafter_rows", "aliases", "grafted", "graft_accepted",
                                 "ceiling_extra"), 0), "steps": steps, "produced": produced}

    monkeypatch.setattr(replay, "replay", scripted)
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines.index("per category: tokens/step / packed/step / drafter rows/step")
    assert lines[header + 1].split() == ["config", "math", "turn", "1", "(category)", "turn", "1", "turn", "2"]
    # math: 5 tokens in 3 steps; the category "turn 1": 7 in 5; turn 1: 8 in 6; turn 2: 4 in 2
    assert [cell.split("/")[0] for cell in lines[header + 2].split()[-4:]] == ["1.67", "1.40", "1.33", "2.00"]


def test_turns_are_tabled_in_turn_order():
    """The bench's and replay's per-turn columns were sorted by name: "turn 10" came before "turn 2"."""
    from redrafter_mlx import bench

    rows = [{"question_id": 1, "turn": t, "mode": "ar", "steps": 3, "decode_seconds": 1.0, "new_tokens": 4,
             "tokens_per_second": 3.0, "peak_memory_mb": 1.0, "tokens": [5, 6, 7, 8]} for t in (10, 2, 1)]
    assert list(bench.per_turn(rows, ["ar"])) == ["turn 1", "turn 2", "turn 10"]


def test_replay_tables_turns_in_turn_order(model_dir, tmp_path, capsys):
    from redrafter_mlx import replay

    f = tmp_path / "turns.jsonl"
    f.write_text(json.dumps({"question_id": 1, "category": "math", "turns": ["What is 12 times 12?",
                                                                           "And 13 times 13?"]}) + "\n")
    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", f, "--max-tokens", 4, "--turns", 2, "--json", out)[0] == 0
    report = json.loads(out.read_text())
    for r in report["results"]:  # turns 1 and 2 renumbered 2 and 10 (by name, "turn 10" sorts first)
        r["turn"] = {1: 2, 2: 10}[r["turn"]]
    out.write_text(json.dumps(report))
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines.index("per category: tokens/step / packed/step / drafter rows/step")
    assert lines[header + 1].split() == ["config", "math", "turn", "2", "turn", "10"]


def test_replay_of_replies_without_a_decoding_step_shows_no_figures(model_dir, prompts, tmp_path, capsys):
    """Replies of one token (--max-tokens 1) take no decoding step: replay printed 0.000 tokens/step (no
    decoding emits fewer than 1), 0.00x and "0 of 0 replies slower", where redrafter-bench shows "-"."""
    from redrafter_mlx import replay

    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 1, "--json", out)[0] == 0
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if line.startswith("2x3")).split()[4:] == ["-"] * 7
    assert next(line for line in lines if line.startswith("2x3 t0")).split()[-2:] == ["-/-/-", "-/-/-"]
    assert replay.main([str(out), "--auto", "mkl"]) == 0
    text = capsys.readouterr().out
    assert next(line for line in text.splitlines() if line.startswith("mkl ")).split()[2:] == ["-"] * 8
    assert "mkl tree: no reply took a decoding step" in text and "0.00" not in text

def test_replay_says_when_the_report_is_of_a_run_that_stopped_early(model_dir, prompts, tmp_path, capsys):
    """A report of a run stopped by Ctrl-C or a time limit ("complete": false) was replayed saying nothing:
    its figures covered the questions it finished only."""
    from redrafter_mlx import replay

    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--json", out)[0] == 0
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    assert "stopped early" not in capsys.readouterr().err
    report = json.loads(out.read_text())
    out.write_text(json.dumps({**report, "complete": False, "results": report["results"][:2]}))
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    err = capsys.readouterr().err
    assert "stopped early (\"complete\": false): it holds 2 questions" in err
    # named as its errors and --help name it (notes said "replay: note:")
    assert err.startswith(f"python -m redrafter_mlx.replay: note: {out} is the report of")
    first = [r for r in report["results"] if r["mode"] == "ar"][:1]
    out.write_text(json.dumps({**report, "complete": False, "results": first}))
    assert replay.main([str(out), "--shapes", "2x3"]) == 0
    err = capsys.readouterr().err
    assert "it holds 1 question" in err and "1 questions" not in err


def test_replay_says_what_works_when_the_drafter_does_not_fit(tiny_kit, model_dir, prompts, tmp_path, capsys):
    """A drafter that does not fit the model (found beside it or given) stopped the replay saying to pass
    --no-drafter, which replay takes only with --auto; one found without its weights said that the report's model
    "cannot be loaded here". Both say what replay takes."""
    from redrafter_mlx import replay

    out = tmp_path / "r.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 8, "--modes", "ar",
               "--json", out)[0] == 0
    other = tiny_kit.model(seed=0, hidden_size=48)
    save_drafter(new_drafter(other.args, lm_head="shared", seed=1), model_dir / "drafter")
    assert replay.main([str(out), "--shapes", "2x3"]) == 2
    err = capsys.readouterr().err
    assert "hidden size 48" in err and "pass --drafter PATH, or --auto PROFILE --no-drafter" in err
    assert "cannot be loaded here" not in err and "(or --no-drafter)" not in err
    assert replay.main([str(out), "--shapes", "2x3", "--drafter", str(model_dir / "drafter")]) == 2  # given: the same
    assert "pass --drafter PATH, or --auto PROFILE --no-drafter" in capsys.readouterr().err
    assert replay.main([str(out), "--auto", "mkl", "--no-drafter"]) == 0
    capsys.readouterr()
    save_drafter(new_drafter(tiny_kit.model(seed=0).args, lm_head="shared", seed=1), model_dir / "drafter")
    (model_dir / "drafter" / "model.safetensors").unlink()
    assert replay.main([str(out), "--shapes", "2x3"]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "pass --drafter PATH, or --auto PROFILE --no-drafter" in err
    assert "cannot be loaded here" not in err


def test_replay_takes_a_reply_that_ended_at_its_first_token(model_dir, prompts, tmp_path, capsys):
    # the bench writes "tokens": [] for a reply whose first token was the end of turn; replay refused the whole
    # file ("has no 'tokens' list, or an empty one")
    from redrafter_mlx import replay

    out = tmp_path / "b.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 6, "--modes", "ar",
               "--json", out)[0] == 0
    report = json.loads(out.read_text())
    report["results"][1].update(tokens=[], new_tokens=0, steps=0, finish_reason="eos")  # as the bench writes one
    out.write_text(json.dumps(report))
    assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line.split() for line in lines if line.startswith("2x3"))
    math = next(line for line in lines if line.startswith("config"))
    assert "math" in math  # the empty reply's category is still a column
    # tokens/step over the other two replies: what a file without the empty one replays to (it was checked as
    # "1.0 give or take 0.5", which any tree that drafted nothing, or drafted well, would give)
    others = tmp_path / "others.json"
    others.write_text(json.dumps({**report, "results": [r for i, r in enumerate(report["results"]) if i != 1]}))
    assert replay.main([str(others), "--model", str(model_dir), "--shapes", "2x3"]) == 0
    alone = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("2x3"))
    assert row[4] == alone[4] and float(row[4]) >= 1.0, (row, alone)
    report["results"][1]["prompt_tokens"] = []  # an empty prompt is still refused
    out.write_text(json.dumps(report))
    assert replay.main([str(out), "--model", str(model_dir)]) == 2
    assert "has no 'prompt_tokens' list, or an empty one" in capsys.readouterr().err


def test_replay_says_when_it_replays_another_drafter_than_the_bench_ran(model_dir, prompts, tmp_path, capsys):
    # a bench run with --drafter OTHER was replayed with the drafter beside the model, saying nothing, and its
    # figures then differed from the bench's
    from redrafter_mlx import replay

    other = tmp_path / "other-drafter"
    save_drafter(new_drafter(load(str(model_dir), use_drafter=False).args, lm_head="shared", seed=7), other)
    out = tmp_path / "b.json"
    assert run(capsys, "--model", model_dir, "--drafter", other, "--prompts", prompts, "--limit", 1, "--max-tokens", 6,
               "--modes", "ar,redrafter", "--beam-width", 2, "--beam-length", 3, "--json", out)[0] == 0
    assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3"]) == 0
    err = capsys.readouterr().err
    assert f"was decoded with the drafter {other}" in err and f"pass --drafter {other}" in err
    for given in (["--drafter", str(other)], ["--drafter", str(model_dir / "drafter")]):  # chosen: no note
        assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3", *given]) == 0
        assert "was decoded with the drafter" not in capsys.readouterr().err
    report = json.loads(out.read_text())
    out.write_text(json.dumps({**report, "drafter": str(model_dir / "drafter")}))  # the one beside the model
    assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3"]) == 0
    assert "was decoded with the drafter" not in capsys.readouterr().err


def test_tune_stores_the_default_shape_per_device(model_dir, prompts, capsys):
    assert load(str(model_dir)).beam_shape is None
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--tune",
                        "--widths", "1,2", "--lengths", "2,3", "--tree", "0,3", "--tree-min-prob", "0.01,0.5",
                        "--lookup", "0,4")
    assert rc == 0 and "stored in" in text
    assert f"stored in {model_dir / FILE} for {model_dir} with float32 weights on this machine" in text  # (whose)
    assert "redrafter-bench: note: the tune measured" in err and "too few to tell shapes apart" in err  # 3 x 8 tokens
    # of its 6 questions (it said "--limit 6", which was not given)
    assert f"note: --tune runs the first 6 questions, and {prompts} holds 3 questions: all of them run" in err
    stored = json.loads((model_dir / FILE).read_text())
    assert len(stored) == 1
    entry = next(iter(stored.values()))
    shape = (entry["beam_width"], entry["beam_length"])
    assert tuple(entry["fastest_shape"]) in {(1, 2), (1, 3), (2, 2), (2, 3)}
    # the timings decide: the fastest shape, or W=1 L=1 when plain decoding beat them all
    assert shape == ((1, 1) if entry["plain_is_faster"] else tuple(entry["fastest_shape"]))
    assert entry["tree"] in ({0} if entry["plain_is_faster"] else {0, 3})  # the fastest variant's tree
    assert entry["lookup"] in ({DEFAULT_LOOKUP} if entry["plain_is_faster"] else {0, 4})
    assert entry["tree_min_prob"] in ({0.01, 0.5} if entry["tree"] else {DEFAULT_MIN_PROB})
    m = load(str(model_dir))
    assert m.beam_shape == shape and m.tree == entry["tree"]
    assert (m.lookup, m.tree_min_prob) == (entry["lookup"], entry["tree_min_prob"])
    assert tuple(drafting(m)) == (*shape, entry["tree"], entry["lookup"], entry["tree_min_prob"])
    g = generate(m, "hello there", max_tokens=6)  # mode "auto": the adaptive controller, whatever is tuned
    assert g.stats.mode == "auto"
    g = generate(m, "hello there", max_tokens=6, lookup=entry["lookup"])  # fixed drafting: the tuned shape
    assert g.stats.mode == ("ar" if shape[1] == 1 else "redrafter")
    g = generate(m, "hello there", mode="redrafter", max_tokens=6, lookup=entry["lookup"])
    assert (g.stats.beam_width, g.stats.beam_length, g.stats.tree) == (*shape, entry["tree"])
    g = generate(m, "hello there", mode="redrafter", max_tokens=6, beam_width=2, beam_length=3)
    assert g.stats.tree == 0  # an explicit shape does not take the tuned tree
    # Another device's entry is not used; a damaged file reads as "not tuned".
    assert read_beam_shape(model_dir, device="gpu (elsewhere)") is None
    (model_dir / FILE).write_text("{not json")
    assert load(str(model_dir)).beam_shape is None
    g = generate(load(str(model_dir)), "hello there", mode="redrafter", max_tokens=4, lookup=0)
    assert (g.stats.beam_width, g.stats.beam_length) == DEFAULT_SHAPE


def test_tune_says_the_lookup_and_floor_it_stores(model_dir, prompts, capsys, monkeypatch):
    """A tune of --lookup 0,4 (or of tree floors) stored the fastest variant's lookup length and floor, and said
    only "fastest shape W=1 L=2 stored in ...": which one was stored, it did not say."""
    monkeypatch.setattr(bench, "tuned_default", lambda summary, best: (best["beam_width"], best["beam_length"], False))
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--tune",
                      "--widths", 1, "--lengths", 2, "--tree", "0,3", "--tree-min-prob", "0.01,0.5", "--lookup", "0,4")
    assert rc == 0
    entry = next(iter(json.loads((model_dir / FILE).read_text()).values()))
    floor = f" tree {entry['tree']} (floor {entry['tree_min_prob']:g})" if entry["tree"] else ""
    assert f"fastest shape W=1 L=2{floor}, lookup {entry['lookup']} (" in text, text


def test_a_tune_over_a_damaged_shape_file_keeps_it_beside_the_new_one(model_dir, prompts, capsys):
    """--tune replaced a damaged beam_shape.json (every other machine's and model's entry in it) without a word.
    It is kept as beam_shape.json.damaged, and the note says so."""
    (model_dir / FILE).write_text('{"cpu (elsewhere)": {"beam_width": 2,')
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--tune",
                        "--widths", "1", "--lengths", "2")
    assert rc == 0 and "stored in" in text
    assert (model_dir / (FILE + ".damaged")).read_text() == '{"cpu (elsewhere)": {"beam_width": 2,'
    assert f"redrafter-bench: note: {model_dir / FILE} was damaged (not valid JSON" in err
    assert f"kept as {FILE}.damaged beside it" in err and len(json.loads((model_dir / FILE).read_text())) == 1


def test_tune_without_a_writable_cost_cache_measures_the_curve_once(model_dir, prompts, capsys, monkeypatch):
    # --tune measured the curve, could not cache it, and the controller then measured it again
    from redrafter_mlx import costs

    def refused(path, *a, **kw):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(costs, "update_json", refused)
    monkeypatch.setattr(costs, "unwritable_ancestor", lambda path: path.parent)  # (chmod does not bind root)
    calls, real = [], costs.calibrate
    monkeypatch.setattr(costs, "calibrate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--tune",
                     "--widths", 1, "--lengths", 2)
    assert rc == 0 and len(calls) == 1 and err.count("measuring this machine's verification cost") == 1, err


def test_tune_into_a_model_folder_that_cannot_be_written_is_refused_before_it_runs(model_dir, prompts, capsys,
                                                                                  monkeypatch):
    # the whole grid ran, then storing the shape failed ("Permission denied", status 1)
    from redrafter_mlx import costs

    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)  # (chmod does not bind root: simulated)
    monkeypatch.setattr(costs, "calibrate", lambda *a, **kw: pytest.fail("the tune ran"))
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--tune",
                     "--widths", 1, "--lengths", 2)
    assert rc == 2 and err.strip().endswith(f"redrafter-bench: error: --tune stores the fastest shape in the model "
                                            f"folder {model_dir}, which cannot be written: tune a copy of the model "
                                            "in a folder you can write")
    assert not (model_dir / FILE).exists()


def test_tree_min_prob_variants_run_side_by_side(model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "p.json"
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 12, "--modes",
                      "ar,redrafter", "--beam-width", 2, "--beam-length", 4, "--tree", "0,6",
                      "--tree-min-prob", "0.001,0.9", "--json", out)
    assert rc == 0
    summary = json.loads(out.read_text())["summary"]
    # the floor only matters to a tree: beams run once, the tree once per floor
    assert set(summary) == {"ar", "redrafter+tree0", "redrafter+tree6@0.001", "redrafter+tree6@0.9"}
    assert "tree_min_prob" not in summary["redrafter+tree0"]
    for p in (0.001, 0.9):
        v = summary[f"redrafter+tree6@{p:g}"]
        assert v["tree_min_prob"] == p and v["identical_to_ar"] is True
    # a lower floor keeps at least as many nodes of the same tree
    assert (summary["redrafter+tree6@0.001"]["packed_tokens_per_step"]
            >= summary["redrafter+tree6@0.9"]["packed_tokens_per_step"])
    for bad in ("0", "1.5", "x"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--tree-min-prob", bad])


def test_a_floor_with_beams_alone_is_refused(model_dir, prompts, capsys):
    """--tree-min-prob where every variant drafts W x L beams was dropped, saying nothing: refused while
    parsing where the options say so, and after the load where no tree is tuned for the model."""
    for beams in (["--beam-width", "2"], ["--beam-length", "3"], ["--tree", "0"], ["--grid", "--tree", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--tree-min-prob", "0.5", *beams])
        assert "--tree-min-prob is the dynamic tree's floor" in capsys.readouterr().err
    assert bench.parse_args(["--prompts", "x", "--modes", "redrafter", "--tree-min-prob", "0.5", "--tree", "0,8"])
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--modes",
                     "ar,redrafter", "--tree-min-prob", "0.5")  # no tree given, none tuned: beams
    assert rc == 2 and err.splitlines()[-1].startswith("redrafter-bench: error: --tree-min-prob is the dynamic tree's")
    assert "measuring" not in err  # refused before the cost model is measured


def test_a_graph_over_untuned_beams_is_refused_before_the_cost_model(model_dir, prompts, capsys):
    """--graph with --lookup alone (fixed drafting at the tuned shape, whose tree only the load can tell) was
    refused by generate in the warm-up, after the cost model was measured, in the API's words (tree=N)."""
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--modes",
                     "ar,auto,redrafter", "--lookup", 4, "--graph", 1)
    assert rc == 2 and "measuring" not in err
    assert err.splitlines()[-1].startswith("redrafter-bench: error: --graph drafts a dynamic tree, and the redrafter "
                                           "column drafts W x L beams")


def test_a_tree_where_plain_decoding_was_tuned_drafts_at_the_default_length(model_dir, prompts, tmp_path, capsys):
    """tuning.drafting's rule (a tuned L = 1 does not turn a tree asked for into plain decoding) held for
    the API and the chat, but the bench read the shape without the tree: --tree 6 there ran 1 x 1, a tree
    of no levels."""
    from redrafter_mlx._platform import device_description

    (model_dir / FILE).write_text(json.dumps({device_description(): {"beam_width": 1, "beam_length": 1}}))
    out = tmp_path / "t.json"
    rc, _, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 6, "--modes",
                   "ar,redrafter", "--tree", 6, "--lookup", 0, "--json", out)
    assert rc == 0
    row = next(r for r in json.loads(out.read_text())["results"] if r["mode"] == "redrafter")
    assert (row["beam_width"], row["beam_length"], row["tree"]) == (*DEFAULT_SHAPE, 6)
    want = generate(load(str(model_dir)), QUESTIONS[0]["turns"][0], mode="redrafter", max_tokens=6, tree=6, lookup=0)
    assert (want.stats.beam_width, want.stats.beam_length) == DEFAULT_SHAPE  # as the API drafts it


def test_the_grid_drafts_beams_where_a_tree_is_tuned_unless_a_tree_is_given(model_dir, prompts, tmp_path, capsys):
    """The grid's shapes are not the tuned one: where a tree was tuned, every shape of the grid (named as beams,
    redrafter@1x3) drafted the tuned tree, and a --tune never measured beams again; a floor without --tree then
    shaped that tree, and is refused as with --beam-width."""
    from redrafter_mlx._platform import device_description

    (model_dir / FILE).write_text(json.dumps({device_description(): {"beam_width": 2, "beam_length": 3, "tree": 6}}))
    assert load(str(model_dir)).tree == 6  # (the entry is read)
    out = tmp_path / "g.json"
    rc, _, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4, "--modes",
                   "ar,redrafter", "--grid", "--widths", "1,2", "--lengths", 3, "--json", out)
    assert rc == 0
    report = json.loads(out.read_text())
    assert {name: column["tree"] for name, column in report["columns"].items() if name != "ar"} == {
        "redrafter@1x3": 0, "redrafter@2x3": 0}
    assert report["settings"]["tree"] == [0]
    for grid in (["--grid"], ["--tune"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--tree-min-prob", "0.5", *grid])
        assert "--tree-min-prob is the dynamic tree's floor" in capsys.readouterr().err


def test_drafting_defaults_follow_the_tuned_entry(tmp_path):
    from types import SimpleNamespace

    untuned = SimpleNamespace(beam_shape=None, tree=None, lookup=None, tree_min_prob=None)
    assert tuple(drafting(untuned)) == (*DEFAULT_SHAPE, DEFAULT_TREE, DEFAULT_LOOKUP, DEFAULT_MIN_PROB)
    tuned = SimpleNamespace(beam_shape=(4, 6), tree=16, lookup=32, tree_min_prob=0.05)
    assert tuple(drafting(tuned)) == (4, 6, 16, 32, 0.05)
    # the tuned tree goes with the tuned shape only; lookup and the floor apply to any shape
    assert tuple(drafting(tuned, beam_width=2)) == (2, 6, DEFAULT_TREE, 32, 0.05)
    assert tuple(drafting(tuned, 1, 3, tree=4, lookup=0, tree_min_prob=0.5)) == (1, 3, 4, 0, 0.5)
    # a tuned "plain decoding was fastest" (L = 1) does not turn an explicit tree or width into plain decoding
    plain = SimpleNamespace(beam_shape=(1, 1), tree=0, lookup=8, tree_min_prob=0.2)
    assert tuple(drafting(plain))[:2] == (1, 1) and tuple(drafting(plain, lookup=8))[:2] == (1, 1)
    assert tuple(drafting(plain, tree=16))[:3] == (*DEFAULT_SHAPE, 16)
    assert tuple(drafting(plain, beam_width=2))[:2] == (2, DEFAULT_SHAPE[1])
    assert tuple(drafting(plain, beam_width=2, beam_length=1))[:2] == (2, 1)
    # stored values out of range read as "not stored"; files from before lookup/floor were stored still load
    (tmp_path / FILE).write_text(json.dumps({"dev": {"beam_width": 4, "beam_length": 6, "tree": 16, "lookup": -1,
                                                     "tree_min_prob": 2.0}, "old": {"beam_width": 1, "beam_length": 3}}))
    assert tuple(read_tuned(tmp_path, "dev")) == (4, 6, 16, None, None)
    assert tuple(read_tuned(tmp_path, "old")) == (1, 3, 0, None, None)


def test_a_tuned_shape_is_kept_per_machine_and_weight_format(model_dir, monkeypatch):
    """beam_shape.json was keyed by device_description() alone ('cpu (x86_64, MKL)'): a model folder
    shared with another CPU, a process under taskset, or the same model loaded with its stored 4-bit
    weights (which cost ~k times one token to verify k here) took the shape another one measured.
    An entry under the description alone (a shipped drafter's, an older --tune's) is still read
    where none names this machine and format."""
    import os

    from redrafter_mlx import costs
    from redrafter_mlx._platform import device_description
    from redrafter_mlx.costs import drafter_digest
    from redrafter_mlx.tuning import device_keys, save_beam_shape

    monkeypatch.setattr(costs, "on_cpu", lambda: True, raising=False)
    monkeypatch.setattr(costs, "cpu_name", lambda: "CPU one", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    (model_dir / FILE).write_text(json.dumps({device_description(): {"beam_width": 1, "beam_length": 3}}))
    m = load(str(model_dir), weight_format="float32")
    assert m.beam_shape == (1, 3)  # the older entry, read where this machine has none
    save_beam_shape(m, 2, 4, {"speedup": 1.0}, tree=5, lookup=0, tree_min_prob=0.3)
    stored = json.loads((model_dir / FILE).read_text())
    digest = drafter_digest(model_dir / "drafter")
    assert set(stored) == {device_description(), device_keys("float32", model_dir, digest)[0]}
    assert f"CPU one, 2 cores | float32 | safetensors | drafter {digest}" in device_keys("float32", model_dir, digest)[0]
    m = load(str(model_dir), weight_format="float32")
    assert (*m.beam_shape, m.tree, m.lookup, m.tree_min_prob) == (2, 4, 5, 0, 0.3)
    # another format, another CPU, fewer cores: not this entry (the description's, as before tuning)
    assert load(str(model_dir), weight_format="float16").beam_shape == (1, 3)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert load(str(model_dir), weight_format="float32").beam_shape == (1, 3)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(costs, "cpu_name", lambda: "CPU two", raising=False)
    assert load(str(model_dir), weight_format="float32").beam_shape == (1, 3)
    monkeypatch.setattr(costs, "cpu_name", lambda: "CPU one", raising=False)
    assert load(str(model_dir), weight_format="float32").beam_shape == (2, 4)


def test_each_model_in_a_shared_folder_keeps_its_own_tuned_shape(tiny_kit, tmp_path):
    """Two GGUF files (two quantizations of a model, say) and safetensors weights in one folder shared one
    beam_shape.json entry, keyed by machine and weight format alone: a model never tuned drafted with the shape
    tuned on another, and tuning one replaced the other's. Each model file now has an entry of its own; one
    --tune wrote before entries named the model is still read by a model that has none."""
    from redrafter_mlx.costs import drafter_digest
    from redrafter_mlx.tuning import device_keys, save_beam_shape

    model = tiny_kit.model(seed=0)
    folder = tiny_kit.write_folder(tmp_path / "both", model)
    a, b = (tiny_kit.write_gguf(folder / f"m.{q}.gguf", model) for q in ("Q4_1", "Q8_0"))
    d = tmp_path / "d"
    save_drafter(new_drafter(model.args, lm_head="shared", seed=1), d)
    save_beam_shape(load(str(a), drafter=str(d)), 2, 5, {})
    assert load(str(b), drafter=str(d)).beam_shape is None and load(str(folder), drafter=str(d)).beam_shape is None
    save_beam_shape(load(str(b), drafter=str(d)), 3, 3, {})
    save_beam_shape(load(str(folder), drafter=str(d)), 1, 4, {})
    assert [load(str(p), drafter=str(d)).beam_shape for p in (a, b, folder)] == [(2, 5), (3, 3), (1, 4)]
    stored = json.loads((folder / FILE).read_text())
    assert len(stored) == 3 and all(any(f" | {n} | drafter " in k for k in stored)
                                    for n in ("m.Q4_1.gguf", "m.Q8_0.gguf", "safetensors"))
    older = {device_keys("float32")[0]: {"beam_width": 4, "beam_length": 2, "drafter_digest": drafter_digest(d)}}
    (folder / FILE).write_text(json.dumps({**older, **{k: v for k, v in stored.items() if "Q8_0" not in k}}))
    assert [load(str(p), drafter=str(d)).beam_shape for p in (a, b, folder)] == [(2, 5), (4, 2), (1, 4)]


def test_a_shape_tuned_with_another_drafter_is_not_used(model_dir, tmp_path):
    """--tune's entry in the model folder stayed in place when redrafter-train or the converter replaced
    MODEL/drafter, and the new drafter ran with the shape (tree, lookup, floor) tuned for the old one. The
    entry now carries the drafter's digest and is not used with another drafter (a note says so): the new
    drafter's own beam_shape.json, else the defaults, apply until --tune runs again. A model folder
    copied elsewhere keeps its entry (the digest is of the drafter's bytes, not its path)."""
    import shutil

    from redrafter_mlx._platform import device_description
    from redrafter_mlx.tuning import save_beam_shape

    m = load(str(model_dir))
    save_beam_shape(m, 2, 4, {"speedup": 1.0}, tree=5, lookup=0, tree_min_prob=0.3)
    m = load(str(model_dir))
    assert (*m.beam_shape, m.tree, m.lookup, m.tree_min_prob) == (2, 4, 5, 0, 0.3)
    copy = shutil.copytree(model_dir, tmp_path / "copy")
    assert load(str(copy)).beam_shape == (2, 4)

    # a drafter put in its place, as redrafter-train and the converter do: a new folder
    save_drafter(new_drafter(m.args, lm_head="shared", seed=2), model_dir / "drafter")
    said = []
    m = load(str(model_dir), progress=said.append)
    assert (m.beam_shape, m.tree, m.lookup, m.tree_min_prob) == (None, None, None, None)
    assert tuple(drafting(m)) == (*DEFAULT_SHAPE, DEFAULT_TREE, DEFAULT_LOOKUP, DEFAULT_MIN_PROB)
    notes = [s for s in said if "another drafter" in s]
    assert len(notes) == 1 and str(model_dir / FILE) in notes[0] and "--tune again" in notes[0], said
    # the new drafter's own file (as a shipped drafter's, keyed by the device alone) is read instead
    (model_dir / "drafter" / FILE).write_text(json.dumps({device_description(): {"beam_width": 1, "beam_length": 3}}))
    assert load(str(model_dir)).beam_shape == (1, 3)
    # tuned again with this drafter: its entry is used
    save_beam_shape(m, 3, 5, {"speedup": 1.0})
    assert load(str(model_dir)).beam_shape == (3, 5)
    # given another drafter by hand, the shape tuned with this one is not used either
    other = tmp_path / "other"
    save_drafter(new_drafter(m.args, lm_head="shared", seed=3), other)
    assert load(str(model_dir), drafter=str(other)).beam_shape is None
    # tuned with that one too (--tune --drafter PATH), each drafter keeps its own entry: the tune with the
    # other drafter replaced the model's own one's, which it then did not use ("tuned with another drafter")
    save_beam_shape(load(str(model_dir), drafter=str(other)), 1, 2, {"speedup": 1.0})
    assert load(str(model_dir), drafter=str(other)).beam_shape == (1, 2)
    assert load(str(model_dir)).beam_shape == (3, 5)


def test_an_entry_without_a_drafter_digest_is_used_only_with_the_drafter_it_was_tuned_with(model_dir, tmp_path):
    """An entry --tune wrote before it stored the drafter's digest (or one written by hand) was used with any
    drafter: given another one by hand, or after redrafter-train put a new one in MODEL/drafter. It is now
    used only where the load can tell it is this drafter's: the drafter it names (if still there) is this
    one, else this one is the drafter installed for the model; and this drafter is no newer than the entry's
    measured_at. A load that drops it says so."""
    import shutil
    import time

    from redrafter_mlx.tuning import device_keys

    # measured after the drafter was written, whatever the wall clock says of the files' times (the premise)
    written = max((model_dir / "drafter" / f).stat().st_mtime for f in ("config.json", "model.safetensors"))
    older = {"beam_width": 2, "beam_length": 5, "drafter": str(model_dir / "drafter"),
             "measured_at": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(max(time.time(), written)))}
    (model_dir / FILE).write_text(json.dumps({device_keys()[-1]: older}))
    other = tmp_path / "other"
    save_drafter(new_drafter(load(str(model_dir), use_drafter=False).args, lm_head="shared", seed=3), other)
    assert load(str(model_dir)).beam_shape == (2, 5)  # the drafter it was tuned with, beside the model
    assert load(str(model_dir), drafter=str(model_dir / "drafter")).beam_shape == (2, 5)  # the same, given
    said = []
    assert load(str(model_dir), drafter=str(other), progress=said.append).beam_shape is None
    assert [s for s in said if f"another drafter (the one at {model_dir / 'drafter'})" in s and "--tune" in s], said
    # written by hand, naming no drafter: the model's own drafter only
    (model_dir / FILE).write_text(json.dumps({device_keys()[-1]: {"beam_width": 1, "beam_length": 3}}))
    assert load(str(model_dir)).beam_shape == (1, 3)
    said = []
    assert load(str(model_dir), drafter=str(other), progress=said.append).beam_shape is None
    assert [s for s in said if "is not the drafter installed for this model" in s], said
    # a model folder moved elsewhere keeps it (the drafter it names is gone: the installed one is taken for it)
    (model_dir / FILE).write_text(json.dumps({device_keys()[-1]: older}))
    moved = shutil.copytree(model_dir, tmp_path / "moved")
    shutil.rmtree(model_dir / "drafter")
    assert load(str(moved)).beam_shape == (2, 5)
    # a drafter put in place of the one it was tuned with, after the tune
    (moved / FILE).write_text(json.dumps({device_keys()[-1]: {**older, "measured_at": "2020-01-01 00:00:00"}}))
    said = []
    assert load(str(moved), progress=said.append).beam_shape is None
    assert [s for s in said if "before the drafter at" in s], said


def test_a_beam_shape_file_that_cannot_be_read_is_not_used_and_the_load_says_so(model_dir, monkeypatch):
    """A beam_shape.json the user cannot read failed every load of the model with a PermissionError traceback,
    and a damaged one (a hand edit gone wrong) was ignored, saying nothing, or, where it held a shape or tree
    larger than generate drafts, failed every call of fixed drafting over options never given. Either is now
    not used, and the load says so through progress."""
    import pathlib

    from redrafter_mlx.tuning import device_keys

    said = []
    for text in ("{not json", "[1, 2]", *(json.dumps({device_keys()[-1]: {"beam_width": 4, "beam_length": 6, **bad}})
                                          for bad in ({"beam_width": "four"}, {"tree": 5000}, {"beam_width": 1000},
                                                      {"lookup": 2000}))):
        (model_dir / FILE).write_text(text)
        said.clear()
        assert load(str(model_dir), progress=said.append).beam_shape is None
        assert [s for s in said if s.startswith(f"cannot read the beam shape in {model_dir / FILE} (")], (text, said)
    real = pathlib.Path.read_text

    def refused(self, *a, **kw):
        if self.name == FILE:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **kw)

    # (a tree of 5000 nodes, more than generate drafts, failed every fixed-drafting call, "tree 5000: drafts are
    # limited to 1024 tokens a step", though no tree was given)
    (model_dir / FILE).write_text(json.dumps({device_keys()[-1]: {"beam_width": 4, "beam_length": 6, "tree": 5000}}))
    assert generate(load(str(model_dir)), "hello", max_tokens=3, lookup=0).stats.new_tokens == 3
    monkeypatch.setattr(pathlib.Path, "read_text", refused)  # (chmod does not bind root: simulated)
    said.clear()
    assert load(str(model_dir), progress=said.append).beam_shape is None
    assert [s for s in said if "cannot read the beam shape" in s and "Permission denied" in s], said


def test_the_table_fits_long_category_and_variant_names():
    """Spec-Bench's "math_reasoning" was cut to 12 characters, and a variant such as
    "redrafter+tree6@0.001" pushed its row out of the columns."""
    import io

    row = {"new_tokens": 9, "steps": 4, "tokens_per_step": 2.25, "tokens_per_second": 10.0}
    results = [{"question_id": 1, "category": "math_reasoning", "mode": "ar", **row},
               {"question_id": 1, "category": "math_reasoning", "mode": "redrafter",
                "variant": "redrafter+tree6@0.001", **row}]
    summary = {m: {"tokens_per_second": 10.0, "tokens_per_step": 2.25, "peak_memory_mb": 1.0}
               for m in ("ar", "redrafter+tree6@0.001")}
    out = io.StringIO()
    bench.print_table(results, summary, ["ar", "redrafter+tree6@0.001"], out)
    lines = out.getvalue().splitlines()
    assert "math_reasoning" in lines[1] and "math_reasoning" in lines[2]
    new_ends = lines[0].index("new") + 3  # the "new" column ends under its heading in every row
    assert [line.index(" 9 ") + 2 for line in lines[1:3]] == [new_ends, new_ends]
    summaries = [line for line in lines if "tok/s" in line and "tokens/step" in line]
    assert len({line.index("tok/s") for line in summaries}) == 1
    # a question_id past 9 characters pushed its row out of the columns
    out = io.StringIO()
    bench.print_table([{**r, "question_id": "writing-haiku-0042", "turn": 2} for r in results], summary,
                      ["ar", "redrafter+tree6@0.001"], out)
    lines = out.getvalue().splitlines()
    assert "writing-haiku-0042/2 math_reasoning" in lines[1]
    new_ends = lines[0].index("new") + 3
    assert [line.index(" 9 ") + 2 for line in lines[1:3]] == [new_ends, new_ends]


def test_prompts_from_a_pipe_are_read(model_dir, capsys):
    """`redrafter-bench --prompts <(head -4 q.jsonl)` gives a pipe (/dev/fd/63), not a regular file: it was "not
    found"."""
    from helpers import piped

    with piped("".join(json.dumps(q) + "\n" for q in QUESTIONS[:2])) as path:
        assert [q["prompt"] for q in bench.read_prompts(path)] == [q["turns"][0] for q in QUESTIONS[:2]]
    with piped(json.dumps(QUESTIONS[0]) + "\n") as path:
        rc, text, err = run(capsys, "--model", model_dir, "--prompts", path, "--modes", "ar", "--max-tokens", 2)
    assert rc == 0, err


def test_bad_input_is_reported(model_dir, tmp_path, capsys):
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", tmp_path / "missing.jsonl")
    assert rc == 2 and "not found" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1}\n')
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", bad)
    assert rc == 2 and "turns" in err
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--widths", "0,2"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--modes", "fast"])


def test_an_output_path_that_is_the_prompt_file_is_refused(model_dir, prompts, tmp_path, capsys):
    """--json is written before the first question: --json q.jsonl --prompts q.jsonl replaced the user's
    prompt file with the report; --plot the same, and --json and --plot one file wrote one over the other."""
    before = prompts.read_text()
    for argv, said in ((["--json", prompts], f"--json {prompts} is the file --prompts names"),
                       (["--json", tmp_path / "." / prompts.name], "is the file --prompts names"),
                       (["--modes", "ar,redrafter", "--grid", "--plot", prompts], "--plot"),
                       (["--modes", "ar,redrafter", "--grid", "--json", tmp_path / "o", "--plot", tmp_path / "o"],
                        "is the file --json names")):
        with pytest.raises(SystemExit):
            bench.parse_args(["--model", str(model_dir), "--prompts", str(prompts), *map(str, argv)])
        assert said in capsys.readouterr().err
    assert prompts.read_text() == before
    assert bench.parse_args(["--prompts", str(prompts), "--json", str(tmp_path / "b.json")]).json == tmp_path / "b.json"


def test_grid_shapes_without_the_grid_are_refused(capsys):
    """--widths and --lengths without --grid ran one shape (the tuned or default one, or the adaptive
    controller), ignoring them, saying nothing."""
    for argv, said in ((["--widths", "1,2"], "--widths shapes the grid, and --grid is not given"),
                       (["--modes", "ar,redrafter", "--lengths", "3"], "--lengths shapes the grid"),
                       (["--modes", "ar,redrafter", "--widths", "1", "--lengths", "3"],
                        "--widths and --lengths shape")):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", *argv])
        assert said in capsys.readouterr().err
    args = bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--grid", "--widths", "1,2"])
    assert (args.widths, args.lengths) == ([1, 2], [3, 4, 5])
    args = bench.parse_args(["--prompts", "x", "--tune", "--lengths", "2"])
    assert (args.widths, args.lengths) == ([1, 2, 4, 8], [2])


def test_a_single_shape_with_the_grid_is_refused(capsys):
    """--grid (and --tune, which runs it) ran every shape in --widths x --lengths and ignored --beam-width
    and --beam-length, saying nothing; the check of drafts over the limit looked at them instead of the grid's
    shapes, so --grid --widths 2000 --beam-width 1 failed only after the model had loaded."""
    for argv, said in ((["--grid", "--beam-width", "3"], "--grid runs every shape in --widths x --lengths, so "
                                                         "--beam-width would be ignored"),
                       (["--grid", "--widths", "2000", "--lengths", "3", "--beam-width", "1"], "--beam-width would be"),
                       (["--tune", "--beam-length", "5"], "--tune runs the grid, every shape"),
                       (["--tune", "--graph", "1"], "--tune measures fixed trees and stores the fastest; --graph "
                                                    "drafting is not tuned"),  # it said "--tune stores a tree shape"
                       (["--grid", "--beam-width", "2", "--beam-length", "3"], "--beam-width and --beam-length")):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", *argv])
        assert said in capsys.readouterr().err


def test_a_drafter_for_modes_that_draft_nothing_is_refused(model_dir, prompts, capsys):
    """--drafter with --modes ar was not even loaded (the report said "drafter": null), saying nothing; with
    --modes ar,mlx-lm it was loaded and used by nothing, and the report named it."""
    drafter = str(model_dir / "drafter")
    for modes in ("ar", "ar,mlx-lm", "mlx-lm"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--modes", modes, "--drafter", drafter])
        assert f"--modes {modes} decodes plainly and drafts nothing: drop --drafter" in capsys.readouterr().err
    assert bench.parse_args(["--prompts", "x", "--modes", "ar,auto", "--drafter", drafter]).drafter == drafter
    # --no-drafter and --graph none (the tree) with no drafting column were ignored, saying nothing
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--modes", "ar,mlx-lm", "--no-drafter"])
    assert "--modes ar,mlx-lm decodes plainly and drafts nothing: drop --no-drafter" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--modes", "ar", "--graph", "none"])
    assert "--graph applies to --modes auto and redrafter" in capsys.readouterr().err
    assert bench.parse_args(["--prompts", "x", "--modes", "ar,auto", "--no-drafter", "--graph", "none"]).no_drafter
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 4,
                     "--modes", "ar,mlx-lm")
    assert rc == 0 and "drafter none (not needed)" in err and "loading drafter" not in err
    assert "modes ar,mlx-lm, no drafting" in err  # it said "adaptive drafting" of a run that drafts nothing


def test_a_first_turn_past_the_context_is_refused_before_the_run(model_dir, tmp_path, capsys):
    """A first turn longer than the model's context ended the run when its question came up, after the
    questions before it had run, with no table and an error that did not say which question."""
    path = tmp_path / "q.jsonl"
    long = {"question_id": "long", "turns": ["a " * 1100]}
    path.write_text("".join(json.dumps(q) + "\n" for q in [QUESTIONS[1], long, QUESTIONS[2]]))
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", path, "--max-tokens", 4, "--modes", "ar")
    assert rc == 2 and text == ""
    assert f"question 'long' of {path} has a first turn of" in err and "has a context of 1024" in err
    assert "q82" not in err  # nothing ran


def test_the_report_is_complete_when_the_plot_or_the_tune_fails(model_dir, prompts, tmp_path, capsys, monkeypatch):
    """The final --json report was written last: a --plot that failed (no matplotlib) or a --tune that found
    no lossless shape returned first, leaving the report of all but the last question, "complete": false."""
    out = tmp_path / "b.json"

    def no_matplotlib(*a):
        raise RedrafterError("--plot needs matplotlib: pip install 'redrafter-mlx[bench]'")

    monkeypatch.setattr(bench, "plot", no_matplotlib)
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--modes", "ar,redrafter",
                     "--beam-width", 2, "--plot", tmp_path / "p.png", "--json", out)
    assert rc == 2 and "--plot needs matplotlib" in err
    report = json.loads(out.read_text())
    assert report["complete"] is True and len(report["results"]) == 2 * len(QUESTIONS)
    monkeypatch.setattr(bench, "best_shape", lambda summary: None)
    out.unlink()
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--tune",
                     "--widths", 1, "--lengths", 2, "--lookup", 0, "--json", out)
    assert rc == 1 and "nothing stored" in err
    report = json.loads(out.read_text())
    assert report["complete"] is True and len(report["results"]) == 2 * len(QUESTIONS)


def test_a_plot_without_ar_draws_tokens_per_second(tmp_path, monkeypatch):
    """--plot of a run without ar (--modes redrafter --grid) drew its first panel, "speedup over ar", with every
    bar 0: an empty panel. It draws the shapes' tokens/s instead, and says so."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn = {}
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: drawn.update(
        {ax.get_title(): [bar.get_height() for bar in ax.patches] for ax in fig.axes}))
    figures = {"tokens_per_step": 1.5, "beam_width": 2, "beam_length": 3, "lookup": 0, "tree": 0}
    summary = {"redrafter@2x3": {**figures, "tokens_per_second": 30.0},
               "redrafter@2x4": {**figures, "beam_length": 4, "tokens_per_second": 40.0}}
    results = [{"question_id": 1, "mode": "redrafter", "variant": "redrafter@2x4", "accepted_length_histogram": {"1": 3}}]
    bench.plot(summary, results, tmp_path / "p.png")
    assert drawn["tokens/s (no ar run to compare with)"] == [30.0, 40.0]
    for v, speedup in zip(summary.values(), (0.75, 1.0)):
        v["speedup"] = speedup
    bench.plot(summary, results, tmp_path / "p.png")
    assert drawn["speedup over ar (tokens/s)"] == [0.75, 1.0]


def test_a_plot_file_matplotlib_cannot_write_is_refused_while_parsing(tmp_path, capsys):
    """--plot grid.txt ended the whole run in matplotlib's traceback ("Format 'txt' is not supported"), and
    --plot grid wrote grid.png, saying "plot written to grid": a name without an extension is written as PNG."""
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--grid", "--plot", str(tmp_path / "grid.txt")])
    err = capsys.readouterr().err
    assert "matplotlib writes no '.txt' files; end the name in .png (or " in err and ".svg" in err
    assert bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--grid", "--plot",
                             str(tmp_path / "grid.SVG")]).plot.name == "grid.SVG"
    figures = {"tokens_per_step": 1.5, "tokens_per_second": 30.0, "beam_width": 2, "beam_length": 3}
    bench.plot({"redrafter": figures}, [], tmp_path / "grid")
    assert (tmp_path / "grid").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "grid.png").exists()


def test_a_plot_without_matplotlib_is_refused_while_parsing(capsys, monkeypatch):
    """--plot without matplotlib was refused after the whole run, when the plot was drawn."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--grid", "--plot", "p.png"])
    assert "--plot needs matplotlib: pip install 'redrafter-mlx[bench]'" in capsys.readouterr().err
    assert bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--grid"]).plot is None


def test_the_summary_pools_the_acceptance_rate():
    """The summary's acceptance rate was the mean of the replies' rates, where its other figures pool the
    replies: a reply the controller decoded plainly throughout (0 of 0 drafts offered, rate 0.0) halved it."""
    def row(qid, steps, accepted, offered):
        return {"question_id": qid, "category": "", "mode": "auto", "new_tokens": steps + accepted + 1, "steps": steps,
                "decode_seconds": 1.0, "tokens_per_second": 1.0, "peak_memory_mb": 0.0, "drafted_tokens": offered,
                "packed_tokens": offered + steps, "accepted_tokens": accepted, "draft_depth": offered,
                "acceptance_rate": accepted / offered if offered else 0.0, "parked_steps": 0, "controller": {}}

    rows = [row(1, 4, 0, 0), row(2, 10, 6, 30), row(3, 2, 2, 2)]
    assert bench.summarize(rows, ["auto"], greedy=False)["auto"]["acceptance_rate"] == pytest.approx(8 / 32)
    assert bench.summarize(rows[:1], ["auto"], greedy=False)["auto"]["acceptance_rate"] == 0.0


def test_the_mean_rate_covers_the_replies_that_have_one():
    """mean_tokens_per_second averaged in the 0.0 of replies with no decode rate (max_tokens 1: no decode step;
    a reply that ended at its first token: a step that found only the end token), pulling the mean down."""
    def row(qid, new, decode, rate):
        return {"question_id": qid, "category": "", "mode": "ar", "new_tokens": new, "steps": max(new - 1, 0),
                "decode_seconds": decode, "tokens_per_second": rate, "peak_memory_mb": 0.0, "tokens": []}

    rows = [row(1, 11, 1.0, 10.0), row(2, 21, 1.0, 20.0), row(3, 1, 0.0, 0.0), row(4, 1, 0.05, 0.0)]
    s = bench.summarize(rows, ["ar"], greedy=False)["ar"]
    assert s["mean_tokens_per_second"] == pytest.approx(15.0)
    assert s["tokens_per_second"] == pytest.approx(30 / 2.05)  # the pooled rate still counts the end token's step
    assert bench.summarize(rows[2:], ["ar"], greedy=False)["ar"]["mean_tokens_per_second"] == 0.0  # none has one


def test_a_value_given_twice_runs_once(model_dir, prompts, tmp_path, capsys):
    """--lookup 8,8 (or a width, tree, floor or graph given twice) ran two variants of one name: their rows
    merged in the summary, and with --turns each one's conversation took both variants' replies, so turn 2
    of a lossless run read identical_to_ar False."""
    args = bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--grid", "--widths", "2,1,2", "--lengths",
                             "3,3", "--lookup", "8,0,8", "--tree", "4,4", "--tree-min-prob", "0.2,0.2", "--graph",
                             "1,none,tree,1"])
    assert (args.widths, args.lengths, args.lookup, args.tree, args.tree_min_prob) == ([2, 1], [3], [8, 0], [4], [0.2])
    assert args.graph == [(1, True), (None, True)]
    out = tmp_path / "d.json"
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--limit", 1, "--max-tokens", 6, "--turns", 2,
                      "--modes", "ar,redrafter", "--lookup", "8,8", "--tree", 4, "--json", out)
    assert rc == 0
    report = json.loads(out.read_text())
    assert [(r["mode"], r["turn"]) for r in report["results"]] == [("ar", 1), ("redrafter", 1), ("ar", 2),
                                                                   ("redrafter", 2)]
    assert report["summary"]["redrafter"]["identical_to_ar"] is True


def test_mlx_lm_stops_at_the_context_as_ar_does(model_dir, tmp_path, capsys):
    """The mlx-lm column decoded past the model's context, where ar stops ("context"): a reply to a prompt
    near the context read as not identical to ar's."""
    path, out = tmp_path / "near.jsonl", tmp_path / "near.json"
    path.write_text(json.dumps({"question_id": 1, "turns": ["a " * 980]}) + "\n")  # 1000 of the 1024 tokens
    rc, _, _ = run(capsys, "--model", model_dir, "--prompts", path, "--max-tokens", 40, "--modes", "ar,mlx-lm",
                   "--json", out)
    assert rc == 0
    report = json.loads(out.read_text())
    ar, ref = report["results"]
    assert len(ar["prompt_tokens"]) + ar["new_tokens"] == 1025 and ar["finish_reason"] == "context"
    assert (ref["tokens"], ref["finish_reason"]) == (ar["tokens"], "context")
    assert report["summary"]["mlx-lm"]["identical_to_ar"] is True


def test_help_says_tune_runs_six_questions_unless_limit(capsys):
    """--tune runs the first 6 questions unless --limit: neither --help's --limit nor its --tune said so."""
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "only the first N questions (default: all; 6 with --tune)" in text
    assert "on the first 6 questions unless --limit" in text
    assert bench.parse_args(["--prompts", "x", "--tune"]).limit == 6
    assert bench.parse_args(["--prompts", "x"]).limit is None
    # --plot promised "acceptance plots"; it draws tokens emitted per step (the accepted-length histogram)
    assert "the fastest one's histogram of tokens emitted per step" in text and "acceptance plots" not in text
    # --model's default was "the registry default", a name --help gave nowhere; --plot's matplotlib was said only by
    # the error; --prompts PROMPTS and --modes MODES said neither the file's kind nor that modes are a list
    from redrafter_mlx.registry import default_model_name

    assert f"registry name, local path or hub id (default: {default_model_name()})" in text
    assert "needs matplotlib: pip install 'redrafter-mlx[bench]'" in text
    assert "--prompts FILE.jsonl" in text and "--modes MODE[,MODE...]" in text


def test_the_reports_settings_are_the_options_the_run_was_given(capsys):
    """The --json report's "settings" held "fixed", parse_args's own note of whether a drafting option was
    given: no option of that name, and not in the description of the JSON. Every key is an option."""
    from types import SimpleNamespace

    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    text = capsys.readouterr().out
    args = bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--beam-width", "2"])
    variants = [("ar", "ar", None, (None, True)), ("redrafter", "redrafter", (2, 4, 0, 0, 0.1), (None, True))]
    out = bench.settings(args, SimpleNamespace(weight_format="float32"), variants)
    assert out["beam_width"] == 2 and "fixed" not in out
    assert [key for key in out if f"--{key.replace('_', '-')}" not in text] == []


def test_replay_says_which_cost_model_cached_needs(tiny_loaded):
    # it said "run redrafter-bench --modes auto once", which caches the curve of the format "auto" resolves to
    # here, where replay loads the one the bench decoded with (a GPU's stored weights, say)
    from redrafter_mlx import replay

    with pytest.raises(RedrafterError) as e:
        replay.profile_costs("cached", tiny_loaded)
    fmt = bench.format_of(tiny_loaded.weight_format)
    assert f"run redrafter-bench --model {tiny_loaded.name} --weight-format {fmt} --modes auto once" in str(e.value)


def test_replay_help_gives_the_tree_floor_it_uses(capsys):
    # it wrote 0.2 out by hand, beside the constant's name, and --limit's metavar was LIMIT where the text says N
    from redrafter_mlx import replay

    with pytest.raises(SystemExit):
        replay.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"below P (default: {DEFAULT_MIN_PROB}, the tree search's)" in text and "--limit N only the first N" in text
    # --graph said "(needs --tree)", and --auto, which refuses --tree, said "--graph applies"; the help said nothing
    # of what replay prints, nor how to make the file it reads
    assert "(fixed shapes need a --tree above 0; --auto takes it alone; default: none)" in text
    assert replay.main(["no-such-bench.json", "--auto", "gpu", "--graph", "1"]) == 2  # (the file, not the options)
    assert "--tree" not in capsys.readouterr().err
    assert "Without --auto it prints, per drafting config, tokens/step" in text
    assert "example: redrafter-bench --modes ar --json bench.json, then python -m redrafter_mlx.replay bench.json" in text


def test_no_speedup_where_ar_timed_no_decode_step(model_dir, prompts, tmp_path, capsys):
    """With replies of one token (--max-tokens 1) no decode step is timed, and every mode's speedup read 0.00x,
    ar's over itself included; there is none to give, so the tables say '-', as without an ar run. The same for
    tokens/step and tok/s, which read 0.00."""
    out = tmp_path / "b.json"
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 1, "--modes", "ar,mlx-lm",
                        "--json", out)
    assert rc == 0 and "0.00x" not in text and "speedup      -" in text
    # each question's progress line as the table: it said "1 tokens, 0.00 tok/step, 0.00 tok/s"
    assert "  q81 ar: 1 token, - tok/step, - tok/s" in err and "0.00" not in err
    # nor a decode step's figures: they read "tok/s    0.00  tokens/step  0.00" (the report keeps its 0.0)
    assert "0.00" not in text and "tok/s       -  tokens/step     -" in text
    report = json.loads(out.read_text())
    assert not any("speedup" in s for s in report["summary"].values())
    assert not any("speedup" in v for cat in report["categories"].values() for v in cat.values())


def test_an_output_that_is_not_a_regular_file_is_refused(tmp_path, capsys, monkeypatch):
    """The report is written to a file beside --json and renamed over it, which replaced a pipe or a device
    there with a regular file: --json /dev/stdout, as root, replaced /dev/stdout for every process."""
    import stat

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for flag in ("--json", "--plot"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--grid", flag, str(fifo)])
        assert f"argument {flag}: {fifo} is not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    # "-", the usual standard output, made a file named "-" in the current folder
    monkeypatch.chdir(tmp_path)
    for flag in ("--json", "--plot"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--prompts", "x", "--modes", "ar,redrafter", "--grid", flag, "-"])
        assert f"argument {flag}: '-' is not standard output here" in capsys.readouterr().err
    assert bench.parse_args(["--prompts", "x", "--json", "./-"]).json.name == "-"  # a file of that name, said so


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux's /dev/stdout, a link to an open file")
def test_json_naming_standard_output_redirected_to_a_file_is_refused(tmp_path):
    """On Linux /dev/stdout is a link, through /proc/self/fd/1, to what the shell redirected to: with `>> log`
    a regular file, so it passed, and the report, renamed over it, replaced the log (what it held lost, and the
    table printed into the file set aside). Refused while parsing, the log as it was; a pipe was refused already."""
    import subprocess
    import sys
    from pathlib import Path

    log = tmp_path / "log.txt"
    log.write_text("an earlier run's lines\n")
    code = "import sys; from redrafter_mlx import bench; sys.exit(bench.main(sys.argv[1:]))"
    for path in ("/dev/stdout", "/proc/self/fd/1", "/dev/fd/1"):
        with open(log, "a") as out:
            proc = subprocess.run([sys.executable, "-c", code, "--prompts", "x", "--json", path], stdout=out,
                                  stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert f"argument --json: {path} names a file the command has open (its standard output" in proc.stderr
        assert log.read_text() == "an earlier run's lines\n"
    assert [p.name for p in tmp_path.iterdir()] == ["log.txt"]


def test_tune_prefers_plain_decoding_when_it_is_faster():
    shape = {"beam_width": 2, "beam_length": 3, "tokens_per_second": 10.0}
    assert bench.tuned_default({"ar": {"tokens_per_second": 9.0}, "redrafter@2x3": shape}, shape) == (2, 3, False)
    assert bench.tuned_default({"ar": {"tokens_per_second": 11.0}, "redrafter@2x3": shape}, shape) == (1, 1, True)
    assert bench.tuned_default({"redrafter@2x3": shape}, shape) == (2, 3, False)  # no ar to compare with


def test_cli_reports_settings_out_of_range(model_dir, capsys, monkeypatch):
    """Out-of-range options are refused while parsing, in the flag's words, before any model loads."""
    from redrafter_mlx import loader
    from redrafter_mlx.__main__ import main as cli

    real_load = loader.load
    monkeypatch.setattr(loader, "load", lambda *a, **k: pytest.fail("loaded a model for a bad option"))
    for flag, value, said in (("--lookup", "-1", "argument --lookup: must be at least 0, not -1"),
                              ("--tree", "-2", "argument --tree: must be at least 0"),
                              ("--tree-min-prob", "0", "argument --tree-min-prob: must be in (0, 1]"),
                              ("--graph", "-1", "argument --graph: must be at least 0"),
                              ("--max-tokens", "0", "argument --max-tokens: must be at least 1"),
                              ("--beam-width", "two", "argument --beam-width: expected an integer, not 'two'"),
                              ("--seed", "-1", "argument --seed: must be from 0"),
                              ("--temperature", "nan", "argument --temperature: expected a finite number"),
                              ("--top-p", "1.5", "argument --top-p: must be in (0, 1]"),
                              ("--weight-format", "int3", "argument --weight-format: invalid choice")):
        with pytest.raises(SystemExit) as exit_:
            cli(["--model", str(model_dir), flag, value, "hello"])
        assert exit_.value.code == 2
        assert said in capsys.readouterr().err
    for argv, said in ((["  "], "the prompt is empty"), (["\u200b\u2060"], "the prompt is empty"),
                       (["--mode", "redrafter", "--no-drafter", "hi"], "--no-drafter")):
        with pytest.raises(SystemExit):
            cli(["--model", str(model_dir), *argv])
        assert said in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(" \n"))  # - reads the prompt from standard input
    with pytest.raises(SystemExit):
        cli(["--model", str(model_dir), "-"])
    assert "the prompt is empty" in capsys.readouterr().err
    monkeypatch.setattr(loader, "load", real_load)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello"))
    assert cli(["--model", str(model_dir), "--max-tokens", "4", "--mode", "ar", "-"]) == 0
    assert "(%d tokens)" % len(loader.load(str(model_dir)).tokenizer.prompt_ids("hello")) in capsys.readouterr().err
    assert cli(["--model", str(model_dir), "--max-tokens", "4", "--tree", "3", "--tree-min-prob", "0.5", "hello"]) == 0
    assert "tree=3" in capsys.readouterr().err
    # a width alone is refused once the model has loaded (the length is the tuned one, else the default), saying so
    assert cli(["--model", str(model_dir), "--beam-width", "1000", "hello"]) == 2
    assert "error: beams of 1000 x 4 tokens (beam_length not given: the default) draft 3000" in capsys.readouterr().err
    # A graph over beams the options name is refused while parsing; over the beams a lookup alone fixes (the
    # tree is then the tuned one, known after loading: none here) only the library can say it: one line, status 2.
    with pytest.raises(SystemExit):
        cli(["--model", str(model_dir), "--max-tokens", "4", "--beam-width", "2", "--tree", "0", "--graph", "1", "hi"])
    assert "--graph drafts a dynamic tree" in capsys.readouterr().err
    assert cli(["--model", str(model_dir), "--max-tokens", "4", "--lookup", "4", "--graph", "1", "hello"]) == 2
    err = capsys.readouterr().err
    assert "graph drafting needs a dynamic tree" in err and "Traceback" not in err
    assert cli(["--model", str(model_dir), "--max-tokens", "6", "--graph", "1", "hello"]) == 0
    err = capsys.readouterr().err
    assert "adaptive:" in err and "graph:" in err  # the graph's figures come beside auto's, not instead


def test_an_interrupted_run_reports_the_questions_it_finished(model_dir, prompts, tmp_path, capsys, monkeypatch,
                                                              ctrl_c_raises):
    out = tmp_path / "b.json"
    real = bench.run_one

    def stopping(loaded, prompt, mode, *a, **kw):  # Ctrl-C during the second question's redrafter run
        if prompt == QUESTIONS[1]["turns"][0] and mode != "ar":
            signal.raise_signal(signal.SIGINT)
        return real(loaded, prompt, mode, *a, **kw)

    monkeypatch.setattr(bench, "run_one", stopping)
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--modes", "ar,redrafter",
                        "--beam-width", 2, "--beam-length", 3, "--json", out)
    # on a line of its own, after the one where the terminal echoed "^C" (it ran on after the "^C")
    assert rc == 130 and " tok/s\n\nredrafter-bench: interrupted after 1 of 3 questions; reporting those\n" in err
    report = json.loads(out.read_text())
    assert report["complete"] is False
    assert [(r["question_id"], r["mode"]) for r in report["results"]] == [(81, "ar"), (81, "redrafter")]
    assert report["summary"]["redrafter"]["questions"] == 1 and "redrafter" in text  # the table of what ran
    assert not list(tmp_path.glob(".b.json.*"))  # written atomically: no temporary left behind
    monkeypatch.setattr(bench, "run_one", real)
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--modes", "ar",
               "--json", out)[0] == 0
    assert json.loads(out.read_text())["complete"] is True

    def terminated(loaded, prompt, mode, *a, **kw):  # `kill` (SIGTERM) during the third question
        if prompt == QUESTIONS[2]["turns"][0]:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(loaded, prompt, mode, *a, **kw)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(bench, "run_one", terminated)
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--modes", "ar",
                        "--json", out)
    assert rc == 143 and "terminated (SIGTERM) after 2 of 3 questions" in err and "ar" in text
    assert " tok/s\nredrafter-bench: terminated" in err  # (no "^C" to leave: no blank line)
    report = json.loads(out.read_text())
    assert report["complete"] is False and [r["question_id"] for r in report["results"]] == [81, 82]
    assert signal.getsignal(signal.SIGTERM) is before  # the bench's handler is gone once it returns


def test_a_run_stopped_before_its_first_question_leaves_no_earlier_report(model_dir, prompts, tmp_path, capsys,
                                                                         monkeypatch):
    # the --json file of an earlier run stayed as it was, "complete": true with its figures, though this run
    # had been stopped (status 143) and said it was "reporting those"
    out = tmp_path / "b.json"
    assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8, "--modes", "ar",
               "--json", out)[0] == 0
    assert json.loads(out.read_text())["complete"] is True
    real = bench.run_one

    def terminated(loaded, prompt, mode, *a, **kw):  # `kill` during the first question (after the warm-up)
        if prompt != "Hello":
            os.kill(os.getpid(), signal.SIGTERM)
        return real(loaded, prompt, mode, *a, **kw)

    monkeypatch.setattr(bench, "run_one", terminated)
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 8,
                        "--modes", "ar,redrafter", "--beam-width", 2, "--beam-length", 3, "--json", out)
    assert rc == 143 and "before the first question finished; nothing to report" in err
    report = json.loads(out.read_text())
    assert report["complete"] is False and report["results"] == []
    assert report["summary"]["redrafter"]["questions"] == 0
    assert "identical_to_ar" not in report["summary"]["redrafter"]  # (no output to compare)
    from redrafter_mlx import replay

    assert replay.main([str(out), "--model", str(model_dir)]) == 2  # (it said: run with --modes ar)
    err = capsys.readouterr().err
    assert "holds no results: its redrafter-bench run stopped before the first question finished" in err


def test_a_run_stopped_while_its_model_loads_says_it_wrote_nothing(model_dir, prompts, tmp_path, capsys, monkeypatch):
    # Ctrl-C while the model loaded left an earlier run's --json report as it was, "complete": true, and said only
    # "cancelled" (as if this run's); SIGTERM there ended the process saying nothing; during the warm-up, after the
    # report was started, it said "cancelled" (and a SIGTERM nothing) where the first question says what was kept
    from redrafter_mlx import loader

    out = tmp_path / "b.json"
    out.write_text('{"complete": true, "results": []}')  # an earlier run's report
    before, real_load = signal.getsignal(signal.SIGTERM), loader.load

    def stopped(*a, **k):
        raise KeyboardInterrupt

    def killed(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)

    argv = ("--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--modes", "ar")
    for stub, status, why in ((stopped, 130, "interrupted"), (killed, 143, "terminated (SIGTERM)")):
        monkeypatch.setattr(loader, "load", stub)
        rc, _, err = run(capsys, *argv, "--json", out)
        assert rc == status and err.strip() == (f"redrafter-bench: {why} before the first question began; nothing "
                                                f"written to {out} (the file there is an earlier run's)")
        assert out.read_text() == '{"complete": true, "results": []}'
        assert signal.getsignal(signal.SIGTERM) is before
    rc, _, err = run(capsys, *argv, "--json", tmp_path / "new.json")
    assert rc == 143 and err.strip().endswith(f"nothing written to {tmp_path / 'new.json'}")
    assert not (tmp_path / "new.json").exists()
    monkeypatch.setattr(loader, "load", real_load)
    real = bench.run_one

    def warm_up_killed(loaded, prompt, *a, **kw):
        if prompt == "Hello":
            os.kill(os.getpid(), signal.SIGTERM)
        return real(loaded, prompt, *a, **kw)

    monkeypatch.setattr(bench, "run_one", warm_up_killed)
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--modes", "auto",
                     "--json", out)
    assert rc == 143 and "terminated (SIGTERM) before the first question finished; nothing to report" in err
    assert json.loads(out.read_text())["complete"] is False  # this run's, with no results


def test_ctrl_c_while_the_model_loads_is_said_on_a_line_of_its_own_with_no_blank_line_under_a_closed_bar(
        model_dir, prompts, capsys, monkeypatch, ctrl_c_raises):
    """The bench's own message after Ctrl-C while its model loaded began with a newline, whatever came before it:
    under a download's bar closed on the way out (tqdm ends its line) it left a blank line. It follows cli.run's rule
    (test_cli's test_ctrl_c_is_said_on_a_line_of_its_own_...): a newline only where the line was not ended since
    Ctrl-C (the terminal's "^C", a bar left mid-line); none after a SIGTERM that follows an ended line."""
    import sys

    from helpers import closes_its_bar, leaves_its_bar, said_a_line_then_ctrl_c

    from redrafter_mlx import loader

    def said_a_line_then_sigterm(*a, **k):  # nothing echoed: the next line is free
        print("loading the model", file=sys.stderr)
        os.kill(os.getpid(), signal.SIGTERM)

    said = "before the first question began\n"
    for load, status, err in (
            (closes_its_bar, 130, f"\rfetch 0/4\rfetch 1/4\rfetch 1/4\nredrafter-bench: interrupted {said}"),
            (leaves_its_bar, 130, f"\rfetch 1/4\nredrafter-bench: interrupted {said}"),
            (said_a_line_then_ctrl_c, 130, f"loading the model\n\nredrafter-bench: interrupted {said}"),
            (said_a_line_then_sigterm, 143, f"loading the model\nredrafter-bench: terminated (SIGTERM) {said}")):
        monkeypatch.setattr(loader, "load", load)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--modes", "ar") \
            == (status, "", err), load.__name__


def test_turns_run_each_question_as_a_conversation(model_dir, prompts, tmp_path, capsys):
    from redrafter_mlx import replay

    out = tmp_path / "t.json"
    rc, text, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 10, "--turns", 2,
                      "--modes", "ar,redrafter", "--beam-width", 2, "--beam-length", 3, "--json", out)
    assert rc == 0
    report = json.loads(out.read_text())
    rows = report["results"]
    # q81 has two turns, the others one; each turn runs in every mode before the next turn
    assert [(r["question_id"], r["turn"], r["mode"]) for r in rows] == [
        (81, 1, "ar"), (81, 1, "redrafter"), (81, 2, "ar"), (81, 2, "redrafter"),
        (82, 1, "ar"), (82, 1, "redrafter"), (83, 1, "ar"), (83, 1, "redrafter")]
    tok = load(str(model_dir)).tokenizer
    for mode in ("ar", "redrafter"):  # turn 2 is asked after the mode's own first reply
        first, second = [r for r in rows if r["question_id"] == 81 and r["mode"] == mode]
        assert first["prompt_tokens"] == tok.prompt_ids(QUESTIONS[0]["turns"][0])
        assert second["prompt_tokens"] == tok.prompt_ids([
            {"role": "user", "content": QUESTIONS[0]["turns"][0]},
            {"role": "assistant", "content": tok.decode(first["tokens"])},
            {"role": "user", "content": "again"}])
    assert report["summary"]["redrafter"]["identical_to_ar"] is True
    # 3 questions, 4 replies: "questions" had counted the rows, turns included
    assert report["summary"]["redrafter"]["questions"] == 3 and report["summary"]["redrafter"]["replies"] == 4
    assert set(report["turns"]) == {"turn 1", "turn 2"}
    assert any(line.split()[:2] == ["81/2", "writing"] for line in text.splitlines())
    assert replay.main([str(out), "--model", str(model_dir), "--shapes", "2x3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("config"))
    assert header.split()[-4:] == ["turn", "1", "turn", "2"]  # per-turn columns after the categories'

    # a later turn that no longer fits the context is left out in every mode, with a message
    long = " ".join(["the sea"] * 2000)
    n = len(tok.prompt_ids(long))
    words = int(2000 * 950 / n)  # a first turn of ~950 of the tiny model's 1024 tokens
    f = tmp_path / "long.jsonl"
    f.write_text(json.dumps({"question_id": 1, "category": "x", "turns": [" ".join(["the sea"] * words), "more"]}) + "\n")
    rc, text, err = run(capsys, "--model", model_dir, "--prompts", f, "--max-tokens", 80, "--turns", 2,
                        "--modes", "ar,redrafter", "--beam-width", 2, "--beam-length", 3, "--json", out)
    assert rc == 0 and "turn 2" in err and "left out" in err
    # in the bench's words (it gave the chat's advice: "shorten the conversation or start a new chat")
    assert "q1 turn 2 ar: the conversation has" in err and "start a new chat" not in err
    assert "left out (a smaller --max-tokens leaves room for more)" in err
    assert [(r["turn"], r["mode"]) for r in json.loads(out.read_text())["results"]] == [(1, "ar"), (1, "redrafter")]
    f.write_text(json.dumps({"question_id": 1, "category": "x", "turns": [long, "more"]}) + "\n")
    rc, _, err = run(capsys, "--model", model_dir, "--prompts", f, "--turns", 2)  # a first turn too long
    assert rc == 2 and "context of 1024" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "x", "--turns", "0"])


def test_a_sampled_reports_seed_gives_its_replies_again(model_dir, prompts, tmp_path, capsys):
    """The --json report of a sampled run holds the seed its replies were drawn with ("settings" and each of our
    rows), and that seed gives a row's reply again; a greedy run's said "seed": 0, where nothing was drawn."""
    from redrafter_mlx import generate, load

    out = tmp_path / "s.json"
    rc, _, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 10, "--limit", 2,
                   "--modes", "ar,auto", "--temperature", "1.5", "--json", out)
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["settings"]["seed"] == 0  # (the default)
    rows = report["results"]
    assert [r["seed"] for r in rows] == [0] * len(rows) == [0] * 4
    m = load(str(model_dir))
    others = []
    for r in rows:
        question = next(q for q in QUESTIONS if q["question_id"] == r["question_id"])["turns"][0]
        assert generate(m, question, max_tokens=10, temperature=1.5, seed=r["seed"]).tokens == r["tokens"]
        others.append(generate(m, question, max_tokens=10, temperature=1.5, seed=r["seed"] + 1).tokens != r["tokens"])
    assert any(others)  # the premise: another seed draws other replies here (else any seed "gave the reply again")
    rc, _, _ = run(capsys, "--model", model_dir, "--prompts", prompts, "--max-tokens", 4, "--limit", 1, "--json", out)
    report = json.loads(out.read_text())
    assert report["settings"]["seed"] is None and all("seed" not in r for r in report["results"])



def test_help_example_runs_on_an_installed_package(tmp_path, monkeypatch, capsys):
    # The --help example read prompts from ../shared/data/mt_bench.jsonl, the project's own folder beside a
    # checkout: from a pip install it ended "prompt file ../shared/data/mt_bench.jsonl not found".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        bench.parse_args(["--help"])
    example = " ".join(capsys.readouterr().out.split("example: redrafter-bench", 1)[1].split())
    args = bench.parse_args(example.split("(", 1)[0].split())
    assert bench.read_prompts(args.prompts, args.limit, args.turns)
