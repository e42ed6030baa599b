"""The one validation pass of the library: the trainer's evaluation and ``ddl eval loss`` both run it."""

from __future__ import annotations

import math

import torch


def perplexity(loss: float) -> float:
    """exp(loss), or inf where that overflows a float (loss >= 700 nats)."""
    return math.exp(loss) if loss < 700 else float("inf")


@torch.no_grad()
def summed_loss(model, batches, *, device: torch.device, autocast=None, sources: int = 0) -> torch.Tensor:
    """``[sum of token losses, token count]`` (float64, on ``device``) of ``model`` over ``(x, y)`` batches.

    The one validation pass of the library (``ddl eval loss`` and the trainer's evaluation): eval mode for
    the pass, the loss of each batch weighted by its tokens and accumulated on the device, so the mean does
    not depend on how the pass is cut into batches (up to float rounding) and the host waits only once.

    ``sources`` > 0: the batches are ``(x, y, source)`` (``source`` (B, T): the index, below ``sources``, of the
    source of each target token; :meth:`~deep_delta.data.TokenLoader.eval_batches` with ``sources=True``) and the
    result is ``(1 + sources, 2)``: row 0 the whole pass, summed exactly as without sources (the model's loss), then
    each source's sums of its tokens' losses (each token's cross-entropy from the logits, in float32) and counts.
    """
    import contextlib

    import torch.nn.functional as F

    autocast = autocast if autocast is not None else contextlib.nullcontext()
    was_training = model.training
    model.eval()
    total = torch.zeros((1 + sources, 2) if sources else 2, dtype=torch.float64, device=device)
    whole = total[0] if sources else total
    try:
        for batch in batches:
            x, y = batch[0].to(device), batch[1].to(device)
            with autocast:
                out = model(x, shift_labels=y, use_cache=False)
            whole[0] += out.loss.double() * y.numel()
            whole[1] += y.numel()
            if sources:
                index = batch[2].to(device).reshape(-1)
                per_token = F.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), y.reshape(-1),
                                            reduction="none")
                total[1:, 0].index_add_(0, index, per_token.double())
                total[1:, 1].index_add_(0, index, torch.ones_like(per_token, dtype=torch.float64))
    finally:
        model.train(was_training)
    return total


def source_numbers(total: torch.Tensor, names: list[str]) -> dict[str, dict[str, float | int]]:
    """``{name: {"loss", "tokens"}}`` of each source from :func:`summed_loss`'s rows (``names`` in row order; a
    source without tokens in the pass is left out)."""
    return {name: {"loss": float(total[1 + i, 0] / total[1 + i, 1]), "tokens": int(total[1 + i, 1])}
            for i, name in enumerate(names) if total[1 + i, 1] > 0}


def validation_numbers(model, batches, info, *, autocast=None) -> dict[str, float]:
    """The trainer's evaluation: ``val_loss`` and ``val_ppl`` of ``model`` over ``batches``, summed over every rank
    (``info``, a :class:`~deep_delta.train.distributed.DistInfo`; FSDP's parameters resharded after the pass)."""
    from deep_delta.train import distributed as distr

    total = summed_loss(model, batches, device=info.device, autocast=autocast)
    distr.all_reduce_sum(total, info)
    distr.reshard(model, info)
    val = float(total[0] / total[1])
    return {"val_loss": val, "val_ppl": perplexity(val)}
