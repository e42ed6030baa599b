"""Where each named source's tokens lie in each split (meta.json's ``splits.<split>.sources``): recorded by
preparation for documents that come from named sources (a named corpus's packages, or any ``sources`` list given to
``write_dataset``), kept across an interrupted and resumed preparation and a split by tokens, never part of the data
fingerprint, and added to a named corpus prepared before they were recorded by preparing it again."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from deb_fixtures import tiny_corpus

from deep_delta.cli.main import main
from deep_delta.data import ByteTokenizer, DataError, TokenLoader, read_meta, write_dataset
from deep_delta.data.corpora import CORPORA
from deep_delta.data.loader import split_shards
from deep_delta.data.shards import open_shard
from deep_delta.train.provenance import data_fingerprint

prep = importlib.import_module("deep_delta.data.prepare")


def _docs(n_a=60, n_b=40, seed=0):
    """Documents of two sources: A's written in 'a's, B's in 'b's, of varied length."""
    rng = np.random.default_rng(seed)
    a = ["A " + "a" * int(rng.integers(20, 200)) for _ in range(n_a)]
    b = ["B " + "b" * int(rng.integers(20, 200)) for _ in range(n_b)]
    return a + b, [("alpha", n_a), ("beta", n_b)]


def _stream(out, split):
    return np.concatenate([np.asarray(open_shard(p)) for p in split_shards(out, split)]).astype(np.int64)


def _truth(tokens: np.ndarray) -> np.ndarray:
    """The source of every token of a stream of these documents: each document's first byte names it ('A' / 'B');
    a document's tokens run to its end-of-text token (256) included."""
    owner, current = np.empty(len(tokens), dtype="<U5"), None
    starts = np.r_[0, np.flatnonzero(tokens == 256) + 1]
    for lo, hi in zip(starts, np.r_[starts[1:], len(tokens)]):
        if lo < len(tokens):
            current = {ord("A"): "alpha", ord("B"): "beta"}.get(int(tokens[lo]), current)  # a cut document: as before
            owner[lo:hi] = current
    return owner


def _from_runs(runs, n) -> np.ndarray:
    owner = np.empty(n, dtype="<U5")
    for i, (start, name) in enumerate(runs):
        owner[start : runs[i + 1][0] if i + 1 < len(runs) else n] = name
    return owner


@pytest.mark.parametrize("test_fraction", [0.0, 0.15])
def test_each_split_records_where_each_sources_tokens_lie(tmp_path, test_fraction):
    docs, sources = _docs()
    meta = write_dataset(docs, ByteTokenizer(), tmp_path / "o", val_fraction=0.15, test_fraction=test_fraction,
                         shard_tokens=1000, sources=sources)
    assert meta["split_by"] == "documents"
    for split, info in meta["splits"].items():
        tokens = _stream(tmp_path / "o", split)
        assert [name for _, name in info["sources"]] == ["alpha", "beta"]  # every split holds both, in order
        np.testing.assert_array_equal(_from_runs(info["sources"], len(tokens)), _truth(tokens))
    assert read_meta(tmp_path / "o")["splits"] == meta["splits"]  # what read_meta accepts


