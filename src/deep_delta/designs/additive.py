"""The additive design: the baseline's residual ``x + F(RMSNorm(x))`` around every sublayer, and Peri-LN.

Settings: ``output_norm`` (Peri-LN: a learned RMSNorm on each sublayer's output before the add,
:class:`~deep_delta.layers.output_norm.NormedBranch`; the variant ``peri-ln`` also norms the embedding,
``embed_norm``, a setting of the backbone). The state is the residual stream (B, T, d): no expansion, no readout.
"""

from __future__ import annotations

from torch import nn

from deep_delta.designs.base import ResidualDesign
from deep_delta.designs.probes import StateProbe
from deep_delta.designs.registry import register_design
from deep_delta.layers.additive import AdditiveResidual
from deep_delta.layers.output_norm import NormedBranch


class AdditiveDesign(ResidualDesign):
    name = "additive"
    about = "the pre-norm additive residual x + F(RMSNorm(x)) (the baseline)"
    fields = ("output_norm",)
    probes = (StateProbe,)

    def residual(self, config, branch: nn.Module, sublayer: int) -> nn.Module:
        if config.output_norm:  # Peri-LN: the baseline's residual around the sublayer with a norm on its output
            branch = NormedBranch(branch, config.hidden_size, eps=config.rms_norm_eps)
        # norm_output "autocast": the branches' first ops on c are matmuls (q, k, v; gate, up)
        return AdditiveResidual(config.hidden_size, branch, norm_eps=config.rms_norm_eps, norm_output="autocast")

    def describe(self, config) -> str:
        if config.output_norm:
            return "additive with a norm on each sublayer's output (Peri-LN): x + RMSNorm(F(RMSNorm(x)))"
        return "additive (the baseline): x + F(RMSNorm(x))"


DESIGN = register_design(AdditiveDesign())
