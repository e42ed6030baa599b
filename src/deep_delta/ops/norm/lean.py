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
    gradients gc (N, d), gbeta (N, G) (G gate outputs: w_g (G, d)), gv (N, d_v); src (N, d). Recomputes the
    forward (nothing but src saved):

        r = rsqrt(mean(s^2) + eps), y = s r, c = y g          (s = src in the norm weight's dtype)
        dlogit_g = gbeta beta_max s_g (1 - s_g),  dlogit_v = gv value_scale s_v (1 - s_v)
        gc_tot = gc + dlogit_g w_g (summed over the gates),  dy = gc_tot g
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
    gct = gc.to(ct) + (dlg * wg if wg.shape[0] == 1 else dlg @ wg)  # each gate's term: (N, G) (G, d)
    dy = gct * g
    gsrc = r * (dy - y * (dy * y).mean(-1, keepdim=True)) + dlv @ wv
    return (gsrc.to(src.dtype), (gct * y).sum(0).to(norm_weight.dtype), (dlg.t() @ c).to(gate_weight.dtype),
            dlg.sum(0).to(gate_bias.dtype), (dlv.t() @ s).to(value_weight.dtype), dlv.sum(0).to(value_bias.dtype))


def out_dtype(norm_weight: Tensor) -> torch.dtype:
    """The dtype of beta and v: fp32, or fp64 for fp64 weights (c has the norm weight's dtype)."""
    return torch.promote_types(norm_weight.dtype, torch.float32)


def missing_grads_as_zeros(gc: Tensor | None, gbeta: Tensor | None, gv: Tensor | None, src: Tensor,
                           norm_weight: Tensor, value_weight: Tensor, gates: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """The upstream gradients of (c, beta (N, gates), v) for a flattened src (N, d), contiguous; an unused output's
    gradient may arrive as None: zeros of its shape."""
    n, d = src.shape
    ct = out_dtype(norm_weight)
    gc = src.new_zeros(n, d, dtype=norm_weight.dtype) if gc is None else gc.contiguous()
    gbeta = src.new_zeros(n, gates, dtype=ct) if gbeta is None else gbeta.contiguous()
    gv = src.new_zeros(n, value_weight.shape[0], dtype=ct) if gv is None else gv.contiguous()
    return gc, gbeta, gv
