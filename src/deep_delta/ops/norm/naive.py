"""The plain reference of the sublayer's input stage: the RMSNorm, the linear gate and the k-Map value.

    c    = RMSNorm(src) = src * rsqrt(mean(src^2) + eps) * g
    beta = beta_max * sigmoid(c . w_g + b_g)
    v    = value_scale * sigmoid(src W_v^T + b_v)

src is read in the norm weight's dtype (as :class:`deep_delta.layers.DeltaResidual` reads it); the math runs in
fp32 (fp64 for fp64 inputs). Short on purpose: the definition the lean path and the kernels are tested against.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def norm_gate_value_reference(
    src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor,
    value_bias: Tensor, *, eps: float, beta_max: float, value_scale: float, c_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """src (..., d), norm_weight (d,), gate_weight (G, d), gate_bias (G,) (G = 1, or the untied rule's 2 gates),
    value_weight (d_v, d), value_bias (d_v,).

    Returns c (..., d) in c_dtype (None: norm_weight's dtype; the gate reads c unrounded), beta (..., G) and v (..., d_v) in fp32 (fp64 for fp64 weights).
    """
    ct = torch.promote_types(norm_weight.dtype, torch.float32)
    s = src.to(norm_weight.dtype).to(ct)
    y = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps)
    c = y * norm_weight.to(ct)
    beta = beta_max * torch.sigmoid(c @ gate_weight.to(ct).t() + gate_bias.to(ct))
    v = value_scale * torch.sigmoid(s @ value_weight.to(ct).t() + value_bias.to(ct))
    return c.to(c_dtype or norm_weight.dtype), beta, v
