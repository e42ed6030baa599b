"""One check of a finished run (issue 58 item 1), shared by plain ``ddl compare`` reusing it and ``--report-only``:
a run is reused only when its record and its metrics agree, it trained one schedule of its claimed length, its
checkpoint's own record says what run.json says, and its model is its variant's; otherwise one line names the file.
The cases are the probe's (round 5, sections 2 and 3: U10-U25, RN1-RN3)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from tests.experiments.test_compare_lr_grid import MODEL
from tests.experiments.test_compare_report_only import _copy
from tests.experiments.test_compare_report_only import _edit_run as _edit

from deep_delta.cli.main import main
from deep_delta.train.metrics import read_metrics


def study(out, data, *extra, steps=4):
    """baseline and ddl-dv1, validated every 2 steps."""
    return ["compare", "--variants", "baseline", "ddl-dv1", "--out", str(out), "--data", str(data), "--steps",
            str(steps), "--batch-size", "2", "--seq-len", "16", "--eval-every", "2", "--eval-batches", "1",
            "--warmup-steps", "0", "--device", "cpu", "--threads", "1", "--no-progress", "--time-repeats", "0", *MODEL,
            *extra]


@pytest.fixture(scope="module")
def two_seeds(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("check") / "cmp"
    assert main(study(out, data_dir, "--seeds", "2")) == 0
    return out


def _refused(argv, capsys, *expected):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for text in expected:
        assert text in err, err
    return err


def _rerun(out, data, capsys, *expected, extra=()):
    """The study's own command again (RR) is refused before anything trains, naming ``expected``; so is
    ``--report-only`` of the same directory."""
    before = {p: p.read_bytes() for p in out.rglob("metrics.jsonl")}
    _refused(study(out, data, "--seeds", "2", *extra), capsys, *expected)
    assert {p: p.read_bytes() for p in out.rglob("metrics.jsonl")} == before
    if not extra:
        _refused(["compare", "--out", str(out), "--report-only"], capsys, *expected[:1])


def test_a_torn_final_validation_is_refused(tmp_path, data_dir, two_seeds, capsys):  # U14
    out = _copy(two_seeds, tmp_path)
    path = out / "seed_1" / "ddl-dv1" / "metrics.jsonl"
    path.write_text(path.read_text()[:-20])
    _rerun(out, data_dir, capsys, "seed_1/ddl-dv1/metrics.jsonl, line", "truncated or damaged")


def test_deleted_metrics_are_refused(tmp_path, data_dir, two_seeds, capsys):  # U15
    out = _copy(two_seeds, tmp_path)
    (out / "seed_1" / "ddl-dv1" / "metrics.jsonl").unlink()
    _rerun(out, data_dir, capsys, "seed_1/ddl-dv1/metrics.jsonl is missing")


def test_a_missing_intermediate_validation_is_refused(tmp_path, data_dir, two_seeds, capsys):  # RN3
    out = _copy(two_seeds, tmp_path)
    path = out / "seed_1" / "ddl-dv1" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(x for x in lines if not ('"val_loss"' in x and json.loads(x)["step"] == 2)) + "\n")
    _rerun(out, data_dir, capsys, "seed_1/ddl-dv1/metrics.jsonl has no validation record at step 2")


def test_an_end_past_the_run_is_refused(tmp_path, data_dir, two_seeds, capsys):  # U20
    out = _copy(two_seeds, tmp_path)
    _edit(out / "seed_0" / "ddl-dv1", lambda r: r["finished"].update(step=100))
    _rerun(out, data_dir, capsys, "seed_0/ddl-dv1/run.json: finished.step is 100, but the run's train_config.steps is 4")


def test_a_record_its_checkpoint_contradicts_is_refused(tmp_path, data_dir, two_seeds, capsys):  # U19
    out = _copy(two_seeds, tmp_path)
    for run in out.glob("seed_*/*"):
        _edit(run, lambda r: r["train_config"].update(lr=5e-3))
    _rerun(out, data_dir, capsys, "does not describe its own checkpoint", "(lr: the checkpoint has",
           "run.json 0.005)", extra=("--lr", "5e-3"))


@pytest.mark.parametrize("checkpoints", [True, False], ids=["with checkpoints", "without checkpoints"])
def test_a_run_copied_and_relabelled_is_refused(tmp_path, data_dir, two_seeds, capsys, checkpoints):  # U23, RN2
    out = _copy(two_seeds, tmp_path)
    target = out / "seed_1" / "baseline"
    shutil.rmtree(target)
    shutil.copytree(out / "seed_1" / "ddl-dv1", target)
    _edit(target, lambda r: r["train_config"].update(variant="baseline"))
    with (target / "metrics.jsonl").open("a") as f:
        f.write("\n")  # the bytes differ; the records do not
    if not checkpoints:
        shutil.rmtree(target / "checkpoints")
    expected = ("(variant: the checkpoint has 'ddl-dv1', run.json 'baseline')" if checkpoints else
                "seed_1/baseline/run.json: model_config is a 'ddl-dv1' model, but train_config.variant is 'baseline'")
    _rerun(out, data_dir, capsys, expected)


def test_a_run_without_its_data_fingerprint_is_refused(tmp_path, data_dir, two_seeds, capsys):  # U24
    out = _copy(two_seeds, tmp_path)
    for run in out.glob("seed_*/*"):
        _edit(run, lambda r: r.pop("data"))
    _refused(study(out, data_dir, "--seeds", "2"), capsys, "seed_0/baseline/run.json records no data fingerprint")


def test_other_data_is_named_as_such(tmp_path, data_dir, two_seeds, capsys):  # U10
    from deep_delta.data import ByteTokenizer, write_dataset

    other = tmp_path / "other"
    write_dataset(["another corpus, " * 400, "of two documents " * 300], ByteTokenizer(), other, val_fraction=0.2)
    out = _copy(two_seeds, tmp_path)
    err = _refused(study(out, other, "--seeds", "2"), capsys, "was made from other data than")
    assert f"it was made from {data_dir.resolve()}, another data directory" in err
    assert "prepared again" not in err


def test_one_seed_into_a_several_seed_comparison_is_refused(tmp_path, data_dir, two_seeds, capsys):  # U13
    out = _copy(two_seeds, tmp_path)
    _refused(study(out, data_dir), capsys, "holds the runs of several seeds (seed_0/, seed_1/), but this comparison "
             "runs one seed")
    assert not (out / "baseline").exists()


def test_a_run_extended_on_a_longer_schedule_is_not_a_run_of_that_length(tmp_path, data_dir, capsys):  # U25
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.trainer import train

    out = tmp_path / "short"
    assert main(study(out, data_dir, "--seeds", "2", steps=2)) == 0
    for run in sorted(out.glob("seed_*/*")):  # `ddl train --resume --steps 4` on each run
        cfg = TrainConfig.from_dict(json.loads((run / "run.json").read_text())["train_config"])
        train(replace(cfg, steps=4), resume=True, progress=False, quiet=True)
    record = json.loads((out / "seed_0" / "baseline" / "run.json").read_text())
    assert [(s["from"], s["to"], s["steps"]) for s in record["segments"]] == [(0, 2, 2), (2, 4, 4)]
    _rerun(out, data_dir, capsys, "seed_0/baseline/run.json: the run trained steps 0-2 on a 2-step schedule, "
           "steps 2-4 on a 4-step schedule", "not one 4-step run")


def test_a_resumed_run_keeps_the_wall_time_of_every_process(tmp_path, data_dir, two_seeds, capsys):  # U18
    out = _copy(two_seeds, tmp_path)
    run = out / "seed_1" / "ddl-dv1"
    first = json.loads((run / "run.json").read_text())
    (run / "run.json").unlink()
    assert main(study(out, data_dir, "--seeds", "2")) == 0  # resumed from its checkpoint of step 4
    again = json.loads((run / "run.json").read_text())
    segments = again["segments"]
    assert [(s["from"], s["to"], s["steps"]) for s in segments] == [(0, 4, 4), (4, 4, 4)]
    assert segments[0]["wall_s"] <= first["finished"]["wall_s"]  # the first process's time, from its checkpoint
    assert again["finished"]["wall_s"] == sum(s["wall_s"] for s in segments)
    assert read_metrics(run) == read_metrics(two_seeds / "seed_1" / "ddl-dv1")


def test_unequal_lengths_are_not_reported_as_costs_nobody_gave(tmp_path, data_dir, capsys):  # RN1, rounds 5 and 6
    """Round 6's RN1: no equal cost invented, and no "N training tokens per variant" or "at equal steps" either: each
    variant's tokens and steps as they are."""
    out = tmp_path / "cost"
    assert main(study(out, data_dir, "--step-costs", "ddl-dv1=0.5")) == 0
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    summary = json.loads((out / "compare.json").read_text())
    assert summary["step_costs"] == {"ddl-dv1": 0.5} and "Equal cost" in (out / "compare.md").read_text()
    (out / "compare.json").unlink()  # no record of the costs it was given: the lengths alone say nothing of cost
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    summary = json.loads((out / "compare.json").read_text())
    report = (out / "compare.md").read_text()
    assert "step_costs" not in summary and "Equal cost" not in report
    assert "trained different numbers of steps (baseline 4, ddl-dv1 8)" in report
    printed = capsys.readouterr().out
    assert "trained different numbers of steps" in printed
    for text in (printed, report):
        assert "at equal steps" not in text and "tokens per variant;" not in text
        assert "at unequal lengths (baseline 4 steps, ddl-dv1 8 steps: neither equal steps nor an equal cost given)" \
            in text
    assert "training tokens per variant: baseline 128, ddl-dv1 256; differences against baseline" in printed
    assert "steps per variant (baseline 4, ddl-dv1 8) x 2 x 16 tokens (training tokens per variant: baseline 128, " \
        "ddl-dv1 256)" in report


