"""Which windows of the split a validation of part of it reads (``TrainConfig.eval_windows``): spread evenly over the
split by default, the first ones as every run did before the setting existed. A record without the setting (run.json,
a checkpoint, a study's summary) is read as such a run: reused as one, refused as a spread run, reported as one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from deep_delta.cli.main import main
from deep_delta.data.shards import write_shard_record
from deep_delta.train.config import TrainConfig, recorded

MODEL = ["--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
         "model.num_attention_heads=2", "--set", "model.max_position_embeddings=64"]
COMPARE = ["compare", "--variants", "baseline", "ddl-dv1", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
           "--eval-every", "1", "--eval-batches", "2", "--device", "cpu", "--no-progress", "--time-repeats", "0",
           "--threads", "1", *MODEL]


def _as_earlier_records(out):
    """Make every record under ``out`` what code before ``eval_windows`` wrote: the field absent."""
    for path in [*out.rglob("run.json"), *out.rglob("train_meta.json")]:
        record = json.loads(path.read_text())
        record["train_config"].pop("eval_windows", None)
        record.get("identity", {}).pop("eval_windows", None)
        path.write_text(json.dumps(record))
    for path in out.rglob("compare.json"):
        summary = json.loads(path.read_text())
        summary["settings"].pop("eval_windows", None)
        path.write_text(json.dumps(summary))


def test_a_record_without_the_plan_reads_as_first():
    assert recorded({"lr": 1e-3})["eval_windows"] == "first"
    assert recorded({"eval_windows": "spread"})["eval_windows"] == "spread"
    assert TrainConfig().eval_windows == "spread"
    with pytest.raises(ValueError, match=r"`eval_windows` got 'middle'; allowed: spread \| first"):
        TrainConfig(eval_windows="middle")


def test_an_earlier_comparison_is_reused_as_a_first_run_and_refused_as_a_spread_one(tmp_path, data_dir, capsys):
    from deep_delta.experiments.finished_runs import read_run

    out = tmp_path / "cmp"
    args = [*COMPARE, "--out", str(out), "--data", str(data_dir)]
    assert main([*args, "--eval-windows", "first"]) == 0
    _as_earlier_records(out)
    before = {p: p.read_bytes() for p in out.rglob("metrics.jsonl")}
    assert read_run(out / "baseline").cfg.eval_windows == "first"
    capsys.readouterr()
    assert main(args) == 2  # the default plan now: spread
    err = capsys.readouterr().err
    assert "eval_windows: run has 'first', now 'spread'" in err and "never mixes" in err
    assert main([*args, "--eval-windows", "first"]) == 0  # the plan it was made with: reused, nothing trained
    assert {p: p.read_bytes() for p in out.rglob("metrics.jsonl")} == before
    _as_earlier_records(out)
    assert main(["compare", "--report-only", "--out", str(out)]) == 0
    report = (out / "compare.md").read_text()
    assert "validation on 2 batches (the split's first windows)" in report
    summary = json.loads((out / "compare.json").read_text())
    assert summary["settings"]["eval_windows"] == "first"
    assert {r["variant"]: r["val_loss"] for r in summary["rows"]} == {
        v: [json.loads(line) for line in (out / v / "metrics.jsonl").read_text().splitlines()][-1]["val_loss"]
        for v in ("baseline", "ddl-dv1")}


def test_an_earlier_run_resumes_only_with_its_plan(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    train = ["train", "--variant", "ddl-cc", "--data", str(data_dir), "--out", str(out), "--batch-size", "2",
             "--seq-len", "16", "--warmup-steps", "1", "--eval-every", "0", "--device", "cpu", "--no-progress",
             "--log-every", "0", "--threads", "1", *MODEL]
    assert main([*train, "--steps", "2", "--eval-windows", "first"]) == 0
    _as_earlier_records(out)
    capsys.readouterr()
    assert main([*train, "--steps", "3", "--resume"]) == 2
    assert "eval_windows: run has 'first', now 'spread'" in capsys.readouterr().err
    assert main([*train, "--steps", "3", "--resume", "--eval-windows", "first"]) == 0


@pytest.fixture()
def halves(tmp_path, data_dir):
    """The training data with a validation split whose first half is one byte and its second half another."""
    import shutil

    out = tmp_path / "halves"
    shutil.copytree(data_dir, out)
    tokens = np.where(np.arange(16 * 40 + 1) < 16 * 20, ord("a"), ord("z"))
    (out / "val_000000.bin").unlink()
    record = write_shard_record(out / "val_000000.bin", tokens)
    meta = json.loads((out / "meta.json").read_text())
    meta["splits"]["val"] = {"num_tokens": record["num_tokens"], "num_documents": 1, "shards": [record]}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_the_trainer_validates_on_the_windows_its_plan_names(halves, make_config, tmp_path, monkeypatch):
    from deep_delta.train import validation
    from deep_delta.train.trainer import Trainer

    seen = {}
    real = validation.validation_numbers

    def spy(model, batches, info, **kw):
        batches = list(batches)
        seen.setdefault("bytes", []).append(sorted({chr(b) for x, _ in batches for b in x.unique().tolist()}))
        return real(model, batches, info, **kw)

    monkeypatch.setattr(validation, "validation_numbers", spy)
    for plan in ("spread", "first"):
        cfg = make_config(tmp_path / plan, data=halves, steps=1, eval_every=0, batch_size=2, seq_len=16,
                          eval_batches=2, eval_windows=plan)
        Trainer(cfg, persist=False, progress=False, quiet=True).run()
    assert seen["bytes"] == [["a", "z"], ["a"]]
    whole = make_config(tmp_path / "whole", data=halves, steps=1, eval_every=0, batch_size=2, seq_len=16,
                        eval_batches=20)
    values = [Trainer(TrainConfig(**{**whole.to_dict(), "eval_windows": plan}), persist=False, progress=False,
                      quiet=True).run().val_loss for plan in ("spread", "first")]
    assert values[0] == values[1]  # the whole split: the same windows in the same batches
