"""The delta design's fusion plan: what each sublayer's update computes for the next sublayer, decided once per
forward.

A DDL update can compute, in the same pass over the state, what the sublayer after it needs: its compressed read
of the new state (d_v > 1: a channel read always; a token-convolution read in a forward without token history
or padding, i.e. training) or its norm, gate and value (the linear-gate k-Map on the Triton backend with the
fusion switched on: d_v = 1, or d_v > 1 through a channel read). What passes between sublayers is a
:class:`~deep_delta.layers.carry.Carry`; what a sublayer's update emits is an
:class:`~deep_delta.layers.carry.Emit`. :func:`plan` makes the per-sublayer choices from today's rules:

- within a block (``block.fuse_reads``): the attention update emits the MLP sublayer's inputs where
  ``DeltaResidual.fuses_norm_of`` holds (and, for d_v > 1, there are no pads), else the MLP sublayer's read
  where it can be fused, else nothing;
- across blocks (``model.fuse_reads`` and both blocks' ``fuse_reads``, and every read fusable): the MLP update
  emits the next block's attention inputs where its own block took that path and ``fuses_norm_of`` holds, else
  the next read (the next block's compressor, or the final readout after the last block), else nothing.

:func:`~deep_delta.layers.carry.unfused` is the plan where nothing is fused, every update a plain ``forward`` (for hooks on each sublayer,
``ddl analyze``, and the tests' reference). The plan changes nothing the model computes, only which ops compute it
(tests/models/test_fusion.py).
"""

from __future__ import annotations

import torch
from torch import nn

from deep_delta.layers.carry import NOTHING, BlockPlan, Emit
from deep_delta.layers.compressors import ChannelCompressor, TokenConvCompressor
from deep_delta.layers.delta_residual import DeltaResidual


def fusable_read(compressor: nn.Module | None, cache, pad_mask: torch.Tensor | None) -> bool:
    """A read that can be computed inside the previous sublayer's update: CC (it needs no other token), and TC
    in a forward without token history or padding (training): its kernel reads the K-1 tokens before each
    chunk of its own, and a padded state is masked after the update, which a fused TC read would not see."""
    if isinstance(compressor, ChannelCompressor):
        return True
    return isinstance(compressor, TokenConvCompressor) and cache is None and pad_mask is None


def plan(model: nn.Module, x: torch.Tensor, cache,
         pad_mask: torch.Tensor | None) -> tuple[BlockPlan, ...]:
    """What every sublayer of ``model`` (a :class:`~deep_delta.models.ddl.modeling_ddl.DDLModel`) emits in a
    forward of state x (its device decides the backend), with ``cache`` and ``pad_mask``: one (attention, MLP)
    pair of :class:`Emit` per block. Called inside the forward (a recording state tape turns the fused norms
    off)."""
    layers = model.layers
    out = []
    inputs_in = False  # the previous MLP update emits this block's attention inputs
    for i, block in enumerate(layers):
        nxt = layers[i + 1] if i + 1 < len(layers) else None
        if block.compressor is None:
            attn, mlp = _vector_block(model, block, nxt, x)
        else:
            attn, mlp = _read_block(model, block, nxt, x, cache, pad_mask, inputs_in)
        out.append((attn, mlp))
        inputs_in = mlp.what == "inputs"
    return tuple(out)


def _vector_block(model: nn.Module, block: nn.Module, nxt: nn.Module | None, x: torch.Tensor) -> BlockPlan:
    """A block without a compressor (d_v = 1, additive, HC): the norms only."""
    fused = (block.fuse_reads and isinstance(block.attn, DeltaResidual)
             and block.attn.fuses_norm_of(block.mlp, x))
    attn = Emit("inputs", block.mlp) if fused else NOTHING
    across = model.fuse_reads and block.fuse_reads and nxt is not None and nxt.fuse_reads
    if fused and across and block.mlp.fuses_norm_of(nxt.attn, x):
        return attn, Emit("inputs", nxt.attn)
    return attn, NOTHING


def _read_block(model: nn.Module, block: nn.Module, nxt: nn.Module | None, x: torch.Tensor,
                cache, pad_mask: torch.Tensor | None, inputs_in: bool) -> BlockPlan:
    """A block with a compressor (d_v > 1): reads, and norms through channel reads."""
    comp = block.compressor
    next_read = nxt.compressor if nxt is not None else model.final_compressor
    across = (model.fuse_reads and block.fuse_reads and fusable_read(comp, cache, pad_mask)
              and fusable_read(next_read, cache, pad_mask))
    next_inputs = nxt.attn if across and nxt is not None and nxt.fuse_reads else None
    norms = inputs_in or (block.fuse_reads and pad_mask is None and isinstance(block.attn, DeltaResidual)
                          and block.attn.fuses_norm_of(block.mlp, x, comp))
    if norms:
        attn = Emit("inputs", block.mlp, comp)
        if next_inputs is not None and block.mlp.fuses_norm_of(next_inputs, x, next_read):
            return attn, Emit("inputs", next_inputs, next_read)
        return attn, Emit("read", None, next_read) if across else NOTHING
    if block.fuse_reads and fusable_read(comp, cache, pad_mask):
        return Emit("read", None, comp), Emit("read", None, next_read) if across else NOTHING
    return NOTHING, NOTHING
