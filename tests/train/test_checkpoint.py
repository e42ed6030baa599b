"""Atomic checkpoints: layout, weights_only loading, pruning, and crashes mid-write."""

from __future__ import annotations

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
    torch.load(path / "train_state.pt", weights_only=True)  # no pickle of code objects
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
    (path / "train_state.pt").unlink()
    with pytest.raises(FileNotFoundError, match="lacks train_state.pt"):
        latest_checkpoint(tmp_path)


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = ckpt.rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    ckpt.set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
