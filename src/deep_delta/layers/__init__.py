"""nn.Modules of DDL: the residual, its gate, the compressors and the state expansion; the additive baseline's
residual; the rivals: HC / mHC, Attention Residuals, and the output norm of the Peri-LN baseline."""

from deep_delta.layers.additive import AdditiveResidual
from deep_delta.layers.attention_residuals import AttnResidual, DepthReadout, DepthSources, block_starts
from deep_delta.layers.compressors import (
    ChannelCompressor,
    StateExpander,
    TokenConvCompressor,
    make_compressor,
)
from deep_delta.layers.delta_residual import DeltaResidual
from deep_delta.layers.gate import BetaGate
from deep_delta.layers.hyper_connections import HyperResidual, StreamReadout
from deep_delta.layers.output_norm import NormedBranch

__all__ = [
    "AdditiveResidual",
    "AttnResidual",
    "BetaGate",
    "ChannelCompressor",
    "DeltaResidual",
    "DepthReadout",
    "DepthSources",
    "HyperResidual",
    "NormedBranch",
    "StateExpander",
    "StreamReadout",
    "TokenConvCompressor",
    "block_starts",
    "make_compressor",
]
