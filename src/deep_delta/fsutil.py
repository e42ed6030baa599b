"""Durable file writes: every file the library writes for keeps goes through ``atomic_write``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
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


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Write a matplotlib figure as PNG through :func:`atomic_write` and close it; returns the path."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write(path, buf.getvalue())
    return Path(path)


# ---------------------------------------------------------------------- integrity of weight files
CHECKSUMS = "checksums.json"


class IntegrityError(ValueError):
    """A file does not match the checksum recorded beside it (bit rot, a partial copy, tampering)."""


def sha256_file(path: str | os.PathLike) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_checksums(directory: str | os.PathLike, patterns: tuple[str, ...] = ("*.safetensors",)) -> dict:
    """Record the SHA-256 and size of the files matching ``patterns`` in ``directory/checksums.json``."""
    import json

    directory = Path(directory)
    files = sorted({p for pat in patterns for p in directory.glob(pat) if p.is_file()})
    record = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in files}
    atomic_write(directory / CHECKSUMS, json.dumps({"algorithm": "sha256", "files": record}, indent=2) + "\n")
    return record


def verify_checksums(directory: str | os.PathLike) -> int:
    """Check every file listed in ``directory/checksums.json``; return how many were checked (0 when the
    directory has no checksums.json, e.g. a model saved by plain transformers). Raises
    :class:`IntegrityError` naming the first file that is missing, has another size or another digest."""
    import json

    directory = Path(directory)
    listing = directory / CHECKSUMS
    if not listing.is_file():
        return 0
    try:
        files = json.loads(listing.read_text())["files"]
        items = [(str(name), str(rec["sha256"]), int(rec["bytes"])) for name, rec in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise IntegrityError(f"{listing} is not a valid checksum list ({e})") from None
    for name, digest, size in items:
        path = directory / name
        if not path.is_file():
            raise IntegrityError(f"{path} is listed in {listing} but missing")
        if path.stat().st_size != size:
            raise IntegrityError(
                f"{path} has {path.stat().st_size} bytes but {listing} records {size}: the file is truncated or "
                "was changed after it was written"
            )
        if sha256_file(path) != digest:
            raise IntegrityError(
                f"{path} does not match its SHA-256 in {listing}: the file is corrupt or was changed after it "
                "was written"
            )
    return len(items)


def as_os_error(error: BaseException, path: str | os.PathLike) -> BaseException:
    """``error`` as an ``OSError`` naming ``path`` when it is a full disk in disguise (safetensors and
    torch's zip writer report ENOSPC as their own errors: "StorageFull", "unexpected pos ..."); otherwise
    ``error`` itself."""
    import errno
    import shutil

    if isinstance(error, OSError):
        return error
    text = str(error)
    full = "StorageFull" in text or "No space left" in text or "os error 28" in text
    if not full and "unexpected pos" in text:  # torch.save's zip writer on a short write
        try:
            full = shutil.disk_usage(Path(path).parent).free < (64 << 20)
        except OSError:
            full = False
    if not full:
        return error
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


# Directories our own commands rotate or replace as a whole: ``ddl train`` prunes checkpoints and
# ``--overwrite`` removes ``checkpoints/``; ``ddl export --overwrite`` swaps a model directory; ``ddl data prepare
# --overwrite`` swaps a data directory. A file written inside one of them by another command is lost silently.
_MODEL_FILES = ("config.json", "model.safetensors")


def replaced_dir(path: str | os.PathLike) -> tuple[Path, str] | None:
    """The directory at or above ``path`` that one of our commands rotates or replaces, and what it is
    ("the checkpoints of a training run", "a model directory", "a prepared data directory"); None when there is
    none. ``path`` need not exist."""
    p = Path(os.path.abspath(path))
    for d in (p, *p.parents):
        if d.name == "checkpoints" and ((d / "LATEST").is_file() or any(d.glob("step_*"))):
            return d, "the checkpoints of a training run (rotated by `ddl train`)"
        if (d / "ddl_export.json").is_file() or all((d / f).is_file() for f in _MODEL_FILES):
            return d, "a model directory (replaced by `ddl export --overwrite`, or a checkpoint rotated by `ddl train`)"
        if (d / "meta.json").is_file() and any(d.glob("*_000000.bin")):
            return d, "a prepared data directory (replaced by `ddl data prepare --overwrite`)"
    return None


def refuse_replaced_dir(out: str | os.PathLike, name: str = "out") -> None:
    """Refuse to write derived outputs at ``out`` (the parameter ``name``) inside a directory that
    :func:`replaced_dir` finds: they would be lost when that directory is rotated or replaced."""
    found = replaced_dir(out)
    if found is not None:
        where, what = found
        raise ValueError(f"`{name}` got {out}, which is inside {where}, {what}: what is written there is lost when "
                         f"it is replaced; allowed: a directory outside it (choose one with `{name}`)")


def refuse_unwritable_results(paths: Iterable[str | os.PathLike]) -> None:
    """Before a long computation, not after it: each of ``paths`` (the result files it will write) must be
    writable as a file: neither a directory itself nor below a regular file."""
    for path in map(Path, paths):
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a directory, but a result file of that name is written there; move "
                                    "or remove it, or choose another output")
        blocker = next((d for d in path.parents if d.exists() and not d.is_dir()), None)
        if blocker is not None:
            raise NotADirectoryError(f"{blocker} is a file, but the result {path} is to be written below it; choose "
                                     "another output")
