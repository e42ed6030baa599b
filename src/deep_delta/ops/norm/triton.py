"""Triton kernels of the sublayer's input stage: the RMSNorm, the linear gate and the k-Map value from one read.

forward   read src (one row per token), g, w_g, b_g, W_v, b_v
          -> s = src in the norm weight's dtype, r = rsqrt(mean(s^2) + eps), y = s r, c = y g    (fp32)
          -> beta = beta_max sigmoid(c . w_g + b_g), v = value_scale sigmoid(W_v s + b_v)        (fp32)
          write c (the norm weight's dtype, or the c_dtype asked for), beta (N, 1) and v (N, d_v) (fp32)
backward  read src, gc (in c's dtype), gbeta, gv; recompute r, y, c and the two sigmoids (nothing but src is saved)
          write grad_src = r (dy - y mean(dy y)) + dlogit_v W_v   with dy = (gc + dlogit_g w_g) g
          the weight gradients (g, w_g, b_g, W_v, b_v) on a persistent grid
          (:func:`deep_delta.ops.delta.triton.reduction_grid`): each program accumulates its contiguous chunk of
          tokens in fp32 registers and writes one partial per weight, so the partial buffers hold at most
          ``max_programs`` copies of the weights whatever the token count; reducer programs of the same launch sum
          them and write each weight's gradient in its dtype (:mod:`deep_delta.ops.partials`)

One program holds a token's row (``BLOCK_D = next_pow2(d)``, masked) and the (d_v, d) value weight in registers.
Tested against the plain reference under ``TRITON_INTERPRET=1`` on CPU (tests/ops/test_norm_gate_value.py).

``GATES`` (a compile-time constant, 1 or 2): the linear gate's outputs, w_g (G, d) and b_g (G,), beta (N, G): two for
the untied rule's erase and write gates (``DDLConfig.update_rule = "untied"``), each its own logit
``c . w_g[i] + b_g[i]`` (in the one-pass form, ``r sum(s g w_g[i])``), the second held as named vectors beside the
first (the one-gate kernels unchanged); partial rows (1 + G, d) and (G + d_v), the one-pass form only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deep_delta.ops import partials
from deep_delta.ops.launch import MAX_WIDTH, check_device, delta_warps, launch, reduction_grid
from deep_delta.ops.norm.lean import missing_grads_as_zeros, out_dtype

# Launch choices, measured on an H200 (benchmarks/tools/tune_kernels.py, 2026-11-26,
# benchmarks/records/2026-11-26-prefetch-norm-launch-h200/: 32 x 1024 tokens, d = 768, bf16 src; d_v = 4 / 1). Forward: one warp per 4096 values of the (d_v, d) tile, at least 1, and
# 4 tokens per program at d_v > 1, 1 at d_v = 1 (0.106 and 0.083 ms; 0.188 and 0.111 with 8 / 4 warps and 16
# tokens, the choice before). Backward: one warp per 1024 values, at least 2 (ops.delta.triton.delta_warps), on 8
# (d_v > 1) or 4 (d_v = 1) programs per SM, token n+1's rows loaded while token n is computed (0.33 and 0.21 ms;
# 0.40 and 0.37 with 8 / 4 warps on 2 per SM without the prefetch). The knobs (None: the rule) are for
# tune_kernels.py.
BWD_PER_SM = None
BWD_PREFETCH = True
FWD_ROWS = None
WARPS = None
# ONE_PASS: every reduction over d of a token is taken from the loaded rows at once (one multi-operand reduction,
# plus the value's), the scalars follow: sum(c w_g) = r sum(s g w_g) and sum(dy y) = r (sum(s g gc) + dlogit_g
# sum(s g w_g)). The other form reduces in the order the math is written (r, then the gate's logit, then the
# backward's mean), a chain of dependent cross-warp reductions per token. The same values to fp32 rounding; not
# yet timed on a GPU (2026-11-26): tune_kernels.py --grid one_pass=0,1 compares the two.
ONE_PASS = True


def _fwd_warps(block: int) -> int:
    return max(1, min(16, block // 4096)) if WARPS is None else WARPS


def _bwd_warps(block: int) -> int:
    return delta_warps(block) if WARPS is None else WARPS


@triton.jit
def _row_math(s_raw, NW, GW, GB, BV, offs_d, offs_v, ok_d, ok_v, wv, D, eps):
    """One token's forward in fp32 registers from its loaded source row: (s, r, y, c, g, w_g, s_g, s_v); masked
    lanes are 0."""
    s = s_raw.to(NW.dtype.element_ty).to(tl.float32)
    r = tl.rsqrt(tl.sum(s * s, axis=0) / D + eps)
    y = s * r
    g = tl.load(NW + offs_d, mask=ok_d, other=0.0).to(tl.float32)
    c = y * g
    wg = tl.load(GW + offs_d, mask=ok_d, other=0.0).to(tl.float32)
    # the gate bias as a vector over offs_v with one live lane: scalar loads and stores are avoided (interpreter)
    bg = tl.load(GB + offs_v * 0, mask=offs_v == 0, other=0.0).to(tl.float32)
    logit_g = tl.sum(c * wg, axis=0) + bg  # (BLOCK_V,): lane 0 is the gate's logit
    s_g = tl.sigmoid(logit_g)
    bv = tl.load(BV + offs_v, mask=ok_v, other=0.0).to(tl.float32)
    s_v = tl.sigmoid(tl.sum(wv * s[None, :], axis=1) + bv)
    return s, r, y, c, g, wg, s_g, s_v


@triton.jit
def _one_pass_row(s, ss, sgw, g, bg, bv, wv, D, eps):
    """(r, c, s_g, s_v) of one token in the one-pass form, from its row s (fp32) and its sums ss = sum(s^2) and
    sgw = sum(s g w_g): c . w_g = r sgw."""
    r = tl.rsqrt(ss / D + eps)
    c = s * r * g
    s_g = tl.sigmoid(r * sgw + bg)  # lane 0 is the gate's
    s_v = tl.sigmoid(tl.sum(wv * s[None, :], axis=1) + bv)
    return r, c, s_g, s_v


@triton.jit
def _add2(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _add3(a0, b0, c0, a1, b1, c1):
    return a0 + a1, b0 + b1, c0 + c1


@triton.jit
def _add4(a0, b0, c0, d0, a1, b1, c1, d1):
    return a0 + a1, b0 + b1, c0 + c1, d0 + d1


@triton.jit
def _grad_row(gc, gbeta, gv, r, y, g, wg, s_g, s_v, wv, sggc, sgw, D, beta_max, value_scale, ONE_PASS: tl.constexpr):
    """One token's backward from its forward values: (grad_src, gc_tot, dlogit_g, dlogit_g's lane vector,
    dlogit_v). ONE_PASS: sum(dy y) from the loaded row's sums sggc = sum(s g gc) and sgw = sum(s g w_g)."""
    dlg = gbeta * beta_max * s_g * (1.0 - s_g)  # lane 0; 0 elsewhere and past the last token
    dlg_s = tl.sum(dlg, axis=0)
    dlv = gv * value_scale * s_v * (1.0 - s_v)  # 0 past d_v and the last token
    gct = gc + dlg_s * wg
    dy = gct * g
    if ONE_PASS:
        dyy = r * (sggc + dlg_s * sgw)  # sum(dy y)
    else:
        dyy = tl.sum(dy * y, axis=0)
    gsrc = r * (dy - y * (dyy / D)) + tl.sum(dlv[:, None] * wv, axis=0)
    return gsrc, gct, dlg_s, dlg, dlv


