"""benchmarks/tools/pack_records.py: a folder of run records packed in place (issue 65 item 5), each run read back
the same before its plain file goes, a second call changing nothing, a run training now skipped, and a run
directory holding both forms with different records refused before anything of it is removed."""

from __future__ import annotations

import gzip
import json

import pytest

from deep_delta.fsutil import dir_lock
from deep_delta.train.metrics import METRICS_FILE, PACKED_METRICS_FILE, read_metrics
from helpers import load_tool


def _run(path, loss):
    path.mkdir(parents=True)
    (path / METRICS_FILE).write_text(json.dumps({"step": 1, "loss": loss}) + "\n")
    (path / "run.json").write_text("{}")
    return path


def test_a_folder_is_packed_once_and_read_the_same(tmp_path, capsys):
    mod = load_tool("pack_records")
    runs = [_run(tmp_path / "study" / "lr_0.001" / v, loss) for v, loss in (("baseline", 5.0), ("ddl-cc", 4.5))]
    before = [read_metrics(r) for r in runs]
    assert mod.main([str(tmp_path / "study")]) == 0
    assert "packed 2 run(s)" in capsys.readouterr().out
    assert [read_metrics(r) for r in runs] == before
    assert all(not (r / METRICS_FILE).exists() and (r / PACKED_METRICS_FILE).is_file() for r in runs)
    assert all((r / "run.json").read_text() == "{}" for r in runs)  # run.json stays plain
    packed = {r: (r / PACKED_METRICS_FILE).read_bytes() for r in runs}
    assert mod.main([str(tmp_path / "study")]) == 0
    assert "packed 0 run(s)" in capsys.readouterr().out
    assert {r: (r / PACKED_METRICS_FILE).read_bytes() for r in runs} == packed


def test_a_run_training_now_is_skipped(tmp_path, capsys):
    mod = load_tool("pack_records")
    run = _run(tmp_path / "study" / "baseline", 5.0)
    with dir_lock(run, "ddl train", name=".lock"):
        assert mod.main([str(tmp_path / "study")]) == 0
    assert f"skipped {run}: a process holds it" in capsys.readouterr().out
    assert (run / METRICS_FILE).is_file() and not (run / PACKED_METRICS_FILE).exists()


def test_both_forms_of_other_records_are_refused_and_kept(tmp_path):
    mod = load_tool("pack_records")
    run = _run(tmp_path / "study" / "baseline", 5.0)
    (run / PACKED_METRICS_FILE).write_bytes(gzip.compress(b'{"step": 1, "loss": 9.0}\n'))
    with pytest.raises(SystemExit, match=f"{run} holds both metrics.jsonl and metrics.jsonl.gz"):
        mod.main([str(tmp_path / "study")])
    assert (run / METRICS_FILE).is_file() and (run / PACKED_METRICS_FILE).is_file()
