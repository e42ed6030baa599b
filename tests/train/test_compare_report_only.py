"""``ddl compare --report-only`` on a comparison: its report from finished run directories brought together
(runs made in parts or on several machines, without their checkpoints), each run's device recorded."""

from __future__ import annotations

import json
import shutil

from deep_delta.cli.main import main

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
    assert "were not made with the same settings (ddl-cc: batch_size: the reference run has 2, now 3)" in err
    shutil.rmtree(out / "ddl-cc")
    path = out / "ddl-dv1" / "run.json"
    run = json.loads(path.read_text())
    del run["finished"]
    path.write_text(json.dumps(run))
    assert main(["compare", "--out", str(out), "--report-only"]) == 2
    assert "the run of ddl-dv1 in" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["compare", "--out", str(tmp_path / "empty"), "--report-only"]) == 2
    assert "holds no run directories" in capsys.readouterr().err
