"""Learning-rate grids: the choice is made on validation data alone, divergence is a data point, and the
sensitivity plot draws every grid point of every seed."""

from __future__ import annotations

import math

import pytest

from deep_delta.experiments.lr_grid import check_lrs, choose_lrs, divergence, grid_table, sensitivity_figure
from deep_delta.experiments.settings import TaskSettings
from deep_delta.experiments.tasks import grid_points, summarize_grid
from deep_delta.tasks import get_task


def point(variant, lr, seed, value, diverged=None):
    return {"variant": variant, "lr": lr, "seed": seed, "value": value, "diverged": diverged}


@pytest.mark.parametrize("lrs, why", [([], "no value"), ([1e-3, 0.0], "[0.0] (not a finite number > 0)"),
                                      ([-1e-3], "[-0.001] (not a finite"), ([math.nan], "[nan]"),
                                      ([math.inf, 1e-3], "[inf]"), ([1e-3, 2e-3, 1e-3], "[0.001] more than once")])
def test_a_bad_grid_is_refused_naming_what_it_got(lrs, why):
    with pytest.raises(ValueError, match=r"`lrs` got ") as e:
        check_lrs(lrs)
    assert why in str(e.value) and "allowed: one or more distinct finite learning rates > 0" in str(e.value)


def test_two_lrs_that_share_a_directory_are_refused_before_anything_trains(tmp_path, capsys):
    """1e-3 and 1.0000001e-3 are both named lr_0.001: the grid is refused (by `ddl compare` before any training,
    and by the task studies, which check their grid the same way) instead of training one over the other."""
    from deep_delta.cli.main import main

    with pytest.raises(ValueError, match=r"`lrs` got 0.001 and 0.0010000001, which share the name lr_0.001"):
        check_lrs([2e-3, 1e-3, 1.0000001e-3])
    assert check_lrs([1e-3, 1.00001e-3]) == [1e-3, 1.00001e-3]  # distinct within 6 significant digits
    out = tmp_path / "grid"
    assert main(["compare", "--lrs", "1e-3", "1.0000001e-3", "--out", str(out), "--steps", "2"]) == 2
    assert "--lrs got 0.001 and 0.0010000001, which share the name lr_0.001" in capsys.readouterr().err
    assert not out.exists()


def test_divergence_is_non_finite_or_above_the_limit():
    assert divergence(1.0, 2.0) is None
    assert "non-finite" in divergence(math.nan, 2.0) and divergence(None, 2.0, "val loss") == "no final val loss"
    assert "above the divergence limit" in divergence(2.5, 2.0)


def test_lower_is_better_picks_the_lowest_mean_and_skips_an_lr_where_a_seed_diverged():
    lrs = [1e-3, 2e-3, 4e-3]
    points = [point("a", 1e-3, 0, 3.0), point("a", 1e-3, 1, 3.2),
              point("a", 2e-3, 0, 2.5), point("a", 2e-3, 1, 2.7),
              point("a", 4e-3, 0, 1.0), point("a", 4e-3, 1, None, "non-finite loss"),  # best mean, but a seed diverged
              point("b", 1e-3, 0, None, "x"), point("b", 2e-3, 0, None, "x"), point("b", 4e-3, 0, None, "x"),
              point("c", 1e-3, 0, 2.0), point("c", 1e-3, 1, None, "x"), point("c", 2e-3, 0, None, "x")]
    chosen = choose_lrs(points, ["a", "b", "c"], lrs, higher_is_better=False)
    assert chosen["a"]["lr"] == 2e-3 and chosen["a"]["why"] is None
    assert chosen["a"]["by_lr"]["0.002"]["mean"] == pytest.approx(2.6)
    assert chosen["a"]["by_lr"]["0.004"]["diverged_seeds"] == [1]
    assert chosen["b"] == {**chosen["b"], "lr": None, "why": "diverged at every lr"}
    assert chosen["c"]["lr"] is None and chosen["c"]["why"] == "diverged in at least one seed at every lr"
    higher = choose_lrs(points, ["a"], lrs, higher_is_better=True)
    assert higher["a"]["lr"] == 1e-3 and higher["a"]["edge"] == "lowest" and chosen["a"]["edge"] is None
    assert "| 0.001 (the grid's lowest: the best may lie below it) |" in grid_table(higher, lrs, str)
    table = grid_table(chosen, lrs, lambda x: f"{x:.2f}")
    assert "| a | 3.10 +- 0.14 | **2.60 +- 0.14** | 1.00 (diverged in seed(s) 1) | 0.002 |" in table
    assert "| b | diverged | diverged | diverged | diverged at every lr |" in table


