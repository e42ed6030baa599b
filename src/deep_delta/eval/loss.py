"""Validation loss and perplexity of a model on a prepared token split (Table 3 of the paper)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from deep_delta.train.validation import perplexity, source_numbers, summed_loss

__all__ = ["LossResult", "evaluate_loss", "perplexity", "summed_loss"]


@dataclass
class LossResult:
    loss: float  # mean next-token cross-entropy (nats / token), every token weighted equally
    perplexity: float  # exp(loss)
    tokens: int
    batches: int
    split: str
    seq_len: int
    windows: str  # which windows: "the whole split", or how part of it was chosen (eval_windows)
    sources: dict | None = None  # with by_source: {name: {"loss", "tokens"}} of each source, in the split's order
    sources_note: str | None = None  # with by_source on data without source runs: why there are none

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
    eval_windows: str = "spread",
    by_source: bool = False,
    progress: bool = False,
) -> LossResult:
    """Mean loss over ``TokenLoader(data_dir, split, batch_size, seq_len).eval_batches(max_batches,
    windows=eval_windows)``: the whole split, or with ``max_batches`` that many batches of windows spread evenly over
    it (``"spread"``) or its first ones (``"first"``). ``by_source``: also the loss of each named source (each token
    counted for the source of its target, a window that straddles two split between them), where the data records
    where its sources lie (``sources_note`` says why not, otherwise).

    seq_len defaults to the model's context (max_position_embeddings). Token ids are checked against the
    model's vocab_size. The loss is accumulated in float64 weighted by tokens, so the result does not depend
    on how the pass is cut into batches (up to float rounding).
    """
    from deep_delta.data import TokenLoader

    context = model.config.max_position_embeddings
    seq_len = context if seq_len is None else seq_len
    if not 1 <= seq_len <= context:
        raise ValueError(f"`seq_len` got {seq_len}; allowed: 1..{context} (the model's context)")
    loader = TokenLoader(data_dir, split, batch_size, seq_len, vocab_size=model.config.vocab_size)
    device = next(model.parameters()).device
    names = loader.source_names if by_source else []
    note = loader.no_sources_reason() if by_source and not names else None
    batches = loader.eval_batches(max_batches, windows=eval_windows, sources=bool(names))
    n = loader.num_eval_batches(max_batches)
    read = loader.num_eval_windows(max_batches)
    what = ("the whole split" if read == loader.num_windows else
            f"{read:,} of its {loader.num_windows:,} windows, " + ("spread evenly over it" if eval_windows == "spread"
                                                               else "the first ones"))
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, total=n, desc=f"eval {split}", unit="batch")
    total = summed_loss(model, batches, device=device, sources=len(names))
    per_source = source_numbers(total, names) if names else None
    total = total[0] if names else total
    mean = float(total[0] / total[1])
    return LossResult(mean, perplexity(mean), int(total[1]), n, split, seq_len, what, per_source, note)
