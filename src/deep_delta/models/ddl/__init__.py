from deep_delta.models.ddl.configuration_ddl import DDLConfig
from deep_delta.models.ddl.modeling_ddl import (
    DDLCache,
    DDLForCausalLM,
    DDLModel,
    DDLPreTrainedModel,
    output_cache,
)
from deep_delta.models.ddl.static_cache import DDLStaticCache

__all__ = ["DDLCache", "DDLConfig", "DDLStaticCache", "DDLForCausalLM", "DDLModel", "DDLPreTrainedModel", "output_cache"]
