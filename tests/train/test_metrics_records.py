"""A run's metrics kept packed (issue 65 item 5): ``metrics.jsonl.gz`` holds the bytes of ``metrics.jsonl``,
gzip-compressed the same way every time, and every reader takes either form; a run directory holding both is
refused; a run continued from a packed record appends to a plain file again; ``overwrite`` removes both."""

from __future__ import annotations

import gzip
import json

import pytest

from deep_delta.train import run_dir as rd
from deep_delta.train.metrics import (
    METRICS_FILE,
    PACKED_METRICS_FILE,
    metrics_file,
    pack_metrics,
    read_metrics,
    truncate_metrics,
)
from deep_delta.train.trainer import Trainer

RECORDS = [{"step": 1, "loss": 5.5, "lr": 1e-3}, {"step": 2, "loss": 5.25, "lr": 1e-3},
           {"step": 2, "val_loss": 5.0, "val_ppl": 148.4131591025766}]


def _run(tmp_path, name="run"):
    run = tmp_path / name
    run.mkdir()
    (run / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return run


def test_a_packed_record_reads_as_the_plain_one_and_packs_the_same_every_time(tmp_path):
    run, again = _run(tmp_path), _run(tmp_path, "again")
    plain = (run / METRICS_FILE).read_bytes()
    assert pack_metrics(run) == run / PACKED_METRICS_FILE
    assert not (run / METRICS_FILE).exists()
    packed = (run / PACKED_METRICS_FILE).read_bytes()
    assert gzip.decompress(packed) == plain  # `zcat` gives the run's file back, byte for byte
    assert packed[4:8] == b"\0\0\0\0" and not packed[3] & 0x08  # mtime 0, no file name
    pack_metrics(again)
    assert (again / PACKED_METRICS_FILE).read_bytes() == packed  # deterministic: git stores one blob
    assert read_metrics(run) == read_metrics(run / METRICS_FILE) == RECORDS
    assert metrics_file(run) == run / PACKED_METRICS_FILE
    assert pack_metrics(run) == run / PACKED_METRICS_FILE and (run / PACKED_METRICS_FILE).read_bytes() == packed


def test_both_forms_are_refused_unless_one_is_the_others_copy(tmp_path):
    run = _run(tmp_path)
    (run / PACKED_METRICS_FILE).write_bytes(gzip.compress(b'{"step": 1, "loss": 9.0}\n'))
    for read in (metrics_file, read_metrics):
        with pytest.raises(ValueError, match=f"{run} holds both metrics.jsonl and metrics.jsonl.gz, so which one is "
                                             "the run's metrics is ambiguous; allowed: one of them"):
            read(run)
    with pytest.raises(ValueError, match="ambiguous"):
        pack_metrics(run)
    assert (run / METRICS_FILE).is_file()  # nothing removed
    (run / PACKED_METRICS_FILE).write_bytes(gzip.compress((run / METRICS_FILE).read_bytes()))
    pack_metrics(run)  # a packing stopped before it removed the plain file: finished now
    assert not (run / METRICS_FILE).exists() and read_metrics(run) == RECORDS


def test_a_packed_file_that_is_not_gzip_is_named(tmp_path):
    run = _run(tmp_path)
    pack_metrics(run)
    path = run / PACKED_METRICS_FILE
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(ValueError, match=f"{path} is not a complete gzip file"):
        read_metrics(run)


def test_a_packed_run_continued_appends_to_a_plain_file(tmp_path):
    run = _run(tmp_path)
    pack_metrics(run)
    truncate_metrics(run, 1)  # what a resumed run does before it appends
    assert not (run / PACKED_METRICS_FILE).exists()
    assert read_metrics(run / METRICS_FILE) == RECORDS[:1]


def test_overwrite_removes_a_packed_record_too(tmp_path, make_config):
    cfg = make_config(tmp_path / "run", steps=2, eval_every=0, save_every=0)
    Trainer(cfg, progress=False, quiet=True).run()
    pack_metrics(tmp_path / "run")
    (tmp_path / "run" / "run.json").unlink()
    assert rd.holds_run(tmp_path / "run")  # the packed record alone is a run
    Trainer(cfg, progress=False, quiet=True, overwrite=True).run()
    assert metrics_file(tmp_path / "run") == tmp_path / "run" / METRICS_FILE
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [1, 2]
