"""What a run builds from its settings: the model's config (its vocabulary sized to the data), the optional
packages it needs, and the model."""

from __future__ import annotations

from deep_delta.train.config import TrainConfig


def model_vocab_size(preset_vocab: int, data_vocab: int) -> int:
    """The preset's vocabulary if it covers the data's, else the data's padded up to a multiple of 64."""
    if preset_vocab >= data_vocab:
        return preset_vocab
    return -(-data_vocab // 64) * 64


def build_model_config(cfg: TrainConfig, data_vocab: int):
    """``DDLConfig`` of the run: variant at preset, vocabulary sized to the data, ``cfg.model`` overrides."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig
    from deep_delta.variants import PRESETS

    overrides = dict(cfg.model)
    if "vocab_size" in overrides:
        if overrides["vocab_size"] < data_vocab:
            raise ValueError(
                f"TrainConfig: `model.vocab_size` got {overrides['vocab_size']}, but the data's tokenizer has "
                f"{data_vocab} token ids (tokens >= the model vocabulary); allowed: an integer >= {data_vocab}"
            )
    else:
        overrides["vocab_size"] = model_vocab_size(PRESETS[cfg.preset]["vocab_size"], data_vocab)
    return check_context(cfg, DDLConfig.from_variant(cfg.variant, cfg.preset, **overrides))


def check_context(cfg: TrainConfig, model_config):
    """``model_config`` when its context holds ``cfg.seq_len`` tokens; else the error naming both."""
    if cfg.seq_len > model_config.max_position_embeddings:
        raise ValueError(
            f"TrainConfig: `seq_len` got {cfg.seq_len}; allowed: at most the model's max_position_embeddings="
            f"{model_config.max_position_embeddings} (raise it with model.max_position_embeddings)"
        )
    return model_config


def require_extras(cfg: TrainConfig, model_config, *, loggers: bool = True) -> None:
    """Refuse, before anything is built or written, a run whose optional packages are not installed (one line
    naming the extra, :func:`deep_delta.extras.require`): the Triton kernels its model's ``delta_backend`` names,
    and with ``loggers`` (the process that logs) the TensorBoard and W&B logging it asks for."""
    from deep_delta.extras import EXTRAS, require

    if model_config.delta_backend == "triton":
        require("triton", "`model.delta_backend` triton (the fused Triton kernels)")
    for module, on in (("tensorboard", cfg.tensorboard), ("wandb", cfg.wandb)):
        if loggers and on:
            require(module, f"`{module}` ({EXTRAS[module][1]})")


def build_model(model_config):
    """A freshly initialised ``DDLForCausalLM`` (seed the RNG before calling: every rank must agree)."""
    from deep_delta.models import DDLForCausalLM

    return DDLForCausalLM(model_config)


__all__ = ["build_model", "build_model_config", "check_context", "model_vocab_size", "require_extras"]
