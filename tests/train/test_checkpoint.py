"""Atomic checkpoints: layout, pickle-free state, integrity, the run lock, pruning, and crashes mid-write."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from deep_delta.models import DDLConfig, DDLForCausalLM
from deep_delta.train import checkpoint as ckpt
from deep_delta.train import latest_checkpoint, load_checkpoint


@pytest.fixture
def model(tiny_model):
    return DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", vocab_size=64, **tiny_model))


def _save(out, model, step, **kw):
    state = {"step": step, "rng": ckpt.rng_state(), "data": {"epoch": 0, "position": step}}
    return ckpt.save_checkpoint(out, step, save_model=kw.pop("save_model", lambda d: model.save_pretrained(d)),
                                train_state=state, meta={"tokenizer": "byte", "variant": "ddl-cc"}, **kw)


def test_layout_loads_without_pickle_and_from_pretrained(tmp_path, model):
    path = _save(tmp_path, model, 5)
    assert path.name == "step_0000005"
    assert (tmp_path / "checkpoints" / "LATEST").read_text().strip() == "step_0000005"
    assert latest_checkpoint(tmp_path) == path
    loaded = load_checkpoint(path)
    assert loaded["meta"]["step"] == 5 and loaded["meta"]["tokenizer"] == "byte"
    assert loaded["state"]["data"] == {"epoch": 0, "position": 5}
    assert sorted(p.name for p in path.iterdir()) == [
        "checksums.json", "config.json", "generation_config.json", "model.safetensors", "train_meta.json",
        "train_state.json",
        "train_state.safetensors"]
    again = DDLForCausalLM.from_pretrained(path)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_no_checkpoint_yet(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "checkpoints" / "step_0000001")


def test_keeps_the_newest_k(tmp_path, model):
    for s in (1, 2, 3, 4):
        _save(tmp_path, model, s, keep=2)
    assert [p.name for p in ckpt.checkpoint_dirs(tmp_path)] == ["step_0000003", "step_0000004"]


def test_crash_while_writing_files_keeps_the_previous_checkpoint(tmp_path, model):
    good = _save(tmp_path, model, 2)

    def crash_after_weights(d):
        model.save_pretrained(d)  # config.json and model.safetensors are written ...
        raise RuntimeError("simulated crash")  # ... then the process dies before train_state.pt

    with pytest.raises(RuntimeError, match="simulated crash"):
        _save(tmp_path, model, 4, save_model=crash_after_weights)
    assert latest_checkpoint(tmp_path) == good
    assert load_checkpoint(good)["meta"]["step"] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["LATEST", "step_0000002"]


def test_crash_before_latest_is_replaced_keeps_the_previous_checkpoint(tmp_path, model, monkeypatch):
    good = _save(tmp_path, model, 2)

    def die(*a, **k):
        raise OSError("simulated crash before LATEST moved")

    monkeypatch.setattr(ckpt, "write_text_atomic", die)
    with pytest.raises(OSError, match="simulated crash"):
        _save(tmp_path, model, 4)
    assert latest_checkpoint(tmp_path) == good  # the complete step_4 directory is not trusted without LATEST
    DDLForCausalLM.from_pretrained(good)


def test_latest_naming_a_broken_directory_is_an_error(tmp_path, model):
    path = _save(tmp_path, model, 3)
    (path / "train_state.json").unlink()
    with pytest.raises(FileNotFoundError, match="lacks train_state.json"):
        latest_checkpoint(tmp_path)


@pytest.mark.parametrize("planted", ["link outside", "huge", "garbage"])
def test_a_latest_that_training_did_not_write_is_refused_unread(tmp_path, model, planted):
    """LATEST as a symbolic link out of the run (to a secret, say), a huge file or one holding something else is
    refused without its content in the message, or in memory."""
    from deep_delta.train.checkpoint import CheckpointError

    _save(tmp_path, model, 3)
    latest = tmp_path / "checkpoints" / "LATEST"
    secret = tmp_path.parent / f"{tmp_path.name}-secret.txt"
    secret.write_text("password=hunter2\n")
    latest.unlink()
    if planted == "link outside":
        latest.symlink_to(secret)
    elif planted == "huge":
        latest.write_text("step_0000003\n" + "x" * (1 << 20))
    else:
        latest.write_text("password=hunter2\n")
    with pytest.raises(CheckpointError, match=f"^{latest}") as e:
        latest_checkpoint(tmp_path)
    assert "hunter2" not in str(e.value) and "xxxx" not in str(e.value)


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = ckpt.rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    ckpt.set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_optimizer_state_round_trips_without_pickle(tmp_path, monkeypatch):
    """An AdamW state (int keys, tuples, 0-dim and bf16 tensors, None) survives safetensors + JSON exactly."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2, bias=False).to(torch.bfloat16))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.95))
    for _ in range(2):
        sum(p.float().pow(2).sum() for p in net.parameters()).backward()
        opt.step()
    state = {"optimizer": opt.state_dict(), "rng": ckpt.rng_state(), "extra": {"none": None, 3: (1, 2.5)}}
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load must not be called"))
    ckpt.save_state(tmp_path, state)
    back = ckpt.load_state(tmp_path)
    assert back["extra"] == {"none": None, 3: (1, 2.5)}
    a, b = state["optimizer"], back["optimizer"]
    assert a["param_groups"] == b["param_groups"] and isinstance(b["param_groups"][0]["betas"], tuple)
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for name, t in a["state"][k].items():
            assert t.dtype == b["state"][k][name].dtype and torch.equal(t, b["state"][k][name]), (k, name)
    opt.load_state_dict(b)  # the optimizer takes it back


