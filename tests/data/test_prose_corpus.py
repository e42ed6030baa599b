"""A named corpus of pinned Debian packages (the machinery of `--source prose-v1`), on tiny packages made here:
nothing is downloaded. The files come from a directory (`--source-dir`) or from `apt-get download` (a stand-in
script on PATH) into the cache, are read without being extracted, deduplicated by content, split by document,
and the prepared directory is cached: a second call finds it and returns at once."""

import importlib
import json
import os
import shutil
import subprocess

import numpy as np
import pytest
from data_helpers import one_line_error
from deb_fixtures import DOC_A, DOC_B, PAGE, PAGE_TEXT, build_deb, tiny_corpus

from deep_delta.cli.main import main
from deep_delta.data import DataError, PrepareSettings, TokenLoader, prepare, prose_data_dir
from deep_delta.data.corpora import CORPORA, PROSE_V1, html_text
from deep_delta.data.debian import deb_files
from deep_delta.data.loader import split_shards
from deep_delta.data.shards import open_shard

corpora = importlib.import_module("deep_delta.data.corpora")
default = importlib.import_module("deep_delta.data.default")
prep = importlib.import_module("deep_delta.data.prepare")


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """The tiny corpus registered as `tiny-v1`, its packages in tmp/debs, the cache in tmp/cache."""
    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path / "cache"))
    corpus, debs = tiny_corpus(tmp_path / "debs")
    monkeypatch.setitem(CORPORA, corpus.name, corpus)
    return corpus, tmp_path / "debs"


