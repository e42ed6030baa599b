"""Shared fixtures of the training tests: a small byte-level data set written in tmp_path, and runs of the
``debug`` recipe (a training step in milliseconds on one CPU core) on it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from deep_delta.data import ByteTokenizer, write_dataset
from deep_delta.train.recipes import debug


def _documents() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)[:40]]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """~100 K byte tokens of English in train/val shards (vocab 257)."""
    out = tmp_path_factory.mktemp("data") / "bytes"
    write_dataset(_documents(), ByteTokenizer(), out, val_fraction=0.1)
    return out


def tiny_config(data_dir: Path, out: Path, **overrides):
    from deep_delta.train import TrainConfig

    """The ``debug`` recipe's run of ddl-cc on ``data_dir`` into ``out``, on the CPU, silent, with ``overrides``."""
    settings = {**debug(), "variant": "ddl-cc", "data": str(data_dir), "out": str(out), "log_every": 0,
                "device": "cpu"}
    return TrainConfig(**{**settings, **overrides})


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root`` (to prove nothing was written)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def tiny_model() -> dict:
    return debug()["model"]


@pytest.fixture
def make_config(data_dir):
    """``make_config(out, **overrides)``: a TrainConfig of a tiny ddl-cc run on :func:`data_dir`."""
    return lambda out, **kw: tiny_config(kw.pop("data", data_dir), out, **kw)


@pytest.fixture
def files_of():
    return snapshot
