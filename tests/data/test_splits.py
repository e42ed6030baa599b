"""Train/val splits of sources with too few documents: one text file is split by tokens; --val-fraction 0
writes a valid directory without a val split."""

import json

import numpy as np
import pytest
from data_helpers import TEXT, prepared

from deep_delta.cli.main import main
from deep_delta.data import DataError, TokenLoader, check_data_dir, open_shard, prepare, read_meta
from deep_delta.data.loader import available_splits, split_shards


def test_single_text_file_is_split_by_tokens(tmp_path, capsys):
    src = tmp_path / "book.txt"
    src.write_text(TEXT * 5)  # 1,960 bytes, one document: 1,961 tokens with the EOT
    out = tmp_path / "o"
    assert main(["data", "prepare", "--source", str(src), "--out", str(out), "--val-fraction", "0.1",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "split by tokens" in printed
    meta = check_data_dir(out)
    assert meta["split_by"] == "tokens"
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    assert (train["num_tokens"], val["num_tokens"]) == (1765, 196)  # the last round(0.1 * 1961) go to val
    assert train["num_documents"] == val["num_documents"] == 1 and meta["num_documents"] == 1
    stream = np.concatenate([np.asarray(open_shard(p)) for s in ("train", "val") for p in split_shards(out, s)])
    np.testing.assert_array_equal(stream, list((TEXT * 5).encode()) + [256])
    TokenLoader(out, "train", 2, 64, vocab_size=257).next_batch()
    TokenLoader(out, "val", 2, 64, vocab_size=257).next_batch()


def test_few_documents_with_a_large_val_fraction_are_split_by_tokens(tmp_path):
    docs = ["a" * 99, "b" * 99, "c" * 99]  # 300 tokens; whole documents would all go to val at 0.9
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": x}) + "\n" for x in docs))
    meta = prepare(src, "byte", tmp_path / "o", val_fraction=0.9, shard_tokens=64, progress=False)
    assert meta["split_by"] == "tokens"
    assert meta["splits"]["train"]["num_tokens"] == 30 and meta["splits"]["val"]["num_tokens"] == 270
    assert (meta["splits"]["train"]["num_documents"], meta["splits"]["val"]["num_documents"]) == (1, 3)
    check_data_dir(tmp_path / "o")
    # many documents keep the whole-document split
    assert prepared(tmp_path, "many", 0.2) and read_meta(tmp_path / "many")["split_by"] == "documents"


def test_single_text_file_without_validation(tmp_path, capsys):
    src = tmp_path / "book.txt"
    src.write_text(TEXT)
    out = tmp_path / "o"
    assert main(["data", "prepare", "--source", str(src), "--out", str(out), "--val-fraction", "0",
                 "--no-progress"]) == 0
    assert "no validation split" in capsys.readouterr().out
    assert available_splits(out) == ["train"] and split_shards(out, "val") == []
    meta = check_data_dir(out)
    assert meta["split_by"] == "none" and meta["splits"]["train"]["num_tokens"] == len(TEXT) + 1
    assert main(["data", "info", str(out)]) == 0
    assert "ok: meta.json and shard headers agree" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match=r"no 'val' shards .* prepared with --val-fraction 0.*"
                                                r"--val-fraction F` \(F > 0"):
        TokenLoader(out, "val", 2, 16)


def test_too_few_tokens_to_split(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"text": "abc"}) + "\n")
    with pytest.raises(DataError, match="1 token.* too few for a train and a validation split"):
        prepare(src, "byte", tmp_path / "o", val_fraction=0.5, max_tokens=1, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]
