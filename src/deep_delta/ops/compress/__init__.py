"""State compressors (CC, TC) and the embedding convolution (EC), with backend dispatch.

``backend`` follows :func:`deep_delta.ops.backend.resolve_backend`: "torch" is the lean PyTorch path
(:mod:`.lean`, tested against the plain reference in :mod:`.naive`), "triton" forces the fused kernels
(:mod:`.triton`; CUDA, or CPU tensors under ``TRITON_INTERPRET=1``), "auto" picks the kernels on CUDA
when Triton is importable and the lean path otherwise: each op's two routes in the table of
:func:`deep_delta.ops.backend.dispatch`. The causal short convolution over the token axis that
the TC and EC references use is :mod:`.shortconv`.
"""

from __future__ import annotations

import torch

from deep_delta.ops.backend import dispatch, lazy, register
from deep_delta.ops.compress.lean import channel_compress_lean, embed_conv_lean, token_compress_lean
from deep_delta.ops.compress.naive import (
    channel_compress_reference,
    embed_conv_reference,
    token_compress_reference,
)

__all__ = [
    "channel_compress",
    "channel_compress_reference",
    "embed_conv",
    "embed_conv_reference",
    "token_compress",
    "token_compress_reference",
]


def _kernels():
    from deep_delta.ops.compress import triton

    return triton


register("channel_compress", torch=channel_compress_lean, triton=lazy(_kernels, "channel_compress_triton"))
register("token_compress", torch=token_compress_lean, triton=lazy(_kernels, "token_compress_triton"))
register("embed_conv", torch=embed_conv_lean, triton=lazy(_kernels, "embed_conv_triton"))


def channel_compress(x: torch.Tensor, weight: torch.Tensor, *, backend: str = "auto") -> torch.Tensor:
    """CC read ``x_in_i = sum_j c_ij x_ij``. x: (..., d, d_v), weight: (d, d_v) -> (..., d)."""
    return dispatch("channel_compress", backend, x)(x, weight)


def token_compress(
    x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """TC read with folded taps. x: (B, T, d, d_v), weight: (K, d, d_v), past: (B, K-1, d, d_v) -> (B, T, d)."""
    return dispatch("token_compress", backend, x)(x, weight, past)


def embed_conv(
    e: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """EC expansion. e: (B, T, d), weight: (K, d, d_v), past: (B, K-1, d) or None -> (B, T, d, d_v)."""
    return dispatch("embed_conv", backend, e)(e, weight, past)
