"""Causal depthwise short convolution over the token axis, with an explicit token history.

Used by the token-axis compressor (TC) and the embedding convolution (EC). Written as K shifted
multiply-adds instead of ``nn.Conv1d`` so the state keeps its (B, T, ...) layout (no transposes) and a
decoding step can pass the last K-1 inputs as ``past``.
"""

from __future__ import annotations

import torch


def pad_with_past(x: torch.Tensor, kernel_size: int, past: torch.Tensor | None) -> torch.Tensor:
    """Prepend the K-1 preceding inputs (zeros at the sequence start) along dim 1.

    x: (B, T, *C); past: (B, K-1, *C) or None -> (B, T + K - 1, *C).
    """
    if kernel_size == 1:
        return x
    if past is None:
        past = x.new_zeros((x.shape[0], kernel_size - 1) + tuple(x.shape[2:]))
    elif past.shape[1] != kernel_size - 1 or past.shape[0] != x.shape[0] or past.shape[2:] != x.shape[2:]:
        raise ValueError(
            f"short conv: `past` must have shape {(x.shape[0], kernel_size - 1) + tuple(x.shape[2:])}, "
            f"got {tuple(past.shape)}"
        )
    return torch.cat([past.to(x.dtype), x], dim=1)


def next_past(padded: torch.Tensor, kernel_size: int) -> torch.Tensor | None:
    """The last K-1 inputs of a padded sequence: the ``past`` for the next call (None when K = 1)."""
    if kernel_size == 1:
        return None
    return padded[:, -(kernel_size - 1):].detach()


def short_conv(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
    """``y_t = sum_s weight[s] * x_{t-s}`` per channel (causal, depthwise).

    x: (B, T, *C); weight: (K, *C') broadcastable to C; past: (B, K-1, *C) or None.
    Returns (B, T, *C_out) where C_out is the broadcast of C and C'.
    """
    k = weight.shape[0]
    t = x.shape[1]
    xp = pad_with_past(x, k, past)
    y = xp[:, k - 1 : k - 1 + t] * weight[0]
    for s in range(1, k):
        y = y + xp[:, k - 1 - s : k - 1 - s + t] * weight[s]
    return y


def keep_taps(ctx, padded: torch.Tensor, w: torch.Tensor, t: int) -> None:
    """What the backward of a taps Function (TC's read and EC, lean and Triton) needs: the padded input (its P
    history rows first), the taps and T."""
    ctx.save_for_backward(padded, w)
    ctx.t = t


def kept_taps(ctx) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(padded, w, t) as :func:`keep_taps` kept them."""
    padded, w = ctx.saved_tensors
    return padded, w, ctx.t
