"""Build beside, then swap in: ``swap_in`` replaces a directory only once the new one is complete, puts the old
one back when the swap fails, and ``remove_stale`` removes only what a dead process left."""

import os
import time

import pytest

from deep_delta import fsutil


def _dir(path, **files):
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _contents(path):
    return {p.name: p.read_text() for p in path.iterdir()}


def test_swap_in_replaces_the_target_and_removes_the_old_one_after(tmp_path):
    target = _dir(tmp_path / "t", a="old")
    built = fsutil.staging_dir(target)
    assert built.parent == tmp_path and built.name.startswith(f".t.tmp-{os.uname().nodename}-{os.getpid()}-")
    (built / "b").write_text("new")
    assert fsutil.swap_in(built, target) is True
    assert _contents(target) == {"b": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
    built = _dir(tmp_path / "built", c="first")
    assert fsutil.swap_in(built, tmp_path / "new") and _contents(tmp_path / "new") == {"c": "first"}


def test_a_failed_swap_puts_the_old_target_back(tmp_path, monkeypatch):
    target = _dir(tmp_path / "t", a="old")
    built = _dir(tmp_path / ".t.tmp-x", b="new")
    real = os.rename

    def rename(src, dst):
        if os.fspath(src) == str(built):
            raise OSError(28, "No space left on device", os.fspath(src))
        return real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        fsutil.swap_in(built, target)
    assert _contents(target) == {"a": "old"} and _contents(built) == {"b": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".t.tmp-x", "t"]


def test_an_aside_name_of_the_callers_choice(tmp_path, monkeypatch):
    target = _dir(tmp_path / "t", a="old")
    built = _dir(tmp_path / ".build", b="new")
    seen = []
    real = os.rename
    monkeypatch.setattr(os, "rename", lambda src, dst: (seen.append(os.path.basename(dst)), real(src, dst)))
    fsutil.swap_in(built, target, aside=tmp_path / ".old-t")
    assert seen == ["t", ".old-t", "t"] and _contents(target) == {"b": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_keep_leaves_a_good_copy_and_replaces_a_bad_one(tmp_path):
    target = _dir(tmp_path / "t", ok="yes")
    built = _dir(tmp_path / ".t.tmp-x", ok="mine")
    good = lambda d: (d / "ok").read_text() == "yes"
    assert fsutil.swap_in(built, target, keep=good) is False
    assert _contents(target) == {"ok": "yes"} and built.is_dir()  # the caller removes what it built
    (target / "ok").write_text("corrupt")
    assert fsutil.swap_in(built, target, keep=good) is True
    assert _contents(target) == {"ok": "mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_remove_stale_removes_only_what_a_dead_process_left(tmp_path):
    target = tmp_path / "t"
    host = os.uname().nodename
    dead = _dir(tmp_path / f".t.old-{host}-999999999-0123abcd")
    alive = _dir(tmp_path / f".t.tmp-{host}-{os.getpid()}-0123abcd")
    elsewhere = _dir(tmp_path / ".t.tmp-another-host-1-0123abcd")  # its process may run: we cannot tell
    legacy_old = _dir(tmp_path / ".t.tmp-k3j4h5g6")
    os.utime(legacy_old, (time.time() - 2 * fsutil.STALE_AFTER,) * 2)
    legacy_new = _dir(tmp_path / ".t.old-a1b2c3d4")
    other = _dir(tmp_path / f".u.tmp-{host}-999999999-0123abcd")  # beside another target
    assert sorted(fsutil.remove_stale(target)) == sorted([dead, legacy_old])
    assert all(p.is_dir() for p in (alive, elsewhere, legacy_new, other))


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, mask):
    """Files written atomically (a temporary file renamed) come out as any other file does: 0666 less the umask
    (mkstemp made them 0600, so data and models prepared on a shared machine were unreadable to its other users):
    shards and meta.json, the report files, and atomic_write itself."""
    import stat

    from deep_delta.data import ByteTokenizer, write_dataset
    from deep_delta.experiments.report import write_outputs
    from deep_delta.fsutil import atomic_write

    old = os.umask(mask)
    try:
        atomic_write(tmp_path / "a.txt", "x")
        write_dataset(["some text " * 50], ByteTokenizer(), tmp_path / "data", val_fraction=0.1)
        write_outputs(tmp_path / "report", "compare", {"rows": []}, "# report\n")
    finally:
        os.umask(old)
    files = [tmp_path / "a.txt", *(tmp_path / "data").iterdir(), *(tmp_path / "report").iterdir()]
    assert len(files) >= 5
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_checkpoint_and_export_weights_follow_the_umask(tmp_path, mask):
    """safetensors writes its files 0600 whatever the umask: a checkpoint's model.safetensors and
    train_state.safetensors and an export's model.safetensors came out unreadable to the other users of a shared
    machine while every file beside them was 0644. Every file of both follows the umask."""
    import stat

    from deep_delta.hf import export_model
    from deep_delta.train.checkpoint import save_checkpoint
    from helpers import tiny_model

    model = tiny_model("ddl-cc")
    old = os.umask(mask)
    try:
        ckpt = save_checkpoint(tmp_path / "run", 3, save_model=lambda d: model.save_pretrained(d),
                               train_state={"step": 3, "w": model.lm_head.weight.detach()},
                               meta={"variant": "ddl-cc", "preset": "tiny", "tokenizer": "byte"})
        export = export_model(tmp_path / "run", tmp_path / "hf")
    finally:
        os.umask(old)
    files = [*ckpt.iterdir(), *export.iterdir()]
    assert {"model.safetensors", "train_state.safetensors"} <= {p.name for p in files}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask, path
