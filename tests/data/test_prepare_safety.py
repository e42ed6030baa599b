"""`ddl data prepare` interrupted (Ctrl-C), killed (stale temporary directories) or writing where it may not
(a read-only --out, an unwritable parent, a read-only filesystem)."""

import importlib
import multiprocessing
import os
import signal
import subprocess
import time

import pytest
from data_helpers import TEXT, one_line_error, prepared

from deep_delta.data import prepare


def _interrupting(n, how):
    def documents():
        for i in range(n):
            yield f"doc {i}: {TEXT}"
        how()

    return documents


def _keyboard_interrupt():
    raise KeyboardInterrupt


def test_ctrl_c_leaves_the_old_output_and_a_resumable_partial_dir(tmp_path, monkeypatch):
    from deep_delta.data.sources import Source

    prep = importlib.import_module("deep_delta.data.prepare")  # the package's `prepare` is the function

    out = prepared(tmp_path, "o")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    gen = _interrupting(300, _keyboard_interrupt)  # > one encode batch: shards are on disk when it stops
    monkeypatch.setattr(prep, "resolve_source", lambda spec, text_suffixes=(), exclude=(), source_dir=None: Source(gen(), {"source": "test"}))
    with pytest.raises(KeyboardInterrupt):
        prepare("x", "byte", out, overwrite=True, shard_tokens=1000, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # the finished shards stay beside --out for a rerun to resume; an error of the data removes them
    assert sorted(p.name for p in tmp_path.iterdir()) == [".o.partial", "o", "o.jsonl"]
    monkeypatch.setattr(prep, "resolve_source", lambda spec, text_suffixes=(), exclude=(), source_dir=None: Source(["x", 5], {"source": "test"}))
    with pytest.raises(TypeError):
        prepare("x", "byte", out, overwrite=True, shard_tokens=1000, progress=False, num_proc=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "o.jsonl"]


def _killed_prepare(out):
    from deep_delta.data.sources import Source

    prep = importlib.import_module("deep_delta.data.prepare")  # the package's `prepare` is the function

    gen = _interrupting(300, lambda: os.kill(os.getpid(), signal.SIGKILL))
    prep.resolve_source = lambda spec, text_suffixes=(), exclude=(), source_dir=None: Source(gen(), {"source": "test"})
    prepare("x", "byte", out, shard_tokens=1000, progress=False)


def test_stale_staging_of_a_killed_run_is_removed(tmp_path):
    out = tmp_path / "o"
    proc = multiprocessing.get_context("fork").Process(target=_killed_prepare, args=(out,))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    left = [p.name for p in tmp_path.iterdir()]
    assert left == [".o.partial"]  # what SIGKILL leaves behind (a rerun with other settings starts over)
    stale = tmp_path / f".o.tmp-{os.uname().nodename}-999999999-0123abcd"  # an earlier version's, dead process
    stale.mkdir()
    legacy = tmp_path / ".o.tmp-k3j4h5g6"  # an earlier version's name (no pid), two days old
    legacy.mkdir()
    os.utime(legacy, (time.time() - 2 * 86400,) * 2)
    mine = tmp_path / f".o.tmp-{os.uname().nodename}-{os.getpid()}-0123abcd"  # a live process's staging
    mine.mkdir()
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    prepare(src, "byte", out, val_fraction=0, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["c.txt", "o", mine.name])


@pytest.fixture
def locked(tmp_path, monkeypatch):
    """A directory whose writes the OS refuses (tests run as root, where permissions do not stop writes: the
    refusal a normal user gets is raised by the system calls that create, open for writing or rename)."""
    where = tmp_path / "locked"
    where.mkdir()
    inside = lambda p: os.fspath(p).startswith(str(where))

    def refuse(real, writes=lambda *a: True):
        def call(path, *args, **kwargs):
            if inside(path) and writes(*args):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real(path, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "mkdir", refuse(os.mkdir))
    monkeypatch.setattr(os, "rename", refuse(os.rename))
    monkeypatch.setattr(os, "replace", refuse(os.replace))
    monkeypatch.setattr(os, "open", refuse(os.open, lambda flags=0, *a: bool(flags & (os.O_WRONLY | os.O_RDWR))))
    return where


def test_unwritable_parent_is_a_permission_error_naming_out(tmp_path, locked, capsys):
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    out = locked / "o"
    with pytest.raises(PermissionError) as info:
        prepare(src, "byte", out, val_fraction=0, progress=False)
    assert info.value.filename == str(out)
    err = one_line_error(capsys, 1, ["data", "prepare", "--source", str(src), "--out", str(out), "--no-progress"])
    assert err == f"ddl data: error: permission denied: {out} (choose a directory you can write to)"


def test_read_only_out_is_not_replaced(tmp_path, monkeypatch):
    out = prepared(tmp_path, "o")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if os.fspath(p) == str(out) else real_access(p, mode, **k))
    with pytest.raises(PermissionError) as info:
        prepare(tmp_path / "o.jsonl", "byte", out, overwrite=True, progress=False)
    assert info.value.filename == str(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.fixture
def read_only_mount(tmp_path, monkeypatch):
    """A read-only tmpfs where this process may mount one (root); elsewhere the error such a filesystem gives
    (EROFS) is raised by every directory creation under it."""
    import errno

    where = tmp_path / "ro"
    where.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(where)], capture_output=True).returncode == 0
    if not mounted:
        real_mkdir = os.mkdir

        def mkdir(path, *a, **k):
            if os.fspath(path).startswith(str(where) + os.sep):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
            return real_mkdir(path, *a, **k)

        monkeypatch.setattr(os, "mkdir", mkdir)
    try:
        yield where
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=True)


def test_read_only_filesystem_names_out(tmp_path, read_only_mount, capsys):
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    out = read_only_mount / "o"
    err = one_line_error(capsys, 1, ["data", "prepare", "--source", str(src), "--out", str(out), "--no-progress"])
    assert err == f"ddl data: error: Read-only file system: {out}"
