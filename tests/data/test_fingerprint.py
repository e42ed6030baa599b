"""``data_fingerprint``: one name for the tokens of a prepared directory (W&B logs it with every run)."""

from __future__ import annotations

import copy

from deep_delta.data.meta import data_fingerprint

META = {"tokenizer": "byte", "vocab_size": 257, "splits": {
    "train": {"num_tokens": 10, "shards": [{"file": "train_000000.bin", "num_tokens": 10, "sha256": "a" * 64}]},
    "val": {"num_tokens": 4, "shards": [{"file": "val_000000.bin", "num_tokens": 4, "sha256": "b" * 64}]},
}}


def test_the_fingerprint_follows_the_shards_and_nothing_else():
    same = copy.deepcopy(META)
    same["num_documents"] = 3  # not the tokens
    same["splits"] = dict(reversed(list(same["splits"].items())))  # the order of the splits does not matter
    assert data_fingerprint(same) == data_fingerprint(META)
    assert len(data_fingerprint(META)) == 16 and int(data_fingerprint(META), 16) >= 0
    other = copy.deepcopy(META)
    other["splits"]["val"]["shards"][0]["sha256"] = "c" * 64
    assert data_fingerprint(other) != data_fingerprint(META)
    gpt2 = {**copy.deepcopy(META), "tokenizer": "gpt2", "vocab_size": 50257}
    assert data_fingerprint(gpt2) != data_fingerprint(META)
