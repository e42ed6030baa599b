"""Durable file writes: every file the library writes for keeps goes through ``atomic_write``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def atomic_write(path: str | os.PathLike, *chunks: bytes | str) -> None:
    """Replace ``path`` with the concatenated ``chunks`` atomically.

    The data goes to a temporary file in the same directory, is fsynced, then renamed over ``path``: a
    reader (or a crash) sees the previous file or the complete new one, never a partial file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
