"""benchmarks/tools/why_figure.py: what it draws of each ``ddl analyze`` report (the state read through the depth, the
share erased, the untied gates) and its refusal of a path that is not a report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import TOOLS, load_tool

TOOL = TOOLS / "why_figure.py"


def delta_report(untied: bool) -> dict:
    """Two sublayers with states 1 -> 2 -> 4, erasing 0.1 and 0.3; the untied one with its two gates."""
    sub = {}
    for i, (erased, beta) in enumerate(((0.1, 0.5), (0.3, 0.7))):
        row = {"erased": erased, "beta": {"mean": beta}}
        if untied:
            row["write_gate"] = {"mean": beta + 0.2}
        sub[f"layer{i}"] = row
    return {"states": {"s0": {"norm_before": 1.0, "norm_after": 2.0}, "s1": {"norm_before": 2.0, "norm_after": 4.0}},
            "sublayers": sub}


def test_series_of_a_ddl_an_untied_and_an_attnres_report():
    mod = load_tool("why_figure")
    tied = mod.series(delta_report(untied=False))
    assert tied["state"] == [1.0, 2.0, 4.0]           # each sublayer's input, then the output
    assert tied["erased"] == [0.1, 0.3]
    assert tied["erase gate"] == [] and tied["write gate"] == []
    untied = mod.series(delta_report(untied=True))
    assert untied["erase gate"] == [0.5, 0.7]
    assert untied["write gate"] == pytest.approx([0.7, 0.9])
    depth = mod.series({"depth": {"a": {"read_norm": 3.0}, "b": {"read_norm": 5.0}}})
    assert depth["state"] == [3.0, 5.0] and depth["erased"] == []


def test_the_figure_is_written_and_a_missing_report_refused(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(delta_report(untied=False)))
    b.write_text(json.dumps(delta_report(untied=True)))
    out = tmp_path / "why.png"
    done = subprocess.run([sys.executable, str(TOOL), "--out", str(out), f"ddl-cc={a}", f"untied={b}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 10_000
    bad = subprocess.run([sys.executable, str(TOOL), "--out", str(out), f"x={tmp_path / 'missing.json'}"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "LABEL=path/to/analysis.json" in bad.stderr
