"""nn.Modules of DDL: the residual, its gate, the compressors and the state expansion."""

from deep_delta.layers.compressors import (
    ChannelCompressor,
    StateExpander,
    TokenConvCompressor,
    make_compressor,
)
from deep_delta.layers.delta_residual import DeltaResidual
from deep_delta.layers.gate import BetaGate

__all__ = [
    "BetaGate",
    "ChannelCompressor",
    "DeltaResidual",
    "StateExpander",
    "TokenConvCompressor",
    "make_compressor",
]
