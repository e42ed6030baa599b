"""Triton kernels of the HC / mHC stream ops, forward and backward: the write, the read, Sinkhorn-Knopp.

The state of a token is a (d, n) tile, the n streams the last axis (``BLOCK_N = next_pow2(n)``, masked).
All arithmetic is fp32 whatever the storage dtype (fp32, bf16, fp16); results are stored in the dtypes of
the references (:mod:`.naive`). A coefficient is per token (N, ...) or static, shared by every token (the
token stride 0: the static forms, HC's ``A_r = I`` at n = 1, mHC without its dynamic part).

write  fwd  one pass over h, f -> h' = h R + f b^T              grid (token, d-chunk): no reduction over d
       bwd  one pass over h, f, G per token (a loop over d-chunks):
            write grad_h = G R^T, grad_f = G b; accumulate grad_R = h^T G and grad_b = G^T f (n x n and n, fp32)
read   fwd  one pass over h -> h_in = h a                        grid (token, d-chunk)
       bwd  one pass over h, g per token: write grad_h = g a^T; accumulate grad_a = h^T g
sinkhorn fwd  a block of tokens' (n, n) logits in registers: exp of the shifted logits, ``iters`` rounds of
            column then row normalisation (each sum + eps), one read and one write of (n, n) per token
       bwd  in registers too, nothing saved but the logits: for round i = iters-1 .. 0 the input of round
            i is recomputed from the logits (O(iters^2) rounds of register arithmetic, no memory traffic)
            and the closed-form backward of ``y = x / (sum x + eps)``,
            ``grad_x = (grad_y - sum(grad_y * y)) / (sum x + eps)``, is applied to the row, then the column
            normalisation; then the exp and the max shift (its gradient to the maximal logits, ties split
            evenly, as ``amax``'s backward).

Per-token coefficient gradients come out as (N, ...) fp32. A static coefficient (one (n, n) / (n,) for all
tokens, token stride 0) has its gradient summed in the backward kernels: a persistent grid of at most
``max_programs`` programs (:func:`deep_delta.ops.delta.triton.reduction_grid`), each looping over a contiguous
chunk of tokens and accumulating in fp32 registers, one (n, n) / (n,) partial per program, summed by reducer
programs of the same launch into the coefficient's dtype (:mod:`deep_delta.ops.partials`; bounded whatever the
token count; deterministic, no atomic adds of values). Tested against the references under
``TRITON_INTERPRET=1`` on CPU (tests/ops/test_hyper_kernels.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deep_delta.ops import partials
from deep_delta.ops.hyper.lean import keep_sinkhorn, kept_sinkhorn
from deep_delta.ops.launch import check_device, launch, reduction_grid

MAX_STREAMS = 64  # an (n, n) tile per token in registers; HC and mHC use 4
TILE = 4096  # elements of the largest register tile (BLOCK_D x BLOCK_N x BLOCK_N in the write)


def _block_n(n: int, name: str) -> int:
    if n > MAX_STREAMS:
        raise ValueError(f"{name} (triton): the number of streams n must be <= {MAX_STREAMS}, got {n}")
    return triton.next_power_of_2(n)


def _block_d(d: int, per_row: int) -> int:
    """Rows of d per chunk: a tile of at most TILE elements, at most the (padded) width."""
    return max(1, min(triton.next_power_of_2(d), TILE // per_row))


# ----------------------------------------------------------------------------------------------- write


@triton.jit
def _write_fwd_kernel(
    H, R, B, F, OUT, D, stride_r, stride_b, NS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr
):
    tok = tl.program_id(0).to(tl.int64)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    md = offs_d < D
    mn = offs_n < NS
    mt = md[:, None] & mn[None, :]
    tile = offs_d[:, None] * NS + offs_n[None, :]
    h = tl.load(H + tok * D * NS + tile, mask=mt, other=0.0).to(tl.float32)
    f = tl.load(F + tok * D + offs_d, mask=md, other=0.0).to(tl.float32)
    r_tile = offs_n[:, None] * NS + offs_n[None, :]
    r = tl.load(R + tok * stride_r + r_tile, mask=mn[:, None] & mn[None, :], other=0.0).to(tl.float32)
    b = tl.load(B + tok * stride_b + offs_n, mask=mn, other=0.0).to(tl.float32)
    out = tl.sum(h[:, :, None] * r[None, :, :], axis=1) + f[:, None] * b[None, :]  # (h R)_ij = sum_k h_ik r_kj
    tl.store(OUT + tok * D * NS + tile, out.to(OUT.dtype.element_ty), mask=mt)


@triton.jit
def _write_bwd_kernel(
    H, R, B, F, G, GH, GR, GB, GF, GR_SUM, GB_SUM, COUNTERS, NT, CHUNK, P, R_R, RED, D, stride_r, stride_b,
    R_STATIC: tl.constexpr, B_STATIC: tl.constexpr, NS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    REDUCE: tl.constexpr, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr,
):
    """P workers (:func:`_write_bwd_worker`); with REDUCE (a static coefficient's gradient summed in the launch)
    RED reducers more (ops/partials.py): the first R_R sum the static R's partials GR (P, n, n) into GR_SUM, the
    others the static b's GB (P, n) into GB_SUM."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P:
        _write_bwd_worker(H, R, B, F, G, GH, GR, GB, GF, ticket.to(tl.int64), NT, CHUNK, D, stride_r, stride_b,
                          R_STATIC, B_STATIC, NS, BLOCK_D, BLOCK_N)
        partials.signal_stored(COUNTERS, P, REDUCE)
    elif REDUCE:
        rid = ticket - P
        if partials.wait_for_workers(COUNTERS, P, rid, RED):
            if rid < R_R:
                partials.reduce_into(GR, GR_SUM, rid, P, NS * NS, REDUCE_ROWS, REDUCE_COLS)
            else:
                partials.reduce_into(GB, GB_SUM, rid - R_R, P, NS, REDUCE_ROWS, REDUCE_COLS)
            partials.reducer_finished(COUNTERS, P, RED)


@triton.jit
def _write_bwd_worker(
    H, R, B, F, G, GH, GR, GB, GF, pid, NT, CHUNK, D, stride_r, stride_b,
    R_STATIC: tl.constexpr, B_STATIC: tl.constexpr, NS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Tokens [pid * CHUNK, (pid + 1) * CHUNK). A per-token coefficient's gradient is stored per token; a static
    one's (token stride 0) is summed over the chunk in registers and stored once per program (a partial)."""
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < NS
    r_tile = offs_n[:, None] * NS + offs_n[None, :]
    mr = mn[:, None] & mn[None, :]
    gr_sum = tl.zeros((BLOCK_N, BLOCK_N), dtype=tl.float32)
    gb_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for i in range(0, CHUNK):
        tok = pid * CHUNK + i
        if tok < NT:
            r = tl.load(R + tok * stride_r + r_tile, mask=mr, other=0.0).to(tl.float32)
            b = tl.load(B + tok * stride_b + offs_n, mask=mn, other=0.0).to(tl.float32)
            gr = tl.zeros((BLOCK_N, BLOCK_N), dtype=tl.float32)
            gb = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for start in range(0, D, BLOCK_D):
                offs_d = start + tl.arange(0, BLOCK_D)
                md = offs_d < D
                mt = md[:, None] & mn[None, :]
                tile = offs_d[:, None] * NS + offs_n[None, :]
                h = tl.load(H + tok * D * NS + tile, mask=mt, other=0.0).to(tl.float32)
                g = tl.load(G + tok * D * NS + tile, mask=mt, other=0.0).to(tl.float32)
                f = tl.load(F + tok * D + offs_d, mask=md, other=0.0).to(tl.float32)
                gh = tl.sum(g[:, None, :] * r[None, :, :], axis=2)  # (G R^T)_ik = sum_j g_ij r_kj
                tl.store(GH + tok * D * NS + tile, gh.to(GH.dtype.element_ty), mask=mt)
                tl.store(GF + tok * D + offs_d, tl.sum(g * b[None, :], axis=1).to(GF.dtype.element_ty), mask=md)
                gr += tl.sum(h[:, :, None] * g[:, None, :], axis=0)  # (h^T G)_kj = sum_i h_ik g_ij
                gb += tl.sum(g * f[:, None], axis=0)
            if R_STATIC:
                gr_sum += gr
            else:
                tl.store(GR + tok * NS * NS + r_tile, gr, mask=mr)
            if B_STATIC:
                gb_sum += gb
            else:
                tl.store(GB + tok * NS + offs_n, gb, mask=mn)
    if R_STATIC:
        tl.store(GR + pid * NS * NS + r_tile, gr_sum, mask=mr)
    if B_STATIC:
        tl.store(GB + pid * NS + offs_n, gb_sum, mask=mn)


# ------------------------------------------------------------------------------------------------ read


@triton.jit
def _read_fwd_kernel(H, A, OUT, D, stride_a, NS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    md = offs_d < D
    mn = offs_n < NS
    h = tl.load(H + tok * D * NS + offs_d[:, None] * NS + offs_n[None, :], mask=md[:, None] & mn[None, :], other=0.0)
    a = tl.load(A + tok * stride_a + offs_n, mask=mn, other=0.0).to(tl.float32)
    out = tl.sum(h.to(tl.float32) * a[None, :], axis=1)
    tl.store(OUT + tok * D + offs_d, out.to(OUT.dtype.element_ty), mask=md)


@triton.jit
def _read_bwd_kernel(
    H, A, G, GH, GA, GA_SUM, COUNTERS, NT, CHUNK, P, RED, D, stride_a,
    A_STATIC: tl.constexpr, NS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    REDUCE: tl.constexpr, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr,
):
    """P workers (:func:`_read_bwd_worker`); with REDUCE (a static a's gradient summed in the launch) RED reducers
    more, which sum its partials GA (P, n) into GA_SUM (ops/partials.py)."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P:
        _read_bwd_worker(H, A, G, GH, GA, ticket.to(tl.int64), NT, CHUNK, D, stride_a, A_STATIC, NS, BLOCK_D, BLOCK_N)
        partials.signal_stored(COUNTERS, P, REDUCE)
    elif REDUCE:
        partials.reducer(COUNTERS, P, GA, GA_SUM, ticket - P, P, NS, RED, REDUCE_ROWS, REDUCE_COLS)


@triton.jit
def _read_bwd_worker(
    H, A, G, GH, GA, pid, NT, CHUNK, D, stride_a,
    A_STATIC: tl.constexpr, NS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Tokens [pid * CHUNK, (pid + 1) * CHUNK); grad_a per token, or (static a) one partial per program."""
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < NS
    ga_sum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for i in range(0, CHUNK):
        tok = pid * CHUNK + i
        if tok < NT:
            a = tl.load(A + tok * stride_a + offs_n, mask=mn, other=0.0).to(tl.float32)
            ga = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for start in range(0, D, BLOCK_D):
                offs_d = start + tl.arange(0, BLOCK_D)
                md = offs_d < D
                mt = md[:, None] & mn[None, :]
                tile = offs_d[:, None] * NS + offs_n[None, :]
                g = tl.load(G + tok * D + offs_d, mask=md, other=0.0).to(tl.float32)
                h = tl.load(H + tok * D * NS + tile, mask=mt, other=0.0).to(tl.float32)
                tl.store(GH + tok * D * NS + tile, (g[:, None] * a[None, :]).to(GH.dtype.element_ty), mask=mt)
                ga += tl.sum(h * g[:, None], axis=0)
            if A_STATIC:
                ga_sum += ga
            else:
                tl.store(GA + tok * NS + offs_n, ga, mask=mn)
    if A_STATIC:
        tl.store(GA + pid * NS + offs_n, ga_sum, mask=mn)


# -------------------------------------------------------------------------------------------- sinkhorn


@triton.jit
def _sinkhorn_start(Z, N, NS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr):
    """The block's logits z (fp32), their (token, i, j) offsets and mask, the maxima and m0 = exp(z - max)."""
    offs_t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_n = tl.arange(0, BLOCK_N)
    mn = offs_n < NS
    idx = offs_t[:, None, None] * (NS * NS) + offs_n[None, :, None] * NS + offs_n[None, None, :]
    mask = (offs_t < N)[:, None, None] & mn[None, :, None] & mn[None, None, :]
    z = tl.load(Z + idx, mask=mask, other=0.0).to(tl.float32)
    zmax = tl.max(tl.max(tl.where(mask, z, float("-inf")), axis=2), axis=1)[:, None, None]
    m0 = tl.exp(tl.where(mask, z - zmax, float("-inf")))  # 0 outside the (n, n) tile and past the last token
    return z, idx, mask, zmax, m0


@triton.jit
def _sinkhorn_fwd_kernel(
    Z, OUT, N, iters, eps, NS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr
):
    z, idx, mask, zmax, m = _sinkhorn_start(Z, N, NS, BLOCK_T, BLOCK_N)
    for _ in range(iters):
        m = m / (tl.sum(m, axis=1)[:, None, :] + eps)  # columns (the reference's sum over axis -2)
        m = m / (tl.sum(m, axis=2)[:, :, None] + eps)  # rows
    tl.store(OUT + idx, m.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _sinkhorn_bwd_kernel(
    Z, G, GZ, N, iters, eps, NS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr
):
    z, idx, mask, zmax, m0 = _sinkhorn_start(Z, N, NS, BLOCK_T, BLOCK_N)
    gm = tl.load(G + idx, mask=mask, other=0.0).to(tl.float32)
    for t in range(iters):
        x = m0
        for _ in range(iters - 1 - t):  # the input of round iters-1-t, recomputed from the logits
            x = x / (tl.sum(x, axis=1)[:, None, :] + eps)
            x = x / (tl.sum(x, axis=2)[:, :, None] + eps)
        sc = tl.sum(x, axis=1)[:, None, :] + eps
        c = x / sc
        sr = tl.sum(c, axis=2)[:, :, None] + eps
        y = c / sr
        gc = tl.where(mask, (gm - tl.sum(gm * y, axis=2)[:, :, None]) / sr, 0.0)  # 0 in the padding
        gm = tl.where(mask, (gc - tl.sum(gc * c, axis=1)[:, None, :]) / sc, 0.0)
    gz = gm * m0
    ismax = tl.where(mask & (z == zmax), 1.0, 0.0)
    count = tl.maximum(tl.sum(tl.sum(ismax, axis=2), axis=1), 1.0)
    total = tl.sum(tl.sum(gz, axis=2), axis=1)
    gz = gz - (total / count)[:, None, None] * ismax
    tl.store(GZ + idx, gz.to(GZ.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------------- autograd Functions


def _token_stride(c: torch.Tensor, tail_dims: int) -> int:
    """A coefficient's token stride: 0 for a static one (only its ``tail_dims``), else its rows' size."""
    return 0 if c.dim() == tail_dims else c.stride(0)


def _backward_grid(nt: int, device: torch.device, static: bool) -> tuple[int, int]:
    """(programs, tokens per program): a persistent grid when a static coefficient's gradient is summed over
    the tokens, else one program per token."""
    return reduction_grid(nt, device) if static else (nt, 1)


def _coef_grad(grad: torch.Tensor, c: torch.Tensor, static: bool) -> torch.Tensor:
    """Where the gradient of coefficient c is written: a static coefficient's, summed by the kernel's reducers, in a
    tensor of c's dtype (ops/partials.py); a per-token one's in the kernel's fp32 output."""
    return torch.empty_like(c) if static else grad


def _reduction(h: torch.Tensor, *static: torch.Tensor | None) -> partials.Reduction | None:
    """The reduction of the static coefficients' gradients among ``static`` (None: per token), or None when every
    coefficient is per token (nothing summed over tokens)."""
    widths = [c.numel() for c in static if c is not None]
    return partials.start(h.device, *widths) if widths else None


def _reduction_args(red: partials.Reduction | None, h: torch.Tensor) -> tuple[torch.Tensor, int, dict]:
    """(counters, reducer programs, constants) of a launch with the reduction ``red`` (None: no reduction)."""
    if red is None:
        return torch.empty(partials.SLOTS, dtype=torch.int32, device=h.device), 0, dict(
            REDUCE=False, REDUCE_ROWS=1, REDUCE_COLS=partials.MIN_COLS)
    return red.counters, red.total, red.meta()


class StreamWriteTriton(torch.autograd.Function):
    """h (N, d, n) contiguous, r (N, n, n) and b (N, n) contiguous, or static r (n, n) and b (n,) (token stride
    0, shared by every token), f (N, d) contiguous -> h' (N, d, n) in h's dtype."""

    @staticmethod
    def forward(ctx, h, r, b, f):
        nt, d, n = h.shape
        bn = _block_n(n, "stream_write")
        bd = _block_d(d, bn * bn)
        out = torch.empty_like(h)
        launch(_write_fwd_kernel, (nt, triton.cdiv(d, bd)),
               (h, r, b, f, out, d, _token_stride(r, 2), _token_stride(b, 1)), writes=(4,),
               NS=n, BLOCK_D=bd, BLOCK_N=bn, num_warps=4)
        ctx.save_for_backward(h, r, b, f)
        return out

    @staticmethod
    def backward(ctx, g):
        h, r, b, f = ctx.saved_tensors
        nt, d, n = h.shape
        bn = _block_n(n, "stream_write")
        bd = _block_d(d, bn * bn)
        g = g.contiguous()
        r_static, b_static = r.dim() == 2, b.dim() == 1
        progs, chunk = _backward_grid(nt, h.device, r_static or b_static)
        gh, gf = torch.empty_like(h), torch.empty_like(f)
        gr = torch.empty(progs if r_static else nt, n, n, dtype=torch.float32, device=h.device)
        gb = torch.empty(progs if b_static else nt, n, dtype=torch.float32, device=h.device)
        gr_out, gb_out = _coef_grad(gr, r, r_static), _coef_grad(gb, b, b_static)
        red = _reduction(h, r if r_static else None, b if b_static else None)
        count, reducers, meta = _reduction_args(red, h)
        r_r = red.reducers[0] if r_static else 0
        launch(_write_bwd_kernel, (progs + reducers,),
               (h, r, b, f, g, gh, gr, gb, gf, gr_out, gb_out, count, nt, chunk, progs, r_r, reducers, d,
                _token_stride(r, 2), _token_stride(b, 1)),
               writes=(5, 6, 7, 8), apart=(9, 10, 11), R_STATIC=r_static, B_STATIC=b_static, NS=n, BLOCK_D=bd,
               BLOCK_N=bn, num_warps=4, **meta)
        if red is not None:
            red.finish("write_bwd_kernel", *((part, out) for part, out, static in
                                             ((gr, gr_out, r_static), (gb, gb_out, b_static)) if static))
        return gh, gr_out.to(r.dtype), gb_out.to(b.dtype), gf


class StreamReadTriton(torch.autograd.Function):
    """h (N, d, n) contiguous, a (N, n) contiguous or static (n,) (token stride 0) -> (N, d)."""

    @staticmethod
    def forward(ctx, h, a):
        nt, d, n = h.shape
        bn = _block_n(n, "stream_read")
        bd = _block_d(d, bn)
        out = torch.empty(nt, d, dtype=h.dtype, device=h.device)
        launch(_read_fwd_kernel, (nt, triton.cdiv(d, bd)), (h, a, out, d, _token_stride(a, 1)), writes=(2,),
               NS=n, BLOCK_D=bd, BLOCK_N=bn, num_warps=4)
        ctx.save_for_backward(h, a)
        return out

    @staticmethod
    def backward(ctx, g):
        h, a = ctx.saved_tensors
        nt, d, n = h.shape
        bn = _block_n(n, "stream_read")
        bd = _block_d(d, bn)
        a_static = a.dim() == 1
        progs, chunk = _backward_grid(nt, h.device, a_static)
        gh = torch.empty_like(h)
        ga = torch.empty(progs if a_static else nt, n, dtype=torch.float32, device=h.device)
        ga_out, red = _coef_grad(ga, a, a_static), _reduction(h, a if a_static else None)
        count, reducers, meta = _reduction_args(red, h)
        launch(_read_bwd_kernel, (progs + reducers,),
               (h, a, g.contiguous(), gh, ga, ga_out, count, nt, chunk, progs, reducers, d, _token_stride(a, 1)),
               writes=(3, 4), apart=(5, 6), A_STATIC=a_static, NS=n, BLOCK_D=bd, BLOCK_N=bn, num_warps=4, **meta)
        if red is not None:
            red.finish("read_bwd_kernel", (ga, ga_out))
        return gh, ga_out.to(a.dtype)


def _sinkhorn_grid(nt: int, n: int) -> tuple[int, int]:
    bn = _block_n(n, "sinkhorn_knopp")
    bt = max(1, min(triton.next_power_of_2(nt), 2048 // (bn * bn)))
    return bn, bt


class SinkhornTriton(torch.autograd.Function):
    """logits (N, n, n) contiguous -> the Sinkhorn-Knopp matrices (N, n, n) in ``out_dtype``; saves the logits."""

    @staticmethod
    def forward(ctx, logits, iters: int, eps: float, out_dtype: torch.dtype):
        nt, n, _ = logits.shape
        bn, bt = _sinkhorn_grid(nt, n)
        out = torch.empty(nt, n, n, dtype=out_dtype, device=logits.device)
        launch(_sinkhorn_fwd_kernel, (triton.cdiv(nt, bt),), (logits, out, nt, iters, eps), writes=(1,),
               NS=n, BLOCK_T=bt, BLOCK_N=bn, num_warps=4)
        keep_sinkhorn(ctx, logits, iters, eps)
        return out

    @staticmethod
    def backward(ctx, g):
        logits, iters, eps = kept_sinkhorn(ctx)
        nt, n, _ = logits.shape
        bn, bt = _sinkhorn_grid(nt, n)
        gz = torch.empty_like(logits)
        launch(_sinkhorn_bwd_kernel, (triton.cdiv(nt, bt),), (logits, g.contiguous(), gz, nt, iters, eps),
               writes=(2,), NS=n, BLOCK_T=bt, BLOCK_N=bn, num_warps=4)
        return gz, None, None, None


# ----------------------------------------------------------------------------------------------- entry points


def _per_token(c: torch.Tensor, lead: tuple[int, ...], tail: tuple[int, ...]) -> torch.Tensor:
    """A coefficient as (N, *tail) contiguous, or a static one as (*tail) contiguous (the kernels read it with
    token stride 0 and sum its gradient themselves)."""
    if c.dim() == len(tail):
        return c.contiguous()
    return c.expand(*lead, *tail).reshape(math.prod(lead), *tail).contiguous()


def stream_write_triton(h: torch.Tensor, r: torch.Tensor, b: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Fused ``h' = h R + f b^T``: h (..., d, n), r (n, n) or (..., n, n), b (n,) or (..., n), f (..., d)."""
    check_device("stream_write", h)
    *lead, d, n = h.shape
    lead = tuple(lead)
    nt = math.prod(lead)
    out = StreamWriteTriton.apply(
        h.reshape(nt, d, n).contiguous(), _per_token(r, lead, (n, n)), _per_token(b, lead, (n,)),
        f.expand(*lead, d).reshape(nt, d).contiguous(),
    )
    return out.view(h.shape)


def stream_read_triton(h: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Fused ``h_in = h a``: h (..., d, n), a (n,) or (..., n) -> (..., d) in h's dtype."""
    check_device("stream_read", h)
    *lead, d, n = h.shape
    lead = tuple(lead)
    out = StreamReadTriton.apply(h.reshape(math.prod(lead), d, n).contiguous(), _per_token(a, lead, (n,)))
    return out.view(*lead, d)


def sinkhorn_knopp_triton(logits: torch.Tensor, iters: int = 20, eps: float = 1e-6) -> torch.Tensor:
    """Sinkhorn-Knopp of (..., n, n) logits in registers; fp32 out (fp64 for fp64 logits, computed in fp32)."""
    check_device("sinkhorn_knopp", logits)
    n = logits.shape[-1]
    out_dtype = torch.promote_types(torch.float32, logits.dtype)
    out = SinkhornTriton.apply(logits.reshape(-1, n, n).contiguous(), int(iters), float(eps), out_dtype)
    return out.view(logits.shape)