def fake_record(variant, lr, seed, validation, test, level_count, diverged=None, last_loss=0.5):
    by_level = {str(lv): {"accuracy": test, "correct": 0, "total": 1} for lv in range(1, level_count + 1)}
    return {"variant": variant, "seed": seed, "settings": {"lr": lr}, "validation": {"overall": validation, "loss": 1.0},
            "accuracy": {"overall": test, "by_difficulty": by_level}, "test_loss": 1.0, "train_s": 1.0,
            "parameters": 10, "diverged": diverged, "loss_curve": [[1, last_loss]], "accuracy_curve": [[1, test]]}


def test_a_best_lr_at_the_top_of_the_grid_is_said_to_be_there():
    lrs = [1e-3, 4e-3]
    points = [point("a", 1e-3, 0, 3.0), point("a", 4e-3, 0, 2.0)]
    chosen = choose_lrs(points, ["a"], lrs, higher_is_better=False)
    assert chosen["a"]["edge"] == "highest"
    assert "| 0.004 (the grid's highest: the best may lie above it) |" in grid_table(chosen, lrs, str)
    assert choose_lrs(points[:1], ["a"], [1e-3], higher_is_better=False)["a"]["edge"] is None  # a one-lr grid


def test_the_task_grid_chooses_on_validation_accuracy_and_never_on_the_test_set():
    """Built so that the lr with the best test accuracy is another than the one with the best validation accuracy:
    the validation one is chosen, and the test accuracy reported is that lr's, not the better one."""
    task = get_task("shell-game")
    settings = TaskSettings(test_size=16)
    levels, lrs, seeds = len(task.levels), [1e-3, 2e-3, 4e-3], [0, 1]
    #            lr:   validation, test
    baseline = {1e-3: (0.50, 0.90), 2e-3: (0.70, 0.40), 4e-3: (0.60, 0.95)}
    ddl = {1e-3: (0.80, 0.30), 2e-3: (0.65, 0.99), 4e-3: (0.90, 0.20)}
    records = {}
    for name, table in (("baseline", baseline), ("ddl-dv1", ddl)):
        for lr, (val, test) in table.items():
            for s in seeds:
                records[name, lr, s] = fake_record(name, lr, s, val + 0.01 * s, test + 0.001 * s, levels)
    records["ddl-dv1", 4e-3, 1]["loss_curve"] = [[1, 9.0]]  # above 1.5 ln(vocabulary): diverged, though the best
    records["baseline", 1e-3, 1]["loss_curve"] = [[1, 9.5], [2, 9.0]]  # above the limit but falling: not diverged
    points = grid_points(task, ["baseline", "ddl-dv1"], seeds, lrs, records)
    assert [p for p in points if p["diverged"]] == [
        point("ddl-dv1", 4e-3, 1, None, f"training loss 9.0000 above the divergence limit "
              f"{1.5 * math.log(task.vocab_size):.4f}")]
    chosen = choose_lrs(points, ["baseline", "ddl-dv1"], lrs, higher_is_better=True)
    assert chosen["baseline"]["lr"] == 2e-3  # the test set would have said 4e-3
    assert chosen["ddl-dv1"]["lr"] == 1e-3  # 4e-3 had a divergence; the test set would have said 2e-3
    summary = summarize_grid(task, ["baseline", "ddl-dv1"], seeds, lrs, settings, records, points, chosen)
    rows = {r["variant"]: r for r in summary["rows"]}
    assert rows["baseline"]["lr"] == 2e-3 and rows["baseline"]["overall_per_seed"] == [0.40, 0.401]
    assert rows["ddl-dv1"]["overall_per_seed"] == [0.30, 0.301]
    assert rows["ddl-dv1"]["vs_baseline_pp"]["mean"] == pytest.approx(-10.0)
    assert summary["lr_selection"]["lrs"] == lrs and summary["lr_grid"] == points


