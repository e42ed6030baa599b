"""Models: the DDL Transformer (baseline and every variant), registered with the Hugging Face Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from deep_delta.models.ddl import DDLCache, DDLConfig, DDLForCausalLM, DDLModel, DDLStaticCache
from deep_delta.models.utils import count_parameters

AutoConfig.register(DDLConfig.model_type, DDLConfig, exist_ok=True)
AutoModel.register(DDLConfig, DDLModel, exist_ok=True)
AutoModelForCausalLM.register(DDLConfig, DDLForCausalLM, exist_ok=True)

__all__ = [
    "DDLCache",
    "DDLConfig",
    "DDLForCausalLM",
    "DDLModel",
    "DDLStaticCache",
    "count_parameters",
]
