"""Failure paths of training, tried as an adversary would: two processes on one run, signals, a mislabelled
resume, stale temporary files, unwritable and full output directories. Each test reproduces the failure
first (the situation that lost data or printed a traceback before) and checks what the user sees now."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from deep_delta.cli.main import main
from deep_delta.train import latest_checkpoint, train
from deep_delta.train.metrics import read_metrics
from helpers import with_options

MODEL = ["--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=2", "--set",
         "model.num_attention_heads=2", "--set", "model.max_position_embeddings=64"]
TIMING = ("tokens_per_s", "step_time_s", "flops_per_s", "mfu")


def _args(data_dir, out, steps, *extra):
    return with_options(["train", "--variant", "ddl-cc", "--data", str(data_dir), "--out", str(out), "--steps",
                         str(steps), "--batch-size", "2", "--seq-len", "16", "--warmup-steps", "2", "--eval-every",
                         "50", "--eval-batches", "1", "--save-every", "1000", "--device", "cpu", "--no-progress",
                         "--log-every", "0", "--threads", "1", *MODEL], *extra)


def _spawn(args) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "deep_delta.cli.main", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _run(args) -> subprocess.CompletedProcess:
    proc = _spawn(args)
    out, err = proc.communicate(timeout=240)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _pause_after(proc: subprocess.Popen, out: Path, records: int) -> None:
    """SIGSTOP ``proc`` once it has logged ``records`` step records (it is then mid-run, holding the lock)."""
    deadline = time.monotonic() + 120
    while len([r for r in read_metrics(out) if "loss" in r]) < records:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the training subprocess did not start"
        time.sleep(0.005)
    proc.send_signal(signal.SIGSTOP)


def _steps(out) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(out)]


def _weights(run) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(latest_checkpoint(run) / "model.safetensors"))


def test_a_second_training_on_the_same_out_is_refused_and_the_first_loses_nothing(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    first = _spawn(_args(data_dir, out, 300))
    _pause_after(first, out, 2)
    try:
        assert main(_args(data_dir, out, 300, "--resume")) == 2
        err = capsys.readouterr().err
        assert f"is in use by another process (pid {first.pid}, ddl train ddl-cc)" in err
        assert "Traceback" not in err
        assert main(_args(data_dir, out, 300, "--overwrite")) == 2  # --overwrite does not take it over either
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == list(range(1, 301))
    assert latest_checkpoint(out).name == "step_0000300"
    assert not (out / ".lock").exists()


def test_a_second_compare_on_the_same_out_is_refused(tmp_path, capsys):
    from deep_delta.train.checkpoint import run_lock

    with run_lock(tmp_path / "cmp", "ddl compare"):
        assert main(["compare", "--variants", "baseline", "--out", str(tmp_path / "cmp"), "--steps", "1",
                     "--no-progress"]) == 2
    assert f"in use by another process (pid {os.getpid()}, ddl compare)" in capsys.readouterr().err


def test_sigterm_checkpoints_the_current_step_and_resume_is_bit_identical(tmp_path, data_dir):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert _run(_args(data_dir, whole, 40)).returncode == 0
    proc = _spawn(_args(data_dir, cut, 40))
    _pause_after(proc, cut, 3)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, err
    stopped = latest_checkpoint(cut)
    step = int(stopped.name.split("_")[1])
    assert 3 <= step < 40
    assert f"stopped by SIGTERM after step {step}; checkpoint {stopped}" in err
    assert "Continue with: ddl train" in err and err.rstrip().endswith("--resume")
    assert "Traceback" not in err
    assert [r["step"] for r in read_metrics(cut) if "loss" in r] == list(range(1, step + 1))
    again = _run(_args(data_dir, cut, 40, "--resume"))
    assert again.returncode == 0, again.stderr
    assert f"resuming at step {step}" in again.stdout + again.stderr
    assert _steps(cut) == _steps(whole)
    a, b = _weights(cut), _weights(whole)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_signal_stops_at_once_and_leaves_the_last_complete_checkpoint(tmp_path, data_dir):
    out = tmp_path / "run"
    proc = _spawn(_args(data_dir, out, 400, "--save-every", "2"))
    _pause_after(proc, out, 3)
    proc.send_signal(signal.SIGINT)  # delivered first (lower number): asks to stop after this step
    proc.send_signal(signal.SIGTERM)  # the second signal: stop now
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert "ddl train: interrupted" in err and "Traceback" not in err
    from deep_delta.train import load_checkpoint

    load_checkpoint(latest_checkpoint(out))  # complete and verified


def test_resume_after_run_json_is_deleted_refuses_another_variant(tmp_path, data_dir, capsys, files_of):
    """Before: with run.json gone, --resume --variant baseline loaded the DDL-CC weights and recorded the run
    as baseline. The checkpoint's own config and settings are compared now."""
    out = tmp_path / "run"
    assert main(_args(data_dir, out, 2)) == 0
    (out / "run.json").unlink()
    before = files_of(out)
    capsys.readouterr()
    args = _args(data_dir, out, 4, "--resume")
    args[args.index("ddl-cc")] = "baseline"
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "a checkpoint of another model" in err and "model.variant: run has 'ddl-cc', now 'baseline'" in err
    assert "Traceback" not in err
    assert files_of(out) == before


