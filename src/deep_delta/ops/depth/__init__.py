"""Attention Residuals' depth attention (AttnRes, Kimi Team, arXiv 2603.15031): a sublayer's input as a softmax
over depth of the earlier sublayers' outputs and the embedding, weighted by its learned pseudo-query against
their RMS-normalised values.

- :mod:`.naive`: the plain reference (the definition);
- :mod:`.lean` (``backend="torch"``): a custom autograd Function that keeps the sources as they are (no stacked
  copy) and only the weights beside them.

No Triton kernel: on every device and backend the lean path runs (``backend`` is validated), the op's one route
in the table of :func:`deep_delta.ops.backend.dispatch`. The layer that
uses it is :class:`deep_delta.layers.AttnResidual`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from deep_delta.ops.backend import dispatch, register
from deep_delta.ops.depth.lean import depth_attention_lean
from deep_delta.ops.depth.naive import depth_attention_reference, depth_weights_reference

__all__ = ["depth_attention", "depth_attention_reference", "depth_weights_reference"]

register("depth_attention", torch=depth_attention_lean)


def depth_attention(sources: Sequence[torch.Tensor], query: torch.Tensor, norm_weight: torch.Tensor, *,
                    eps: float = 1e-5, backend: str = "auto") -> torch.Tensor:
    """``sum_i softmax_i(q^T RMSNorm(V_i) g) V_i``: the softmax-weighted sum of the sources over depth.

    Args:
        sources: n >= 1 tensors (..., d) of one shape and dtype: the embedding and the earlier outputs (or the
            block sums of Block AttnRes).
        query: the pseudo-query q, (d,); zero gives the plain mean of the sources.
        norm_weight: the gain g of the sources' RMSNorm, (d,); eps: its eps.
        backend: "auto" | "torch" | "triton"; every one runs the lean path (there is no kernel).
    Returns:
        (..., d) in the sources' dtype; the weights and the sum in fp32 (fp64 for fp64 inputs).
    """
    sources = tuple(sources)
    if not sources:
        raise ValueError("depth_attention: `sources` got none; allowed: one or more tensors (..., d)")
    first = sources[0]
    if first.dim() < 1:
        raise ValueError(f"depth_attention: a source must have shape (..., d), got {tuple(first.shape)}")
    d = first.shape[-1]
    for i, src in enumerate(sources):
        if src.shape != first.shape or src.dtype != first.dtype:
            raise ValueError(f"depth_attention: source {i} is {tuple(src.shape)} {src.dtype}, source 0 "
                             f"{tuple(first.shape)} {first.dtype}; allowed: one shape and dtype for every source")
        if not src.is_floating_point():
            raise TypeError(f"depth_attention: source {i} must be a floating-point tensor, got {src.dtype}")
    for name, t in (("query", query), ("norm_weight", norm_weight)):
        if tuple(t.shape) != (d,):
            raise ValueError(f"depth_attention: `{name}` must have shape ({d},), got {tuple(t.shape)}")
    return dispatch("depth_attention", backend, first)(sources, query, norm_weight, eps)
