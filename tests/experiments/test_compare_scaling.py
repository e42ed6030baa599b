"""``ddl compare --widths/--lengths``: the comparison at every width and length, and the difference to the
baseline against width and compute, with the paired intervals of each point."""

from __future__ import annotations

import json

import pytest

from deep_delta.cli.main import main

MODEL = ["--set", "model.num_hidden_layers=1", "--set", "model.num_attention_heads=2", "--set",
         "model.max_position_embeddings=64"]


def micro(out, data_dir, *extra, batch_size=2):
    return ["compare", "--variants", "baseline", "ddl-dv1", "--out", str(out), "--data", str(data_dir),
            "--batch-size", str(batch_size), "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1",
            "--warmup-steps", "0", "--device", "cpu", "--threads", "1", "--no-progress", "--time-repeats", "0", *MODEL,
            *extra]


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


@pytest.fixture(scope="module")
def study_in_parts(tmp_path_factory, data_dir):
    """A study run in two parts into one OUT: width 16 with two seeds at the shared lr, then width 32 with one
    seed and an lr grid."""
    out = tmp_path_factory.mktemp("parts") / "study"
    assert main(micro(out, data_dir, "--seeds", "2", "--widths", "16", "--lengths", "2")) == 0
    assert main(micro(out, data_dir, "--seeds", "1", "--lrs", "1e-3", "4e-3", "--widths", "32", "--lengths",
                      "2")) == 0
    (out / "scaling.md").unlink()  # the second part's summary covers width 32 alone
    return out


def test_report_only_summarises_every_point_of_a_study_run_in_parts(study_in_parts, capsys):
    out = study_in_parts
    stamp = {p: p.stat().st_mtime_ns for p in out.glob("d*/**/*") if p.is_file()}
    assert len(stamp) > 20
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    assert all(p.stat().st_mtime_ns == t for p, t in stamp.items())  # nothing retrained or rewritten
    summary = json.loads((out / "scaling.json").read_text())
    assert [(p["width"], p["steps"], p["seeds"], p["lrs"]) for p in summary["points"]] == [
        (16, 2, [0, 1], None), (32, 2, [0], [1e-3, 4e-3])]
    assert summary["seeds"] is None and summary["lrs"] is None and summary["widths"] == [16, 32]
    for p in summary["points"]:
        point = json.loads((out / f"d{p['width']}_s{p['steps']}" / "compare.json").read_text())
        row = next(r for r in point["rows"] if r["variant"] == "ddl-dv1")
        assert (p["d_val_loss"], p["ci95"], p["wins"], p["n"], p["lr"]) == (
            row["d_val_loss"], row["d_val_loss_ci95"], row["wins"], row["n_paired"], row.get("lr") or 2e-3)
    assert summary["points"][0]["ci95"] is not None and summary["points"][1]["ci95"] is None  # 2 seeds vs 1
    report = (out / "scaling.md").read_text()
    assert "each point's own seeds, below" in report and "its point's grid (below)" in report
    assert "| d16_s2 | 0, 1 | - |" in report and "| d32_s2 | 0 | 0.001, 0.004 |" in report
    assert report in capsys.readouterr().out
    assert main(["compare", "--out", str(out), "--report-only", "--widths", "32"]) == 0
    assert [p["width"] for p in json.loads((out / "scaling.json").read_text())["points"]] == [32]


@pytest.mark.parametrize("extra, expected", [
    (["--lrs", "1e-3"], "--report-only trains nothing, but got --lrs; allowed with it: --out, --widths"),
    (["--seeds", "2", "--batch-size", "4"], "got --seeds, --batch-size;"),
    (["--widths", "64"], "holds no finished point for width 64 (points found: d16_s2, d32_s2)"),
])
def test_report_only_refuses_training_options_and_absent_points(study_in_parts, capsys, extra, expected):
    assert main(["compare", "--out", str(study_in_parts), "--report-only", *extra]) == 2
    assert expected in capsys.readouterr().err


def test_report_only_refuses_points_of_different_studies(study_in_parts, tmp_path, data_dir, capsys):
    import shutil

    out = tmp_path / "mixed"
    shutil.copytree(study_in_parts / "d16_s2", out / "d16_s2")
    assert main(micro(out, data_dir, "--widths", "24", "--lengths", "2", batch_size=3)) == 0
    assert main(["compare", "--out", str(out), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "the point d24_s2 differs from d16_s2 in more than width, length, lr and seeds" in err
    assert "batch_size: d16_s2 has 2, now 3" in err
    assert main(["compare", "--out", str(tmp_path / "none"), "--report-only"]) == 2
    assert "which is not a directory" in capsys.readouterr().err


def test_report_only_refuses_a_point_whose_runs_were_replaced(study_in_parts, tmp_path, data_dir, capsys):
    """A finished point rerun with another setting and --overwrite, stopped after its first run, leaves the old
    compare.json beside a new run: --report-only refuses it, naming the run and the setting, instead of
    reporting the old numbers. A point kept without its runs (a record) is taken as recorded, and said so."""
    import shutil

    out = tmp_path / "study"
    shutil.copytree(study_in_parts / "d16_s2", out / "d16_s2")
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    capsys.readouterr()
    # the first run of the rerun (seed 0, baseline) at lr 1e-3 replaces the old one; the rest stay old
    rerun = tmp_path / "rerun"
    assert main(micro(rerun, data_dir, "--lr", "1e-3", "--seeds", "2", "--widths", "16", "--lengths", "2")) == 0
    shutil.rmtree(out / "d16_s2" / "seed_0" / "baseline")
    shutil.copytree(rerun / "d16_s2" / "seed_0" / "baseline", out / "d16_s2" / "seed_0" / "baseline")
    assert main(["compare", "--out", str(out), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "d16_s2/compare.json no longer describes its runs" in err and "lr: run has 0.001, now 0.002" in err
    # a run directory that is gone
    shutil.rmtree(out / "d16_s2" / "seed_0" / "baseline")
    assert main(["compare", "--out", str(out), "--report-only"]) == 2
    assert "seed_0/baseline/run.json is missing" in capsys.readouterr().err
    # every run gone: the point is a record, reported as recorded and said so
    for d in (out / "d16_s2").glob("seed_*"):
        shutil.rmtree(d)
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    assert "The runs of d16_s2 are not on disk" in (out / "scaling.md").read_text()
