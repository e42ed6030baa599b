"""``ddl compare --report-only`` on a comparison: its report from finished run directories brought together
(runs made in parts or on several machines, without their checkpoints), each run's device recorded."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from deep_delta.cli.main import main
from helpers import with_options

MODEL = ["--set", "model.num_hidden_layers=1", "--set", "model.num_attention_heads=2", "--set",
         "model.max_position_embeddings=64", "--set", "model.hidden_size=32"]


def micro(out, data_dir, *extra):
    return ["compare", "--variants", "baseline", "ddl-dv1", "--out", str(out), "--data", str(data_dir),
            "--batch-size", "2", "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1", "--warmup-steps",
            "0", "--steps", "2", "--device", "cpu", "--threads", "1", "--no-progress", "--time-repeats", "0",
            *MODEL, *extra]


def _numbers(summary: dict) -> list:
    return [(r["variant"], r.get("lr"), r["val_loss"], r["d_val_loss"], [x["val_loss"] for x in r["per_seed"]])
            for r in summary["rows"]]


def test_a_comparison_is_rebuilt_from_its_finished_runs_without_their_checkpoints(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    assert main(micro(out, data_dir, "--seeds", "2")) == 0
    first = json.loads((out / "compare.json").read_text())
    run = json.loads((out / "seed_1" / "ddl-dv1" / "run.json").read_text())
    assert run["device"]["name"] == "cpu" and run["finished"]["step"] == 2 and run["finished"]["diverged"] is None
    for d in out.glob("seed_*/*/checkpoints"):  # the results come back small: no checkpoint
        shutil.rmtree(d)
    for name in ("compare.md", "compare.json", "curves.png"):
        (out / name).unlink()
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    again = json.loads((out / "compare.json").read_text())
    assert _numbers(again) == _numbers(first) and again["seeds"] == [0, 1]
    assert again["devices"] == {"baseline seed 0": "cpu", "ddl-dv1 seed 0": "cpu", "baseline seed 1": "cpu",
                                "ddl-dv1 seed 1": "cpu"}
    assert "brought together from finished run directories" in (out / "compare.md").read_text()
    assert "| DDL (d_v=1) | ddl-dv1 |" in capsys.readouterr().out


def test_an_lr_grid_is_brought_together_from_runs_made_apart(tmp_path, data_dir):
    """Each lr trained by its own command (as on two machines), the lr directories copied into one OUT: the
    report chooses each variant's lr as the grid trained in one command does."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(micro(whole, data_dir, "--lrs", "1e-3", "4e-3")) == 0
    for lr in ("1e-3", "4e-3"):
        assert main(micro(tmp_path / f"part_{lr}", data_dir, "--lrs", lr)) == 0
        name = f"lr_{float(lr):g}"
        shutil.copytree(tmp_path / f"part_{lr}" / name, parts / name)
    assert main(["compare", "--out", str(parts), "--report-only"]) == 0
    one, apart = (json.loads((d / "compare.json").read_text()) for d in (whole, parts))
    assert _numbers(apart) == _numbers(one)
    assert apart["lr_selection"]["chosen"] == one["lr_selection"]["chosen"]
    assert (parts / "lr_sensitivity.png").read_bytes()[:4] == b"\x89PNG"


def test_unfinished_or_mismatched_runs_are_refused(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    assert main(micro(out, data_dir)) == 0
    other = tmp_path / "other"
    assert main(["compare", "--variants", "ddl-cc", "--out", str(other), "--data", str(data_dir), "--batch-size", "3",
                 "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1", "--warmup-steps", "0", "--steps", "2",
                 "--device", "cpu", "--threads", "1", "--no-progress", "--time-repeats", "0", *MODEL]) == 0
    shutil.copytree(other / "ddl-cc", out / "ddl-cc")
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "were not made with the same settings (ddl-cc seed 0: batch_size: the reference run has 2, now 3)" in err
    shutil.rmtree(out / "ddl-cc")
    path = out / "ddl-dv1" / "run.json"
    run = json.loads(path.read_text())
    del run["finished"]
    path.write_text(json.dumps(run))
    assert main(["compare", "--out", str(out), "--report-only"]) == 2
    assert "ddl-dv1/run.json records no end: the run has not finished" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["compare", "--out", str(tmp_path / "empty"), "--report-only"]) == 2
    assert "holds no run directories" in capsys.readouterr().err


