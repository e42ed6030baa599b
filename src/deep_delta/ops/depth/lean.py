"""Lean depth attention (``backend="torch"``): a custom autograd Function over the sources as they are.

The reference stacks the n sources into a new (..., n, d) tensor and its autograd keeps that stack and the
normalised keys, per sublayer: with Full AttnRes the n-th sublayer would keep n state-sized copies. This path
takes the sources as separate tensors (the model keeps them anyway), keeps only them and the weights (..., n)
for backward, and forms nothing of state size but the output and the gradients. With ``w = q * g`` (query and
norm gain), ``r_i = rsqrt(mean(V_i^2) + eps)``, ``s_i = r_i w^T V_i`` and ``alpha = softmax(s)``:

    forward:   h = sum_i alpha_i V_i
    backward:  a_i = G^T V_i,   ds_i = alpha_i (a_i - sum_j alpha_j a_j)
               dV_i = alpha_i G + ds_i r_i (w - s_i r_i V_i / d)
               dw = sum_{tokens, i} ds_i r_i V_i,   dq = dw * g,   dg = dw * q
"""

from __future__ import annotations

import torch

from deep_delta.ops.backend import compute_dtype


def _logits(sources: tuple[torch.Tensor, ...], w: torch.Tensor, eps: float,
            ct: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, r): the logits ``r_i w^T V_i`` and the inverse RMS ``r_i``, each (..., n) in ct."""
    rs, dots = [], []
    for src in sources:
        sf = src.to(ct)
        rs.append(torch.rsqrt(sf.square().mean(-1) + eps))
        dots.append(sf @ w)
    r = torch.stack(rs, dim=-1)
    return torch.stack(dots, dim=-1) * r, r


def _forward(query: torch.Tensor, norm_weight: torch.Tensor, eps: float, sources: tuple[torch.Tensor, ...]
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h, alpha, s, r): the output in the sources' dtype, the weights, the logits and the inverse RMS (..., n)."""
    ct = compute_dtype(query, norm_weight, *sources)
    w = query.to(ct) * norm_weight.to(ct)
    s, r = _logits(sources, w, eps, ct)
    alpha = torch.softmax(s, dim=-1)
    out = alpha[..., 0:1] * sources[0].to(ct)
    for i in range(1, len(sources)):
        out = torch.addcmul(out, alpha[..., i:i + 1], sources[i].to(ct))
    return out.to(sources[0].dtype), alpha, s, r


class DepthAttentionFunction(torch.autograd.Function):
    """``sum_i softmax(s)_i V_i``; query, norm_weight: (d,); sources: n tensors (..., d) of one dtype."""

    @staticmethod
    def forward(ctx, query, norm_weight, eps: float, *sources):
        out, alpha, s, r = _forward(query, norm_weight, eps, sources)
        ctx.save_for_backward(query, norm_weight, alpha, s, r, *sources)
        ctx.ct = alpha.dtype
        return out

    @staticmethod
    def backward(ctx, g):
        query, norm_weight, alpha, s, r, *sources = ctx.saved_tensors
        ct = ctx.ct
        gf = g.to(ct)
        d = gf.shape[-1]
        qf, nf = query.to(ct), norm_weight.to(ct)
        w = qf * nf
        a = torch.stack([(gf * src.to(ct)).sum(-1) for src in sources], dim=-1)  # (..., n)
        ds = alpha * (a - (alpha * a).sum(-1, keepdim=True))
        coef = ds * r  # (..., n)
        grads, dw = [], torch.zeros_like(w)
        for i, src in enumerate(sources):
            sf = src.to(ct)
            ci = coef[..., i:i + 1]
            dv = alpha[..., i:i + 1] * gf + ci * w - (ci * s[..., i:i + 1] * r[..., i:i + 1] / d) * sf
            grads.append(dv.to(src.dtype))
            dw = dw + (ci * sf).reshape(-1, d).sum(0)
        dq = (dw * nf).to(query.dtype) if ctx.needs_input_grad[0] else None
        dn = (dw * qf).to(norm_weight.dtype) if ctx.needs_input_grad[1] else None
        return (dq, dn, None, *grads)


def depth_attention_lean(sources: tuple[torch.Tensor, ...], query: torch.Tensor, norm_weight: torch.Tensor,
                         eps: float) -> torch.Tensor:
    """Lean :func:`deep_delta.ops.depth.naive.depth_attention_reference`; shapes already validated. Without a
    gradient to keep (inference, decoding) the forward alone: no autograd Function, nothing saved."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, norm_weight, *sources)):
        return DepthAttentionFunction.apply(query, norm_weight, float(eps), *sources)
    return _forward(query, norm_weight, float(eps), sources)[0]