def test_a_planted_pickle_is_refused_and_never_opened(tmp_path, model, monkeypatch):
    path = _save(tmp_path, model, 3)
    for f in ("train_state.json", "train_state.safetensors"):
        (path / f).unlink()
    torch.save({"step": 3}, path / "train_state.pt")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load must not be called"))
    with pytest.raises(ckpt.CheckpointError, match="train_state.pt.*pickles are never opened"):
        latest_checkpoint(tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="train_state.pt"):
        load_checkpoint(path)


def test_a_pickle_beside_the_safetensors_state_is_refused(tmp_path, model, monkeypatch):
    """A complete checkpoint with a pickle planted beside its safetensors state is refused, naming the pickle
    (docs/reliability.md, section 6), not loaded while the pickle is ignored."""
    path = _save(tmp_path, model, 3)
    torch.save({"step": 3}, path / "optimizer.pt")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load must not be called"))
    with pytest.raises(ckpt.CheckpointError, match=r"optimizer.pt: this checkpoint holds a pickle"):
        latest_checkpoint(tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="optimizer.pt"):
        load_checkpoint(path)


@pytest.mark.parametrize("name", ["model.safetensors", "train_state.safetensors"])
def test_a_bit_flip_in_a_weight_file_is_refused_naming_it(tmp_path, model, name):
    path = _save(tmp_path, model, 3)
    data = bytearray((path / name).read_bytes())
    data[len(data) // 2] ^= 0x10
    (path / name).write_bytes(bytes(data))
    with pytest.raises(ckpt.IntegrityError, match=f"{name} does not match its SHA-256"):
        load_checkpoint(path)


def test_a_truncated_weight_file_is_refused_naming_it(tmp_path, model):
    path = _save(tmp_path, model, 3)
    (path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ckpt.IntegrityError, match="model.safetensors has 100 bytes"):
        load_checkpoint(path)


def test_run_lock_refuses_a_second_holder_and_leaves_nothing(tmp_path):
    out = tmp_path / "run"
    with ckpt.run_lock(out, "first"):
        with pytest.raises(ckpt.RunLockedError, match=f"pid {os.getpid()}, first"):
            with ckpt.run_lock(out, "second"):
                pass
    assert not out.exists()  # created by the lock, empty again: removed
    with ckpt.run_lock(out):  # free again
        pass


def test_run_lock_is_released_by_kill_9(tmp_path):
    out = tmp_path / "run"
    code = ("import sys, time; from deep_delta.train.checkpoint import run_lock\n"
            "with run_lock(sys.argv[1], 'child'):\n    print('locked', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(ckpt.RunLockedError, match=f"pid {child.pid}, child"):
            with ckpt.run_lock(out):
                pass
    finally:
        child.kill()
        child.wait()
    with ckpt.run_lock(out, "after"):  # the kernel dropped the dead process's lock; its stale file is reused
        assert (out / ".lock").read_text() == f"pid {os.getpid()}, after"


def test_clean_stale_removes_what_a_killed_writer_left(tmp_path, model):
    _save(tmp_path, model, 2)
    root = tmp_path / "checkpoints"
    (root / ".tmp-step_0000004-999").mkdir()
    (root / ".tmp-step_0000004-999" / "model.safetensors").write_bytes(b"partial")
    (root / ".LATEST.abc123.tmp").write_text("step_0000004")
    removed = ckpt.clean_stale(tmp_path)
    assert sorted(p.name for p in removed) == [".LATEST.abc123.tmp", ".tmp-step_0000004-999"]
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step_0000002"]
