"""``ddl compare --lrs``: every (variant, lr, seed) trained and kept with its lr, each variant reported at its own
best lr on validation loss, a diverging lr a data point, a rerun reusing every run, and bad grids refused."""

from __future__ import annotations

import json

import pytest

from deep_delta.cli.main import main
from deep_delta.experiments import stats
from deep_delta.train.metrics import read_metrics

MODEL = ["--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
         "model.num_attention_heads=2", "--set", "model.max_position_embeddings=64"]


def micro(out, data_dir, *extra):
    return ["compare", "--variants", "baseline", "ddl-dv1", "--out", str(out), "--data", str(data_dir),
            "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--eval-every", "3", "--eval-batches", "1",
            "--warmup-steps", "0", "--device", "cpu", "--threads", "1", "--no-progress", "--time-repeats", "0",
            *MODEL, *extra]


def final_val(run_dir):
    return [r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r][-1]


def diverge_when(monkeypatch, failing, at=None):
    """Runs for which ``failing(cfg)`` holds see a NaN loss at step ``at`` (default: their last): the trainer's own
    divergence path ends them there (under `on_divergence` raise or stop), as a real divergence would."""
    from deep_delta.train.trainer import Trainer

    real = Trainer._check_finite

    def check(self, loss, norm):
        if failing(self.cfg) and self.step + 1 == (at or self.cfg.steps):
            loss = float("nan")
        return real(self, loss, norm)

    monkeypatch.setattr(Trainer, "_check_finite", check)


