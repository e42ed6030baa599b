"""``default_data_dir``: the embedded default corpus, prepared once with the byte tokenizer and cached."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from deep_delta.data.prepare import DEFAULT_SHARD_TOKENS, META_FORMAT, check_data_dir, write_dataset
from deep_delta.data.sources import default_texts, texts_sha256
from deep_delta.data.tokenizers import ByteTokenizer
from deep_delta.fsutil import remove_stale, staging_dir, swap_in

CACHE_ENV = "DDL_CACHE_DIR"
DEFAULT_DIR_NAME = "pydoc-byte"
# ~465 K tokens in all: 10% (~46 K tokens, ~180 windows of 256) gives a steadier validation loss than 1%.
PYDOC_VAL_FRACTION = 0.1


def default_cache_dir() -> Path:
    """Where cached data directories live: ``$DDL_CACHE_DIR/data`` if set, else ``~/.cache/deep_delta/data``."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "deep_delta") / "data"


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
