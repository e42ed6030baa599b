"""benchmarks/ keeps tools apart from records: every script is in tools/ and in the index, every record is a dated
folder with a README that says when, on what, at which commit and by which command it was measured, and the
index and LATEST.md link only to paths that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RECORDS = sorted(p for p in (BENCH / "records").iterdir() if p.is_dir())
FIELDS = ("**Date:**", "**Device:**", "**Commit:**", "**Command:**", "**What it measured:**", "**Files:**")
LINK = re.compile(r"\]\(([^)#\s]+)\)")


def test_the_top_level_holds_the_index_the_latest_figures_tools_and_records():
    assert sorted(p.name for p in BENCH.iterdir() if p.name != "__pycache__") == [
        "LATEST.md", "QUEUE.md", "README.md", "records", "tools"]


def test_every_script_is_a_tool_and_the_index_documents_it():
    index = (BENCH / "README.md").read_text()
    scripts = sorted(p.name for p in BENCH.rglob("*") if p.suffix in (".py", ".sh"))
    tools = sorted(p.name for p in (BENCH / "tools").iterdir() if p.suffix in (".py", ".sh"))
    assert scripts == tools, "a script outside benchmarks/tools/"
    missing = [t for t in tools if f"[{t}](tools/{t})" not in index]
    assert not missing, f"benchmarks/README.md has no row for {missing}"


@pytest.mark.parametrize("record", RECORDS, ids=[p.name for p in RECORDS])
def test_every_record_is_dated_and_says_how_it_was_measured(record):
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+-(cpu|h100|h200)", record.name), record.name
    readme = (record / "README.md").read_text()
    lines = readme.splitlines()
    for field in FIELDS:
        assert any(line.startswith(f"- {field}") for line in lines), f"{record.name}/README.md lacks {field}"
    assert f"(records/{record.name}/)" in (BENCH / "README.md").read_text(), f"the index does not list {record.name}"


@pytest.mark.parametrize("page", [BENCH / "README.md", BENCH / "LATEST.md",
                                  *(p / "README.md" for p in RECORDS)], ids=lambda p: str(p.relative_to(BENCH)))
def test_links_resolve(page):
    broken = [t for t in LINK.findall(page.read_text())
              if "://" not in t and not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to {broken}"
