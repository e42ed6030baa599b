"""The comparison's plan (issue 65, item 4): one object says which runs select and which report, built in one place
(every setting checked there), read back from a comparison's directory by --report-only, and recorded in the
summary the report reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.experiments.test_compare_held_out import held_out, split_data  # noqa: F401, F811 (fixture)
from tests.experiments.test_compare_scaling import micro

from deep_delta.cli.main import main
from deep_delta.experiments.plan import EVAL_DIR, ComparePlan, build_plan, plan_of, recorded_mode
from deep_delta.train.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]


def _base(**kw) -> TrainConfig:
    return TrainConfig(preset="tiny", steps=300, eval_every=50, **kw)


def test_each_mode_is_one_plan_with_its_selection_and_report():
    base = _base()
    single = build_plan(base, ["ddl-cc", "baseline"], seeds=[0, 1])
    grid = build_plan(base, ["baseline", "ddl-cc"], seeds=[0, 1], lrs={"*": [1e-3, 2e-3], "ddl-cc": [4e-3, 8e-3]})
    held = build_plan(base, ["baseline", "ddl-cc"], seeds=[0, 1], lrs=[1e-3, 2e-3], eval_seeds=3,
                      checks={"ddl-cc": 1.2})
    scaling = build_plan(base, ["baseline", "ddl-cc"], seeds=[0], lrs=[1e-3], widths=[32, 64])
    assert [p.mode for p in (single, grid, held, scaling)] == ["single", "grid", "held_out", "scaling"]
    assert single.reference == "baseline" and single.grids is None
    assert (single.report_split, single.report_seeds) == ("val", [0, 1])
    assert grid.lrs == [1e-3, 2e-3, 4e-3, 8e-3] and grid.at(4e-3) == ["ddl-cc"] and grid.at(1e-3) == ["baseline"]
    at = held.at_lr(2e-3)  # one lr of the grid: a plain comparison of the variants whose grid holds it
    assert (at.mode, at.variants, at.seeds, at.report_split) == ("single", ("baseline", "ddl-cc"), (0, 1), "val")
    assert (held.report_split, held.report_seeds, held.seeds) == ("test", [100, 101, 102], (0, 1))
    assert (held.selection.mode, held.selection.grids, held.selection.report_split) == ("grid", held.grids, "val")
    assert scaling.point().mode == "grid"
    # the plan survives its record (compare.json's "plan") as it was
    for plan in (single, grid, held, scaling):
        record = json.loads(json.dumps(plan.to_dict()))
        assert ComparePlan.from_dict(record) == plan and record["mode"] == plan.mode


def test_the_runs_that_select_and_report_stand_where_the_comparison_writes_them(tmp_path):
    base = _base(lr=1e-3)
    held = build_plan(base, ["baseline", "ddl-cc"], seeds=[0, 1], lrs=[1e-3, 2e-3], eval_seeds=2,
                      checks={"ddl-cc": 1.25})
    select = held.runs(base, tmp_path / "lr_0.001")
    assert list(select) == [("baseline", 0), ("ddl-cc", 0), ("baseline", 1), ("ddl-cc", 1)]  # seed-major
    assert select["ddl-cc", 1].out == str(tmp_path / "lr_0.001" / "seed_1" / "ddl-cc")
    report = held.report_runs(base, tmp_path, {"baseline": 1e-3, "ddl-cc": 2e-3})
    assert {k: (Path(c.out).relative_to(tmp_path).as_posix(), c.lr) for k, c in report.items()} == {
        ("baseline", 100): ("evaluation/seed_100/baseline", 1e-3), ("ddl-cc", 100): ("evaluation/seed_100/ddl-cc", 2e-3),
        ("baseline", 101): ("evaluation/seed_101/baseline", 1e-3), ("ddl-cc", 101): ("evaluation/seed_101/ddl-cc", 2e-3)}
    checks = held.check_runs(base, tmp_path, {"baseline": 1e-3, "ddl-cc": 2e-3})
    (cfg,) = checks.values()
    assert (Path(cfg.out).relative_to(tmp_path).as_posix(), cfg.steps, cfg.seed) == ("break_even/r_1.25/ddl-cc", 240, 100)
    assert held.check_runs(base, tmp_path, {"baseline": 1e-3, "ddl-cc": None}) == {}  # no lr: nothing to check


@pytest.mark.parametrize("kw, refusal", [
    (dict(eval_seeds=2), "`eval_seeds` reports fresh seeds at each variant's chosen lr, but no lr grid"),
    (dict(lrs=[1e-3], eval_seeds=2, widths=[32]), "`eval_seeds` with `widths` / `lengths`"),
    (dict(lrs={"ddl-cc": [1e-3], "*": [2e-3]}, lengths=[10]), "`lrs` with a grid per variant and `widths`"),
    (dict(lrs=[1e-3], checks={"ddl-cc": 1.2}), "`break_even_checks` checks r* at the first evaluation seed"),
    (dict(lrs=[1e-3], eval_seeds=2, eval_seed_start=1), "share 1 with the selection seeds"),
    (dict(step_costs={"baseline": 1.2}), "`step_costs` names the reference 'baseline'"),
    (dict(widths=[0]), "`widths` got [0]"),
])
def test_every_refusal_comes_from_the_one_place_the_plan_is_built(kw, refusal):
    with pytest.raises(ValueError, match=refusal.replace("*", r"\*").replace("(", r"\(").replace("[", r"\[")):
        build_plan(_base(), ["baseline", "ddl-cc"], seeds=[0, 1], **kw)


def test_report_only_reads_the_mode_back_from_the_directory(tmp_path):
    assert recorded_mode(tmp_path) == "single"
    (tmp_path / "lr_0.001").mkdir()
    assert recorded_mode(tmp_path) == "grid"
    (tmp_path / EVAL_DIR).mkdir()
    assert recorded_mode(tmp_path) == "held_out"
    (tmp_path / "d32_s10").mkdir()
    assert recorded_mode(tmp_path) == "scaling"


def test_a_summary_written_before_plans_were_recorded_implies_its_plan():
    """The committed deep study (issue 64's predecessor) has no "plan" in its compare.json: its keys imply one."""
    summary = json.loads((REPO / "studies/deep12/all/compare.json").read_text())
    assert "plan" not in summary
    plan = plan_of(summary)
    assert plan.mode == "held_out" and plan.report_split == "test"
    assert plan.seeds == tuple(summary["held_out"]["selection_seeds"])
    assert list(plan.eval_seeds) == summary["held_out"]["eval_seeds"]
    assert set(plan.variants) == {r["variant"] for r in summary["rows"]}


def test_a_comparison_records_its_plan_and_report_only_rebuilds_the_same(tmp_path, data_dir, capsys):
    out = tmp_path / "grid"
    assert main(micro(out, data_dir, "--steps", "2", "--seeds", "2", "--lrs", "1e-3", "2e-3")) == 0
    trained = json.loads((out / "compare.json").read_text())["plan"]
    assert trained["mode"] == "grid" and trained["seeds"] == [0, 1]
    assert trained["grids"] == {"baseline": [1e-3, 2e-3], "ddl-dv1": [1e-3, 2e-3]}
    assert json.loads((out / "lr_0.001" / "compare.json").read_text())["plan"]["mode"] == "single"
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    assert json.loads((out / "compare.json").read_text())["plan"] == trained


def test_a_held_out_study_records_its_plan_and_report_only_rebuilds_the_same(tmp_path, split_data):  # noqa: F811
    out = tmp_path / "held"
    assert main(held_out(out, split_data, steps=2, eval_every=1)) == 0
    trained = json.loads((out / "compare.json").read_text())["plan"]
    assert (trained["mode"], trained["report_split"], trained["seeds"], trained["eval_seeds"]) == (
        "held_out", "test", [0, 1], [100, 101])
    assert json.loads((out / "selection.json").read_text())["plan"]["mode"] == "grid"
    assert main(["compare", "--out", str(out), "--report-only"]) == 0
    assert json.loads((out / "compare.json").read_text())["plan"] == trained
