"""The README example for a researcher: DeltaResidual around their own sublayer, then a training step.

``README_EXAMPLE`` is the README's first Python block, read from README.md (no copy to drift from it); the test
runs that text, then checks what it computes (tests/test_readme_code.py runs every block of the README).
"""

from __future__ import annotations

import torch

from deep_delta.models import count_parameters
from helpers import readme_python_blocks

README_EXAMPLE = readme_python_blocks()[0][1]  # the README's first Python block, as it is there


def run_example() -> dict:
    namespace: dict = {}
    exec(compile(README_EXAMPLE, "README_EXAMPLE", "exec"), namespace)
    return namespace


def test_readme_example_runs_and_trains():
    torch.manual_seed(0)
    ns = run_example()
    model, x, y, loss = ns["model"], ns["x"], ns["y"], ns["loss"]
    assert torch.isfinite(loss)
    assert ns["X"].shape == (32, 64, 4) and bool(torch.isfinite(ns["X"]).all())
    # more steps on the same batch: every parameter (gates and value maps included) gets a finite
    # gradient, and the loss goes down
    opt = ns["opt"]
    losses = []
    for _ in range(10):
        step_loss = torch.nn.functional.mse_loss(model(x), y)
        step_loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
        opt.step()
        opt.zero_grad()
        losses.append(float(step_loss))
    assert losses[-1] < 0.8 * losses[0], losses


def test_readme_example_ab_switch_keeps_the_interface():
    torch.manual_seed(0)
    ns = run_example()
    Net = ns["Net"]
    ddl, additive = Net(ddl=True), Net(ddl=False)
    x = torch.randn(8, 64)
    assert ddl(x).shape == additive(x).shape == (8, 1)
    n_ddl, n_add = count_parameters(ddl), count_parameters(additive)
    # per block DDL adds the gate (d + 1) and the value map (d + 1)
    assert n_ddl - n_add == 4 * 2 * (64 + 1)
    # the additive switch is exactly x + F(RMSNorm(x)) per block
    block = additive.blocks[0]
    assert torch.equal(block(x), x + block.branch(block.norm(x)))
