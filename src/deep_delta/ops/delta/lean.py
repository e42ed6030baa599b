"""Lean PyTorch delta update: the ``backend="torch"`` path, a custom autograd Function.

Same math as :func:`deep_delta.ops.delta.naive.delta_update_reference` (the plain reference it is tested
against), written to touch the (N, d, d_v) state as few times as possible:

- forward: one read of x for ``p = u^T x`` (a batched mat-vec) and one fused read-write
  ``x + u delta^T`` (``addcmul``); no fp32 copy of the state, no saved intermediates of state size.
- backward: saves only x (alive anyway: it is the previous layer's output), the raw k, v and beta;
  recomputes the unit direction u and ``p`` (cheap, (N, d) and (N, d_v)) and computes

      a      = u^T G                       (N, d_v)
      grad_x = G - u (beta a)^T            one read of G, one write
      grad_u = G delta - beta x a          one read of G and x each
      grad_k = rho (grad_u - u (u . grad_u)),   rho = 1 / sqrt(|k|^2 + eps^2)
      grad_v = beta a,  grad_beta = sum_j a_j (v_j - p_j)

  where ``u = k rho`` is the unit direction and ``delta = beta (v - p)``.

The untied gates (``update_rule="untied"``) are a mode of the same Function: with the erase gate ``beta_e``
beside the write gate ``beta``, ``delta = beta v - beta_e p``, ``gp = -beta_e a``, ``grad_beta = sum_j a_j v_j``
and ``grad_beta_e = -sum_j a_j p_j``; every other line is the same. The write-only control (``erase=False`` in
:func:`lean_forward` / :func:`lean_backward`, the custom ops' lean kernels) reads nothing: ``p = 0``, ``gp = 0``
(``grad_x = G``, ``grad_u = G delta``), ``grad_beta = sum_j a_j v_j``. :func:`rule_gates` and
:func:`rule_grads` turn the kernels' one gate tensor per rule (beta (N, 1), or (N, 2) = (beta_e, beta_w) for the
untied rule) into these arguments and back.
"""

from __future__ import annotations

import math

import torch

from deep_delta.ops.backend import compute_dtype
from deep_delta.ops.delta.naive import unit_direction
from deep_delta.ops.delta.recompute import active_tape, delta_rebuild
from deep_delta.ops.delta.rules import rule_spec


def _project(u: torch.Tensor, x: torch.Tensor, ct: torch.dtype) -> torch.Tensor:
    """The projection ``p = u^T x`` (N, d_v) in the compute dtype: one batched mat-vec over the state.

    fp32/fp64 states are read in place. A bf16/fp16 state is read through an fp32 copy so that p is not
    rounded (p - v can cancel; its rounding error would land on the whole update). That copy is transient
    and only on this reference path; the Triton kernel reads bf16 and accumulates in fp32 directly.
    """
    if x.dtype == ct:
        return torch.bmm(u.unsqueeze(1), x).squeeze(1)
    return torch.bmm(u.unsqueeze(1), x.to(ct)).squeeze(1)


def _gated(beta: torch.Tensor, v: torch.Tensor, p: torch.Tensor, beta_erase: torch.Tensor | None,
           ct: torch.dtype) -> torch.Tensor:
    """``delta``, (N, d_v) in ct: ``beta (v - p)`` (tied gates), or ``beta v - beta_erase p`` (untied)."""
    if beta_erase is None:
        return beta.to(ct) * (v.to(ct) - p)
    return beta.to(ct) * v.to(ct) - beta_erase.to(ct) * p


