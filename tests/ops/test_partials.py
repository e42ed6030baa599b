"""Weight gradients summed inside the launch that computes them (:mod:`deep_delta.ops.partials`; issue 40, item 4).

Every kernel that sums a weight gradient over its tokens (the norm, gate and value's five weights, the fused CC
read's c, the fused TC read's taps with K <= 4 and K > 4, the CC read's c, the TC / EC convolutions' taps, the HC /
mHC static coefficients) now launches reducer programs beside its workers: they wait for the workers' partial
rows, sum them in fp32 and write each gradient once in its weight's dtype, so the backward is its launches and
nothing more. Here ``max_programs`` is patched to 5 workers, the reducers to 8 columns each (several reducers per
partial row, the last one partly past the row, a reducer's columns across two gradients of the norm) and 2 rows per
step (a short last block of rows), and the kernels run under the Triton interpreter: values
and every input's gradient against the plain references (fp32 and bf16, odd sizes), the counters back at zero
after every launch, the same bits from two runs, zero tokens, and the backward of each op counted on fake tensors:
its Triton launches and no ATen op (no sum, no copy, no cast). Under the interpreter the programs run one after
another; the concurrency the counters order (a reducer waiting for workers still running) only a GPU exercises.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from tests.ops.test_hyper_kernels import check_linear, hyper_inputs  # noqa: E402
from tests.ops.test_kernels import DEVICE, DTYPE_IDS, DTYPES, delta_inputs, run_both, state_inputs  # noqa: E402
from tests.ops.test_norm_gate_value import CONSTS, compare, norm_inputs, outputs_and_grads, upstream  # noqa: E402

from deep_delta.eval.launches import AtenLaunches, kernel_name  # noqa: E402
from deep_delta.ops import launch as ops_launch  # noqa: E402
from deep_delta.ops import partials  # noqa: E402
from deep_delta.ops.compress import channel_compress, embed_conv, token_compress  # noqa: E402
from deep_delta.ops.compress.naive import (  # noqa: E402
    channel_compress_reference,
    embed_conv_reference,
    token_compress_reference,
)
from deep_delta.ops.delta import triton as delta_triton  # noqa: E402
from deep_delta.ops.delta import update_and_channel_read, update_and_token_read  # noqa: E402
from deep_delta.ops.delta.naive import delta_update_reference  # noqa: E402
from deep_delta.ops.hyper import stream_read, stream_write  # noqa: E402
from deep_delta.ops.hyper.naive import stream_read_reference, stream_write_reference  # noqa: E402
from deep_delta.ops.launch import count_traffic  # noqa: E402
from deep_delta.ops.norm import norm_gate_value  # noqa: E402
from deep_delta.ops.norm import triton as norm_triton  # noqa: E402

WORKERS, COLS, ROWS = 5, 8, 2


ISSUED: list[torch.Tensor] = []  # every set of counters handed to a launch in this test


@pytest.fixture(autouse=True)
def inkernel(monkeypatch, set_switches):
    """The in-kernel reduction switched on (off by default until a GPU run has passed: ``switches``), and every set
    of counters it hands out kept, so that the tests can check each is back at zero."""
    set_switches(inkernel_reduce=True)
    ISSUED.clear()
    issue = partials.counters

    def keep(device):
        count = issue(device)
        ISSUED.append(count)
        return count

    monkeypatch.setattr(partials, "counters", keep)


@pytest.fixture
def small_reduction(monkeypatch):
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: WORKERS)
    monkeypatch.setattr(partials, "MIN_COLS", COLS)
    monkeypatch.setattr(partials, "MAX_COLS", COLS)
    monkeypatch.setattr(partials, "REDUCE_TILE", COLS * ROWS)


def counters_at_zero() -> bool:
    """Every set of counters handed out (and every cached one) is zero, and at least one was handed out."""
    return bool(ISSUED) and all(int(t.abs().sum()) == 0 for t in [*ISSUED, *partials._COUNTERS.values()])


@triton.jit
def _copy_then_sum_kernel(X, PART, OUT, COUNTERS, P, R, WIDTH, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr):
    """Worker i copies row i of X (P, WIDTH) into PART; the reducers sum PART's rows into OUT."""
    ticket = partials.take_ticket(COUNTERS, True)
    if ticket < P:
        for c0 in range(0, WIDTH, REDUCE_COLS):
            cols = c0 + tl.arange(0, REDUCE_COLS)
            row = tl.load(X + ticket * WIDTH + cols, mask=cols < WIDTH, other=0.0)
            tl.store(PART + ticket * WIDTH + cols, row, mask=cols < WIDTH)
        partials.signal_stored(COUNTERS, P, True)
    else:
        partials.reducer(COUNTERS, P, PART, OUT, ticket - P, P, WIDTH, R, REDUCE_ROWS, REDUCE_COLS)


