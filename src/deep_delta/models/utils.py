"""Facts about a model that every tool reports the same way."""

from __future__ import annotations

from torch import nn


def count_parameters(model: nn.Module) -> int:
    """The number of parameters of ``model``, a shared tensor (the tied embedding and LM head) once.

    Any module: a DDL model, a layer, or a DDP / FSDP2 wrapper (FSDP2 counts the full, unsharded tensors).
    """
    return sum(p.numel() for p in model.parameters())
