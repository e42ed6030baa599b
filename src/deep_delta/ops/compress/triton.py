"""Triton kernels of the compressors (CC, TC) and the embedding convolution (EC), forward and backward.

Each program owns ``ROWS`` tokens (a reduction kernel: ``CHUNK`` tokens, below) and holds a (d, d_v) tile
per token (``BLOCK_D = next_pow2(d)``, ``BLOCK_V = next_pow2(d_v)``, masked); all sums are fp32. The weight-gradient kernels run on a persistent
grid (:func:`deep_delta.ops.delta.triton.reduction_grid`): at most ``max_programs`` programs (2 x the SM count
on CUDA), each looping over a contiguous chunk of tokens and accumulating in fp32 registers, then one (d, d_v)
fp32 partial per program (and tap), summed by reducer programs of the same launch (:mod:`deep_delta.ops.partials`):
bounded by ``max_programs`` x the weight whatever the token count; deterministic, no atomic adds of values.

- CC  fwd: x_in = sum_j c_ij x_ij (one read of x);  bwd: grad_x = g c^T (one write), grad_c partials.
- TC  fwd: x_in_t = sum_s sum_j w_s x_{t-s} (the K taps of a token are re-read from L2, not HBM);
      bwd: grad_x_t = sum_s w_s g_{t+s} (a gather, one write), grad_w partials per tap.
- EC  fwd: X_t = sum_s w_s e_{t-s} 1^T (one write of the state from the (B, T, d) embeddings);
      bwd: grad_e_t = sum_s sum_j w_s G_{t+s} (one read of G per tap), grad_w partials per tap.

TC and EC share their kernels: the forward (``_conv_fwd_kernel``), the input gradient (``_conv_bwd_input_kernel``)
and the weight gradient (``_conv_bwd_w_kernel``), each with a compile-time flag for the side of the convolution
that holds the (d, d_v) state.

Sequences with history (decoding) are handled by concatenating the K-1 past rows in front (P rows) and
computing outputs for the last T rows; during training P = 0 and nothing is copied.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deep_delta.ops import partials
from deep_delta.ops.compress.shortconv import keep_taps, kept_taps
from deep_delta.ops.launch import (
    check_device,
    launch,
    read_warps,
    reduction_grid,
    rows_per_program,
    state_blocks,
)


@triton.jit
def _cc_fwd_kernel(X, C, XIN, N, D, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr,
                   BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    tile = offs_d[:, None] * DV + offs_v[None, :]
    c = tl.load(C + tile, mask=md[:, None] & mv[None, :], other=0.0).to(tl.float32)
    for r in range(ROWS):
        n = pid * ROWS + r
        ok_d = md & (((offs_d * 0) + n) < N)
        ok_v = mv & (((offs_v * 0) + n) < N)
        x = tl.load(X + n * D * DV + tile, mask=ok_d[:, None] & ok_v[None, :], other=0.0).to(tl.float32)
        tl.store(XIN + n * D + offs_d, tl.sum(x * c, axis=1).to(XIN.dtype.element_ty), mask=ok_d)


@triton.jit
def _cc_bwd_kernel(X, C, G, GX, GC_PART, GC, COUNTERS, N, CHUNK, P, R, D, BLOCK_D: tl.constexpr, DV: tl.constexpr,
                   BLOCK_V: tl.constexpr, REDUCE: tl.constexpr, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr):
    """P workers (:func:`_cc_bwd_worker`), then (REDUCE) R reducers that sum their grad_c partials into GC
    (ops/partials.py)."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P:
        _cc_bwd_worker(X, C, G, GX, GC_PART, ticket, N, CHUNK, D, BLOCK_D, DV, BLOCK_V)
        partials.signal_stored(COUNTERS, P, REDUCE)
    elif REDUCE:
        partials.reducer(COUNTERS, P, GC_PART, GC, ticket - P, P, D * DV, R, REDUCE_ROWS, REDUCE_COLS)


