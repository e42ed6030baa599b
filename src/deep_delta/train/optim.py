"""AdamW with weight decay on matrices only, and the warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: parameters with dim >= 2 (matrices, embeddings, conv taps) decay; vectors
    (norm gains, biases, gate and compressor vectors) do not. Tied parameters appear once."""
    decay, no_decay = [], []
    for p in model.parameters():  # .parameters() yields a tied tensor once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                    fused: bool | None = None) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, fused=fused)
    for group in optimizer.param_groups:
        group["initial_lr"] = lr  # the base rate the schedule scales (set_learning_rate)
    return optimizer


class WarmupCosine:
    """Multiplier of the base learning rate after ``step`` optimizer steps.

    Linear warm-up ``(step + 1) / warmup`` for ``step < warmup``, then cosine from 1 down to ``min_ratio`` at
    ``total``; ``min_ratio`` beyond. A plain object (numbers only) so its state pickles without code.
    """

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if step >= self.total:
            return self.min_ratio
        progress = (step - self.warmup) / max(1, self.total - self.warmup)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, factor: float) -> float:
    """Set every group's learning rate to its base rate (``initial_lr``, recorded on first use) times
    ``factor``; returns the first group's new rate. The schedule is a pure function of the step, so a resumed
    run needs nothing but the step to continue it."""
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * factor
    return optimizer.param_groups[0]["lr"]