@pytest.mark.parametrize("damage", ["deleted", "an LFS pointer"])
def test_a_grid_run_without_its_metrics_is_refused_not_called_diverged(tmp_path, data_dir, capsys, damage):  # U16
    out = tmp_path / "grid"
    args = study(out, data_dir, "--lrs", "1e-3", "2e-3")
    assert main(args) == 0
    path = out / "lr_0.002" / "baseline" / "metrics.jsonl"
    if damage == "deleted":
        path.unlink()
    else:
        path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 1234\n")
    expected = "lr_0.002/baseline/metrics.jsonl " + ("is missing" if damage == "deleted" else
                                                     "line 1: not a metrics record")
    _refused(args, capsys, expected.replace("metrics.jsonl line", "metrics.jsonl, line"))
    _refused(["compare", "--out", str(out), "--report-only"], capsys, expected.replace("metrics.jsonl line",
                                                                                          "metrics.jsonl, line"))


def test_a_run_copied_as_another_seed_is_refused_when_reused(tmp_path, data_dir, two_seeds, capsys):  # RN2
    out = _copy(two_seeds, tmp_path)
    target = out / "seed_1" / "ddl-dv1"
    shutil.rmtree(target)
    shutil.copytree(out / "seed_0" / "ddl-dv1", target)
    shutil.rmtree(target / "checkpoints")
    _edit(target, lambda r: r["train_config"].update(seed=1))
    with (target / "metrics.jsonl").open("a") as f:
        f.write("\n")
    _rerun(out, data_dir, capsys, "hold the same metrics.jsonl: one run copied")


