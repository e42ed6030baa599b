"""The test split (`--test-fraction`): whole documents apart from train and val (the selection split), recorded
in meta.json like val, read by TokenLoader, `ddl data info` and `ddl data verify`; counted in the data fingerprint."""

import json

import numpy as np
import pytest
from data_helpers import TEXT

from deep_delta.cli.main import main
from deep_delta.data import (
    DataError,
    TokenLoader,
    check_data_dir,
    open_shard,
    prepare,
    read_meta,
    verify_data_dir,
)
from deep_delta.data.loader import available_splits, split_shards
from deep_delta.data.prepare import SPLIT_TOLERANCE

SPLITS = ("train", "val", "test")


def _corpus(tmp_path, n=300, seed=0):
    """``n`` distinct documents of varied length in a jsonl file; returns the path and the documents."""
    rng = np.random.default_rng(seed)
    docs = [f"doc {i}: " + "word " * int(rng.integers(5, 120)) for i in range(n)]
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return src, docs


def _documents(out, split):
    """The documents of a split, decoded from its shards (each ends with the end-of-text id 256)."""
    shards = split_shards(out, split)
    if not shards:
        return []
    stream = np.concatenate([np.asarray(open_shard(p)) for p in shards])
    cuts = np.flatnonzero(stream == 256)
    return [bytes(stream[a + 1 if i else 0 : b].astype(np.uint8)).decode()
            for i, (a, b) in enumerate(zip(np.r_[-1, cuts[:-1]], cuts))]


def test_test_split_is_whole_documents_apart_from_train_and_val(tmp_path, capsys):
    src, docs = _corpus(tmp_path)
    out = tmp_path / "o"
    assert main(["data", "prepare", "--source", str(src), "--out", str(out), "--val-fraction", "0.1",
                 "--test-fraction", "0.15", "--shard-tokens", "4000", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "  test " in printed and "split by tokens" not in printed
    meta = check_data_dir(out)
    assert meta["split_by"] == "documents" and meta["test_fraction"] == 0.15 and meta["val_fraction"] == 0.1
    assert list(meta["splits"]) == list(SPLITS) and available_splits(out) == sorted(SPLITS)
    found = {s: _documents(out, s) for s in SPLITS}
    for s in SPLITS:
        assert len(found[s]) == meta["splits"][s]["num_documents"] > 0
    assert sorted(d for s in SPLITS for d in found[s]) == sorted(docs)  # every document once, in one split
    assert sum(meta["splits"][s]["num_tokens"] for s in SPLITS) == meta["num_tokens"]
    for s, fraction in (("val", 0.1), ("test", 0.15)):
        share = meta["splits"][s]["num_tokens"] / meta["num_tokens"]
        assert abs(share - fraction) <= SPLIT_TOLERANCE * fraction
        rec = meta["splits"][s]["shards"][0]  # recorded like val's: size, largest id, checksum
        assert rec["file"] == f"{s}_000000.bin" and len(rec["sha256"]) == 64 and rec["max_token_id"] <= 256
    x, y = TokenLoader(out, "test", 2, 32, vocab_size=257).next_batch()
    assert tuple(x.shape) == (2, 32)
    assert main(["data", "info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "  test " in info and "test_000000.bin" in info and "ok:" in info
    report = verify_data_dir(out)
    assert not report.problems and {s["split"] for s in report.shards} == set(SPLITS)
    corrupt = out / "test_000000.bin"
    data = bytearray(corrupt.read_bytes())
    data[2000] ^= 1
    corrupt.write_bytes(bytes(data))
    assert any("test_000000.bin: content differs" in p for p in verify_data_dir(out).problems)


def test_the_test_split_changes_nothing_when_not_asked_for(tmp_path):
    src, _ = _corpus(tmp_path, n=60)
    meta = prepare(src, "byte", tmp_path / "o", val_fraction=0.1, progress=False)
    assert "test" not in meta["splits"] and meta["test_fraction"] == 0
    assert split_shards(tmp_path / "o", "test") == []
    with pytest.raises(FileNotFoundError, match=r"no test split; prepare it again with `ddl data prepare "
                                                r"--test-fraction F`"):
        TokenLoader(tmp_path / "o", "test", 2, 16)


def test_the_test_split_is_deterministic_and_leaves_train_the_rest(tmp_path):
    src, _ = _corpus(tmp_path, n=120)
    a = prepare(src, "byte", tmp_path / "a", val_fraction=0.05, test_fraction=0.05, progress=False)
    b = prepare(src, "byte", tmp_path / "b", val_fraction=0.05, test_fraction=0.05, progress=False, num_proc=2)
    assert a["splits"] == b["splits"]
    train_only = prepare(src, "byte", tmp_path / "t", val_fraction=0, test_fraction=0.05, progress=False)
    assert set(train_only["splits"]) == set(SPLITS) and train_only["splits"]["val"]["num_tokens"] == 0
    assert _documents(tmp_path / "t", "test") == _documents(tmp_path / "a", "test")  # test chooses first


def test_one_document_is_split_by_tokens_into_three(tmp_path, capsys):
    src = tmp_path / "book.txt"
    src.write_text(TEXT * 5)  # one document: 1,961 tokens with the EOT
    out = tmp_path / "o"
    assert main(["data", "prepare", "--source", str(src), "--out", str(out), "--val-fraction", "0.1",
                 "--test-fraction", "0.2", "--no-progress"]) == 0
    assert "last 392 tokens are the test split and the 196 before them" in capsys.readouterr().out
    meta = check_data_dir(out)
    counts = [meta["splits"][s]["num_tokens"] for s in SPLITS]
    assert meta["split_by"] == "tokens" and counts == [1961 - 196 - 392, 196, 392]
    assert [meta["splits"][s]["num_documents"] for s in SPLITS] == [1, 1, 1]
    stream = np.concatenate([np.asarray(open_shard(p)) for s in SPLITS for p in split_shards(out, s)])
    np.testing.assert_array_equal(stream, list((TEXT * 5).encode()) + [256])


def test_split_by_tokens_counts_the_documents_each_split_touches(tmp_path):
    docs = ["a" * 99, "b" * 99, "c" * 99, "d" * 99]  # 400 tokens: whole documents cannot give 0.45 + 0.45
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": x}) + "\n" for x in docs))
    meta = prepare(src, "byte", tmp_path / "o", val_fraction=0.45, test_fraction=0.45, shard_tokens=64,
                   progress=False)
    assert meta["split_by"] == "tokens"
    assert [meta["splits"][s]["num_tokens"] for s in SPLITS] == [40, 180, 180]
    assert [meta["splits"][s]["num_documents"] for s in SPLITS] == [1, 3, 2]
    with pytest.raises(DataError, match="too few for train, validation and test splits"):
        prepare(src, "byte", tmp_path / "p", val_fraction=0.5, test_fraction=0.4, max_tokens=2, progress=False)


def test_meta_json_test_fraction_is_checked(tmp_path):
    src, _ = _corpus(tmp_path, n=40)
    prepare(src, "byte", tmp_path / "o", val_fraction=0.1, test_fraction=0.1, progress=False)
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    for bad, said in ((1.5, r"'test_fraction' got 1.5; allowed: a number in \[0, 1\)"),
                      (0.95, r"'test_fraction' got 0.95; allowed: a number below 1 - val_fraction \(0.1\)")):
        (tmp_path / "o" / "meta.json").write_text(json.dumps({**meta, "test_fraction": bad}))
        with pytest.raises(DataError, match=said):
            read_meta(tmp_path / "o")
