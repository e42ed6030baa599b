"""The test measurement of a held-out study (``RUN/test.json``) reads the windows its run's ``eval_windows`` names,
records that plan, and is reused only for the same plan: a record of another plan is measured again, and one written
before records named a plan counts as the first windows."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from deep_delta.data.shards import open_shard, write_shard_record
from deep_delta.experiments import held_out_split
from deep_delta.train.data import TrainData
from deep_delta.train.trainer import train


@pytest.fixture(scope="module")
def with_test(tmp_path_factory, data_dir):
    """The training tests' data with a test split of 4,000 tokens."""
    out = tmp_path_factory.mktemp("test_windows") / "bytes"
    shutil.copytree(data_dir, out)
    record = write_shard_record(out / "test_000000.bin", np.asarray(open_shard(out / "train_000000.bin"))[-4000:])
    meta = json.loads((out / "meta.json").read_text())
    meta["splits"]["test"] = {"num_tokens": record["num_tokens"], "shards": [record]}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_test_json_names_its_plan_and_another_plan_is_measured_again(tmp_path, with_test, make_config, monkeypatch):
    cfg = make_config(tmp_path / "run", data=with_test, eval_windows="first", steps=2, eval_every=0)
    train(cfg, progress=False, quiet=True)
    data = TrainData.resolve(str(with_test))
    first = held_out_split.measure_test(cfg, data, 256, step=cfg.steps, say=lambda msg: None)
    path = tmp_path / "run" / "test.json"
    assert first["eval_windows"] == "first" and json.loads(path.read_text()) == first
    real = held_out_split._evaluate

    def measured(*args):
        measured.calls += 1
        return real(*args)

    measured.calls = 0
    monkeypatch.setattr(held_out_split, "_evaluate", measured)
    assert held_out_split.measure_test(cfg, data, 256, step=cfg.steps, say=lambda msg: None) == first
    earlier = {k: v for k, v in first.items() if k != "eval_windows"}  # as test.json was written before plans
    path.write_text(json.dumps(earlier))
    assert held_out_split.measure_test(cfg, data, 256, step=cfg.steps, say=lambda msg: None) == earlier
    assert measured.calls == 0  # both reused
    spread = held_out_split.measure_test(replace(cfg, eval_windows="spread"), data, 256, step=cfg.steps,
                                     say=lambda msg: None)
    assert measured.calls == 1 and spread["eval_windows"] == "spread"
    assert spread["tokens"] == first["tokens"] and spread["loss"] != first["loss"]
    assert json.loads(path.read_text()) == spread


def test_test_json_records_the_loss_of_each_source(tmp_path, make_config):
    from pydoc_data.topics import topics

    from deep_delta.data import ByteTokenizer, write_dataset

    texts = [topics[k] for k in sorted(topics)[:40]]
    docs = texts[:20] + [t[::-1] for t in texts[20:]]
    data_dir = tmp_path / "named"
    write_dataset(docs, ByteTokenizer(), data_dir, val_fraction=0.1, test_fraction=0.1,
                  sources=[("prose", 20), ("backwards", 20)])
    cfg = make_config(tmp_path / "run", data=data_dir, steps=2, eval_every=0)
    train(cfg, progress=False, quiet=True)
    data = TrainData.resolve(str(data_dir))
    assert held_out_split.sources_note(data) is None
    record = held_out_split.measure_test(cfg, data, 1024, step=cfg.steps, say=lambda msg: None)
    assert list(record["sources"]) == ["prose", "backwards"]  # the spread windows reach both
    parts = record["sources"].values()
    assert sum(x["tokens"] for x in parts) == record["tokens"]
    assert sum(x["loss"] * x["tokens"] for x in parts) / record["tokens"] == pytest.approx(record["loss"], rel=1e-5)
    assert json.loads((tmp_path / "run" / "test.json").read_text())["sources"] == record["sources"]


def test_the_report_pairs_each_sources_test_loss_by_seed():
    from deep_delta.experiments.compare_report import source_section
    from deep_delta.experiments.held_out import source_rows

    def record(a, b):
        return {"sources": {"alpha": {"loss": a, "tokens": 100}, "beta": {"loss": b, "tokens": 28}}}

    tests = {("baseline", 100): record(2.0, 3.0), ("baseline", 101): record(2.2, 3.4),
             ("ddl-cc", 100): record(1.9, 3.1), ("ddl-cc", 101): record(2.0, 3.3)}
    held = source_rows(tests, ["baseline", "ddl-cc"], [100, 101], "baseline", {})
    (alpha, beta) = held["sources"]
    assert (alpha["source"], alpha["tokens"], beta["source"]) == ("alpha", 100, "beta")
    assert alpha["variants"]["baseline"]["loss"] == pytest.approx(2.1)
    assert alpha["variants"]["ddl-cc"]["d"] == pytest.approx(-0.15) and alpha["variants"]["ddl-cc"]["n"] == 2
    assert beta["variants"]["ddl-cc"]["d"] == pytest.approx(0.0)
    lines = source_section({"reference": "baseline", "rows": [{"variant": "baseline"}, {"variant": "ddl-cc"}],
                            "held_out": held})
    assert "| source | tokens | baseline loss | ddl-cc d loss (95% CI) |" in lines
    assert any(line.startswith("| alpha | 100 | 2.1000 | -0.1500 [") for line in lines)
    # a run measured before the loss per source was recorded: no table, one line saying so
    partial = {**tests, ("ddl-cc", 101): {"loss": 2.5}}
    note = source_rows(partial, ["baseline", "ddl-cc"], [100, 101], "baseline", {})["sources_note"]
    assert note.startswith("no test loss per source: 1 of the 4 evaluation runs' test.json record none")
    assert source_section({"held_out": {"sources_note": note}}) == ["", f"Test loss per source: {note}."]
    # none recorded, on data that names no sources: nothing to say
    assert source_rows({k: {"loss": 2.0} for k in tests}, ["baseline", "ddl-cc"], [100, 101], "baseline", {}) == {}


def test_a_named_corpus_without_source_runs_is_said_in_one_line(tmp_path):
    from pathlib import Path

    data = TrainData(Path("/data/prose"), {"source": "prose-v1", "splits": {"test": {"num_tokens": 10}}}, "f" * 64)
    note = held_out_split.sources_note(data)
    assert note.startswith("no test loss per source: the test split of /data/prose records no sources (it was "
                           "prepared from prose-v1 before `ddl data prepare` recorded where each source's tokens lie")
    assert held_out_split.sources_note(TrainData(Path("/d"), {"source": "notes.jsonl"}, "f" * 64)) is None
