"""``ddl compare``'s step times (the equal-time columns) time the step the runs trained: built by the one builder,
``deep_delta.train.step.build_step``, with the runs' TrainConfig fields that shape a step (compile, CUDA graphs,
activation checkpointing, the clip, the optimizer's settings). Before issue 50 it dropped ``cuda_graphs`` and
activation checkpointing."""

from __future__ import annotations

import pytest

from deep_delta.experiments import compare
from deep_delta.train import step as step_module
from deep_delta.train.config import TrainConfig


class Built(Exception):
    """Raised by the spy once it has seen the settings (nothing is timed)."""


@pytest.mark.parametrize("settings", [
    dict(activation_checkpointing=True, grad_clip=0.5, lr=3e-3),
    dict(compile=True, cuda_graphs="blocks", betas=(0.8, 0.9), weight_decay=0.0),
], ids=["activation-checkpointing", "cuda-graphs"])
def test_the_timed_step_is_built_with_the_runs_settings(monkeypatch, settings):
    seen = []

    def spy(model, cfg, info=None, *, autocast=None):
        seen.append(cfg)
        raise Built

    monkeypatch.setattr(step_module, "build_step", spy)
    base = TrainConfig(variant="baseline", preset="tiny", device="cpu", batch_size=2, seq_len=16,
                       model={"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2}, **settings)
    with pytest.raises(Built):
        compare.measure_step_times(base, ["baseline"], data_vocab=257, repeats=1)
    (cfg,) = seen
    for name in compare.STEP_FIELDS:
        assert getattr(cfg, name) == getattr(base, name), name
    assert (cfg.batch_size, cfg.seq_len, cfg.device) == (2, 16, "cpu")


def test_the_trainer_and_the_bench_build_the_same_step(monkeypatch):
    """Every step the package trains or times comes from build_step: the trainer's and StepSubject's calls."""
    from deep_delta.eval.step_bench import StepSubject

    calls = []
    real = step_module.build_step

    def spy(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module, "build_step", spy)
    StepSubject("baseline", "tiny", batch_size=1, seq_len=8, overrides={"num_hidden_layers": 1},
                train={"activation_checkpointing": True})
    assert calls[-1].activation_checkpointing is True