def test_the_fingerprint_and_the_shards_do_not_depend_on_the_source_runs(tmp_path):
    docs, sources = _docs()
    named = write_dataset(docs, ByteTokenizer(), tmp_path / "named", val_fraction=0.1, sources=sources)
    plain = write_dataset(docs, ByteTokenizer(), tmp_path / "plain", val_fraction=0.1)
    assert all("sources" not in info for info in plain["splits"].values())
    assert data_fingerprint(tmp_path / "named", named) == data_fingerprint(tmp_path / "plain", plain)
    for name in ("train_000000.bin", "val_000000.bin"):
        assert (tmp_path / "named" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


def test_a_split_by_tokens_cuts_the_runs_with_the_stream(tmp_path):
    # two documents cannot give 10% validation and 10% test: the stream is cut by tokens
    docs, sources = ["A " + "a" * 3000, "B " + "b" * 1000], [("alpha", 1), ("beta", 1)]
    meta = write_dataset(docs, ByteTokenizer(), tmp_path / "o", val_fraction=0.1, test_fraction=0.1,
                         sources=sources)
    assert meta["split_by"] == "tokens"
    # the stream of the train, val and test documents, in that order, is what was cut: its runs, cut with it
    whole = np.concatenate([_stream(tmp_path / "o", s) for s in ("train", "val", "test")])
    glued = np.concatenate([_from_runs(meta["splits"][s]["sources"], meta["splits"][s]["num_tokens"])
                            for s in ("train", "val", "test")])
    np.testing.assert_array_equal(glued, _truth(whole))


def test_an_interrupted_preparation_keeps_its_source_runs(tmp_path, monkeypatch):
    docs, sources = _docs(300, 200)
    whole = write_dataset(docs, ByteTokenizer(), tmp_path / "whole", val_fraction=0.1, test_fraction=0.1,
                          shard_tokens=3000, sources=sources, resume=True)
    saved, calls = prep._save_progress, []

    def killed(directory, state):
        saved(directory, state)
        calls.append(state)
        if len(calls) == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_save_progress", killed)
    with pytest.raises(KeyboardInterrupt):
        write_dataset(docs, ByteTokenizer(), tmp_path / "o", val_fraction=0.1, test_fraction=0.1, shard_tokens=3000,
                      sources=sources, resume=True)
    assert any(rec["sources"] for rec in calls[-1]["splits"].values())  # kept in the progress record
    monkeypatch.undo()
    again = write_dataset(docs, ByteTokenizer(), tmp_path / "o", val_fraction=0.1, test_fraction=0.1,
                          shard_tokens=3000, sources=sources, resume=True)
    assert again["splits"] == whole["splits"]


def test_a_source_list_that_does_not_count_the_documents_is_refused(tmp_path):
    docs, _ = _docs(5, 5)
    with pytest.raises(ValueError, match="`sources` name 8 documents, but the source gave more"):
        write_dataset(docs, ByteTokenizer(), tmp_path / "a", val_fraction=0, sources=[("alpha", 5), ("beta", 3)])
    with pytest.raises(ValueError, match="`sources` name 12 documents, but the source gave 10"):
        write_dataset(docs, ByteTokenizer(), tmp_path / "b", val_fraction=0, sources=[("alpha", 5), ("beta", 7)])
    with pytest.raises(ValueError, match=r"`sources` got \('', 5\); allowed: \(name, number of documents\) pairs"):
        write_dataset(docs, ByteTokenizer(), tmp_path / "c", val_fraction=0, sources=[("", 5), ("beta", 5)])


@pytest.mark.parametrize("runs", [[], [[1, "alpha"]], [[0, "alpha"], [0, "beta"]], [[0, ""]], [[0, "a"], [10**9, "b"]],
                                  "alpha"])
def test_meta_json_source_runs_are_checked(tmp_path, runs):
    docs, sources = _docs(5, 5)
    write_dataset(docs, ByteTokenizer(), tmp_path / "o", val_fraction=0, sources=sources)
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    meta["splits"]["train"]["sources"] = runs
    (tmp_path / "o" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"field 'splits\.train\.sources.*allowed: \[first token, name\] runs"):
        read_meta(tmp_path / "o")


def test_the_loader_names_the_source_of_every_target_token(tmp_path):
    docs, sources = _docs()
    write_dataset(docs, ByteTokenizer(), tmp_path / "o", val_fraction=0.2, sources=sources)
    loader = TokenLoader(tmp_path / "o", "val", 3, 16)
    assert loader.source_names == ["alpha", "beta"]
    truth = _truth(_stream(tmp_path / "o", "val"))
    seen = set()
    for x, y, src in loader.eval_batches(max_batches=4, sources=True):
        assert src.shape == y.shape
        for row_x, row_src in zip(x, src):
            start = next(i for i in range(loader.num_windows) if np.array_equal(
                _stream(tmp_path / "o", "val")[i * 16 : i * 16 + 16], row_x.numpy()))
            want = truth[start * 16 + 1 : start * 16 + 17]  # the targets: positions 1..T of the window
            assert [loader.source_names[i] for i in row_src.tolist()] == want.tolist()
            seen |= set(want.tolist())
    assert seen == {"alpha", "beta"}  # the spread windows reach both sources
    plain = write_dataset(docs, ByteTokenizer(), tmp_path / "plain", val_fraction=0.2)
    assert plain and TokenLoader(tmp_path / "plain", "val", 3, 16).sources is None
    with pytest.raises(ValueError, match="records no sources .its source .python iterable. names no sources"):
        next(TokenLoader(tmp_path / "plain", "val", 3, 16).eval_batches(sources=True))


def _two_packages(n=40):
    rng = np.random.default_rng(1)
    return {package: {f"usr/share/doc/{package}/{i:03d}.txt": (f"{package} {i}. " + "word " * int(
        rng.integers(20, 120))).encode() for i in range(n)} for package in ("alpha", "beta")}


def test_a_named_corpus_prepared_before_source_runs_gets_them_by_preparing_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path / "cache"))
    corpus, _ = tiny_corpus(tmp_path / "debs", "tiny-v1", files=_two_packages())
    monkeypatch.setitem(CORPORA, corpus.name, corpus)
    out = tmp_path / "data"
    args = ["data", "prepare", "--source", "tiny-v1", "--source-dir", str(tmp_path / "debs"), "--val-fraction", "0.1",
            "--test-fraction", "0.1", "--num-proc", "1", "--out", str(out), "--no-progress"]
    assert main(args) == 0
    meta = read_meta(out)
    for split, info in meta["splits"].items():
        assert [name for _, name in info["sources"]] == ["alpha", "beta"], split
    # as prepared before the runs were recorded
    earlier = {**meta, "splits": {s: {k: v for k, v in info.items() if k != "sources"}
                                  for s, info in meta["splits"].items()}}
    (out / "meta.json").write_text(json.dumps(earlier, indent=2))
    shards = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.bin")}
    capsys.readouterr()
    assert main(args) == 0  # no --overwrite needed: nothing but meta.json changes
    said = capsys.readouterr().out
    assert "prepared again beside it, the same shards (their checksums), so only its meta.json was rewritten" in said
    assert read_meta(out)["splits"] == meta["splits"]
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.glob("*.bin")} == shards
    assert data_fingerprint(out, read_meta(out)) == data_fingerprint(out, earlier)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "debs"]  # no partial directory left
    assert main(args) == 0
    assert "already holds tiny-v1 prepared with these settings" in capsys.readouterr().out


