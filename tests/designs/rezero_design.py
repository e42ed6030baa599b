"""A residual design of a user's own, from outside the package: ReZero (Bachlechner et al., 2020, "ReZero is All You
Need"), ``x <- x + alpha F(x)`` around every sublayer, with no norm, and a learned scalar ``alpha`` per sublayer that
starts at ``alpha_init`` (0 in the paper: every block starts as the identity).

Nothing under ``src/`` knows this file. A model names it by ``design_module`` (this file's path, or an import path
when it is installed), and its variant by name:

    ddl train --variant rezero --set model.design_module=tests/designs/rezero_design.py ...

Its settings (``alpha_init``) live in the config's ``design_settings`` mapping:
``--set 'model.design_settings={alpha_init: 0.1}'``. docs/designs.md walks through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init

from deep_delta.designs import Probe, ResidualDesign, register_design


@dataclass(frozen=True)
class ReZeroSettings:
    """The design's settings: ``alpha_init``, every sublayer's alpha at initialisation (a float >= 0)."""

    alpha_init: float = 0.0

    def __post_init__(self):
        if isinstance(self.alpha_init, bool) or not isinstance(self.alpha_init, (int, float)) or self.alpha_init < 0:
            raise ValueError(f"ReZeroSettings: `alpha_init` got {self.alpha_init!r}; allowed: a float >= 0")


class ReZeroResidual(nn.Module):
    """``x + alpha * branch(x)``: the sublayer reads the state as it is (no norm) and its output is scaled by a learned
    scalar."""

    def __init__(self, dim: int, branch: nn.Module, alpha_init: float):
        super().__init__()
        self.dim, self.alpha_init = dim, alpha_init
        self.branch = branch
        self.alpha = nn.Parameter(torch.full((), float(alpha_init)))

    def forward(self, x: torch.Tensor, *branch_args, **branch_kwargs) -> torch.Tensor:
        return x + self.alpha * self.branch(x, *branch_args, **branch_kwargs).to(x.dtype)


class AlphaProbe(Probe):
    """What ``ddl analyze`` reports of it: each sublayer's alpha."""

    name, watched = "rezero", ReZeroResidual

    def sections(self):
        return {"rezero": {name: float(m.alpha) for name, m in self.modules}}

    @staticmethod
    def format(report):
        lines = ["| sublayer | alpha |", "| --- | ---: |"]
        return "\n".join(lines + [f"| {name} | {alpha:.4f} |" for name, alpha in report["rezero"].items()])

    @staticmethod
    def plot(report, out):
        return []


class ReZeroDesign(ResidualDesign):
    name = "rezero"
    about = "ReZero: x + alpha F(x) with a learned scalar alpha per sublayer and no norm"
    settings = ReZeroSettings
    probes = (AlphaProbe,)

    def residual(self, config, branch: nn.Module, sublayer: int) -> nn.Module:
        return ReZeroResidual(config.hidden_size, branch, self.design_settings(config).alpha_init)

    def init_module(self, module: nn.Module, config, std: float) -> bool:
        if isinstance(module, ReZeroResidual):
            init.constant_(module.alpha, module.alpha_init)  # leaves an alpha loaded from a checkpoint alone
            return True
        return False

    def describe(self, config) -> str:
        return f"ReZero (x + alpha F(x), alpha from {self.design_settings(config).alpha_init:g})"


DESIGN = register_design(ReZeroDesign(), variants={"rezero": {}}, paper_names={"rezero": "ReZero"})
