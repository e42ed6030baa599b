"""``ddl tasks`` end to end on a micro setting: the table and JSON, resuming without retraining, paired seeds,
and clear errors for a bad task, variant or --set."""

import json

import numpy as np
import pytest
import torch

import deep_delta.experiments.task_runs as task_runs
import deep_delta.experiments.tasks as task_study
from deep_delta.cli.main import main
from deep_delta.experiments.settings import TaskSettings, model_config
from deep_delta.tasks import data_rng, get_task
from deep_delta.tasks.evaluation import evaluate
from helpers import with_options

MICRO = ["--steps", "4", "--threads", "1", "--no-progress", "--set", "test_size=48", "--set", "eval_size=16",
         "--set", "eval_every=2", "--set", "log_every=2", "--set", "warmup_steps=1", "--set", "batch_size=8",
         "--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
         "model.num_attention_heads=2"]


def run_micro(tmp_path, *extra):
    return main(["tasks", "run", "shell-game", "--variants", "baseline", "ddl-dv1", "--seeds", "1", "--out",
                 str(tmp_path), *MICRO, *extra])


def test_run_writes_table_and_json_then_resumes_without_training(tmp_path, capsys, monkeypatch):
    assert run_micro(tmp_path) == 0
    # G9: the figure is named with its folder, as the other files are
    assert f"wrote {tmp_path}/tasks.md, {tmp_path}/tasks.json, {tmp_path}/tasks.png\n" in capsys.readouterr().out
    summary = json.loads((tmp_path / "tasks.json").read_text())
    assert [r["variant"] for r in summary["rows"]] == ["baseline", "ddl-dv1"]
    for row in summary["rows"]:
        assert row["seeds"] == [0] and len(row["overall_per_seed"]) == 1
        assert set(row["by_difficulty"]) == {str(level) for level in range(1, 9)}
        assert all(len(cell["per_seed"]) == 1 for cell in row["by_difficulty"].values())
    record = json.loads((tmp_path / "ddl-dv1-seed0.json").read_text())
    assert record["steps_done"] == 4 and record["accuracy"]["total"] == 48 * 8
    table = (tmp_path / "tasks.md").read_text()
    assert "| DDL (d_v=1) |" in table and "| chance | 20.0 |" in table
    assert (tmp_path / "tasks.png").stat().st_size > 0
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*-seed*.json")}

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(task_study, "train_one", no_training)
    capsys.readouterr()
    assert run_micro(tmp_path) == 0
    assert "reusing 2 finished result(s)" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*-seed*.json")} == before
    # other settings in the same directory are refused, naming what differs
    assert run_micro(tmp_path, "--set", "lr=0.01") == 2
    err = capsys.readouterr().err
    # the one setting that differs, not both whole settings (round 5, TK1)
    assert "(settings.lr: file has 0.002, now 0.01)" in err and "'preset'" not in err, err


def test_beta_max_reaches_the_model(tmp_path):
    assert main(["tasks", "run", "pointer-chase", "--variants", "ddl-dv1", "--seeds", "1", "--out", str(tmp_path),
                 *MICRO, "--set", "model.beta_max=1", "--set", "model.beta_init=0.5"]) == 0
    record = json.loads((tmp_path / "ddl-dv1-seed0.json").read_text())
    assert record["model_config"]["beta_max"] == 1 and record["settings"]["model"]["beta_max"] == 1


