"""The training setting ``activation_checkpointing``: the Trainer checkpoints every block, the run trains and its
losses equal those of the same run without checkpointing; a resumed run may switch it."""

from __future__ import annotations

import numpy as np
import pytest

from deep_delta.train import TrainConfig, train
from deep_delta.train import trainer as trainer_mod
from deep_delta.train.metrics import read_metrics
from helpers import DEBUG_MODEL


def _losses(out):
    return [r["loss"] for r in read_metrics(out) if "loss" in r]


def test_a_checkpointed_run_trains_like_the_plain_run(tmp_path, make_config, monkeypatch):
    enabled = []
    setup = trainer_mod.Trainer.setup

    def spy(self):
        setup(self)
        enabled.append(all(block.gradient_checkpointing for block in self.model.model.layers))

    monkeypatch.setattr(trainer_mod.Trainer, "setup", spy)
    kw = dict(steps=4, eval_every=0, save_every=0, log_every=1)
    plain = make_config(tmp_path / "plain", **kw)
    ckpt = make_config(tmp_path / "ckpt", activation_checkpointing=True, **kw)
    train(plain, progress=False, quiet=True)
    train(ckpt, progress=False, quiet=True)
    assert enabled == [False, True]
    la, lb = _losses(plain.out), _losses(ckpt.out)
    assert len(la) == 4 and la[-1] < la[0]
    np.testing.assert_allclose(lb, la, rtol=1e-5)


def test_resume_may_switch_activation_checkpointing(tmp_path, make_config):
    train(make_config(tmp_path / "run", steps=2, eval_every=0, save_every=2), progress=False, quiet=True)
    train(make_config(tmp_path / "run", steps=4, eval_every=0, save_every=2, activation_checkpointing=True),
          resume=True, progress=False, quiet=True)
    assert len(_losses(tmp_path / "run")) > 0


def test_the_setting_is_checked():
    assert TrainConfig().activation_checkpointing is False
    with pytest.raises(ValueError, match="`activation_checkpointing` got 'yes'"):
        TrainConfig(activation_checkpointing="yes")


def test_fsdp_with_activation_checkpointing_matches_one_plain_process(tmp_path, data_dir):
    """torchrun, 2 CPU processes, FSDP2 (each block a unit, checkpointed inside its hooks) = 1 plain process."""
    import os
    import subprocess
    import sys

    model = dict(DEBUG_MODEL)
    single = TrainConfig(variant="ddl-cc", model=model, data=str(data_dir), out=str(tmp_path / "single"), steps=3,
                         batch_size=4, seq_len=32, warmup_steps=1, eval_every=0, log_every=0, device="cpu")
    train(single, progress=False, quiet=True)
    out = tmp_path / "fsdp"
    sets = [a for k, v in model.items() for a in ("--set", f"model.{k}={v}")]
    args = ["train", "--variant", "ddl-cc", "--data", str(data_dir), "--out", str(out), "--steps", "3",
            "--batch-size", "2", "--seq-len", "32", "--warmup-steps", "1", "--eval-every", "0", "--device", "cpu",
            "--distributed", "fsdp", "--no-progress", "--log-every", "0", "--set", "activation_checkpointing=true",
            *sets]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "deep_delta.cli.main", *args], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_allclose(_losses(out), _losses(single.out), rtol=1e-5)