def test_a_loss_above_the_limit_diverged_unless_it_is_falling():
    task = get_task("shell-game")
    limit = 1.5 * math.log(task.vocab_size)
    for curve, diverged in (([[1, 9.5], [2, 9.0]], False), ([[1, 5.0], [2, 9.0]], True), ([[1, 9.0], [2, 9.0]], True),
                            ([[1, 9.0], [2, 0.5 * limit]], False), ([[1, 1.0], [2, math.nan]], True)):
        record = fake_record("baseline", 1e-3, 0, 0.5, 0.5, len(task.levels))
        record["loss_curve"] = curve
        (p,) = grid_points(task, ["baseline"], [0], [1e-3], {("baseline", 1e-3, 0): record})
        assert bool(p["diverged"]) is diverged, (curve, p["diverged"])


def test_a_record_without_validation_is_an_error_naming_it():
    task = get_task("shell-game")
    record = fake_record("baseline", 1e-3, 0, 0.5, 0.5, len(task.levels))
    del record["validation"]
    with pytest.raises(ValueError, match="baseline seed 0 at lr 0.001 has no validation accuracy"):
        grid_points(task, ["baseline"], [0], [1e-3], {("baseline", 1e-3, 0): record})


def test_the_sensitivity_plot_draws_every_point_of_every_seed():
    lrs, seeds, variants = [5e-4, 1e-3, 2e-3], [0, 1, 2], ["baseline", "ddl-cc"]
    points = [point(v, lr, s, 1.0 + i + 0.1 * j + 0.01 * s) for i, v in enumerate(variants)
              for j, lr in enumerate(lrs) for s in seeds]
    points[4] = {**points[4], "value": None, "diverged": "non-finite loss"}
    points[-1] = {**points[-1], "value": None, "diverged": "above the limit"}
    fig = sensitivity_figure(points, variants, "loss", "t")
    drawn = {}
    for collection in fig.axes[0].collections:
        gid = collection.get_gid()
        if gid:
            drawn[gid] = sorted(tuple(map(float, xy)) for xy in collection.get_offsets())
    for v in variants:
        ok = sorted((p["lr"], p["value"]) for p in points if p["variant"] == v and not p["diverged"])
        assert [c for xy in drawn[f"points:{v}"] for c in xy] == pytest.approx([c for xy in ok for c in xy])
        bad = sorted(p["lr"] for p in points if p["variant"] == v and p["diverged"])
        assert [x for x, _ in drawn[f"diverged:{v}"]] == pytest.approx(bad)
    assert sum(len(xs) for xs in drawn.values()) == len(lrs) * len(seeds) * len(variants)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_a_report_without_a_grid_says_one_shared_lr():
    from deep_delta.experiments.task_report import summarize_tasks, task_report

    task = get_task("shell-game")
    settings = TaskSettings(test_size=16).with_values(lr=3e-3)
    record = fake_record("baseline", 3e-3, 0, 0.5, 0.5, len(task.levels))
    report = task_report(summarize_tasks(task, ["baseline"], [0], {("baseline", 0): record}, settings))
    assert "Learning rate: one shared lr (0.003) for every variant, not tuned per variant" in report
