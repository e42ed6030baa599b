"""Lean PyTorch path of the HC / mHC stream ops: the ``backend="torch"`` path, custom autograd Functions.

Same math as :mod:`deep_delta.ops.hyper.naive` (the plain references they are tested against), written to
keep less for backward and to touch the (N, d, n) state fewer times:

- write ``h' = h R + f b^T``: forward is the reference's ops (bit for bit the same values), the add in
  place. Saves h, R, b, f in their own dtypes (the reference's autograd saves fp32 copies of a bf16 h and
  f). Backward, with no state-sized temporary besides grad_h:

      grad_h = G R^T            one read of G, one write
      grad_R = h^T G            per token (N, n, n), or one (N d, n)^T (N d, n) GEMM for a static R
      grad_f = G b              a batched mat-vec, no state-sized temporary (the reference forms G * b)
      grad_b = f^T G            a batched vec-mat, no state-sized temporary (the reference forms G * f)

- read ``h_in = h a``: forward is the reference's matmul; saves h in its own dtype (not an fp32 copy).
  Backward ``grad_h = g a^T`` (one write) and ``grad_a = h^T g``.
- Sinkhorn-Knopp: saves only the logits (the reference's autograd keeps an (N, n, n) and an (N, 1, n)
  tensor per half-step, 40 of each at 20 rounds: 3.2 KB per token at n = 4, 0.8x the (d = 256, n = 4)
  fp32 state); backward recomputes the iterates (transient) and applies the
  closed-form backward of each normalisation ``y = x / (sum x + eps)``:
  ``grad_x = (grad_y - sum(grad_y * y)) / (sum x + eps)`` (sums along the normalised axis), then of the
  shifted ``exp`` (the gradient of the max shift goes to the maximal logits, split evenly between ties,
  as ``amax``'s backward does).

All math is fp32 (fp64 for fp64 inputs), also under autocast (the reference's matmuls would run in the
autocast dtype there); results in the dtypes of the references.
"""

from __future__ import annotations

import contextlib
import math

import torch

from deep_delta.ops.backend import compute_dtype


def _no_autocast(t: torch.Tensor):
    """Autocast off on t's device for the block (the math stays in the compute dtype), where it is on."""
    try:
        on = torch.is_autocast_enabled(t.device.type)
    except (RuntimeError, TypeError, ValueError):  # a device type autocast does not know
        on = False
    return torch.autocast(t.device.type, enabled=False) if on else contextlib.nullcontext()


