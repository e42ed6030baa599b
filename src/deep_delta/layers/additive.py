"""The plain pre-norm residual: ``x + branch(RMSNorm(x))``, the baseline's update around every sublayer.

It takes the same call as :class:`~deep_delta.layers.delta_residual.DeltaResidual` (``forward(x, *branch_args,
**branch_kwargs)``, the same ``norm_output``), so that swapping one for the other is an A/B comparison with no other
change. The Peri-LN baseline is this residual around a branch with a norm on its output
(:class:`~deep_delta.layers.output_norm.NormedBranch`).
"""

from __future__ import annotations

import torch
from torch import nn

NORM_OUTPUTS = ("module", "autocast")


def branch_dtype(norm_output: str, norm: nn.RMSNorm, src: torch.Tensor) -> torch.dtype | None:
    """The dtype a branch gets its normed input in when it is not the norm weight's, else None: under autocast with
    ``norm_output="autocast"``, the autocast dtype (the branch's first ops are matmuls, which would round to it
    anyway); with ``"module"``, the norm's own."""
    device = src.device.type
    if norm_output == "autocast" and torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        return None if dtype == norm.weight.dtype else dtype
    return None


class AdditiveResidual(nn.Module):
    """Wrap ``branch`` (a module from R^d to R^d) with the additive residual ``x + branch(RMSNorm(x))``.

    Args:
        dim: model width d.
        branch: the sublayer F; it receives the normed input and any extra arguments given to ``forward``.
        norm_eps: the RMSNorm's eps.
        norm_output: "module" (the branch gets the norm's output) or "autocast" (under autocast, in the autocast
            dtype, rounded once after the norm; see :class:`~deep_delta.layers.delta_residual.DeltaResidual`).
    """

    def __init__(self, dim: int, branch: nn.Module, *, norm_eps: float = 1e-5, norm_output: str = "module"):
        super().__init__()
        if norm_output not in NORM_OUTPUTS:
            raise ValueError(f"AdditiveResidual: `norm_output` must be one of {NORM_OUTPUTS}, got {norm_output!r}")
        self.dim, self.norm_output = dim, norm_output
        self.norm = nn.RMSNorm(dim, eps=norm_eps)
        self.branch = branch

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

    def forward(self, x: torch.Tensor, *branch_args, **branch_kwargs) -> torch.Tensor:
        """x: (..., d) -> x + branch(RMSNorm(x)), in x's dtype (a state stored in lower precision is read in the
        norm's dtype)."""
        if x.dim() < 2 or x.shape[-1] != self.dim:
            raise ValueError(f"AdditiveResidual: expected a state of shape (..., {self.dim}), got {tuple(x.shape)}")
        c = self.norm(x.to(self.norm.weight.dtype))
        dtype = branch_dtype(self.norm_output, self.norm, x)
        h = self.branch(c if dtype is None else c.to(dtype), *branch_args, **branch_kwargs)
        return x + h.to(x.dtype)


__all__ = ["AdditiveResidual", "NORM_OUTPUTS", "branch_dtype"]
