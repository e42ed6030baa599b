"""Durable file writes: every file the library writes for keeps goes through ``atomic_write``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
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
        # mkstemp creates the file 0600 whatever the umask; a file written in place would be 0666 less the umask,
        # so that data and models prepared on a shared machine are readable by the others it is shared with
        os.fchmod(fd, 0o666 & ~current_umask())
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


def current_umask() -> int:
    """The process's file mode creation mask (read from /proc on Linux, where reading it changes nothing; else
    set and restored at once)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_json_file(path: str | os.PathLike, what: str, *, limit: int = 16 << 20) -> object:
    """The JSON value in ``path`` (``what`` says what the file should be, e.g. "a run record"), read as UTF-8. A
    file that is missing, larger than ``limit`` bytes, not UTF-8 or not JSON is an error naming the file (a
    ``FileNotFoundError`` or ``ValueError``), never a raw decoding error without a path; nothing of a file that
    is not what it should be is echoed."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; expected {what}")
    size = path.stat().st_size
    if size > limit:
        raise ValueError(f"{path} holds {size:,} bytes, more than {what} ever does (at most {limit:,}); it is not "
                         f"{what}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); expected {what}") from None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); expected {what}") from None


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Write a matplotlib figure as PNG through :func:`atomic_write` and close it; returns the path."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write(path, buf.getvalue())
    return Path(path)


# ---------------------------------------------------------------------- build beside, then swap in
# A directory written as a whole (prepared data, the default data cache, a checkpoint, an export) is built in a
# directory beside its target (same filesystem, so one rename moves it) and put in place by ``swap_in``: a failure
# before the swap leaves the target as it was, and nothing half-built is ever at the target's name.
STALE_AFTER = 24 * 3600  # seconds: when a temporary directory without a process in its name counts as stale


def _owner() -> str:
    """``HOST-PID`` of this process, written into the names of its temporary directories."""
    return f"{re.sub(r'[^A-Za-z0-9.-]', '_', socket.gethostname()) or 'host'}-{os.getpid()}"


def beside(target: str | os.PathLike, kind: str) -> Path:
    """A fresh name beside ``target`` for a temporary directory of this process: ``.NAME.KIND-HOST-PID-XXXXXXXX``
    (``kind`` "tmp": being built; "old": a previous ``target`` set aside), the names :func:`remove_stale` knows."""
    target = Path(target)
    return target.parent / f".{target.name}.{kind}-{_owner()}-{uuid.uuid4().hex[:8]}"


def staging_dir(target: str | os.PathLike) -> Path:
    """A new empty directory beside ``target`` (:func:`beside`, kind "tmp") to build it in."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    path = beside(target, "tmp")
    path.mkdir()
    return path


def swap_in(
    built: str | os.PathLike,
    target: str | os.PathLike,
    *,
    aside: str | os.PathLike | None = None,
    keep: Callable[[Path], bool] | None = None,
) -> bool:
    """Put the directory ``built`` (made beside ``target``, on the same filesystem) at ``target``: the one place
    the library swaps a directory it built into place, its files given the mode of a file written in place
    (:func:`follow_umask`). A ``target`` already there (other than an empty directory,
    which the rename replaces) is renamed aside (to ``aside``, else a fresh :func:`beside` name of kind "old"),
    ``built`` is renamed onto ``target``, and only then is the old one removed; if that rename fails, the old one
    is renamed back and the error raised. Returns True.

    ``keep`` serves a directory that several processes may build at once (a cache): it is called with a
    ``target`` found in the way. When it says True, that one stays, ``built`` is left to the caller, and the
    result is False; otherwise that one is worth nothing, so it is removed at once, and a copy another process
    puts there meanwhile is offered to ``keep`` in turn."""
    built, target = Path(built), Path(target)
    follow_umask(built)
    for _ in range(10):
        try:
            os.rename(built, target)  # nothing at target (or an empty directory): nothing to set aside
            break
        except OSError:
            if not os.path.lexists(target):
                raise
        if keep is not None and keep(target):
            return False
        old = Path(aside) if aside is not None else beside(target, "old")
        try:
            os.rename(target, old)
        except FileNotFoundError:
            continue  # another process set it aside first
        if keep is not None:
            _remove(old)
            continue
        try:
            os.rename(built, target)
        except BaseException:
            os.rename(old, target)
            raise
        _remove(old)
        break
    else:
        raise RuntimeError(f"could not put {built} at {target}: other processes keep replacing it")
    fsync_dir(target.parent)
    return True


def follow_umask(directory: str | os.PathLike) -> None:
    """Give every file under ``directory`` the mode a file written in place gets, 0666 less the umask: writers that
    go through a temporary file (safetensors' weights, mkstemp) make theirs 0600, which would hide the weights of a
    checkpoint or an export from the other users of a shared machine while the files beside them are readable."""
    mode = 0o666 & ~current_umask()
    for path in Path(directory).rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except (OverflowError, OSError):
        return False
    return True