@pytest.mark.parametrize("out_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("rows", "width"), [(0, 13), (1, 1), (5, 13), (9, 40)])
def test_reducers_sum_the_workers_rows(small_reduction, rows, width, out_dtype):
    """The protocol alone: P workers store rows, R reducers wait for them and sum columns in blocks; the sum
    equals torch's (fp32, rounded once to the output's dtype), the same bits twice, the counters back at zero.
    No workers (no tokens) sums to zero."""
    x = torch.randn(rows, width, device=DEVICE)
    red = partials.plan(4, width)
    assert (red.reducers, red.cols, red.rows) == ((triton.cdiv(width, COLS),), COLS, ROWS)
    red = red.total
    outs = []
    for _ in range(2):
        part, out = torch.empty_like(x), torch.full((width,), float("nan"), dtype=out_dtype, device=DEVICE)
        _copy_then_sum_kernel[(rows + red,)](x, part, out, partials.counters(x.device), rows, red, width,
                                             REDUCE_ROWS=ROWS, REDUCE_COLS=COLS)
        assert counters_at_zero()
        outs.append(out)
    want = x.double().sum(0)
    tol = 1e-6 if out_dtype == torch.float32 else 2.0**-8
    assert outs[0].dtype == out_dtype and torch.equal(outs[0], outs[1])
    assert ((outs[0].double() - want).abs() <= tol * (want.abs() + x.double().abs().sum(0)) + 1e-30).all()


def fused_cc(x, k, v, beta, c):
    return update_and_channel_read(x, k, v, beta, c, backend="triton")


def fused_cc_reference(x, k, v, beta, c):
    out = delta_update_reference(x, k, v, beta)
    return out, channel_compress_reference(out, c)


def fused_tc(x, k, v, beta, w):
    return update_and_token_read(x, k, v, beta, w, backend="triton")


def fused_tc_reference(x, k, v, beta, w):
    out = delta_update_reference(x, k, v, beta)
    return out, token_compress_reference(out, w)


B, T = 3, 5  # 15 tokens: 5 workers of 3 tokens, across batch rows
D, DV = 7, 3  # odd sizes: a (d, d_v) weight of 21 values, 3 reducers of 8 columns (the last partly past it)


@pytest.mark.parametrize("inkernel_sum", [True, False], ids=["inkernel-sum", "torch-sum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_weight_gradient_with_several_reducers(small_reduction, dtype, inkernel_sum, set_switches):
    """Every reducing kernel against its plain reference: values and the gradient of every input (fp32 and bf16
    inputs, fp32 weights), with the partial rows summed in the launch (the counters at zero after each) and by
    torch (the ``inkernel_reduce`` switch off: no counters handed out)."""
    set_switches(inkernel_reduce=inkernel_sum)
    x, k, v, beta = delta_inputs((B, T), D, DV, dtype, seed=1)
    xs, e, w, c, _past, _past_e, gx, gin = state_inputs(B, T, D, DV, 4, dtype, seed=2)
    w5 = torch.randn(5, D, DV, device=DEVICE) / DV
    cases = {
        "fused CC read": lambda: run_both(fused_cc, fused_cc_reference, (x, k, v, beta, c), (gx, gin), dtype),
        "fused TC read, K = 4": lambda: run_both(fused_tc, fused_tc_reference, (x, k, v, beta, w), (gx, gin), dtype),
        "fused TC read, K = 5": lambda: run_both(fused_tc, fused_tc_reference, (x, k, v, beta, w5), (gx, gin), dtype),
        "CC read": lambda: run_both(lambda *a: channel_compress(*a, backend="triton"), channel_compress_reference,
                                    (xs, c), (gin,), dtype),
        "TC read": lambda: run_both(lambda *a: token_compress(*a, backend="triton"), token_compress_reference,
                                    (xs, w), (gin,), dtype),
        "EC": lambda: run_both(lambda *a: embed_conv(*a, backend="triton"), embed_conv_reference, (e, w), (gx,), dtype),
        "norm, gate, value": lambda: compare(lambda *a, **kw: norm_gate_value(*a, **kw, backend="triton"),
                                             norm_inputs((B, T), 33, DV, dtype, seed=3), dtype),
    }
    h, r, b, f, a, gh, gin_h = hyper_inputs((B, T), 33, 4, "static", dtype, seed=4)
    cases["HC write, static R and b"] = lambda: check_linear(lambda *t: stream_write(*t, backend="triton"),
                                                             stream_write_reference, (h, r, b, f), gh, dtype)
    cases["HC read, static a"] = lambda: check_linear(lambda *t: stream_read(*t, backend="triton"),
                                                      stream_read_reference, (h, a), gin_h, dtype)
    for name, case in cases.items():
        ISSUED.clear()
        case()
        assert counters_at_zero() if inkernel_sum else not ISSUED, name


def _cc_backward():
    x, k, v, beta = delta_inputs((B, T), D, DV, torch.float32, seed=7)
    c = torch.randn(D, DV, device=DEVICE)
    return delta_triton.triton_backward(torch.randn_like(x.reshape(-1, D, DV)), torch.randn(B * T, D, device=DEVICE),
                                        x.reshape(-1, D, DV), k.reshape(-1, D), v.reshape(-1, DV), beta.reshape(-1), c,
                                        1e-5)


# Stale counters at a launch, each a state a launch that died mid-way or reused memory could leave: the probe of
# 2026-11-28 (round 5, SW6-SW8) planted the rows below; "finished-1" / "finished-2" wrote a wrong grad_c without an
# error before (an early "last reducer" reset the counters while a reducer was still to come), "finished-minus-1"
# finished but left the counters stale for the next launch.
STALE = {
    "tickets": [3, 0, 0, 0], "tickets-and-rows": [12, 12, 0, 0], "rows": [0, 7, 0, 0], "finished": [0, 0, 300, 0],
    "finished-1": [0, 0, 1, 0], "finished-2": [0, 0, 2, 0], "finished-3": [0, 0, 3, 0],
    "ticket-1": [1, 0, 0, 0], "ticket-2": [2, 0, 0, 0], "rows-1": [0, 1, 0, 0], "rows-4": [0, 4, 0, 0],
    "failed": [0, 0, 0, 1], "rows-minus-1": [0, -1, 0, 0], "rows-int-max": [0, 2147483647, 0, 0],
    "failed-minus-5": [0, 0, 0, -5], "finished-minus-1": [0, 0, -1, 0],
}
# A ticket below zero, or one that overflows int32 on the next program's add: a worker of chunk -1 (or -2^31)
# stored its partial row before the buffer (heap corruption, a segfault: SW7). Each runs in a process of its own,
# so that the old code's crash fails the test instead of ending the run.
NEGATIVE_TICKETS = {"ticket-minus-1": [-1, 0, 0, 0], "ticket-int-max": [2147483647, 0, 0, 0]}


@pytest.mark.parametrize("planted", list(STALE.values()), ids=list(STALE))
def test_stale_counters_give_a_clear_error_not_a_hang_or_a_wrong_gradient(small_reduction, monkeypatch, planted):
    """Counters that are not zero at a launch (planted here; on a GPU: a launch that died mid-way, or memory handed
    to another tensor): a reducer whose ticket is past the launch's reducers, that sees more rows signalled than
    workers, counts itself past the reducers, finishes last while the tickets and rows are not the launch's, or polls
    ``SPIN_LIMIT`` times without seeing every worker, and a worker that finds the stored or finished count stale,
    sets the failed counter and writes nothing, and the host raises ReductionError naming the kernel (on a GPU the
    kernel traps). Before issue 47, [3, 0, 0] hung and [12, 12, 0] wrote a wrong grad_c without an error; before
    issue 58, [0, 0, 1, 0] and [0, 0, 2, 0] wrote a wrong grad_c without an error."""
    if DEVICE == "cuda":  # the kernel traps: the process's CUDA context is lost, so it runs in its own process
        _stale_counters_trap_on_the_gpu(planted)
        return
    monkeypatch.setattr(partials, "counters", lambda device: torch.tensor(planted, dtype=torch.int32, device=device))
    with pytest.raises(partials.ReductionError, match=r"delta_bwd_kernel: the in-kernel reduction .* DDL_INKERNEL_REDUCE=0"):
        _cc_backward()


@pytest.mark.parametrize("planted", list(NEGATIVE_TICKETS.values()), ids=list(NEGATIVE_TICKETS))
def test_negative_tickets_write_nothing_outside_the_buffers(planted):
    """A negative ticket is a program past every program of the launch: it fails and writes nothing (on a GPU the
    kernel traps). Run in a process of its own (the old code corrupted the heap or segfaulted there), with the
    reduction of the fused CC read's backward at this file's small sizes under the interpreter."""
    if DEVICE == "cuda":
        _stale_counters_trap_on_the_gpu(planted)
        return
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = (
        "import torch\n"
        "from deep_delta.ops import launch as ops_launch, partials\n"
        "from deep_delta.ops.delta import triton as dt\n"
        f"ops_launch.max_programs = lambda device, per_sm=None: {WORKERS}\n"
        f"partials.MIN_COLS = partials.MAX_COLS = {COLS}; partials.REDUCE_TILE = {COLS * ROWS}\n"
        f"partials.counters = lambda device: torch.tensor({planted}, dtype=torch.int32, device=device)\n"
        f"n, d, dv = {B * T}, {D}, {DV}\n"
        "r = lambda *s: torch.randn(*s)\n"
        "try:\n"
        "    dt.triton_backward(r(n, d, dv), r(n, d), r(n, d, dv), r(n, d), r(n, dv), r(n).abs(), r(d, dv), 1e-5)\n"
        "    print('finished without an error')\n"
        "except partials.ReductionError as e:\n"
        "    print('ReductionError:', e)\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root / "src"), DDL_INKERNEL_REDUCE="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-2000:]}"
    assert "ReductionError: delta_bwd_kernel: the in-kernel reduction" in done.stdout, done.stdout + done.stderr[-2000:]


def _stale_counters_trap_on_the_gpu(planted):
    """On a GPU: the fused CC read's backward with planted counters fails with a CUDA error (the trap) within the
    spin bound, in a process of its own, instead of hanging or finishing with a gradient."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from deep_delta.ops import partials\n"
        "from deep_delta.ops.delta import triton as dt\n"
        f"partials.counters = lambda device: torch.tensor({planted}, dtype=torch.int32, device=device)\n"
        "n, d, dv = 4096, 64, 4\n"
        "r = lambda *s: torch.randn(*s, device='cuda')\n"
        "out = dt.triton_backward(r(n, d, dv), r(n, d), r(n, d, dv), r(n, d), r(n, dv), r(n).abs(), r(d, dv), 1e-5)\n"
        "torch.cuda.synchronize()\n"
        "print('finished without an error')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ, DDL_INKERNEL_REDUCE="1"))
    assert done.returncode != 0 and "finished without an error" not in done.stdout, done.stdout
    assert "CUDA" in done.stderr or "cuda" in done.stderr, done.stderr[-2000:]


def test_fresh_counters_off_cuda_and_one_set_per_stream_on_cuda():
    """Off CUDA every launch gets fresh zeros (nothing cached that a failed launch could leave dirty); the cache
    is for CUDA streams only, and fresh zeros again while a graph is captured (checked on the GPU by the device
    call's stress probe)."""
    before = dict(partials._COUNTERS)
    first, second = partials.counters(torch.device("cpu")), partials.counters(torch.device("cpu"))
    assert first is not second and first.tolist() == second.tolist() == [0] * partials.SLOTS
    assert partials._COUNTERS == before


def test_same_bits_twice_and_gradients_in_the_weights_dtype(small_reduction):
    """bf16 weights get bf16 gradients, written by the kernel (no cast after it; within a few bf16 roundings of
    the fp64 lean path, c being bf16 too); two runs give the same bits."""
    inputs = norm_inputs((B, T), 33, DV, torch.float32, torch.bfloat16, seed=5)
    grads = upstream(inputs[0], DV)
    first, second = (outputs_and_grads(lambda *a, **kw: norm_gate_value(*a, **kw, backend="triton"), inputs,
                                       grads)[1] for _ in range(2))
    want = outputs_and_grads(lambda *a, **kw: norm_gate_value(*a, **kw, backend="torch"), inputs, grads,
                             torch.float64)[1]
    for got, again, ref, t in zip(first, second, want, inputs):
        assert got.dtype == t.dtype and torch.equal(got, again)
        assert ((got.double() - ref).norm() / ref.norm()).item() < 3e-2
    c = torch.randn(D, DV, device=DEVICE)
    x, k, v, beta = delta_inputs((B, T), D, DV, torch.float32, seed=6)
    runs = []
    for _ in range(2):
        cc = c.clone().requires_grad_()
        out, xin = fused_cc(x, k, v, beta, cc)
        (out.sum() + xin.square().sum()).backward()
        runs.append(cc.grad)
    assert torch.equal(*runs)


def test_zero_tokens_give_zero_weight_gradients(small_reduction):
    """No workers: the reducers still run and write zeros."""
    src, *weights = norm_inputs((0,), 12, DV)
    grads = norm_triton.triton_backward(*upstream(src, DV), src, *weights, *CONSTS.values())
    assert grads[0].shape == (0, 12) and all(int(g.abs().sum()) == 0 and g.shape == t.shape
                                             for g, t in zip(grads[1:], weights))
    x, k, v, beta = delta_inputs((0,), D, DV, torch.float32)
    c = torch.randn(D, DV, device=DEVICE)
    *_, grad_c = delta_triton.triton_backward(torch.zeros_like(x), torch.zeros(0, D, device=DEVICE), x, k, v,
                                              beta.reshape(0), c, 1e-5)
    assert grad_c.shape == c.shape and int(grad_c.abs().sum()) == 0
    assert counters_at_zero()


def _backward_launches(forward, inputs, n_out):
    """(Triton kernels, ATen ops) of ``torch.autograd.grad`` through ``forward(*inputs)`` on fake tensors, dry."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        leaves = [t().requires_grad_() for t in inputs]
        with count_traffic(dry=True):
            outs = forward(*leaves)
            outs = outs[:n_out] if isinstance(outs, tuple) else (outs,)
            upstream_grads = [torch.ones_like(o) for o in outs]
        with count_traffic(dry=True, keep_calls=True) as kernels, AtenLaunches() as aten:
            torch.autograd.grad(outs, leaves, upstream_grads)
    return [kernel_name(kernel) for kernel, *_ in kernels.calls], aten.ops


@pytest.mark.parametrize(("op", "kernels"), [
    ("norm, gate, value", ["norm_gate_value_bwd_kernel"]),
    ("fused CC read", ["delta_bwd_kernel"]),
    ("fused TC read, K = 4", ["delta_bwd_kernel"]),
    ("fused TC read, K = 5", ["delta_bwd_kernel", "delta_tc_grad_w_kernel"]),
    ("CC read", ["cc_bwd_kernel"]),
    ("TC read", ["conv_bwd_input_kernel", "conv_bwd_w_kernel"]),
    ("HC write, static", ["write_bwd_kernel"]),
], ids=lambda a: a if isinstance(a, str) else None)
def test_the_backward_is_its_launches_and_no_torch_op(op, kernels, set_switches):
    """No sum of partials, no copy or cast of a gradient after the kernels: the ATen ops of each backward, counted
    as ``ddl bench-kernels --launches`` counts them, are none (at the small preset's width and 8 x 1024 tokens:
    the persistent grid at its full size)."""
    set_switches(tc_one_pass=True)  # the TC rows: the one-pass backward's launches
    bsz, t, d, dv = 8, 1024, 768, 4
    f32, bf16 = torch.float32, torch.bfloat16

    def make(*shape, dtype=f32):
        return lambda: torch.randn(*shape, dtype=dtype)

    state = (make(bsz, t, d, dv, dtype=bf16), make(bsz, t, d, dtype=bf16), make(bsz, t, dv), make(bsz, t, 1))
    forward, inputs, n_out = {
        "norm, gate, value": (lambda *a: norm_gate_value(*a, eps=1e-5, beta_max=2.0, value_scale=4.0, c_dtype=bf16,
                                                         backend="triton"),
                              (make(bsz * t, d, dtype=bf16), make(d), make(1, d), make(1), make(dv, d), make(dv)), 3),
        "fused CC read": (fused_cc, (*state, make(d, dv)), 2),
        "fused TC read, K = 4": (fused_tc, (*state, make(4, d, dv)), 2),
        "fused TC read, K = 5": (fused_tc, (*state, make(5, d, dv)), 2),
        "CC read": (lambda *a: channel_compress(*a, backend="triton"), (state[0], make(d, dv)), 1),
        "TC read": (lambda *a: token_compress(*a, backend="triton"), (state[0], make(4, d, dv)), 1),
        "HC write, static": (lambda *a: stream_write(*a, backend="triton"),
                             (make(bsz * t, d, 4, dtype=bf16), make(4, 4), make(4), make(bsz * t, d, dtype=bf16)), 1),
    }[op]
    launched, aten = _backward_launches(forward, inputs, n_out)
    assert launched == kernels
    assert aten == [], f"{op}: ATen ops in the backward: {aten}"


def test_the_reducers_spread_over_the_sms():
    """About one reducer per SM at the small preset's widths (an H100's 132): the reduction reads with the whole
    GPU, not one SM; 32 to 256 columns each, 16 KB loaded per step."""
    d, dv, sms = 768, 4, 132
    for widths in ((2 * d, dv * d, 1 + dv), (2 * d, d, 2), (d * dv,), (4 * d * dv,)):  # norm d_v 4 / 1, CC, TC
        red = partials.plan(sms, *widths)
        assert sms / 2 <= red.total <= 2 * sms, (widths, red)
        assert red.cols * red.rows == 4096 and all(r == triton.cdiv(w, red.cols) for r, w in zip(red.reducers, widths))
    assert partials.plan(sms, 16, 4).cols == 32 and partials.plan(1, 10**6).cols == 256
