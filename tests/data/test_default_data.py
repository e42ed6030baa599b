import multiprocessing
import os

import numpy as np

from deep_delta.data import ByteTokenizer, TokenLoader, default_data_dir, open_shard, read_meta
from deep_delta.data.default import DEFAULT_DIR_NAME
from deep_delta.data.sources import default_texts


def test_builds_once_and_reuses(tmp_path):
    d = default_data_dir(tmp_path)
    assert d == tmp_path / DEFAULT_DIR_NAME
    meta = read_meta(d)
    assert meta["tokenizer"] == "byte" and meta["vocab_size"] == 257 and meta["eot_token"] == 256
    texts = default_texts()
    expected = sum(len(t.encode()) + 1 for t in texts)
    assert meta["num_tokens"] == expected == meta["splits"]["train"]["num_tokens"] + meta["splits"]["val"]["num_tokens"]
    assert meta["num_documents"] == len(texts)
    # the stream of a split is its documents, each followed by EOT (256)
    val = np.asarray(open_shard(d / "val_000000.bin"))
    assert val[-1] == 256 and (val == 256).sum() == meta["splits"]["val"]["num_documents"]
    first = ByteTokenizer().decode(val[: np.flatnonzero(val == 256)[0]].tolist())
    assert first == texts[0]
    mtime = os.stat(d / "train_000000.bin").st_mtime_ns
    assert default_data_dir(tmp_path) == d
    assert os.stat(d / "train_000000.bin").st_mtime_ns == mtime
    TokenLoader(d, "train", 2, 256, vocab_size=257).next_batch()
    TokenLoader(d, "val", 2, 256, vocab_size=257).next_batch()


def test_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path / "data" / DEFAULT_DIR_NAME


def test_rebuilds_corrupted_copy(tmp_path):
    d = default_data_dir(tmp_path)
    good = (d / "train_000000.bin").read_bytes()
    (d / "train_000000.bin").write_bytes(good[:2000])
    assert default_data_dir(tmp_path) == d
    assert (d / "train_000000.bin").read_bytes() == good
    (d / "meta.json").write_text("{not json")
    assert default_data_dir(tmp_path) == d and read_meta(d)["tokenizer"] == "byte"
    assert sorted(p.name for p in tmp_path.iterdir()) == [DEFAULT_DIR_NAME]


def _build(cache, barrier, queue):
    barrier.wait()  # start all builds at the same moment
    queue.put(str(default_data_dir(cache)))


def test_concurrent_processes(tmp_path):
    # fork: the children inherit the imported package, so each starts in milliseconds
    ctx = multiprocessing.get_context("fork")
    barrier, queue = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_build, args=(tmp_path, barrier, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    outs = {queue.get(timeout=5) for _ in procs}
    assert outs == {str(tmp_path / DEFAULT_DIR_NAME)}
    assert sorted(p.name for p in tmp_path.iterdir()) == [DEFAULT_DIR_NAME]
    TokenLoader(tmp_path / DEFAULT_DIR_NAME, "train", 1, 64, vocab_size=257)
