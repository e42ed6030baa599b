"""Deep Delta Learning (arXiv:2601.00417) for PyTorch.

    from deep_delta import DDLConfig, DDLForCausalLM, DeltaResidual, delta_update
"""

from deep_delta.layers import ChannelCompressor, DeltaResidual, StateExpander, TokenConvCompressor
from deep_delta.models import DDLCache, DDLConfig, DDLForCausalLM, DDLModel
from deep_delta.ops import delta_operator, delta_update

__version__ = "0.1.0"

__all__ = [
    "ChannelCompressor",
    "DDLCache",
    "DDLConfig",
    "DDLForCausalLM",
    "DDLModel",
    "DeltaResidual",
    "StateExpander",
    "TokenConvCompressor",
    "delta_operator",
    "delta_update",
]
