"""README's Layout names every package under src/deep_delta (issue 50): a package added or moved shows up there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_layout_names_every_package():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):readme.index("## Status and limits")]
    src = ROOT / "src" / "deep_delta"
    top = sorted(p.name for p in src.iterdir() if (p / "__init__.py").exists())
    for name in top:
        assert re.search(rf"^\s+{name}/", layout, re.M), f"README's Layout does not name {name}/"
    for package in ("ops",):  # the op packages, named inside ops/'s line
        for sub in sorted(p.name for p in (src / package).iterdir() if (p / "__init__.py").exists()):
            assert f"{sub}/" in layout, f"README's Layout does not name {package}/{sub}/"


def test_run_records_live_in_studies_not_in_docs():
    """Issue 58 (item 7 of the issue): run records are data, read by the tools; docs/ holds documents. The run
    records (run.json, metrics.jsonl) lived under docs/evidence/ (146 metrics files, 19 MB); they are in studies/,
    which README's Layout names."""
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):readme.index("## Status and limits")]
    assert re.search(r"^\s+studies/", layout, re.M)
    records = ("run.json", "metrics.jsonl", "metrics.jsonl.gz", "compare.json", "tasks.json", "scaling.json")
    assert not [p for name in records for p in (ROOT / "docs").rglob(name)]
    assert len(list((ROOT / "studies").rglob("metrics.jsonl*"))) >= 146  # packed: metrics.jsonl.gz


def test_a_fresh_machine_has_two_commands():
    """README's first section gives exactly two commands, each setup and then one thing: the main job, the tests
    (the one .ci/run runs verbatim); what else a reader needs (a CPU-only install, `ddl` on PATH) is prose."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Fresh machine"):readme.index("## A short tour")]
    commands = [line.strip() for line in section.splitlines() if line.startswith("    ")]
    assert commands == ["bash scripts/setup.sh && .venv/bin/ddl compare",
                        "bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2"], commands
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()
    assert "source .venv/bin/activate" in section and "--index-url https://download.pytorch.org/whl/cpu" in section