@triton.jit
def norm_row_forward(s, g1, gw1, bg1, bv1, wv, gw2, bg2, D, eps, GATES: tl.constexpr):
    """One token's (r, c, sigmoid of the gate's logit (lane 0), sigmoid of the value logits, sigmoid of the second
    gate's logit (lane 0; GATES == 2, else the first's)) in the one-pass form from its source row s (fp32) and the
    program's weights: g1 = g, gw1 = g w_g, the biases, wv = W_v, gw2 = g w_g[1] and bg2 (:func:`norm_weights`)."""
    if GATES == 2:
        ss, sgw, sgw2 = tl.reduce((s * s, s * gw1, s * gw2), 0, _add3)
        r, c, s_g, s_v = _one_pass_row(s, ss, sgw, g1, bg1, bv1, wv, D, eps)
        s_g2 = tl.sigmoid(r * sgw2 + bg2)
    else:
        ss, sgw = tl.reduce((s * s, s * gw1), 0, _add2)
        r, c, s_g, s_v = _one_pass_row(s, ss, sgw, g1, bg1, bv1, wv, D, eps)
        s_g2 = s_g
    return r, c, s_g, s_v, s_g2


@triton.jit
def norm_row_store(C, BETA, V, n, c, s_g, s_v, s_g2, offs_d, offs_v, ok_d, ok_v, D, DV, beta_max, value_scale,
                   GATES: tl.constexpr):
    """Token n's c, beta (N, GATES) and v (the forward's outputs)."""
    tl.store(C + n * D + offs_d, c.to(C.dtype.element_ty), mask=ok_d)
    tl.store(BETA + GATES * n + offs_v * 0, (beta_max * s_g).to(BETA.dtype.element_ty), mask=ok_v & (offs_v == 0))
    if GATES == 2:
        tl.store(BETA + 2 * n + 1 + offs_v * 0, (beta_max * s_g2).to(BETA.dtype.element_ty),
                 mask=ok_v & (offs_v == 0))
    tl.store(V + n * DV + offs_v, (value_scale * s_v).to(V.dtype.element_ty), mask=ok_v)


