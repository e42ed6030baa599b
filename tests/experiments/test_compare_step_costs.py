"""``ddl compare --step-costs``: an equal-cost comparison. A variant whose step costs c x the baseline's trains
round(steps / c) steps with its own full schedule; the reports say so; bad costs are refused before training."""

from __future__ import annotations

import json

import pytest
from tests.experiments.test_compare_scaling import micro

from deep_delta.cli.main import main
from deep_delta.experiments.plan import cost_steps


def test_cost_steps():
    assert (cost_steps(1200, 1.22), cost_steps(300, 1.45), cost_steps(10, 0.5), cost_steps(3, 100.0)) == (
        984, 207, 20, 1)


def test_a_dearer_variant_trains_fewer_steps_with_its_own_schedule(tmp_path, data_dir, capsys):
    out = tmp_path / "cost"
    assert main(micro(out, data_dir, "--steps", "6", "--step-costs", "ddl-dv1=1.5")) == 0
    summary = json.loads((out / "compare.json").read_text())
    assert summary["step_costs"] == {"ddl-dv1": 1.5}
    steps = {r["variant"]: [x["steps"] for x in r["per_seed"]] for r in summary["rows"]}
    assert steps == {"baseline": [6], "ddl-dv1": [4]}
    run = json.loads((out / "ddl-dv1" / "run.json").read_text())
    assert run["train_config"]["steps"] == 4  # its own schedule: cosine over 4 steps, not 6 cut short
    report = (out / "compare.md").read_text()
    assert ("Equal cost: the budget is 6 steps of `baseline`; ddl-dv1 4 steps (its step 1.5x the reference's; "
            "together 6 reference steps)") in report
    printed = capsys.readouterr().out
    assert "equal cost: ddl-dv1's step 1.5x the baseline's" in printed and "(ddl-dv1 128)" in printed


def test_the_study_and_the_lr_grid_pass_the_costs_on(tmp_path, data_dir):
    out = tmp_path / "study"
    assert main(micro(out, data_dir, "--lengths", "4", "--lrs", "1e-3", "2e-3", "--step-costs", "ddl-dv1=2")) == 0
    for lr in ("0.001", "0.002"):
        point = json.loads((out / "d256_s4" / f"lr_{lr}" / "compare.json").read_text())
        assert {r["variant"]: r["per_seed"][0]["steps"] for r in point["rows"]} == {"baseline": 4, "ddl-dv1": 2}
    summary = json.loads((out / "scaling.json").read_text())
    assert summary["step_costs"] == {"ddl-dv1": 2.0} and summary["points"][0]["tokens"] == 2 * 2 * 16
    assert "Equal cost: `steps` is `baseline`'s" in (out / "scaling.md").read_text()


@pytest.mark.parametrize("costs, expected", [
    (["ddl-cc=1.2"], "--step-costs names 'ddl-cc', which is not compared; allowed: one of ddl-dv1"),
    (["baseline=1.2"], "--step-costs names the reference 'baseline'"),
    (["ddl-dv1=0"], "--step-costs for 'ddl-dv1' got 0.0; allowed: a number in [0.01, 100]"),
    (["ddl-dv1=nan"], "--step-costs for 'ddl-dv1' got nan; allowed: a number in [0.01, 100]"),
    (["ddl-dv1"], "--step-costs got 'ddl-dv1'; allowed: VARIANT=RATIO, e.g. ddl-cc=1.22"),
    (["ddl-dv1=fast"], "--step-costs got 'ddl-dv1=fast'; allowed: VARIANT=RATIO"),
    (["ddl-dv1=1.2", "ddl-dv1=1.3"], "--step-costs names 'ddl-dv1' twice"),
])
def test_bad_costs_are_refused_before_training(tmp_path, data_dir, capsys, costs, expected):
    out = tmp_path / "bad"
    assert main(micro(out, data_dir, "--steps", "2", "--step-costs", *costs)) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("extra, expected", [
    (["--steps", "6", "--step-costs", "ddl-dv1=100"],
     "--step-costs for 'ddl-dv1' (100) with --steps 6: ddl-dv1 would train 1 step(s), which cost 100 of the "
     "reference's steps, not 6"),
    (["--steps", "3", "--step-costs", "ddl-dv1=1.6"], "ddl-dv1 would train 2 step(s), which cost 3.2 of the"),
    (["--lengths", "4", "8", "--step-costs", "ddl-dv1=3"], "with --lengths 4: ddl-dv1 would train 1 step(s)"),
])
def test_a_budget_that_whole_steps_cannot_meet_is_refused(tmp_path, data_dir, capsys, extra, expected):
    """Equal cost is stated only when it holds: 6 baseline steps at a cost of 100 once trained 1 step (100 steps'
    worth) and called it equal cost. Whole steps must cost the budget within 5%; the error says how many steps
    would do."""
    out = tmp_path / "bad"
    assert main(micro(out, data_dir, *extra)) == 2
    err = capsys.readouterr().err
    flag = "--lengths" if "--lengths" in extra else "--steps"  # the flag the budget was given with (round 5, SC4)
    assert expected in err and f"not an equal cost; allowed: {flag} of at least" in err, err
    assert not out.exists()
