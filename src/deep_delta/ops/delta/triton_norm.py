"""Triton kernels of a delta update fused with the next sublayer's input stage (issue 40, item 1): d_v = 1 (below),
and d_v > 1 through the next sublayer's CC read (``_update_read_norm_*``: the same, with x_in = sum_j c_ij x'_ij of
the tile just written as the input stage's source; no x_in written, its gradient g_in kept in registers).

forward   read x, k, v, beta (one token's row each) and the next sublayer's g, w_g, b_g, W_v, b_v
          -> u = k rsqrt(mean(k^2) + eps_k^2/d) / sqrt(d), p = u . x, delta = beta (v - p)       (fp32)
          -> write x' = x + u delta                                                           (x's dtype)
          -> from the stored row s = x' (as the next sublayer reads it): c = RMSNorm(s) g,
             beta' = beta_max sigmoid(c . w_g + b_g), v' = value_scale sigmoid(W_v s + b_v)
          write c (c_dtype), beta' (N, 1), v' (N, d_v') (fp32)
backward  read x, k, v, beta, G = dL/dx', gc, gbeta', gv'; recompute x' in registers (as stored) and the norm's
          forward; the norm's backward gives dL/dx' through the next sublayer's input stage, which joins G in
          fp32; then the update's backward: write grad_x, grad_k, grad_v, grad_beta; the next sublayer's weight
          gradients (g, w_g, b_g, W_v, b_v) summed over the tokens on a persistent grid with reducers in the
          same launch (:mod:`deep_delta.ops.partials`, as :mod:`.triton`'s backward)

So each state row is read once and written once per direction for the update and the next sublayer's norm
together, where the unfused pair reads x' again in the norm's forward and backward and writes and re-reads the
norm's gradient of x'. The per-token math is :mod:`.triton`'s one-pass form (``norm_row_forward``,
``norm_row_backward``) and the d_v = 1 update of :mod:`deep_delta.ops.delta.triton`, on vectors. Tested against
the reference (:func:`deep_delta.ops.delta.naive.update_and_norm_reference`) under ``TRITON_INTERPRET=1``
(tests/ops/test_update_and_norm.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deep_delta.ops import partials
from deep_delta.ops.delta import triton as delta_triton
from deep_delta.ops.delta.lean_norm import missing_update_grads
from deep_delta.ops.delta.rules import rule_spec
from deep_delta.ops.launch import (
    MAX_WIDTH,
    NORM_SHARE,
    check_device,
    delta_rows,
    delta_warps,
    launch,
    record,
    reduction_grid,
    state_blocks,
)
from deep_delta.ops.norm.triton import (
    norm_outputs,
    norm_partial_buffers,
    norm_partials_add,
    norm_partials_store,
    norm_partials_zero,
    norm_reducer,
    norm_row_backward,
    norm_row_forward,
    norm_row_store,
    norm_sums,
    norm_weights,
    norm_widths,
)

# Launch choices, not yet timed on a GPU (2026-11-27). d_v = 1: the forward and backward at the delta kernels' warps
# (one per 1024 fp32 values of the tile, at least 2), one token per program forward, a persistent backward grid of
# 4 programs per SM (the d_v = 1 norm backward's). Through the CC read (d_v > 1): the forward as the fused update +
# CC read; the backward holds the read's and the norm's weight tiles and their gradients' accumulators besides
# the token's tiles, so twice the warps (sm_90 without a GPU, d = 768, d_v = 4: 251 / 255 registers bf16 / fp32
# state at 8 warps, spilling 0 / 8 bytes, against 576 / 656 at 4; kernel_resources.py) on one program per SM.
BWD_PER_SM = 4
READ_BWD_PER_SM = 1
WARPS = None  # every kernel here at this many warps (None: the rules above); for tune_kernels.py


def _warps(elements: int, factor: int = 1) -> int:
    return WARPS if WARPS is not None else min(16, factor * delta_warps(elements))


@triton.jit
def _vector_update(X, K, V, BETA, n, offs_d, offs_1, ok_d, ok_1, D, eps2_over_d, inv_sqrt_d, ERASE: tl.constexpr):
    """Token n's d_v = 1 update in fp32 registers: (x, u, rho, v, beta, beta_e, p, delta) with u = k rho,
    rho = rsqrt(mean(k^2) + eps^2/d) / sqrt(d), p = u . x, delta = beta (v - p) (v and the gates read as lane 0 of a
    vector: no scalar loads, for the interpreter). ERASE: the update rule, as ops.delta.triton's (0: delta = beta v,
    x not read for p; 2: delta = beta v - beta_e p, BETA (N, 2) = (beta_e, beta))."""
    k = tl.load(K + n * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
    x = tl.load(X + n * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
    v = tl.sum(tl.load(V + n + offs_1 * 0, mask=ok_1, other=0.0).to(tl.float32), axis=0)
    if ERASE == 2:
        beta = tl.sum(tl.load(BETA + 2 * n + 1 + offs_1 * 0, mask=ok_1, other=0.0).to(tl.float32), axis=0)
        beta_e = tl.sum(tl.load(BETA + 2 * n + offs_1 * 0, mask=ok_1, other=0.0).to(tl.float32), axis=0)
    else:
        beta = tl.sum(tl.load(BETA + n + offs_1 * 0, mask=ok_1, other=0.0).to(tl.float32), axis=0)
        beta_e = beta
    rho = tl.rsqrt(tl.sum(k * k, axis=0) / D + eps2_over_d) * inv_sqrt_d
    u = k * rho
    if ERASE == 0:
        p = v * 0.0
        delta = beta * v
    elif ERASE == 2:
        p = tl.sum(u * x, axis=0)
        delta = beta * v - beta_e * p
    else:
        p = tl.sum(u * x, axis=0)
        delta = beta * (v - p)
    return x, u, rho, v, beta, beta_e, p, delta


@triton.jit
def _update_norm_fwd_kernel(
    X, K, V, BETA, NW, GW, GB, WV, BV, OUT, C, BETA2, V2,
    N, D, DV, eps2_over_d, inv_sqrt_d, eps, beta_max, value_scale,
    BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, ERASE: tl.constexpr, GATES: tl.constexpr,
):
    """One token per program: its update (by the rule ERASE), then the next sublayer's (c, beta', v') from the row
    just stored (its gate's GATES outputs)."""
    n = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    ok_d = offs_d < D
    ok_v = offs_v < DV
    wv, g1, wg1, gw1, bg1, bv1, wg2, gw2, bg2 = norm_weights(NW, GW, GB, WV, BV, offs_d, offs_v, D, DV, GATES)
    x, u, rho, v, beta, beta_e, p, delta = _vector_update(X, K, V, BETA, n, offs_d, offs_v, ok_d, offs_v == 0, D,
                                                          eps2_over_d, inv_sqrt_d, ERASE)
    out = (x + u * delta).to(OUT.dtype.element_ty)
    tl.store(OUT + n * D + offs_d, out, mask=ok_d)
    s = out.to(NW.dtype.element_ty).to(tl.float32)  # the stored row, read in the norm weight's dtype
    r, c, s_g, s_v, s_g2 = norm_row_forward(s, g1, gw1, bg1, bv1, wv, gw2, bg2, D, eps, GATES)
    norm_row_store(C, BETA2, V2, n, c, s_g, s_v, s_g2, offs_d, offs_v, ok_d, ok_v, D, DV, beta_max, value_scale,
                   GATES)


@triton.jit
def _update_norm_bwd_kernel(
    X, K, V, BETA, NW, GW, GB, WV, BV, G, GC, GBETA2, GV2,
    GX, GK, GV, GBETA, PART_D, PART_V, PART_B, G_NW, G_GW, G_GB, G_WV, G_BV, COUNTERS,
    N, CHUNK, P, R_D, R_V, R, D, DV, eps2_over_d, inv_sqrt_d, eps, beta_max, value_scale,
    BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, REDUCE: tl.constexpr, REDUCE_ROWS: tl.constexpr,
    REDUCE_COLS: tl.constexpr, ERASE: tl.constexpr, GATES: tl.constexpr,
):
    """P workers (:func:`_update_norm_bwd_worker`) and (REDUCE) R reducers (``norm_reducer``, ops/partials.py)."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P:
        _update_norm_bwd_worker(X, K, V, BETA, NW, GW, GB, WV, BV, G, GC, GBETA2, GV2, GX, GK, GV, GBETA, PART_D,
                                PART_V, PART_B, ticket, N, CHUNK, D, DV, eps2_over_d, inv_sqrt_d, eps, beta_max,
                                value_scale, BLOCK_D, BLOCK_V, ERASE, GATES)
        partials.signal_stored(COUNTERS, P, REDUCE)
    elif REDUCE:
        norm_reducer(PART_D, PART_V, PART_B, G_NW, G_GW, G_GB, G_WV, G_BV, COUNTERS, ticket - P, P, R_D, R_V, R, D, DV,
                     REDUCE_ROWS, REDUCE_COLS, GATES)


@triton.jit
def _update_norm_bwd_worker(
    X, K, V, BETA, NW, GW, GB, WV, BV, G, GC, GBETA2, GV2, GX, GK, GV, GBETA, PART_D, PART_V, PART_B, pid,
    N, CHUNK, D, DV, eps2_over_d, inv_sqrt_d, eps, beta_max, value_scale,
    BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, ERASE: tl.constexpr, GATES: tl.constexpr,
):
    """Tokens [pid * CHUNK, (pid + 1) * CHUNK): per token the norm's backward on the recomputed x', its gradient
    added to G's row, then the update's backward (by the rule ERASE, as ops.delta.triton's ``token_grads_store``);
    the norm weights' gradients summed over the chunk in fp32."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    wv, g1, wg1, gw1, bg1, bv1, wg2, gw2, bg2 = norm_weights(NW, GW, GB, WV, BV, offs_d, offs_v, D, DV, GATES)
    acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2 = norm_partials_zero(BLOCK_D, BLOCK_V)
    for i in range(0, CHUNK):
        n = pid * CHUNK + i
        ok_d = md & ((offs_d * 0 + n) < N)
        ok_v = mv & ((offs_v * 0 + n) < N)
        ok_1 = (offs_v == 0) & ((offs_v * 0 + n) < N)
        x, u, rho, v, beta, beta_e, p, delta = _vector_update(X, K, V, BETA, n, offs_d, offs_v, ok_d, ok_1, D,
                                                              eps2_over_d, inv_sqrt_d, ERASE)
        s = (x + u * delta).to(X.dtype.element_ty).to(NW.dtype.element_ty).to(tl.float32)  # x' as stored
        gc = tl.load(GC + n * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
        gbeta2 = tl.load(GBETA2 + GATES * n + offs_v * 0, mask=ok_1, other=0.0).to(tl.float32)
        if GATES == 2:
            gbeta2b = tl.load(GBETA2 + 2 * n + 1 + offs_v * 0, mask=ok_1, other=0.0).to(tl.float32)
        else:
            gbeta2b = gbeta2
        gv2 = tl.load(GV2 + n * DV + offs_v, mask=ok_v, other=0.0).to(tl.float32)
        gsrc, inc_g, inc_wg, dlg, dlv, inc_wg2, dlg2 = norm_row_backward(s, gc, gbeta2, gv2, g1, wg1, gw1, bg1, bv1,
                                                                         wv, gbeta2b, wg2, gw2, bg2, D, eps, beta_max,
                                                                         value_scale, GATES)
        acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2 = norm_partials_add(
            acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2, inc_g, inc_wg, dlg, dlv, s, inc_wg2, dlg2, GATES)
        # the update's backward for the whole gradient of x'
        g = tl.load(G + n * D + offs_d, mask=ok_d, other=0.0).to(tl.float32) + gsrc
        a = tl.sum(u * g, axis=0)
        if ERASE == 0:  # no read: grad_x is G, and x takes no part in grad_u
            gx = g
            gu = g * delta
        else:
            if ERASE == 2:
                gp = -beta_e * a
            else:
                gp = -beta * a
            gx = g + u * gp
            gu = g * delta + x * gp
        tl.store(GX + n * D + offs_d, gx.to(GX.dtype.element_ty), mask=ok_d)
        gk = rho * (gu - u * tl.sum(u * gu, axis=0))
        tl.store(GK + n * D + offs_d, gk.to(GK.dtype.element_ty), mask=ok_d)
        lane = tl.full((BLOCK_V,), 0.0, tl.float32)
        tl.store(GV + n + offs_v * 0, (lane + beta * a).to(GV.dtype.element_ty), mask=ok_1)
        if ERASE == 1:
            tl.store(GBETA + n + offs_v * 0, (lane + a * (v - p)).to(GBETA.dtype.element_ty), mask=ok_1)
        elif ERASE == 2:
            tl.store(GBETA + 2 * n + 1 + offs_v * 0, (lane + a * v).to(GBETA.dtype.element_ty), mask=ok_1)
            tl.store(GBETA + 2 * n + offs_v * 0, (lane - a * p).to(GBETA.dtype.element_ty), mask=ok_1)
        else:
            tl.store(GBETA + n + offs_v * 0, (lane + a * v).to(GBETA.dtype.element_ty), mask=ok_1)
    norm_partials_store(PART_D, PART_V, PART_B, pid, acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2, offs_d,
                        offs_v, D, DV, GATES)


@triton.jit
def _update_read_norm_fwd_kernel(
    X, K, V, BETA, CR, NW, GW, GB, WV, BV, OUT, C, BETA2, V2,
    N, D, eps2_over_d, inv_sqrt_d, eps, beta_max, value_scale,
    ROWS: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr, ERASE: tl.constexpr,
    GATES: tl.constexpr,
):
    """ROWS tokens per program: the update of each (d, d_v) tile (by the rule ERASE), x' stored, the CC read
    x_in = sum_j c_ij x'_ij of the stored tile (rounded to x's dtype, as the unfused read stores it), and from it the
    next sublayer's (c, beta', v') (d_v' = d_v: the next sublayer reads the same state; its gate's GATES outputs)."""
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    tile = offs_d[:, None] * DV + offs_v[None, :]
    cr = tl.load(CR + tile, mask=md[:, None] & mv[None, :], other=0.0).to(tl.float32)
    wv, g1, wg1, gw1, bg1, bv1, wg2, gw2, bg2 = norm_weights(NW, GW, GB, WV, BV, offs_d, offs_v, D, DV, GATES)
    for r in range(ROWS):
        n = pid * ROWS + r
        ok_d = md & ((offs_d * 0 + n) < N)
        ok_v = mv & ((offs_v * 0 + n) < N)
        x, u, rho, v, beta, beta_e, p, delta = delta_triton.token_update(X, K, V, BETA, n, offs_d, offs_v, tile, ok_d,
                                                                         ok_v, D, DV, eps2_over_d, inv_sqrt_d, ERASE)
        out = (x + u[:, None] * delta[None, :]).to(OUT.dtype.element_ty)
        tl.store(OUT + n * D * DV + tile, out, mask=ok_d[:, None] & ok_v[None, :])
        xin = tl.sum(out.to(tl.float32) * cr, axis=1).to(OUT.dtype.element_ty)
        s = xin.to(NW.dtype.element_ty).to(tl.float32)
        r_, c, s_g, s_v, s_g2 = norm_row_forward(s, g1, gw1, bg1, bv1, wv, gw2, bg2, D, eps, GATES)
        norm_row_store(C, BETA2, V2, n, c, s_g, s_v, s_g2, offs_d, offs_v, ok_d, ok_v, D, DV, beta_max, value_scale,
                       GATES)


@triton.jit
def _update_read_norm_bwd_kernel(
    X, K, V, BETA, CR, NW, GW, GB, WV, BV, G, GC, GBETA2, GV2,
    GX, GK, GV, GBETA, PART_C, PART_D, PART_V, PART_B, G_CR, G_NW, G_GW, G_GB, G_WV, G_BV, COUNTERS,
    N, CHUNK, P, R_C, R_D, R_V, R, D, eps2_over_d, inv_sqrt_d, eps, beta_max, value_scale,
    BLOCK_D: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr, REDUCE: tl.constexpr,
    REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr, ERASE: tl.constexpr, GATES: tl.constexpr,
):
    """P workers (:func:`_update_read_norm_bwd_worker`) and (REDUCE) R reducers: the first R_C sum the read's weight
    gradient (PART_C (P, d d_v) into G_CR), the rest the next sublayer's norm weights' (``norm_reducer``)."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P:
        _update_read_norm_bwd_worker(X, K, V, BETA, CR, NW, GW, GB, WV, BV, G, GC, GBETA2, GV2, GX, GK, GV, GBETA,
                                     PART_C, PART_D, PART_V, PART_B, ticket, N, CHUNK, D, eps2_over_d, inv_sqrt_d, eps,
                                     beta_max, value_scale, BLOCK_D, DV, BLOCK_V, ERASE, GATES)
        partials.signal_stored(COUNTERS, P, REDUCE)
    elif REDUCE:
        if ticket - P < R_C:
            partials.reducer(COUNTERS, P, PART_C, G_CR, ticket - P, P, D * DV, R, REDUCE_ROWS, REDUCE_COLS)
        else:
            norm_reducer(PART_D, PART_V, PART_B, G_NW, G_GW, G_GB, G_WV, G_BV, COUNTERS, ticket - P - R_C, P, R_D,
                         R_V, R, D, DV, REDUCE_ROWS, REDUCE_COLS, GATES)


@triton.jit
def _update_read_norm_bwd_worker(
    X, K, V, BETA, CR, NW, GW, GB, WV, BV, G, GC, GBETA2, GV2, GX, GK, GV, GBETA, PART_C, PART_D, PART_V, PART_B,
    pid, N, CHUNK, D, eps2_over_d, inv_sqrt_d, eps, beta_max, value_scale,
    BLOCK_D: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr, ERASE: tl.constexpr, GATES: tl.constexpr,
):
    """Tokens [pid * CHUNK, (pid + 1) * CHUNK): x' and its read x_in recomputed as stored, the next sublayer's input
    stage's backward on x_in (its gradient g_in in fp32), then the read's (G += g_in c^T, grad_c += g_in x'^T) and
    the update's backward; the read's and the norm weights' gradients summed over the chunk in fp32."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    mw = md[:, None] & mv[None, :]
    tile = offs_d[:, None] * DV + offs_v[None, :]
    cr = tl.load(CR + tile, mask=mw, other=0.0).to(tl.float32)
    wv, g1, wg1, gw1, bg1, bv1, wg2, gw2, bg2 = norm_weights(NW, GW, GB, WV, BV, offs_d, offs_v, D, DV, GATES)
    acc_c = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
    acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2 = norm_partials_zero(BLOCK_D, BLOCK_V)
    for i in range(0, CHUNK):
        n = pid * CHUNK + i
        ok_d = md & ((offs_d * 0 + n) < N)
        ok_v = mv & ((offs_v * 0 + n) < N)
        x, u, rho, v, beta, beta_e, p, delta = delta_triton.token_update(X, K, V, BETA, n, offs_d, offs_v, tile, ok_d,
                                                                         ok_v, D, DV, eps2_over_d, inv_sqrt_d, ERASE)
        out = (x + u[:, None] * delta[None, :]).to(X.dtype.element_ty).to(tl.float32)  # x' as stored
        s = tl.sum(out * cr, axis=1).to(X.dtype.element_ty).to(NW.dtype.element_ty).to(tl.float32)  # x_in as stored
        gc = tl.load(GC + n * D + offs_d, mask=ok_d, other=0.0).to(tl.float32)
        gbeta2 = tl.load(GBETA2 + GATES * n + offs_v * 0, mask=ok_v & (offs_v == 0), other=0.0).to(tl.float32)
        if GATES == 2:
            gbeta2b = tl.load(GBETA2 + 2 * n + 1 + offs_v * 0, mask=ok_v & (offs_v == 0), other=0.0).to(tl.float32)
        else:
            gbeta2b = gbeta2
        gv2 = tl.load(GV2 + n * DV + offs_v, mask=ok_v, other=0.0).to(tl.float32)
        gin, inc_g, inc_wg, dlg, dlv, inc_wg2, dlg2 = norm_row_backward(s, gc, gbeta2, gv2, g1, wg1, gw1, bg1, bv1, wv,
                                                                        gbeta2b, wg2, gw2, bg2, D, eps, beta_max,
                                                                        value_scale, GATES)
        acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2 = norm_partials_add(
            acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2, inc_g, inc_wg, dlg, dlv, s, inc_wg2, dlg2, GATES)
        g = tl.load(G + n * D * DV + tile, mask=ok_d[:, None] & ok_v[None, :], other=0.0).to(tl.float32)
        g = g + gin[:, None] * cr
        acc_c += gin[:, None] * out
        delta_triton.token_grads_store(GX, GK, GV, GBETA, n, g, x, u, rho, v, beta, beta_e, p, delta, offs_d, offs_v,
                                       tile, ok_d, ok_v, D, DV, ERASE)
    tl.store(PART_C + pid * D * DV + tile, acc_c, mask=mw)
    norm_partials_store(PART_D, PART_V, PART_B, pid, acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2, offs_d,
                        offs_v, D, DV, GATES)


def _blocks(d: int, dv: int) -> tuple[int, int]:
    if d > MAX_WIDTH:
        raise ValueError(f"update_and_norm (triton): width d must be <= {MAX_WIDTH}, got {d}")
    return triton.next_power_of_2(d), triton.next_power_of_2(dv)


def triton_forward(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, norm_weight: torch.Tensor,
    gate_weight: torch.Tensor, gate_bias: torch.Tensor, value_weight: torch.Tensor, value_bias: torch.Tensor,
    k_eps: float, eps: float, beta_max: float, value_scale: float, c_dtype: torch.dtype | None = None,
    rule: str = "delta",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch: (x' (N, d) in x's dtype, c (N, d) in c_dtype (None: the norm weight's), beta' (N, G'),
    v' (N, d_v')) for contiguous x, k (N, d), v, beta (N, 1) ((N, 2) for the untied ``rule``) and the next
    sublayer's weights (G' = its gate's outputs, gate_weight (G', d))."""
    n, d = x.shape
    dv, gates = value_weight.shape[0], gate_weight.shape[0]
    bd, bv = _blocks(d, dv)
    out = torch.empty_like(x)
    c, beta2, v2 = norm_outputs(n, d, dv, norm_weight, c_dtype, x.device, gates)
    if n == 0:
        return out, c, beta2, v2
    launch(
        _update_norm_fwd_kernel, (n,),
        (x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, out, c, beta2, v2, n, d, dv,
         k_eps * k_eps / d, 1.0 / math.sqrt(d), float(eps), float(beta_max), float(value_scale)),
        writes=(9, 10, 11, 12), apart=(4, 5, 6, 7, 8, 10, 11, 12), BLOCK_D=bd, BLOCK_V=bv,
        ERASE=rule_spec(rule).erase, GATES=gates, num_warps=_warps(bd * bv),
    )
    # the next sublayer's share of the launch, recorded on its own: what the update alone would not move
    record("update_norm_fwd_kernel" + NORM_SHARE, (norm_weight, gate_weight, gate_bias, value_weight, value_bias),
           (c, beta2, v2))
    return out, c, beta2, v2


def triton_backward(
    g: torch.Tensor, gc: torch.Tensor, gbeta2: torch.Tensor, gv2: torch.Tensor, x: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor, beta: torch.Tensor, norm_weight: torch.Tensor, gate_weight: torch.Tensor,
    gate_bias: torch.Tensor, value_weight: torch.Tensor, value_bias: torch.Tensor, k_eps: float, eps: float,
    beta_max: float, value_scale: float, rule: str = "delta",
) -> tuple[torch.Tensor, ...]:
    """One launch: the gradients of (x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight,
    value_bias), each its own tensor in its input's dtype and shape; the weight gradients summed over the tokens
    in the launch (ops/partials.py)."""
    n, d = x.shape
    dv, gates = value_weight.shape[0], gate_weight.shape[0]
    bd, bv = _blocks(d, dv)
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                  for t in (x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias))
    progs, chunk = reduction_grid(n, x.device, per_sm=BWD_PER_SM)
    part_d, part_v, part_b = norm_partial_buffers(progs, d, dv, x.device, gates)
    red = partials.start(x.device, *norm_widths(d, dv, gates))
    r_d, r_v, _ = red.reducers
    launch(
        _update_norm_bwd_kernel, (progs + red.total,),
        (x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, g.contiguous(),
         gc.contiguous(), gbeta2.contiguous(), gv2.contiguous(), *grads[:4], part_d, part_v, part_b, *grads[4:],
         red.counters, n, chunk, progs, r_d, r_v, red.total, d, dv, k_eps * k_eps / d,
         1.0 / math.sqrt(d), float(eps), float(beta_max), float(value_scale)),
        writes=(13, 14, 15, 16, 17, 18, 19), apart=(4, 5, 6, 7, 8, 10, 11, 12, 17, 18, 19, 20, 21, 22, 23, 24, 25),
        BLOCK_D=bd, BLOCK_V=bv, ERASE=rule_spec(rule).erase, GATES=gates, num_warps=_warps(bd * bv),
        **red.meta(),
    )
    record("update_norm_bwd_kernel" + NORM_SHARE, (norm_weight, gate_weight, gate_bias, value_weight, value_bias, gc,
                                                   gbeta2, gv2), (part_d, part_v, part_b))
    red.finish("update_norm_bwd_kernel", *norm_sums(part_d, part_v, part_b, *grads[4:]))
    return grads


def read_triton_forward(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, read: torch.Tensor,
    norm_weight: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor, value_weight: torch.Tensor,
    value_bias: torch.Tensor, k_eps: float, eps: float, beta_max: float, value_scale: float,
    c_dtype: torch.dtype | None = None, rule: str = "delta",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch: (x' (N, d, d_v) in x's dtype, c (N, d), beta' (N, G'), v' (N, d_v)) for contiguous x (N, d, d_v),
    k (N, d), v (N, d_v), beta (N, 1) ((N, 2) for the untied ``rule``), the next sublayer's CC read weight (d, d_v)
    and input stage's weights (G' = its gate's outputs)."""
    n, d, dv = x.shape
    gates = gate_weight.shape[0]
    bd, bv = state_blocks(d, dv)
    out = torch.empty_like(x)
    c, beta2, v2 = norm_outputs(n, d, dv, norm_weight, c_dtype, x.device, gates)
    if n == 0:
        return out, c, beta2, v2
    rows = delta_rows(n, bd * bv)
    launch(
        _update_read_norm_fwd_kernel, (triton.cdiv(n, rows),),
        (x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, out, c, beta2, v2, n, d,
         k_eps * k_eps / d, 1.0 / math.sqrt(d), float(eps), float(beta_max), float(value_scale)),
        writes=(10, 11, 12, 13), apart=(5, 6, 7, 8, 9, 11, 12, 13), ROWS=rows, BLOCK_D=bd, DV=dv, BLOCK_V=bv,
        ERASE=rule_spec(rule).erase, GATES=gates, num_warps=_warps(bd * bv),
    )
    record("update_read_norm_fwd_kernel" + NORM_SHARE, (norm_weight, gate_weight, gate_bias, value_weight,
                                                        value_bias), (c, beta2, v2))
    return out, c, beta2, v2


def read_triton_backward(
    g: torch.Tensor, gc: torch.Tensor, gbeta2: torch.Tensor, gv2: torch.Tensor, x: torch.Tensor, k: torch.Tensor,
    v: torch.Tensor, beta: torch.Tensor, read: torch.Tensor, norm_weight: torch.Tensor, gate_weight: torch.Tensor,
    gate_bias: torch.Tensor, value_weight: torch.Tensor, value_bias: torch.Tensor, k_eps: float, eps: float,
    beta_max: float, value_scale: float, rule: str = "delta",
) -> tuple[torch.Tensor, ...]:
    """One launch: the gradients of (x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight,
    value_bias), each its own tensor in its input's dtype; the read's and the norm weights' summed in the launch."""
    n, d, dv = x.shape
    gates = gate_weight.shape[0]
    bd, bv = state_blocks(d, dv)
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                  for t in (x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias))
    progs, chunk = reduction_grid(n, x.device, per_sm=READ_BWD_PER_SM)
    part_c = torch.empty(progs, d, dv, dtype=torch.float32, device=x.device)
    part_d, part_v, part_b = norm_partial_buffers(progs, d, dv, x.device, gates)
    red = partials.start(x.device, d * dv, *norm_widths(d, dv, gates))
    r_c, r_d, r_v, _ = red.reducers
    launch(
        _update_read_norm_bwd_kernel, (progs + red.total,),
        (x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, g.contiguous(),
         gc.contiguous(), gbeta2.contiguous(), gv2.contiguous(), *grads[:4], part_c, part_d, part_v, part_b,
         *grads[4:], red.counters, n, chunk, progs, r_c, r_d, r_v, red.total, d, k_eps * k_eps / d,
         1.0 / math.sqrt(d), float(eps), float(beta_max), float(value_scale)),
        writes=(14, 15, 16, 17, 18, 19, 20, 21),
        apart=(5, 6, 7, 8, 9, 11, 12, 13, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28),
        BLOCK_D=bd, DV=dv, BLOCK_V=bv, ERASE=rule_spec(rule).erase, GATES=gates,
        num_warps=_warps(bd * bv, 2), **red.meta(),
    )
    # the read's sum is the update's share (a partial sum belongs to the record before it), the norm's the norm's
    red.finish("update_read_norm_bwd_kernel", (part_c, grads[4]))
    record("update_read_norm_bwd_kernel" + NORM_SHARE, (norm_weight, gate_weight, gate_bias, value_weight,
                                                        value_bias, gc, gbeta2, gv2), (part_d, part_v, part_b))
    red.finish("update_read_norm_bwd_kernel", *norm_sums(part_d, part_v, part_b, *grads[5:]))
    return grads


class UpdateReadNormTriton(torch.autograd.Function):
    """Flattened x (N, d, d_v), k (N, d), v (N, d_v), beta (N, 1) ((N, 2) for the untied rule), the next sublayer's
    CC read weight (d, d_v) and input stage's weights, the update rule; returns (x', c, beta', v'). Saves the
    inputs only."""

    @staticmethod
    def forward(ctx, x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps,
                beta_max, value_scale, c_dtype, rule="delta"):
        ctx.save_for_backward(x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias)
        ctx.consts = (k_eps, eps, beta_max, value_scale, rule)
        return read_triton_forward(x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight,
                                   value_bias, k_eps, eps, beta_max, value_scale, c_dtype, rule)

    @staticmethod
    def backward(ctx, g, gc, gbeta2, gv2):
        saved = ctx.saved_tensors
        ups = missing_update_grads(g, gc, gbeta2, gv2, saved[0], saved[5], saved[8], saved[6].shape[0])
        return (*read_triton_backward(*ups, *saved, *ctx.consts), None, None, None, None, None, None)


class UpdateNormTriton(torch.autograd.Function):
    """Flattened x, k (N, d), v, beta (N, 1) ((N, 2) for the untied rule), the next sublayer's weights and the
    update rule; returns (x', c, beta', v'). Saves the inputs only (x' is recomputed in the backward)."""

    @staticmethod
    def forward(ctx, x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps, eps,
                beta_max, value_scale, c_dtype, rule="delta"):
        ctx.save_for_backward(x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias)
        ctx.consts = (k_eps, eps, beta_max, value_scale, rule)
        return triton_forward(x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, k_eps,
                              eps, beta_max, value_scale, c_dtype, rule)

    @staticmethod
    def backward(ctx, g, gc, gbeta2, gv2):
        saved = ctx.saved_tensors
        ups = missing_update_grads(g, gc, gbeta2, gv2, saved[0], saved[4], saved[7], saved[5].shape[0])
        return (*triton_backward(*ups, *saved, *ctx.consts), None, None, None, None, None, None)


def update_and_norm_triton(x, k, v, beta, read, norm_weight, gate_weight, gate_bias, value_weight, value_bias, *,
                           k_eps, eps, beta_max, value_scale, c_dtype=None, rule="delta"):
    """The kernels' autograd Functions on flattened contiguous tensors: without ``read`` x (N, d), k (N, d),
    v (N, 1), beta (N, 1) (:class:`UpdateNormTriton`); with ``read`` (d, d_v) x (N, d, d_v), v (N, d_v)
    (:class:`UpdateReadNormTriton`) -> (x', c (N, d), beta' (N, G'), v' (N, d_v')). ``rule``: the update's
    ("delta", "write", or "untied" with beta (N, 2)); G' the next sublayer's gate outputs (gate_weight (G', d))."""
    check_device("update_and_norm", x)
    weights = (norm_weight.contiguous(), gate_weight.contiguous(), gate_bias.contiguous(), value_weight.contiguous(),
               value_bias.contiguous())
    consts = (float(k_eps), float(eps), float(beta_max), float(value_scale), c_dtype, rule)
    if read is None:
        return UpdateNormTriton.apply(x, k, v, beta, *weights, *consts)
    return UpdateReadNormTriton.apply(x, k, v, beta, read.contiguous(), *weights, *consts)
