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
from deep_delta.experiments import test_split
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
    first = test_split.measure_test(cfg, data, 256, step=cfg.steps, say=lambda msg: None)
    path = tmp_path / "run" / "test.json"
    assert first["eval_windows"] == "first" and json.loads(path.read_text()) == first
    real = test_split._evaluate

    def measured(*args):
        measured.calls += 1
        return real(*args)

    measured.calls = 0
    monkeypatch.setattr(test_split, "_evaluate", measured)
    assert test_split.measure_test(cfg, data, 256, step=cfg.steps, say=lambda msg: None) == first
    earlier = {k: v for k, v in first.items() if k != "eval_windows"}  # as test.json was written before plans
    path.write_text(json.dumps(earlier))
    assert test_split.measure_test(cfg, data, 256, step=cfg.steps, say=lambda msg: None) == earlier
    assert measured.calls == 0  # both reused
    spread = test_split.measure_test(replace(cfg, eval_windows="spread"), data, 256, step=cfg.steps,
                                     say=lambda msg: None)
    assert measured.calls == 1 and spread["eval_windows"] == "spread"
    assert spread["tokens"] == first["tokens"] and spread["loss"] != first["loss"]
    assert json.loads(path.read_text()) == spread
