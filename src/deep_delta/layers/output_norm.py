"""A sublayer with a norm on its output: the branch of the Peri-LN baseline (``x + RMSNorm(F(RMSNorm(x)))``).

The bounded branch a practitioner reaches for before any new residual: OLMo 2 and Gemma 2 / 3 put a learned
RMSNorm on each sublayer's output before the add (Gemma keeps the input norm too, "sandwich" or Peri-LN, as here).
Wrapped around a sublayer inside the additive residual (:class:`~deep_delta.layers.additive.AdditiveResidual`), nothing else of the
baseline changes.
"""

from __future__ import annotations

import torch
from torch import nn


class NormedBranch(nn.Module):
    """``norm(inner(c, ...))``: ``inner`` (a module from R^d to R^d) with a learned RMSNorm on its output (gain 1 at
    init). Extra arguments pass to ``inner``."""

    def __init__(self, inner: nn.Module, dim: int, eps: float = 1e-5):
        super().__init__()
        self.inner = inner
        self.norm = nn.RMSNorm(dim, eps=eps)

    def forward(self, c: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.norm(self.inner(c, *args, **kwargs))
