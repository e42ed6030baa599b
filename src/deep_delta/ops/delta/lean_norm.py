"""The lean path of a delta update fused with the next sublayer's input stage (:func:`deep_delta.ops.delta.update_and_norm`):
the custom ops' kernels off CUDA (:mod:`deep_delta.ops.delta.library`) and their closed-form backwards, built from the
lean update (:mod:`.lean`) and the lean norm, gate and value (:mod:`deep_delta.ops.norm.lean`)."""

from __future__ import annotations

import torch

from deep_delta.ops.norm.lean import (
    missing_grads_as_zeros,
    norm_gate_value_backward_lean,
    norm_gate_value_lean,
)

Tensor = torch.Tensor


def update_norm_forward_lean(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor,
    value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float, beta_max: float, value_scale: float,
    c_dtype: torch.dtype | None = None, rule: str = "delta",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x', c, beta', v') of flattened x, k (N, d), v, beta (N, 1) ((N, 2) for the untied ``rule``): the lean update
    (ops/delta/lean.py), then :func:`norm_gate_value_lean` of x'. No autograd of its own (the custom op's backward
    is :func:`update_norm_backward_lean`)."""
    from deep_delta.ops.delta.lean import rule_forward

    out, _ = rule_forward(rule, x.unsqueeze(-1), k, v, beta, k_eps)
    out = out.squeeze(-1)
    c, beta2, v2 = norm_gate_value_lean(out, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps=eps,
                                        beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype)
    return out, c.contiguous(), beta2.contiguous(), v2.contiguous()


def update_norm_backward_lean(
    g: Tensor, gc: Tensor, gbeta2: Tensor, gv2: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor,
    norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor,
    k_eps: float, eps: float, beta_max: float, value_scale: float, rule: str = "delta",
) -> tuple[Tensor, ...]:
    """The gradients of (x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias) for the
    upstream gradients of (x', c, beta', v'): x' recomputed, the input stage's backward
    (:func:`norm_gate_value_backward_lean`) on it, its gradient of x' added to g in the compute dtype, then the
    update's backward by ``rule`` (ops/delta/lean.py). Each gradient in its input's dtype."""
    from deep_delta.ops.backend import compute_dtype
    from deep_delta.ops.delta.lean import rule_backward, rule_forward

    ct = compute_dtype(x, k, v, beta)
    out, _ = rule_forward(rule, x.unsqueeze(-1), k, v, beta, k_eps)
    # x' as stored, in the compute dtype (exact): the input stage's gradient of x' comes back unrounded
    gsrc, *weight_grads = norm_gate_value_backward_lean(gc, gbeta2, gv2, out.squeeze(-1).to(ct), norm_weight,
                                                        gate_weight, gate_bias, value_weight, value_bias, eps,
                                                        beta_max, value_scale)
    total = (g.to(ct) + gsrc).unsqueeze(-1)
    gx, gk, gv, gb = rule_backward(rule, total, x.to(ct).unsqueeze(-1), k, v, beta, k_eps)
    return (gx.squeeze(-1).to(x.dtype), gk, gv, gb, *weight_grads)


def missing_update_grads(g: Tensor | None, gc: Tensor | None, gbeta2: Tensor | None, gv2: Tensor | None, x: Tensor,
                         norm_weight: Tensor, value_weight: Tensor,
                         gates: int = 1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The upstream gradients of the fused update's (x', c, beta' (N, gates), v') for a flattened x (N, d) or
    (N, d, d_v), contiguous; an unused output's gradient may arrive as None: zeros of its shape."""
    g = torch.zeros_like(x) if g is None else g.contiguous()
    rows = x if x.dim() == 2 else x[..., 0]  # (N, d): the shape of c's gradient
    return (g, *missing_grads_as_zeros(gc, gbeta2, gv2, rows, norm_weight, value_weight, gates))


def update_read_norm_forward_lean(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor, norm_weight: Tensor, gate_weight: Tensor,
    gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float, beta_max: float,
    value_scale: float, c_dtype: torch.dtype | None = None, rule: str = "delta",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x', c, beta', v') of flattened x (N, d, d_v), k (N, d), v (N, d_v), beta (N, 1) ((N, 2) for the untied
    ``rule``), read (d, d_v): the lean update, the CC read of x' (in x's dtype) and :func:`norm_gate_value_lean` of
    it. No autograd of its own."""
    from deep_delta.ops.compress.lean import channel_read
    from deep_delta.ops.delta.lean import rule_forward

    out, _ = rule_forward(rule, x, k, v, beta, k_eps)
    c, beta2, v2 = norm_gate_value_lean(channel_read(out, read), norm_weight, gate_weight, gate_bias, value_weight,
                                        value_bias, eps=eps, beta_max=beta_max, value_scale=value_scale,
                                        c_dtype=c_dtype)
    return out, c.contiguous(), beta2.contiguous(), v2.contiguous()


def update_read_norm_backward_lean(
    g: Tensor, gc: Tensor, gbeta2: Tensor, gv2: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor,
    norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor,
    k_eps: float, eps: float, beta_max: float, value_scale: float, rule: str = "delta",
) -> tuple[Tensor, ...]:
    """The gradients of (x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias): x' and
    x_in recomputed, the input stage's backward on x_in (its gradient of x_in in the compute dtype), then the fused
    update + read's lean backward by ``rule`` (``deep_delta.ops.delta.lean.update_read_backward_lean``)."""
    from deep_delta.ops.backend import compute_dtype
    from deep_delta.ops.compress.lean import channel_read
    from deep_delta.ops.delta.lean import rule_forward, update_read_backward_lean

    ct = compute_dtype(x, k, v, beta)
    out, _ = rule_forward(rule, x, k, v, beta, k_eps)
    gin, *weight_grads = norm_gate_value_backward_lean(gc, gbeta2, gv2, channel_read(out, read).to(ct), norm_weight,
                                                       gate_weight, gate_bias, value_weight, value_bias, eps,
                                                       beta_max, value_scale)
    return (*update_read_backward_lean(g, gin, x, out, k, v, beta, read, k_eps, rule), *weight_grads)
