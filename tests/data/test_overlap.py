"""`ddl data info --overlap`: the share of each held-out split's aligned 64-token chunks found verbatim anywhere in
train, on a constructed corpus where a known share of them was copied from train (at any position, across a shard
boundary too)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from deep_delta.cli.main import main
from deep_delta.data.overlap import held_out_overlap, window_hashes
from deep_delta.data.shards import write_shard_record


def _corpus(tmp_path, *, copied_val=(3, 7, 11, 12, 20), copied_test=(1,)):
    """Random byte tokens: train in two shards; val of 24 chunks (and a partial one), those at ``copied_val`` taken
    from train at odd positions (one across the shards' boundary); test of 4 chunks, ``copied_test`` likewise."""
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, size=200_003).astype(np.uint16)
    cut = 120_001
    sources = iter([cut - 30, 17, 99_991, 150_000, 777, 5_555])  # the first straddles the two train shards

    def split(n, copied):
        chunks = rng.integers(0, 256, size=(n, 64)).astype(np.uint16)
        for c in copied:
            at = next(sources)
            chunks[c] = train[at : at + 64]
        return chunks.reshape(-1)

    val = np.concatenate([split(24, copied_val), rng.integers(0, 256, size=40).astype(np.uint16)])
    test = split(4, copied_test)
    records = {"train": [write_shard_record(tmp_path / "train_000000.bin", train[:cut]),
                         write_shard_record(tmp_path / "train_000001.bin", train[cut:])],
               "val": [write_shard_record(tmp_path / "val_000000.bin", val)],
               "test": [write_shard_record(tmp_path / "test_000000.bin", test)]}
    meta = {"tokenizer": "byte", "vocab_size": 257, "eot_token": 256, "source": "constructed",
            "splits": {s: {"num_tokens": sum(r["num_tokens"] for r in rs), "num_documents": 1, "shards": rs}
                       for s, rs in records.items()}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    return tmp_path


def test_the_share_of_copied_chunks_is_found(tmp_path):
    data = _corpus(tmp_path)
    report = held_out_overlap(data, windows={"val": (64, np.array([0, 3, 12]))})
    val, test = report.splits
    assert (val.split, val.chunks, val.found) == ("val", 24, 5) and val.share == pytest.approx(5 / 24)
    assert (test.split, test.chunks, test.found) == ("test", 4, 1)
    assert (val.windows_chunks, val.windows_found) == (3, 2)  # chunks 0, 3 and 12: 3 and 12 were copied
    assert report.train_positions == 200_003 - 63 and report.seconds > 0


def test_a_chunk_counts_only_when_its_tokens_are_in_train(tmp_path, monkeypatch):
    from deep_delta.data import overlap

    data = _corpus(tmp_path)
    # every token hashed alike: every window's hash collides, and only the token-by-token check tells them apart
    monkeypatch.setattr(overlap, "_TABLE", np.ones(1 << 16, dtype=np.uint64))
    val, test = held_out_overlap(data).splits
    assert (val.found, test.found) == (5, 1)


def test_window_hashes_are_the_polynomial_hash_of_each_window():
    from deep_delta.data import overlap

    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 300, size=200)
    h = window_hashes(tokens, 8)
    mask = (1 << 64) - 1
    for i in (0, 5, 192):
        want = 0
        for t in tokens[i : i + 8]:
            want = (want * overlap._BASE + int(overlap._TABLE[t])) & mask
        assert int(h[i]) == want
    assert len(h) == 193
    with pytest.raises(ValueError, match="`chunk` got 48; allowed: a power of two"):
        window_hashes(tokens, 48)


def test_ddl_data_info_overlap(tmp_path, capsys):
    data = _corpus(tmp_path)
    assert main(["data", "info", str(data), "--overlap"]) == 0
    out = capsys.readouterr().out
    assert "overlap with train: aligned 64-token chunks of each held-out split that occur verbatim in train" in out
    assert "val              24 chunks            5 in train (20.83%)" in out
    assert "test              4 chunks            1 in train (25.00%)" in out
    assert "in the windows a default `ddl compare` evaluates" in out
    assert main(["data", "info", str(data), "--overlap", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["overlap"]
    assert [(s["split"], s["chunks"], s["found"]) for s in got["splits"]] == [("val", 24, 5), ("test", 4, 1)]
    assert main(["data", "info", str(data)]) == 0
    assert "overlap with train" not in capsys.readouterr().out  # only when asked: it reads all of train
