"""``ddl compare --widths/--lengths``: the comparison at every width and length, and the difference to the
baseline against width and compute, with the paired intervals of each point."""

from __future__ import annotations

import json

import pytest

from deep_delta.cli.main import main

MODEL = ["--set", "model.num_hidden_layers=1", "--set", "model.num_attention_heads=2", "--set",
         "model.max_position_embeddings=64"]


def micro(out, data_dir, *extra):
    return ["compare", "--variants", "baseline", "ddl-dv1", "--out", str(out), "--data", str(data_dir),
            "--batch-size", "2", "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1", "--warmup-steps",
            "0", "--device", "cpu", "--threads", "1", "--no-progress", "--time-repeats", "0", *MODEL, *extra]


def test_the_study_reports_each_points_paired_difference(tmp_path, data_dir, capsys):
    out = tmp_path / "study"
    assert main(micro(out, data_dir, "--seeds", "2", "--widths", "16", "32", "--lengths", "2", "3")) == 0
    summary = json.loads((out / "scaling.json").read_text())
    assert [(p["variant"], p["width"], p["steps"]) for p in summary["points"]] == [
        ("ddl-dv1", w, n) for w in (16, 32) for n in (2, 3)]
    for p in summary["points"]:
        point = json.loads((out / f"d{p['width']}_s{p['steps']}" / "compare.json").read_text())
        row = next(r for r in point["rows"] if r["variant"] == "ddl-dv1")
        assert point["settings"]["model"]["hidden_size"] == p["width"] and point["settings"]["steps"] == p["steps"]
        assert (p["d_val_loss"], p["ci95"], p["wins"]) == (row["d_val_loss"], row["d_val_loss_ci95"], row["wins"])
        assert p["tokens"] == p["steps"] * 2 * 16 and p["compute"] == 6 * p["parameters"] * p["tokens"]
    assert summary["points"][0]["parameters"] < summary["points"][2]["parameters"]
    report = (out / "scaling.md").read_text()
    assert "one shared lr (0.002) for every variant" in report and "| ddl-dv1 | 32 | 3 | 96 |" in report
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "# Width and length study" in printed and ", widths 16 32, 2/3 steps x 2 x 16 tokens each" in printed


@pytest.mark.parametrize("extra, expected", [
    (["--widths", "16", "--set", "model.hidden_size=32"], "--widths and `--set model.hidden_size=...` were both"),
    (["--lengths", "2", "--steps", "3"], "--lengths and one length (--steps, or --set steps=...) were both given"),
    (["--widths", "0"], "--widths got [0]; allowed: one or more distinct integers >= 1"),
    (["--lengths", "2", "2"], "--lengths got [2] more than once"),
])
def test_bad_study_sizes_are_refused(tmp_path, data_dir, capsys, extra, expected):
    out = tmp_path / "bad"
    assert main(micro(out, data_dir, *extra)) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_a_study_whose_summary_cannot_be_written_is_refused_before_training(tmp_path, data_dir, capsys):
    out = tmp_path / "study"
    (out / "scaling.md").mkdir(parents=True)
    assert main(micro(out, data_dir, "--widths", "16", "--lengths", "2")) != 0
    assert "scaling.md is a directory" in capsys.readouterr().err
    assert not (out / "d16_s2").exists()
