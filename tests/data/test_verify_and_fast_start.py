"""`ddl data verify` finds and names each kind of damage and adds missing shard records; `TokenLoader` with
shard records starts without opening a shard, and without them it scans with one warning."""

import importlib
import json
import shutil
import warnings

import numpy as np
import pytest

from deep_delta.cli.main import main
from deep_delta.data import ShardError, TokenLoader, prepare, read_meta
from deep_delta.data.shards import HEADER_BYTES, write_shard_record

loader_module = importlib.import_module("deep_delta.data.loader")

WORDS = "delta rule value direction gate state residual shard token".split()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """40 documents of a few words (about 6 KB of byte tokens)."""
    path = tmp_path_factory.mktemp("src") / "corpus.jsonl"
    rng = np.random.default_rng(0)
    docs = [f"doc {i} " + " ".join(rng.choice(WORDS, int(rng.integers(5, 40)))) for i in range(40)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


@pytest.fixture(scope="module")
def prepared(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "data"
    prepare(source, "byte", out, val_fraction=0.1, shard_tokens=600, progress=False, num_proc=1)
    assert len(read_meta(out)["splits"]["train"]["shards"]) >= 4
    return out


@pytest.fixture
def data(prepared, tmp_path):
    """A fresh copy of a prepared byte-tokenizer directory: several train shards of 600 tokens, with records."""
    return shutil.copytree(prepared, tmp_path / "data")


def verify(capsys, *argv):
    code = main(["data", "verify", *map(str, argv)])
    return code, capsys.readouterr().out


def strip_records(d):
    """Remove the shard records from meta.json, as in a directory prepared before they existed."""
    meta = json.loads((d / "meta.json").read_text())
    for info in meta["splits"].values():
        for shard in info["shards"]:
            for key in ("bytes", "max_token_id", "sha256"):
                del shard[key]
    meta.pop("shard_checksum", None)
    (d / "meta.json").write_text(json.dumps(meta))


def set_token(shard, position, value):
    raw = bytearray(shard.read_bytes())
    raw[HEADER_BYTES + 2 * position : HEADER_BYTES + 2 * position + 2] = int(value).to_bytes(2, "little")
    shard.write_bytes(bytes(raw))


def token(shard, position):
    return int(np.frombuffer(shard.read_bytes(), "<u2", count=1, offset=HEADER_BYTES + 2 * position)[0])


# ---------------------------------------------------------------------------------------- ddl data verify
def test_good_directory_is_ok(data, capsys):
    code, out = verify(capsys, data)
    assert code == 0, out
    assert "problem" not in out
    assert "ok: every shard matches meta.json" in out
    shards = len(read_meta(data)["splits"]["train"]["shards"]) + len(read_meta(data)["splits"]["val"]["shards"])
    assert f"read {shards} shard(s)" in out


def test_corrupted_token_is_named_with_its_position(data, capsys):
    shard = data / "train_000002.bin"
    set_token(shard, 123, 0xFFFF)  # a flipped byte pair: an id no tokenizer of ours makes
    code, out = verify(capsys, data)
    assert code == 1
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    assert any(f"{shard}: token id 65535 at position 123 (byte {HEADER_BYTES + 246})" in p for p in problems), out
    assert any(f"{shard}: content differs from its checksum" in p for p in problems), out
    assert all("train_000002.bin" in p for p in problems), out  # the other shards are not blamed
    assert "ok:" not in out


def test_checksum_mismatch_of_an_in_vocabulary_change(data, capsys):
    shard = data / "train_000001.bin"
    old = token(shard, 10)
    set_token(shard, 10, 32 if old != 32 else 33)  # still a valid byte id: only the checksum can tell
    code, out = verify(capsys, data)
    assert code == 1
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    assert problems == [f"problem: token shard {shard}: content differs from its checksum, {data / 'meta.json'} "
                        f"records sha256 {read_meta(data)['splits']['train']['shards'][1]['sha256']}"], out


def test_truncated_shard_is_named(data, capsys):
    shard = data / "train_000000.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    code, out = verify(capsys, data)
    assert code == 1
    assert f"problem: token shard {shard} is truncated" in out
    assert "train_000001.bin" not in out.split("problem:", 1)[1]  # only the damaged shard is named


def test_id_beyond_the_tokenizer_vocabulary(data, capsys):
    # a shard whose records agree with it (same size, checksum, largest id) but holds id 257 = vocab_size of the
    # byte tokenizer: only the vocabulary check finds it
    shard = data / "train_000003.bin"
    tokens = np.frombuffer(shard.read_bytes(), "<u2", offset=HEADER_BYTES).copy()
    tokens[77] = 257
    record = write_shard_record(shard, tokens)
    meta = json.loads((data / "meta.json").read_text())
    meta["splits"]["train"]["shards"][3] = record
    (data / "meta.json").write_text(json.dumps(meta))
    code, out = verify(capsys, data)
    assert code == 1
    problems = [line for line in out.splitlines() if line.startswith("problem:")]
    assert len(problems) == 1, out
    assert f"{shard}: token id 257 at position 77 (byte {HEADER_BYTES + 154})" in problems[0]
    assert "vocab_size 257" in problems[0]


def test_json_output_parses(data, capsys):
    code, out = verify(capsys, data, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["problems"] == [] and report["wrote_metadata"] is False
    assert {s["file"] for s in report["shards"]} == {p.name for p in data.glob("*.bin")}
    set_token(data / "val_000000.bin", 5, 0xFFFF)
    code, out = verify(capsys, data, "--json")
    assert code == 1
    report = json.loads(out)
    assert report["problems"] and all("val_000000.bin" in p for p in report["problems"])


def test_write_metadata_adds_records_then_the_loader_starts_without_reading(data, capsys, monkeypatch):
    prepared = read_meta(data)
    strip_records(data)
    code, out = verify(capsys, data)
    assert code == 0 and "--write-metadata" in out  # no records is not a problem, but the fix is shown
    assert "sha256" not in (data / "meta.json").read_text()
    code, out = verify(capsys, data, "--write-metadata")
    assert code == 0 and "wrote the shard records" in out, out
    assert read_meta(data)["splits"] == prepared["splits"]  # the same records prepare wrote

    opened = []
    real = loader_module.open_shard
    monkeypatch.setattr(loader_module, "open_shard", lambda p: opened.append(p) or real(p))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "no shard records" warning any more
        TokenLoader(data, "train", batch_size=2, seq_len=16, vocab_size=257)
    assert opened == []


def test_write_metadata_refuses_a_damaged_directory(data, capsys):
    strip_records(data)
    set_token(data / "train_000001.bin", 3, 300)  # without records only the vocabulary check can see damage
    before = (data / "meta.json").read_bytes()
    code, out = verify(capsys, data, "--write-metadata")
    assert code == 1
    assert "train_000001.bin: token id 300 at position 3" in out
    assert "not writing shard records" in out and "wrote" not in out
    assert (data / "meta.json").read_bytes() == before


# ---------------------------------------------------------------------------------------- TokenLoader start
def test_loader_with_records_opens_each_shard_once_on_first_use(data, monkeypatch):
    opened = []
    real = loader_module.open_shard
    monkeypatch.setattr(loader_module, "open_shard", lambda p: opened.append(p.name) or real(p))
    loader = TokenLoader(data, "train", batch_size=3, seq_len=50, vocab_size=257)
    assert opened == []  # construction read headers only
    names = [r["file"] for r in read_meta(data)["splits"]["train"]["shards"]]
    x, _ = next(loader.eval_batches(max_batches=1, windows="first"))  # the first 3 windows: tokens 0..150 of shard 0
    assert opened == names[:1]
    for _ in loader.eval_batches():
        pass
    for _ in range(20):
        loader.next_batch()
    assert sorted(opened) == sorted(names) and len(opened) == len(names)  # each shard opened once
    stream = np.concatenate([np.frombuffer((data / n).read_bytes(), "<u2", offset=HEADER_BYTES) for n in names])
    assert x[0].tolist() == stream[:50].tolist()


@pytest.mark.parametrize("change", ["truncated", "appended"])
def test_loader_refuses_a_shard_whose_size_differs_from_its_record(data, change):
    shard = data / "train_000002.bin"
    raw = shard.read_bytes()
    shard.write_bytes(raw[:-8] if change == "truncated" else raw + b"\0\0")
    with pytest.raises(ShardError) as e:
        TokenLoader(data, "train", batch_size=2, seq_len=16)
    message = str(e.value)
    assert str(shard) in message and f"records {len(raw)}" in message
    assert f"ddl data verify {data}" in message


def test_loader_without_records_scans_with_one_warning(data, monkeypatch):
    with_records = TokenLoader(data, "train", batch_size=2, seq_len=16, seed=3)
    expected = [with_records.next_batch()[0].tolist() for _ in range(5)]
    strip_records(data)
    opened = []
    real = loader_module.open_shard
    monkeypatch.setattr(loader_module, "open_shard", lambda p: opened.append(p.name) or real(p))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = TokenLoader(data, "train", batch_size=2, seq_len=16, seed=3)
    assert [w.category for w in caught] == [UserWarning], [str(w.message) for w in caught]
    assert "--write-metadata" in str(caught[0].message) and str(data) in str(caught[0].message)
    assert len(opened) == len(read_meta(data)["splits"]["train"]["shards"])  # the scan path reads every shard
    assert [loader.next_batch()[0].tolist() for _ in range(5)] == expected