@triton.jit
def norm_row_backward(s, gc, gbeta, gv, g1, wg1, gw1, bg1, bv1, wv, gbeta2, wg2, gw2, bg2, D, eps, beta_max,
                      value_scale, GATES: tl.constexpr):
    """One token's backward in the one-pass form from its source row s (fp32) and the upstream gradients (fp32):
    (grad_src, its terms of grad_g and grad_w_g, of grad_b_g (lane 0) and dlogit_v, whose outer product with s
    is its term of grad_W_v and which is its term of grad_b_v, then the second gate's terms of grad_w_g[1] and
    grad_b_g[1] (GATES == 2; else the first's again)). gbeta2, wg2, gw2, bg2: the second gate's (unused for one)."""
    if GATES == 2:
        ss, sgw, sggc, sgw2 = tl.reduce((s * s, s * gw1, s * g1 * gc, s * gw2), 0, _add4)
        r, c, s_g, s_v = _one_pass_row(s, ss, sgw, g1, bg1, bv1, wv, D, eps)
        s_g2 = tl.sigmoid(r * sgw2 + bg2)
        y = s * r
        dlg2 = gbeta2 * beta_max * s_g2 * (1.0 - s_g2)  # lane 0
        dlg2_s = tl.sum(dlg2, axis=0)
        # the second gate joins the first through gc: (gc + dlogit_2 w_g[1]) g, and sum(dy y) gains dlogit_2 r sgw2
        gsrc, gct, dlg_s, dlg, dlv = _grad_row(gc + dlg2_s * wg2, gbeta, gv, r, y, g1, wg1, s_g, s_v, wv,
                                               sggc + dlg2_s * sgw2, sgw, D, beta_max, value_scale, True)
        return gsrc, gct * y, dlg_s * c, dlg, dlv, dlg2_s * c, dlg2
    else:
        ss, sgw, sggc = tl.reduce((s * s, s * gw1, s * g1 * gc), 0, _add3)
        r, c, s_g, s_v = _one_pass_row(s, ss, sgw, g1, bg1, bv1, wv, D, eps)
        y = s * r
        gsrc, gct, dlg_s, dlg, dlv = _grad_row(gc, gbeta, gv, r, y, g1, wg1, s_g, s_v, wv, sggc, sgw, D, beta_max,
                                               value_scale, True)
        inc_wg = dlg_s * c
        return gsrc, gct * y, inc_wg, dlg, dlv, inc_wg, dlg


@triton.jit
def _bwd_row_load(SRC, GC, GBETA, GV, n, offs_d, offs_v, ok_d, ok_v, D, DV, GATES: tl.constexpr):
    """Token n's backward inputs as stored: src's row, its gradient gc, gbeta (lane 0 of a d_v-sized vector), gv,
    and the second gate's gbeta (GATES == 2; else the first's)."""
    s_raw = tl.load(SRC + n * D + offs_d, mask=ok_d, other=0.0)
    gc = tl.load(GC + n * D + offs_d, mask=ok_d, other=0.0)
    gbeta = tl.load(GBETA + GATES * n + offs_v * 0, mask=ok_v & (offs_v == 0), other=0.0)
    if GATES == 2:
        gbeta2 = tl.load(GBETA + 2 * n + 1 + offs_v * 0, mask=ok_v & (offs_v == 0), other=0.0)
    else:
        gbeta2 = gbeta
    gv = tl.load(GV + n * DV + offs_v, mask=ok_v, other=0.0)
    return s_raw, gc, gbeta, gv, gbeta2