def _extended_without_segments(tmp_path, data_dir):
    """U25's runs (2 steps, then `ddl train --resume --steps 4` on each) with `segments` removed from run.json: a
    record written before segments were."""
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.trainer import train

    out = tmp_path / "short"
    assert main(study(out, data_dir, "--seeds", "2", steps=2)) == 0
    for run in sorted(out.glob("seed_*/*")):
        cfg = TrainConfig.from_dict(json.loads((run / "run.json").read_text())["train_config"])
        train(replace(cfg, steps=4), resume=True, progress=False, quiet=True)
        _edit(run, lambda r: r.pop("segments"))
    return out


def test_U25b_a_run_extended_before_segments_were_recorded_is_told_by_its_lr_column(tmp_path, data_dir, capsys):
    """Round 6's U25b: without `segments` the run was reused as a 4-step run; its metrics' lr column restarts the
    schedule at step 3 (the step the resume with `--steps 4` began), which the refusal names, with the fix."""
    out = _extended_without_segments(tmp_path, data_dir)
    lrs = [r["lr"] for r in read_metrics(out / "seed_0" / "baseline") if "loss" in r]
    assert len(lrs) == 4 and lrs[1] == lrs[2]  # step 2 ended the 2-step cosine; step 3 is the 4-step one's middle
    _rerun(out, data_dir, capsys, "seed_0/baseline/metrics.jsonl: its lr column follows one 4-step warm-up and cosine "
           "schedule (--warmup-steps 0, --min-lr-ratio 0.1, scaled by the lr of step 1) only from step 3",
           "so the schedule restarted at step 3 (a run resumed with a changed --steps) and this is not one 4-step run",
           f"to retrain this run alone, remove {out / 'seed_0' / 'baseline'} and run the study's `ddl compare` again")