# ---------------------------------------------------------------------- each run is what its own record says
@pytest.fixture(scope="module")
def seeds_study(tmp_path_factory, data_dir):
    """A finished comparison of baseline and ddl-dv1 with seeds 0 and 1 (2 steps each), made once; each test copies
    it before changing it."""
    out = tmp_path_factory.mktemp("seeds") / "cmp"
    assert main(micro(out, data_dir, "--seeds", "2")) == 0
    return out


@pytest.fixture(scope="module")
def grid_study(tmp_path_factory, data_dir):
    """A finished lr grid (1e-3, 2e-3) of baseline and ddl-dv1, and the lr 4e-3 of the same comparison made with
    another batch size, made once."""
    root = tmp_path_factory.mktemp("grid")
    assert main(micro(root / "grid", data_dir, "--lrs", "1e-3", "2e-3")) == 0
    assert main(with_options(micro(root / "other", data_dir, "--lrs", "4e-3"), "--batch-size", "3")) == 0
    return root


def _copy(study, tmp_path):
    out = tmp_path / "cmp"
    shutil.copytree(study, out, symlinks=True)
    return out


def _edit_run(run_dir, change):
    path = run_dir / "run.json"
    run = json.loads(path.read_text())
    change(run)
    path.write_text(json.dumps(run))


def _refused(out, capsys, *expected):
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for text in expected:
        assert text in err, err
    return err


def _cut_after_first_line(path):
    path.write_text(path.read_text().splitlines()[0] + "\n")


def _replace_with(target, source, link=False):
    shutil.rmtree(target)
    if link:
        target.symlink_to(source, target_is_directory=True)
    else:
        shutil.copytree(source, target)


SEED_CASES = {
    # a ddl-dv1 run copied into baseline/ is not the baseline
    "variant copied": (lambda o, data: _replace_with(o / "seed_0" / "baseline", o / "seed_0" / "ddl-dv1"),
                       ["seed_0/baseline/run.json records variant 'ddl-dv1' (train_config.variant), but the run stands in baseline/"]),
    # seed 0 copied, or linked, as seed 1: one run twice is not two seeds
    "seed copied": (lambda o, data: _replace_with(o / "seed_1" / "ddl-dv1", o / "seed_0" / "ddl-dv1"),
                    ["seed_1/ddl-dv1/run.json records seed 0 (train_config.seed), but the run stands in seed_1/"]),
    "seed linked": (lambda o, data: _replace_with(o / "seed_1", o / "seed_0", link=True),
                    ["records seed 0 (train_config.seed), but the run stands in seed_1/"]),
    "seed copied and relabelled": (
        lambda o, data: (_replace_with(o / "seed_1" / "ddl-dv1", o / "seed_0" / "ddl-dv1"),
                   _edit_run(o / "seed_1" / "ddl-dv1", lambda r: r["train_config"].update(seed=1))),
        ["seed_1/ddl-dv1/run.json does not describe its own checkpoint", "(seed: the checkpoint has 0, run.json 1)"]),
    # what a run reports comes from complete files of its own
    "metrics missing": (lambda o, data: (o / "seed_1" / "baseline" / "metrics.jsonl").unlink(),
                        ["seed_1/baseline/metrics.jsonl is missing"]),
    "metrics empty": (lambda o, data: (o / "seed_1" / "baseline" / "metrics.jsonl").write_text(""),
                      ["seed_1/baseline/metrics.jsonl is empty, but", "records the run's end at step 2"]),
    "metrics truncated": (lambda o, data: _cut_after_first_line(o / "seed_0" / "ddl-dv1" / "metrics.jsonl"),
                          ["seed_0/ddl-dv1/metrics.jsonl ends at step 1, but", "records the run's end at step 2"]),
    "metrics torn": (lambda o, data: (o / "seed_0" / "ddl-dv1" / "metrics.jsonl").write_text(
                         (o / "seed_0" / "ddl-dv1" / "metrics.jsonl").read_text()[:-20]),
                     ["seed_0/ddl-dv1/metrics.jsonl, line", "not a metrics record (the file is truncated or damaged)"]),
    # a run.json that is not a finished run's record
    "no train_config": (lambda o, data: _edit_run(o / "seed_0" / "ddl-dv1", lambda r: r.pop("train_config")),
                        ["ddl-dv1/run.json: `train_config` got null; allowed: the run's settings"]),
    "finished null": (lambda o, data: _edit_run(o / "seed_0" / "ddl-dv1", lambda r: r.update(finished=None)),
                      ["ddl-dv1/run.json: `finished` got null; allowed: the record of the run's end"]),
    "a JSON list": (lambda o, data: (o / "seed_1" / "baseline" / "run.json").write_text("[1, 2]"),
                    ["seed_1/baseline/run.json is not a run record: it holds a JSON list"]),
    "not UTF-8": (lambda o, data: (o / "seed_1" / "baseline" / "run.json").write_bytes(b'{"a": "\xff"}'),
                  ["seed_1/baseline/run.json is not UTF-8 text (byte 7"]),
    "seed_abc": (lambda o, data: shutil.copytree(o / "seed_1", o / "seed_abc"),
                 ["seed_abc is not a seed folder of a comparison; allowed: seed_<integer>/"]),
    # one step count per variant: seeds of other lengths are not averaged
    "other steps": (lambda o, data: _other_steps(o, data), ["seed_1/ddl-dv1/run.json records steps 3 (train_config.steps), but",
                                                     "trained 2; allowed: one step count"]),
}


