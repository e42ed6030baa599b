"""The README example for a researcher: DeltaResidual around their own sublayer, then a training step.

``README_EXAMPLE`` is the exact code shown in the README; the test runs that text, then checks it.
"""

from __future__ import annotations

import torch

from deep_delta.models import count_parameters

README_EXAMPLE = '''
import torch
from torch import nn
from deep_delta import DeltaResidual

class MyMLP(nn.Module):                       # your sublayer: (..., d) -> (..., d)
    def __init__(self, d):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, c):
        return self.net(c)

class Net(nn.Module):
    def __init__(self, d=64, depth=4, ddl=True):
        super().__init__()
        # x <- x + beta k (v - k^T x) with k = MyMLP(RMSNorm(x)); ddl=False: x <- x + MyMLP(RMSNorm(x))
        self.blocks = nn.ModuleList(DeltaResidual(d, MyMLP(d), additive=not ddl) for _ in range(depth))
        self.head = nn.Linear(d, 1)

    def forward(self, x):                     # x: (batch, d)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(32, 64), torch.randn(32, 1)
loss = nn.functional.mse_loss(model(x), y)
loss.backward()
opt.step()
opt.zero_grad()

# expanded state (d_v = 4): the state is (batch, d, 4); x_in defaults to the mean over the 4 channels
block = DeltaResidual(64, MyMLP(64), value_channels=4)
X = block(x.unsqueeze(-1).repeat(1, 1, 4))    # (32, 64, 4)
'''


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