def _sum_to(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-token gradient summed down to the shape of a broadcast (static) coefficient, in its dtype."""
    return grad.sum_to_size(like.shape).to(like.dtype)


class StreamWriteFunction(torch.autograd.Function):
    """``h R + f b^T``; h (N, d, n), r (N, n, n) or (n, n), b (N, n) or (n,), f (N, d) -> (N, d, n)."""

    @staticmethod
    def forward(ctx, h, r, b, f):
        ct = compute_dtype(h, r, b, f)
        with _no_autocast(h):
            out = torch.matmul(h.to(ct), r.to(ct))  # a fresh buffer in ct
            out.add_(f.to(ct).unsqueeze(-1) * b.to(ct).unsqueeze(-2))  # the reference's roundings, in place
        ctx.save_for_backward(h, r, b, f)
        return out.to(h.dtype)

    @staticmethod
    def backward(ctx, g):
        h, r, b, f = ctx.saved_tensors
        ct = compute_dtype(h, r, b, f)
        n = h.shape[-1]
        gh = gr = gb = gf = None
        with _no_autocast(h):
            gc = g.to(ct)
            if ctx.needs_input_grad[0]:
                gh = torch.matmul(gc, r.to(ct).transpose(-1, -2)).to(h.dtype)
            if ctx.needs_input_grad[1]:
                if r.dim() == 2:  # static: one GEMM over all tokens and rows
                    gr = (h.to(ct).reshape(-1, n).T @ gc.reshape(-1, n)).to(r.dtype)
                else:
                    gr = _sum_to(torch.matmul(h.to(ct).transpose(-1, -2), gc), r)
            if ctx.needs_input_grad[2]:
                if b.dim() == 1:
                    gb = (f.to(ct).reshape(1, -1) @ gc.reshape(-1, n)).reshape(n).to(b.dtype)
                else:
                    gb = _sum_to(torch.matmul(f.to(ct).unsqueeze(-2), gc).squeeze(-2), b)
            if ctx.needs_input_grad[3]:
                gf = torch.matmul(gc, b.to(ct).unsqueeze(-1)).squeeze(-1).to(f.dtype)
        return gh, gr, gb, gf


class StreamReadFunction(torch.autograd.Function):
    """``h a``; h (N, d, n), a (N, n) or (n,) -> (N, d) in h's dtype."""

    @staticmethod
    def forward(ctx, h, a):
        ct = compute_dtype(h, a)
        with _no_autocast(h):
            out = torch.matmul(h.to(ct), a.to(ct).unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(h, a)
        return out.to(h.dtype)

    @staticmethod
    def backward(ctx, g):
        h, a = ctx.saved_tensors
        ct = compute_dtype(h, a)
        n = h.shape[-1]
        gh = ga = None
        with _no_autocast(h):
            gc = g.to(ct)
            if ctx.needs_input_grad[0]:
                gh = (gc.unsqueeze(-1) * a.to(ct).unsqueeze(-2)).to(h.dtype)
            if ctx.needs_input_grad[1]:
                if a.dim() == 1:
                    ga = (gc.reshape(1, -1) @ h.to(ct).reshape(-1, n)).reshape(n).to(a.dtype)
                else:
                    ga = _sum_to(torch.matmul(gc.unsqueeze(-2), h.to(ct)).squeeze(-2), a)
        return gh, ga


def _sinkhorn_iterates(z: torch.Tensor, iters: int, eps: float, keep: bool):
    """exp of the shifted logits and the rounds; with ``keep`` also every half-step's (input, sum + eps)."""
    m = torch.exp(z - z.amax(dim=(-2, -1), keepdim=True))
    m0, steps = m, []
    for _ in range(iters):
        for axis in (-2, -1):  # column normalisation, then row normalisation
            s = m.sum(axis, keepdim=True) + eps
            if keep:
                steps.append((m, s, axis))
            m = m / s
    return m0, m, steps


def keep_sinkhorn(ctx, logits: torch.Tensor, iters: int, eps: float) -> None:
    """What a Sinkhorn-Knopp Function's backward needs (lean and Triton): only the logits, and the rounds' settings
    (both recompute the rounds)."""
    ctx.save_for_backward(logits)
    ctx.iters, ctx.eps = iters, eps


def kept_sinkhorn(ctx) -> tuple[torch.Tensor, int, float]:
    """(logits, iters, eps) as :func:`keep_sinkhorn` kept them."""
    (logits,) = ctx.saved_tensors
    return logits, ctx.iters, ctx.eps


class SinkhornFunction(torch.autograd.Function):
    """Sinkhorn-Knopp of logits (N, n, n) in the compute dtype; saves only the logits."""

    @staticmethod
    def forward(ctx, logits, iters: int, eps: float):
        ct = compute_dtype(logits)
        with _no_autocast(logits):
            _, m, _ = _sinkhorn_iterates(logits.to(ct), iters, eps, keep=False)
        keep_sinkhorn(ctx, logits, iters, eps)
        return m

    @staticmethod
    def backward(ctx, g):
        logits, iters, eps = kept_sinkhorn(ctx)
        ct = compute_dtype(logits)
        with _no_autocast(logits):
            z = logits.to(ct)
            m0, m, steps = _sinkhorn_iterates(z, iters, eps, keep=True)
            outputs = [x for x, _, _ in steps[1:]] + [m]  # a half-step's output is the next one's input
            gm = g.to(ct)
            for (_, s, axis), y in zip(reversed(steps), reversed(outputs)):
                gm = (gm - (gm * y).sum(axis, keepdim=True)) / s
            gz = gm * m0
            # the shift by the maximum: its gradient, -sum(gz), goes to the maximal logits (ties split evenly)
            ismax = (z == z.amax(dim=(-2, -1), keepdim=True)).to(ct)
            gz = gz - gz.sum(dim=(-2, -1), keepdim=True) * ismax / ismax.sum(dim=(-2, -1), keepdim=True)
        return gz.to(logits.dtype), None, None


def _flat_coef(c: torch.Tensor, lead: tuple[int, ...], tail: int) -> torch.Tensor:
    """A coefficient with ``tail`` trailing dims: static (no leading dims) as it is, else (N, ...)."""
    if c.dim() == tail:
        return c
    shape = c.shape[-tail:]
    return c.expand(*lead, *shape).reshape(math.prod(lead), *shape)


def stream_write_lean(h: torch.Tensor, r: torch.Tensor, b: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``h' = h R + f b^T``: h (..., d, n), r (n, n) or (..., n, n), b (n,) or (..., n), f (..., d)."""
    *lead, d, n = h.shape
    lead = tuple(lead)
    nt = math.prod(lead)
    out = StreamWriteFunction.apply(
        h.reshape(nt, d, n), _flat_coef(r, lead, 2), _flat_coef(b, lead, 1), f.expand(*lead, d).reshape(nt, d)
    )
    return out.view(h.shape)


def stream_read_lean(h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``h_in = h a``: h (..., d, n), a (n,) or (..., n) -> (..., d) in h's dtype."""
    *lead, d, n = h.shape
    lead = tuple(lead)
    out = StreamReadFunction.apply(h.reshape(math.prod(lead), d, n), _flat_coef(a, lead, 1))
    return out.view(*lead, d)


def sinkhorn_knopp_lean(logits: torch.Tensor, iters: int = 20, eps: float = 1e-6) -> torch.Tensor:
    """Sinkhorn-Knopp of (..., n, n) logits (as :func:`..naive.sinkhorn_knopp_reference`), saving only them."""
    n = logits.shape[-1]
    lead = logits.shape[:-2]
    out = SinkhornFunction.apply(logits.reshape(-1, n, n), int(iters), float(eps))
    return out.view(*lead, n, n)