def _other_steps(out, data_dir):
    """seed 1 of ddl-dv1 replaced by a run of 3 steps made with the same settings."""
    other = out.parent / "three"
    argv = with_options(micro(other, data_dir, "--seed", "1"), "--variants", "ddl-dv1", "--steps", "3")
    assert main(argv) == 0
    _replace_with(out / "seed_1" / "ddl-dv1", other / "ddl-dv1")


@pytest.mark.parametrize("case", list(SEED_CASES))
def test_report_only_believes_each_runs_own_record(seeds_study, data_dir, tmp_path, capsys, case):
    """Whatever a folder is named or holds, a run is reported as what its run.json says, and only when that agrees
    with where it stands, with its own metrics and with the other runs: else one line naming the run and the
    field, and nothing is written."""
    out = _copy(seeds_study, tmp_path)
    change, expected = SEED_CASES[case]
    change(out, data_dir)
    before = (out / "compare.json").read_bytes()
    _refused(out, capsys, *expected)
    assert (out / "compare.json").read_bytes() == before


GRID_CASES = {
    # an lr folder is named as `ddl compare --lrs` names it, and its runs were made at that lr
    "lr_4e-3 beside lr_0.004": (lambda r, o: shutil.copytree(o / "lr_0.001", o / "lr_1e-3"),
                                ["lr_1e-3 is not an lr folder of a grid (`ddl compare --lrs` names the folder of lr "
                                 "0.001 lr_0.001)"]),
    "lr_nan": (lambda r, o: (o / "lr_0.002").rename(o / "lr_nan"), ["lr_nan is not an lr folder of a grid;"]),
    "lr_0": (lambda r, o: (o / "lr_0.002").rename(o / "lr_0"), ["lr_0 is not an lr folder of a grid;"]),
    "lr_abc": (lambda r, o: (o / "lr_0.002").rename(o / "lr_abc"), ["lr_abc is not an lr folder of a grid;"]),
    "renamed lr": (lambda r, o: (o / "lr_0.002").rename(o / "lr_0.003"),
                   ["lr_0.003/baseline/run.json records lr 0.002 (train_config.lr), but the run stands in lr_0.003/"]),
    # lr folders of another batch size do not join the grid
    "other batch size": (lambda r, o: shutil.copytree(r / "other" / "lr_0.004", o / "lr_0.004"),
                         ["were not made with the same settings (baseline seed 0: batch_size: the reference run has "
                          "2, now 3)"]),
}


@pytest.mark.parametrize("case", list(GRID_CASES))
def test_report_only_of_a_grid_believes_each_runs_lr(grid_study, tmp_path, capsys, case):
    out = _copy(grid_study / "grid", tmp_path)
    change, expected = GRID_CASES[case]
    change(grid_study, out)
    _refused(out, capsys, *expected)


