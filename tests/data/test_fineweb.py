"""FineWeb-Edu through Hugging Face ``datasets``, offline: local parquet files with the data set's schema."""

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deep_delta.cli.main import main
from deep_delta.data import DataUnavailableError, open_shard, prepare, read_meta
from deep_delta.data.loader import split_shards
from deep_delta.data.sources import FINEWEB_REPO, fineweb_records, iter_texts

# The columns of HuggingFaceFW/fineweb-edu (sample-10BT / sample-100BT), with their arrow types.
SCHEMA = pa.schema([
    ("text", pa.string()), ("id", pa.string()), ("dump", pa.string()), ("url", pa.string()),
    ("date", pa.string()), ("file_path", pa.string()), ("language", pa.string()),
    ("language_score", pa.float64()), ("token_count", pa.int64()), ("score", pa.float64()),
    ("int_score", pa.int64()),
])


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path_factory, monkeypatch):
    # datasets writes lock files into its cache even when streaming: keep them out of the user's ~/.cache
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf-datasets-cache"))


def write_fineweb(directory, files=2, rows=15):
    directory.mkdir(parents=True, exist_ok=True)
    texts = []
    for f in range(files):
        batch = [f"Photosynthesis lesson {f}-{r}. " + "Plants turn light into sugar. " * (r % 5 + 1) for r in range(rows)]
        texts += batch
        table = pa.table({
            "text": batch,
            "id": [f"<urn:uuid:{f:04d}-{r:04d}>" for r in range(rows)],
            "dump": ["CC-MAIN-2024-10"] * rows,
            "url": [f"https://example.org/{f}/{r}" for r in range(rows)],
            "date": ["2024-02-20T12:00:00Z"] * rows,
            "file_path": [f"s3://commoncrawl/crawl-data/{f}.warc.gz"] * rows,
            "language": ["en"] * rows,
            "language_score": [0.95] * rows,
            "token_count": [len(t.split()) for t in batch],
            "score": [3.1] * rows,
            "int_score": [3] * rows,
        }, schema=SCHEMA)
        pq.write_table(table, directory / f"{f:03d}_00000.parquet")
    return sorted(directory.glob("*.parquet")), texts


def streams(d):
    return {s: np.concatenate([np.asarray(open_shard(p)) for p in split_shards(d, s)]) for s in ("train", "val")}


def test_records_through_datasets(tmp_path):
    files, texts = write_fineweb(tmp_path / "fw")
    records = list(fineweb_records(data_files=[str(p) for p in files]))
    assert set(records[0]) == set(SCHEMA.names)
    assert list(iter_texts(records, "fw")) == texts


@pytest.fixture
def hub_from_local(tmp_path, monkeypatch):
    """Make load_dataset(FINEWEB_REPO, name=...) read local FineWeb-schema parquet files instead of the Hub."""
    files, texts = write_fineweb(tmp_path / "fw")
    real = datasets.load_dataset
    calls = []

    def fake(path, name=None, split=None, streaming=False, **kw):
        calls.append((path, name, split, streaming))
        assert path == FINEWEB_REPO
        return real("parquet", data_files=[str(p) for p in files], split=split, streaming=streaming)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    return files, texts, calls


def test_fineweb_source_matches_local_parquet(tmp_path, hub_from_local):
    files, texts, calls = hub_from_local
    meta = prepare("fineweb-edu:sample-100BT", "byte", tmp_path / "hub", val_fraction=0.1, progress=False)
    assert calls == [(FINEWEB_REPO, "sample-100BT", "train", True)]
    assert meta["source"] == "fineweb-edu:sample-100BT" and meta["num_documents"] == len(texts)
    assert meta["num_tokens"] == sum(len(t.encode()) + 1 for t in texts)
    prepare(str(tmp_path / "fw" / "*.parquet"), "byte", tmp_path / "local", val_fraction=0.1, progress=False)
    a, b = streams(tmp_path / "hub"), streams(tmp_path / "local")
    for split in a:
        np.testing.assert_array_equal(a[split], b[split])


def test_fineweb_cli_with_max_tokens(tmp_path, hub_from_local, capsys):
    rc = main(["data", "prepare", "--source", "fineweb-edu", "--out", str(tmp_path / "o"), "--max-tokens", "2k",
               "--no-progress"])
    assert rc == 0
    meta = read_meta(tmp_path / "o")
    assert meta["num_tokens"] == 2000 and meta["truncated"] and meta["source"] == "fineweb-edu:sample-10BT"
    assert hub_from_local[2][0][1] == "sample-10BT"
    assert "prepared 2,000 tokens" in capsys.readouterr().out


def test_hub_unreachable(tmp_path, monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise ConnectionError(f"Couldn't reach '{FINEWEB_REPO}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataUnavailableError, match="Hub is unreachable") as info:
        prepare("fineweb-edu:sample-10BT", "byte", tmp_path / "o", progress=False)
    assert "--source 'fineweb-edu/sample/10BT/*.parquet'" in str(info.value)
    assert not (tmp_path / "o").exists() and list(tmp_path.iterdir()) == []
    rc = main(["data", "prepare", "--source", "fineweb-edu", "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "error: cannot open the Hugging Face Hub" in err and "local source" in err


def test_hub_drops_mid_stream(tmp_path, monkeypatch):
    def flaky(*args, **kwargs):
        def gen():
            yield {"text": "one"}
            yield {"text": "two"}
            raise ConnectionError("connection reset")

        return gen()

    monkeypatch.setattr(datasets, "load_dataset", flaky)
    with pytest.raises(DataUnavailableError, match=r"failed after 2 records \(ConnectionError: connection reset\)"):
        prepare("fineweb-edu", "byte", tmp_path / "o", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_empty_config():
    with pytest.raises(ValueError, match="empty config"):
        prepare("fineweb-edu:", "byte", "unused", progress=False)
