"""The lean PyTorch path of the sublayer's input stage (the CPU target): what :class:`DeltaResidual` computed
before this op existed, the same ops in the same order, so values and autograd's gradients are bit for bit
the module's (``norm_gate_value_lean``, and its two halves ``rms_norm_lean`` and ``gate_value_lean``, which
:class:`DeltaResidual` calls around its branch); and the closed-form backward (``norm_gate_value_backward_lean``)
that the custom op ``deep_delta::norm_gate_value_backward`` runs off CUDA (:mod:`.library`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def rms_norm_lean(src: Tensor, norm_weight: Tensor, eps: float) -> Tensor:
    """c = ``nn.RMSNorm``'s forward of src (..., d), read in the norm weight's dtype."""
    src = src.to(norm_weight.dtype)  # a state stored in lower precision is read in the module's dtype
    return F.rms_norm(src, (src.shape[-1],), norm_weight, eps)


def gate_value_lean(c: Tensor, src: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor,
                    value_bias: Tensor, *, beta_max: float, value_scale: float) -> tuple[Tensor, Tensor]:
    """(beta, v) from c (..., d) and src (..., d) (already in the norm weight's dtype), as ``BetaGate(kind="linear")``
    and the k-Map's value projection compute them: the gate in fp32 with autocast off, the value projection in
    the autocast dtype under autocast (as ``nn.Linear``), then its sigmoid in fp32."""
    with torch.autocast(device_type=c.device.type, enabled=False):
        ct = torch.promote_types(c.dtype, torch.float32)  # fp32 logits; fp64 stays fp64 (gradcheck)
        logit = F.linear(c.to(ct), gate_weight.to(ct), gate_bias.to(ct))
        beta = beta_max * torch.sigmoid(logit)
    v = value_scale * torch.sigmoid(F.linear(src, value_weight, value_bias).to(torch.promote_types(src.dtype,
                                                                                                 torch.float32)))
    return beta, v


def norm_gate_value_lean(
    src: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor,
    value_bias: Tensor, *, eps: float, beta_max: float, value_scale: float, c_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(c, beta, v): :func:`rms_norm_lean`, then :func:`gate_value_lean` (autograd through these ops gives the
    gradients); c cast to c_dtype last (the gate reads it before). Shapes: :func:`deep_delta.ops.norm.norm_gate_value`.

    :class:`DeltaResidual` calls the two halves around its branch (the gate's and the value's autograd nodes
    then come after the branch's, as before this op existed, so autograd sums the gradient of c in the same
    order: bit for bit the module's gradients).
    """
    src = src.to(norm_weight.dtype)
    c = rms_norm_lean(src, norm_weight, eps)
    beta, v = gate_value_lean(c, src, gate_weight, gate_bias, value_weight, value_bias, beta_max=beta_max,
                              value_scale=value_scale)
    return (c if c_dtype is None else c.to(c_dtype)), beta, v


def norm_gate_value_backward_lean(
    gc: Tensor, gbeta: Tensor, gv: Tensor, src: Tensor, norm_weight: Tensor, gate_weight: Tensor,
    gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, eps: float, beta_max: float, value_scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients (src, norm_weight, gate_weight, gate_bias, value_weight, value_bias) for the upstream
    gradients gc (N, d), gbeta (N, 1), gv (N, d_v); src (N, d). Recomputes the forward (nothing but src saved):

        r = rsqrt(mean(s^2) + eps), y = s r, c = y g          (s = src in the norm weight's dtype)
        dlogit_g = gbeta beta_max s_g (1 - s_g),  dlogit_v = gv value_scale s_v (1 - s_v)
        gc_tot = gc + dlogit_g w_g,  dy = gc_tot g
        grad_src = r (dy - y mean(dy y)) + dlogit_v W_v
        grad_g = sum_n gc_tot y,  grad_w_g = sum_n dlogit_g c,  grad_b_g = sum_n dlogit_g,
        grad_W_v = dlogit_v^T s,  grad_b_v = sum_n dlogit_v
    All in fp32 (fp64 for fp64 weights); each gradient in its input's dtype.
    """
    ct = torch.promote_types(norm_weight.dtype, torch.float32)
    s = src.to(norm_weight.dtype).to(ct)
    g, wg, bg, wv, bv = (t.to(ct) for t in (norm_weight, gate_weight, gate_bias, value_weight, value_bias))
    r = torch.rsqrt(s.square().mean(-1, keepdim=True) + eps)
    y = s * r
    c = y * g
    sg = torch.sigmoid(c @ wg.t() + bg)
    sv = torch.sigmoid(s @ wv.t() + bv)
    dlg = gbeta.to(ct) * beta_max * sg * (1 - sg)
    dlv = gv.to(ct) * value_scale * sv * (1 - sv)
    gct = gc.to(ct) + dlg * wg
    dy = gct * g
    gsrc = r * (dy - y * (dy * y).mean(-1, keepdim=True)) + dlv @ wv
    return (gsrc.to(src.dtype), (gct * y).sum(0).to(norm_weight.dtype), (dlg.t() @ c).to(gate_weight.dtype),
            dlg.sum(0).to(gate_bias.dtype), (dlv.t() @ s).to(value_weight.dtype), dlv.sum(0).to(value_bias.dtype))


def out_dtype(norm_weight: Tensor) -> torch.dtype:
    """The dtype of beta and v: fp32, or fp64 for fp64 weights (c has the norm weight's dtype)."""
    return torch.promote_types(norm_weight.dtype, torch.float32)


def missing_grads_as_zeros(gc: Tensor | None, gbeta: Tensor | None, gv: Tensor | None, src: Tensor,
                           norm_weight: Tensor, value_weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The upstream gradients of (c, beta, v) for a flattened src (N, d), contiguous; an unused output's
    gradient may arrive as None: zeros of its shape."""
    n, d = src.shape
    ct = out_dtype(norm_weight)
    gc = src.new_zeros(n, d, dtype=norm_weight.dtype) if gc is None else gc.contiguous()
    gbeta = src.new_zeros(n, 1, dtype=ct) if gbeta is None else gbeta.contiguous()
    gv = src.new_zeros(n, value_weight.shape[0], dtype=ct) if gv is None else gv.contiguous()
    return gc, gbeta, gv


def update_norm_forward_lean(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor,
    value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float, beta_max: float, value_scale: float,
    c_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x', c, beta', v') of flattened x, k (N, d), v, beta (N, 1): the lean update (ops/delta/lean.py), then
    :func:`norm_gate_value_lean` of x'. No autograd of its own (the custom op's backward is
    :func:`update_norm_backward_lean`)."""
    from deep_delta.ops.delta.lean import lean_forward

    out, _ = lean_forward(x.unsqueeze(-1), k, v, beta, k_eps)
    out = out.squeeze(-1)
    c, beta2, v2 = norm_gate_value_lean(out, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps=eps,
                                        beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype)
    return out, c.contiguous(), beta2.contiguous(), v2.contiguous()


def update_norm_backward_lean(
    g: Tensor, gc: Tensor, gbeta2: Tensor, gv2: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor,
    norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor,
    k_eps: float, eps: float, beta_max: float, value_scale: float,
) -> tuple[Tensor, ...]:
    """The gradients of (x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias) for the
    upstream gradients of (x', c, beta', v'): x' recomputed, the input stage's backward
    (:func:`norm_gate_value_backward_lean`) on it, its gradient of x' added to g in the compute dtype, then the
    update's backward (ops/delta/lean.py). Each gradient in its input's dtype."""
    from deep_delta.ops.delta.lean import lean_backward, lean_forward
    from deep_delta.ops.delta.naive import compute_dtype

    ct = compute_dtype(x, k, v, beta)
    out, _ = lean_forward(x.unsqueeze(-1), k, v, beta, k_eps)
    # x' as stored, in the compute dtype (exact): the input stage's gradient of x' comes back unrounded
    gsrc, *weight_grads = norm_gate_value_backward_lean(gc, gbeta2, gv2, out.squeeze(-1).to(ct), norm_weight,
                                                        gate_weight, gate_bias, value_weight, value_bias, eps,
                                                        beta_max, value_scale)
    total = (g.to(ct) + gsrc).unsqueeze(-1)
    gx, gk, gv, gb = lean_backward(total, x.to(ct).unsqueeze(-1), k, v, beta, k_eps)
    return (gx.squeeze(-1).to(x.dtype), gk, gv, gb, *weight_grads)


def missing_update_grads(g: Tensor | None, gc: Tensor | None, gbeta2: Tensor | None, gv2: Tensor | None, x: Tensor,
                         norm_weight: Tensor, value_weight: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The upstream gradients of the fused update's (x', c, beta', v') for a flattened x (N, d) or (N, d, d_v),
    contiguous; an unused output's gradient may arrive as None: zeros of its shape."""
    g = torch.zeros_like(x) if g is None else g.contiguous()
    rows = x if x.dim() == 2 else x[..., 0]  # (N, d): the shape of c's gradient
    return (g, *missing_grads_as_zeros(gc, gbeta2, gv2, rows, norm_weight, value_weight))


def update_read_norm_forward_lean(
    x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor, norm_weight: Tensor, gate_weight: Tensor,
    gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor, k_eps: float, eps: float, beta_max: float,
    value_scale: float, c_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x', c, beta', v') of flattened x (N, d, d_v), k (N, d), v (N, d_v), beta (N, 1), read (d, d_v): the lean
    update, the CC read of x' (in x's dtype) and :func:`norm_gate_value_lean` of it. No autograd of its own."""
    from deep_delta.ops.compress.lean import channel_read
    from deep_delta.ops.delta.lean import lean_forward

    out, _ = lean_forward(x, k, v, beta, k_eps)
    c, beta2, v2 = norm_gate_value_lean(channel_read(out, read), norm_weight, gate_weight, gate_bias, value_weight,
                                        value_bias, eps=eps, beta_max=beta_max, value_scale=value_scale,
                                        c_dtype=c_dtype)
    return out, c.contiguous(), beta2.contiguous(), v2.contiguous()


def update_read_norm_backward_lean(
    g: Tensor, gc: Tensor, gbeta2: Tensor, gv2: Tensor, x: Tensor, k: Tensor, v: Tensor, beta: Tensor, read: Tensor,
    norm_weight: Tensor, gate_weight: Tensor, gate_bias: Tensor, value_weight: Tensor, value_bias: Tensor,
    k_eps: float, eps: float, beta_max: float, value_scale: float,
) -> tuple[Tensor, ...]:
    """The gradients of (x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias): x' and
    x_in recomputed, the input stage's backward on x_in (its gradient of x_in in the compute dtype), then the fused
    update + read's lean backward (``deep_delta.ops.delta.library.update_read_backward_lean``)."""
    from deep_delta.ops.compress.lean import channel_read
    from deep_delta.ops.delta.lean import lean_forward
    from deep_delta.ops.delta.library import update_read_backward_lean
    from deep_delta.ops.delta.naive import compute_dtype

    ct = compute_dtype(x, k, v, beta)
    out, _ = lean_forward(x, k, v, beta, k_eps)
    gin, *weight_grads = norm_gate_value_backward_lean(gc, gbeta2, gv2, channel_read(out, read).to(ct), norm_weight,
                                                       gate_weight, gate_bias, value_weight, value_bias, eps,
                                                       beta_max, value_scale)
    return (*update_read_backward_lean(g, gin, x, out, k, v, beta, read, k_eps), *weight_grads)
