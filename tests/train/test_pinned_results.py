"""Results pinned across the refactor that put every run through one trainer and one study framework (issue
41): ``ddl compare``'s training and validation losses at the debug recipe, and a mechanism-task run's results,
for fixed seeds, equal to the last bit to what the code before it (commit f70aa33) gave.

The pins were made on the development machine (x86_64 with AVX512, torch 2.13.0+cpu, one thread). They hold bit
for bit on a machine shown to compute as that one did: one whose probe (tests/helpers.py, ``cpu_probe``: a fixed
fp32 training step through the same kernels, at these runs' shapes) gives the pinning machine's bits. A machine
that picks other CPU kernels (another math-library path, instruction set or release) rounds differently, also
under the same version and ISA label, so there the check is to ``PIN_TOLERANCE`` (1e-5) relative; the assertion
message says which one ran, and pytest's header says which one this session runs.
"""

from __future__ import annotations

import json

import pytest
import torch

import helpers
from deep_delta.cli.main import main
from helpers import same_as_pinned

PINS = {'compare': {'baseline': {'loss': ['0x1.90986e0000000p+2', '0x1.8f67e40000000p+2',
                                   '0x1.8c380e0000000p+2', '0x1.8781580000000p+2',
                                   '0x1.8631480000000p+2', '0x1.8444a00000000p+2'],
                          'val_loss': ['0x1.89977f0000000p+2', '0x1.8622050000000p+2']},
             'ddl-cc': {'loss': ['0x1.8f0a2c0000000p+2', '0x1.8f2e680000000p+2',
                                 '0x1.8cc4fe0000000p+2', '0x1.886dba0000000p+2',
                                 '0x1.88f3b00000000p+2', '0x1.86cb5c0000000p+2'],
                        'val_loss': ['0x1.8afb570000000p+2', '0x1.87f8540000000p+2']},
             'ddl-dv1': {'loss': ['0x1.91ad6c0000000p+2', '0x1.9027880000000p+2',
                                  '0x1.8ca9460000000p+2', '0x1.88936c0000000p+2',
                                  '0x1.897c4c0000000p+2', '0x1.861c1a0000000p+2'],
                         'val_loss': ['0x1.8ceec10000000p+2', '0x1.89b8a40000000p+2']},
             'ddl-tc': {'loss': ['0x1.8f0a2c0000000p+2', '0x1.8f2e060000000p+2',
                                 '0x1.8cc79a0000000p+2', '0x1.8870020000000p+2',
                                 '0x1.88f7c40000000p+2', '0x1.86cd9e0000000p+2'],
                        'val_loss': ['0x1.8afb990000000p+2', '0x1.87f9b80000000p+2']}},
 'task': {'baseline': {'accuracy_curve': [[10, '0x1.70a3d70a3d70ap-3'], [20, '0x1.70a3d70a3d70ap-3'],
                                          [30, '0x1.87ae147ae147bp-3']],
                       'correct': 304,
                       'loss_curve': [[5, '0x1.d4aca33333333p+2'], [10, '0x1.d173bf3333333p+2'],
                                      [15, '0x1.89dda73333333p+2'], [20, '0x1.3b21100000000p+2'],
                                      [25, '0x1.a3f6cc6666666p+1'], [30, '0x1.317b7f3333333p+1']],
                       'test_loss': '0x1.0da0b60000000p+1',
                       'total': 1600,
                       'validation': ['0x1.c51eb851eb852p-3', '0x1.110b3a0000000p+1']},
          'ddl-dv1': {'accuracy_curve': [[10, '0x1.7333333333333p-3'], [20, '0x1.b333333333333p-3'],
                                         [30, '0x1.a147ae147ae14p-3']],
                      'correct': 337,
                      'loss_curve': [[5, '0x1.c042813333333p+1'], [10, '0x1.90fd36ccccccdp+1'],
                                     [15, '0x1.1ee40e0000000p+1'], [20, '0x1.e80404ccccccdp+0'],
                                     [25, '0x1.bb6f300000000p+0'], [30, '0x1.a54382ccccccdp+0']],
                      'test_loss': '0x1.a4730a0000000p+0',
                      'total': 1600,
                      'validation': ['0x1.d70a3d70a3d71p-3', '0x1.a37cdc0000000p+0']}}}


def _same(got: float, pinned_hex: str, what: str) -> None:
    same_as_pinned(got, float.fromhex(pinned_hex), what)