def rule_gates(rule: str, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
    """(beta_write, beta_erase or None, erase) of an update rule's gate tensor as the kernels take it: beta (N, 1)
    for "delta" and "write" (erase False: the rule reads nothing), (N, 2) = (beta_e, beta_w) for "untied"
    (:mod:`.rules`)."""
    spec = rule_spec(rule)
    if spec.erase_gate:
        return beta[:, 1:], beta[:, :1], True
    return beta, None, spec.reads


def rule_grads(rule: str, grads: tuple) -> tuple:
    """:func:`lean_backward`'s gradients as the rule's inputs take them: (grad_x, grad_k, grad_v, grad_beta), the
    untied rule's two gate gradients joined as (N, 2) = (erase, write)."""
    if not rule_spec(rule).erase_gate:
        return grads
    *first, grad_write, grad_erase = grads
    return (*first, torch.cat([grad_erase, grad_write], dim=-1))


def lean_forward(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, k_eps: float,
    beta_erase: torch.Tensor | None = None, erase: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x', delta): the new state ``x + u delta^T`` (N, d, d_v) in x.dtype and ``delta = beta (v - u^T x)``
    (N, d_v) in the compute dtype. x: (N, d, d_v), k: (N, d), v: (N, d_v), beta: (N, 1); ``beta_erase`` (N, 1):
    the untied erase gate, ``delta = beta v - beta_erase u^T x``; ``erase=False``: the write-only control,
    ``delta = beta v`` (x not read)."""
    ct = compute_dtype(x, k, v, beta)
    u, _ = unit_direction(k, k_eps, ct)
    xd = x.dtype
    p = _project(u, x, ct) if erase else 0.0  # (N, d_v)
    delta = _gated(beta, v, p, beta_erase, ct)  # (N, d_v)
    return torch.addcmul(x, u.to(xd).unsqueeze(-1), delta.to(xd).unsqueeze(1)), delta


def lean_backward(
    g: torch.Tensor,
    x: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    k_eps: float,
    needs: tuple[bool, ...] = (True, True, True, True),
    beta_erase: torch.Tensor | None = None,
    erase: bool = True,
) -> tuple[torch.Tensor | None, ...]:
    """(grad_x, grad_k, grad_v, grad_beta) of the update for the upstream gradient g (N, d, d_v), each in its
    input's dtype (None where ``needs`` is False); recomputes u, p and delta from the inputs. With the untied
    erase gate ``beta_erase`` (N, 1), also its gradient: (grad_x, grad_k, grad_v, grad_beta, grad_beta_erase)
    (``needs`` then has five entries). ``erase=False``: the write-only control (no read, so G alone is grad_x and
    x takes no part)."""
    ct = compute_dtype(x, k, v, beta)
    xd = x.dtype
    u, rho = unit_direction(k, k_eps, ct)
    ux = u.to(xd)
    g = g.contiguous()
    p = _project(u, x, ct) if erase else 0.0
    bf = beta.to(ct)
    vf = v.to(ct)
    delta = _gated(beta, v, p, beta_erase, ct)
    a = torch.bmm(ux.unsqueeze(1), g).squeeze(1).to(ct)  # (N, d_v) = u^T G
    gp = -(bf if beta_erase is None else beta_erase.to(ct)) * a  # dL/dp
    grad_x = grad_k = grad_v = grad_beta = None
    if needs[0]:
        grad_x = torch.addcmul(g, ux.unsqueeze(-1), gp.to(xd).unsqueeze(1)) if erase else g.clone()
    if needs[1]:
        # grad_u = G delta + x gp, two mat-vecs over the state (accumulated in fp32)
        gu = torch.bmm(g, delta.to(g.dtype).unsqueeze(-1)).squeeze(-1).to(ct)
        if erase:
            gu = gu + torch.bmm(x, gp.to(xd).unsqueeze(-1)).squeeze(-1).to(ct)
        grad_k = (rho * (gu - u * (u * gu).sum(-1, keepdim=True))).to(k.dtype)
    if needs[2]:
        grad_v = (bf * a).to(v.dtype)
    if beta_erase is None:
        if needs[3]:
            grad_beta = (a * (vf - p)).sum(-1, keepdim=True).to(beta.dtype)
        return grad_x, grad_k, grad_v, grad_beta
    if needs[3]:
        grad_beta = (a * vf).sum(-1, keepdim=True).to(beta.dtype)
    grad_erase = -(a * p).sum(-1, keepdim=True).to(beta_erase.dtype) if needs[4] else None
    return grad_x, grad_k, grad_v, grad_beta, grad_erase


class DeltaUpdateFunction(torch.autograd.Function):
    """``x + beta u (v^T - u^T x)``; x: (N, d, d_v), k: (N, d), v: (N, d_v), beta: (N, 1). With ``beta_erase``
    (N, 1), the untied gates: ``x + u (beta v^T - beta_erase u^T x)``."""

    @staticmethod
    def forward(ctx, x, k, v, beta, k_eps: float, beta_erase=None):
        out, delta = lean_forward(x, k, v, beta, k_eps, beta_erase)
        tape = active_tape()
        if tape is not None:  # x is saved as a handle that rebuilds it from out (see recompute.py)
            tape.record(x, out, delta_rebuild(k, delta, k_eps))
        ctx.save_for_backward(x, k, v, beta, beta_erase)
        ctx.k_eps = k_eps
        return out

    @staticmethod
    def backward(ctx, g):
        x, k, v, beta, beta_erase = ctx.saved_tensors
        if beta_erase is None:
            return (*lean_backward(g, x, k, v, beta, ctx.k_eps, ctx.needs_input_grad[:4]), None, None)
        needs = ctx.needs_input_grad[:4] + ctx.needs_input_grad[5:6]
        *grads, grad_erase = lean_backward(g, x, k, v, beta, ctx.k_eps, needs, beta_erase)
        return (*grads, None, grad_erase)


def delta_update_lean(
    x: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    k_eps: float = 1e-5,
) -> torch.Tensor:
    """Lean ``x + beta k (v^T - k^T x)`` (k normalised inside); shapes already validated.

    x: (..., d, d_v), k: (..., d), v: (..., d_v), beta: (..., 1). Returns (..., d, d_v) in x.dtype.
    """
    *lead, d, dv = x.shape
    n = math.prod(lead)
    out = DeltaUpdateFunction.apply(
        x.reshape(n, d, dv), k.reshape(n, d), v.reshape(n, dv), beta.reshape(n, 1), float(k_eps)
    )
    return out.view(x.shape)


def untied_update_lean(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta_erase: torch.Tensor,
                       beta_write: torch.Tensor, k_eps: float = 1e-5) -> torch.Tensor:
    """Lean ``x + k (beta_write v^T - beta_erase k^T x)`` (k normalised inside), the untied gates: the delta
    update's Function with its erase gate apart. Shapes as :func:`delta_update_lean`, both gates (..., 1)."""
    *lead, d, dv = x.shape
    n = math.prod(lead)
    out = DeltaUpdateFunction.apply(
        x.reshape(n, d, dv), k.reshape(n, d), v.reshape(n, dv), beta_write.reshape(n, 1), float(k_eps),
        beta_erase.reshape(n, 1),
    )
    return out.view(x.shape)


def update_lean(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *, k_eps: float = 1e-5,
                rule: str = "delta") -> torch.Tensor:
    """The lean update by ``rule`` (the ``"torch"`` route of every update), gates as one tensor: beta (..., 1), or
    (..., 2) = (erase, write) for the untied rule; shapes validated. The rule's lean function: the write-only
    control's :func:`write_update_lean`, the untied gates' :func:`untied_update_lean`, else the delta rule's
    :func:`delta_update_lean`."""
    spec = rule_spec(rule)
    if not spec.reads:
        return write_update_lean(x, k, v, beta, k_eps)
    if spec.erase_gate:
        return untied_update_lean(x, k, v, beta[..., :1], beta[..., 1:], k_eps)
    return delta_update_lean(x, k, v, beta, k_eps)


def rule_forward(rule: str, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                 k_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`lean_forward` of an update rule with its gate tensor as the kernels take it (:func:`rule_gates`)."""
    beta_w, beta_e, erase = rule_gates(rule, beta)
    return lean_forward(x, k, v, beta_w, k_eps, beta_e, erase)


def rule_backward(rule: str, g: torch.Tensor, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                  k_eps: float) -> tuple[torch.Tensor, ...]:
    """:func:`lean_backward` of an update rule, (grad_x, grad_k, grad_v, grad_beta) with grad_beta shaped as the
    rule's gate tensor (:func:`rule_grads`)."""
    beta_w, beta_e, erase = rule_gates(rule, beta)
    return rule_grads(rule, lean_backward(g, x, k, v, beta_w, k_eps, (True,) * 5, beta_e, erase))


def write_update_lean(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                      k_eps: float = 1e-5) -> torch.Tensor:
    """The write-only control ``x + beta k v^T`` on every device and backend (no kernel of its own: it reads no
    state, so the lean path is one fused ``addcmul`` over x); autograd's own backward. x: (..., d, d_v), k:
    (..., d), v: (..., d_v), beta: (..., 1) -> x's shape and dtype, the outer product in fp32 (fp64 for fp64
    inputs) rounded once to x's dtype."""
    ct = compute_dtype(x, k, v, beta)
    u, _ = unit_direction(k, k_eps, ct)
    gated = beta.to(ct) * v.to(ct)  # (..., d_v)
    if x.dtype == ct:
        return torch.addcmul(x, u.unsqueeze(-1), gated.unsqueeze(-2))
    return x + (u.unsqueeze(-1) * gated.unsqueeze(-2)).to(x.dtype)


def update_read_backward_lean(
    g: torch.Tensor, gin: torch.Tensor, x: torch.Tensor, out: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    beta: torch.Tensor, c: torch.Tensor, k_eps: float, rule: str = "delta",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x, grad_k, grad_v, grad_beta, grad_c) of the fused op; g (N, d, d_v), gin (N, d), out = x' the
    forward's new state (saved: the next update's input, kept anyway, except after a model's last update:
    one state per model, ``benchmarks/tools/saved_by_source.py``). Lean math: the read's gradient
    ``g_in c^T`` joins g before the update's backward (in the compute dtype, as the Triton kernel does in
    registers: a bf16 state goes through a transient fp32 copy, rounded once at the end), and
    ``grad_c = sum_n g_in x'^T``. ``rule``: the update's (:func:`rule_backward`; beta (N, 2) for "untied")."""
    from deep_delta.ops.compress.lean import channel_read_weight_grad, read_gradient_rows

    ct = compute_dtype(x, k, v, beta)
    ge = read_gradient_rows(gin, x.shape[-1], ct)
    grad_c = channel_read_weight_grad(ge, out).to(c.dtype)
    total = torch.addcmul(g.to(ct), ge, c.to(ct))
    grad_x, grad_k, grad_v, grad_beta = rule_backward(rule, total, x.to(ct), k, v, beta, k_eps)
    return grad_x.to(x.dtype), grad_k, grad_v, grad_beta, grad_c