@triton.jit
def _cc_bwd_worker(X, C, G, GX, GC_PART, pid, N, CHUNK, D, BLOCK_D: tl.constexpr, DV: tl.constexpr,
                   BLOCK_V: tl.constexpr):
    """Tokens [pid * CHUNK, (pid + 1) * CHUNK): grad_x per token, grad_c of the chunk in registers, one partial."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    tile = offs_d[:, None] * DV + offs_v[None, :]
    c = tl.load(C + tile, mask=md[:, None] & mv[None, :], other=0.0).to(tl.float32)
    gc = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
    for r in range(0, CHUNK):
        n = pid * CHUNK + r
        ok_d = md & (((offs_d * 0) + n) < N)
        ok_v = mv & (((offs_v * 0) + n) < N)
        mt = ok_d[:, None] & ok_v[None, :]
        g = tl.load(G + n * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
        x = tl.load(X + n * D * DV + tile, mask=mt, other=0.0).to(tl.float32)
        tl.store(GX + n * D * DV + tile, (g[:, None] * c).to(GX.dtype.element_ty), mask=mt)
        gc += g[:, None] * x
    tl.store(GC_PART + pid * D * DV + tile, gc, mask=md[:, None] & mv[None, :])


@triton.jit
def _conv_fwd_kernel(
    SP, W, OUT, N, T, L, D,
    OUT_IS_STATE: tl.constexpr, KS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """A token convolution's forward: output row n = (b, t) in [0, B*T) is ``sum_s w_s SP(b, t + P - s)`` over the
    taps s with t + P - s >= 0, SP holding the P past rows in front (L = P + T rows per sequence).

    TC: SP = x (B, L, d, d_v); OUT (B*T, d), the read: the sum over d_v.  (OUT_IS_STATE = False)
    EC: SP = e (B, L, d) broadcast over d_v; OUT (B*T, d, d_v), the state.  (OUT_IS_STATE = True)
    """
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    tile = offs_d[:, None] * DV + offs_v[None, :]
    p = L - T
    for r in range(ROWS):
        n = pid * ROWS + r
        b = n // T
        t = n % T
        acc = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
        for s in tl.static_range(KS):
            src = t + p - s
            ok_d = md & (((offs_d * 0) + n) < N) & (((offs_d * 0) + src) >= 0)
            w = tl.load(W + s * D * DV + tile, mask=md[:, None] & mv[None, :], other=0.0).to(tl.float32)
            if OUT_IS_STATE:
                e = tl.load(SP + (b * L + src) * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
                acc += w * e[:, None]
            else:
                x = tl.load(SP + (b * L + src) * D * DV + tile, mask=ok_d[:, None] & mv[None, :], other=0.0)
                acc += w * x.to(tl.float32)
        ok_d = md & (((offs_d * 0) + n) < N)
        if OUT_IS_STATE:
            tl.store(OUT + n * D * DV + tile, acc.to(OUT.dtype.element_ty), mask=ok_d[:, None] & mv[None, :])
        else:
            tl.store(OUT + n * D + offs_d, tl.sum(acc, axis=1).to(OUT.dtype.element_ty), mask=ok_d)


@triton.jit
def _conv_bwd_input_kernel(
    G, W, GSP, M, T, L, D,
    G_IS_STATE: tl.constexpr, KS: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The gradient of a token convolution's input with its P past rows: row m = (b, q) in [0, B*L) of GSP is
    ``sum_s w_s g(b, q - P + s)`` over the taps s with 0 <= q - P + s < T.

    TC: g (B, T, d) broadcast over d_v; GSP (B, L, d, d_v), the gradient of x.  (G_IS_STATE = False)
    EC: g (B, T, d, d_v); GSP (B, L, d), the gradient of e: the sum over d_v.  (G_IS_STATE = True)
    """
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    tile = offs_d[:, None] * DV + offs_v[None, :]
    p = L - T
    for r in range(ROWS):
        m = pid * ROWS + r
        b = m // L
        q = m % L
        acc = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
        for s in tl.static_range(KS):
            t = q - p + s
            tv = (offs_d * 0) + t
            ok_d = md & (((offs_d * 0) + m) < M) & (tv >= 0) & (tv < T)
            w = tl.load(W + s * D * DV + tile, mask=md[:, None] & mv[None, :], other=0.0).to(tl.float32)
            if G_IS_STATE:
                g = tl.load(G + (b * T + t) * D * DV + tile, mask=ok_d[:, None] & mv[None, :], other=0.0)
                acc += w * g.to(tl.float32)
            else:
                g = tl.load(G + (b * T + t) * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
                acc += w * g[:, None]
        ok_d = md & (((offs_d * 0) + m) < M)
        if G_IS_STATE:
            tl.store(GSP + m * D + offs_d, tl.sum(acc, axis=1).to(GSP.dtype.element_ty), mask=ok_d)
        else:
            tl.store(GSP + m * D * DV + tile, acc.to(GSP.dtype.element_ty), mask=ok_d[:, None] & mv[None, :])


@triton.jit
def _conv_bwd_w_kernel(
    A, S, GW_PART, GW, COUNTERS, N, CHUNK, P, KS, R, T, L, D,
    A_IS_STATE: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr, REDUCE: tl.constexpr, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr,
):
    """P x K workers (:func:`_conv_bwd_w_worker`; ticket i: the chunk i // K, tap i % K), then (REDUCE) R reducers
    that sum the (P, K, d, d_v) partials into GW (ops/partials.py)."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P * KS:
        _conv_bwd_w_worker(A, S, GW_PART, ticket // KS, ticket % KS, KS, N, CHUNK, T, L, D, A_IS_STATE, BLOCK_D,
                           DV, BLOCK_V)
        partials.signal_stored(COUNTERS, P * KS, REDUCE)
    elif REDUCE:
        partials.reducer(COUNTERS, P * KS, GW_PART, GW, ticket - P * KS, P, KS * D * DV, R, REDUCE_ROWS,
                         REDUCE_COLS)


@triton.jit
def _conv_bwd_w_worker(
    A, S, GW_PART, pid, s, KS, N, CHUNK, T, L, D,
    A_IS_STATE: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Partial ``sum_n A(b, t) * S(b, t + P - s)`` over the tokens n in [pid * CHUNK, (pid + 1) * CHUNK) for tap
    s, accumulated in fp32 registers; one (d, d_v) partial per (program, tap).

    TC: A = g (B, T, d) broadcast over d_v, S = x (B, L, d, d_v).  (A_IS_STATE = False)
    EC: A = G (B, T, d, d_v), S = e (B, L, d) broadcast over d_v.  (A_IS_STATE = True)
    """
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    tile = offs_d[:, None] * DV + offs_v[None, :]
    p = L - T
    acc = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
    for r in range(0, CHUNK):
        n = pid * CHUNK + r
        b = n // T
        t = n % T
        src = t + p - s
        ok_d = md & (((offs_d * 0) + n) < N) & (((offs_d * 0) + src) >= 0)
        mt = ok_d[:, None] & mv[None, :]
        if A_IS_STATE:
            a = tl.load(A + n * D * DV + tile, mask=mt, other=0.0).to(tl.float32)
            e = tl.load(S + (b * L + src) * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
            acc += a * e[:, None]
        else:
            g = tl.load(A + n * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
            x = tl.load(S + (b * L + src) * D * DV + tile, mask=mt, other=0.0).to(tl.float32)
            acc += g[:, None] * x
    tl.store(GW_PART + (pid * KS + s) * D * DV + tile, acc, mask=md[:, None] & mv[None, :])


def _reduction_meta(d: int, dv: int) -> dict:
    """The meta-parameters of a persistent reduction kernel (its tokens per program are a runtime argument)."""
    bd, bv = state_blocks(d, dv)
    return dict(BLOCK_D=bd, DV=dv, BLOCK_V=bv, num_warps=read_warps(bd * bv))


def _launch_args(n: int, d: int, dv: int) -> tuple[tuple[int], dict]:
    """Grid and meta-parameters of a kernel without a reduction over tokens: ``ROWS`` tokens per program."""
    rows = rows_per_program(n)
    bd, bv = state_blocks(d, dv)
    return (triton.cdiv(n, rows),), dict(ROWS=rows, BLOCK_D=bd, DV=dv, BLOCK_V=bv, num_warps=read_warps(bd * bv))


class ChannelCompressTriton(torch.autograd.Function):
    """x: (N, d, d_v), c: (d, d_v) -> (N, d)."""

    @staticmethod
    def forward(ctx, x, c):
        n, d, dv = x.shape
        c = c.contiguous()
        xin = torch.empty(n, d, dtype=x.dtype, device=x.device)
        grid, meta = _launch_args(n, d, dv)
        launch(_cc_fwd_kernel, grid, (x, c, xin, n, d), writes=(2,), **meta)
        ctx.save_for_backward(x, c)
        return xin

    @staticmethod
    def backward(ctx, g):
        x, c = ctx.saved_tensors
        n, d, dv = x.shape
        progs, chunk = reduction_grid(n, x.device)
        gx = torch.empty_like(x)
        part = torch.empty(progs, d, dv, dtype=torch.float32, device=x.device)
        gc = torch.empty_like(c)
        red = partials.start(x.device, d * dv)
        launch(_cc_bwd_kernel, (progs + red.total,),
               (x, c, g.contiguous(), gx, part, gc, red.counters, n, chunk, progs, red.total, d),
               writes=(3, 4), apart=(5, 6), **_reduction_meta(d, dv), **red.meta())
        red.finish("cc_bwd_kernel", (part, gc))
        return gx, gc


def _wgrad(a: torch.Tensor, src: torch.Tensor, w: torch.Tensor, t: int, a_is_state: bool) -> torch.Tensor:
    b, length = src.shape[:2]
    kk, d, dv = w.shape
    n = b * t
    progs, chunk = reduction_grid(n, a.device, per_program_axis=kk)  # (progs, K) workers, at most max_programs
    part = torch.empty(progs, kk, d, dv, dtype=torch.float32, device=a.device)
    gw = torch.empty_like(w)
    red = partials.start(a.device, kk * d * dv)
    launch(_conv_bwd_w_kernel, (progs * kk + red.total,),
           (a, src, part, gw, red.counters, n, chunk, progs, kk, red.total, t, length, d), writes=(2,),
           apart=(3, 4), A_IS_STATE=a_is_state, **_reduction_meta(d, dv), **red.meta())
    red.finish("conv_bwd_w_kernel", (part, gw))
    return gw


class TokenCompressTriton(torch.autograd.Function):
    """xp: (B, P+T, d, d_v), w: (K, d, d_v) -> (B, T, d)."""

    @staticmethod
    def forward(ctx, xp, w, t: int):
        b, length, d, dv = xp.shape
        w = w.contiguous()
        n = b * t
        xin = torch.empty(b, t, d, dtype=xp.dtype, device=xp.device)
        grid, meta = _launch_args(n, d, dv)
        launch(_conv_fwd_kernel, grid, (xp, w, xin, n, t, length, d), writes=(2,), OUT_IS_STATE=False,
               KS=w.shape[0], **meta)
        keep_taps(ctx, xp, w, t)
        return xin

    @staticmethod
    def backward(ctx, g):
        xp, w, t = kept_taps(ctx)
        b, length, d, dv = xp.shape
        g = g.contiguous()
        gx = gw = None
        if ctx.needs_input_grad[0]:
            m = b * length
            gx = torch.empty_like(xp)
            grid, meta = _launch_args(m, d, dv)
            launch(_conv_bwd_input_kernel, grid, (g, w, gx, m, t, length, d), writes=(2,), G_IS_STATE=False,
                   KS=w.shape[0], **meta)
        if ctx.needs_input_grad[1]:
            gw = _wgrad(g, xp, w, t, a_is_state=False)
        return gx, gw, None


class EmbedConvTriton(torch.autograd.Function):
    """ep: (B, P+T, d), w: (K, d, d_v) -> (B, T, d, d_v)."""

    @staticmethod
    def forward(ctx, ep, w, t: int):
        b, length, d = ep.shape
        w = w.contiguous()
        kk, _, dv = w.shape
        n = b * t
        x = torch.empty(b, t, d, dv, dtype=ep.dtype, device=ep.device)
        grid, meta = _launch_args(n, d, dv)
        launch(_conv_fwd_kernel, grid, (ep, w, x, n, t, length, d), writes=(2,), OUT_IS_STATE=True, KS=kk, **meta)
        keep_taps(ctx, ep, w, t)
        return x

    @staticmethod
    def backward(ctx, g):
        ep, w, t = kept_taps(ctx)
        b, length, d = ep.shape
        kk, _, dv = w.shape
        g = g.contiguous()
        ge = gw = None
        if ctx.needs_input_grad[0]:
            m = b * length
            ge = torch.empty_like(ep)
            grid, meta = _launch_args(m, d, dv)
            launch(_conv_bwd_input_kernel, grid, (g, w, ge, m, t, length, d), writes=(2,), G_IS_STATE=True, KS=kk,
                   **meta)
        if ctx.needs_input_grad[1]:
            gw = _wgrad(g, ep, w, t, a_is_state=True)
        return ge, gw, None


def channel_compress_triton(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: (..., d, d_v), weight: (d, d_v) -> (..., d)."""
    check_device("channel_compress", x)
    *lead, d, dv = x.shape
    return ChannelCompressTriton.apply(x.reshape(-1, d, dv).contiguous(), weight).view(*lead, d)


def token_compress_triton(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
    """x: (B, T, d, d_v), weight: (K, d, d_v), past: (B, K-1, d, d_v) or None -> (B, T, d)."""
    check_device("token_compress", x)
    t = x.shape[1]
    xp = x.contiguous() if past is None else torch.cat([past.to(x.dtype), x], dim=1)
    return TokenCompressTriton.apply(xp, weight, t)


def embed_conv_triton(e: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None = None) -> torch.Tensor:
    """e: (B, T, d), weight: (K, d, d_v), past: (B, K-1, d) or None -> (B, T, d, d_v)."""
    check_device("embed_conv", e)
    t = e.shape[1]
    ep = e.contiguous() if past is None else torch.cat([past.to(e.dtype), e], dim=1)
    return EmbedConvTriton.apply(ep, weight, t)
