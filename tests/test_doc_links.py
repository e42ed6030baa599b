"""Every relative link of README.md, the documents in docs/ and the READMEs of studies/ points at a file or folder
that exists (the study records moved from docs/evidence/ to studies/, issue 58: a link left behind shows here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "studies").rglob("README.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(page):
    broken = [t for t in LINK.findall(page.read_text()) if "://" not in t and not t.startswith("mailto:")
              and not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to {broken}"


def test_the_documents_link_to_the_study_records():
    evidence = (ROOT / "docs" / "evidence.md").read_text()
    assert "](../studies/" in evidence and "](evidence/" not in evidence
