from deep_delta.models.ddl.cache import DDLCache, DDLStaticCache, output_cache
from deep_delta.models.ddl.configuration_ddl import DDLConfig
from deep_delta.models.ddl.modeling_ddl import DDLForCausalLM, DDLModel, DDLPreTrainedModel

__all__ = ["DDLCache", "DDLConfig", "DDLStaticCache", "DDLForCausalLM", "DDLModel", "DDLPreTrainedModel", "output_cache"]
