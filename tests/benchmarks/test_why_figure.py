"""benchmarks/tools/why_figure.py: what it draws of each ``ddl analyze`` report (the state read through the depth, the
share erased, the untied gates) and its refusals, one line each before anything is written: a path that is not a
report (missing, not JSON, not an object, not an analysis: round 6's WF1, WF3) and an ``--out`` it cannot write
(WF1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import TOOLS, load_tool, tool_refusal

TOOL = TOOLS / "why_figure.py"
ENV = dict(os.environ, PYTHONPATH=str(TOOLS.parents[1] / "src"))  # this tree's library (fsutil's JSON reader)


def delta_report(untied: bool) -> dict:
    """Two sublayers with states 1 -> 2 -> 4, erasing 0.1 and 0.3; the untied one with its two gates."""
    sub = {}
    for i, (erased, beta) in enumerate(((0.1, 0.5), (0.3, 0.7))):
        row = {"erased": erased, "beta": {"mean": beta}}
        if untied:
            row["write_gate"] = {"mean": beta + 0.2}
        sub[f"layer{i}"] = row
    return {"variant": "ddl-cc-untied" if untied else "ddl-cc", "windows": 4, "probes": ["states", "delta"],
            "states": {"s0": {"norm_before": 1.0, "norm_after": 2.0}, "s1": {"norm_before": 2.0, "norm_after": 4.0}},
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
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 10_000
    bad = subprocess.run([sys.executable, str(TOOL), "--out", str(out), f"x={tmp_path / 'missing.json'}"],
                         capture_output=True, text=True, timeout=120, env=ENV)
    assert bad.returncode != 0 and "LABEL=path/to/analysis.json" in bad.stderr


def refused(*argv) -> str:
    """The one line why_figure.py exits with (SystemExit: printed on stderr, exit 1)."""
    return tool_refusal("why_figure", *argv)


def test_wf1_a_report_that_is_not_json_or_not_an_object_is_refused(tmp_path):
    """WF1: ``x=wf/bad.json`` (``garbage``) and ``x=wf/list.json`` (``[1]``): JSONDecodeError, AttributeError
    tracebacks. Now one line naming the file and what it should be; no figure written."""
    bad, listed, out = tmp_path / "bad.json", tmp_path / "list.json", tmp_path / "1.png"
    bad.write_text("garbage")
    listed.write_text("[1]")
    said = refused("--out", out, f"x={bad}")
    assert f"{bad} is not valid JSON" in said and "`ddl analyze` report" in said
    said = refused("--out", out, f"x={listed}")
    assert f"{listed} is not a `ddl analyze` report (the analysis.json it writes): it holds a JSON list" in said
    assert not out.exists()


@pytest.mark.parametrize("name", ["nodir/5.png", "analysis.json", "why.md", "no_suffix"])
def test_wf1_an_out_matplotlib_cannot_write_is_refused_before_anything_is_written(tmp_path, name):
    """WF1: ``--out wf/nodir/5.png`` (FileNotFoundError) and ``--out lossy/peri-ln/analysis.json
    x=lossy/peri-ln/analysis.json`` (ValueError: Format 'json' is not supported, after drawing): tracebacks. Now
    refused before anything is read or drawn, the input untouched."""
    report = tmp_path / "analysis.json"
    report.write_text(json.dumps(delta_report(untied=False)))
    kept = report.read_bytes()
    out = tmp_path / name
    said = refused("--out", out, f"x={report}")
    assert said.startswith(f"why_figure.py: --out got '{out}'"), said
    assert ("folder" in said and "does not exist" in said) if "/" in name else "allowed: a path ending in one of .png" \
        in said
    assert report.read_bytes() == kept and sorted(p.name for p in tmp_path.iterdir()) == ["analysis.json"]


def test_wf3_a_json_that_is_not_an_analysis_is_refused(tmp_path):
    """WF3: ``x=cmp/r0/compare.json`` (a ``ddl compare`` summary): a figure of three empty panels, exit 0. Now one
    line naming the file and what was expected; no figure. A report without anything the figure draws is refused
    too."""
    compare, out = tmp_path / "compare.json", tmp_path / "3.png"
    compare.write_text(json.dumps({"rows": [], "reference": "baseline", "seeds": [0, 1], "settings": {}}))
    said = refused("--out", out, f"x={compare}")
    assert said == (f"why_figure.py: {compare} is not a `ddl analyze` report (the analysis.json it writes): it has no "
                    "windows or probes; allowed: the analysis.json of `ddl analyze --model RUN` (an object with "
                    "windows, probes and at least one of states, depth, sublayers)")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"windows": 4, "probes": []}))
    assert "it has none of states, depth, sublayers" in refused("--out", out, f"x={bare}")
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps({"windows": 4, "probes": ["states"], "states": {"s0": {"norm": 1.0}}}))
    assert "its states, depth, sublayers are not as `ddl analyze` writes them" in refused("--out", out, f"x={damaged}")
    assert not out.exists()


def test_wf_refusals_are_one_line_on_stderr_without_a_traceback(tmp_path):
    """The same refusals from the command line: exit 1, one line on stderr, no traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text("garbage")
    done = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "x.png"), f"x={bad}"],
                          capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.startswith("why_figure.py: ")
