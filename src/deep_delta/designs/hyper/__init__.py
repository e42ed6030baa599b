"""The hyper design: Hyper-Connections (HC, Zhu et al., arXiv 2409.19606) and manifold-constrained HC (mHC, Xie et
al., arXiv 2512.24880), the rivals that widen the residual stream into n streams instead of rewriting it.

The state is (B, T, d, n): the embedding copied to n streams (:class:`~deep_delta.layers.compressors.StateExpander`,
"repeat"), each sublayer reading a mix of the streams and writing its output back into each
(:class:`~deep_delta.layers.hyper_connections.HyperResidual`), the streams read out as their mean before the final
norm (:class:`~deep_delta.layers.hyper_connections.StreamReadout`).

Settings (flat fields of :class:`~deep_delta.models.ddl.configuration_ddl.DDLConfig`): hc_streams (n, default 4),
hc_kind ("hc" | "mhc", n >= 2), hc_dynamic (token-dependent coefficients, the papers' default), hc_sinkhorn_iters
(mHC's Sinkhorn-Knopp rounds, 20 in the paper). The streams are stored in the embeddings' dtype (``state_dtype``
"auto" only).
"""

from __future__ import annotations

import math

from torch import nn

from deep_delta.designs.base import ResidualDesign, mup_readout_init_
from deep_delta.designs.hyper.probe import HyperProbe
from deep_delta.designs.registry import register_design
from deep_delta.layers.compressors import StateExpander
from deep_delta.layers.hyper_connections import HYPER_KINDS, HyperResidual, StreamReadout

# a hyper-connection's readouts from the width to a fixed number of coefficients (HC's per-stream dynamic_proj,
# d -> n + 2; mHC's phi, n d -> 2n + n^2): like DDL's gate and value projections they train at lr / m and start at
# zero under muP (docs/mup.md); the static forms have none
READOUTS = ("dynamic_proj", "phi")


def _bad(field: str, got, allowed: str) -> ValueError:
    return ValueError(f"DDLConfig: `{field}` got {got!r}; allowed: {allowed}")


class HyperDesign(ResidualDesign):
    name = "hyper"
    about = "hyper-connections: n residual streams mixed around each sublayer (HC / mHC)"
    fields = ("hc_streams", "hc_kind", "hc_dynamic", "hc_sinkhorn_iters")
    probes = (HyperProbe,)

    def check(self, config) -> None:
        if config.hc_kind not in HYPER_KINDS:
            raise _bad("hc_kind", config.hc_kind, " | ".join(HYPER_KINDS))
        least = 2 if config.hc_kind == "mhc" else 1
        if config.hc_streams < least:
            raise _bad("hc_streams", config.hc_streams, f"an integer >= {least} for hc_kind={config.hc_kind!r}")
        if config.hc_sinkhorn_iters < 1:
            raise _bad("hc_sinkhorn_iters", config.hc_sinkhorn_iters, "an integer >= 1")
        if config.state_dtype != "auto":
            raise _bad("state_dtype", config.state_dtype, "'auto' with residual='hyper' (its streams are stored in the "
                       "embeddings' dtype)")

    def expander(self, config) -> nn.Module:
        return StateExpander(config.hidden_size, config.hc_streams, "repeat")  # n copies of the embedding

    def residual(self, config, branch: nn.Module, sublayer: int) -> nn.Module:
        return HyperResidual(
            config.hidden_size, branch, streams=config.hc_streams, kind=config.hc_kind, dynamic=config.hc_dynamic,
            sublayer=sublayer, norm_eps=config.rms_norm_eps, sinkhorn_iters=config.hc_sinkhorn_iters,
            backend=config.delta_backend,
        )

    def readout(self, config) -> nn.Module:
        return StreamReadout(config.hidden_size, config.hc_streams)

    def init_module(self, module: nn.Module, config, std: float) -> bool:
        if isinstance(module, HyperResidual):  # HC draws nothing; mHC's phi over its fan-in n*d
            module.reset_parameters(config.hidden_init_scale / math.sqrt(module.streams * config.hidden_size))
            for weight in self.mup_readouts(module).values():
                mup_readout_init_(weight, config)
        elif isinstance(module, StateExpander):
            module.reset_parameters()
        else:
            return False
        return True

    def mup_readouts(self, module: nn.Module) -> dict[str, nn.Parameter]:
        if not isinstance(module, HyperResidual):
            return {}
        return {name: p for name, p in module.named_parameters(recurse=False) if name in READOUTS}

    def describe(self, config) -> str:
        form = "dynamic" if config.hc_dynamic else "static"
        return f"hyper ({config.hc_kind.upper()}, {config.hc_streams} streams, {form} coefficients)"

    def state_width(self, config) -> int:
        return config.hidden_size * config.hc_streams

    def info_fields(self, config) -> list[str]:
        return ["hc_kind", "hc_dynamic", "hc_streams", "hc_sinkhorn_iters"]


DESIGN = register_design(HyperDesign())
