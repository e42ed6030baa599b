"""What the one trainer gives every run, ``ddl train`` included: batches of its own, a model built by the caller,
an evaluation callback, callbacks around the steps, a run kept in memory, and a divergence as a result."""

from __future__ import annotations

import json
import math

import pytest
import torch

from deep_delta.cli.main import main
from deep_delta.train import latest_checkpoint
from deep_delta.train.data import BatchList
from deep_delta.train.metrics import read_metrics
from deep_delta.train.trainer import NonFiniteLossError, Trainer
from helpers import tiny_model


class Poison:
    """A forward hook that turns the logits into NaN from the ``at``-th training forward on."""

    def __init__(self, model, at: int):
        self.calls, self.at = 0, at
        model.lm_head.register_forward_hook(self)

    def __call__(self, module, args, output):
        if module.training:
            self.calls += 1
            if self.calls >= self.at:
                return output * float("nan")
        return output


def test_on_divergence_stop_ends_the_run_at_its_last_good_step(tmp_path, make_config):
    """The third step's loss is NaN: with "stop" the update is not applied, the run ends at step 2, validated and
    checkpointed there, and the result says why; with "raise" (the default) it is the error it always was."""
    cfg = make_config(tmp_path / "run", steps=6, on_divergence="stop", eval_every=0, save_every=0)
    model = tiny_model("ddl-cc", vocab_size=320, max_position_embeddings=64).train()
    Poison(model, at=3)
    result = Trainer(cfg, model=model, progress=False, quiet=True).run()
    assert result.step == 2 and result.diverged.startswith("non-finite loss (loss nan") and "at step 3" in result.diverged
    assert latest_checkpoint(tmp_path / "run").name == "step_0000002"
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records if "loss" in r] == [1, 2]
    assert [r["step"] for r in records if "val_loss" in r] == [2]
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the poisoned step changed nothing
    model2 = tiny_model("ddl-cc", vocab_size=320, max_position_embeddings=64).train()
    Poison(model2, at=3)
    with pytest.raises(NonFiniteLossError, match="non-finite loss .* at step 3; training stopped"):
        Trainer(make_config(tmp_path / "raise", steps=6), model=model2, progress=False, quiet=True).run()


