"""``ddl compare --lrs ... --eval-seeds N``: each variant's lr chosen on the val split at the selection seeds, then
fresh runs at the chosen lr with the evaluation seeds, reported on the test split; the old way (chosen and
reported on the same seeds and validation sample) labelled so; a killed study resumed; ``--report-only`` reading
the same layout."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tests.experiments.test_compare_lr_grid import MODEL

from deep_delta.cli.main import main
from deep_delta.data.shards import open_shard, write_shard_record
from deep_delta.train.metrics import read_metrics

PLANTED = 1e-5  # an lr far too small to train: it wins only where its validation loss is planted


@pytest.fixture(scope="module")
def split_data(tmp_path_factory, data_dir):
    """The training tests' data with a test split of 4,000 tokens (test_000000.bin, recorded in meta.json)."""
    out = tmp_path_factory.mktemp("held_out") / "bytes"
    shutil.copytree(data_dir, out)
    tokens = np.asarray(open_shard(out / "train_000000.bin"))[-4000:]
    record = write_shard_record(out / "test_000000.bin", tokens)
    meta = json.loads((out / "meta.json").read_text())
    meta["splits"]["test"] = {"num_tokens": record["num_tokens"], "shards": [record]}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def plant(monkeypatch, lr: float, by: float = 1.0):
    """Runs at ``lr`` see their validation loss lowered by ``by``: that lr wins on the selection split only."""
    from deep_delta.train.trainer import Trainer

    real = Trainer.evaluate

    def evaluate(self):
        numbers = real(self)
        if numbers is not None and self.cfg.lr == lr:
            numbers = {**numbers, "val_loss": numbers["val_loss"] - by}
        return numbers

    monkeypatch.setattr(Trainer, "evaluate", evaluate)


def held_out(out, data, *extra, lrs=(PLANTED, 3e-3), steps=3, eval_every=3, start=100, tokens="1024"):
    """A grid on 2 selection seeds, 2 evaluation seeds from 100, reported on 1,024 test tokens."""
    return ["compare", "--variants", "baseline", "ddl-dv1", "--out", str(out), "--data", str(data),
            "--steps", str(steps), "--batch-size", "2", "--seq-len", "16", "--eval-every", str(eval_every),
            "--eval-batches", "1", "--warmup-steps", "0", "--device", "cpu", "--threads", "1", "--no-progress",
            "--time-repeats", "0", *MODEL, "--lrs", *map(str, lrs), "--seeds", "2", "--eval-seeds", "2",
            "--eval-seed-start", str(start), "--test-tokens", tokens, *extra]


def test_a_planted_lr_is_chosen_on_val_and_reported_on_test(tmp_path, split_data, capsys, monkeypatch):
    plant(monkeypatch, PLANTED)
    out = tmp_path / "held"
    assert main(held_out(out, split_data)) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "compare.json").read_text())
    assert summary["reported_split"] == "test"
    assert summary["held_out"]["selection_seeds"] == [0, 1] and summary["held_out"]["eval_seeds"] == [100, 101]
    assert summary["held_out"]["test_tokens"] == 1024
    for row in summary["rows"]:
        assert row["lr"] == PLANTED  # chosen on the planted validation loss
        for x in row["per_seed"]:
            run = out / "evaluation" / f"seed_{x['seed']}" / row["variant"]
            test = json.loads((run / "test.json").read_text())
            assert json.loads((run / "run.json").read_text())["train_config"]["lr"] == PLANTED
            assert x["test_loss"] == test["loss"] and test["tokens"] == 1024
            # the planted validation loss is a nat below what the model measures on test
            val = [r["val_loss"] for r in read_metrics(run) if "val_loss" in r][-1]
            assert x["val_loss"] == val and test["loss"] > val + 0.5
        assert row["test_loss"] == pytest.approx(sum(x["test_loss"] for x in row["per_seed"]) / 2)
    dv1 = next(r for r in summary["rows"] if r["variant"] == "ddl-dv1")
    base = next(r for r in summary["rows"] if r["variant"] == "baseline")
    assert dv1["d_test_loss"] == pytest.approx(dv1["test_loss"] - base["test_loss"])
    report = (out / "compare.md").read_text()
    assert "| test loss |" in report and f"{base['test_loss']:.4f}" in report
    assert "at the selection seeds 0, 1" in report and "evaluation seeds 100, 101, reported on the `test` split" \
        in report
    assert "at the selection seeds 0, 1" in printed and f"{base['test_loss']:.4f}" in printed
    selection = json.loads((out / "selection.json").read_text())
    assert selection["seeds"] == [0, 1] and "held_out" not in selection
    # the selection's own report is labelled as choosing and reporting on the same seeds and validation sample
    assert "chosen and reported on the same seeds and validation sample" in (out / "selection.md").read_text()
    # the test windows' plan: recorded in each test.json and said in the report
    assert summary["held_out"]["test_windows"] == "spread"
    assert "1,024 tokens in windows spread evenly over the split, the same windows for every run" in report
    test_file = out / "evaluation" / "seed_100" / "baseline" / "test.json"
    assert json.loads(test_file.read_text())["eval_windows"] == "spread"
    test_file.write_text(json.dumps({**json.loads(test_file.read_text()), "eval_windows": "first"}))
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only", "--no-progress"]) == 2
    assert "test.json is missing or not of this run's final step, data and windows (--eval-windows spread)" in \
        capsys.readouterr().err


