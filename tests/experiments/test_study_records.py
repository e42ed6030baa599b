"""The committed studies report from their packed records (issue 65 item 5): a sample of studies/ copied to a
temporary folder and brought together with ``ddl compare --report-only`` gives the numbers of its committed report,
every run read from its metrics.jsonl.gz (no plain metrics.jsonl is kept under studies/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from deep_delta.cli.main import main

STUDIES = Path(__file__).resolve().parents[2] / "studies"
# (the records, the committed report they give, folders whose runs join them first as run.sh copies them: cp -rn)
SAMPLE = {
    "main_job": ("main_job", "main_job/compare.json", ()),  # one seed, four variants
    "firstlook_rivals": ("firstlook_rivals", "firstlook_rivals/compare.json", ()),  # an lr grid, two seeds
    "write_only 768": ("write_only/runs768/study48-768/d768_s300", "write_only/d768_s300/compare.json", ()),
    "deep12": ("deep12/all", "deep12/all/compare.json", ("deep12/p1", "deep12/p2")),  # held out, on test
}


def _rows(summary: dict, fields: dict[str, set] | None = None) -> dict[str, list]:
    """Each variant's numbers; ``fields``: each variant's per-seed fields to compare (a report made before a field
    existed, ``train_wall_s``, has not got it)."""
    return {r["variant"]: [r.get("lr"), r.get("val_loss"), r.get("d_val_loss"), r.get("d_val_loss_ci95"),
                           r.get("test_loss"), r.get("d_test_loss"), r.get("d_test_loss_ci95"), r.get("test_wins"),
                           [{k: v for k, v in x.items() if fields is None or k in fields[r["variant"]]}
                            for x in r["per_seed"]]] for r in summary["rows"]}


def _unordered(value) -> list | None:
    return None if value is None else sorted(json.dumps(x, sort_keys=True) for x in value)


def _copy_missing(source: Path, target: Path) -> None:
    """``cp -rn SOURCE/. TARGET/``: what ``TARGET`` lacks."""
    def copy(src, dst):
        if not Path(dst).exists():
            shutil.copy2(src, dst)
    shutil.copytree(source, target, dirs_exist_ok=True, copy_function=copy)


def test_no_plain_metrics_are_kept_in_studies():
    assert not list(STUDIES.rglob("metrics.jsonl")), "studies/ keeps its runs' metrics packed (pack_records.py)"
    assert len(list(STUDIES.rglob("metrics.jsonl.gz"))) >= 300


@pytest.mark.parametrize("name", list(SAMPLE))
def test_a_committed_study_reports_its_numbers_from_its_packed_records(name, tmp_path, capsys):
    records, report, halves = SAMPLE[name]
    out = tmp_path / "study"
    shutil.copytree(STUDIES / records, out)
    for half in halves:
        _copy_missing(STUDIES / half, out)
    assert main(["compare", "--report-only", "--out", str(out), "--threads", "1"]) == 0
    got, want = (json.loads(p.read_text()) for p in (out / "compare.json", STUDIES / report))
    assert _rows(got, {r["variant"]: set(r["per_seed"][0]) for r in want["rows"]}) == _rows(want)
    for key in ("seeds", "timing", "lr_selection", "step_costs"):
        assert got.get(key) == want.get(key), key
    if want.get("held_out") is not None:  # what a held-out study records since (the test windows' plan) added
        added = {k: v for k, v in got["held_out"].items() if k not in want["held_out"]}
        assert {k: got["held_out"][k] for k in want["held_out"]} == want["held_out"]
        # where the study's data is on this machine with its source runs, why there is no loss per source is said
        note = added.pop("sources_note", None)
        assert note is None or "record none (measured before it was recorded" in note, note
        # every record here predates spread windows; the count asked (each test.json's tokens_asked) is recorded since
        assert added == {"test_windows": "first", "test_tokens_asked": 250_000}, added
    for key in ("lr_grid", "break_even_checks"):
        assert _unordered(got.get(key)) == _unordered(want.get(key)), key