@pytest.mark.parametrize("argv, expected", [
    (["tasks", "run", "nope"], "`task` got 'nope'; allowed: shell-game | pointer-chase | recall | flip-flop"),
    (["tasks", "run", "recall", "--variants", "ddl-xx"], "--variants got 'ddl-xx'; allowed: one or more of baseline"),
    (["tasks", "run", "recall", "--set", "model.hidden_sise=8"],
     "--set got 'model.hidden_sise=8': DDLConfig has no field 'hidden_sise'; allowed model fields: "),
    (["tasks", "run", "recall", "--set", "model.beta_max=3"], "`beta_max` got 3.0; allowed: "),
    (["tasks", "run", "recall", "--set", "stepz=3"], "--set got 'stepz=3': no setting 'stepz'; allowed: batch_size"),
    (["tasks", "run", "recall", "--steps", "0"], "--steps got 0; allowed: an integer >= 1"),
    (["tasks", "run", "recall", "--set", "task.num_pairs=40"], "`num_pairs` got 40; allowed: at most num_keys=16"),
    (["tasks", "run", "recall", "--seeds", "0"], "--seeds got [0]; allowed: a count N >= 1"),
    # task spaces too small to fill the test set (before: RuntimeError, a traceback)
    (["tasks", "run", "shell-game", "--set", "task.num_cups=2", "--set", "task.num_swaps=1", "--set",
      "test_size=48"], "task shell-game (num_cups=2, num_swaps=1): could not draw 48 test sequences"),
    (["tasks", "run", "pointer-chase", "--set", "task.num_symbols=2", "--set", "task.num_hops=1", "--set",
      "test_size=48"], "these parameters allow too few distinct sequences to fill the test split"),
])
def test_bad_input_names_the_field(argv, expected, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert not (tmp_path / "out").exists()


def test_list_shows_every_task(capsys):
    assert main(["tasks", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("shell-game", "pointer-chase", "recall", "flip-flop"):
        assert f"{name}:" in out
    assert "chance 20.0%" in out and "BOS s SEP i1 j1 ... im jm" in out


def test_seed_pairs_data_and_initialisation_across_variants():
    """Seed s: the same training batches for every variant; the same initial weights where shapes agree."""
    task = get_task("shell-game")
    a = task.generate(data_rng(2, f"{task.name}/train"), 32)
    b = task.generate(data_rng(2, f"{task.name}/train"), 32)
    assert np.array_equal(a.inputs, b.inputs)
    settings = TaskSettings().with_values(model={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2})
    m1 = task_runs.build_model(task, "baseline", 2, settings)
    m2 = task_runs.build_model(task, "baseline", 2, settings)
    m3 = task_runs.build_model(task, "baseline", 3, settings)
    emb = "model.embed_tokens.weight"
    assert torch.equal(m1.state_dict()[emb], m2.state_dict()[emb])
    assert not torch.equal(m1.state_dict()[emb], m3.state_dict()[emb])


def test_untrained_model_is_near_chance():
    task = get_task("pointer-chase")
    settings = TaskSettings().with_values(model={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2})
    torch.manual_seed(0)
    from deep_delta.models import DDLForCausalLM

    model = DDLForCausalLM(model_config(task, "ddl-dv1", settings))
    result = evaluate(model, task, task.test_set(0, 300), torch.device("cpu"))
    # argmax over the whole vocabulary (20 tokens, 16 of them symbols): at most about chance, and not solved
    assert result["overall"] < 2 * task.chance and result["total"] == 300 * 5


def test_an_lr_grid_keeps_every_run_with_its_lr_and_chooses_on_validation(tmp_path, capsys):
    lrs = [1e-3, 4e-3]
    assert run_micro(tmp_path, "--lrs", *map(str, lrs)) == 0
    summary = json.loads((tmp_path / "tasks.json").read_text())
    chosen = summary["lr_selection"]["chosen"]
    for row in summary["rows"]:
        v = row["variant"]
        records = {lr: json.loads((tmp_path / f"lr_{lr:g}" / f"{v}-seed0.json").read_text()) for lr in lrs}
        assert all(r["settings"]["lr"] == lr for lr, r in records.items())
        best = max(lrs, key=lambda lr: records[lr]["validation"]["overall"])  # a tie keeps the first
        assert row["lr"] == chosen[v]["lr"] == best
        assert row["overall_per_seed"] == [records[best]["accuracy"]["overall"]]
    assert len(summary["lr_grid"]) == 2 * 2 and summary["settings"]["lr"] is None
    report = (tmp_path / "tasks.md").read_text()
    assert "chosen on the validation accuracy alone" in report
    assert "The validation set: 16 held-out sequences of the train split, never the test set." in report
    assert (tmp_path / "lr_sensitivity.png").stat().st_size > 0 and (tmp_path / "lr_0.001" / "tasks.md").is_file()
    before = {p: p.read_bytes() for p in tmp_path.glob("lr_*/*-seed0.json")}
    assert run_micro(tmp_path, "--lrs", *map(str, lrs)) == 0  # a rerun trains nothing
    assert {p: p.read_bytes() for p in tmp_path.glob("lr_*/*-seed0.json")} == before
    printed = capsys.readouterr().out
    assert "validation accuracy (%) at every lr" in printed
    assert f"{tmp_path}/tasks.png, {tmp_path}/lr_sensitivity.png\n" in printed


@pytest.mark.parametrize("extra, expected", [
    (["--lrs", "1e-3", "--set", "lr=2e-3"], "--lrs got 0.001 together with one learning rate (--set lr=2e-3)"),
    (["--lrs", "1e-3", "0"], "--lrs got [0.0] (not a finite number > 0)"),
    (["--lrs", "2e-3", "2e-3"], "--lrs got [0.002] more than once"),
])
def test_a_bad_lr_grid_is_refused(extra, expected, capsys, tmp_path):
    assert main(["tasks", "run", "recall", *extra, "--out", str(tmp_path / "out")]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_validation_set_is_held_out_training_distribution_never_test():
    from deep_delta.tasks import split_of
    from deep_delta.tasks.evaluation import validation_set

    task, settings = get_task("shell-game"), TaskSettings(eval_size=64, test_size=64)
    validation = validation_set(task, settings.test_seed, settings.eval_size)
    assert len(validation) == 64 and all(split_of(row) == "train" for row in validation.inputs)
    test = {row.tobytes() for row in task.test_set(settings.test_seed, settings.test_size).inputs}
    assert not any(row.tobytes() in test for row in validation.inputs)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished micro study (one variant, one seed): its directory and the result file's text."""
    out = tmp_path_factory.mktemp("study")
    assert main(["tasks", "run", "shell-game", "--variants", "ddl-dv1", "--seeds", "1", "--out", str(out),
                 *MICRO]) == 0
    return out, (out / "ddl-dv1-seed0.json").read_text()


def _edit_and_rerun(finished, capsys, edit):
    out, text = finished
    record = json.loads(text)
    edit(record)
    (out / "ddl-dv1-seed0.json").write_text(json.dumps(record, indent=1))
    capsys.readouterr()
    try:
        code = main(["tasks", "run", "shell-game", "--variants", "ddl-dv1", "--seeds", "1", "--out", str(out),
                     *MICRO])
    finally:
        (out / "ddl-dv1-seed0.json").write_text(text)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def test_an_accuracy_edited_by_hand_is_refused(finished, capsys):
    """Before: a result whose accuracy was raised by hand (counts left alone) was reported as it was."""

    def raise_accuracy(record):
        record["accuracy"]["overall"] = 0.99

    code, err = _edit_and_rerun(finished, capsys, raise_accuracy)
    assert code == 2 and "do not match its `checksum`" in err and "ddl-dv1-seed0.json" in err


@pytest.mark.parametrize("edit, says", [
    (lambda r: r["accuracy"].__setitem__("overall", 0.99), "field 'accuracy.overall' got 0.99; allowed: "),
    (lambda r: r["accuracy"].__setitem__("overall", None), "field 'accuracy.overall' got None"),
    (lambda r: r["accuracy"]["by_difficulty"].pop("3"), "field 'accuracy.by_difficulty.3' got None"),
    (lambda r: r["accuracy"]["by_difficulty"]["2"].__setitem__("correct", 10**6),
     "field 'accuracy.by_difficulty.2.accuracy' got"),
    (lambda r: r.pop("train_s"), "field 'train_s' got None; allowed: a number"),
], ids=["accuracy-raised", "accuracy-null", "level-missing", "count-changed", "field-missing"])
def test_a_result_without_a_checksum_is_checked_against_its_counts(finished, capsys, edit, says):
    """Results written before checksums (or with it removed) are checked field by field: a JSON that parses but
    lacks fields or whose accuracy disagrees with its counts is a one-line error, not a KeyError / TypeError."""

    def without_checksum(record):
        record.pop("checksum")
        edit(record)

    code, err = _edit_and_rerun(finished, capsys, without_checksum)
    assert code == 2 and says in err and "delete it, or retrain it with --overwrite" in err, err


def test_an_untouched_result_without_a_checksum_is_reused(finished, capsys, monkeypatch):
    monkeypatch.setattr(task_study, "train_one", lambda *a, **k: pytest.fail("a finished run was trained again"))
    code, _ = _edit_and_rerun(finished, capsys, lambda r: r.pop("checksum"))
    assert code == 0


@pytest.mark.parametrize("blocked", ["ddl-dv1-seed0.json", "tasks.md"])
def test_a_result_path_that_is_a_directory_is_refused_before_training(tmp_path, capsys, monkeypatch, blocked):
    """Before: found by the write after the whole run had trained."""
    monkeypatch.setattr(task_study, "train_one", lambda *a, **k: pytest.fail("trained before the outputs were checked"))
    (tmp_path / blocked).mkdir()
    assert run_micro(tmp_path) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / blocked} is a directory" in err and "Traceback" not in err


def test_sigterm_keeps_every_finished_result_and_says_how_to_continue(tmp_path):
    """Before: SIGTERM killed `ddl tasks run` silently, the run in progress lost with no word of what was kept."""
    import os
    import signal
    import subprocess
    import sys
    import time

    argv = with_options(["tasks", "run", "shell-game", "--variants", "baseline", "ddl-dv1", "--seeds", "1", "--out",
                         str(tmp_path), *MICRO], "--steps", "400")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "deep_delta.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    first = tmp_path / "baseline-seed0.json"
    deadline = time.monotonic() + 180
    while not (tmp_path / "tasks.md").is_file():  # the summary after the first run: the second is starting
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first run did not finish"
        time.sleep(0.05)
    time.sleep(1.0)  # well inside the second run's 400 steps
    kept = first.read_bytes()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM; the run in progress (ddl-dv1 seed 0) is lost; 1 finished result(s) are kept" in err, err
    assert f"Continue with: ddl {' '.join(argv[:4])}" in err and "Traceback" not in err
    assert first.read_bytes() == kept and not (tmp_path / "ddl-dv1-seed0.json").exists()


def test_an_out_inside_a_prepared_data_directory_is_refused(tmp_path, capsys):
    """`ddl data prepare --overwrite` replaces a data directory whole: a study written inside it would go with it."""
    from deep_delta.data import ByteTokenizer, write_dataset

    data = tmp_path / "data"
    write_dataset(["some text " * 50], ByteTokenizer(), data, val_fraction=0)
    assert run_micro(data / "study") == 2
    err = capsys.readouterr().err
    assert f"--out got {data / 'study'}, which is inside {data}, a prepared data directory" in err, err
    assert not (data / "study").exists()


def test_an_lr_grid_checks_every_lrs_stored_results_before_training(finished, tmp_path, capsys):
    _, text = finished  # a result made at the default lr 2e-3, put where the grid keeps its lr 4e-3 runs
    (tmp_path / "lr_0.004").mkdir()
    (tmp_path / "lr_0.004" / "ddl-dv1-seed0.json").write_text(text)
    assert main(["tasks", "run", "shell-game", "--variants", "ddl-dv1", "--seeds", "1", "--out", str(tmp_path),
                 *MICRO, "--lrs", "1e-3", "4e-3"]) == 2
    err = capsys.readouterr().err
    assert "lr_0.004/ddl-dv1-seed0.json" in err and "0.002" in err and "0.004" in err, err
    assert not (tmp_path / "lr_0.001").exists()  # nothing trained