def test_U25b_a_record_without_segments_is_reused_when_its_lr_column_is_one_schedule(tmp_path, data_dir, two_seeds,
                                                                                    capsys):
    out = _copy(two_seeds, tmp_path)
    for run in out.glob("seed_*/*"):
        _edit(run, lambda r: r.pop("segments"))
    capsys.readouterr()
    assert main(study(out, data_dir, "--seeds", "2")) == 0
    assert capsys.readouterr().out.count("(its record); kept") == 4
    assert main(["compare", "--out", str(out), "--report-only"]) == 0


def test_U25b_a_record_without_segments_or_an_lr_column_is_unverifiable(tmp_path, data_dir, two_seeds, capsys):
    out = _copy(two_seeds, tmp_path)
    run = out / "seed_1" / "ddl-dv1"
    _edit(run, lambda r: r.pop("segments"))
    path = run / "metrics.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "lr"}) + "\n" for r in records))
    _rerun(out, data_dir, capsys, "seed_1/ddl-dv1/run.json records no `segments` (written before they were), and "
           "whether the run trained one 4-step schedule cannot be checked from its metrics either",
           "records no usable lr at step 1): the record is unverifiable", "to retrain this run alone, remove")


def test_U16c_the_refusals_advice_retrains_the_one_damaged_run_and_keeps_the_others(tmp_path, data_dir, capsys):
    """Round 6's U16c: the refusal of a damaged run said "`--overwrite` retrains the run", and `--overwrite`
    retrained every run of the grid. Now it names the run's directory: removed, the study's command trains it
    alone, the other runs' records untouched; `--overwrite` says it retrains every run."""
    out = tmp_path / "grid"
    args = study(out, data_dir, "--lrs", "1e-3", "2e-3")
    assert main(args) == 0
    damaged = out / "lr_0.002" / "baseline"
    (damaged / "metrics.jsonl").unlink()
    others = {p: p.read_bytes() for p in out.rglob("metrics.jsonl")}
    assert len(others) == 3
    err = _refused(args, capsys, "lr_0.002/baseline/metrics.jsonl is missing",
                   f"to retrain this run alone, remove {damaged} and run the study's `ddl compare` again (it trains "
                   "only the runs that are missing; --overwrite would retrain every run in --out)")
    assert "--overwrite retrains the run" not in err
    shutil.rmtree(damaged)  # the advice
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.count("(its record); kept") == 3
    assert {p: p.read_bytes() for p in others} == others
    assert [r["step"] for r in read_metrics(damaged) if "loss" in r] == [1, 2, 3, 4]
    from deep_delta.cli.main import build_parser

    compare = build_parser()._subparsers._group_actions[0].choices["compare"]
    help_text = next(a.help for a in compare._actions if "--overwrite" in a.option_strings)
    assert "retrain every run already in OUT" in help_text and "to retrain one run alone, remove its directory" in \
        help_text