def fake_apt(tmp_path, monkeypatch, repo, *, fail=False):
    """An `apt-get` on PATH that logs its arguments and 'downloads' NAME=VERSION by copying NAME's package from
    ``repo`` under apt's name (the epoch as %3a); with ``fail`` it answers as apt does for a version it lacks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    body = ('echo "E: Version \'1:1.0-1\' for \'alpha\' was not found" >&2; exit 100' if fail else
            'shift; for spec in "$@"; do name=${spec%%=*}; cp "' + str(repo) + '/${name}_1.0-1_all.deb" '
            '"./${name}_1%3a1.0-1_all.deb"; done')
    script = bin_dir / "apt-get"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n{body}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def documents(out, split="train"):
    stream = np.concatenate([np.asarray(open_shard(p)) for p in split_shards(out, split)])
    return [bytes(d[:-1].astype(np.uint8)).decode() for d in np.split(stream, np.flatnonzero(stream == 256) + 1)[:-1]]


def test_packages_are_read_cleaned_and_deduplicated(tiny, tmp_path):
    corpus, debs = tiny
    meta = prepare(corpus.name, "byte", tmp_path / "o", val_fraction=0, source_dir=debs, progress=False)
    # alpha: a.txt and b.txt.gz (gunzipped) in path order; skip/ excluded, latin1.txt and empty.txt skipped;
    # beta: copy.txt is alpha's a.txt again (removed), page.html loses its tags; image.png matches no pattern
    assert documents(tmp_path / "o") == [DOC_A, DOC_B, PAGE_TEXT]
    pinned = corpus.pinned()
    assert meta["packages"] == [
        {**pinned[0], "documents": 2, "bytes": len(DOC_A) + len(DOC_B), "duplicates": 0, "not_utf8": 1, "empty": 1},
        {**pinned[1], "documents": 1, "bytes": len(PAGE_TEXT), "duplicates": 1, "not_utf8": 0, "empty": 0}]
    assert meta["duplicates_removed"] == 1 and meta["source"] == "tiny-v1" and meta["num_documents"] == 3
    assert meta["num_tokens"] == len(DOC_A) + len(DOC_B) + len(PAGE_TEXT) + 3
    assert not (tmp_path / "cache").exists()  # read from source_dir: nothing fetched, nothing cached


def test_html_text_strips_markup_cheaply():
    assert html_text(PAGE) == PAGE_TEXT
    assert html_text("<pre>  indented\n    code</pre>") == "  indented\n    code"  # line structure kept


def test_packages_are_fetched_once_with_apt_then_taken_from_the_cache(tiny, tmp_path, monkeypatch, capsys):
    corpus, debs = tiny
    log = fake_apt(tmp_path, monkeypatch, debs)
    first = prepare(corpus.name, "byte", tmp_path / "a", val_fraction=0, progress=False)
    assert log.read_text() == "download alpha=1:1.0-1 beta=1:1.0-1\n"
    cached = tmp_path / "cache" / "sources" / "tiny-v1"
    assert sorted(p.name for p in cached.iterdir()) == ["alpha_1.0-1_all.deb", "beta_1.0-1_all.deb"]
    assert main(["data", "prepare", "--source", "tiny-v1", "--val-fraction", "0", "--out", str(tmp_path / "b"),
                 "--no-progress"]) == 0
    assert log.read_text() == "download alpha=1:1.0-1 beta=1:1.0-1\n"  # not fetched again
    printed = capsys.readouterr().out
    assert "from alpha 1:1.0-1: 2 documents" in printed and "1 duplicates removed" in printed
    assert json.loads((tmp_path / "b" / "meta.json").read_text())["splits"] == first["splits"]
    (cached / "beta_1.0-1_all.deb").unlink()  # only what is missing is fetched
    prepare(corpus.name, "byte", tmp_path / "c", val_fraction=0, progress=False)
    assert log.read_text().splitlines()[-1] == "download beta=1:1.0-1"


def test_without_apt_the_error_says_how_to_provide_the_files(tiny, tmp_path, monkeypatch, capsys):
    corpus, _ = tiny
    empty = tmp_path / "no-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    err = one_line_error(capsys, 2, ["data", "prepare", "--source", "tiny-v1", "--out", str(tmp_path / "o"),
                                     "--no-progress"])
    assert "cannot fetch alpha 1:1.0-1, beta 1:1.0-1 for tiny-v1: `apt-get` is not installed here" in err
    assert "http://deb.debian.org/debian/pool/main/a/alpha/alpha_1.0-1_all.deb" in err and "--source-dir" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / ".o.partial").exists()


def test_a_failing_apt_is_one_line_naming_its_error(tiny, tmp_path, monkeypatch, capsys):
    corpus, debs = tiny
    fake_apt(tmp_path, monkeypatch, debs, fail=True)
    err = one_line_error(capsys, 2, ["data", "prepare", "--source", "tiny-v1", "--out", str(tmp_path / "o"),
                                     "--no-progress"])
    assert ("`apt-get download` failed (E: Version '1:1.0-1' for 'alpha' was not found)" in err
            and "--source-dir" in err)
    cached = tmp_path / "cache" / "sources" / "tiny-v1"
    assert list(cached.iterdir()) == []  # its temporary download directory is gone


def test_package_files_are_checked_against_their_pins(tiny, tmp_path):
    corpus, debs = tiny
    other = tmp_path / "other"
    shutil.copytree(debs, other)
    (other / "beta_1.0-1_all.deb").rename(other / "beta_1%3a1.0-1_all.deb")  # apt-get download's name: found
    prepare(corpus.name, "byte", tmp_path / "ok", val_fraction=0, source_dir=other, progress=False)
    build_deb(other / "alpha_1.0-1_all.deb", {"usr/share/doc/alpha/a.txt": b"other text"})
    with pytest.raises(DataError, match=r"alpha_1.0-1_all.deb: sha256 [0-9a-f]{64}, but tiny-v1 pins alpha 1:1.0-1 "
                                        r"with sha256 [0-9a-f]{64}"):
        prepare(corpus.name, "byte", tmp_path / "o", source_dir=other, progress=False)
    (other / "alpha_1.0-1_all.deb").unlink()
    with pytest.raises(FileNotFoundError, match=r"holds no alpha_1.0-1_all.deb \(alpha 1:1.0-1 of tiny-v1\); "
                                                r"download it from http://deb.debian.org/debian/pool/main/a/alpha/"):
        prepare(corpus.name, "byte", tmp_path / "o", source_dir=other, progress=False)
    assert not (tmp_path / "o").exists()


def test_source_dir_only_with_a_named_corpus(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"`source_dir` got 'debs' with `source` 'default'; allowed: a directory of "
                                         r"package files only with a named corpus \(prose-v1"):
        PrepareSettings(out=str(tmp_path / "o"), source_dir="debs")
    with pytest.raises(ValueError, match=r"`text_suffixes` \['.md'\] apply to local files only"):
        prepare("prose-v1", "byte", tmp_path / "o", text_suffixes=(".md",), progress=False)


def _many(n=80):
    rng = np.random.default_rng(0)
    return {"gamma": {f"usr/share/doc/gamma/{i:03d}.txt": (f"page {i}. " + "prose " * int(rng.integers(20, 200)))
                      .encode() for i in range(n)}}


def test_prose_data_dir_is_built_once_split_three_ways_and_reused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path / "cache"))
    corpus, _ = tiny_corpus(tmp_path / "debs", "prose-v1", val_fraction=0.1, test_fraction=0.1, files=_many())
    monkeypatch.setitem(CORPORA, "prose-v1", corpus)
    monkeypatch.setattr(default, "PROSE_V1", corpus)
    log = fake_apt(tmp_path, monkeypatch, tmp_path / "debs")
    out = prose_data_dir(tmp_path / "data")
    assert out == tmp_path / "data" / "prose-v1-byte" and log.read_text().count("download") == 1
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["val_fraction"], meta["test_fraction"], meta["split_by"]) == (0.1, 0.1, "documents")
    assert meta["num_documents"] == 80 and meta["packages"][0]["documents"] == 80
    split = {s: documents(out, s) for s in ("train", "val", "test")}
    assert sorted(d for docs in split.values() for d in docs) == sorted(t.decode() for t in _many()["gamma"].values())
    TokenLoader(out, "test", 2, 32, vocab_size=257).next_batch()

    def no_reading(*args, **kwargs):
        raise AssertionError("the corpus was read again")

    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    monkeypatch.setattr(corpora, "fetch_packages", no_reading)
    assert prose_data_dir(tmp_path / "data") == out  # found built: nothing read, nothing written
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
    assert main(["data", "prepare", "--source", "prose-v1", "--val-fraction", "0.1", "--test-fraction", "0.1",
                 "--num-proc", "1", "--out", str(out), "--no-progress"]) == 0  # the recipe's command: the same
    assert "already holds prose-v1 prepared with these settings" in capsys.readouterr().out
    monkeypatch.undo()
    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(CORPORA, "prose-v1", corpus)
    monkeypatch.setattr(default, "PROSE_V1", corpus)
    with open(out / "test_000000.bin", "r+b") as f:  # a damaged directory is built again (from the cache)
        f.truncate(2000)
    assert prose_data_dir(tmp_path / "data") == out and log.read_text().count("download") == 1
    assert json.loads((out / "meta.json").read_text())["splits"] == meta["splits"]


def test_an_interrupted_build_leaves_no_half_written_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("DDL_CACHE_DIR", str(tmp_path / "cache"))
    corpus, _ = tiny_corpus(tmp_path / "debs", "prose-v1", val_fraction=0.1, test_fraction=0.1, files=_many())
    debs = tmp_path / "debs"
    monkeypatch.setitem(CORPORA, "prose-v1", corpus)
    monkeypatch.setattr(default, "PROSE_V1", corpus)
    finish = prep._finish

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_finish", killed)
    with pytest.raises(KeyboardInterrupt):
        prose_data_dir(tmp_path / "data", source_dir=debs)
    assert not (tmp_path / "data" / "prose-v1-byte").exists()
    monkeypatch.setattr(prep, "_finish", finish)
    out = prose_data_dir(tmp_path / "data", source_dir=debs)
    assert json.loads((out / "meta.json").read_text())["num_documents"] == 80
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["prose-v1-byte"]


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is not installed")
def test_a_package_built_by_dpkg_deb_is_read(tmp_path):
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text("Package: tiny\nVersion: 1.0\nArchitecture: all\nMaintainer: x <x@y>\n"
                                             "Description: a test\n")
    (root / "usr" / "share" / "doc" / "tiny").mkdir(parents=True)
    (root / "usr" / "share" / "doc" / "tiny" / "a.txt").write_text(DOC_A)
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "-b", str(root), str(tmp_path / "t.deb")],
                   check=True, capture_output=True)
    assert list(deb_files(tmp_path / "t.deb", lambda n: n.endswith(".txt"))) == [
        ("usr/share/doc/tiny/a.txt", DOC_A.encode())]


def test_a_file_that_is_not_a_package_is_named(tmp_path):
    (tmp_path / "x.deb").write_bytes(b"not an archive")
    with pytest.raises(DataError, match=r"x.deb: not a Debian package"):
        list(deb_files(tmp_path / "x.deb", bool))
    build_deb(tmp_path / "z.deb", {"a.txt": b"x"}, compression="gz")  # data.tar.gz reads too
    assert list(deb_files(tmp_path / "z.deb", bool)) == [("a.txt", b"x")]


def test_prose_v1_is_pinned_file_by_file():
    names = [p.package.name for p in PROSE_V1.parts]
    assert len(names) == len(set(names)) == 13 and PROSE_V1.name == "prose-v1"
    for part in PROSE_V1.parts:
        p = part.package
        assert p.file_name == f"{p.name}_{p.version.split(':')[-1]}_all.deb" and p.pool.endswith("/" + p.file_name)
        assert len(p.sha256) == 64 and int(p.sha256, 16) >= 0 and part.include and part.about
    assert PROSE_V1.val_fraction > 0 and PROSE_V1.test_fraction > 0


def test_FP1_a_damaged_shard_is_named_not_nothing_to_do(tiny, tmp_path, capsys):
    """Round 6's FP1: a prepared corpus with bytes of a shard zeroed (its size and header unchanged) was "already
    prepared ...: nothing to do", and trained on. Now `ddl data prepare` reads every shard against its checksum (as
    `ddl data verify` does) before it says so: a damaged shard is one error naming it and saying to prepare again;
    `--overwrite` prepares it again."""
    from deep_delta.data import verify_data_dir

    corpus, debs = tiny
    out = tmp_path / "o"
    args = ["data", "prepare", "--source", corpus.name, "--val-fraction", "0", "--source-dir", str(debs), "--out",
            str(out), "--no-progress"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 0 and "nothing to do" in capsys.readouterr().out
    shard = out / "train_000000.bin"
    data = bytearray(shard.read_bytes())
    data[-8:] = bytes(8)  # four tokens set to 0: the same size, a valid header, every id in the vocabulary
    shard.write_bytes(bytes(data))
    err = one_line_error(capsys, 2, args)
    assert (f"{out} holds tiny-v1 prepared with these settings, but it is damaged: token shard {shard}: content "
            "differs from its checksum") in err
    assert "prepare it again with --overwrite" in err and "nothing to do" not in err
    assert main([*args, "--overwrite"]) == 0
    assert "nothing to do" not in capsys.readouterr().out  # prepared again
    assert verify_data_dir(out).problems == [] and bytes(data) != shard.read_bytes()
