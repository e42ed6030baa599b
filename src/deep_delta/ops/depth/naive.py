"""Plain PyTorch reference of Attention Residuals' depth attention (Kimi Team, arXiv 2603.15031).

A sublayer's input is a softmax-weighted sum of the outputs that came before it (and the embedding), over depth:

    K_i = RMSNorm(V_i) * g           (each source normalised over d, with the learned gain g)
    s_i = w^T K_i                    (w: the sublayer's learned pseudo-query, (d,))
    h   = sum_i softmax(s)_i V_i

The lean path (:mod:`.lean`) is tested against these functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from deep_delta.ops.backend import compute_dtype


def depth_weights_reference(sources: Sequence[torch.Tensor], query: torch.Tensor, norm_weight: torch.Tensor,
                            eps: float) -> torch.Tensor:
    """The softmax weights over the sources, (..., n) in fp32 (fp64 for fp64 inputs). sources: n tensors (..., d);
    query, norm_weight: (d,)."""
    ct = compute_dtype(query, norm_weight, *sources)
    values = torch.stack([s.to(ct) for s in sources], dim=-2)  # (..., n, d)
    keys = values * torch.rsqrt(values.square().mean(-1, keepdim=True) + eps) * norm_weight.to(ct)
    return torch.softmax(keys @ query.to(ct), dim=-1)


def depth_attention_reference(sources: Sequence[torch.Tensor], query: torch.Tensor, norm_weight: torch.Tensor,
                              eps: float) -> torch.Tensor:
    """``sum_i softmax(w^T RMSNorm(V_i) g)_i V_i`` over the n sources (..., d) -> (..., d) in the sources' dtype;
    the weights and the sum in fp32 (fp64 for fp64 inputs)."""
    ct = compute_dtype(query, norm_weight, *sources)
    alpha = depth_weights_reference(sources, query, norm_weight, eps)
    values = torch.stack([s.to(ct) for s in sources], dim=-2)
    return (alpha.unsqueeze(-1) * values).sum(-2).to(sources[0].dtype)
