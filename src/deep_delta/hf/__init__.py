"""Hugging Face integration: tokenizers saved beside the weights, model loading, export and generation.

    from deep_delta.hf import load_model, export_model, save_tokenizer

    loaded = load_model("runs/x")            # an HF dir, a checkpoint, or a run (checkpoints/LATEST)
    loaded.model, loaded.tokenizer           # DDLForCausalLM (eval mode), a transformers tokenizer
"""

from deep_delta.hf.decode import StaticDecoder
from deep_delta.hf.export import export_model
from deep_delta.hf.generation import SamplingOptions, generate_text
from deep_delta.hf.loading import LoadedModel, ModelSource, load_model, resolve_model_dir
from deep_delta.hf.tokenizer import build_tokenizer, byte_tokenizer, save_tokenizer, tokenizer_from_tiktoken

__all__ = [
    "LoadedModel",
    "ModelSource",
    "SamplingOptions",
    "StaticDecoder",
    "build_tokenizer",
    "byte_tokenizer",
    "export_model",
    "generate_text",
    "load_model",
    "resolve_model_dir",
    "save_tokenizer",
    "tokenizer_from_tiktoken",
]