def crash_when(monkeypatch, failing):
    """Runs for which ``failing(cfg)`` holds crash at their second step (a killed process)."""
    from deep_delta.train.trainer import Trainer

    real = Trainer.train_step

    def train_step(self):
        if failing(self.cfg) and self.step == 1:
            raise RuntimeError("killed")
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", train_step)


def test_a_killed_study_reports_its_partial_results_and_resumes(tmp_path, split_data, capsys, monkeypatch):
    out = tmp_path / "resume"
    args = held_out(out, split_data, lrs=(1e-3, 2e-3), steps=4, eval_every=1)
    crash_when(monkeypatch, lambda cfg: cfg.seed == 101 and cfg.variant == "ddl-dv1")
    with pytest.raises(RuntimeError, match="killed"):
        main(args)
    capsys.readouterr()
    partial = json.loads((out / "compare.json").read_text())
    assert partial["seeds"] == [100] and any("PARTIAL: 1 of 2 evaluation seeds" in n for n in partial["notes"])
    assert any("the study goes on and rewrites this report" in n for n in partial["notes"])  # while it trains
    assert main(["compare", "--out", str(out), "--report-only", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "PARTIAL: 1 of 2 evaluation seeds" in printed
    # round 6's HP: --report-only trains nothing, and the one seed is an evaluation seed
    assert "goes on" not in printed and "(this report trained nothing); the `ddl compare` that started the study " \
        "finishes them and rewrites this report" in printed
    assert "an anecdote, not evidence (use --eval-seeds 3 or more)" in printed and "--seeds 3" not in printed
    kept = {p: p.read_text() for p in out.glob("**/metrics.jsonl") if "seed_101" not in str(p) or "baseline" in str(p)}
    tests = {p: p.read_text() for p in out.glob("evaluation/**/test.json")}
    monkeypatch.undo()
    assert main([*args, "--break-even-check", "ddl-dv1=2"]) == 0
    printed = capsys.readouterr().out
    assert {p: p.read_text() for p in kept} == kept  # finished runs reused, not retrained
    assert {p: p.read_text() for p in tests} == tests  # their test losses reused, not measured again
    summary = json.loads((out / "compare.json").read_text())
    assert summary["seeds"] == [100, 101] and not any("PARTIAL" in n for n in summary.get("notes", []))
    # the exact run of the break-even check: 2 steps with its own schedule at the first evaluation seed
    (check,) = summary["break_even_checks"]
    run = out / "break_even" / "r_2" / "ddl-dv1"
    assert json.loads((run / "run.json").read_text())["train_config"]["steps"] == 2
    exact = [r["val_loss"] for r in read_metrics(run) if "val_loss" in r][-1]
    curve = [[r["step"], r["val_loss"]] for r in read_metrics(out / "evaluation" / "seed_100" / "ddl-dv1")
             if "val_loss" in r]
    # the estimate at a point of the curve is that point (through exp(log(loss)): equal up to rounding)
    assert check["exact_loss"] == exact and check["estimate"] == pytest.approx(dict(map(tuple, curve))[2], rel=1e-12)
    assert check["error"] == pytest.approx(exact - dict(map(tuple, curve))[2])
    assert f"measured error (exact minus the curve's estimate) {check['error']:+.4f} nats" in printed
    row = next(r for r in summary["rows"] if r["variant"] == "ddl-dv1")
    assert [x["seed"] for x in row["break_even"]["per_seed"]] == [100, 101]
    assert "| ddl-dv1 | 100: " in (out / "compare.md").read_text()
    # --report-only reads the same layout back to the same numbers
    assert main(["compare", "--out", str(out), "--report-only", "--no-progress"]) == 0
    again = json.loads((out / "compare.json").read_text())
    assert [(r["variant"], r["lr"], r["test_loss"], r["d_test_loss"]) for r in again["rows"]] == \
        [(r["variant"], r["lr"], r["test_loss"], r["d_test_loss"]) for r in summary["rows"]]
    assert again["break_even_checks"] == summary["break_even_checks"]


@pytest.mark.parametrize("extra, expected", [
    (dict(tokens="100k"), "--test-tokens got 100,000, but the test split of"),
    (dict(start=1), "which share 1 with the selection seeds (0, 1)"),
    (dict(extra=["--break-even-check", "baseline=2"]), "--break-even-check names 'baseline'"),
    # round 6's BE5: ratios whose exact run cannot fall on the curve (here steps 3 to 6) trained, then said so
    (dict(steps=6, extra=["--break-even-check", "ddl-dv1=0.5"]),
     "--break-even-check for 'ddl-dv1' got 0.5: below 1, its exact run (N / r = 12 steps) would reach past the "
     "variant's 6-step curve: its curve gives no estimate to check there; allowed: a ratio in [1, 2.1]"),
    (dict(steps=6, extra=["--break-even-check", "ddl-dv1=20"]),
     "got 20: its exact run of 1 step(s) would fall before the variant's first validation, at step 3"),
    (dict(steps=6, extra=["--break-even-check", "ddl-dv1=4"]), "got 4: its exact run of 2 step(s) would fall before"),
    # round 6's BE6: 6 / 1.1 trains 5 steps, 5.5 of the reference's 6: not equal cost (the 5% of --step-costs)
    (dict(steps=6, extra=["--break-even-check", "ddl-dv1=1.1"]),
     "got 1.1: its exact run would train 5 step(s), which cost 5.5 of the reference's 6 steps (off by 8%, more than "
     "5%): not at equal cost; allowed: a ratio whose whole steps cost 6 within 5%, the nearest up to 1.05 (6 steps) "
     "or from 1.14 (5 steps)"),
], ids=["test-tokens", "eval-seed-start", "reference", "BE5-below-1", "BE5-too-few-steps", "BE5-4", "BE6"])
def test_a_held_out_study_is_refused_before_anything_trains(tmp_path, split_data, capsys, extra, expected):
    out = tmp_path / "bad"
    assert main(held_out(out, split_data, *extra.pop("extra", []), **extra)) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_data_without_a_test_split_is_refused(tmp_path, data_dir, capsys):
    assert main(held_out(tmp_path / "none", data_dir)) == 2
    assert "has no test split (no test_*.bin shards)" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("extra", [[], ["--lrs", "1e-3", "2e-3"], ["--report-only"]],
                         ids=["one-lr", "grid", "report-only"])
def test_a_first_evaluation_seed_without_evaluation_seeds_is_refused(tmp_path, data_dir, capsys, extra):
    """Round 6's H8b: ``--eval-seed-start 5`` without ``--eval-seeds`` ran a plain comparison, the flag ignored
    without a word; refused as ``--test-tokens`` without ``--eval-seeds`` is (H8), before anything trains."""
    from tests.experiments.test_compare_scaling import micro

    out = tmp_path / "cmp"
    argv = ["compare", "--out", str(out), "--report-only"] if extra == ["--report-only"] else micro(out, data_dir,
                                                                                                   *extra)
    assert main([*argv, "--eval-seed-start", "5"]) == 2
    err = capsys.readouterr().err
    assert ("--report-only trains nothing, but got --eval-seed-start" if extra == ["--report-only"] else
            "--eval-seed-start got a value without --eval-seeds; allowed: with --eval-seeds") in err, err
    assert not out.exists()


def test_a_test_count_below_a_batch_says_the_tokens_it_measures(tmp_path, split_data, capsys):
    """Round 6's H5e: ``--test-tokens 10`` measured a whole batch (2 windows of 16 tokens here) without a word. Said
    before anything trains, in the evaluation's banner and in compare.md."""
    out = tmp_path / "h5e"
    assert main(held_out(out, split_data, lrs=(1e-3,), steps=2, eval_every=1, tokens="10")) == 0
    printed = capsys.readouterr().out
    rounded = "the 10 asked rounded up to whole batches of 2 windows of 16 tokens"
    first = printed.index(f"test tokens: each evaluation run will be measured on 32 ({rounded})")
    assert first < printed.index("[1/") and f"reported on 32 test tokens ({rounded})" in printed
    summary = json.loads((out / "compare.json").read_text())
    assert summary["held_out"]["test_tokens"] == 32 and summary["held_out"]["test_tokens_asked"] == 10
    assert (f"reported on the `test` split (32 tokens in windows spread evenly over the split, the same windows for "
            f"every run; {rounded})") in (out / "compare.md").read_text()