@pytest.fixture()
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_compare_losses_at_the_debug_recipe_are_pinned(tmp_path, data_dir, one_thread):
    out = tmp_path / "cmp"
    # validated on the first windows of the split, as the pins were made (the default now spreads them over it)
    assert main(["compare", "--config", "debug", "--data", str(data_dir), "--out", str(out), "--time-repeats", "0",
                 "--eval-windows", "first", "--threads", "1", "--no-progress"]) == 0
    for variant, pinned in PINS["compare"].items():
        records = [json.loads(line) for line in (out / variant / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in records if "loss" in r]
        vals = [r["val_loss"] for r in records if "val_loss" in r]
        assert (len(losses), len(vals)) == (len(pinned["loss"]), len(pinned["val_loss"]))
        for i, (got, want) in enumerate(zip(losses, pinned["loss"])):
            _same(got, want, f"{variant} training loss at step {i + 1}")
        for i, (got, want) in enumerate(zip(vals, pinned["val_loss"])):
            _same(got, want, f"{variant} validation loss {i + 1}")


def test_a_task_run_is_pinned(tmp_path, one_thread):
    out = tmp_path / "task"
    assert main(["tasks", "run", "shell-game", "--variants", "baseline", "ddl-dv1", "--seeds", "1", "--steps", "30",
                 "--threads", "1", "--no-progress", "--set", "eval_every=10", "--set", "log_every=5", "--set",
                 "test_size=200", "--set", "eval_size=100", "--set", "model.hidden_size=32", "--set",
                 "model.num_hidden_layers=1", "--set", "model.num_attention_heads=2", "--out", str(out)]) == 0
    for variant, pinned in PINS["task"].items():
        r = json.loads((out / f"{variant}-seed0.json").read_text())
        assert (r["accuracy"]["correct"], r["accuracy"]["total"]) == (pinned["correct"], pinned["total"])
        _same(r["test_loss"], pinned["test_loss"], f"{variant} test loss")
        _same(r["validation"]["overall"], pinned["validation"][0], f"{variant} validation accuracy")
        _same(r["validation"]["loss"], pinned["validation"][1], f"{variant} validation loss")
        assert [s for s, _ in r["loss_curve"]] == [s for s, _ in pinned["loss_curve"]]
        for (step, got), (_, want) in zip(r["loss_curve"], pinned["loss_curve"]):
            _same(got, want, f"{variant} training loss of the window ending at step {step}")
        assert [s for s, _ in r["accuracy_curve"]] == [s for s, _ in pinned["accuracy_curve"]]
        for (step, got), (_, want) in zip(r["accuracy_curve"], pinned["accuracy_curve"]):
            _same(got, want, f"{variant} accuracy at step {step}")


def test_a_machine_that_rounds_differently_checks_the_pins_to_the_tolerance(monkeypatch):
    """Issue 66: a CPU that reports the same torch version and ISA as the pinning machine but rounds ~1e-7
    relative differently (its loss 6.240715503692627 against the pinned 6.240715980529785). Under the pinning
    machine's probe that is a failure (bit for bit); under any other probe the same pin passes to 1e-5 relative,
    and a difference beyond the tolerance still fails."""
    pinned, other = 6.240715980529785, 6.240715503692627
    monkeypatch.setattr(helpers, "cpu_probe", lambda: helpers.PINNING_PROBE)  # computes as the pinning machine
    same_as_pinned(pinned, pinned, "the pin itself")
    with pytest.raises(AssertionError, match=r"loss: 6\.240715503692627 != pinned 6\.240715980529785 \(bit for bit"):
        same_as_pinned(other, pinned, "loss")
    monkeypatch.setattr(helpers, "cpu_probe", lambda: "0" * 16)  # a probe one bit away would do as well
    same_as_pinned(other, pinned, "loss")
    same_as_pinned(pinned * (1 + 9e-6), pinned, "loss")
    with pytest.raises(AssertionError, match=r"to 1e-05 relative: this machine's probe 0{16} is not the pinning"):
        same_as_pinned(pinned * (1 + 2e-5), pinned, "loss")


def test_the_probe_is_a_pure_function_of_the_machine():
    """The probe gives the same bits on every call (so a machine matches or not once and for all), on one thread
    whatever the session's setting, and leaves PyTorch's thread count and random state as they were."""
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    torch.set_num_threads(2)
    try:
        again = helpers.cpu_probe.__wrapped__()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert again == helpers.cpu_probe() and len(again) == 16
    assert torch.equal(torch.get_rng_state(), rng)
