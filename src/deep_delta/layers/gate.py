"""The gate beta in (0, beta_max): eq. 2.7 (single linear) or A.2 (tanh MLP), with fp32 logits.

The paper's range is beta_max = 2 (up to a full reflection); beta_max = 1 stops at the projection (no
reflection), the gate-range ablation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

GATE_KINDS = ("linear", "mlp")


def gate_bias_for(beta_init: float, beta_max: float = 2.0) -> float:
    """Logit that makes ``beta_max * sigmoid(logit) == beta_init``."""
    if not beta_max > 0.0:
        raise ValueError(f"beta_max must be > 0, got {beta_max}")
    if not 0.0 < beta_init < beta_max:
        raise ValueError(f"beta_init must lie in the open interval (0, beta_max={beta_max:g}), got {beta_init}")
    p = beta_init / beta_max
    return math.log(p / (1.0 - p))


class BetaGate(nn.Module):
    """``beta = beta_max sigmoid(w^T c + b)`` (kind="linear") or ``beta_max sigmoid(w^T tanh(W c) + b)`` ("mlp").

    c: (..., d) -> beta: (..., outputs) in fp32. The bias starts at logit(beta_init / beta_max); beta_max = 2 is
    the paper's gate. ``outputs`` > 1: that many gates from projections of their own (the untied erase and write
    gates: ``outputs=2``), every one starting as a copy of the first, so that the gates start equal and the
    initialisation draws the random numbers of the one-gate module (a model's other weights at a seed stay those
    of its tied variant).
    """

    def __init__(self, dim: int, kind: str = "linear", hidden_size: int | None = None, beta_init: float = 1.0,
                 beta_max: float = 2.0, outputs: int = 1):
        super().__init__()
        if kind not in GATE_KINDS:
            raise ValueError(f"BetaGate: `kind` must be one of {GATE_KINDS}, got {kind!r}")
        if outputs < 1:
            raise ValueError(f"BetaGate: `outputs` got {outputs}; allowed: an integer >= 1")
        self.kind, self.outputs = kind, outputs
        self.beta_init, self.beta_max = beta_init, float(beta_max)
        self.bias_init = gate_bias_for(beta_init, beta_max)
        if kind == "mlp":
            hidden_size = hidden_size or max(dim // 4, 1)
            self.hidden = nn.Linear(dim, hidden_size, bias=False)
        else:
            self.hidden = None
        fan_in = hidden_size if kind == "mlp" else dim
        self.proj = nn.Linear(fan_in, 1, bias=True)  # constructed as the one-gate module is: the same draws
        if outputs > 1:  # widened without drawing anything (reset_parameters fills every gate)
            self.proj.weight = nn.Parameter(torch.empty(outputs, fan_in))
            self.proj.bias = nn.Parameter(torch.empty(outputs))
            self.proj.out_features = outputs
        self.reset_parameters()

    def reset_parameters(self, std: float | None = None) -> None:
        fan_in = self.proj.in_features if self.hidden is None else self.hidden.in_features
        std = std if std is not None else 0.5 / math.sqrt(fan_in)
        if self.hidden is not None:
            nn.init.normal_(self.hidden.weight, std=std)
        if self.outputs == 1:
            nn.init.normal_(self.proj.weight, std=std)
        elif not getattr(self.proj.weight, "_is_hf_initialized", False):  # not a weight transformers has loaded
            with torch.no_grad():  # the one-gate module's draw, copied to the other gates
                nn.init.normal_(self.proj.weight[:1], std=std)
                self.proj.weight[1:].copy_(self.proj.weight[:1].expand_as(self.proj.weight[1:]))
        nn.init.constant_(self.proj.bias, self.bias_init)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=c.device.type, enabled=False):
            ct = torch.promote_types(c.dtype, torch.float32)  # fp32 logits; fp64 stays fp64 (gradcheck)
            h = c.to(ct)
            if self.hidden is not None:
                h = torch.tanh(F.linear(h, self.hidden.weight.to(ct)))
            logit = F.linear(h, self.proj.weight.to(ct), self.proj.bias.to(ct))
            return self.beta_max * torch.sigmoid(logit)
