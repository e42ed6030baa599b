import json

import bpe_fixtures
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deep_delta.data import ByteTokenizer, TokenLoader, check_data_dir, open_shard, prepare, read_meta
from deep_delta.data.loader import split_shards

DOCS = [f"document {i}: " + "lorem ipsum dolor sit amet " * (i % 7 + 1) + "é✓" for i in range(40)]


def split_stream(d, split):
    files = split_shards(d, split)
    return np.concatenate([np.asarray(open_shard(p)) for p in files]) if files else np.zeros(0, np.uint16)


def documents_of(stream, eot=256):
    """Decode a byte-token stream back into documents (each ends with EOT)."""
    assert len(stream) == 0 or stream[-1] == eot
    cuts = np.flatnonzero(stream == eot)
    starts = np.concatenate([[0], cuts[:-1] + 1])
    return [ByteTokenizer().decode(stream[a:b].tolist()) for a, b in zip(starts, cuts)]


def is_subsequence(part, whole):
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


def check_split_of(d, docs, val_fraction):
    """Train and val hold exactly the documents, each once, in source order within each split."""
    train, val = documents_of(split_stream(d, "train")), documents_of(split_stream(d, "val"))
    assert sorted(train + val) == sorted(docs)
    assert is_subsequence(train, docs) and is_subsequence(val, docs)
    meta = read_meta(d)
    total = sum(len(x.encode()) + 1 for x in docs)
    assert meta["num_tokens"] == total and meta["num_documents"] == len(docs)
    assert meta["splits"]["val"]["num_documents"] == len(val)
    biggest = max(len(x.encode()) + 1 for x in docs)
    assert abs(meta["splits"]["val"]["num_tokens"] - val_fraction * total) <= biggest
    check_data_dir(d)
    return train, val


def write_jsonl(path, docs, extra=True):
    with open(path, "w", encoding="utf-8") as f:
        for i, x in enumerate(docs):
            f.write(json.dumps({"id": i, "text": x, "meta": {"k": 1}} if extra else {"text": x}) + "\n")
    return path


