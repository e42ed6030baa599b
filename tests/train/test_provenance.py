"""A stored result is continued or reused only with the settings and the data it was made with: the one check
(train/provenance.py) behind `ddl train --resume`, `ddl compare` reruns and `ddl tasks run` reruns. Each test
reproduces a rerun that mixed results before."""

from __future__ import annotations

import json
import warnings

import pytest

from deep_delta.cli.main import main
from deep_delta.data import ByteTokenizer, write_dataset
from deep_delta.train import latest_checkpoint
from deep_delta.train.metrics import read_metrics
from deep_delta.train.provenance import StoredResultMismatch, check_belongs, data_fingerprint, differences

MODEL = ["--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
         "model.num_attention_heads=2", "--set", "model.max_position_embeddings=64"]


def _prepare(directory, text: str):
    write_dataset([text * 80, text[::-1] * 80], ByteTokenizer(), directory, val_fraction=0.25)
    return directory


def _train(data, out, steps, *extra):
    return ["train", "--variant", "ddl-cc", "--data", str(data), "--out", str(out), "--steps", str(steps),
            "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "1", "--eval-every", "0", "--device", "cpu",
            "--no-progress", "--log-every", "0", "--threads", "1", *MODEL, *extra]


def test_differences_name_each_key():
    assert differences({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "d": 4}, skip={"c"}) == [
        "b: stored 2, now 5", "d: stored None, now 4"]
    with pytest.raises(StoredResultMismatch, match=r"the run was made with other settings \(b: stored 2, now 5\); "
                                                   r"do this"):
        check_belongs({"b": 2}, {"b": 5}, what="the run", remedy="do this")


def test_the_fingerprint_tells_data_with_the_same_token_count_apart(tmp_path):
    from deep_delta.data import read_meta

    one, two = _prepare(tmp_path / "one", "abcdefgh "), _prepare(tmp_path / "two", "hgfedcba ")
    m1, m2 = read_meta(one), read_meta(two)
    assert m1["num_tokens"] == m2["num_tokens"]
    assert data_fingerprint(one, m1) != data_fingerprint(two, m2)
    assert data_fingerprint(one, m1) == data_fingerprint(one, read_meta(one))


def test_the_fingerprint_covers_the_test_split(tmp_path):
    """Data that differs only in its test split (the same train and val shards) has another fingerprint, so run.json
    tells apart runs whose test numbers came from different test text."""
    from deep_delta.data import read_meta

    docs = [f"document {i} " * (20 + i) for i in range(40)]
    one, two = tmp_path / "one", tmp_path / "two"
    write_dataset(docs, ByteTokenizer(), one, val_fraction=0.1, test_fraction=0.1)
    write_dataset(docs, ByteTokenizer(), two, val_fraction=0.1, test_fraction=0.1)
    test_shard = two / "test_000000.bin"
    data = bytearray(test_shard.read_bytes())
    data[-2] = ord("X")  # one byte of test text differs
    test_shard.write_bytes(bytes(data))
    meta = json.loads((two / "meta.json").read_text())
    del meta["splits"]["test"]["shards"][0]["sha256"]  # no record: the fingerprint hashes the file itself
    (two / "meta.json").write_text(json.dumps(meta))
    m1, m2 = read_meta(one), read_meta(two)
    assert m1["splits"]["train"] == m2["splits"]["train"] and m1["splits"]["val"] == m2["splits"]["val"]
    assert data_fingerprint(one, m1) != data_fingerprint(two, m2)
    m1["splits"]["test"]["shards"][0]["sha256"] = "0" * 64  # a recorded checksum that differs
    assert data_fingerprint(one, m1) != data_fingerprint(one, read_meta(one))