def test_report_only_keeps_the_step_times_the_comparison_measured(tmp_path, data_dir, capsys):
    """A finished comparison rebuilt from its runs keeps the step ms and equal-time columns its `ddl compare`
    measured (they were dropped); a compare.json timed for other settings is not used, and the report says so."""
    out = tmp_path / "cmp"
    assert main(with_options(micro(out, data_dir), "--time-repeats", "1")) == 0
    first = json.loads((out / "compare.json").read_text())
    assert first["timing"]["step_time_s"]
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    again = json.loads((out / "compare.json").read_text())
    assert again["timing"] == first["timing"]
    for a, b in zip(first["rows"], again["rows"]):
        assert (a["step_time_s"], a["equal_time_val_loss"], a.get("equal_time_d_val_loss")) == \
            (b["step_time_s"], b["equal_time_val_loss"], b.get("equal_time_d_val_loss"))
    assert "step ms: median of 1 interleaved rounds" in (out / "compare.md").read_text()
    again["settings"]["batch_size"] = 5  # a summary of other settings beside these runs
    (out / "compare.json").write_text(json.dumps(again))
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    printed = capsys.readouterr().out
    last = json.loads((out / "compare.json").read_text())
    assert last["timing"] is None and "were measured for other settings" in printed
    assert "batch_size: it was timed with 5, now 2" in (out / "compare.md").read_text()


def test_a_finished_run_kept_without_checkpoints_is_reused_not_retrained(tmp_path, data_dir, capsys):
    """A study whose finished runs came back as records only (run.json, metrics.jsonl: a lost run directory
    restored from the committed evidence) resumes with the runs it lacks and trains none of those again."""
    out = tmp_path / "cmp"
    assert main(micro(out, data_dir, "--seeds", "2")) == 0
    first = json.loads((out / "compare.json").read_text())
    for d in out.glob("seed_*/*/checkpoints"):
        shutil.rmtree(d)
    shutil.rmtree(out / "seed_1" / "ddl-dv1")  # the one run still to train
    kept = {p: p.read_bytes() for p in out.glob("seed_*/*/metrics.jsonl")}
    capsys.readouterr()
    assert main(micro(out, data_dir, "--seeds", "2")) == 0
    said = capsys.readouterr().out
    assert said.count("(its record); kept") == 3
    assert {p: p.read_bytes() for p in kept} == kept  # the three records as they were
    assert not (out / "seed_0" / "baseline" / "checkpoints").exists()
    assert (out / "seed_1" / "ddl-dv1" / "checkpoints").is_dir()  # the missing run trained
    assert _numbers(json.loads((out / "compare.json").read_text())) == _numbers(first)


def test_a_finished_run_with_checkpoints_is_reused_its_record_untouched(tmp_path, data_dir, capsys):
    """Running a finished study again trains nothing and rewrites no run's record: run.json keeps the wall time
    of the process that trained it (a resumed run would record the resume's fraction of a second)."""
    out = tmp_path / "cmp"
    assert main(micro(out, data_dir)) == 0
    kept = {p: p.read_bytes() for p in out.glob("*/*.json*")}
    assert len(kept) == 4 and all((p.parent / "checkpoints").is_dir() for p in kept)
    capsys.readouterr()
    assert main(micro(out, data_dir)) == 0
    assert capsys.readouterr().out.count("(its record); kept") == 2
    assert {p: p.read_bytes() for p in kept} == kept


def test_a_finished_run_without_checkpoints_is_not_retrained_to_go_further(tmp_path, data_dir, capsys):
    """More steps than a checkpoint-less finished run has: refused before anything trains (the step count is a
    result-changing setting), the record kept."""
    out = tmp_path / "cmp"
    assert main(micro(out, data_dir)) == 0
    for d in out.glob("*/checkpoints"):
        shutil.rmtree(d)
    kept = {p: p.read_bytes() for p in out.glob("*/*.json*")}
    capsys.readouterr()
    longer = micro(out, data_dir)
    longer[longer.index("--steps") + 1] = "3"
    assert main(longer) == 2
    err = capsys.readouterr().err
    assert "was made with other settings (steps: run has 2, now 3)" in err and "--overwrite" in err
    assert {p: p.read_bytes() for p in kept} == kept


