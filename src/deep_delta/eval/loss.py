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
        raise ValueError(f"--seq-len: got {seq_len}; allowed: 1..{context} (the model's context)")
    loader = TokenLoader(data_dir, split, batch_size, seq_len, vocab_size=model.config.vocab_size)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, tokens, batches = 0.0, 0, 0
    it = loader.eval_batches(max_batches)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, total=loader.num_eval_batches(max_batches), desc=f"eval {split}", unit="batch")
    try:
        for x, y in it:
            x, y = x.to(device), y.to(device)
            loss = model(input_ids=x, shift_labels=y, use_cache=False).loss
            total += float(loss) * y.numel()
            tokens += y.numel()
            batches += 1
    finally:
        model.train(was_training)
    mean = total / tokens
    return LossResult(mean, math.exp(mean) if mean < 700 else float("inf"), tokens, batches, split, seq_len)
