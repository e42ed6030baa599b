"""studies/ does not swamp the repository (issue 65 item 5): no tracked file there over FILE_LIMIT, and no study
folder over STUDY_LIMIT but those STUDY_LIMITS names, each with its reason. The run records are kept packed
(metrics.jsonl.gz, studies/README.md); a file or a folder that grows past its limit is named here, with its size,
before it is committed. What git's history holds already cannot shrink: this keeps it from growing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20
FILE_LIMIT = 2 * MB
STUDY_LIMIT = 5 * MB
STUDY_LIMITS = {
    # measured 11.2 MB when its records were packed (2026-12-02): 54 report figures (7.1 MB: every lr's curves for
    # each half and for the merged call, the selection and evaluation curves, the analyses) and 146 runs of 300
    # steps (3.0 MB of packed metrics), each run kept once (p1/, p2/; all/ holds only what the merged call trained)
    "deep12": 12 * MB,
    # measured 5.4 MB: the 146 runs of width 768 (runs768/: 2.7 MB of packed metrics), which the study's points are
    # reported from, and 30 figures (2.1 MB)
    "write_only": 6 * MB,
}


def tracked_sizes() -> dict[str, int]:
    """Every file git tracks under studies/, with its size in the working tree (a file deleted there: left out)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing says which files are tracked")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "studies"], capture_output=True, check=True)
    paths = [p for p in listed.stdout.decode().split("\0") if p]
    return {p: (ROOT / p).stat().st_size for p in paths if (ROOT / p).is_file()}


def test_no_tracked_file_of_studies_is_large():
    large = {p: n for p, n in tracked_sizes().items() if n > FILE_LIMIT}
    assert not large, (f"tracked under studies/ and over {FILE_LIMIT // MB} MB: "
                       + ", ".join(f"{p} ({n / MB:.1f} MB)" for p, n in sorted(large.items())))


def test_no_study_folder_is_over_its_limit():
    sizes: dict[str, int] = {}
    for path, n in tracked_sizes().items():
        parts = Path(path).parts
        if len(parts) > 2:  # studies/STUDY/...
            sizes[parts[1]] = sizes.get(parts[1], 0) + n
    over = {s: n for s, n in sizes.items() if n > STUDY_LIMITS.get(s, STUDY_LIMIT)}
    assert not over, "study folders over their limit: " + ", ".join(
        f"studies/{s}/ ({n / MB:.1f} MB, limit {STUDY_LIMITS.get(s, STUDY_LIMIT) // MB} MB)" for s, n in over.items())
    assert set(STUDY_LIMITS) <= set(sizes), "a limit for a study folder that is not there"
