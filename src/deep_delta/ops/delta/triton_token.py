"""Triton kernels of the delta update fused with the next sublayer's TC read, forward and backward.

The TC read of token t needs the new states of tokens t-K+1..t, written by the update of those tokens, so
it cannot be computed from one token's tile as the CC read is. These kernels give each program a chunk of
``CHUNK`` consecutive tokens of one sequence and let it compute the K-1 tokens before the chunk again
(the halo: their state is read, their update recomputed, nothing written), so that every read it needs is
in its own registers:

forward   for t = t0-K+1 .. t0+CHUNK-1 (t >= 0): the update of token t as ops.delta.triton (fp32 math),
          x'_t stored (t >= t0); the read's contributions of x'_t (as stored, rounded) to the K tokens it
          reaches, r_m = sum_j w_m[:, j] x'_t[:, j] for t+m, added to K pending sums kept in registers (the
          sum of token t+m lives in slot (t+m) mod K, so nothing is shifted); the slot of t is then complete:
          x_in_t = that slot, stored (t >= t0), and the slot cleared.
backward  the gradient of x'_t is G_t + sum_s w_s g_in_{t+s} (the K rows of g_in, d-vectors, from L2), formed in
          registers; the update's backward as ops.delta.triton with it; the taps' gradient
          grad_w_s += g_in_{t+s} x'_t^T accumulated in fp32 registers. A persistent grid: at most
          ``max_programs`` programs (ops.delta.triton: 2 x the SM count on CUDA), each looping over chunks, so the partial buffer of grad_w is
          (programs, K, d, d_v) whatever the number of tokens, summed by torch (deterministic, no atomics).

Compared with the update followed by a separate TC read (two kernels each way): one pass over the state
instead of two forward (plus the halo's K-1 in CHUNK re-reads), and backward no separate state-sized
gradient of the read, no read of the state for grad_w and no state-sized gradient add. Without history
only (training and a cache-less forward); decoding keeps the separate read. Tested against the plain
reference (update, then the TC read) under ``TRITON_INTERPRET=1`` (tests/ops/test_kernels_token_read.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deep_delta.ops.delta.recompute import active_tape, delta_rebuild
from deep_delta.ops.delta.triton import (
    _blocks,
    _token_update,
    check_device,
    delta_warps,
    max_programs,
    sum_partials,
)
from deep_delta.ops.launch import launch

CHUNK = 32  # forward tokens per program: halo overhead (K-1)/CHUNK, 8 x 1024 tokens -> 256 programs
# backward tokens per chunk of the persistent loop (no halo there). Alone, 8 tokens with 16 warps ran 1.09x faster
# than 32 with 8 (tune_kernels.py on an H200, 2026-11-26), but the compiled training step of DDL-TC with them ran
# at 0.34x the baseline on that H200 against 0.49x with these on an H100 (2026-11-25), with no same-device run of
# the step to tell the device from the change: these stay until one does (benchmarks/h100/README.md)
BWD_CHUNK = 32


@triton.jit
def _delta_tc_fwd_kernel(
    X, K, V, BETA, W, OUT, XIN, DELTA,
    T, D, DV, eps2_over_d, inv_sqrt_d,
    HAS_DELTA: tl.constexpr, KS: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0)
    t0 = tl.program_id(1) * CHUNK
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    offs_q = tl.arange(0, BLOCK_K)
    md = offs_d < D
    mv = offs_v < DV
    mq = offs_q < KS
    mt = md[:, None] & mv[None, :]
    tile = offs_d[:, None] * DV + offs_v[None, :]
    pending = tl.zeros((BLOCK_K, BLOCK_D), dtype=tl.float32)
    start = tl.maximum(t0 - (KS - 1), 0)
    stop = tl.minimum(t0 + CHUNK, T)
    for t in range(start, stop):
        n = b * T + t
        keep_d = md & (((offs_d * 0) + t) >= t0)  # halo tokens are computed, not stored
        keep_v = mv & (((offs_v * 0) + t) >= t0)
        x, u, rho, v, beta, p, delta = _token_update(X, K, V, BETA, n, offs_d, offs_v, tile, md, mv, D, DV,
                                                     eps2_over_d, inv_sqrt_d)
        if HAS_DELTA:
            tl.store(DELTA + n * DV + offs_v, delta, mask=keep_v)
        out_st = (x + u[:, None] * delta[None, :]).to(OUT.dtype.element_ty)
        tl.store(OUT + n * D * DV + tile, out_st, mask=keep_d[:, None] & mv[None, :])
        out = out_st.to(tl.float32)  # the read sees the stored (rounded) state, as a separate read would
        # slot q holds the read of token t' = t + ((q - t) mod K): x'_t enters it through tap (q - t) mod K
        tap = (offs_q + KS - (t % KS)) % KS
        w = tl.load(W + tap[:, None, None] * D * DV + tile[None, :, :], mask=mq[:, None, None] & mt[None, :, :],
                    other=0.0).to(tl.float32)
        pending += tl.sum(w * out[None, :, :], axis=2)
        done = offs_q == (t % KS)
        xin = tl.sum(tl.where(done[:, None], pending, 0.0), axis=0)
        tl.store(XIN + n * D + offs_d, xin.to(XIN.dtype.element_ty), mask=keep_d)
        pending = tl.where(done[:, None], 0.0, pending)


@triton.jit
def _delta_tc_bwd_kernel(
    X, K, V, BETA, W, G, GIN,
    GX, GK, GV, GBETA, GW_PART,
    T, D, DV, n_chunks, chunks_per_seq, eps2_over_d, inv_sqrt_d,
    KS: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    offs_q = tl.arange(0, BLOCK_K)
    md = offs_d < D
    mv = offs_v < DV
    mq = offs_q < KS
    mt = md[:, None] & mv[None, :]
    tile = offs_d[:, None] * DV + offs_v[None, :]
    w = tl.load(W + offs_q[:, None, None] * D * DV + tile[None, :, :], mask=mq[:, None, None] & mt[None, :, :],
                other=0.0).to(tl.float32)
    gw = tl.zeros((BLOCK_K, BLOCK_D, BLOCK_V), dtype=tl.float32)
    for chunk in range(pid, n_chunks, programs):
        b = chunk // chunks_per_seq
        t0 = (chunk % chunks_per_seq) * CHUNK
        for t in range(t0, tl.minimum(t0 + CHUNK, T)):
            n = b * T + t
            x, u, rho, v, beta, p, delta = _token_update(X, K, V, BETA, n, offs_d, offs_v, tile, md, mv, D, DV,
                                                         eps2_over_d, inv_sqrt_d)
            out = (x + u[:, None] * delta[None, :]).to(X.dtype.element_ty).to(tl.float32)
            ts = t + offs_q  # the tokens whose read x'_t enters, through tap s = ts - t
            okq = mq & (ts < T)
            gin = tl.load(GIN + (b * T + ts)[:, None] * D + offs_d[None, :], mask=okq[:, None] & md[None, :],
                          other=0.0).to(tl.float32)
            g = tl.load(G + n * D * DV + tile, mask=mt, other=0.0).to(tl.float32)
            g = g + tl.sum(w * gin[:, :, None], axis=0)
            gw += gin[:, :, None] * out[None, :, :]
            a = tl.sum(u[:, None] * g, axis=0)
            gp = -beta * a
            tl.store(GX + n * D * DV + tile, (g + u[:, None] * gp[None, :]).to(GX.dtype.element_ty), mask=mt)
            gu = tl.sum(g * delta[None, :] + x * gp[None, :], axis=1)
            gk = rho * (gu - u * tl.sum(u * gu, axis=0))
            tl.store(GK + n * D + offs_d, gk.to(GK.dtype.element_ty), mask=md)
            tl.store(GV + n * DV + offs_v, (beta * a).to(GV.dtype.element_ty), mask=mv)
            gb = tl.full((BLOCK_V,), 0.0, tl.float32) + tl.sum(a * (v - p), axis=0)
            tl.store(GBETA + n + offs_v * 0, gb.to(GBETA.dtype.element_ty), mask=mv & (offs_v == 0))
    tl.store(GW_PART + pid * KS * D * DV + offs_q[:, None, None] * D * DV + tile[None, :, :], gw,
             mask=mq[:, None, None] & mt[None, :, :])


def _chunk(t: int, most: int) -> int:
    return min(most, triton.next_power_of_2(max(t, 1)))


def token_read_forward(x, k, v, beta, w, k_eps: float, want_delta: bool = False):
    """(x', x_in, delta or None). x: (B, T, d, d_v), k: (B, T, d), v: (B, T, d_v), beta: (B, T), w: (K, d, d_v),
    all contiguous; x_in (B, T, d) in x's dtype, delta (B, T, d_v) fp32."""
    bsz, t, d, dv = x.shape
    ks = w.shape[0]
    bd, bv = _blocks(d, dv)
    chunk = _chunk(t, CHUNK)
    out = torch.empty_like(x)
    xin = torch.empty(bsz, t, d, dtype=x.dtype, device=x.device)
    delta = torch.empty(bsz, t, dv, dtype=torch.float32, device=x.device) if want_delta else None
    launch(
        _delta_tc_fwd_kernel, (bsz, triton.cdiv(t, chunk)),
        (x, k, v, beta, w, out, xin, out if delta is None else delta, t, d, dv, k_eps * k_eps / d, 1.0 / math.sqrt(d)),
        writes=(5, 6, 7), HAS_DELTA=want_delta, KS=ks, BLOCK_K=triton.next_power_of_2(ks), CHUNK=chunk,
        BLOCK_D=bd, BLOCK_V=bv, num_warps=delta_warps(bd * bv),
    )
    return out, xin, delta


def token_read_backward(g, gin, x, k, v, beta, w, k_eps: float):
    """(grad_x, grad_k, grad_v, grad_beta, grad_w) for the upstream gradients g (of x') and gin (of x_in, or
    None for zero); shapes as :func:`token_read_forward`'s inputs."""
    bsz, t, d, dv = x.shape
    ks = w.shape[0]
    bd, bv = _blocks(d, dv)
    chunk = _chunk(t, BWD_CHUNK)
    per_seq = triton.cdiv(t, chunk)
    n_chunks = bsz * per_seq
    programs = min(n_chunks, max_programs(x.device))
    gin = torch.zeros(bsz, t, d, dtype=x.dtype, device=x.device) if gin is None else gin.contiguous()
    gx, gk, gv, gbeta = torch.empty_like(x), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    gw_part = torch.empty(programs, ks, d, dv, dtype=torch.float32, device=x.device)
    launch(
        _delta_tc_bwd_kernel, (programs,),
        (x, k, v, beta, w, g.contiguous(), gin, gx, gk, gv, gbeta, gw_part, t, d, dv, n_chunks, per_seq,
         k_eps * k_eps / d, 1.0 / math.sqrt(d)),
        writes=(7, 8, 9, 10, 11), KS=ks, BLOCK_K=triton.next_power_of_2(ks), CHUNK=chunk, BLOCK_D=bd,
        BLOCK_V=bv, num_warps=delta_warps(bd * bv),
    )
    return gx, gk, gv, gbeta, sum_partials(gw_part, w.dtype)


class DeltaUpdateTokenRead(torch.autograd.Function):
    """x: (B, T, d, d_v), k: (B, T, d), v: (B, T, d_v), beta: (B, T), w: (K, d, d_v), contiguous -> (x', x_in)."""

    @staticmethod
    def forward(ctx, x, k, v, beta, w, k_eps: float):
        tape = active_tape()
        out, xin, delta = token_read_forward(x, k, v, beta, w, k_eps, want_delta=tape is not None)
        if tape is not None:  # x is saved as a handle that rebuilds it from out
            tape.record(x, out, delta_rebuild(k.reshape(-1, k.shape[-1]), delta.reshape(-1, delta.shape[-1]), k_eps))
        ctx.save_for_backward(x, k, v, beta, w)
        ctx.k_eps = k_eps
        return out, xin

    @staticmethod
    def backward(ctx, g, gin):
        x, k, v, beta, w = ctx.saved_tensors
        return (*token_read_backward(g, gin, x, k, v, beta, w, ctx.k_eps), None)


def delta_update_token_read_triton(x, k, v, beta, weight, *, k_eps: float = 1e-5):
    """Fused update and TC read of the new state: (x', x_in) with ``x_in_t = sum_s sum_j w_s[:, j] x'_{t-s}[:, j]``.

    x: (B, T, d, d_v), k: (B, T, d), v: (B, T, d_v), beta: (B, T, 1), weight: (K, d, d_v) the next sublayer's
    folded TC taps (no token history: the K-1 states before the first token are zero).
    """
    check_device("update_and_token_read", x)
    bsz, t = x.shape[:2]
    out, xin = DeltaUpdateTokenRead.apply(x.contiguous(), k.contiguous(), v.contiguous(),
                                          beta.reshape(bsz, t).contiguous(), weight.contiguous(), float(k_eps))
    return out, xin
