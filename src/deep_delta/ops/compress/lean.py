"""Lean PyTorch compressors and embedding convolution: the ``backend="torch"`` path.

Autograd Functions with the math of :mod:`.naive` (tested against it) written for few, vectorised passes
over the (B, T, d, d_v) state:

- the state is handled as (B, T, d*d_v) rows, so every tap is one contiguous multiply-add
  (``addcmul_`` on time-shifted slices, no padded copy during training);
- the sum over the d_v value channels is a matrix product with a ones vector (a short inner reduction is
  an order of magnitude slower as a plain ``sum(-1)`` on CPU);
- backward recomputes what is cheap (the broadcast of e or of the upstream gradient) and saves only the
  inputs.
"""

from __future__ import annotations

import torch

from deep_delta.ops.compress.shortconv import keep_taps, kept_taps


def _sum_value_channels(y: torch.Tensor, dv: int) -> torch.Tensor:
    """(..., d*d_v) -> (..., d): sum over the innermost d_v channels as one mat-vec."""
    ones = torch.ones(dv, 1, dtype=y.dtype, device=y.device)
    return torch.mm(y.reshape(-1, dv), ones).view(*y.shape[:-1], y.shape[-1] // dv)


def _broadcast_channels(e: torch.Tensor, dv: int) -> torch.Tensor:
    """(..., d) -> (..., d*d_v), each feature repeated over its d_v channels (one contiguous write)."""
    return e.unsqueeze(-1).expand(*e.shape, dv).reshape(*e.shape[:-1], e.shape[-1] * dv)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of weight gradients: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(torch.float32, dtype)


def _tap_range(s: int, t: int, p: int) -> tuple[int, int]:
    """Outputs t' in [lo, t) read input row t' + p - s (inputs: p history rows, then t rows)."""
    return max(0, s - p), t


def _taps(src: torch.Tensor, wf: torch.Tensor, t: int, p: int) -> torch.Tensor:
    """A causal tap conv: ``y[:, t'] = sum_s wf[s] * src[:, t' + p - s]``.

    src: (B, P+T, C) (P history rows first), wf: (K, C) -> (B, T, C) in src's dtype."""
    y = src[:, p:] * wf[0]
    for s in range(1, wf.shape[0]):
        lo, hi = _tap_range(s, t, p)
        if lo < hi:
            y[:, lo:hi].addcmul_(src[:, lo + p - s : hi + p - s], wf[s])
    return y


def _taps_transposed(g: torch.Tensor, wf: torch.Tensor, t: int, p: int) -> torch.Tensor:
    """The gradient of :func:`_taps` with respect to its input: g (B, T, C) -> (B, P+T, C), the history rows'
    included (zero where no output reads them)."""
    b, _, c = g.shape
    h = torch.empty(b, p + t, c, dtype=g.dtype, device=g.device)
    h[:, :p].zero_()
    torch.mul(g, wf[0], out=h[:, p:])
    for s in range(1, wf.shape[0]):
        lo, hi = _tap_range(s, t, p)
        if lo < hi:
            h[:, lo + p - s : hi + p - s].addcmul_(g[:, lo:hi], wf[s])
    return h


def _tap_weight_grad(g: torch.Tensor, src: torch.Tensor, kk: int, t: int, p: int) -> torch.Tensor:
    """Weight gradient of a causal tap conv: row s = sum over (b, t') of g[:, t'] * src[:, t' + p - s].

    g: (B, T, C) upstream gradient; src: (B, P+T, C) the conv input (P history rows first) -> (K, C) in the
    accumulation dtype.
    """
    c = g.shape[-1]
    rows = []
    for s in range(kk):
        lo, hi = _tap_range(s, t, p)
        if lo < hi:
            prod = g[:, lo:hi] * src[:, lo + p - s : hi + p - s]
            rows.append(prod.reshape(-1, c).sum(0, dtype=_acc(src.dtype)))
        else:
            rows.append(torch.zeros(c, dtype=_acc(src.dtype), device=src.device))
    return torch.stack(rows)


def channel_read(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The CC read ``x_in_i = sum_j w_ij x_ij`` without autograd. x: (N, d, d_v), w: (d, d_v) -> (N, d)."""
    n, d, dv = x.shape
    return _sum_value_channels((x * w.to(x.dtype)).view(n, d * dv), dv)


def read_gradient_rows(g: torch.Tensor, dv: int, dtype: torch.dtype) -> torch.Tensor:
    """The read's upstream gradient g (N, d) repeated over the d_v channels: (N, d, d_v) in ``dtype``."""
    return _broadcast_channels(g.to(dtype), dv).view(*g.shape, dv)


def channel_read_weight_grad(ge: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``sum_n g_n x_n^T``: the read's weight gradient (d, d_v) in the accumulation dtype.

    ge: (N, d, d_v) from :func:`read_gradient_rows`, x: (N, d, d_v) the state that was read."""
    n, d, dv = x.shape
    return (ge * x).view(n, d * dv).sum(0, dtype=_acc(x.dtype)).view(d, dv)


class ChannelCompressFunction(torch.autograd.Function):
    """x: (N, d, d_v), w: (d, d_v) -> (N, d)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return channel_read(x, w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        ge = read_gradient_rows(g, x.shape[-1], x.dtype)
        grad_x = ge * w.to(x.dtype) if ctx.needs_input_grad[0] else None
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = channel_read_weight_grad(ge, x).to(w.dtype)
        return grad_x, grad_w


class TokenCompressFunction(torch.autograd.Function):
    """xp: (B, P+T, d, d_v) (P history rows first), w: (K, d, d_v) -> (B, T, d)."""

    @staticmethod
    def forward(ctx, xp, w, t: int):
        b, length, d, dv = xp.shape
        p, kk = length - t, w.shape[0]
        y = _taps(xp.view(b, length, d * dv), w.to(xp.dtype).reshape(kk, d * dv), t, p)
        keep_taps(ctx, xp, w, t)
        return _sum_value_channels(y, dv)

    @staticmethod
    def backward(ctx, g):
        xp, w, t = kept_taps(ctx)
        b, length, d, dv = xp.shape
        p, kk = length - t, w.shape[0]
        xf = xp.view(b, length, d * dv)
        wf = w.to(xp.dtype).reshape(kk, d * dv)
        ge = _broadcast_channels(g.to(xp.dtype), dv)  # (B, T, d*d_v)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = _taps_transposed(ge, wf, t, p).view(xp.shape)
        if ctx.needs_input_grad[1]:
            grad_w = _tap_weight_grad(ge, xf, kk, t, p).view(kk, d, dv).to(w.dtype)
        return grad_x, grad_w, None


class EmbedConvFunction(torch.autograd.Function):
    """ep: (B, P+T, d) (P history rows first), w: (K, d, d_v) -> (B, T, d, d_v)."""

    @staticmethod
    def forward(ctx, ep, w, t: int):
        b, length, d = ep.shape
        kk, _, dv = w.shape
        p = length - t
        y = _taps(_broadcast_channels(ep, dv), w.to(ep.dtype).reshape(kk, d * dv), t, p)  # (B, T, d*d_v)
        keep_taps(ctx, ep, w, t)
        return y.view(b, t, d, dv)

    @staticmethod
    def backward(ctx, g):
        ep, w, t = kept_taps(ctx)
        b, length, d = ep.shape
        kk, _, dv = w.shape
        p = length - t
        wf = w.to(ep.dtype).reshape(kk, d * dv)
        gf = g.to(ep.dtype).reshape(b, t, d * dv)
        grad_e = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_e = _sum_value_channels(_taps_transposed(gf, wf, t, p), dv)
        if ctx.needs_input_grad[1]:
            ef = _broadcast_channels(ep, dv)
            grad_w = _tap_weight_grad(gf, ef, kk, t, p).view(kk, d, dv).to(w.dtype)
        return grad_e, grad_w, None


def channel_compress_lean(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: (..., d, d_v), weight: (d, d_v) -> (..., d)."""
    *lead, d, dv = x.shape
    out = ChannelCompressFunction.apply(x.reshape(-1, d, dv), weight)
    return out.view(*lead, d)


def token_compress_lean(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
    """x: (B, T, d, d_v), weight: (K, d, d_v), past: (B, K-1, d, d_v) or None -> (B, T, d)."""
    t = x.shape[1]
    xp = x.contiguous() if past is None else torch.cat([past.to(x.dtype), x], dim=1)
    return TokenCompressFunction.apply(xp, weight, t)


def embed_conv_lean(e: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
    """e: (B, T, d), weight: (K, d, d_v), past: (B, K-1, d) or None -> (B, T, d, d_v)."""
    t = e.shape[1]
    ep = e.contiguous() if past is None else torch.cat([past.to(e.dtype), e], dim=1)
    return EmbedConvFunction.apply(ep, weight, t)
