"""`prepare --num-proc N` gives the same shards as one process; an interrupted preparation resumed gives the
same shards as an uninterrupted one."""

import importlib
import json

import numpy as np
import pytest

from deep_delta.data import prepare, read_meta

prep = importlib.import_module("deep_delta.data.prepare")  # the package's `prepare` is the function
workers = importlib.import_module("deep_delta.data.workers")

WORDS = "delta rule value direction gate state residual écrit ✓ shard token".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two jsonl files of 600 documents of varied length (about 150 KB of byte tokens)."""
    d = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    for k in range(2):
        with open(d / f"part{k}.jsonl", "w", encoding="utf-8") as f:
            for i in range(300):
                n = int(rng.integers(1, 60))
                f.write(json.dumps({"text": f"doc {k}.{i} " + " ".join(rng.choice(WORDS, n))}) + "\n")
    return d


def files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def run(corpus, out, **kw):
    kw.setdefault("shard_tokens", 7000)
    return prepare(corpus, "byte", out, val_fraction=0.05, progress=False, **kw)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "o"
    run(corpus, out, num_proc=1)
    return files(out)


def test_num_proc_gives_identical_shards(corpus, reference, tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "CHUNK_DOCS", 7)  # many chunks in flight, finished out of order
    run(corpus, tmp_path / "o", num_proc=2)
    got = files(tmp_path / "o")
    assert sum(n.startswith("train_") for n in got) >= 10
    assert got == reference
    meta = read_meta(tmp_path / "o")
    for info in meta["splits"].values():
        for rec in info["shards"]:
            assert rec["bytes"] == len(got[rec["file"]]) and len(rec["sha256"]) == 64
            assert rec["max_token_id"] == int(np.frombuffer(got[rec["file"]][1024:], "<u2").max())


@pytest.mark.parametrize("kill_after, num_proc", [(1, 1), (4, 1), (9, 2)])
def test_interrupted_then_resumed_is_identical(corpus, reference, tmp_path, monkeypatch, kill_after, num_proc):
    saved, calls = prep._save_progress, []

    def killed_after_shard(directory, state):
        saved(directory, state)
        calls.append(state)
        if len(calls) == kill_after:
            raise KeyboardInterrupt  # as a kill between shards: finished shards on disk, the rest not

    monkeypatch.setattr(prep, "_save_progress", killed_after_shard)
    out = tmp_path / "o"
    with pytest.raises(KeyboardInterrupt):
        run(corpus, out, num_proc=num_proc)
    partial = tmp_path / ".o.partial"
    done = {rec["file"] for s in calls[-1]["splits"].values() for rec in s["shards"]}
    assert len(done) == kill_after and not out.exists()
    (partial / "train_000099.bin").write_bytes(b"half a shard")  # written after the last record: redone
    stamps = {n: (partial / n).stat().st_mtime_ns for n in done}

    monkeypatch.setattr(prep, "_save_progress", saved)
    encoded = []
    real = workers.encode_chunk
    monkeypatch.setattr(workers, "encode_chunk", lambda tok, texts: encoded.append(len(texts)) or real(tok, texts))
    run(corpus, out, num_proc=1)
    assert files(out) == reference
    assert {n: (out / n).stat().st_mtime_ns for n in done} == stamps  # finished shards were kept, not rewritten
    assert sum(encoded) < 600  # documents of finished shards were not tokenized again
    assert not partial.exists()


def test_other_settings_start_over(corpus, reference, tmp_path, monkeypatch):
    def killed(directory, state):
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_save_progress", killed)
    with pytest.raises(KeyboardInterrupt):
        run(corpus, tmp_path / "o", shard_tokens=5000, num_proc=1)
    monkeypatch.undo()
    run(corpus, tmp_path / "o", num_proc=1)  # another shard size: nothing of the first run is kept
    assert files(tmp_path / "o") == reference


def test_resume_with_max_tokens_cut(corpus, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    run(corpus, whole, num_proc=1, max_tokens=30_000)
    saved, calls = prep._save_progress, []

    def killed(directory, state):
        saved(directory, state)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_save_progress", killed)
    with pytest.raises(KeyboardInterrupt):
        run(corpus, tmp_path / "o", num_proc=1, max_tokens=30_000)
    monkeypatch.undo()
    run(corpus, tmp_path / "o", num_proc=1, max_tokens=30_000)
    assert files(tmp_path / "o") == files(whole)


def test_resume_with_a_test_split(corpus, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    run(corpus, whole, num_proc=1, test_fraction=0.1, shard_tokens=3000)
    assert len(read_meta(whole)["splits"]["test"]["shards"]) >= 2
    saved, calls = prep._save_progress, []

    def killed(directory, state):
        saved(directory, state)
        calls.append(state)
        if state["splits"]["test"]["shards"]:
            raise KeyboardInterrupt  # after the first finished test shard

    monkeypatch.setattr(prep, "_save_progress", killed)
    with pytest.raises(KeyboardInterrupt):
        run(corpus, tmp_path / "o", num_proc=1, test_fraction=0.1, shard_tokens=3000)
    assert calls[-1]["splits"]["test"]["shards"]
    monkeypatch.undo()
    run(corpus, tmp_path / "o", num_proc=1, test_fraction=0.1, shard_tokens=3000)
    assert files(tmp_path / "o") == files(whole)