def test_resume_on_data_prepared_again_from_other_text_with_the_same_token_count_is_refused(tmp_path, capsys):
    """Before: only a different token count was refused; the same count trained on the new text without a word."""
    data, out = tmp_path / "data", tmp_path / "run"
    _prepare(data, "the first text of the run ")
    assert main(_train(data, out, 2)) == 0
    assert "data_fingerprint" in json.loads((latest_checkpoint(out) / "train_meta.json").read_text())
    _prepare(tmp_path / "other", "another text, same length")  # same token count, other tokens
    (data / "meta.json").unlink()
    for shard in data.glob("*.bin"):
        shard.unlink()
    for f in (tmp_path / "other").iterdir():
        f.rename(data / f.name)
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(_train(data, out, 4, "--resume")) == 2
    err = capsys.readouterr().err
    assert "was made from other data than" in err and str(data) in err and "Traceback" not in err
    assert (out / "metrics.jsonl").read_text() == before


def test_a_checkpoint_written_before_fingerprints_still_resumes_with_a_warning(tmp_path, capsys):
    data, out = _prepare(tmp_path / "data", "some text to learn "), tmp_path / "run"
    assert main(_train(data, out, 2)) == 0
    meta_file = latest_checkpoint(out) / "train_meta.json"
    meta = json.loads(meta_file.read_text())
    del meta["data_fingerprint"]
    meta_file.write_text(json.dumps(meta))  # train_meta.json is not covered by checksums.json
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(_train(data, out, 3, "--resume")) == 0
    assert any("written before checkpoints recorded their data" in str(w.message) for w in caught)
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 3]


COMPARE = ["compare", "--variants", "baseline", "ddl-dv1", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
           "--eval-every", "1", "--device", "cpu", "--no-progress", "--seeds", "2", "--time-repeats", "0", *MODEL]


def test_a_compare_rerun_with_other_eval_batches_is_refused_naming_it(tmp_path, data_dir, capsys):
    """Before: a rerun with --eval-batches 1 reused the finished runs' 4-batch losses beside new 1-batch ones and
    labelled the table "1 batches"."""
    out = tmp_path / "cmp"
    args = [*COMPARE, "--out", str(out), "--data", str(data_dir)]
    assert main([*args, "--eval-batches", "2"]) == 0
    # interrupted: one run lost its checkpoints and metrics, the others are finished
    import shutil

    shutil.rmtree(out / "seed_1" / "ddl-dv1")
    before = {p: p.read_bytes() for p in out.rglob("metrics.jsonl")}
    capsys.readouterr()
    assert main([*args, "--eval-batches", "1"]) == 2
    err = capsys.readouterr().err
    assert "eval_batches: run has 2, now 1" in err and "never mixes" in err and "--overwrite" in err
    assert {p: p.read_bytes() for p in out.rglob("metrics.jsonl")} == before
    assert not (out / "seed_1" / "ddl-dv1").exists()
    assert main([*args, "--eval-batches", "2"]) == 0  # the same settings continue it


def test_validation_losses_of_other_batch_counts_in_one_run_are_refused(tmp_path, data_dir, capsys):
    """A run of a comparison continued by hand with `ddl train --resume --eval-batches 1` (which may change it):
    run.json now says 1, its metrics hold losses on 2 batches. The comparison reads the numbers' own record and
    refuses to report them as losses on 1 batch."""
    out = tmp_path / "cmp"
    args = [*COMPARE, "--out", str(out), "--data", str(data_dir)]
    assert main([*args, "--eval-batches", "2"]) == 0
    for run_file in out.rglob("run.json"):  # what the hand-made resume wrote
        run = json.loads(run_file.read_text())
        run["train_config"]["eval_batches"] = 1
        run_file.write_text(json.dumps(run))
    capsys.readouterr()
    assert main([*args, "--eval-batches", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds validation losses measured on 2 batches, this comparison on 1 (--eval-batches)" in err, err


def test_a_compare_output_that_is_a_directory_is_refused_before_training(tmp_path, data_dir, capsys):
    out = tmp_path / "cmp"
    (out / "compare.json").mkdir(parents=True)
    assert main([*COMPARE, "--out", str(out), "--data", str(data_dir), "--eval-batches", "1"]) == 2
    assert f"{out / 'compare.json'} is a directory" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["compare.json"]  # nothing trained