def test_without_the_package_files_the_directory_is_kept_and_said_in_one_line(tmp_path, monkeypatch, capsys):
    import os

    from deep_delta.data import prepare

    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path / "cache"))
    corpus, _ = tiny_corpus(tmp_path / "debs", "tiny-v1", files=_two_packages(10))
    monkeypatch.setitem(CORPORA, corpus.name, corpus)
    out = tmp_path / "data"
    prepare("tiny-v1", "byte", out, val_fraction=0.2, source_dir=tmp_path / "debs", progress=False)
    meta = read_meta(out)
    earlier = {**meta, "splits": {s: {k: v for k, v in info.items() if k != "sources"}
                                  for s, info in meta["splits"].items()}}
    (out / "meta.json").write_text(json.dumps(earlier))
    bin_dir = tmp_path / "bin"  # an apt-get that cannot fetch: no package files anywhere
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho 'E: no network' >&2\nexit 100\n")
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.warns(UserWarning, match="prepared before source runs were recorded, and they were not added"):
        assert prepare("tiny-v1", "byte", out, val_fraction=0.2, progress=False) == earlier
    assert json.loads((out / "meta.json").read_text()) == earlier  # the data as it was, still usable
    assert main(["data", "prepare", "--source", "tiny-v1", "--val-fraction", "0.2", "--out", str(out),
                 "--no-progress"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "they were not added: cannot fetch" in notes[0]
