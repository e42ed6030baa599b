"""Cached data directories, prepared once with the byte tokenizer: ``default_data_dir`` (the embedded default
text) and ``prose_data_dir`` (the ``prose-v1`` corpus of pinned Debian documentation packages)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from deep_delta.data.cache import default_cache_dir
from deep_delta.data.corpora import PROSE_V1
from deep_delta.data.prepare import (
    DEFAULT_SHARD_TOKENS,
    META_FORMAT,
    check_data_dir,
    prepare_from,
    write_dataset,
)
from deep_delta.data.settings import PrepareSettings
from deep_delta.data.sources import default_texts, texts_sha256
from deep_delta.data.tokenizers import ByteTokenizer
from deep_delta.fsutil import remove_stale, staging_dir, swap_in

DEFAULT_DIR_NAME = "pydoc-byte"
# ~465 K tokens in all: 10% (~46 K tokens, ~180 windows of 256) gives a steadier validation loss than 1%.
PYDOC_VAL_FRACTION = 0.1
PROSE_DIR_NAME = f"{PROSE_V1.name}-byte"


def _is_current(path: Path, sha256: str) -> bool:
    try:
        meta = check_data_dir(path)
    except (OSError, ValueError):
        return False
    return (
        meta.get("format") == META_FORMAT
        and meta.get("source") == "default"
        and meta.get("source_sha256") == sha256
        and meta.get("tokenizer") == ByteTokenizer.name
        and meta.get("val_fraction") == PYDOC_VAL_FRACTION
        and meta.get("shard_tokens") == DEFAULT_SHARD_TOKENS
        and meta.get("max_tokens") is None
    )


def default_data_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory of the embedded default corpus (CPython's ``pydoc_data.topics``) as byte-level token shards.

    Built on first use into ``<cache_dir>/pydoc-byte`` (``cache_dir`` defaults to :func:`default_cache_dir`) and
    reused afterwards while its ``meta.json`` and shards are intact and match this Python's text; otherwise
    rebuilt. Safe when several processes call it at once: each builds in its own temporary directory and
    renames it into place; a process that loses the race uses the winner's copy.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    out = root / DEFAULT_DIR_NAME
    texts = default_texts()
    sha = texts_sha256(texts)
    if _is_current(out, sha):
        return out
    remove_stale(out)  # what a killed build left; other processes' builds in progress are kept
    staging = staging_dir(out)
    try:
        write_dataset(texts, ByteTokenizer(), staging, val_fraction=PYDOC_VAL_FRACTION,
                      shard_tokens=DEFAULT_SHARD_TOKENS,
                      source_info={"source": "default", "source_detail": "pydoc_data.topics", "source_sha256": sha})
        swap_in(staging, out, keep=lambda found: _is_current(found, sha))  # another process's good copy stays
        return out
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def prose_settings(cache_dir: str | os.PathLike | None = None, *, source_dir: str | os.PathLike | None = None,
                   progress: bool = False) -> PrepareSettings:
    """The settings of the ``prose-v1`` data directory, those of its recipe ``ddl data prepare --source prose-v1
    --val-fraction F --test-fraction F --num-proc 1 --out <cache_dir>/prose-v1-byte``, with the corpus's fractions
    (``PROSE_V1.val_fraction``, ``PROSE_V1.test_fraction``)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return PrepareSettings(source=PROSE_V1.name, out=str(root / PROSE_DIR_NAME), val_fraction=PROSE_V1.val_fraction,
                           test_fraction=PROSE_V1.test_fraction, overwrite=True, progress=progress, num_proc=1,
                           source_dir=None if source_dir is None else str(source_dir))


def prose_data_dir(cache_dir: str | os.PathLike | None = None, *, source_dir: str | os.PathLike | None = None,
                   progress: bool = False) -> Path:
    """Directory of the ``prose-v1`` corpus (English documentation prose from 13 pinned Debian packages, ~70 M
    byte tokens) as byte-level token shards with the splits train, val (the selection split) and test.

    Built on first use into ``<cache_dir>/prose-v1-byte`` (``cache_dir`` defaults to :func:`default_cache_dir`):
    the package files are fetched once with ``apt-get download`` into ``<cache root>/sources/prose-v1`` (or read
    from ``source_dir``, a directory of them downloaded beforehand) and checked against their pinned SHA-256. Later
    calls find it built (its ``meta.json`` names the same packages and settings and the shard headers agree) and
    return at once. Built like ``ddl data prepare`` builds (in ``.prose-v1-byte.partial``, renamed into place when
    complete), so an interrupted build leaves no half-written directory; a damaged or differently made one is
    replaced."""
    settings = prose_settings(cache_dir, source_dir=source_dir, progress=progress)
    prepare_from(settings)
    return Path(settings.out)