def test_packed_records_report_and_are_reused_as_the_plain_ones(seeds_study, data_dir, tmp_path, capsys):
    """Runs kept packed (metrics.jsonl.gz, as studies/ keeps them: issue 65 item 5) give the same report, and a
    rerun of the comparison reuses them; a run directory holding both forms is refused, naming it."""
    from deep_delta.train.metrics import pack_metrics

    out = _copy(seeds_study, tmp_path)
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    plain = json.loads((out / "compare.json").read_text())
    for run in out.glob("seed_*/*"):
        shutil.rmtree(run / "checkpoints")
        pack_metrics(run)
    assert not list(out.rglob("metrics.jsonl")) and len(list(out.rglob("metrics.jsonl.gz"))) == 4
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    assert _numbers(json.loads((out / "compare.json").read_text())) == _numbers(plain)
    assert main(micro(out, data_dir, "--seeds", "2")) == 0
    assert capsys.readouterr().out.count("(its record); kept") == 4
    assert not list(out.rglob("metrics.jsonl"))  # reused, not rewritten
    run = out / "seed_1" / "ddl-dv1"
    (run / "metrics.jsonl").write_bytes(b'{"step": 1, "loss": 1.0}\n')
    _refused(out, capsys, f"{run} holds both metrics.jsonl and metrics.jsonl.gz, so which one is the run's metrics "
             "is ambiguous")


def test_SW5c_report_only_refuses_mixed_kernel_switches_and_says_mixed_threads_and_commits(seeds_study, tmp_path,
                                                                                          capsys):
    """Round 6's SW5c: a run retrained with a kernel switch on (DDL_INKERNEL_REDUCE=1) was brought together with runs
    made with it off, without a word, and compare.json's machine gave the reporting process's switches and threads.
    Now the mix is refused (as plain `ddl compare` refuses such a run against its own switches); threads and code
    commits that differ are said in the report; the machine record is the runs' own."""
    import torch

    from deep_delta.ops import switches
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.trainer import train

    out = _copy(seeds_study, tmp_path)
    run = out / "seed_1" / "ddl-dv1"
    cfg = TrainConfig.from_dict(json.loads((run / "run.json").read_text())["train_config"])
    shutil.rmtree(run)
    with switches.override(inkernel_reduce=True):
        train(replace(cfg, out=str(run)), progress=False, quiet=True)
    assert json.loads((run / "run.json").read_text())["kernel_switches"]["INKERNEL_REDUCE"] is True
    _refused(out, capsys, "seed_1/ddl-dv1/run.json records kernel switch INKERNEL_REDUCE True, there False",
             "runs made on other kernel paths are not one comparison", f"remove {run}")
    _edit_run(run, lambda r: r["kernel_switches"].update(INKERNEL_REDUCE=False))  # as the others: one set again
    _edit_run(run, lambda r: r["device"].update(threads=2))
    for seed, commit in ((0, "a" * 40), (1, "b" * 40)):
        for variant in ("baseline", "ddl-dv1"):
            _edit_run(out / f"seed_{seed}" / variant, lambda r, c=commit: r.update(code={"commit": c, "clean": True}))
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with switches.override(tc_one_pass=True):  # the reporting process's own: not the runs'
            assert main(["compare", "--out", str(out), "--report-only"]) == 0
    finally:
        torch.set_num_threads(threads)
    summary = json.loads((out / "compare.json").read_text())
    m = summary["machine"]
    assert m["kernel_switches"] == json.loads((out / "seed_0" / "baseline" / "run.json").read_text())["kernel_switches"]
    assert m["kernel_switches"]["TC_ONE_PASS"] is False
    assert m["torch_threads"] == {"baseline seed 0 at lr 0.002": 1, "ddl-dv1 seed 0 at lr 0.002": 1,
                                  "baseline seed 1 at lr 0.002": 1, "ddl-dv1 seed 1 at lr 0.002": 2}
    assert m["code"]["ddl-dv1 seed 1 at lr 0.002"]["commit"] == "b" * 40
    assert m["report_written_on"]["torch_threads"] == 3
    report = (out / "compare.md").read_text()
    assert "the runs were trained with different CPU threads (" in report
    assert "the runs were trained with different code commits (" in report and "bbbbbbbbbbbb" in report
    assert "Machine: the runs' own, as their run.json records it: CPU only (no GPU)" in report
    assert "kernel switches all off" in report
