"""The ``torch.library`` custom ops (:mod:`deep_delta.ops.delta.library`) against the plain reference.

- ``torch.library.opcheck`` (schema, autograd registration, fake tensors, AOT dispatch with dynamic shapes) on
  every op, forward and backward, fp32, fp64 and bf16, odd sizes; and with ``backend="triton"`` (the kernels on
  any device: under the interpreter on CPU), which ``torch.compile`` of a ``"triton"`` model calls.
- Values and gradients of ``backend="auto"`` (the custom ops) equal the reference, with the tolerances of
  tests/ops/test_kernels.py (``assert_close``).
- The state rebuild (``StateTape``) through the custom ops in eager.
On CPU the ops run their lean kernels; on a CUDA machine the same tests run the Triton kernels.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from tests.ops.test_kernels import DEVICE, delta_inputs, run_both

from deep_delta.ops import delta_update
from deep_delta.ops.compress.naive import channel_compress_reference
from deep_delta.ops.delta import update_and_channel_read
from deep_delta.ops.delta.library import (
    delta_update_backward_op,
    delta_update_op,
    delta_update_read_backward_op,
    delta_update_read_op,
)
from deep_delta.ops.delta.naive import delta_update_reference
from deep_delta.ops.delta.recompute import StateTape, observe
from deep_delta.ops.launch import count_traffic

SHAPES = [((2, 3), 7, 1), ((5,), 12, 3), ((1,), 33, 4), ((3, 1), 9, 8)]
SHAPE_IDS = ["n6-d7-dv1", "n5-d12-dv3", "n1-d33-dv4", "n3-d9-dv8"]
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp64", "fp32", "bf16"]


def flat_inputs(lead, d, dv, dtype, seed):
    x, k, v, beta = delta_inputs(lead, d, dv, dtype, seed=seed)
    n = x.numel() // (d * dv)
    if dtype == torch.float64:
        v, beta = v.double(), beta.double()
    return x.reshape(n, d, dv), k.reshape(n, d), v.reshape(n, dv), beta.reshape(n, 1)


def opcheck_delta_ops(lead, d, dv, dtype, backend):
    x, k, v, beta = flat_inputs(lead, d, dv, dtype, seed=d)
    gen = torch.Generator().manual_seed(d + 1)
    c = torch.randn(d, dv, generator=gen).to(dtype).to(DEVICE)
    g = torch.randn(x.shape, generator=gen).to(dtype).to(DEVICE)
    gin = torch.randn(x.shape[:-1], generator=gen).to(dtype).to(DEVICE)
    grad = lambda *ts: tuple(t.clone().requires_grad_() for t in ts)  # noqa: E731
    out = delta_update_op(x, k, v, beta, 1e-5, "delta", backend)
    cases = [
        (delta_update_op, (*grad(x, k, v, beta), 1e-5, "delta", backend)),
        (delta_update_op, (x, k, v, beta, 1e-5, "delta", backend)),
        (delta_update_read_op, (*grad(x, k, v, beta, c), 1e-5, "delta", backend)),
        (delta_update_backward_op, (g, x, k, v, beta, 1e-5, "delta", backend)),
        (delta_update_read_backward_op, (g, gin, x, out, k, v, beta, c, 1e-5, "delta", backend)),
    ]
    for op, args in cases:
        # opcheck's own comparisons use its default tolerances: bf16 results of the eager and the traced
        # calls are the same kernels, so they agree exactly
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, f"{op}: {result}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,dv", SHAPES, ids=SHAPE_IDS)
def test_opcheck_every_custom_op(lead, d, dv, dtype):
    opcheck_delta_ops(lead, d, dv, dtype, "auto")


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=DTYPE_IDS[1:])
def test_opcheck_every_custom_op_on_the_triton_path(dtype):
    opcheck_delta_ops((5,), 12, 3, dtype, "triton")
    opcheck_norm_ops(5, 12, 3, dtype, "triton")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,dv", SHAPES, ids=SHAPE_IDS)
def test_custom_op_update_matches_reference(lead, d, dv, dtype):
    x, k, v, beta = delta_inputs(lead, d, dv, dtype, seed=d + dv)
    if dtype == torch.float64:
        v, beta = v.double(), beta.double()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    fast = lambda x, k, v, b: delta_update(x, k, v, b, backend="auto")  # noqa: E731
    run_both(fast, delta_update_reference, (x, k, v, beta), (g,), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,dv", SHAPES[1:], ids=SHAPE_IDS[1:])
def test_custom_op_update_and_read_matches_reference(lead, d, dv, dtype):
    x, k, v, beta = delta_inputs(lead, d, dv, dtype, seed=3)
    gen = torch.Generator().manual_seed(5)
    c = torch.randn(d, dv, generator=gen).to(DEVICE)
    if dtype == torch.float64:
        v, beta, c = v.double(), beta.double(), c.double()
    g = torch.randn(x.shape, generator=gen).to(DEVICE)
    gin = torch.randn(x.shape[:-1], generator=gen).to(DEVICE)

    def ref(x, k, v, b, c):
        out = delta_update_reference(x, k, v, b)
        return out, channel_compress_reference(out, c)

    fast = lambda x, k, v, b, c: update_and_channel_read(x, k, v, b, c, backend="auto")  # noqa: E731
    run_both(fast, ref, (x, k, v, beta, c), (g, gin), dtype)


def test_custom_op_read_output_unused_gets_gradients():
    """Only x' feeds the loss: the op's x_in gradient arrives undefined and counts as zero."""
    x, k, v, beta = delta_inputs((4,), 9, 3, torch.float32, seed=2)
    c = torch.randn(9, 3, device=DEVICE)
    g = torch.randn(x.shape, device=DEVICE)
    fast = lambda x, k, v, b, c: update_and_channel_read(x, k, v, b, c, backend="auto")[0]  # noqa: E731
    ref = lambda x, k, v, b, c: delta_update_reference(x, k, v, b) + 0 * c.sum()  # noqa: E731
    run_both(fast, ref, (x, k, v, beta, c), (g,), torch.float32)


def test_state_rebuild_through_the_custom_ops():
    """Inside a StateTape the custom ops record their updates: x is rebuilt from x' (the saved handle, not the
    tensor), and the gradients equal those without the tape."""
    x0, k, v, beta = delta_inputs((2, 5), 12, 3, torch.float64, seed=4)
    ks = [k, k.flip(0), k.roll(1, -1)]
    c = torch.randn(12, 3, dtype=torch.float64, device=DEVICE)
    g = torch.randn(x0.shape, dtype=torch.float64, device=DEVICE)

    def run(tape: bool):
        leaves = [t.detach().clone().requires_grad_() for t in (x0, *ks, v.double(), beta.double(), c)]
        x, k0, k1, k2, vv, bb, cc = leaves
        kept = []
        with observe(kept), StateTape() if tape else contextlib.nullcontext() as t:
            if tape:
                t.register(x)
            x1 = delta_update(x, k0, vv, bb)
            x2, xin = update_and_channel_read(x1, k1, vv, bb, cc)
            x3 = delta_update(x2, k2 * xin.unsqueeze(-1).mean(), vv, bb)
        # saved states: x (update 1), x1 and x2 (the fused op keeps its new state for grad_c), x2 (update 3)
        handles = sum(not isinstance(obj, torch.Tensor) for obj in kept)
        assert handles == (4 if tape else 0), f"{handles} saved states are rebuild handles"
        torch.autograd.backward(x3, g)
        return [leaf.grad for leaf in leaves]

    for got, ref in zip(run(True), run(False)):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def opcheck_norm_ops(n, d, dv, dtype, backend):
    from deep_delta.ops.norm.library import norm_gate_value_backward_op, norm_gate_value_op

    gen = torch.Generator().manual_seed(d)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    r = lambda *shape, dt=wdt: torch.randn(*shape, generator=gen).to(dt).to(DEVICE)  # noqa: E731
    src = r(n, d, dt=dtype)
    weights = (1 + 0.3 * r(d), r(1, d), r(1), r(dv, d), r(dv))
    grads = (r(n, d), r(n, 1), r(n, dv))
    consts = (1e-5, 2.0, 4.0)
    low = torch.bfloat16 if dtype != torch.float64 else torch.float32  # c in a lower precision (c_dtype)
    cases = [
        (norm_gate_value_op, (src.clone().requires_grad_(), *(w.clone().requires_grad_() for w in weights), *consts,
                              None, backend)),
        (norm_gate_value_op, (src.clone().requires_grad_(), *(w.clone().requires_grad_() for w in weights), *consts,
                              low, backend)),
        (norm_gate_value_op, (src, *weights, *consts, None, backend)),
        (norm_gate_value_backward_op, (*grads, src, *weights, *consts, backend)),
        (norm_gate_value_backward_op, (grads[0].to(low), *grads[1:], src, *weights, *consts, backend)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, f"{op}: {result}"


def update_norm_args(n, d, dv, dtype, seed=0):
    """(x, k, v, beta (the update's, x in dtype), the next sublayer's weights (fp32, fp64 with fp64 x), the
    upstream gradients of (x', c, beta', v'), the constants (k_eps, eps, beta_max, value_scale))."""
    gen = torch.Generator().manual_seed(seed + d)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    r = lambda *shape, dt=wdt: torch.randn(*shape, generator=gen).to(dt).to(DEVICE)  # noqa: E731
    x, k, v, beta = r(n, d, dt=dtype), r(n, d, dt=dtype), 2 * r(n, 1).sigmoid(), 2 * r(n, 1).sigmoid()
    weights = (1 + 0.3 * r(d), r(1, d), r(1), r(dv, d), r(dv))
    grads = (r(n, d, dt=dtype), r(n, d), r(n, 1), r(n, dv))
    return (x, k, v, beta), weights, grads, (1e-5, 1e-5, 2.0, 4.0)


def opcheck_update_norm_ops(n, d, dv, dtype, backend):
    from deep_delta.ops.delta.library import update_norm_backward_op, update_norm_op

    inputs, weights, grads, consts = update_norm_args(n, d, dv, dtype)
    low = torch.bfloat16 if dtype != torch.float64 else torch.float32
    leaves = lambda: tuple(t.clone().requires_grad_() for t in (*inputs, *weights))  # noqa: E731
    cases = [
        (update_norm_op, (*leaves(), *consts, None, "delta", backend)),
        (update_norm_op, (*leaves(), *consts, low, "delta", backend)),
        (update_norm_op, (*inputs, *weights, *consts, None, "delta", backend)),
        (update_norm_backward_op, (*grads, *inputs, *weights, *consts, "delta", backend)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, f"{op}: {result}"


def opcheck_update_read_norm_ops(n, d, dv, dtype, backend):
    from deep_delta.ops.delta.library import update_read_norm_backward_op, update_read_norm_op

    gen = torch.Generator().manual_seed(d)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    r = lambda *shape, dt=wdt: torch.randn(*shape, generator=gen).to(dt).to(DEVICE)  # noqa: E731
    inputs = (r(n, d, dv, dt=dtype), r(n, d, dt=dtype), 2 * r(n, dv).sigmoid(), 2 * r(n, 1).sigmoid(), r(d, dv))
    weights = (1 + 0.3 * r(d), r(1, d), r(1), r(dv, d), r(dv))
    grads = (r(n, d, dv, dt=dtype), r(n, d), r(n, 1), r(n, dv))
    consts = (1e-5, 1e-5, 2.0, 4.0)
    leaves = lambda: tuple(t.clone().requires_grad_() for t in (*inputs, *weights))  # noqa: E731
    cases = [
        (update_read_norm_op, (*leaves(), *consts, None, "delta", backend)),
        (update_read_norm_op, (*inputs, *weights, *consts, None, "delta", backend)),
        (update_read_norm_backward_op, (*grads, *inputs, *weights, *consts, "delta", backend)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, f"{op}: {result}"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_opcheck_update_read_norm_ops(dtype):
    """``deep_delta::update_read_norm`` and its backward op (the update through the next CC read into the next
    sublayer's input stage), on the lean path and the kernels."""
    opcheck_update_read_norm_ops(5, 12, 3, dtype, "auto")
    if dtype != torch.float64:
        opcheck_update_read_norm_ops(5, 12, 3, dtype, "triton")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n,d,dv", [(6, 7, 1), (5, 12, 3)], ids=["n6-d7-dv1", "n5-d12-dv3"])
def test_opcheck_update_norm_ops(n, d, dv, dtype):
    """``deep_delta::update_norm`` and its backward op (the d_v = 1 update fused with the next sublayer's input
    stage, :mod:`deep_delta.ops.norm.library`), on the lean path and the kernels."""
    opcheck_update_norm_ops(n, d, dv, dtype, "auto")
    if dtype != torch.float64:
        opcheck_update_norm_ops(n, d, dv, dtype, "triton")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n,d,dv", [(6, 7, 1), (5, 12, 3), (1, 33, 4)], ids=["n6-d7-dv1", "n5-d12-dv3", "n1-d33-dv4"])
def test_opcheck_norm_gate_value_ops(n, d, dv, dtype):
    """``deep_delta::norm_gate_value`` and its backward op (:mod:`deep_delta.ops.norm.library`): src in dtype,
    weights in fp32 (fp64 with fp64 src), as the module holds them."""
    opcheck_norm_ops(n, d, dv, dtype, "auto")


def _storages(tensors) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in tensors if torch.is_tensor(t) and t.numel() > 0]


def test_triton_kernels_of_every_op_return_fresh_tensors():
    """Every op on the Triton path (``backend="triton"``: here run by the interpreter on CPU, on a GPU natively, the
    path of each op's CUDA kernel) returns outputs that alias neither an input nor each other: torch.library
    refuses such outputs on CUDA ("may not alias any inputs ... or other returns"), which the lean CPU kernels
    alone never exercise."""
    from deep_delta.ops.delta.library import update_norm_backward_op, update_norm_op
    from deep_delta.ops.norm.library import norm_gate_value_backward_op, norm_gate_value_op

    x, k, v, beta = flat_inputs((5,), 12, 3, torch.float32, seed=1)
    uinputs, uweights, ugrads, uconsts = update_norm_args(5, 12, 1, torch.float32)
    gen = torch.Generator().manual_seed(2)
    r = lambda *shape: torch.randn(*shape, generator=gen).to(DEVICE)  # noqa: E731
    c, g, gin = r(12, 3), r(*x.shape), r(*x.shape[:-1])
    out = delta_update_op(x, k, v, beta, 1e-5, "delta", "triton")
    src, weights, ngrads = r(5, 12), (1 + 0.3 * r(12), r(1, 12), r(1), r(3, 12), r(3)), (r(5, 12), r(5, 1), r(5, 3))
    consts = (1e-5, 2.0, 4.0)
    cases = {
        "delta_update": (delta_update_op, (x, k, v, beta, 1e-5, "delta")),
        "delta_update_read": (delta_update_read_op, (x, k, v, beta, c, 1e-5, "delta")),
        "delta_update_backward": (delta_update_backward_op, (g, x, k, v, beta, 1e-5, "delta")),
        "delta_update_read_backward": (delta_update_read_backward_op, (g, gin, x, out, k, v, beta, c, 1e-5, "delta")),
        "norm_gate_value": (norm_gate_value_op, (src, *weights, *consts, None)),
        "norm_gate_value c_dtype": (norm_gate_value_op, (src, *weights, *consts, torch.bfloat16)),
        "norm_gate_value_backward": (norm_gate_value_backward_op, (*ngrads, src, *weights, *consts)),
        "update_norm": (update_norm_op, (*uinputs, *uweights, *uconsts, None, "delta")),
        "update_norm_backward": (update_norm_backward_op, (*ugrads, *uinputs, *uweights, *uconsts, "delta")),
    }
    for name, (op, args) in cases.items():
        with count_traffic() as counter:
            result = op(*args, "triton")
        assert counter.launches, f"{name}: no Triton kernel launched"
        outputs = result if isinstance(result, tuple) else (result,)
        got = _storages(outputs)
        assert len(got) == len(set(got)), f"{name}: two outputs share a storage"
        assert not set(got) & set(_storages(args)), f"{name}: an output aliases an input"
