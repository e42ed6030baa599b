"""Triton kernels of the delta update, forward and backward, with an optional fused CC read (and the backward of
the fused TC read, whose forward is in :mod:`.triton_token`).

One program owns ``ROWS`` consecutive tokens (with the fused read, the backward's ``CHUNK`` tokens of a persistent
grid, :func:`reduction_grid`); for each it holds the whole (d, d_v) state tile in
registers (``BLOCK_D = next_pow2(d)``, ``BLOCK_V = next_pow2(d_v)``, masked), so the state is read once
and written once per pass:

forward   read k, x, v, beta -> k_hat = k * rsqrt(mean(k^2) + eps^2/d)  (fp32 reduction)
                             -> p = (k_hat . x) / sqrt(d), delta = beta (v - p)  (fp32)
                             -> write x' = x + (k_hat / sqrt(d)) delta^T       (x's dtype)
          [fused read]       -> write x_in = sum_j c_ij x'_ij                  (the next sublayer's CC read)
backward  read x, k, v, beta, G (and g_in, c for the fused read: G += g_in c^T; or g_in and the TC taps w:
          G += sum_s w_s g_in[t+s])
          recompute k_hat, p, delta (nothing of state size is saved but x itself)
          write grad_x = G - u (beta a)^T, grad_k, grad_v, grad_beta with a = u^T G
          [fused read]       grad_c = sum_n g_in x'^T: a persistent grid (see :func:`reduction_grid`), each
                             program accumulating its contiguous chunk of tokens in fp32 registers, one
                             (d, d_v) fp32 partial per program (at most ``max_programs``), summed by reducer
                             programs of the same launch into grad_c in c's dtype (:mod:`deep_delta.ops.partials`)
          [fused TC read]    grad_w_s = sum_t g_in[t+s] x'_t^T for the first four taps, the same way

Gate and value math are fp32 whatever the storage dtype (fp32, bf16, fp16). Tested against the plain
reference under ``TRITON_INTERPRET=1`` on CPU (tests/ops/test_kernels.py).

The update rules (``ERASE``, below) are a mode of every kernel here: the write-only control skips the read p = u^T x
(delta = beta v; backward grad_x = G, no x term in grad_u, and without a fused read the state is not read at all),
the untied gates take beta (N, 2) = (beta_e, beta_w) (delta = beta_w v - beta_e p, both gates' gradients); tested in
tests/ops/test_fused_rules.py.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deep_delta.ops import partials
from deep_delta.ops.delta.recompute import active_tape, delta_rebuild
from deep_delta.ops.delta.rules import rule_spec
from deep_delta.ops.launch import check_device, delta_rows, delta_warps, launch, reduction_grid, state_blocks

# The fused CC read's backward (a loop over a chunk of tokens): token n+1 loaded while token n is computed, on
# 2 programs per SM. On an H200 (tune_kernels.py, 2026-11-26, 32 x 1024 tokens, d = 768, bf16): 0.576 ms without
# the prefetch on 8 per SM (the choice before it), 0.391 ms with it on 8, 0.374 ms with it on 2.
READ_BWD_PER_SM = 2
READ_BWD_PREFETCH = True


# ERASE, a compile-time constant of every update kernel: the update rule's erase term, its ``rule_spec(rule).erase``
# (ops/delta/rules.py; the one reference is ops.delta.naive.delta_update_reference). 1 (the delta rule):
# x + beta u (v - u^T x)^T; 0 (the write-only control): x + beta u v^T, the read u^T x and its gradient terms
# skipped; 2 (the untied gates): x + u (beta_w v - beta_e u^T x)^T, with BETA (N, 2) holding (beta_e, beta_w) per
# token (the rule's gates' order) and GBETA their gradients. Written as integer literals in the kernels.


@triton.jit
def token_load(X, K, V, BETA, n, offs_d, offs_v, tile, ok_d, ok_v, D, DV, ERASE: tl.constexpr):
    """Token n's k, x, v and gates as stored (not yet fp32): (k, x, v, beta, beta_e), beta the write gate (the one
    gate of the tied and write-only rules), beta_e the untied erase gate (beta again for the other rules), each a
    vector over offs_v with one live lane; ok_d / ok_v mask the loads."""
    k = tl.load(K + n * D + offs_d, mask=ok_d, other=0.0)
    x = tl.load(X + n * D * DV + tile, mask=ok_d[:, None] & ok_v[None, :], other=0.0)
    v = tl.load(V + n * DV + offs_v, mask=ok_v, other=0.0)
    if ERASE == 2:  # (beta_e, beta_w) per token
        beta = tl.load(BETA + 2 * n + 1 + offs_v * 0, mask=ok_v & (offs_v == 0), other=0.0)
        beta_e = tl.load(BETA + 2 * n + offs_v * 0, mask=ok_v & (offs_v == 0), other=0.0)
    else:
        beta = tl.load(BETA + n + offs_v * 0, mask=ok_v & (offs_v == 0), other=0.0)
        beta_e = beta
    return k, x, v, beta, beta_e


@triton.jit
def token_math(k, x, v, beta, beta_e, D, eps2_over_d, inv_sqrt_d, ERASE: tl.constexpr):
    """One token's update in fp32 registers from its loaded inputs (:func:`token_load`):
    (x, u, rho, v, beta, beta_e, p, delta) with u = k rho, rho = rsqrt(mean(k^2) + eps^2/d) / sqrt(d) (as
    ops.delta.naive.unit_direction), p = u^T x, delta = beta (v - p) (ERASE 1); beta v - beta_e p (2); beta v and
    p = 0, the state not read (0)."""
    k = k.to(tl.float32)
    rho = tl.rsqrt(tl.sum(k * k, axis=0) / D + eps2_over_d) * inv_sqrt_d
    u = k * rho
    x = x.to(tl.float32)
    v = v.to(tl.float32)
    beta = tl.sum(beta.to(tl.float32), axis=0)
    beta_e = tl.sum(beta_e.to(tl.float32), axis=0)
    if ERASE == 0:
        p = v * 0.0
        delta = beta * v
    elif ERASE == 2:
        p = tl.sum(u[:, None] * x, axis=0)
        delta = beta * v - beta_e * p
    else:
        p = tl.sum(u[:, None] * x, axis=0)
        delta = beta * (v - p)
    return x, u, rho, v, beta, beta_e, p, delta


@triton.jit
def token_update(X, K, V, BETA, n, offs_d, offs_v, tile, ok_d, ok_v, D, DV, eps2_over_d, inv_sqrt_d,
                 ERASE: tl.constexpr):
    """One token's update in fp32 registers, as every delta kernel (forward and backward) computes it:
    :func:`token_math` of :func:`token_load`."""
    k, x, v, beta, beta_e = token_load(X, K, V, BETA, n, offs_d, offs_v, tile, ok_d, ok_v, D, DV, ERASE)
    return token_math(k, x, v, beta, beta_e, D, eps2_over_d, inv_sqrt_d, ERASE)


@triton.jit
def token_grads_store(GX, GK, GV, GBETA, n, g, x, u, rho, v, beta, beta_e, p, delta, offs_d, offs_v, tile, ok_d, ok_v,
                      D, DV, ERASE: tl.constexpr):
    """Token n's update backward for the whole gradient g (BLOCK_D, BLOCK_V) of x' (fp32) and its forward values
    (:func:`token_math`): a = u^T G, gp = -beta a (the untied rule's -beta_e a; none without the read),
    grad_x = G + u gp^T, grad_u = G delta + x gp, grad_k, grad_v = beta a, grad_beta = a . (v - p) (a . v for the
    untied write gate and the write-only rule, -a . p for the erase gate), each stored in its tensor's dtype."""
    a = tl.sum(u[:, None] * g, axis=0)  # u^T G, (BLOCK_V,)
    if ERASE == 0:  # no read: grad_x is G, and x takes no part in grad_u
        gx = g
        gu = tl.sum(g * delta[None, :], axis=1)
    else:
        if ERASE == 2:
            gp = -beta_e * a
        else:
            gp = -beta * a
        gx = g + u[:, None] * gp[None, :]
        gu = tl.sum(g * delta[None, :] + x * gp[None, :], axis=1)
    tl.store(GX + n * D * DV + tile, gx.to(GX.dtype.element_ty), mask=ok_d[:, None] & ok_v[None, :])
    gk = rho * (gu - u * tl.sum(u * gu, axis=0))
    tl.store(GK + n * D + offs_d, gk.to(GK.dtype.element_ty), mask=ok_d)
    tl.store(GV + n * DV + offs_v, (beta * a).to(GV.dtype.element_ty), mask=ok_v)
    lane = tl.full(offs_v.shape, 0.0, tl.float32)
    first = ok_v & (offs_v == 0)
    if ERASE == 1:
        tl.store(GBETA + n + offs_v * 0, (lane + tl.sum(a * (v - p), axis=0)).to(GBETA.dtype.element_ty), mask=first)
    elif ERASE == 2:
        tl.store(GBETA + 2 * n + 1 + offs_v * 0, (lane + tl.sum(a * v, axis=0)).to(GBETA.dtype.element_ty),
                 mask=first)
        tl.store(GBETA + 2 * n + offs_v * 0, (lane - tl.sum(a * p, axis=0)).to(GBETA.dtype.element_ty), mask=first)
    else:
        tl.store(GBETA + n + offs_v * 0, (lane + tl.sum(a * v, axis=0)).to(GBETA.dtype.element_ty), mask=first)


@triton.jit
def _delta_fwd_kernel(
    X, K, V, BETA, OUT, C, XIN, DELTA,
    N, D, eps2_over_d, inv_sqrt_d,
    HAS_READ: tl.constexpr, HAS_DELTA: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr, ERASE: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    tile = offs_d[:, None] * DV + offs_v[None, :]
    if HAS_READ:
        c = tl.load(C + tile, mask=md[:, None] & mv[None, :], other=0.0).to(tl.float32)
    for r in range(ROWS):
        n = pid * ROWS + r
        n_d = (offs_d * 0) + n  # the row index as a vector: masks must be tensors (tl.zeros_like is a jit helper; avoided)
        n_v = (offs_v * 0) + n
        ok_d = md & (n_d < N)
        ok_v = mv & (n_v < N)
        mt = ok_d[:, None] & ok_v[None, :]
        x, u, rho, v, beta, beta_e, p, delta = token_update(X, K, V, BETA, n, offs_d, offs_v, tile, ok_d, ok_v, D, DV,
                                                             eps2_over_d, inv_sqrt_d, ERASE)
        if HAS_DELTA:  # kept (fp32) to rebuild x from x' in backward (ops/delta/recompute.py)
            tl.store(DELTA + n * DV + offs_v, delta, mask=ok_v)
        out = x + u[:, None] * delta[None, :]
        out_st = out.to(OUT.dtype.element_ty)
        tl.store(OUT + n * D * DV + tile, out_st, mask=mt)
        if HAS_READ:
            # read the stored (rounded) state, as a separate compressor would
            xin = tl.sum(out_st.to(tl.float32) * c, axis=1)
            tl.store(XIN + n * D + offs_d, xin.to(XIN.dtype.element_ty), mask=ok_d)


@triton.jit
def _bwd_load(X, K, V, BETA, G, GIN, n, offs_d, offs_v, tile, ok_d, ok_v, N, D, DV, HAS_READ: tl.constexpr,
              TAPS: tl.constexpr, ERASE: tl.constexpr):
    """Token n's backward inputs as stored: k, x, v, the gates (:func:`token_load`), G's tile and one row of g_in:
    row n with the CC read, row n + 3 with the TC taps (the newest row of the kernel's window of four), none
    (a load with an all-false mask: no traffic) without a read."""
    k, x, v, beta, beta_e = token_load(X, K, V, BETA, n, offs_d, offs_v, tile, ok_d, ok_v, D, DV, ERASE)
    g = tl.load(G + n * D * DV + tile, mask=ok_d[:, None] & ok_v[None, :], other=0.0)
    if TAPS > 0:
        gin = tl.load(GIN + (n + 3) * D + offs_d, mask=ok_d & (((offs_d * 0) + n + 3) < N), other=0.0)
    else:
        gin = tl.load(GIN + n * D + offs_d, mask=ok_d & HAS_READ, other=0.0)
    return k, x, v, beta, beta_e, g, gin


@triton.jit
def _tap_step(raw, t_d, s, T, out, w, g, gw, TAP_GRADS: tl.constexpr):
    """Tap s of a token at position t_d of its sequence, g_in[t + s] given as stored (``raw``; zero past the
    sequence's end, where the row is the next sequence's): (G + w_s g_in[t+s], grad_w_s + g_in[t+s] x'^T), the
    second unchanged without TAP_GRADS."""
    gin = tl.where(t_d + s < T, raw.to(tl.float32), 0.0)
    if TAP_GRADS:
        gw = gw + gin[:, None] * out
    return g + w * gin[:, None], gw


@triton.jit
def _tap_tile(C, s, tile, mw, D, DV):
    """Tap s's (d, d_v) tile of the TC weight (K, d, d_v), in fp32."""
    return tl.load(C + s * D * DV + tile, mask=mw, other=0.0).to(tl.float32)


@triton.jit
def _delta_bwd_kernel(
    X, K, V, BETA, G, GIN, C,
    GX, GK, GV, GBETA, GC_PART, GC_OUT, COUNTERS,
    N, CHUNK, P, R, T, D, eps2_over_d, inv_sqrt_d,
    HAS_READ: tl.constexpr, TAPS: tl.constexpr, TAP_GRADS: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr, PREFETCH: tl.constexpr, REDUCE: tl.constexpr, REDUCE_ROWS: tl.constexpr,
    REDUCE_COLS: tl.constexpr, ERASE: tl.constexpr,
):
    """P workers (:func:`_delta_bwd_worker`); with REDUCE (a read's weight gradient summed in this launch,
    ops/partials.py) R reducers more, which sum the workers' partial rows GC_PART (P, W) into GC_OUT (W elements,
    W = d d_v for the CC read, K d d_v for the TC taps), in GC_OUT's dtype. Without REDUCE the grid is the P
    workers (no read; torch sums the partials; or the TC taps' second kernel sums them)."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P:
        _delta_bwd_worker(X, K, V, BETA, G, GIN, C, GX, GK, GV, GBETA, GC_PART, ticket, N, CHUNK, T, D, eps2_over_d,
                          inv_sqrt_d, HAS_READ, TAPS, TAP_GRADS, BLOCK_D, DV, BLOCK_V, PREFETCH, ERASE)
        partials.signal_stored(COUNTERS, P, REDUCE)
    elif REDUCE:
        partials.reducer(COUNTERS, P, GC_PART, GC_OUT, ticket - P, P, (TAPS + HAS_READ) * D * DV, R, REDUCE_ROWS,
                         REDUCE_COLS)


@triton.jit
def _delta_bwd_worker(
    X, K, V, BETA, G, GIN, C, GX, GK, GV, GBETA, GC_PART, pid,
    N, CHUNK, T, D, eps2_over_d, inv_sqrt_d,
    HAS_READ: tl.constexpr, TAPS: tl.constexpr, TAP_GRADS: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr, PREFETCH: tl.constexpr, ERASE: tl.constexpr,
):
    """Tokens [pid * CHUNK, (pid + 1) * CHUNK) of the flattened rows, the weight gradient of the fused read
    summed over them in fp32 registers, one partial per program:

    - the CC read (HAS_READ; C the (d, d_v) weight c): G += g_in c^T, grad_c += g_in x'^T;
    - the TC read (TAPS = K > 0; C the next sublayer's taps (K, d, d_v), tokens in sequences of length T):
      G += sum_s w_s g_in[t+s] and, for the first four taps, grad_w_s += g_in[t+s] x'^T (x' recomputed as the
      forward stored it), into a (P, K, d, d_v) partial buffer; taps past the fourth are
      ops.delta.triton_token's second kernel's. The rows g_in[t .. t+3] are a window carried from token to
      token: one new row per token (row t+3, loaded with the token's other inputs), the other three kept from
      the tokens before; rows past the fourth tap are loaded where used. Without TAP_GRADS (the one-pass
      backward switched off: ``switches.get().tc_one_pass``) only G's part: the second kernel sums every tap's
      gradient.

    PREFETCH: token n+1's inputs are loaded before token n's math (their latency behind it, for the registers
    that hold them). ERASE: the update rule (module note)."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    mw = md[:, None] & mv[None, :]
    tile = offs_d[:, None] * DV + offs_v[None, :]
    first = pid * CHUNK
    if HAS_READ:
        c = tl.load(C + tile, mask=mw, other=0.0).to(tl.float32)
        gc = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
    if TAPS > 0:  # the first four taps: the tiles of w and of their gradient, and the window of g_in rows
        first_d = (offs_d * 0) + first
        gw0 = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)  # named: a loop carries no list (unused without TAP_GRADS)
        w0 = _tap_tile(C, 0, tile, mw, D, DV)
        win0 = tl.load(GIN + first * D + offs_d, mask=md & (first_d < N), other=0.0)  # rows t, t+1, t+2
        win1 = tl.load(GIN + (first + 1) * D + offs_d, mask=md & (first_d + 1 < N), other=0.0)
        win2 = tl.load(GIN + (first + 2) * D + offs_d, mask=md & (first_d + 2 < N), other=0.0)
    if TAPS > 1:
        gw1 = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
        w1 = _tap_tile(C, 1, tile, mw, D, DV)
    if TAPS > 2:
        gw2 = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
        w2 = _tap_tile(C, 2, tile, mw, D, DV)
    if TAPS > 3:
        gw3 = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
        w3 = _tap_tile(C, 3, tile, mw, D, DV)
    if PREFETCH:
        k_nx, x_nx, v_nx, b_nx, be_nx, g_nx, gin_nx = _bwd_load(
            X, K, V, BETA, G, GIN, first, offs_d, offs_v, tile, md & (((offs_d * 0) + first) < N),
            mv & (((offs_v * 0) + first) < N), N, D, DV, HAS_READ, TAPS, ERASE)
    for r in range(0, CHUNK):
        n = first + r
        n_d = (offs_d * 0) + n  # the row index as a vector: masks must be tensors (tl.zeros_like is a jit helper; avoided)
        n_v = (offs_v * 0) + n
        ok_d = md & (n_d < N)
        ok_v = mv & (n_v < N)
        if PREFETCH:
            k_raw, x_raw, v_raw, b_raw, be_raw, g_raw, gin_raw = k_nx, x_nx, v_nx, b_nx, be_nx, g_nx, gin_nx
            more_d = ((offs_d * 0) + r + 1) < CHUNK
            more_v = ((offs_v * 0) + r + 1) < CHUNK
            k_nx, x_nx, v_nx, b_nx, be_nx, g_nx, gin_nx = _bwd_load(
                X, K, V, BETA, G, GIN, n + 1, offs_d, offs_v, tile, md & (n_d + 1 < N) & more_d,
                mv & (n_v + 1 < N) & more_v, N, D, DV, HAS_READ, TAPS, ERASE)
        else:
            k_raw, x_raw, v_raw, b_raw, be_raw, g_raw, gin_raw = _bwd_load(
                X, K, V, BETA, G, GIN, n, offs_d, offs_v, tile, ok_d, ok_v, N, D, DV, HAS_READ, TAPS, ERASE)
        x, u, rho, v, beta, beta_e, p, delta = token_math(k_raw, x_raw, v_raw, b_raw, be_raw, D, eps2_over_d,
                                                          inv_sqrt_d, ERASE)
        g = g_raw.to(tl.float32)
        if HAS_READ or TAPS > 0:  # x' as the forward stored it (rounded), as a separate read would see it
            out = (x + u[:, None] * delta[None, :]).to(X.dtype.element_ty).to(tl.float32)
        if HAS_READ:
            gin = gin_raw.to(tl.float32)
            g = g + gin[:, None] * c
            gc += gin[:, None] * out
        if TAPS > 0:  # the read of token t + s took x'_t through tap s
            t_d = n_d % T
            g, gw0 = _tap_step(win0, t_d, 0, T, out, w0, g, gw0, TAP_GRADS)
            if TAPS > 1:
                g, gw1 = _tap_step(win1, t_d, 1, T, out, w1, g, gw1, TAP_GRADS)
            if TAPS > 2:
                g, gw2 = _tap_step(win2, t_d, 2, T, out, w2, g, gw2, TAP_GRADS)
            if TAPS > 3:
                g, gw3 = _tap_step(gin_raw, t_d, 3, T, out, w3, g, gw3, TAP_GRADS)
            for s in tl.static_range(4, TAPS):  # taps past the fourth: their rows and tiles from L1 / L2
                gin = tl.load(GIN + (n + s) * D + offs_d, mask=ok_d & (t_d + s < T), other=0.0).to(tl.float32)
                g = g + _tap_tile(C, s, tile, mw, D, DV) * gin[:, None]
            win0, win1, win2 = win1, win2, gin_raw
        token_grads_store(GX, GK, GV, GBETA, n, g, x, u, rho, v, beta, beta_e, p, delta, offs_d, offs_v, tile, ok_d,
                          ok_v, D, DV, ERASE)
    if HAS_READ:
        tl.store(GC_PART + pid * D * DV + tile, gc, mask=mw)
    if TAPS > 0 and TAP_GRADS:
        part = GC_PART + pid * TAPS * D * DV + tile
        tl.store(part, gw0, mask=mw)
        if TAPS > 1:
            tl.store(part + D * DV, gw1, mask=mw)
        if TAPS > 2:
            tl.store(part + 2 * D * DV, gw2, mask=mw)
        if TAPS > 3:
            tl.store(part + 3 * D * DV, gw3, mask=mw)


def _flat(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, rule: str = "delta"):
    """x, k, v and the gates with one leading dimension, contiguous: beta (N,), or (N, 2) for the untied rule's two
    gates."""
    *lead, d, dv = x.shape
    n = math.prod(lead)
    gates = len(rule_spec(rule).gates)
    return (
        x.reshape(n, d, dv).contiguous(),
        k.reshape(n, d).contiguous(),
        v.reshape(n, dv).contiguous(),
        beta.reshape((n,) if gates == 1 else (n, gates)).contiguous(),
    )


def triton_forward(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, c: torch.Tensor | None, k_eps: float,
    want_delta: bool = False, rule: str = "delta",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One forward launch: (x', x_in or None, delta or None).

    Contiguous x: (N, d, d_v), k: (N, d), v: (N, d_v), beta: (N,) or (N, 1) (the untied rule: (N, 2), the erase
    then the write gate); c: (d, d_v) for the fused CC read ``x_in`` (N, d); ``want_delta`` also writes ``delta``
    (N, d_v) fp32 (for the state rebuild); ``rule``: "delta", "write" or "untied" (the kernels' ``ERASE``).
    """
    n, d, dv = x.shape
    bd, bv = state_blocks(d, dv)
    rows = delta_rows(n, bd * bv)
    out = torch.empty_like(x)
    has_read = c is not None
    xin = torch.empty(n, d, dtype=x.dtype, device=x.device) if has_read else None
    delta = torch.empty(n, dv, dtype=torch.float32, device=x.device) if want_delta else None
    launch(
        _delta_fwd_kernel, (triton.cdiv(n, rows),),
        (x, k, v, beta, out, c.contiguous() if has_read else x, out if xin is None else xin,
         out if delta is None else delta, n, d, k_eps * k_eps / d, 1.0 / math.sqrt(d)), writes=(4, 6, 7),
        HAS_READ=has_read, HAS_DELTA=want_delta, ROWS=rows, BLOCK_D=bd, DV=dv, BLOCK_V=bv, ERASE=rule_spec(rule).erase,
        num_warps=delta_warps(bd * bv),
    )
    return out, xin, delta


def triton_backward(
    g: torch.Tensor, gin: torch.Tensor | None, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    beta: torch.Tensor, c: torch.Tensor | None, k_eps: float, rule: str = "delta",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One backward launch: (grad_x, grad_k, grad_v, grad_beta, grad_c or None), shapes as the inputs (grad_beta
    (N, 2) for the untied rule's two gates).

    With c (the fused read) gin is the gradient of x_in (N, d), or None for zero. The write-only rule without a read
    does not read x (its gradient is G's part alone).
    """
    n, d, dv = x.shape
    bd, bv = state_blocks(d, dv)
    has_read = c is not None
    if has_read:  # a persistent grid: grad_c partials bounded by max_programs, not by n
        progs, chunk = reduction_grid(n, x.device, per_sm=READ_BWD_PER_SM)
    else:  # no reduction over tokens: every row block its own program
        chunk = delta_rows(n, bd * bv)
        progs = triton.cdiv(n, chunk)
    g = g.contiguous()
    gx = torch.empty_like(x)
    gk = torch.empty_like(k)
    gv = torch.empty_like(v)
    gbeta = torch.empty_like(beta)
    if has_read:
        gin = torch.zeros(n, d, dtype=x.dtype, device=x.device) if gin is None else gin.contiguous()
        gc_part = torch.empty(progs, d, dv, dtype=torch.float32, device=x.device)
        c_arg = c.contiguous()
        gc = torch.empty_like(c_arg)
        red = partials.start(x.device, d * dv)
        count, reducing, meta = red.counters, red.total, red.meta()
    else:  # unused placeholders
        gin, gc_part, c_arg, gc, count, reducing = g, g, g, g, g, 0
        meta = dict(REDUCE=False, **partials.plan(1, d * dv).meta())
    x_arg = x if has_read or rule_spec(rule).reads else g  # the write-only rule reads no state
    launch(
        _delta_bwd_kernel, (progs + reducing,),
        (x_arg, k, v, beta, g, gin, c_arg, gx, gk, gv, gbeta, gc_part, gc, count, n, chunk, progs, reducing, 1, d,
         k_eps * k_eps / d, 1.0 / math.sqrt(d)),
        writes=(7, 8, 9, 10, 11), apart=(12, 13), HAS_READ=has_read, TAPS=0, TAP_GRADS=False, BLOCK_D=bd, DV=dv,
        BLOCK_V=bv, PREFETCH=has_read and READ_BWD_PREFETCH, ERASE=rule_spec(rule).erase, num_warps=delta_warps(bd * bv),
        **meta,
    )
    if not has_read:
        return gx, gk, gv, gbeta, None
    red.finish("delta_bwd_kernel", (gc_part, gc))
    return gx, gk, gv, gbeta, gc


class DeltaUpdateTriton(torch.autograd.Function):
    """Flattened inputs x: (N, d, d_v), k: (N, d), v: (N, d_v), beta: (N,) (the untied rule: (N, 2)), c: (d, d_v) or
    None, the update rule.

    Returns x' (N, d, d_v), or (x', x_in) with x_in (N, d) = CC read of x' when c is given.
    """

    @staticmethod
    def forward(ctx, x, k, v, beta, c, k_eps: float, rule: str = "delta"):
        tape = active_tape()
        out, xin, delta = triton_forward(x, k, v, beta, c, k_eps, want_delta=tape is not None, rule=rule)
        if tape is not None:  # x is saved as a handle that rebuilds it from out
            tape.record(x, out, delta_rebuild(k, delta, k_eps))
        ctx.save_for_backward(x, k, v, beta, c)
        ctx.k_eps, ctx.rule = k_eps, rule
        return out if c is None else (out, xin)

    @staticmethod
    def backward(ctx, g, gin=None):
        x, k, v, beta, c = ctx.saved_tensors
        return (*triton_backward(g, gin, x, k, v, beta, c, ctx.k_eps, ctx.rule), None, None)


def delta_update_triton(
    x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *, k_eps: float = 1e-5,
    rule: str = "delta",
) -> torch.Tensor:
    """Fused update of state x by ``rule``: ``x + beta k (v^T - k^T x)`` ("delta"), ``x + beta k v^T`` ("write"),
    ``x + k (beta_w v^T - beta_e k^T x)`` ("untied", beta (..., 2) = (beta_e, beta_w)); x: (..., d, d_v),
    k: (..., d), v: (..., d_v), beta: (..., 1) or (..., 2)."""
    check_device("delta_update", x)
    xf, kf, vf, bf = _flat(x, k, v, beta, rule)
    return DeltaUpdateTriton.apply(xf, kf, vf, bf, None, float(k_eps), rule).view(x.shape)


def delta_update_read_triton(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                             weight: torch.Tensor, *, k_eps: float = 1e-5,
                             rule: str = "delta") -> tuple[torch.Tensor, torch.Tensor]:
    """Fused update (by ``rule``, as :func:`delta_update_triton`) and CC read of the new state: returns (x', x_in)
    with ``x_in_i = sum_j c_ij x'_ij``.

    weight: (d, d_v), the channel compressor of the next sublayer. Saves the separate read pass over x'
    in the forward and the separate (g_in c^T) write plus gradient add in the backward.
    """
    check_device("update_and_channel_read", x)
    xf, kf, vf, bf = _flat(x, k, v, beta, rule)
    out, xin = DeltaUpdateTriton.apply(xf, kf, vf, bf, weight, float(k_eps), rule)
    return out.view(x.shape), xin.view(*x.shape[:-1])
