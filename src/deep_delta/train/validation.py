"""The one validation pass of the library: the trainer's evaluation and ``ddl eval loss`` both run it."""

from __future__ import annotations

import math

import torch


def perplexity(loss: float) -> float:
    """exp(loss), or inf where that overflows a float (loss >= 700 nats)."""
    return math.exp(loss) if loss < 700 else float("inf")


@torch.no_grad()
def summed_loss(model, batches, *, device: torch.device, autocast=None) -> torch.Tensor:
    """``[sum of token losses, token count]`` (float64, on ``device``) of ``model`` over ``(x, y)`` batches.

    The one validation pass of the library (``ddl eval loss`` and the trainer's evaluation): eval mode for
    the pass, the loss of each batch weighted by its tokens and accumulated on the device, so the mean does
    not depend on how the pass is cut into batches (up to float rounding) and the host waits only once.
    """
    import contextlib

    autocast = autocast if autocast is not None else contextlib.nullcontext()
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    try:
        for x, y in batches:
            x, y = x.to(device), y.to(device)
            with autocast:
                loss = model(x, shift_labels=y, use_cache=False).loss
            total[0] += loss.double() * y.numel()
            total[1] += y.numel()
    finally:
        model.train(was_training)
    return total


def validation_numbers(model, batches, info, *, autocast=None) -> dict[str, float]:
    """The trainer's evaluation: ``val_loss`` and ``val_ppl`` of ``model`` over ``batches``, summed over every rank
    (``info``, a :class:`~deep_delta.train.distributed.DistInfo`; FSDP's parameters resharded after the pass)."""
    from deep_delta.train import distributed as distr

    total = summed_loss(model, batches, device=info.device, autocast=autocast)
    distr.all_reduce_sum(total, info)
    distr.reshard(model, info)
    val = float(total[0] / total[1])
    return {"val_loss": val, "val_ppl": perplexity(val)}
