"""The one optimizer step: what every training run in the package executes, and what the benchmarks time.

:class:`OptimizerStep` binds a model (and its wrapped form under DDP / FSDP / compile), its AdamW, the
autocast context, the gradient clip and the process group; calling it on ``accum`` micro-batches runs forward +
backward of each (gradients averaged, synced on the last one), clips, calls ``before_update`` (which may raise to
skip the update), steps the optimizer and zeroes the gradients. The :class:`~deep_delta.train.trainer.Trainer`
calls it once per step; ``ddl bench`` and ``ddl bench-kernels`` time it, and ``ddl compare`` times the step of
the runs it trained. :func:`build_step` makes it from a model and a :class:`~deep_delta.train.config.TrainConfig`
(activation checkpointing, compile and CUDA graphs, the precision, the optimizer): the one place a training step
is assembled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from deep_delta.train import distributed as distr

if TYPE_CHECKING:
    from deep_delta.train.config import TrainConfig


class OptimizerStep:
    """``step(batches, accum=1, before_update=None) -> (loss, grad_norm)``: one optimizer step of ``model``.

    ``train_model``: the module the forward runs through (the DDP / FSDP / compiled wrapper; default ``model``);
    ``autocast``: the forward's autocast context (default none); ``grad_clip``: the norm gradients are clipped
    to (0: only measured); ``info``: the process group (default one process on the CPU); ``cuda_graphs``: the
    model's compiled regions replay CUDA graphs (``distributed.parallelize``), so each micro-batch starts a new
    step of the graph trees (``torch.compiler.cudagraph_mark_step_begin``: the previous replay's outputs may then
    be overwritten, which the loss, detached and summed at once, never needs)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 train_model: torch.nn.Module | None = None, autocast=None, grad_clip: float = 1.0,
                 info: distr.DistInfo | None = None, cuda_graphs: bool = False):
        self.model, self.optimizer, self.cuda_graphs = model, optimizer, cuda_graphs
        self.train_model = train_model if train_model is not None else model
        self.autocast = autocast if autocast is not None else contextlib.nullcontext()
        self.grad_clip = grad_clip
        self.info = info or distr.DistInfo()

    def __call__(self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *, accum: int = 1,
                 before_update: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward + backward of ``accum`` ``(x, y)`` micro-batches, clipping, ``before_update(loss, grad_norm)``,
        AdamW, zero_grad. Returns the mean loss (all-reduced over ranks) and the gradient norm as tensors:
        nothing here waits on the device."""
        info = self.info
        loss_sum = torch.zeros((), device=info.device)
        for micro, (x, y) in enumerate(batches):
            x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
            distr.set_gradient_sync(self.train_model, info, micro == accum - 1)
            loss = self.forward(x, y)
            self.accumulate_gradients(loss, accum)
            loss_sum += loss.detach()
        loss_t = distr.all_reduce_sum(loss_sum, info) / (accum * info.world_size)
        return loss_t, self.update(loss_t, before_update)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of one micro-batch (inputs x, targets y already aligned), through the wrapped model under the
        step's autocast; with ``cuda_graphs``, a new step of the graph trees first."""
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast:
            return self.train_model(x, shift_labels=y).loss

    @staticmethod
    def accumulate_gradients(loss: torch.Tensor, accum: int = 1) -> None:
        """The gradients of one micro-batch's loss, averaged over ``accum`` micro-batches, accumulated into each
        parameter's ``.grad``: the backward every training step runs (``ddl bench-kernels --launches`` counts it).
        One micro-batch divides by nothing (the same gradients, one kernel less each way)."""
        (loss if accum == 1 else loss / accum).backward()

    def update(self, loss_t: torch.Tensor,
               before_update: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> torch.Tensor:
        """Clip (or measure) the gradients, ``before_update(loss, grad_norm)``, AdamW, zero_grad; returns the
        gradient norm (a tensor)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:
            grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        if before_update is not None:
            before_update(loss_t, grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm


__all__ = ["OptimizerStep"]


@dataclass
class TrainStep:
    """What :func:`build_step` assembled: the module the forward runs through (``train_model``), the optimizer
    (a torch optimizer, or ``optim.MuonWithAdamW``), the step, and whether it trains in bf16 autocast."""

    train_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    step: OptimizerStep
    bf16: bool | None  # None: a given autocast


def build_step(model: torch.nn.Module, cfg: TrainConfig, info: distr.DistInfo | None = None, *,
               autocast=None) -> TrainStep:
    """The training step of ``model`` (on ``info.device`` already) as ``cfg`` asks for it: activation
    checkpointing (before compile and FSDP wrap the blocks), the blocks compiled and replayed as CUDA graphs
    (``cfg.compile``, ``cfg.cuda_graphs``) and wrapped for DDP / FSDP (``distributed.parallelize``), bf16
    autocast by the one rule (``runtime.trains_in_bf16``; FSDP's mixed precision instead under FSDP on CUDA),
    the optimizer ``cfg.optimizer`` (``optim.build_optimizer``: AdamW, fused on CUDA without FSDP, or Muon with
    AdamW) with ``cfg``'s lr, weight decay and betas, and the gradient clip. The
    trainer, ``ddl bench`` and ``ddl compare``'s step times all build their step here. ``autocast``: a context
    in place of the rule's (a benchmark of fp16 autocast, which training does not offer)."""
    from deep_delta.runtime import training_autocast, trains_in_bf16
    from deep_delta.train.optim import build_optimizer

    info = info or distr.DistInfo()
    if cfg.activation_checkpointing:
        model.activation_checkpointing_enable()
    bf16 = trains_in_bf16(cfg.dtype, info.device)
    fsdp = info.mode == "fsdp"
    train_model = distr.parallelize(model, info, compile=cfg.compile, bf16=bf16 and fsdp and info.device.type == "cuda",
                                    cuda_graphs=cfg.cuda_graphs)
    fused = True if info.device.type == "cuda" and not fsdp else None
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, cfg.betas, fused=fused, optimizer=cfg.optimizer,
                                adamw_lr_ratio=cfg.adamw_lr_ratio)
    step = OptimizerStep(model, optimizer, train_model=train_model,
                         autocast=autocast if autocast is not None else training_autocast(cfg.dtype, info.device,
                                                                                          fsdp=fsdp),
                         grad_clip=cfg.grad_clip,
                         info=info, cuda_graphs=cfg.cuda_graphs != "off")
    return TrainStep(train_model, optimizer, step, bf16 if autocast is None else None)