def test_txt_directory(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i, x in enumerate(DOCS[:10]):
        (src / ("sub" if i % 2 else "") / f"doc{i:02d}.txt").write_text(x, encoding="utf-8")
    (src / "notes.md").write_text("ignored")
    meta = prepare(src, "byte", tmp_path / "out", val_fraction=0.2, progress=False)
    order = sorted(src.rglob("*.txt"))
    expected = [p.read_text(encoding="utf-8") for p in order]
    check_split_of(tmp_path / "out", expected, 0.2)
    assert meta["source_files"] == [str(p) for p in order]
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("byte", 257, 256)


def test_jsonl_file(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", DOCS)
    prepare(path, "byte", tmp_path / "out", val_fraction=0.1, progress=False)
    train, val = check_split_of(tmp_path / "out", DOCS, 0.1)
    assert val[0] == DOCS[0] and len(val) >= 2


def test_parquet_glob_and_determinism(tmp_path):
    for k in range(2):
        pq.write_table(pa.table({"text": DOCS[20 * k : 20 * k + 20], "n": list(range(20))}), tmp_path / f"p{k}.parquet")
    prepare(str(tmp_path / "p*.parquet"), "byte", tmp_path / "a", val_fraction=0.05, progress=False)
    prepare(str(tmp_path / "p*.parquet"), "byte", tmp_path / "b", val_fraction=0.05, progress=False, shard_tokens=300)
    check_split_of(tmp_path / "a", DOCS, 0.05)
    # the shard size changes the files, not the streams
    assert len(split_shards(tmp_path / "b", "train")) > 3
    for split in ("train", "val"):
        np.testing.assert_array_equal(split_stream(tmp_path / "a", split), split_stream(tmp_path / "b", split))
    prepare(str(tmp_path / "p*.parquet"), "byte", tmp_path / "c", val_fraction=0.05, progress=False)
    for f in ("meta.json", "train_000000.bin", "val_000000.bin"):
        a, c = (tmp_path / "a" / f).read_bytes(), (tmp_path / "c" / f).read_bytes()
        assert a == c or f == "meta.json" and json.loads(a)["splits"] == json.loads(c)["splits"]


def test_default_source(tmp_path):
    from deep_delta.data.sources import default_texts

    meta = prepare("default", "byte", tmp_path / "o", val_fraction=0.02, progress=False)
    check_split_of(tmp_path / "o", default_texts(), 0.02)
    assert meta["source"] == "default" and len(meta["source_sha256"]) == 64


def test_max_tokens_cuts_exactly(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", DOCS)
    meta = prepare(path, "byte", tmp_path / "o", val_fraction=0.1, max_tokens=1000, progress=False)
    assert meta["num_tokens"] == 1000 and meta["truncated"]
    stream = np.concatenate([split_stream(tmp_path / "o", "val"), split_stream(tmp_path / "o", "train")])
    assert len(stream) == 1000
    full = sum(len(x.encode()) + 1 for x in DOCS[:5])
    meta = prepare(path, "byte", tmp_path / "p", val_fraction=0.1, max_tokens=full, progress=False)
    assert meta["num_tokens"] == full and not meta["truncated"] and meta["num_documents"] == 5


def test_no_validation_split(tmp_path):
    prepare(write_jsonl(tmp_path / "c.jsonl", DOCS), "byte", tmp_path / "o", val_fraction=0, progress=False)
    assert split_shards(tmp_path / "o", "val") == []
    assert read_meta(tmp_path / "o")["splits"]["val"]["num_tokens"] == 0
    with pytest.raises(FileNotFoundError, match="no 'val' shards"):
        TokenLoader(tmp_path / "o", "val", 1, 8)


def test_gpt2_tokenizer_from_local_bpe(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", DOCS)
    bpe = bpe_fixtures.write_tiktoken(tmp_path / "tiny.tiktoken")
    with pytest.warns(UserWarning):
        meta = prepare(path, "gpt2", tmp_path / "o", bpe_file=bpe, progress=False)
    n = len(bpe_fixtures.ranks())
    assert (meta["tokenizer"], meta["vocab_size"], meta["eot_token"]) == ("gpt2", n + 1, n)
    loader = TokenLoader(tmp_path / "o", "train", 2, 16, vocab_size=n + 1)
    assert int(loader.next_batch()[0].max()) <= n
    with pytest.raises(ValueError, match=f"holds token id {n}, but the model's vocabulary has 257"):
        TokenLoader(tmp_path / "o", "train", 2, 16, vocab_size=257)


def test_refuses_to_overwrite(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", DOCS)
    out = tmp_path / "o"
    prepare(path, "byte", out, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(FileExistsError, match="is not empty; pass --overwrite"):
        prepare(path, "byte", out, val_fraction=0.5, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    prepare(path, "byte", out, val_fraction=0.5, overwrite=True, progress=False)
    assert read_meta(out)["val_fraction"] == 0.5
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"refusing to overwrite .*notes\.txt"):
        prepare(path, "byte", out, overwrite=True, progress=False)
    assert (out / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    prepare(path, "byte", tmp_path / "empty", progress=False)  # an empty directory is fine


def test_failure_leaves_existing_output_untouched(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", DOCS)
    out = tmp_path / "o"
    prepare(good, "byte", out, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"title": "no text here"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 41: record has no 'text' field \(got \['title'\]\)"):
        prepare(bad, "byte", out, overwrite=True, progress=False, shard_tokens=100)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl", "o"]  # no temp dirs left


def test_bad_sources(tmp_path):
    out = tmp_path / "o"
    with pytest.raises(FileNotFoundError, match=r"neither 'default', a named corpus \(prose-v1\), 'fineweb-edu"):
        prepare(tmp_path / "nope.txt", "byte", out, progress=False)
    (tmp_path / "x.csv").write_text("text\nhi\n")
    with pytest.raises(ValueError, match=r"unsupported suffix '\.csv'; allowed: \.txt, \.jsonl, \.parquet"):
        prepare(tmp_path / "x.csv", "byte", out, progress=False)
    (tmp_path / "j.jsonl").write_text('{"text": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"j\.jsonl, line 2: invalid JSON"):
        prepare(tmp_path / "j.jsonl", "byte", out, progress=False)
    (tmp_path / "k.jsonl").write_text('{"text": 5}\n')
    with pytest.raises(ValueError, match=r"k\.jsonl, line 1: record has a 'text' field of type int; allowed: a string"):
        prepare(tmp_path / "k.jsonl", "byte", out, progress=False)
    pq.write_table(pa.table({"content": ["a"]}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"p\.parquet: parquet file has no 'text' column \(columns: \['content'\]\)"):
        prepare(tmp_path / "p.parquet", "byte", out, progress=False)
    (tmp_path / "blank.txt").write_text("")
    with pytest.raises(ValueError, match="holds no documents"):
        prepare(tmp_path / "blank.txt", "byte", out, progress=False)
    assert not out.exists()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"val_fraction": 1.0}, r"`val_fraction` got 1.0; allowed: a number in \[0, 1\)"),
        ({"shard_tokens": 0}, "`shard_tokens` got 0; allowed: an integer >= 1 and <= 2,147,483,647"),
        ({"max_tokens": -5}, r"`max_tokens` got -5; allowed: an integer >= 1, or None \(no cap\)"),
        ({"num_proc": 0}, r"`num_proc` got 0; allowed: an integer >= 1, or None \(the CPUs available\)"),
    ],
)
def test_bad_options(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prepare("default", "byte", tmp_path / "o", progress=False, **kwargs)
    assert not (tmp_path / "o").exists()
