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


def test_a_few_large_files_honour_the_fraction(tmp_path, capsys):
    """A book and a note at --val-fraction 0.01: whole documents put the book (99% of the tokens) in validation,
    since the first document always goes there; the split is by tokens instead, and the validation share is what
    was asked for. The stream is the train documents followed by the validation ones, cut once."""
    src = tmp_path / "big"
    src.mkdir()
    book, note = TEXT * 100, "A short note. " * 20  # 39,200 and 280 bytes
    (src / "a.txt").write_text(book)
    (src / "z.txt").write_text(note)
    out = tmp_path / "o"
    assert main(["data", "prepare", "--source", str(src), "--out", str(out), "--val-fraction", "0.01",
                 "--no-progress"]) == 0
    assert "split by tokens" in capsys.readouterr().out
    meta = check_data_dir(out)
    total = len(book) + len(note) + 2
    train, val = meta["splits"]["train"]["num_tokens"], meta["splits"]["val"]["num_tokens"]
    assert (meta["split_by"], val, train + val) == ("tokens", round(0.01 * total), total)
    # the book went to validation as a whole document, the note to training: the note comes first, then the book
    stream = np.concatenate([np.asarray(open_shard(p)) for s in ("train", "val") for p in split_shards(out, s)])
    np.testing.assert_array_equal(stream, list(note.encode()) + [256] + list(book.encode()) + [256])
    assert (meta["splits"]["train"]["num_documents"], meta["splits"]["val"]["num_documents"]) == (2, 1)


@pytest.mark.parametrize("fraction", [0.05, 0.1, 0.3])
def test_every_split_is_within_the_tolerance_of_its_fraction(tmp_path, fraction):
    """Documents of very different sizes: whatever the split, by documents or by tokens, the validation share is
    within SPLIT_TOLERANCE of --val-fraction."""
    from deep_delta.data.prepare import SPLIT_TOLERANCE

    rng = np.random.default_rng(0)
    docs = ["x" * int(n) for n in rng.lognormal(5, 1.5, size=40)]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": x}) + "\n" for x in docs))
    meta = prepare(src, "byte", tmp_path / "o", val_fraction=fraction, shard_tokens=512, progress=False)
    share = meta["splits"]["val"]["num_tokens"] / meta["num_tokens"]
    assert abs(share - fraction) <= SPLIT_TOLERANCE * fraction, (meta["split_by"], share)
