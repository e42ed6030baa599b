"""Plain PyTorch reference of the delta update (eq. 2.5) and the Delta Operator (eq. 2.3).

Every faster implementation in :mod:`deep_delta.ops` is tested against these functions.
"""

from __future__ import annotations

import math

import torch


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs, fp64 when any input is fp64 (gradcheck)."""
    out = torch.float32
    for t in tensors:
        out = torch.promote_types(out, t.dtype)
    return out


def normalize_direction(k: torch.Tensor, k_eps: float = 1e-5) -> torch.Tensor:
    """Precision-friendly direction (section 4.1) *without* its 1/sqrt(d) scale, in fp32 (fp64 stays).

    ``k_hat = k / sqrt(mean(k^2) + k_eps^2 / d)``; the unit direction is ``k_hat / sqrt(d)``, which equals
    ``k / sqrt(|k|^2 + k_eps^2)``. Keeping 1/sqrt(d) outside the dot products keeps intermediates O(1).

    k: (..., d) -> (..., d).
    """
    d = k.shape[-1]
    kf = k.to(compute_dtype(k))
    return kf * torch.rsqrt(kf.square().mean(-1, keepdim=True) + (k_eps * k_eps) / d)


def delta_update_torch(
    x: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    k_eps: float = 1e-5,
) -> torch.Tensor:
    """Reference ``x + beta k (v^T - k^T x)`` with k normalised inside; shapes already validated.

    x: (..., d, d_v), k: (..., d), v: (..., d_v), beta: (..., 1). Returns (..., d, d_v) in x.dtype.
    The gate and value math and the reduction ``k^T x`` run in fp32 (fp64 if any input is fp64).
    """
    d = x.shape[-2]
    ct = compute_dtype(x, k, v, beta)
    scale = 1.0 / math.sqrt(d)
    k_hat = normalize_direction(k, k_eps).to(ct)  # (..., d)
    # read: k^T x, a reduction over d in the compute dtype
    proj = torch.matmul(k_hat.unsqueeze(-2), x.to(ct)).squeeze(-2)  # (..., d_v)
    # compare: beta * (v - k^T x); small, (..., d_v)
    delta = beta.to(ct) * (v.to(ct) - proj * scale)
    # write: rank-1 update of the state
    update = (k_hat * scale).unsqueeze(-1) * delta.unsqueeze(-2)
    return x + update.to(x.dtype)


def delta_operator_torch(k: torch.Tensor, beta: torch.Tensor, k_eps: float = 1e-5) -> torch.Tensor:
    """Dense Delta Operator ``A = I - beta k k^T`` (eq. 2.3) with k normalised like in the update.

    k: (..., d), beta: (..., 1) -> (..., d, d) in fp32 (fp64 when k is fp64).
    """
    d = k.shape[-1]
    unit = normalize_direction(k, k_eps) / math.sqrt(d)
    eye = torch.eye(d, dtype=unit.dtype, device=k.device)
    return eye - beta.to(unit.dtype).unsqueeze(-1) * unit.unsqueeze(-1) * unit.unsqueeze(-2)
