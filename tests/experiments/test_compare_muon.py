"""``ddl compare --optimizer muon``: the lr grid is Muon's (AdamW's group follows by ``--adamw-lr-ratio``), the
optimizer is part of a run's identity (a finished AdamW run is never reused as a Muon run, nor the reverse), and
the report says which optimizer trained the runs."""

from __future__ import annotations

import json

from tests.experiments.test_compare_lr_grid import micro  # baseline and ddl-dv1, 3 steps of 2 x 16 tokens

from deep_delta.cli.main import main


def test_a_muon_grid_trains_muon_at_each_lr_and_adamw_at_the_ratio(tmp_path, data_dir, capsys):
    out = tmp_path / "grid"
    muon = ["--optimizer", "muon", "--adamw-lr-ratio", "0.5"]
    assert main(micro(out, data_dir, *muon, "--lrs", "0.001", "0.004")) == 0
    printed = capsys.readouterr().out
    for lr in (0.001, 0.004):
        for variant in ("baseline", "ddl-dv1"):
            run = json.loads((out / f"lr_{lr:g}" / variant / "run.json").read_text())
            assert run["train_config"]["optimizer"] == "muon" and run["train_config"]["lr"] == lr
            groups = run["optimizer"]["groups"]
            assert groups[0]["optimizer"] == "muon" and groups[0]["lr"] == lr
            assert {g["lr"] for g in groups[1:]} == {lr * 0.5} and {g["optimizer"] for g in groups[1:]} == {"adamw"}
    said = "every lr here is Muon's, AdamW's is 0.5 x it"
    assert said in printed and said in (out / "compare.md").read_text()
    assert "optimizer Muon on the hidden matrices (match_rms_adamw) with AdamW on the rest at 0.5 x lr" in (
        out / "lr_0.001" / "compare.md").read_text()
    # the same study again reuses every run; from the records alone it says the same
    assert main(micro(out, data_dir, *muon, "--lrs", "0.001", "0.004")) == 0
    assert said in capsys.readouterr().out
    assert main(["compare", "--report-only", "--out", str(out)]) == 0
    assert said in capsys.readouterr().out


def test_a_finished_adamw_run_is_not_reused_as_a_muon_run(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    assert main(micro(out, data_dir)) == 0
    assert "optimizer AdamW" in (out / "compare.md").read_text()
    before = {p: p.read_bytes() for p in out.rglob("metrics.jsonl")}
    capsys.readouterr()
    assert main(micro(out, data_dir, "--optimizer", "muon")) == 2
    err = capsys.readouterr().err
    assert "optimizer: run has 'adamw', now 'muon'" in err
    assert {p: p.read_bytes() for p in out.rglob("metrics.jsonl")} == before
    # nor the ratio of a Muon run (a run recorded before the fields existed counts as AdamW: tests/train/test_muon.py)
    assert main(micro(out, data_dir, "--optimizer", "muon", "--overwrite")) == 0
    capsys.readouterr()
    assert main(micro(out, data_dir, "--optimizer", "muon", "--adamw-lr-ratio", "2")) == 2
    assert "adamw_lr_ratio: run has 1.0, now 2.0" in capsys.readouterr().err
