"""Seeded comparisons: pairing, the interval arithmetic, the equal-wall-clock view, and multi-seed runs."""

from __future__ import annotations

import json
import math

import pytest

from deep_delta.cli.main import main
from deep_delta.experiments import stats
from deep_delta.train.metrics import read_metrics

MODEL = ["--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
         "model.num_attention_heads=2", "--set", "model.max_position_embeddings=64"]


def test_paired_interval_matches_a_hand_computed_example():
    # differences -0.1, -0.2, -0.3: mean -0.2, sd 0.1, t_0.975(2) = 4.303, half width 4.303 * 0.1 / sqrt(3)
    d = stats.paired_difference([1.0, 2.0, 3.0], [1.1, 2.2, 3.3])
    half = 4.303 * 0.1 / math.sqrt(3)
    assert d["mean"] == pytest.approx(-0.2) and d["sd"] == pytest.approx(0.1)
    assert d["ci95"] == pytest.approx([-0.2 - half, -0.2 + half])
    assert (d["wins"], d["n"]) == (3, 3)
    one = stats.paired_difference([1.0, None], [2.0, 5.0])  # a missing pair is left out
    assert (one["mean"], one["ci95"], one["n"]) == (-1.0, None, 1)
    assert stats.t975(1) == 12.706 and stats.t975(30) == 2.042 and abs(stats.t975(120) - 1.980) < 0.002


def test_value_at_interpolates_and_never_extrapolates():
    curve = [(10, 4.0), (20, 3.0), (40, 2.0)]
    assert stats.value_at(curve, 15) == pytest.approx(3.5)
    assert stats.value_at(curve, 30) == pytest.approx(2.5)
    assert stats.value_at(curve, 40) == 2.0
    assert stats.value_at(curve, 5) is None and stats.value_at(curve, 41) is None


def test_the_same_seed_gives_every_variant_the_same_batches(tmp_path, data_dir, monkeypatch):
    from deep_delta.train.step import OptimizerStep

    seen: dict[str, list] = {}
    real = OptimizerStep.__call__

    def spy(self, batches, **kw):
        batches = list(batches)
        seen.setdefault(self.model.config.variant, []).append([(x.clone(), y.clone()) for x, y in batches])
        return real(self, batches, **kw)

    monkeypatch.setattr(OptimizerStep, "__call__", spy)
    args = ["compare", "--variants", "baseline", "ddl-cc", "--out", str(tmp_path / "cmp"), "--data", str(data_dir),
            "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1",
            "--device", "cpu", "--no-progress", "--seeds", "5", "7", "--time-repeats", "1", *MODEL]
    assert main(args) == 0
    base, ddl = seen["baseline"], seen["ddl-cc"]
    assert len(base) == len(ddl) == 8  # 3 steps x 2 seeds in seed order, then 2 rounds of the step timing
    base, ddl = base[:6], ddl[:6]
    for a, b in zip(base, ddl):
        assert all((xa == xb).all() and (ya == yb).all() for (xa, ya), (xb, yb) in zip(a, b))
    assert not all((x0 == x1).all() for (x0, _), (x1, _) in zip(base[0], base[3]))  # seeds differ


def test_multi_seed_compare_writes_per_seed_numbers_and_continues(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--variants", "baseline", "ddl-dv1", "--out", str(out), "--data", str(data_dir),
            "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--eval-every", "1", "--eval-batches", "1",
            "--device", "cpu", "--no-progress", "--seeds", "3", "--time-repeats", "1", *MODEL]
    assert main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "compare.json").read_text())
    assert summary["seeds"] == [0, 1, 2]
    rows = {r["variant"]: r for r in summary["rows"]}
    for v, r in rows.items():
        finals = [[x["val_loss"] for x in read_metrics(out / f"seed_{s}" / v) if "val_loss" in x][-1]
                  for s in (0, 1, 2)]
        assert [p["val_loss"] for p in r["per_seed"]] == finals
        assert r["val_loss"] == pytest.approx(sum(finals) / 3)
    diffs = [a["val_loss"] - b["val_loss"] for a, b in zip(rows["ddl-dv1"]["per_seed"], rows["baseline"]["per_seed"])]
    expect = stats.paired_difference([p["val_loss"] for p in rows["ddl-dv1"]["per_seed"]],
                                     [p["val_loss"] for p in rows["baseline"]["per_seed"]])
    assert rows["ddl-dv1"]["d_val_loss"] == pytest.approx(sum(diffs) / 3)
    assert rows["ddl-dv1"]["d_val_loss_ci95"] == pytest.approx(expect["ci95"])
    assert rows["ddl-dv1"]["wins"] == sum(d < 0 for d in diffs)
    assert rows["ddl-dv1"]["step_time_s"] > 0 and "equal_time_val_loss" in rows["ddl-dv1"]
    assert "95% CI of d" in printed and "lower in" in printed
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # interrupted: one run lost its last checkpoint and metrics beyond step 1; a rerun continues it alone
    before = (out / "seed_0" / "baseline" / "metrics.jsonl").read_text()
    assert main(args) == 0
    assert (out / "seed_0" / "baseline" / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("given, want", [(None, [4]), ([3], [0, 1, 2]), ([0, 2, 5], [0, 2, 5]), ([1], [0])])
def test_seed_list(given, want):
    from deep_delta.cli.options import seed_list

    assert seed_list(given, 4) == want
