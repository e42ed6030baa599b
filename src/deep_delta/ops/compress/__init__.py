"""State compressors (CC, TC) and the embedding convolution (EC), with backend dispatch.

``backend`` follows :func:`deep_delta.ops.backend.resolve_backend`: "torch" is the lean PyTorch path
(:mod:`.lean`, tested against the plain reference in :mod:`.naive`), "triton" forces the fused kernels
(:mod:`.triton`; CUDA, or CPU tensors under ``TRITON_INTERPRET=1``), "auto" picks the kernels on CUDA
when Triton is importable and the lean path otherwise.
"""

from __future__ import annotations

import torch

from deep_delta.ops.backend import resolve_backend
from deep_delta.ops.compress.lean import channel_compress_lean, embed_conv_lean, token_compress_lean
from deep_delta.ops.compress.naive import (
    channel_compress_reference,
    embed_conv_reference,
    token_compress_reference,
)


def channel_compress(x: torch.Tensor, weight: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """CC read ``x_in_i = sum_j c_ij x_ij``. x: (..., d, d_v), weight: (d, d_v) -> (..., d)."""
    if resolve_backend(backend, x.device) == "triton":
        from deep_delta.ops.compress.triton import channel_compress_triton

        return channel_compress_triton(x, weight)
    return channel_compress_lean(x, weight)


def token_compress(
    x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """TC read with folded taps. x: (B, T, d, d_v), weight: (K, d, d_v), past: (B, K-1, d, d_v) -> (B, T, d)."""
    if resolve_backend(backend, x.device) == "triton":
        from deep_delta.ops.compress.triton import token_compress_triton

        return token_compress_triton(x, weight, past)
    return token_compress_lean(x, weight, past)


def embed_conv(
    e: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """EC expansion. e: (B, T, d), weight: (K, d, d_v), past: (B, K-1, d) or None -> (B, T, d, d_v)."""
    if resolve_backend(backend, e.device) == "triton":
        from deep_delta.ops.compress.triton import embed_conv_triton

        return embed_conv_triton(e, weight, past)
    return embed_conv_lean(e, weight, past)


def update_and_channel_read(
    x: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    weight: torch.Tensor,
    *,
    k_eps: float = 1e-5,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta update of one sublayer fused with the CC read of the next: returns (x', x_in).

    x: (..., d, d_v), k: (..., d), v: (..., d_v), beta: (..., 1), weight: (d, d_v) the next sublayer's
    channel compressor. Equals ``x' = delta_update(x, k, v, beta)``, ``x_in = channel_compress(x', weight)``;
    the Triton kernel computes x_in from the tile it has just written (no second pass over x').
    """
    from deep_delta.ops import _check_inputs, delta_update

    beta = _check_inputs(x, k, v, beta)
    if backend == "auto":  # the registered op (deep_delta.ops.delta.library): Triton on CUDA, lean elsewhere
        from deep_delta.ops.delta.library import update_with_op

        return update_with_op(x, k, v, beta, weight, k_eps)
    if resolve_backend(backend, x.device) == "triton":
        from deep_delta.ops.delta.triton import delta_update_read_triton

        return delta_update_read_triton(x, k, v, beta, weight, k_eps=k_eps)
    out = delta_update(x, k, v, beta, k_eps=k_eps, backend="torch")
    return out, channel_compress_lean(out, weight)


def update_and_token_read(
    x: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    weight: torch.Tensor,
    *,
    k_eps: float = 1e-5,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta update of one sublayer fused with the TC read of the next (no token history): (x', x_in).

    x: (B, T, d, d_v), k: (B, T, d), v: (B, T, d_v), beta: (B, T, 1), weight: (K, d, d_v) the next sublayer's
    folded TC taps. Equals ``x' = delta_update(x, k, v, beta)``, ``x_in = token_compress(x', weight)``; the
    Triton kernels (:mod:`deep_delta.ops.delta.triton_token`) make one pass over the state each way.
    """
    from deep_delta.ops import _check_inputs, delta_update

    beta = _check_inputs(x, k, v, beta)
    if x.dim() != 4 or weight.dim() != 3 or tuple(weight.shape[1:]) != tuple(x.shape[2:]):
        raise ValueError(f"update_and_token_read: expected x (B, T, d, d_v) and weight (K, d, d_v), got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    if resolve_backend(backend, x.device) == "triton":
        from deep_delta.ops.delta.triton_token import delta_update_token_read_triton

        return delta_update_token_read_triton(x, k, v, beta, weight, k_eps=k_eps)
    out = delta_update(x, k, v, beta, k_eps=k_eps, backend=backend)
    return out, token_compress(out, weight, None, backend=backend)


__all__ = [
    "channel_compress",
    "channel_compress_reference",
    "embed_conv",
    "embed_conv_reference",
    "token_compress",
    "token_compress_reference",
    "update_and_channel_read",
    "update_and_token_read",
]
