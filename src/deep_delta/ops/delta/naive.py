"""Plain PyTorch reference of the delta update (eq. 2.5) and the Delta Operator (eq. 2.3).

Every faster implementation in :mod:`deep_delta.ops` is tested against these functions.
"""

from __future__ import annotations

import math

import torch

from deep_delta.ops.backend import compute_dtype
from deep_delta.ops.delta.rules import rule_spec


def unit_direction(
    k: torch.Tensor, k_eps: float = 1e-5, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, rho): the unit direction ``u = k rho`` (..., d) and ``rho = 1 / sqrt(|k|^2 + k_eps^2)`` (..., 1).

    The one definition of the normalisation: the reference, the lean path and the state rebuild of
    ``recompute_states`` call it (the Triton kernels compute the same expression in registers). Written as
    the precision-friendly RMSNorm of section 4.1, ``rsqrt(mean(k^2) + k_eps^2 / d)``, with the 1/sqrt(d)
    scale applied last. In ``dtype``, default fp32 (fp64 when k is fp64).
    """
    d = k.shape[-1]
    kf = k.to(dtype or compute_dtype(k))
    rho = torch.rsqrt(kf.square().mean(-1, keepdim=True) + (k_eps * k_eps) / d) * (1.0 / math.sqrt(d))
    return kf * rho, rho


def delta_update_reference(
    x: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    k_eps: float = 1e-5,
    *,
    erase: bool = True,
    beta_erase: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference ``x + beta k (v^T - k^T x)`` with k normalised inside; shapes already validated. The three update
    rules of ``DDLConfig.update_rule`` are this one function:

    - "delta" (the paper): as written;
    - "write" (``erase=False``): the write-only control ``x + beta k v^T`` (the update without its read ``k^T x``:
      nothing of the state is erased; :func:`deep_delta.ops.delta.write_update`);
    - "untied" (``beta_erase`` given, (..., 1)): ``x + k (beta v^T - beta_erase k^T x)``, the erase and the write
      with gates of their own, beta the write gate (:func:`deep_delta.ops.delta.untied_update`). Tied gates
      (``beta_erase == beta``) give the delta rule, ``beta_erase == 0`` the write-only control.

    x: (..., d, d_v), k: (..., d), v: (..., d_v), beta: (..., 1). Returns (..., d, d_v) in x.dtype.
    The gate and value math and the projection ``u^T x`` run in fp32 (fp64 if any input is fp64).
    """
    if beta_erase is not None and not erase:
        raise ValueError("delta_update_reference: `beta_erase` (the untied erase gate) needs erase=True")
    ct = compute_dtype(x, k, v, beta, *(() if beta_erase is None else (beta_erase,)))
    u, _ = unit_direction(k, k_eps, ct)  # (..., d)
    # project: p = u^T x, a reduction over d in the compute dtype (the write-only control reads nothing)
    p = torch.matmul(u.unsqueeze(-2), x.to(ct)).squeeze(-2) if erase else 0.0  # (..., d_v)
    # compare: beta * (v - u^T x); small, (..., d_v); untied: beta v - beta_erase u^T x
    if beta_erase is None:
        delta = beta.to(ct) * (v.to(ct) - p)
    else:
        delta = beta.to(ct) * v.to(ct) - beta_erase.to(ct) * p
    # write: rank-1 update of the state
    update = u.unsqueeze(-1) * delta.unsqueeze(-2)
    return x + update.to(x.dtype)


def rule_reference(rule: str, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                   k_eps: float = 1e-5) -> torch.Tensor:
    """:func:`delta_update_reference` of an update rule (``DDLConfig.update_rule``) with its gates as one tensor, as
    the fused ops take them: beta (..., 1) for "delta" and "write", (..., 2) = (erase, write) for "untied"
    (:mod:`deep_delta.ops.delta.rules`)."""
    spec = rule_spec(rule)
    if spec.erase_gate:
        return delta_update_reference(x, k, v, beta[..., 1:], k_eps, beta_erase=beta[..., :1])
    return delta_update_reference(x, k, v, beta, k_eps, erase=spec.reads)


def delta_operator_reference(k: torch.Tensor, beta: torch.Tensor, k_eps: float = 1e-5) -> torch.Tensor:
    """Dense Delta Operator ``A = I - beta k k^T`` (eq. 2.3) with k normalised like in the update.

    k: (..., d), beta: (..., 1) -> (..., d, d) in fp32 (fp64 when k is fp64).
    """
    d = k.shape[-1]
    u, _ = unit_direction(k, k_eps)
    eye = torch.eye(d, dtype=u.dtype, device=k.device)
    return eye - beta.to(u.dtype).unsqueeze(-1) * u.unsqueeze(-1) * u.unsqueeze(-2)


def update_and_norm_reference(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, norm_weight: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor,
    value_weight: torch.Tensor, value_bias: torch.Tensor, *, read: torch.Tensor | None = None, k_eps: float, eps: float,
    beta_max: float, value_scale: float, c_dtype: torch.dtype | None = None, rule: str = "delta",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An update (by ``rule``: :func:`rule_reference`) and the next sublayer's input stage of the new state, one after
    the other: without ``read``
    a d_v = 1 state x (..., d), k (..., d), v (..., 1), beta (..., 1), ``x' = delta_update_reference(x, k, v,
    beta)`` and ``(c, beta', v') = norm_gate_value_reference(x', ...)``; with ``read`` (d, d_v) x (..., d, d_v),
    v (..., d_v), and the input stage of ``x_in = channel_compress_reference(x', read)``. Returns
    (x', c, beta', v')."""
    from deep_delta.ops.compress.naive import channel_compress_reference
    from deep_delta.ops.norm.naive import norm_gate_value_reference

    if read is None:
        out = rule_reference(rule, x.unsqueeze(-1), k, v, beta, k_eps).squeeze(-1)
        x_in = out
    else:
        out = rule_reference(rule, x, k, v, beta, k_eps)
        x_in = channel_compress_reference(out, read)
    return (out, *norm_gate_value_reference(x_in, norm_weight, gate_weight, gate_bias, value_weight, value_bias,
                                            eps=eps, beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype))