@triton.jit
def _norm_gate_value_fwd_kernel(
    SRC, NW, GW, GB, WV, BV, C, BETA, V,
    N, D, DV, eps, beta_max, value_scale,
    ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, ONE_PASS: tl.constexpr, GATES: tl.constexpr,
):
    """ROWS tokens per program; GATES == 2 (the untied gates) in the one-pass form only."""
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    wv = tl.load(WV + offs_v[:, None] * D + offs_d[None, :], mask=mv[:, None] & md[None, :], other=0.0).to(tl.float32)
    if ONE_PASS:  # the biases, loaded once; g and w_g per row (held across the rows, they spill at 1 warp)
        bg1 = tl.load(GB + offs_v * 0, mask=offs_v == 0, other=0.0).to(tl.float32)
        bv1 = tl.load(BV + offs_v, mask=mv, other=0.0).to(tl.float32)
        bg2 = bg1
        if GATES == 2:
            bg2 = tl.load(GB + 1 + offs_v * 0, mask=offs_v == 0, other=0.0).to(tl.float32)
    for i in range(ROWS):
        n = pid * ROWS + i
        ok_d = md & ((offs_d * 0 + n) < N)  # the row index as a vector: masks must be tensors
        ok_v = mv & ((offs_v * 0 + n) < N)
        s_raw = tl.load(SRC + n * D + offs_d, mask=ok_d, other=0.0)
        if ONE_PASS:
            s = s_raw.to(NW.dtype.element_ty).to(tl.float32)
            g1 = tl.load(NW + offs_d, mask=md, other=0.0).to(tl.float32)
            gw1 = g1 * tl.load(GW + offs_d, mask=md, other=0.0).to(tl.float32)
            gw2 = gw1
            if GATES == 2:
                gw2 = g1 * tl.load(GW + D + offs_d, mask=md, other=0.0).to(tl.float32)
            r, c, s_g, s_v, s_g2 = norm_row_forward(s, g1, gw1, bg1, bv1, wv, gw2, bg2, D, eps, GATES)
        else:
            s, r, y, c, g, wg, s_g, s_v = _row_math(s_raw, NW, GW, GB, BV, offs_d, offs_v, ok_d, ok_v, wv, D, eps)
            s_g2 = s_g
        norm_row_store(C, BETA, V, n, c, s_g, s_v, s_g2, offs_d, offs_v, ok_d, ok_v, D, DV, beta_max, value_scale,
                       GATES)


@triton.jit
def _norm_gate_value_bwd_kernel(
    SRC, NW, GW, GB, WV, BV, GC, GBETA, GV,
    GSRC, PART_D, PART_V, PART_B, G_NW, G_GW, G_GB, G_WV, G_BV, COUNTERS,
    N, CHUNK, P, R_D, R_V, R, D, DV, eps, beta_max, value_scale,
    BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, PREFETCH: tl.constexpr, ONE_PASS: tl.constexpr,
    REDUCE: tl.constexpr, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr, GATES: tl.constexpr,
):
    """P workers and R reducers (ops/partials.py). Worker i: tokens [i * CHUNK, (i + 1) * CHUNK), its partials
    PART_D (1 + G, d) = (grad_g, grad_w_g), PART_V (d_v, d) = grad_W_v, PART_B (G + d_v) = (grad_b_g, grad_b_v);
    PREFETCH: token n+1's rows are loaded before token n's math; ONE_PASS: the module's note (GATES == 2: the
    one-pass form only). Reducers 0 .. R_D-1 sum PART_D's columns into G_NW and G_GW, the next R_V PART_V's into
    G_WV, the rest PART_B's into G_GB, G_BV."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P:
        _norm_bwd_worker(SRC, NW, GW, GB, WV, BV, GC, GBETA, GV, GSRC, PART_D, PART_V, PART_B, ticket, N, CHUNK, D,
                         DV, eps, beta_max, value_scale, BLOCK_D, BLOCK_V, PREFETCH, ONE_PASS, GATES)
        partials.signal_stored(COUNTERS, P, REDUCE)
    elif REDUCE:
        norm_reducer(PART_D, PART_V, PART_B, G_NW, G_GW, G_GB, G_WV, G_BV, COUNTERS, ticket - P, P, R_D, R_V, R, D, DV,
                     REDUCE_ROWS, REDUCE_COLS, GATES)


@triton.jit
def norm_reducer(PART_D, PART_V, PART_B, G_NW, G_GW, G_GB, G_WV, G_BV, COUNTERS, rid, P, R_D, R_V, R, D, DV,
                 REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr, GATES: tl.constexpr):
    """Reducer ``rid`` of a launch whose P workers wrote the norm's partials (:func:`norm_row_backward`'s sums):
    reducers 0 .. R_D-1 sum PART_D's columns into G_NW and G_GW, the next R_V PART_V's into G_WV, the rest
    PART_B's into G_GB and G_BV (ops/partials.py)."""
    if partials.wait_for_workers(COUNTERS, P, rid, R):
        if rid < R_D:
            cols = partials.reducer_columns(rid, REDUCE_COLS)
            acc = partials.sum_columns(PART_D, P, (1 + GATES) * D, cols, REDUCE_ROWS, REDUCE_COLS)
            partials.store_columns(G_NW, 0, D, cols, acc)
            partials.store_columns(G_GW, D, (1 + GATES) * D, cols, acc)
        elif rid < R_D + R_V:
            partials.reduce_into(PART_V, G_WV, rid - R_D, P, DV * D, REDUCE_ROWS, REDUCE_COLS)
        else:
            cols = partials.reducer_columns(rid - R_D - R_V, REDUCE_COLS)
            acc = partials.sum_columns(PART_B, P, GATES + DV, cols, REDUCE_ROWS, REDUCE_COLS)
            partials.store_columns(G_GB, 0, GATES, cols, acc)
            partials.store_columns(G_BV, GATES, GATES + DV, cols, acc)
        partials.reducer_finished(COUNTERS, P, R)


