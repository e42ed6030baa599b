"""Where cached data lives: ``$DDL_CACHE_DIR`` if set, else ``~/.cache/deep_delta``; prepared data directories
under ``data/``, the downloaded files of a named corpus under ``sources/<name>/``."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DDL_CACHE_DIR"


def cache_root() -> Path:
    """``$DDL_CACHE_DIR`` if set, else ``~/.cache/deep_delta``."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "deep_delta"


def default_cache_dir() -> Path:
    """Where cached data directories live: ``$DDL_CACHE_DIR/data`` if set, else ``~/.cache/deep_delta/data``."""
    return cache_root() / "data"


def sources_cache_dir(name: str) -> Path:
    """Where the downloaded files of the named corpus ``name`` are kept: ``<cache root>/sources/<name>``."""
    return cache_root() / "sources" / name