def test_stale_temporary_files_are_cleaned_at_start(tmp_path, data_dir):
    out = tmp_path / "run"
    assert main(_args(data_dir, out, 2)) == 0
    root = out / "checkpoints"
    (root / ".LATEST.x1y2.tmp").write_text("step_0000009\n")
    (root / ".tmp-step_0000003-4242").mkdir()
    assert main(_args(data_dir, out, 3, "--resume")) == 0
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_0000002", "step_0000003"]


def test_out_under_a_regular_file_is_one_line(tmp_path, data_dir, capsys):
    (tmp_path / "file").write_text("not a directory")
    assert main(_args(data_dir, tmp_path / "file" / "run", 1)) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddl train: error:") and str(tmp_path / "file") in err and "Traceback" not in err
    assert main(_args(data_dir, tmp_path / "file", 1)) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_unwritable_out_is_one_line(tmp_path, data_dir, capsys, monkeypatch):
    """Tests run as root here, where permissions do not stop writes: the refusal the OS gives a normal user
    is raised where the run directory is created."""
    out = tmp_path / "locked" / "run"
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **k):
        if str(self).startswith(str(tmp_path / "locked")):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert main(_args(data_dir, out, 1)) == 1
    err = capsys.readouterr().err
    assert err.strip() == (f"ddl train: error: permission denied: {out} (choose a directory you can write to)")


@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """A directory on a 256 KiB tmpfs (a real ENOSPC) where mounting is allowed; elsewhere the writer of the
    weight files raises what safetensors raises on a full disk (its message, recorded on a full tmpfs)."""
    where = tmp_path / "small_disk"
    where.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], capture_output=True).returncode == 0
    if not mounted:
        import safetensors.torch
        from safetensors import SafetensorError

        def full(*a, **k):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(safetensors.torch, "save_file", full)
    yield where
    if mounted:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_is_one_line_and_leaves_no_partial_checkpoint(full_disk, data_dir, capsys):
    out = full_disk / "run"
    assert main(_args(data_dir, out, 2)) == 1
    err = capsys.readouterr().err
    assert "ddl train: error: no space left on device while writing" in err and "checkpoints/.tmp-step" in err
    assert "Traceback" not in err
    root = out / "checkpoints"
    assert latest_checkpoint(out) is None and not list(root.glob(".tmp-*"))


def test_training_without_a_validation_split(tmp_path, data_dir, make_config):
    """--val-fraction 0 data (no val shards): allowed with eval_every 0, refused with a message otherwise."""
    from deep_delta.data import ByteTokenizer, write_dataset

    docs = [p.read_text() for p in sorted(Path(__file__).parent.glob("*.py"))]
    d = tmp_path / "noval"
    write_dataset(docs, ByteTokenizer(), d, val_fraction=0.0)
    with pytest.raises(ValueError, match="no validation split .*`eval_every` 0"):
        train(make_config(tmp_path / "a", data=d, eval_every=3), progress=False, quiet=True)
    result = train(make_config(tmp_path / "b", data=d, eval_every=0), progress=False, quiet=True)
    assert result.step == 6 and result.val_loss is None
    assert not [r for r in read_metrics(tmp_path / "b") if "val_loss" in r]
    assert json.loads((tmp_path / "b" / "run.json").read_text())["train_config"]["eval_every"] == 0


def test_debug_shows_the_traceback(tmp_path, data_dir, monkeypatch):
    args = _args(data_dir, tmp_path / "run", 1, "--set", "steps=-1")
    assert main(args) == 2
    with pytest.raises(ValueError, match="`steps` got -1"):
        main(["--debug", *args])
    monkeypatch.setenv("DDL_DEBUG", "1")
    with pytest.raises(ValueError, match="`steps` got -1"):
        main(args)


def test_nothing_derived_is_written_inside_a_runs_checkpoints(tmp_path, data_dir, capsys, files_of):
    """`ddl export --out RUN/checkpoints/step_N` (the next rotation deleted it) and an export or file anywhere in
    RUN/checkpoints are refused; `ddl train --overwrite` of a run whose checkpoints/ holds a user's file or export
    is refused naming them, and nothing is removed; a rotation never deletes a step_N that is not a checkpoint."""
    out = tmp_path / "run"
    assert main(_args(data_dir, out, 2, "--save-every", "1", "--keep", "1")) == 0
    for inside in ("checkpoints/step_0000009", "checkpoints/exports/cc", "checkpoints/step_0000002/hf"):
        capsys.readouterr()
        assert main(["export", "--model", str(out), "--out", str(out / inside)]) == 2
        err = capsys.readouterr().err
        assert f"--out got {out / inside}, which is inside {out / 'checkpoints'}" in err, err
        assert not (out / inside).exists()
    assert main(["export", "--model", str(out), "--out", str(tmp_path / "hf")]) == 0
    (out / "checkpoints" / "notes.txt").write_text("mine")
    mine = out / "checkpoints" / "step_0000009"
    shutil.copytree(tmp_path / "hf", mine)  # an export made there before exports were refused
    # a rotation keeps what is not a checkpoint
    assert main(_args(data_dir, out, 4, "--save-every", "1", "--keep", "1", "--resume")) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "LATEST", "notes.txt", "step_0000004", "step_0000009"]
    before = files_of(out)
    capsys.readouterr()
    assert main(_args(data_dir, out, 2, "--overwrite")) == 2
    err = capsys.readouterr().err
    assert "--overwrite would remove" in err and "notes.txt, step_0000009 that training did not write" in err
    assert files_of(out) == before
    (out / "checkpoints" / "notes.txt").unlink()
    shutil.rmtree(mine)
    assert main(_args(data_dir, out, 2, "--overwrite")) == 0
