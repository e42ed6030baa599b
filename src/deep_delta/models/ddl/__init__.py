from deep_delta.models.ddl.configuration_ddl import DDLConfig
from deep_delta.models.ddl.modeling_ddl import (
    DDLCache,
    DDLForCausalLM,
    DDLModel,
    DDLPreTrainedModel,
    output_cache,
)

__all__ = ["DDLCache", "DDLConfig", "DDLForCausalLM", "DDLModel", "DDLPreTrainedModel", "output_cache"]