@triton.jit
def _norm_bwd_worker(
    SRC, NW, GW, GB, WV, BV, GC, GBETA, GV, GSRC, PART_D, PART_V, PART_B, pid, N, CHUNK, D, DV, eps, beta_max,
    value_scale, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr, PREFETCH: tl.constexpr, ONE_PASS: tl.constexpr,
    GATES: tl.constexpr,
):
    """Worker ``pid`` of the backward: its chunk of tokens, one partial row per weight buffer."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    wv, g1, wg1, gw1, bg1, bv1, wg2, gw2, bg2 = norm_weights(NW, GW, GB, WV, BV, offs_d, offs_v, D, DV, GATES)
    acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2 = norm_partials_zero(BLOCK_D, BLOCK_V)
    if PREFETCH:
        first = pid * CHUNK
        s_nx, gc_nx, gbeta_nx, gv_nx, gb2_nx = _bwd_row_load(SRC, GC, GBETA, GV, first, offs_d, offs_v,
                                                             md & ((offs_d * 0 + first) < N),
                                                             mv & ((offs_v * 0 + first) < N), D, DV, GATES)
    for i in range(0, CHUNK):
        n = pid * CHUNK + i
        ok_d = md & ((offs_d * 0 + n) < N)
        ok_v = mv & ((offs_v * 0 + n) < N)
        if PREFETCH:
            s_raw, gc_raw, gbeta_raw, gv_raw, gb2_raw = s_nx, gc_nx, gbeta_nx, gv_nx, gb2_nx
            nxt_d = md & ((offs_d * 0 + n + 1) < N) & ((offs_d * 0 + i + 1) < CHUNK)
            nxt_v = mv & ((offs_v * 0 + n + 1) < N) & ((offs_v * 0 + i + 1) < CHUNK)
            s_nx, gc_nx, gbeta_nx, gv_nx, gb2_nx = _bwd_row_load(SRC, GC, GBETA, GV, n + 1, offs_d, offs_v, nxt_d,
                                                                 nxt_v, D, DV, GATES)
        else:
            s_raw, gc_raw, gbeta_raw, gv_raw, gb2_raw = _bwd_row_load(SRC, GC, GBETA, GV, n, offs_d, offs_v, ok_d, ok_v,
                                                                      D, DV, GATES)
        gc = gc_raw.to(tl.float32)
        gbeta = gbeta_raw.to(tl.float32)
        gv = gv_raw.to(tl.float32)
        if ONE_PASS:
            s = s_raw.to(NW.dtype.element_ty).to(tl.float32)
            gsrc, inc_g, inc_wg, dlg, dlv, inc_wg2, dlg2 = norm_row_backward(
                s, gc, gbeta, gv, g1, wg1, gw1, bg1, bv1, wv, gb2_raw.to(tl.float32), wg2, gw2, bg2, D, eps, beta_max,
                value_scale, GATES)
        else:
            s, r, y, c, g, wg, s_g, s_v = _row_math(s_raw, NW, GW, GB, BV, offs_d, offs_v, ok_d, ok_v, wv, D, eps)
            gsrc, gct, dlg_s, dlg, dlv = _grad_row(gc, gbeta, gv, r, y, g, wg, s_g, s_v, wv, 0.0, 0.0, D, beta_max,
                                                   value_scale, False)
            inc_g, inc_wg = gct * y, dlg_s * c
            inc_wg2, dlg2 = inc_wg, dlg
        tl.store(GSRC + n * D + offs_d, gsrc.to(GSRC.dtype.element_ty), mask=ok_d)
        acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2 = norm_partials_add(
            acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2, inc_g, inc_wg, dlg, dlv, s, inc_wg2, dlg2, GATES)
    norm_partials_store(PART_D, PART_V, PART_B, pid, acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2, offs_d,
                        offs_v, D, DV, GATES)


@triton.jit
def norm_weights(NW, GW, GB, WV, BV, offs_d, offs_v, D, DV, GATES: tl.constexpr):
    """A program's copy of the weights in fp32: (W_v (BLOCK_V, BLOCK_D), g, w_g, g w_g, b_g (lane 0), b_v), then the
    second gate's w_g[1], g w_g[1], b_g[1] (lane 0) for GATES == 2 (else the first's again)."""
    md = offs_d < D
    mv = offs_v < DV
    wv = tl.load(WV + offs_v[:, None] * D + offs_d[None, :], mask=mv[:, None] & md[None, :], other=0.0).to(tl.float32)
    g1 = tl.load(NW + offs_d, mask=md, other=0.0).to(tl.float32)
    wg1 = tl.load(GW + offs_d, mask=md, other=0.0).to(tl.float32)
    bg1 = tl.load(GB + offs_v * 0, mask=offs_v == 0, other=0.0).to(tl.float32)
    bv1 = tl.load(BV + offs_v, mask=mv, other=0.0).to(tl.float32)
    if GATES == 2:
        wg2 = tl.load(GW + D + offs_d, mask=md, other=0.0).to(tl.float32)
        bg2 = tl.load(GB + 1 + offs_v * 0, mask=offs_v == 0, other=0.0).to(tl.float32)
    else:
        wg2 = wg1
        bg2 = bg1
    return wv, g1, wg1, g1 * wg1, bg1, bv1, wg2, g1 * wg2, bg2


@triton.jit
def norm_partials_zero(BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr):
    """A worker's fp32 accumulators of the norm's weight gradients: (g, w_g (BLOCK_D,), W_v (BLOCK_V, BLOCK_D),
    b_g (lane 0 of BLOCK_V), b_v (BLOCK_V,), and the second gate's w_g[1] (BLOCK_D,) and b_g[1] (lane 0))."""
    return (tl.zeros([BLOCK_D], dtype=tl.float32), tl.zeros([BLOCK_D], dtype=tl.float32),
            tl.zeros([BLOCK_V, BLOCK_D], dtype=tl.float32), tl.zeros([BLOCK_V], dtype=tl.float32),
            tl.zeros([BLOCK_V], dtype=tl.float32), tl.zeros([BLOCK_D], dtype=tl.float32),
            tl.zeros([BLOCK_V], dtype=tl.float32))


@triton.jit
def norm_partials_add(acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2, inc_g, inc_wg, dlg, dlv, s, inc_wg2,
                      dlg2, GATES: tl.constexpr):
    """One token's terms (``norm_row_backward``'s, and its source row s) added to the accumulators (the second
    gate's for GATES == 2)."""
    if GATES == 2:
        acc_wg2 += inc_wg2
        acc_bg2 += dlg2
    return (acc_g + inc_g, acc_wg + inc_wg, acc_wv + dlv[:, None] * s[None, :], acc_bg + dlg, acc_bv + dlv, acc_wg2,
            acc_bg2)


@triton.jit
def norm_partials_store(PART_D, PART_V, PART_B, pid, acc_g, acc_wg, acc_wv, acc_bg, acc_bv, acc_wg2, acc_bg2, offs_d,
                        offs_v, D, DV, GATES: tl.constexpr):
    """Worker ``pid``'s partial rows: PART_D (1 + G, d) = (grad_g, grad_w_g), PART_V (d_v, d) = grad_W_v,
    PART_B (G + d_v) = (grad_b_g, grad_b_v)."""
    md = offs_d < D
    mv = offs_v < DV
    tl.store(PART_D + pid * (1 + GATES) * D + offs_d, acc_g, mask=md)
    tl.store(PART_D + pid * (1 + GATES) * D + D + offs_d, acc_wg, mask=md)
    if GATES == 2:
        tl.store(PART_D + pid * 3 * D + 2 * D + offs_d, acc_wg2, mask=md)
    tl.store(PART_V + pid * DV * D + offs_v[:, None] * D + offs_d[None, :], acc_wv, mask=mv[:, None] & md[None, :])
    tl.store(PART_B + pid * (GATES + DV) + offs_v * 0, acc_bg, mask=offs_v == 0)
    if GATES == 2:
        tl.store(PART_B + pid * (2 + DV) + 1 + offs_v * 0, acc_bg2, mask=offs_v == 0)
    tl.store(PART_B + pid * (GATES + DV) + GATES + offs_v, acc_bv, mask=mv)


def _blocks(d: int, dv: int) -> tuple[int, int]:
    if d > MAX_WIDTH:
        raise ValueError(f"norm_gate_value (triton): width d must be <= {MAX_WIDTH}, got {d}")
    return triton.next_power_of_2(d), triton.next_power_of_2(dv)


def norm_partial_buffers(progs: int, d: int, dv: int, device: torch.device,
                         gates: int = 1) -> tuple[torch.Tensor, ...]:
    """The fp32 partial rows of ``progs`` workers of a norm backward with ``gates`` gate outputs: (g, w_g)
    (P, 1 + G, d), W_v (P, d_v, d) and (b_g, b_v) (P, G + d_v) (:func:`norm_partials_store`'s layout)."""
    return (torch.empty(progs, 1 + gates, d, dtype=torch.float32, device=device),
            torch.empty(progs, dv, d, dtype=torch.float32, device=device),
            torch.empty(progs, gates + dv, dtype=torch.float32, device=device))


def norm_widths(d: int, dv: int, gates: int = 1) -> tuple[int, int, int]:
    """The widths of the norm's three partial rows (:func:`norm_partial_buffers`), for :func:`partials.start`."""
    return (1 + gates) * d, dv * d, gates + dv


def norm_sums(part_d, part_v, part_b, g_nw, g_gw, g_gb, g_wv, g_bv) -> tuple[tuple, ...]:
    """The norm's partial buffers with the gradients their columns hold, in :meth:`partials.Reduction.finish`'s
    form (the layout of :func:`norm_partials_store`)."""
    return (part_d, g_nw, g_gw), (part_b, g_gb, g_bv), (part_v, g_wv)


def norm_outputs(n: int, d: int, dv: int, norm_weight: torch.Tensor, c_dtype: torch.dtype | None,
                 device: torch.device, gates: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty (c (N, d) in c_dtype (None: the norm weight's dtype), beta (N, gates), v (N, d_v)) of a forward."""
    return (torch.empty(n, d, dtype=c_dtype or norm_weight.dtype, device=device),
            torch.empty(n, gates, dtype=out_dtype(norm_weight), device=device),
            torch.empty(n, dv, dtype=out_dtype(norm_weight), device=device))


def triton_forward(
    src: torch.Tensor, norm_weight: torch.Tensor, gate_weight: torch.Tensor, gate_bias: torch.Tensor,
    value_weight: torch.Tensor, value_bias: torch.Tensor, eps: float, beta_max: float, value_scale: float,
    c_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One launch: (c (N, d) in c_dtype (None: norm_weight's dtype), beta (N, G), v (N, d_v) fp32) for a contiguous
    src (N, d) and the gate's G = gate_weight.shape[0] outputs (1, or the untied rule's 2)."""
    n, d = src.shape
    dv, gates = value_weight.shape[0], gate_weight.shape[0]
    bd, bv = _blocks(d, dv)
    c, beta, v = norm_outputs(n, d, dv, norm_weight, c_dtype, src.device, gates)
    if n == 0:
        return c, beta, v
    rows = (4 if dv > 1 else 1) if FWD_ROWS is None else FWD_ROWS
    launch(
        _norm_gate_value_fwd_kernel, (triton.cdiv(n, rows),),
        (src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, c, beta, v, n, d, dv, float(eps),
         float(beta_max), float(value_scale)), writes=(6, 7, 8),
        ROWS=rows, BLOCK_D=bd, BLOCK_V=bv, ONE_PASS=ONE_PASS or gates == 2, GATES=gates,
        num_warps=_fwd_warps(bd * bv),
    )
    return c, beta, v


def triton_backward(
    gc: torch.Tensor, gbeta: torch.Tensor, gv: torch.Tensor, src: torch.Tensor, norm_weight: torch.Tensor,
    gate_weight: torch.Tensor, gate_bias: torch.Tensor, value_weight: torch.Tensor, value_bias: torch.Tensor,
    eps: float, beta_max: float, value_scale: float,
) -> tuple[torch.Tensor, ...]:
    """One launch: the gradients of (src, norm_weight, gate_weight, gate_bias, value_weight, value_bias), each in
    its input's dtype and shape, its own tensor (a custom op's outputs may not alias each other; torch.library
    checks it on CUDA, where this runs as the op's kernel). The weight gradients are summed over the tokens in the
    launch (ops/partials.py), each written once in its dtype."""
    n, d = src.shape
    dv, gates = value_weight.shape[0], gate_weight.shape[0]
    bd, bv = _blocks(d, dv)
    gsrc = torch.empty_like(src)
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                  for t in (norm_weight, gate_weight, gate_bias, value_weight, value_bias))
    # at most max_programs partials, whatever n (none for n = 0: the reducers then write zeros)
    per_sm = (8 if dv > 1 else 4) if BWD_PER_SM is None else BWD_PER_SM
    progs, chunk = reduction_grid(n, src.device, per_sm=per_sm)
    part_d, part_v, part_b = norm_partial_buffers(progs, d, dv, src.device, gates)
    red = partials.start(src.device, *norm_widths(d, dv, gates))
    r_d, r_v, _ = red.reducers
    launch(
        _norm_gate_value_bwd_kernel, (progs + red.total,),
        (src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, gc.contiguous(), gbeta.contiguous(),
         gv.contiguous(), gsrc, part_d, part_v, part_b, *grads, red.counters, n, chunk, progs, r_d,
         r_v, red.total, d, dv, float(eps), float(beta_max), float(value_scale)),
        writes=(9, 10, 11, 12), apart=(13, 14, 15, 16, 17, 18),
        BLOCK_D=bd, BLOCK_V=bv, PREFETCH=BWD_PREFETCH, ONE_PASS=ONE_PASS or gates == 2, GATES=gates,
        num_warps=_bwd_warps(bd * bv), **red.meta(),
    )
    g_nw, g_gw, g_gb, g_wv, g_bv = grads
    red.finish("norm_gate_value_bwd_kernel", *norm_sums(part_d, part_v, part_b, g_nw, g_gw, g_gb, g_wv, g_bv))
    return (gsrc, *grads)


class NormGateValueTriton(torch.autograd.Function):
    """Contiguous src (N, d) and the weights as :func:`deep_delta.ops.norm.norm_gate_value` takes them;
    returns (c, beta, v). Saves src and the weights only."""

    @staticmethod
    def forward(ctx, src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max,
                value_scale, c_dtype):
        ctx.save_for_backward(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias)
        ctx.consts = (eps, beta_max, value_scale)
        return triton_forward(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max,
                              value_scale, c_dtype)

    @staticmethod
    def backward(ctx, gc, gbeta, gv):
        src, *weights = ctx.saved_tensors
        gc, gbeta, gv = missing_grads_as_zeros(gc, gbeta, gv, src, weights[0], weights[3], weights[1].shape[0])
        return (*triton_backward(gc, gbeta, gv, src, *weights, *ctx.consts), None, None, None, None)


def norm_gate_value_triton(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, *, eps, beta_max,
                           value_scale, c_dtype=None):
    """The kernels' autograd Function at any leading shape: src (..., d) -> c (..., d), beta (..., G) (G gate
    outputs), v (..., d_v)."""
    check_device("norm_gate_value", src)
    lead, d = src.shape[:-1], src.shape[-1]
    c, beta, v = NormGateValueTriton.apply(
        src.reshape(-1, d).contiguous(), norm_weight.contiguous(), gate_weight.contiguous(), gate_bias.contiguous(),
        value_weight.contiguous(), value_bias.contiguous(), float(eps), float(beta_max), float(value_scale), c_dtype)
    return c.view(*lead, d), beta.view(*lead, gate_weight.shape[0]), v.view(*lead, value_weight.shape[0])