def test_grid_reports_each_variant_at_its_best_validation_lr_and_reuses_runs(tmp_path, data_dir, capsys,
                                                                              monkeypatch):
    out = tmp_path / "grid"
    lrs = [1e-3, 3e-3, 1e-2]
    # every seed at 1e-2 diverges; so does ddl-dv1 seed 1 at 3e-3, which takes 3e-3 out of ddl-dv1's choice
    diverge_when(monkeypatch, lambda cfg: cfg.lr == 1e-2 or (cfg.lr, cfg.variant, cfg.seed) == (3e-3, "ddl-dv1", 1))
    args = micro(out, data_dir, "--seeds", "2", "--lrs", *map(str, lrs))
    assert main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "compare.json").read_text())
    grid = summary["lr_selection"]
    assert grid["lrs"] == lrs and len(summary["lr_grid"]) == 2 * 3 * 2 and summary["settings"]["lr"] is None
    for p in summary["lr_grid"]:
        run = out / f"lr_{p['lr']:g}" / f"seed_{p['seed']}" / p["variant"]
        assert json.loads((run / "run.json").read_text())["train_config"]["lr"] == p["lr"]
        if p["lr"] == 1e-2 or (p["lr"], p["variant"], p["seed"]) == (3e-3, "ddl-dv1", 1):
            assert p["diverged"].startswith("non-finite loss (loss nan") and p["diverged"].endswith("at step 3")
            assert p["value"] is None
        else:
            assert p["diverged"] is None and p["value"] == final_val(run)
    rows = {r["variant"]: r for r in summary["rows"]}
    for v, row in rows.items():
        eligible = lrs[:2] if v == "baseline" else lrs[:1]
        means = {lr: sum(final_val(out / f"lr_{lr:g}" / f"seed_{s}" / v) for s in (0, 1)) / 2 for lr in eligible}
        assert row["lr"] == min(means, key=means.get)
        assert [x["val_loss"] for x in row["per_seed"]] == [final_val(out / f"lr_{row['lr']:g}" / f"seed_{s}" / v)
                                                            for s in (0, 1)]
        assert grid["chosen"][v]["by_lr"]["0.01"]["n"] == 0
    paired = stats.paired_difference([x["val_loss"] for x in rows["ddl-dv1"]["per_seed"]],
                                     [x["val_loss"] for x in rows["baseline"]["per_seed"]])
    assert rows["ddl-dv1"]["d_val_loss"] == pytest.approx(paired["mean"])
    assert rows["ddl-dv1"]["d_val_loss_ci95"] == pytest.approx(paired["ci95"])
    report = (out / "compare.md").read_text()
    assert "each variant at its own best lr of the grid 0.001, 0.003, 0.01, chosen on the final validation loss" \
        in report
    assert "| baseline |" in report and "| diverged |" in report and "lr_sensitivity.png" in report
    assert "(diverged in seed(s) 1)" in report
    assert "Learning rate: one shared lr (0.001) for every variant" in (out / "lr_0.001" / "compare.md").read_text()
    assert "final validation loss at every lr" in printed
    for name in ("lr_sensitivity.png", "curves.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    # a rerun trains nothing: every run is reused from its own directory
    before = {p: p.read_text() for p in out.glob("lr_*/seed_*/*/metrics.jsonl")}
    assert len(before) == 12
    assert main(args) == 0
    assert {p: p.read_text() for p in out.glob("lr_*/seed_*/*/metrics.jsonl")} == before


def test_a_variant_diverged_at_every_lr_is_reported_as_such(tmp_path, data_dir, capsys, monkeypatch):
    out = tmp_path / "all-diverged"
    diverge_when(monkeypatch, lambda cfg: True)
    assert main(micro(out, data_dir, "--lrs", "1e-3", "2e-3")) == 1
    captured = capsys.readouterr()
    summary = json.loads((out / "compare.json").read_text())
    assert all(r["lr"] is None and r["diverged"] == "diverged at every lr" for r in summary["rows"])
    assert "baseline diverged: diverged at every lr" in captured.err


@pytest.mark.parametrize("extra, expected", [
    (["--lrs", "1e-3", "--lr", "2e-3"], "--lrs got 0.001 together with one learning rate (--lr 0.002); allowed: "
                                        "either the grid or one lr, not both"),
    (["--lrs", "1e-3", "--set", "lr=2e-3"], "(--set lr=2e-3)"),
    (["--lrs", "1e-3", "0"], "--lrs got [0.0] (not a finite number > 0)"),
    (["--lrs", "1e-3", "1e-3"], "--lrs got [0.001] more than once"),
])
def test_bad_grids_are_refused_before_anything_runs(tmp_path, data_dir, capsys, extra, expected):
    out = tmp_path / "bad"
    assert main(micro(out, data_dir, *extra)) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_a_non_finite_lr_is_refused_by_the_parser(tmp_path, data_dir, capsys):
    with pytest.raises(SystemExit) as e:
        main(micro(tmp_path / "bad", data_dir, "--lrs", "1e-3", "nan"))
    assert e.value.code == 2 and "--lrs" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_each_variant_trains_only_its_own_grid_and_is_chosen_within_it(tmp_path, data_dir, capsys):
    """Issue 64: ``--lrs 1e-3 3e-3 ddl-dv1=3e-3,1e-2``: the plain lrs are the baseline's grid, ddl-dv1 has its own;
    each lr's folder holds the variants whose grid has it, each variant is chosen within its grid (its edge too),
    the table marks the lrs outside a grid, and --report-only brings back the same report."""
    out = tmp_path / "own"
    assert main(micro(out, data_dir, "--seeds", "2", "--lrs", "1e-3", "3e-3", "ddl-dv1=3e-3,1e-2")) == 0
    printed = capsys.readouterr().out
    assert "each at every lr of its own grid (baseline 0.001 0.003; ddl-dv1 0.003 0.01)" in printed
    trained = sorted((p.parent.parent.parent.name, p.parent.name) for p in out.glob("lr_*/seed_*/*/run.json"))
    assert trained == sorted([("lr_0.001", "baseline")] * 2 + [("lr_0.003", "baseline")] * 2
                             + [("lr_0.003", "ddl-dv1")] * 2 + [("lr_0.01", "ddl-dv1")] * 2)
    summary = json.loads((out / "compare.json").read_text())
    grid = summary["lr_selection"]
    assert grid["lrs"] == [1e-3, 3e-3, 1e-2] and grid["grids"] == {"baseline": [1e-3, 3e-3], "ddl-dv1": [3e-3, 1e-2]}
    for variant, lrs in grid["grids"].items():
        chosen = grid["chosen"][variant]
        assert set(chosen["by_lr"]) == {f"{x:g}" for x in lrs} and chosen["lr"] in lrs
        means = {x: chosen["by_lr"][f"{x:g}"]["mean"] for x in lrs}
        assert chosen["lr"] == min(means, key=means.get)
        assert chosen["edge"] == ("lowest" if chosen["lr"] == min(lrs) else "highest")
    report = (out / "compare.md").read_text()
    assert "its own grid (baseline 0.001, 0.003; ddl-dv1 0.003, 0.01)" in report
    row = next(line for line in report.splitlines() if line.startswith("| baseline |") and "lr 0.01" not in line
               and line.count("|") == 6)
    assert row.split("|")[3].strip() == "-" or row.split("|")[4].strip() == "-"
    assert "`-`: an lr outside the variant's grid (not trained)" in report
    live = report
    assert main(["compare", "--report-only", "--out", str(out), "--threads", "1"]) == 0
    strip = lambda text: [x for x in text.splitlines() if not x.startswith("Machine:")]  # noqa: E731
    assert strip((out / "compare.md").read_text()) == strip(live)


@pytest.mark.parametrize("items, match", [
    (["1e-3", "ddl-cc=2e-3"], r"--lrs gives a grid for ddl-cc, which is not compared"),
    (["ddl-dv1=2e-3,4e-3"], r"--lrs gives no grid for .baseline."),
    (["1e-3", "ddl-dv1=1e-3", "ddl-dv1=2e-3"], r"names .ddl-dv1. twice"),
    (["1e-3", "ddl-dv1=2e-3,2e-3"], r"ddl-dv1.s grid: --lrs got \[0.002\] more than once"),
    (["1e-3", "ddl-dv1=0"], r"ddl-dv1.s grid: --lrs got \[0.0\] \(not a finite number > 0\)"),
])
def test_a_bad_grid_per_variant_is_refused_before_anything_trains(tmp_path, data_dir, capsys, items, match):
    out = tmp_path / "bad"
    assert main(micro(out, data_dir, "--lrs", *items)) == 2
    assert __import__("re").search(match, capsys.readouterr().err)
    assert not out.exists() or not any(out.rglob("run.json"))


@pytest.mark.parametrize("item", ["ddl-dv1=abc", "ddl-dv1=", "=1e-3", "ddl-dv1=1e-3,nan"])
def test_a_malformed_grid_item_is_refused_by_the_parser(tmp_path, data_dir, capsys, item):
    with pytest.raises(SystemExit) as e:
        main(micro(tmp_path / "bad", data_dir, "--lrs", "1e-3", item))
    assert e.value.code == 2 and f"got {item!r}" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
