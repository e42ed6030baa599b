"""Training: ``TrainConfig`` (recipes, YAML, overrides), the trainer, atomic checkpoints, torchrun (DDP / FSDP2).

    from deep_delta.train import TrainConfig, train, latest_checkpoint, load_checkpoint

    result = train(TrainConfig(variant="ddl-cc", preset="tiny", steps=200, out="runs/cc"))

The names load on first use (:mod:`deep_delta._lazy`): ``deep_delta.train.config`` needs no PyTorch.
"""

from deep_delta._lazy import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "deep_delta.train.checkpoint": ("latest_checkpoint", "load_checkpoint", "save_checkpoint"),
    "deep_delta.train.config": ("TrainConfig", "available_configs", "load_config"),
    "deep_delta.train.data": ("TrainData",),
    "deep_delta.train.trainer": ("NonFiniteLossError", "TrainResult", "Trainer", "train"),
})
