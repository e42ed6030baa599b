"""curves.png's third panel (issue 57, item 4's figure "loss against tokens x measured step cost"): with measured step
times, each variant's validation curve against the cost it spent, its steps x its step time's ratio to the
reference's; without them, the two panels as before."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from deep_delta.experiments import compare_report  # noqa: E402


def _runs(root):
    for variant, losses in (("baseline", (3.0, 2.5, 2.2)), ("ddl-cc", (2.9, 2.4, 2.1))):
        d = root / variant
        d.mkdir(parents=True)
        lines = []
        for i, loss in enumerate(losses):
            step = 10 * (i + 1)
            lines += [json.dumps({"step": step, "loss": loss + 0.1}), json.dumps({"step": step, "val_loss": loss})]
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _figure(monkeypatch, tmp_path, costs):
    seen = {}
    monkeypatch.setattr(compare_report, "save_figure", lambda fig, path, dpi: seen.setdefault("fig", fig) and path)
    compare_report.plot_curves(tmp_path, ["baseline", "ddl-cc"], tmp_path / "curves.png", [0], None, costs)
    return seen["fig"]


def test_the_cost_panel_stretches_each_curve_by_its_step_ratio(monkeypatch, tmp_path):
    _runs(tmp_path)
    fig = _figure(monkeypatch, tmp_path, {"baseline": 1.0, "ddl-cc": 1.5})
    assert len(fig.axes) == 3
    lines = {line.get_label(): list(line.get_xdata()) for line in fig.axes[2].get_lines()}
    assert lines["Baseline"] == [10, 20, 30]
    assert lines["DDL-CC"] == pytest.approx([15, 30, 45])
    assert "cost" in fig.axes[2].get_xlabel()


def test_without_step_times_two_panels(monkeypatch, tmp_path):
    _runs(tmp_path)
    assert len(_figure(monkeypatch, tmp_path, None).axes) == 2
