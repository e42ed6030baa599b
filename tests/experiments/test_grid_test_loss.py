"""benchmarks/tools/grid_test_loss.py: every grid run of a held-out study measured on the evaluation runs' test
windows; an lr planted to win on val alone shows its worse test loss there; a second call measures nothing again."""

from __future__ import annotations

import json

import pytest
from tests.experiments.test_compare_held_out import PLANTED, held_out, plant, split_data  # noqa: F401 (fixture)

from deep_delta.cli.main import main
from helpers import load_tool


def test_the_grid_on_test_shows_the_planted_lr(tmp_path, split_data, capsys, monkeypatch):  # noqa: F811
    plant(monkeypatch, PLANTED)
    out = tmp_path / "held"
    assert main(held_out(out, split_data, steps=6, eval_every=6)) == 0
    monkeypatch.undo()
    capsys.readouterr()
    tool = load_tool("grid_test_loss")
    assert tool.main([str(out), "--data", str(split_data)]) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / "test_vs_lr.json").read_text())
    assert result["chosen_on_val"] == {"baseline": PLANTED, "ddl-dv1": PLANTED}
    assert len(result["points"]) == 8 and not result["left_out"]  # 2 variants x 2 lrs x 2 seeds
    assert {p["tokens"] for p in result["points"] + result["evaluation"]} == {1024}
    for v in ("baseline", "ddl-dv1"):
        def mean(lr, v=v):
            values = [p["test_loss"] for p in result["points"] if p["variant"] == v and p["lr"] == lr]
            assert len(values) == 2
            return sum(values) / 2
        assert mean(PLANTED) > mean(3e-3) + 0.05  # chosen on val, worse on test
        row = next(line for line in printed.splitlines() if line.startswith(f"| {v} |"))
        assert f"**{mean(PLANTED):.4f}**" in row and "(n 2)" in row  # the chosen lr in bold; 2 evaluation seeds
        # the evaluation seeds at the planted lr are measured as the grid's runs at that lr are
        ev = [e["test_loss"] for e in result["evaluation"] if e["variant"] == v]
        assert len(ev) == 2 and min(ev) > mean(3e-3)
    assert (out / "test_vs_lr.png").stat().st_size > 10_000
    kept = {p: p.stat().st_mtime_ns for p in out.glob("lr_*/seed_*/*/test.json")}
    assert len(kept) == 8
    assert tool.main([str(out), "--data", str(split_data)]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("lr_*/seed_*/*/test.json")} == kept  # reused, not remeasured


def test_a_folder_without_a_selection_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="selection.json is missing"):
        load_tool("grid_test_loss").main([str(tmp_path), "--data", str(tmp_path)])
    with pytest.raises(SystemExit) as e:  # argparse: the count type of every `ddl` token option
        load_tool("grid_test_loss").main([str(tmp_path), "--data", str(tmp_path), "--test-tokens", "lots"])
    assert e.value.code == 2
