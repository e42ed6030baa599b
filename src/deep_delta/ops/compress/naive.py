"""Plain PyTorch references of the state compressors and the embedding convolution.

These are the definitions every faster implementation (:mod:`.lean`, :mod:`.triton`) is tested against.
Shapes: state x (B, T, d, d_v), embeddings e (B, T, d), per-channel taps w (K, d, d_v).
"""

from __future__ import annotations

import torch

from deep_delta.ops.compress.shortconv import pad_with_past, short_conv


def channel_compress_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """CC read ``x_in_i = sum_j c_ij x_ij``. x: (..., d, d_v), weight: (d, d_v) -> (..., d)."""
    return (x * weight.to(x.dtype)).sum(-1)


def token_compress_reference(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
    """TC read ``x_in_{t,i} = sum_s sum_j w_{s,i,j} x_{t-s,i,j}`` (read vector folded into the taps).

    x: (B, T, d, d_v), weight: (K, d, d_v), past: (B, K-1, d, d_v) or None (zeros) -> (B, T, d).
    """
    k = weight.shape[0]
    return short_conv(x, weight.to(x.dtype), past).sum(-1) if k > 0 else x.sum(-1)


def embed_conv_reference(e: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
    """EC state expansion ``x_{t,i,j} = sum_s w_{s,i,j} e_{t-s,i}``.

    e: (B, T, d), weight: (K, d, d_v), past: (B, K-1, d) or None -> (B, T, d, d_v).
    """
    ep = None if past is None else past.unsqueeze(-1)
    return short_conv(e.unsqueeze(-1), weight.to(e.dtype), ep)


__all__ = ["channel_compress_reference", "embed_conv_reference", "pad_with_past", "token_compress_reference"]
