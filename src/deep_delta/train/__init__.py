"""Training: ``TrainConfig`` (recipes, YAML, overrides), the trainer, atomic checkpoints, torchrun (DDP / FSDP2).

    from deep_delta.train import TrainConfig, train, latest_checkpoint, load_checkpoint

    result = train(TrainConfig(variant="ddl-cc", preset="tiny", steps=200, out="runs/cc"))

The names load on first use (:mod:`deep_delta._lazy`): ``deep_delta.train.config`` needs no PyTorch.
"""

from deep_delta._lazy import lazy_names

_PUBLIC = {
    "latest_checkpoint": "deep_delta.train.checkpoint",
    "load_checkpoint": "deep_delta.train.checkpoint",
    "save_checkpoint": "deep_delta.train.checkpoint",
    "TrainConfig": "deep_delta.train.config",
    "available_configs": "deep_delta.train.config",
    "load_config": "deep_delta.train.config",
    "NonFiniteLossError": "deep_delta.train.trainer",
    "TrainResult": "deep_delta.train.trainer",
    "Trainer": "deep_delta.train.trainer",
    "train": "deep_delta.train.trainer",
    "TrainData": "deep_delta.train.data",
}

__all__ = sorted(_PUBLIC)
__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
