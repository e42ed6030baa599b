"""Divergence means one thing everywhere: a run that diverged is reported as diverged by ``ddl compare`` and by its
``--report-only`` alike, under ``--on-divergence`` stop or raise; a diverged lr is never chosen in a grid; a grid
on data without a validation split is refused before it trains; and the divergence error's advice is a command
that runs."""

from __future__ import annotations

import json

import pytest
from tests.experiments.test_compare_lr_grid import micro  # the same micro comparison

from deep_delta.cli.main import main
from helpers import with_options


def diverge_when(monkeypatch, failing, at):
    """Runs for which ``failing(cfg)`` holds see a NaN loss at step ``at``: the trainer's own divergence path
    (``on_divergence`` raise or stop) ends them, as a real divergence would."""
    from deep_delta.train.trainer import Trainer

    real = Trainer._check_finite

    def check(self, loss, norm):
        return real(self, float("nan") if failing(self.cfg) and self.step + 1 == at else loss, norm)

    monkeypatch.setattr(Trainer, "_check_finite", check)


def _rows(out):
    return {r["variant"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}


@pytest.mark.parametrize("mode", ["stop", "raise"])
def test_compare_and_its_report_only_agree_on_a_divergence(tmp_path, data_dir, capsys, monkeypatch, mode):
    """ddl-dv1 diverges at step 2: `ddl compare` reports it diverged (under stop it once reported the loss at its
    last good step as a normal result), and `--report-only` of the same folder gives the same rows."""
    out = tmp_path / "cmp"
    diverge_when(monkeypatch, lambda cfg: cfg.variant == "ddl-dv1", at=2)
    assert main(micro(out, data_dir, "--on-divergence", mode)) == 1
    err = capsys.readouterr().err
    assert "ddl compare: ddl-dv1 diverged: non-finite loss (loss nan" in err and "at step 2" in err
    trained = _rows(out)
    assert trained["ddl-dv1"]["val_loss"] is None and trained["ddl-dv1"]["diverged"].endswith("at step 2")
    assert trained["baseline"]["val_loss"] is not None and trained["baseline"]["diverged"] is None
    run = json.loads((out / "ddl-dv1" / "run.json").read_text())
    assert run["finished"]["diverged"] == trained["ddl-dv1"]["diverged"] and run["finished"]["step"] == 1
    assert main(["compare", "--out", str(out), "--report-only"]) == 1
    collected = _rows(out)
    for v in ("baseline", "ddl-dv1"):
        assert {k: collected[v][k] for k in ("val_loss", "diverged", "steps")} == \
            {k: trained[v][k] for k in ("val_loss", "diverged", "steps")}
    # a rerun keeps the divergence as the run's result: nothing trains again
    before = (out / "ddl-dv1" / "metrics.jsonl").read_bytes()
    assert main(micro(out, data_dir, "--on-divergence", mode)) == 1
    assert (out / "ddl-dv1" / "metrics.jsonl").read_bytes() == before
    assert "diverged (non-finite loss" in capsys.readouterr().out


def test_a_diverged_lr_is_never_chosen(tmp_path, data_dir, monkeypatch):
    """Under `--on-divergence stop` a run that diverged at step 2 of 3 at lr 2e-3 stopped with a finite loss; it is
    a diverged grid point all the same, and its lr is not eligible."""
    out = tmp_path / "grid"
    diverge_when(monkeypatch, lambda cfg: cfg.lr == 2e-3 and cfg.variant == "ddl-dv1", at=2)
    assert main(micro(out, data_dir, "--on-divergence", "stop", "--lrs", "1e-3", "2e-3")) == 0
    summary = json.loads((out / "compare.json").read_text())
    point = next(p for p in summary["lr_grid"] if p["variant"] == "ddl-dv1" and p["lr"] == 2e-3)
    assert point["diverged"].endswith("at step 2") and point["value"] is None
    chosen = summary["lr_selection"]["chosen"]["ddl-dv1"]
    assert chosen["lr"] == 1e-3 and chosen["by_lr"]["0.002"]["diverged_seeds"] == [0]
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    again = json.loads((out / "compare.json").read_text())
    assert again["lr_selection"]["chosen"] == summary["lr_selection"]["chosen"]


def test_a_grid_on_data_without_validation_is_refused_before_training(tmp_path, capsys):
    """The grid chooses on validation loss: data prepared with --val-fraction 0 is refused up front (every run
    once counted as "diverged", rc 1, when nothing had diverged)."""
    from deep_delta.data import ByteTokenizer, write_dataset

    data = tmp_path / "no-val"
    write_dataset(["some text to train on. " * 400], ByteTokenizer(), data, val_fraction=0.0)
    out = tmp_path / "grid"
    argv = with_options(micro(out, data, "--lrs", "1e-3", "2e-3"), "--eval-every", "0")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "an lr grid chooses each variant's lr on its final validation loss, but" in err
    assert "has no validation split" in err and "Traceback" not in err
    assert not out.exists()


def test_the_divergence_advice_is_a_command_that_runs(tmp_path, data_dir, capsys):
    """`ddl train` that diverges (lr 1e9, no clipping) says what to do; what it says is accepted: a new run with a
    lower lr over the old one (`--resume` keeps the lr, and refuses another)."""
    out = tmp_path / "run"
    argv = ["train", "--config", "debug", "--variant", "ddl-cc", "--data", str(data_dir), "--out", str(out),
            "--device", "cpu", "--no-progress", "--grad-clip", "0", "--warmup-steps", "0", "--steps", "20",
            "--save-every", "1"]
    assert main([*argv, "--lr", "1e9"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "train it anew with a lower --lr or more --warmup-steps (--overwrite, or another --out)" in err
    assert "then --resume" not in err and "then `resume`" not in err
    run = json.loads((out / "run.json").read_text())
    assert run["finished"]["diverged"].startswith("non-finite")
    assert main([*argv, "--lr", "1e-3", "--resume"]) == 2  # the lr of a run is not changed by resuming it
    assert "lr: run has 1000000000.0" in capsys.readouterr().err
    assert main([*with_options(argv, "--steps", "2"), "--lr", "1e-3", "--overwrite"]) == 0
