"""Triton kernels of the delta update fused with the next sublayer's TC read, forward and backward.

The TC read of token t needs the new states of tokens t-K+1..t, written by the update of those tokens, so
it cannot be computed from one token's tile as the CC read is. The forward gives each program a chunk of
``CHUNK`` consecutive tokens of one sequence and lets it compute the K-1 tokens before the chunk again
(the halo: their state is read, their update recomputed, nothing written), so that every read it needs is
in its own registers:

forward   for t = t0-K+1 .. t0+CHUNK-1 (t >= 0): the update of token t as ops.delta.triton (fp32 math),
          x'_t stored (t >= t0); the read's contributions of x'_t (as stored, rounded) to the K tokens it
          reaches, r_s = sum_j w_s[:, j] x'_t[:, j] for t+s, one tap tile at a time, added to K pending sums
          kept in a (d, slot) register tensor (the sum of token t+s lives in slot (t+s) mod K, so nothing is
          shifted); the slot of t is then complete: x_in_t = that slot, stored (t >= t0), and the slot
          cleared. With ``PREFETCH`` token t+1's inputs are loaded before token t's math.
backward  one pass over the state, on a persistent grid of at most ``max_programs`` programs (one per SM on
          CUDA, ``BWD_PER_SM``), each a contiguous chunk of the flattened tokens (crossing sequences):
          ops.delta.triton's update backward with ``TAPS = K``. Per token it recomputes x'_t in registers (as
          the forward stored it, rounded), forms the state's gradient G_t + sum_s w_s g_in_{t+s} and adds
          g_in_{t+s} x'_t^T to the tap s gradient, one fp32 (d, d_v) accumulator for each of the first four
          taps; the four tap tiles of w are loaded once per program, and the rows g_in_t .. g_in_{t+3} are a
          window carried from token to token (one new row per token). One partial per program,
          (programs, K, d, d_v) whatever the number of tokens, summed by reducer programs of the same launch
          into grad_w in w's dtype (:mod:`deep_delta.ops.partials`; deterministic, no atomic adds of values).
          For K > 4 a second kernel on the same grid adds the taps past the fourth from x' as stored (which the
          Function then saves: the next update's input, kept anyway), four taps per program, and its reducers
          sum the partials instead.

Compared with the update followed by a separate TC read (two kernels each way): one pass over the state
instead of two forward (plus the halo's K-1 in CHUNK re-reads), and backward no separate state-sized
gradient of the read and no state-sized gradient add: it reads x, G and g_in once and writes the gradients
once, as the update's own backward does, plus the partials (for K <= 4). Without history only (training and a
cache-less forward); decoding keeps the separate read. Tested against the plain reference (update, then the TC
read) under ``TRITON_INTERPRET=1`` (tests/ops/test_kernels_token_read.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from deep_delta.ops import partials, switches
from deep_delta.ops.delta.recompute import active_tape, delta_rebuild
from deep_delta.ops.delta.rules import rule_spec
from deep_delta.ops.delta.triton import _delta_bwd_kernel, token_load, token_math
from deep_delta.ops.launch import check_device, delta_warps, launch, reduction_grid, state_blocks

CHUNK = 32  # forward tokens per program: halo overhead (K-1)/CHUNK, 8 x 1024 tokens -> 256 programs
TAP_GROUP = 4  # taps whose gradient the update's backward sums (its four named accumulators; a second kernel the rest)
# the forward loads token t + 1 while computing t: more registers (141 against 109 at 8 warps, sm_90), and
# 1.13x faster at 4 warps on an H200 (tune_kernels.py, 2026-11-26)
PREFETCH = True
# The backward (the update's backward with the read's gradient and the taps' gradient, one pass) at twice the
# update's warps (8 at d = 768, d_v = 4), one program per SM: compiled for sm_90 it holds 251-255 registers per
# thread (the four tap tiles of w and four fp32 accumulators of their gradient besides the state's tiles), so one
# 8-warp program fills an SM's 65,536 registers. Without the prefetch of token n+1 it spills nothing; with it,
# 32 (bf16) / 88 (fp32) bytes per thread; at 16 warps (at most 128 registers) 32-120 with either. Not yet timed.
BWD_PREFETCH = False
BWD_PER_SM = 1


@triton.jit
def _delta_tc_fwd_kernel(
    X, K, V, BETA, W, OUT, XIN, DELTA,
    T, D, eps2_over_d, inv_sqrt_d,
    HAS_DELTA: tl.constexpr, KS: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr, PREFETCH: tl.constexpr, ERASE: tl.constexpr,
):
    b = tl.program_id(0)
    t0 = tl.program_id(1) * CHUNK
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    offs_q = tl.arange(0, BLOCK_K)
    md = offs_d < D
    mv = offs_v < DV
    mt = md[:, None] & mv[None, :]
    tile = offs_d[:, None] * DV + offs_v[None, :]
    pending = tl.zeros((BLOCK_D, BLOCK_K), dtype=tl.float32)  # (d, slot): the tile's layout when BLOCK_K == BLOCK_V
    start = tl.maximum(t0 - (KS - 1), 0)
    stop = tl.minimum(t0 + CHUNK, T)
    # PREFETCH: token t's inputs are loaded one iteration ahead (their latency behind token t-1's math, at the
    # cost of the registers that hold them: fewer programs per SM)
    ok_d = md & (((offs_d * 0) + start) < stop)
    ok_v = mv & (((offs_v * 0) + start) < stop)
    k_raw, x_raw, v_raw, b_raw, be_raw = token_load(X, K, V, BETA, b * T + start, offs_d, offs_v, tile, ok_d, ok_v, D,
                                                    DV, ERASE)
    for t in range(start, stop):
        n = b * T + t
        if PREFETCH:
            k_cur, x_cur, v_cur, b_cur, be_cur = k_raw, x_raw, v_raw, b_raw, be_raw
            ok_d = md & (((offs_d * 0) + t + 1) < stop)
            ok_v = mv & (((offs_v * 0) + t + 1) < stop)
            k_raw, x_raw, v_raw, b_raw, be_raw = token_load(X, K, V, BETA, n + 1, offs_d, offs_v, tile, ok_d, ok_v, D,
                                                            DV, ERASE)
        else:
            k_cur, x_cur, v_cur, b_cur, be_cur = token_load(X, K, V, BETA, n, offs_d, offs_v, tile, md, mv, D, DV,
                                                            ERASE)
        keep_d = md & (((offs_d * 0) + t) >= t0)  # halo tokens are computed, not stored
        keep_v = mv & (((offs_v * 0) + t) >= t0)
        x, u, rho, v, beta, beta_e, p, delta = token_math(k_cur, x_cur, v_cur, b_cur, be_cur, D, eps2_over_d,
                                                          inv_sqrt_d, ERASE)
        if HAS_DELTA:
            tl.store(DELTA + n * DV + offs_v, delta, mask=keep_v)
        out_st = (x + u[:, None] * delta[None, :]).to(OUT.dtype.element_ty)
        tl.store(OUT + n * D * DV + tile, out_st, mask=keep_d[:, None] & mv[None, :])
        out = out_st.to(tl.float32)  # the read sees the stored (rounded) state, as a separate read would
        # tap s carries x'_t into the read of token t + s, whose pending sum lives in slot (t + s) mod K: one
        # (d, d_v) tile of the taps at a time (reloaded per token from L1, not held: registers decide occupancy)
        for s in tl.static_range(KS):
            w_s = tl.load(W + s * D * DV + tile, mask=mt, other=0.0).to(tl.float32)
            r_s = tl.sum(w_s * out, axis=1)
            pending += tl.where((offs_q == (t + s) % KS)[None, :], r_s[:, None], 0.0)
        done = offs_q == (t % KS)
        xin = tl.sum(tl.where(done[None, :], pending, 0.0), axis=1)
        tl.store(XIN + n * D + offs_d, xin.to(XIN.dtype.element_ty), mask=keep_d)
        pending = tl.where(done[None, :], 0.0, pending)


@triton.jit
def _tap_grad(GIN, row, ok, offs_d, D, out, gw):
    """grad_w_s += g_in[t+s] x'_t for one tap s: GIN row ``row`` = t + s, ``ok`` masks it (past the sequence, or
    s past the taps)."""
    gin = tl.load(GIN + row * D + offs_d, mask=ok, other=0.0).to(tl.float32)
    return gw + gin[:, None] * out


@triton.jit
def _delta_tc_grad_w_kernel(
    OUT, GIN, GW_PART, GW, COUNTERS,
    N, CHUNK, P, GROUPS, FIRST, R, T, D, KS,
    BLOCK_D: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr, REDUCE: tl.constexpr, REDUCE_ROWS: tl.constexpr,
    REDUCE_COLS: tl.constexpr,
):
    """The taps' gradient from the saved x', groups of four taps from group FIRST (1 with the one-pass backward:
    the update's backward accumulates the first four; else 0): P x GROUPS workers (:func:`_tap_group_worker`),
    ticket i the chunk i // GROUPS and the taps from 4 (i % GROUPS + FIRST), then (REDUCE) R reducers that sum the
    (P, K, d, d_v) partials of both kernels into GW, in GW's dtype (ops/partials.py)."""
    ticket = partials.take_ticket(COUNTERS, REDUCE)
    if ticket < P * GROUPS:
        _tap_group_worker(OUT, GIN, GW_PART, ticket // GROUPS, (ticket % GROUPS + FIRST) * 4, N, CHUNK, T, D, KS,
                          BLOCK_D, DV, BLOCK_V)
        partials.signal_stored(COUNTERS, P * GROUPS, REDUCE)
    elif REDUCE:
        partials.reducer(COUNTERS, P * GROUPS, GW_PART, GW, ticket - P * GROUPS, P, KS * D * DV, R, REDUCE_ROWS,
                         REDUCE_COLS)


@triton.jit
def _tap_group_worker(
    OUT, GIN, GW_PART, pid, s0, N, CHUNK, T, D, KS, BLOCK_D: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Tokens [pid * CHUNK, (pid + 1) * CHUNK) of the flattened (B * T) rows, taps s0 .. s0 + 3:
    grad_w_s = sum_t g_in[t+s] x'_t^T, x'_t read as the forward stored it, one (d, d_v) fp32 accumulator per tap in
    registers, one partial per program in the update's (P, K, d, d_v) buffer."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.arange(0, BLOCK_V)
    md = offs_d < D
    mv = offs_v < DV
    mt = md[:, None] & mv[None, :]
    tile = offs_d[:, None] * DV + offs_v[None, :]
    gw0 = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)  # named: a loop carries no list
    gw1 = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
    gw2 = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
    gw3 = tl.zeros((BLOCK_D, BLOCK_V), dtype=tl.float32)
    for r in range(0, CHUNK):
        n = pid * CHUNK + r
        n_d = (offs_d * 0) + n  # masks must be tensors
        ok_d = md & (n_d < N)
        out = tl.load(OUT + n * D * DV + tile, mask=mt & (((tile * 0) + n) < N), other=0.0).to(tl.float32)
        t_d = n_d % T
        s_d = (offs_d * 0) + s0
        gw0 = _tap_grad(GIN, n + s0, ok_d & (t_d + s0 < T) & (s_d < KS), offs_d, D, out, gw0)
        gw1 = _tap_grad(GIN, n + s0 + 1, ok_d & (t_d + s0 + 1 < T) & (s_d + 1 < KS), offs_d, D, out, gw1)
        gw2 = _tap_grad(GIN, n + s0 + 2, ok_d & (t_d + s0 + 2 < T) & (s_d + 2 < KS), offs_d, D, out, gw2)
        gw3 = _tap_grad(GIN, n + s0 + 3, ok_d & (t_d + s0 + 3 < T) & (s_d + 3 < KS), offs_d, D, out, gw3)
    part = GW_PART + (pid * KS + s0) * D * DV + tile
    s_t = (tile * 0) + s0  # masks must be tensors
    tl.store(part, gw0, mask=mt & (s_t < KS))
    tl.store(part + D * DV, gw1, mask=mt & (s_t + 1 < KS))
    tl.store(part + 2 * D * DV, gw2, mask=mt & (s_t + 2 < KS))
    tl.store(part + 3 * D * DV, gw3, mask=mt & (s_t + 3 < KS))


def _chunk(t: int, most: int) -> int:
    return min(most, triton.next_power_of_2(max(t, 1)))


def token_read_forward(x, k, v, beta, w, k_eps: float, want_delta: bool = False, rule: str = "delta"):
    """(x', x_in, delta or None). x: (B, T, d, d_v), k: (B, T, d), v: (B, T, d_v), beta: (B, T) (the untied rule:
    (B, T, 2), the erase then the write gate), w: (K, d, d_v), all contiguous; x_in (B, T, d) in x's dtype, delta
    (B, T, d_v) fp32; ``rule`` the update rule (ops.delta.triton's ``ERASE``)."""
    bsz, t, d, dv = x.shape
    ks = w.shape[0]
    bd, bv = state_blocks(d, dv)
    chunk = _chunk(t, CHUNK)
    out = torch.empty_like(x)
    xin = torch.empty(bsz, t, d, dtype=x.dtype, device=x.device)
    delta = torch.empty(bsz, t, dv, dtype=torch.float32, device=x.device) if want_delta else None
    launch(
        _delta_tc_fwd_kernel, (bsz, triton.cdiv(t, chunk)),
        (x, k, v, beta, w, out, xin, out if delta is None else delta, t, d, k_eps * k_eps / d, 1.0 / math.sqrt(d)),
        writes=(5, 6, 7), HAS_DELTA=want_delta, KS=ks, BLOCK_K=triton.next_power_of_2(ks), CHUNK=chunk,
        BLOCK_D=bd, DV=dv, BLOCK_V=bv, PREFETCH=PREFETCH, ERASE=rule_spec(rule).erase, num_warps=delta_warps(bd * bv),
    )
    return out, xin, delta


def saves_new_state(ks: int, one_pass: bool) -> bool:
    """Whether the backward reads x' as the forward stored it (the taps' second kernel runs): K > 4, or the
    one-pass backward switched off (``switches.get().tc_one_pass``)."""
    return ks > TAP_GROUP or not one_pass


def token_read_backward(g, gin, x, out, k, v, beta, w, k_eps: float, one_pass: bool | None = None,
                        rule: str = "delta"):
    """(grad_x, grad_k, grad_v, grad_beta, grad_w) for the upstream gradients g (of x') and gin (of x_in, or
    None for zero); out = x', the forward's new state, read by the taps' second kernel (None when it does not run:
    :func:`saves_new_state`); other shapes as :func:`token_read_forward`'s inputs. With the one-pass backward
    (``switches.get().tc_one_pass``), one launch for K <= 4: the update's backward with the read's gradient added per
    token and the taps' gradient from x' recomputed in registers, on a bounded persistent grid (ops.delta.triton's
    kernel); for K > 4 a second launch on the same grid adds the other taps' gradient from the saved x'. Without
    it, the update's backward adds the read's gradient only and the second launch sums every tap's gradient.
    ``one_pass``: None for the switch's value now (the Function passes the forward's); ``rule`` the update rule."""
    bsz, t, d, dv = x.shape
    ks = w.shape[0]
    n = bsz * t
    bd, bv = state_blocks(d, dv)
    gin = torch.zeros(bsz, t, d, dtype=x.dtype, device=x.device) if gin is None else gin.contiguous()
    gx, gk, gv, gbeta = torch.empty_like(x), torch.empty_like(k), torch.empty_like(v), torch.empty_like(beta)
    groups = triton.cdiv(ks, TAP_GROUP)
    one_pass = switches.get().tc_one_pass if one_pass is None else one_pass
    first = 1 if one_pass else 0  # the first group of taps the second kernel sums
    progs, chunk = reduction_grid(n, x.device, per_program_axis=groups, per_sm=BWD_PER_SM)
    gw_part = torch.empty(progs, ks, d, dv, dtype=torch.float32, device=x.device)
    gw = torch.empty_like(w)
    red = partials.start(x.device, ks * d * dv)
    one = groups == first  # only the update's backward: it sums the partials in its launch, else the second kernel
    none = dict(REDUCE=False, **red.plan.meta())
    launch(
        _delta_bwd_kernel, (progs + (red.total if one else 0),),
        # without the taps' gradient the update's launch writes no partial (gx as a placeholder: counted once)
        (x, k, v, beta, g.contiguous(), gin, w, gx, gk, gv, gbeta, gw_part if one_pass else gx, gw, red.counters, n,
         chunk, progs, red.total, t, d, k_eps * k_eps / d, 1.0 / math.sqrt(d)),
        writes=(7, 8, 9, 10, 11), apart=(12, 13), HAS_READ=False, TAPS=ks, TAP_GRADS=one_pass, BLOCK_D=bd, DV=dv,
        BLOCK_V=bv, PREFETCH=BWD_PREFETCH, ERASE=rule_spec(rule).erase, **(red.meta() if one else none),
        num_warps=delta_warps(2 * bd * bv),  # the tiles of four taps and their gradient besides the state's
    )
    if not one:
        if out is None:
            raise ValueError("token_read_backward: the taps' second kernel reads x' (out), got None")
        launch(
            _delta_tc_grad_w_kernel, (progs * (groups - first) + red.total,),
            (out.contiguous(), gin, gw_part, gw, red.counters, n, chunk, progs, groups - first, first, red.total, t,
             d, ks),
            writes=(2,), apart=(3, 4), BLOCK_D=bd, DV=dv, BLOCK_V=bv, num_warps=delta_warps(bd * bv), **red.meta(),
        )
    red.finish("delta_tc_grad_w_kernel" if not one else "delta_bwd_kernel", (gw_part, gw))
    return gx, gk, gv, gbeta, gw


class DeltaUpdateTokenRead(torch.autograd.Function):
    """x: (B, T, d, d_v), k: (B, T, d), v: (B, T, d_v), beta: (B, T) ((B, T, 2) for the untied rule), w: (K, d,
    d_v), contiguous, the update rule -> (x', x_in)."""

    @staticmethod
    def forward(ctx, x, k, v, beta, w, k_eps: float, rule: str = "delta"):
        tape = active_tape()
        out, xin, delta = token_read_forward(x, k, v, beta, w, k_eps, want_delta=tape is not None, rule=rule)
        if tape is not None:  # x is saved as a handle that rebuilds it from out
            tape.record(x, out, delta_rebuild(k.reshape(-1, k.shape[-1]), delta.reshape(-1, delta.shape[-1]), k_eps))
        # x' too where the taps' second kernel reads it (K > 4, or the one-pass backward off): the next update's
        # input, saved by it anyway (the extra memory is the model's last state only); else recomputed in registers
        ctx.one_pass = switches.get().tc_one_pass
        ctx.save_for_backward(x, out if saves_new_state(w.shape[0], ctx.one_pass) else None, k, v, beta, w)
        ctx.k_eps, ctx.rule = k_eps, rule
        return out, xin

    @staticmethod
    def backward(ctx, g, gin):
        x, out, k, v, beta, w = ctx.saved_tensors
        return (*token_read_backward(g, gin, x, out, k, v, beta, w, ctx.k_eps, ctx.one_pass, ctx.rule), None, None)


def delta_update_token_read_triton(x, k, v, beta, weight, *, k_eps: float = 1e-5, rule: str = "delta"):
    """Fused update (by ``rule``: "delta", "write" or "untied", as ops.delta.triton's) and TC read of the new state:
    (x', x_in) with ``x_in_t = sum_s sum_j w_s[:, j] x'_{t-s}[:, j]``.

    x: (B, T, d, d_v), k: (B, T, d), v: (B, T, d_v), beta: (B, T, 1) ((B, T, 2) for the untied rule), weight:
    (K, d, d_v) the next sublayer's folded TC taps (no token history: the K-1 states before the first token are
    zero).
    """
    check_device("update_and_token_read", x)
    bsz, t = x.shape[:2]
    gates = len(rule_spec(rule).gates)
    gates = (bsz, t) if gates == 1 else (bsz, t, gates)
    out, xin = DeltaUpdateTokenRead.apply(x.contiguous(), k.contiguous(), v.contiguous(),
                                          beta.reshape(gates).contiguous(), weight.contiguous(), float(k_eps), rule)
    return out, xin
