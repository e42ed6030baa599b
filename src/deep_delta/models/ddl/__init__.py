from deep_delta.models.ddl.configuration_ddl import (
    DEFAULT_VARIANTS,
    PAPER_NAMES,
    PRESETS,
    VARIANTS,
    DDLConfig,
)
from deep_delta.models.ddl.modeling_ddl import (
    DDLCache,
    DDLForCausalLM,
    DDLModel,
    DDLPreTrainedModel,
    output_cache,
)

__all__ = [
    "DEFAULT_VARIANTS",
    "PAPER_NAMES",
    "PRESETS",
    "VARIANTS",
    "DDLCache",
    "DDLConfig",
    "DDLForCausalLM",
    "DDLModel",
    "DDLPreTrainedModel",
    "output_cache",
]
