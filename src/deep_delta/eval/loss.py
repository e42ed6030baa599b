"""Validation loss and perplexity of a model on a prepared token split (Table 3 of the paper)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

import torch


@dataclass
class LossResult:
    loss: float  # mean next-token cross-entropy (nats / token), every token weighted equally
    perplexity: float  # exp(loss)
    tokens: int
    batches: int
    split: str
    seq_len: int

    def to_dict(self) -> dict:
        return asdict(self)


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


@torch.no_grad()
def evaluate_loss(
    model,
    data_dir: str | os.PathLike,
    *,
    split: str = "val",
    batch_size: int = 8,
    seq_len: int | None = None,
    max_batches: int | None = None,
    progress: bool = False,
) -> LossResult:
    """Mean loss over ``TokenLoader(data_dir, split, batch_size, seq_len).eval_batches(max_batches)``.

    seq_len defaults to the model's context (max_position_embeddings). Token ids are checked against the
    model's vocab_size. The loss is accumulated in float64 weighted by tokens, so the result does not depend
    on how the pass is cut into batches (up to float rounding).
    """
    from deep_delta.data import TokenLoader

    context = model.config.max_position_embeddings
    seq_len = context if seq_len is None else seq_len
    if not 1 <= seq_len <= context:
        raise ValueError(f"seq_len: got {seq_len}; allowed: 1..{context} (the model's context)")
    loader = TokenLoader(data_dir, split, batch_size, seq_len, vocab_size=model.config.vocab_size)
    device = next(model.parameters()).device
    batches = loader.eval_batches(max_batches)
    n = loader.num_eval_batches(max_batches)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, total=n, desc=f"eval {split}", unit="batch")
    total = summed_loss(model, batches, device=device)
    mean = float(total[0] / total[1])
    return LossResult(mean, perplexity(mean), int(total[1]), n, split, seq_len)
