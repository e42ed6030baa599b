"""Training: ``TrainConfig`` (YAML + overrides), the trainer, atomic checkpoints, torchrun (DDP / FSDP2).

    from deep_delta.train import TrainConfig, train, latest_checkpoint, load_checkpoint

    result = train(TrainConfig(variant="ddl-cc", preset="tiny", steps=200, out="runs/cc"))
"""

from deep_delta.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from deep_delta.train.config import TrainConfig, available_configs, load_config, resolve_config
from deep_delta.train.trainer import NonFiniteLossError, TrainResult, train

__all__ = [
    "NonFiniteLossError",
    "TrainConfig",
    "TrainResult",
    "available_configs",
    "latest_checkpoint",
    "load_checkpoint",
    "load_config",
    "resolve_config",
    "save_checkpoint",
    "train",
]
