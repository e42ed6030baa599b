"""What one sublayer's update hands the next: a :class:`Carry`, and the plan's word for what to compute, an
:class:`Emit`. A residual that hands nothing on passes the empty ``Carry()``; only the delta residual's updates
compute anything for the next sublayer (its compressed read, or its norm, gate and value: the fusion plan of the
delta design, :mod:`deep_delta.designs.delta.fusion`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn


class Carry(NamedTuple):
    """What a sublayer's update computed for the next sublayer: nothing (both None), the next sublayer's compressed
    read ``read`` (..., d), or its norm, gate and value ``inputs`` = (c, beta, v) (what ``prepared`` takes)."""

    read: torch.Tensor | None = None
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class Emit(NamedTuple):
    """What an update computes for the next sublayer beside the new state: ``what`` is "nothing", "read" (the
    compressed read of the new state by ``read``, a channel or token compressor) or "inputs" (``nxt``'s norm, gate
    and value of the new state: d_v = 1 with ``read`` None, or d_v > 1 through ``read``, a channel compressor)."""

    what: str = "nothing"
    nxt: nn.Module | None = None
    read: nn.Module | None = None


NOTHING = Emit()
EMITS = ("nothing", "read", "inputs")
BlockPlan = tuple[Emit, Emit]  # what the attention update and the MLP update of a block emit


def unfused(blocks: int) -> tuple[BlockPlan, ...]:
    """The plan of ``blocks`` blocks in which no update emits anything."""
    return tuple((NOTHING, NOTHING) for _ in range(blocks))


__all__ = ["BlockPlan", "Carry", "EMITS", "Emit", "NOTHING", "unfused"]
