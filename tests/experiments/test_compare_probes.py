"""The `ddl compare` cases of the round-5 probe that are not a finished run's check: width-study points recomputed
from their runs (RN4-RN7, RO30), a plain comparison beside a user's files (RO34), the report-only terminal (RN8),
lr grids as the table and the warnings show them (G2-G4, G7, G8) and step costs (SC2-SC4)."""

from __future__ import annotations

import json
import shutil

import pytest
from tests.experiments.test_compare_scaling import micro

from deep_delta.cli.main import main
from deep_delta.experiments.lr_grid import choose_lrs, gap_warning, grid_table
from deep_delta.experiments.plan import check_step_costs


@pytest.fixture(scope="module")
def widths(tmp_path_factory, data_dir):
    """A width study of two points (widths 16 and 32, 2 steps, 2 seeds)."""
    out = tmp_path_factory.mktemp("widths") / "study"
    assert main(micro(out, data_dir, "--seeds", "2", "--widths", "16", "32", "--lengths", "2")) == 0
    return out


def _point(out, change, runs=True):
    path = out / "d16_s2" / "compare.json"
    summary = json.loads(path.read_text())
    path.write_text(json.dumps(change(summary)))
    if not runs:
        for d in (out / "d16_s2").glob("seed_*"):
            shutil.rmtree(d)


def _dv1(summary):
    return next(r for r in summary["rows"] if r["variant"] == "ddl-dv1")


def _report_only(out, capsys, code=0):
    capsys.readouterr()
    assert main(["compare", "--out", str(out), "--report-only"]) == code
    return capsys.readouterr()


def test_a_points_numbers_are_recomputed_from_its_runs(widths, tmp_path, capsys):  # RN4
    out = tmp_path / "study"
    shutil.copytree(widths, out)
    true = _dv1(json.loads((out / "d16_s2" / "compare.json").read_text()))

    def forge(summary):
        row = _dv1(summary)
        row.update(d_val_loss=row["d_val_loss_ci95"][0], wins=2)  # inside its interval: only the runs can tell
        return summary

    _point(out, forge)
    _report_only(out, capsys)
    point = json.loads((out / "scaling.json").read_text())["points"][0]
    assert (point["width"], point["d_val_loss"], point["wins"]) == (16, true["d_val_loss"], true["wins"])


@pytest.mark.parametrize("case, change, runs, expected", [
    ("RO30", lambda s: (_dv1(s).update(d_val_loss=-0.5), s)[1], False, "rows[1].d_val_loss` got -0.5; allowed: the "
     "mean of its interval's pairs, inside"),
    ("RN5", lambda s: [1], True, "d16_s2/compare.json: `(the file)` got [1]; allowed: a comparison's summary"),
    ("RN6", lambda s: {"settings": {"model": {"hidden_size": 16}, "steps": 2}}, True,
     "d16_s2/compare.json: `rows` got null; allowed: a row per variant"),
    ("RN7", lambda s: (_dv1(s).update(d_val_loss=None, val_loss="x"), s)[1], True,
     "d16_s2/compare.json: `rows[1].val_loss` got \"x\"; allowed: a number or null"),
])
def test_a_damaged_point_summary_is_one_line_naming_it(widths, tmp_path, capsys, case, change, runs, expected):
    out = tmp_path / "study"
    shutil.copytree(widths, out)
    _point(out, change, runs)
    err = _report_only(out, capsys, 2).err
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_a_grid_with_a_gap_is_said_so_in_the_width_study(tmp_path, data_dir):  # G8
    out = tmp_path / "study"
    assert main(micro(out, data_dir, "--widths", "16", "--lengths", "2", "--lrs", "1e-3", "4e-3")) == 0
    assert "Warning: the lr grid has a gap wider than 2x: 0.001 to 0.004 (4x)" in (out / "scaling.md").read_text()


def test_a_comparison_beside_a_users_files_is_reported_as_one(tmp_path, data_dir, capsys):  # RO34, RN8
    out = tmp_path / "cmp"
    assert main(micro(out, data_dir, "--lrs", "1e-3", "4e-3", "--steps", "2")) == 0
    (out / "drafts_sorted").mkdir()
    (out / "d1_s1.txt").write_text("notes")
    printed = _report_only(out, capsys).out
    assert "| variant | lr 0.001 | lr 0.004 | chosen lr |" in printed  # the grid, as the live run printed it
    assert "Warning: the lr grid has a gap wider than 2x" in printed
    assert (out / "compare.md").is_file() and not (out / "scaling.md").exists()


def test_a_one_point_grid_chooses_nothing(tmp_path, data_dir, capsys):  # G2
    out = tmp_path / "one"
    assert main(micro(out, data_dir, "--lrs", "1e-3", "--steps", "2")) == 0
    captured = capsys.readouterr()
    assert "the lr grid has one point (0.001): it chooses nothing" in captured.err
    assert "0.001 (the grid's only lr: nothing was chosen)" in (out / "compare.md").read_text()


def test_the_grid_table_goes_from_the_lowest_lr_up():  # G3
    lrs = [4e-3, 1e-3, 2e-3]
    points = [{"variant": "baseline", "lr": lr, "seed": 0, "value": 3.0 + lr, "diverged": None} for lr in lrs]
    table = grid_table(choose_lrs(points, ["baseline"], lrs, higher_is_better=False), lrs, lambda x: f"{x:.4f}")
    assert table.splitlines()[0] == "| variant | lr 0.001 | lr 0.002 | lr 0.004 | chosen lr |"


def test_a_gap_just_over_2x_shows_the_digits_that_make_it_one():  # G4
    assert "0.001 to 0.002 (2.000001x)" in gap_warning([1e-3, 2.000001e-3])
    assert gap_warning([1e-3, 2e-3]) is None


def test_a_negative_lr_is_named(tmp_path, data_dir, capsys):  # G7
    assert main(micro(tmp_path / "neg", data_dir, "--lrs", "-1e-3")) == 2
    assert "--lrs got [-0.001] (not a finite number > 0)" in capsys.readouterr().err


def test_a_cost_exactly_5_percent_off_is_within_5_percent():  # SC2
    assert check_step_costs({"ddl-dv1": 1.05}, ["baseline", "ddl-dv1"], [6]) == {"ddl-dv1": 1.05}


@pytest.mark.parametrize("extra, expected", [
    (["--step-costs", "ddl-dv1=nan"], "--step-costs for 'ddl-dv1' got nan"),  # SC3
    (["--step-costs", "baseline=2"], "--step-costs names the reference 'baseline'"),  # SC3
    (["--widths", "16", "--lengths", "6", "7", "--step-costs", "ddl-dv1=1.5"], "with --lengths 7: ddl-dv1 would "
     "train 5 step(s)"),  # SC4
])
def test_bad_costs_are_refused_before_the_banner_announces_them(tmp_path, data_dir, capsys, extra, expected):
    assert main(micro(tmp_path / "bad", data_dir, *extra)) == 2
    captured = capsys.readouterr()
    assert expected in captured.err and "equal cost" not in captured.out and "ddl compare:" not in captured.out
    assert not (tmp_path / "bad").exists()
