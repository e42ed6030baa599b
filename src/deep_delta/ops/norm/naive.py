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
    """src (..., d), norm_weight (d,), gate_weight (1, d), gate_bias (1,), value_weight (d_v, d), value_bias (d_v,).

    Returns c (..., d) in c_dtype (None: norm_weight's dtype; the gate reads c unrounded), beta (..., 1) and v (..., d_v) in fp32 (fp64 for fp64 weights).
    """
    ct = torch.promote_types(norm_weight.dtype, torch.float32)
    s = src.to(norm_weight.dtype).to(ct)
    y = s * torch.rsqrt(s.square().mean(-1, keepdim=True) + eps)
    c = y * norm_weight.to(ct)
    beta = beta_max * torch.sigmoid(c @ gate_weight.to(ct).t() + gate_bias.to(ct))
    v = value_scale * torch.sigmoid(s @ value_weight.to(ct).t() + value_bias.to(ct))
    return c.to(c_dtype or norm_weight.dtype), beta, v


def update_and_norm_reference(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor,
    value_weight: Tensor, value_bias: Tensor, *, read: Tensor | None = None, k_eps: float, eps: float,
    beta_max: float, value_scale: float, c_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A delta update and the next sublayer's input stage of the new state, one after the other: without ``read``
    a d_v = 1 state x (..., d), k (..., d), v (..., 1), beta (..., 1), ``x' = delta_update_reference(x, k, v,
    beta)`` and ``(c, beta', v') = norm_gate_value_reference(x', ...)``; with ``read`` (d, d_v) x (..., d, d_v),
    v (..., d_v), and the input stage of ``x_in = channel_compress_reference(x', read)``. Returns
    (x', c, beta', v')."""
    from deep_delta.ops.compress.naive import channel_compress_reference
    from deep_delta.ops.delta.naive import delta_update_reference

    if read is None:
        out = delta_update_reference(x.unsqueeze(-1), k, v, beta, k_eps).squeeze(-1)
        x_in = out
    else:
        out = delta_update_reference(x, k, v, beta, k_eps)
        x_in = channel_compress_reference(out, read)
    return (out, *norm_gate_value_reference(x_in, norm_weight, gate_weight, gate_bias, value_weight, value_bias,
                                            eps=eps, beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype))