def remove_stale(target: str | os.PathLike) -> list[Path]:
    """Remove the temporary directories beside ``target`` (:func:`beside` names) that a killed process (SIGKILL,
    a crash, power loss) left: those named for a process of this host that no longer runs, and those of older
    versions (no process in the name) untouched for :data:`STALE_AFTER` seconds. A running process's directories
    are left alone. Returns what was removed."""
    target = Path(target)
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(?:tmp|old)-(.+)")
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return []
    host = _owner().rsplit("-", 1)[0]
    removed = []
    for path in entries:
        m = pattern.fullmatch(path.name)
        if m is None or path.is_symlink() or not path.is_dir():
            continue
        owner = re.fullmatch(r"(.+)-(\d+)-[0-9a-f]{8}", m.group(1))
        if owner is not None:
            stale = owner.group(1) == host and not _running(int(owner.group(2)))
        else:
            try:
                stale = time.time() - path.stat().st_mtime > STALE_AFTER
            except OSError:
                continue
        if stale:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


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
    directory = Path(directory)
    files = sorted({p for pat in patterns for p in directory.glob(pat) if p.is_file()})
    record = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in files}
    atomic_write(directory / CHECKSUMS, json.dumps({"algorithm": "sha256", "files": record}, indent=2) + "\n")
    return record


def verify_checksums(directory: str | os.PathLike) -> int:
    """Check every file listed in ``directory/checksums.json``; return how many were checked (0 when the
    directory has no checksums.json, e.g. a model saved by plain transformers). Raises
    :class:`IntegrityError` naming the first file that is missing, has another size or another digest."""
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


def replaced_dir(path: str | os.PathLike, *, itself: bool = True) -> tuple[Path, str] | None:
    """The directory at or above ``path`` (strictly above it when ``itself`` is false: a command that replaces
    ``path`` as a whole, export or data preparation) that one of our commands rotates or replaces, and what it is
    ("the checkpoints of a training run", "a model directory", "a prepared data directory"); None when there is
    none. ``path`` need not exist. A run's ``checkpoints/`` counts from the start, before its first checkpoint."""
    p = Path(os.path.abspath(path))
    for d in (p, *p.parents) if itself else p.parents:
        if d.name == "checkpoints" and ((d / "LATEST").is_file() or any(d.glob("step_*"))
                                        or (d.parent / "run.json").is_file()):
            return d, "the checkpoints of a training run (rotated by `ddl train`, removed by `ddl train --overwrite`)"
        if (d / "ddl_export.json").is_file() or all((d / f).is_file() for f in _MODEL_FILES):
            return d, "a model directory (replaced by `ddl export --overwrite`, or a checkpoint rotated by `ddl train`)"
        if (d / "meta.json").is_file() and any(d.glob("*_000000.bin")):
            return d, "a prepared data directory (replaced by `ddl data prepare --overwrite`)"
    return None


def refuse_replaced_dir(out: str | os.PathLike, name: str = "out", *, itself: bool = True) -> None:
    """Refuse to write at ``out`` (the parameter ``name``) inside a directory that :func:`replaced_dir` finds (with
    ``itself``): what is written there would be lost when that directory is rotated or replaced. Every command
    that writes checks its output with this before it starts."""
    found = replaced_dir(out, itself=itself)
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


class DirectoryLockedError(FileExistsError):
    """Another process holds a directory's lock (:func:`dir_lock`)."""


@contextlib.contextmanager
def dir_lock(directory: str | os.PathLike, what: str, *, name: str = ".lock",
             busy: str = "wait for it to finish (or stop it), or choose another output directory") -> Iterator[Path]:
    """Hold an exclusive OS lock on ``DIRECTORY/<name>`` for the duration (``fcntl.flock``: the kernel releases it
    when the process ends in any way, kill -9 included): one writer per directory. A second holder is refused
    (:class:`DirectoryLockedError`) naming the first one (its pid and ``what``) and ``busy``, what to do. The lock
    file is removed on release, and ``directory`` too if this call created it and it is empty (a refused run
    leaves nothing behind). Where ``fcntl`` does not exist this is a no-op. The one lock of the package: run
    directories (``train.checkpoint.run_lock``) and data preparation (``data.prepare``)."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output directory {out} exists and is not a directory")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield path
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "pid unknown"
            os.close(fd)
            raise DirectoryLockedError(f"{out} is in use by another process ({holder}); {busy}") from None
        try:  # the holder before us may have removed the file while we waited: then lock the new one
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, {what}".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # still holding the lock: a waiter that opened this file sees it is gone and retries
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()  # only when empty


def lock_held(directory: str | os.PathLike, name: str = ".lock") -> bool:
    """Whether another process (or another open file of this one) holds ``DIRECTORY/<name>`` (:func:`dir_lock`)."""
    try:
        import fcntl

        with open(Path(directory) / name) as f:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # per open file: a lock of this process conflicts too
    except BlockingIOError:
        return True
    except (ImportError, OSError):
        return False
    return False