def test_ddl_train_reports_a_stopped_divergence(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    assert main(["train", "--config", "debug", "--variant", "ddl-cc", "--data", str(data_dir), "--out", str(out),
                 "--device", "cpu", "--no-progress", "--on-divergence", "stop", "--lr", "1e9", "--grad-clip", "0",
                 "--warmup-steps", "0", "--steps", "20"]) == 0
    err = capsys.readouterr().err
    assert "ddl train: the run diverged (non-finite" in err and "(--on-divergence stop)" in err
    run = json.loads((out / "run.json").read_text())
    assert run["train_config"]["on_divergence"] == "stop"


def test_a_run_kept_in_memory_writes_nothing(tmp_path, make_config, files_of):
    """``persist=False``: no run directory, lock, metrics file or checkpoint; every record in ``records``; a
    resume of such a run is refused."""
    out = tmp_path / "run"
    before = files_of(tmp_path)
    trainer = Trainer(make_config(out, steps=4, eval_every=2), persist=False, progress=False, quiet=True)
    result = trainer.run()
    assert not out.exists() and files_of(tmp_path) == before
    assert [r["step"] for r in trainer.records if "loss" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in trainer.records if "val_loss" in r] == [2, 4]
    assert result.checkpoint is None and result.val_loss == trainer.records[-1]["val_loss"]
    with pytest.raises(ValueError, match="`resume` got true with `persist` false"):
        Trainer(make_config(out), persist=False, resume=True)


def test_batches_evaluate_and_callbacks(tmp_path):
    """A run on batches of its own (no data directory resolved), a caller's model, an evaluation callback at the
    evaluation cadence and callbacks before the first step and after each: called in that order."""
    from deep_delta.train.config import TrainConfig

    g = torch.Generator().manual_seed(0)
    batches = [(x[:, :-1], x[:, 1:]) for x in (torch.randint(0, 256, (2, 17), generator=g) for _ in range(4))]
    model = tiny_model("baseline", vocab_size=320, max_position_embeddings=64)
    calls = []

    class Spy:
        def on_train_start(self, trainer):
            calls.append(("start", trainer.step))

        def on_step_end(self, trainer, record):
            calls.append(("step", record["step"]))

    cfg = TrainConfig(variant="baseline", out=str(tmp_path / "unused"), steps=4, batch_size=2, seq_len=16,
                      eval_every=2, save_every=0, warmup_steps=0, device="cpu", dtype="float32")
    trainer = Trainer(cfg, model=model, batches=BatchList(batches), persist=False, progress=False, quiet=True,
                      callbacks=[Spy()], evaluate=lambda m: calls.append(("eval", m.training)) or {"answer": 42.0})
    result = trainer.run()
    assert calls == [("start", 0), ("step", 1), ("eval", True), ("step", 2), ("step", 3), ("eval", True), ("step", 4)]
    assert result.evaluation == {"answer": 42.0} and result.val_loss is None
    assert [r["answer"] for r in trainer.records if "answer" in r] == [42.0, 42.0]
    with pytest.raises(IndexError, match="all 0 batches were drawn"):
        BatchList([]).next_batch()
    with pytest.raises(ValueError, match="`batches` without `model` or `data`"):
        Trainer(cfg, batches=BatchList(batches))
    with pytest.raises(ValueError, match="no validation data and no `evaluate` but `eval_every` is 2"):
        Trainer(cfg, model=model, batches=BatchList(batches), persist=False)


class RuinTheUpdate:
    """A callback whose ``at``-th update ruins the model, on every machine alike, while that step's own loss was
    finite. ``how="forward"``: the weights stay finite but from that update on every forward gives NaN logits
    (a hook on the LM head), so only the validation loss shows it; ``how="weights"``: the update's gradients are
    NaN, so AdamW writes NaN weights. (lr 1e10 did the first on one CPU and left finite losses on another:
    issue 66.)"""

    def __init__(self, how: str, at: int = 1):
        self.how, self.at, self.ruined = how, at, False

    def on_train_start(self, trainer):
        trainer.model.lm_head.register_forward_hook(
            lambda module, args, output: output * float("nan") if self.ruined else output)

    def on_before_update(self, trainer):
        if trainer.step + 1 != self.at:  # the step being taken is trainer.step + 1
            return
        if self.how == "forward":
            self.ruined = True
        else:
            for p in trainer.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))


@pytest.mark.parametrize("how", ["forward", "weights"])
@pytest.mark.parametrize("save_every", [3, 1])
def test_on_divergence_stop_never_passes_off_ruined_weights_as_good(tmp_path, data_dir, capsys, monkeypatch,
                                                                    save_every, how):
    """The first update ruins the weights while its own loss was finite (:class:`RuinTheUpdate`, into the trainer
    ``ddl train`` builds), and the second step's loss is NaN. "stop" used to checkpoint step 1 as the last good
    step, a checkpoint that validates to NaN. Now the step-1 weights are not checkpointed (save every 3) or,
    where the step's own checkpoint already holds them (save every step), the lines say so; a checkpoint kept as
    good validates to a finite loss. Both ways of ruin: finite weights that validate to NaN (only the validation
    loss can tell) and non-finite weights."""
    import deep_delta.train.trainer as trainer_module

    class Ruined(trainer_module.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, callbacks=[RuinTheUpdate(how)], **kwargs)

    monkeypatch.setattr(trainer_module, "Trainer", Ruined)
    out = tmp_path / "run"
    assert main(["train", "--config", "debug", "--variant", "ddl-cc", "--data", str(data_dir), "--out", str(out),
                 "--device", "cpu", "--no-progress", "--on-divergence", "stop", "--steps", "6",
                 "--save-every", str(save_every)]) == 0
    records = read_metrics(out)
    # the case as built: step 1's loss finite, its weights validating to a non-finite loss, step 2's loss NaN
    assert [r["step"] for r in records if "loss" in r] == [1] and math.isfinite(records[0]["loss"])
    vals = [r["val_loss"] for r in records if "val_loss" in r]
    assert vals and not math.isfinite(vals[-1]), vals
    err = capsys.readouterr().err
    assert "(non-finite loss (loss nan" in err and "at step 2) and stopped at step 1" in err, err
    assert "the weights of step 1 are not good" in err, err
    kept = latest_checkpoint(out)
    if save_every == 1:
        assert kept.name == "step_0000001" and f"its checkpoint {kept} holds them; do not resume or use it" in err
    else:
        assert kept is None and "not checkpointed; the last checkpoint is none" in err
