"""The HC / mHC stream ops' fast paths against the plain references (ops/hyper/naive.py), values and gradients.

- Triton kernels (:mod:`deep_delta.ops.hyper.triton`: the write ``h R + f b^T``, the read ``h a``,
  Sinkhorn-Knopp), on CPU under the Triton interpreter (``TRITON_INTERPRET=1``, set before Triton is
  imported, as in tests/ops/test_kernels.py) or natively on CUDA.
- The lean PyTorch path (:mod:`deep_delta.ops.hyper.lean`, ``backend="torch"``): the same comparisons, fp64
  gradcheck, and its forward equal to the reference's bit for bit (the CPU default changes no value).
- Tiny hc and mhc models on ``delta_backend="triton"`` against ``"torch"``.

Tolerances. The write and the read are linear in each input, so the error of every output and gradient
element is bounded by the roundings of its terms: ``check_linear`` runs the reference in fp64 on the same
(rounded) values and again on their absolute values (the magnitude ``sum |terms|`` of each element) and
asks ``|got - ref| <= tol * magnitude`` with tol 2^-20 in fp32 (16 fp32 ulps of the magnitude: a static
coefficient's gradient is a sum over every token and row, with cancellation, so a bound relative to the
result itself would be arbitrary), 2^-6 in bf16 (bf16 storage of the state, the branch output, the new state
and their gradients: unit roundoff 2^-8; the Triton interpreter rounds bf16 toward zero, 2^-7), 1e-12 in fp64
(lean path). Sinkhorn-Knopp uses ``run_both`` of tests/ops/test_kernels.py (fp32: relative 2e-6,
elementwise 1e-5 + 1e-5 |ref|), the reference on fp32 copies of the same values.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from test_kernels import DEVICE, assert_same_loss_and_grads, run_both, tiny_model  # noqa: E402  (tests/ops is on sys.path under pytest)

from deep_delta.layers.hyper_connections import HyperResidual  # noqa: E402
from deep_delta.ops.hyper import sinkhorn_knopp, stream_read, stream_write  # noqa: E402
from deep_delta.ops.hyper.lean import sinkhorn_knopp_lean, stream_read_lean, stream_write_lean  # noqa: E402
from deep_delta.ops.hyper.naive import (  # noqa: E402
    sinkhorn_knopp_reference,
    stream_read_reference,
    stream_write_reference,
)

DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]
# (lead, d, n, coefficients): "token" per token (the dynamic forms), "static" one (n, n) / (n,) for all
# tokens, "bcast" (B, 1, ...) broadcast over T; d not a power of two, and widths past one d-chunk
# (256 rows at n = 4, 4096 at n = 1) so that the kernels' loops over d run more than once
SHAPES = [
    ((2, 3), 7, 1, "token"),
    ((2, 3), 7, 1, "static"),
    ((5,), 12, 2, "token"),
    ((2, 2), 33, 4, "static"),
    ((3,), 20, 4, "token"),
    ((2, 3), 9, 3, "bcast"),
    ((2,), 300, 4, "token"),
    ((1,), 4100, 1, "static"),
]
SHAPE_IDS = ["d7-n1", "d7-n1-static", "d12-n2", "d33-n4-static", "d20-n4", "d9-n3-bcast", "d300-n4", "d4100-n1-static"]


def coef_shape(lead: tuple[int, ...], kind: str) -> tuple[int, ...]:
    return {"token": lead, "static": (), "bcast": lead[:1] + (1,) * (len(lead) - 1)}[kind]


def hyper_inputs(lead, d, n, kind, dtype, seed=0):
    """State h and branch output f in ``dtype`` (as the model's), the coefficients in fp32 (as the layers make
    them); upstream gradients for the write (state-sized) and the read."""
    g = torch.Generator().manual_seed(seed)
    cs = coef_shape(lead, kind)
    h = torch.randn(*lead, d, n, generator=g).to(dtype)
    f = torch.randn(*lead, d, generator=g).to(dtype)
    r = torch.randn(*cs, n, n, generator=g)
    a, b = torch.randn(*cs, n, generator=g), torch.randn(*cs, n, generator=g)
    gh, gin = torch.randn(*lead, d, n, generator=g), torch.randn(*lead, d, generator=g)
    return [t.to(DEVICE) for t in (h, r, b, f, a, gh, gin)]


TOL = {torch.float64: 1e-12, torch.float32: 2.0**-20, torch.bfloat16: 2.0**-6}


def check_linear(fast, ref, inputs, grad_out, dtype):
    """``fast`` against the fp64 ``ref`` in the output and every input gradient, elementwise within
    ``TOL[dtype]`` of the magnitude (``ref`` on the absolute inputs and upstream gradient); dtypes as the
    inputs'. The upstream gradient is rounded to the output's dtype for both."""
    a = [t.detach().clone().requires_grad_() for t in inputs]
    b = [t.detach().double().requires_grad_() for t in inputs]
    m = [t.detach().double().abs().requires_grad_() for t in inputs]
    out_a, out_b, out_m = fast(*a), ref(*b), ref(*m)
    assert out_a.dtype == inputs[0].dtype and out_a.shape == out_b.shape
    g = grad_out.to(out_a.dtype)
    out_a.backward(g)
    out_b.backward(g.double())
    out_m.backward(g.double().abs())
    pairs = [("output", out_a, out_b, out_m)] + [(f"grad of input {i}", x.grad, y.grad, z.grad)
                                                 for i, (x, y, z) in enumerate(zip(a, b, m))]
    for i, (name, got, want, mag) in enumerate(pairs):
        assert got.dtype == (out_a.dtype if i == 0 else inputs[i - 1].dtype), f"{name}: dtype {got.dtype}"
        excess = ((got.double() - want).abs() - TOL[dtype] * mag.detach()).max().item()
        assert excess <= 0, f"{name}: error exceeds {TOL[dtype]:.1e} x magnitude by {excess:.2e}"


def triton_write(h, r, b, f):
    return stream_write(h, r, b, f, backend="triton")


def triton_read(h, a):
    return stream_read(h, a, backend="triton")


# ----------------------------------------------------------------------------- Triton kernels


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,n,kind", SHAPES, ids=SHAPE_IDS)
def test_triton_stream_write_and_read_match_reference(lead, d, n, kind, dtype):
    h, r, b, f, a, gh, gin = hyper_inputs(lead, d, n, kind, dtype, seed=d + n)
    check_linear(triton_write, stream_write_reference, (h, r, b, f), gh, dtype)
    check_linear(triton_read, stream_read_reference, (h, a), gin, dtype)


def test_triton_write_at_hc_init_is_the_residual_add():
    """R = I, b = 1 (HC's static init): h' = h + f, to the last bit in fp32."""
    h, _, _, f, *_ = hyper_inputs((2, 3), 10, 4, "token", torch.float32)
    out = stream_write(h, torch.eye(4, device=DEVICE), torch.ones(4, device=DEVICE), f, backend="triton")
    assert torch.equal(out, h + f.unsqueeze(-1))


def sinkhorn_logits(lead, n, seed=0):
    return (2 * torch.randn(*lead, n, n, generator=torch.Generator().manual_seed(seed))).to(DEVICE)


# (lead, n, iters): the model's 20 rounds at n = 4 and n = 2, padded tiles (n = 3, 5), one matrix (static)
SINK_CASES = [((2, 3), 4, 20), ((5,), 2, 20), ((3,), 3, 7), ((), 4, 20), ((2,), 5, 4), ((4,), 1, 3)]
SINK_IDS = ["b2x3-n4", "b5-n2", "b3-n3-it7", "static-n4", "b2-n5-it4", "n1"]


@pytest.mark.parametrize("lead,n,iters", SINK_CASES, ids=SINK_IDS)
def test_triton_sinkhorn_matches_reference(lead, n, iters):
    z = sinkhorn_logits(lead, n, seed=n + iters)
    g = torch.randn(z.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    fast = lambda z: sinkhorn_knopp(z, iters, backend="triton")  # noqa: E731
    run_both(fast, lambda z: sinkhorn_knopp_reference(z, iters), (z,), (g,), torch.float32)


def test_triton_sinkhorn_ties_bf16_logits_and_large_logits():
    """Tied maxima (mHC's init: the n diagonal entries) split the shift's gradient as amax's backward does;
    bf16 logits give fp32 matrices (the reference's dtype rule); large logits stay finite."""
    z = torch.log((torch.eye(4) + 0.25) / 2).to(DEVICE)
    g = torch.randn(4, 4, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    run_both(lambda z: sinkhorn_knopp(z, backend="triton"), sinkhorn_knopp_reference, (z,), (g,), torch.float32)
    zb = sinkhorn_logits((3,), 4).bfloat16()
    out = sinkhorn_knopp(zb, 5, backend="triton")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, sinkhorn_knopp_reference(zb, 5), rtol=2e-6, atol=1e-7)
    big = sinkhorn_knopp(torch.tensor([[1e4, 0.0], [0.0, 1e4]], device=DEVICE), backend="triton")
    assert torch.isfinite(big).all()


# ----------------------------------------------------------------------------- lean PyTorch path


@pytest.mark.parametrize("dtype", [torch.float64, *DTYPES], ids=["fp64", *DTYPE_IDS])
@pytest.mark.parametrize("lead,d,n,kind", SHAPES[:6], ids=SHAPE_IDS[:6])
def test_lean_stream_ops_match_reference(lead, d, n, kind, dtype):
    h, r, b, f, a, gh, gin = hyper_inputs(lead, d, n, kind, dtype, seed=3)
    if dtype == torch.float64:
        r, b, a, gh, gin = r.double(), b.double(), a.double(), gh.double(), gin.double()
    check_linear(stream_write_lean, stream_write_reference, (h, r, b, f), gh, dtype)
    check_linear(stream_read_lean, stream_read_reference, (h, a), gin, dtype)
    z = sinkhorn_logits(lead, n).to(dtype if dtype == torch.float64 else torch.float32)
    gz = torch.randn(z.shape, dtype=z.dtype, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    run_both(sinkhorn_knopp_lean, sinkhorn_knopp_reference, (z,), (gz,), z.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_lean_forward_is_the_reference_bit_for_bit(dtype):
    """backend "torch" (the CPU default) computes the reference's values: only the backward differs."""
    for kind in ("token", "static"):
        h, r, b, f, a, *_ = hyper_inputs((2, 5), 12, 4, kind, dtype, seed=5)
        assert torch.equal(stream_write(h, r, b, f, backend="torch"), stream_write_reference(h, r, b, f))
        assert torch.equal(stream_read(h, a, backend="torch"), stream_read_reference(h, a))
        z = sinkhorn_logits((2, 5) if kind == "token" else (), 4)
        assert torch.equal(sinkhorn_knopp(z, backend="torch"), sinkhorn_knopp_reference(z))


def test_lean_functions_gradcheck():
    f64 = dict(dtype=torch.float64, device=DEVICE)
    h = torch.randn(1, 2, 4, 3, **f64, requires_grad=True)
    f = torch.randn(1, 2, 4, **f64, requires_grad=True)
    for cs in ((1, 2), ()):
        r = torch.randn(*cs, 3, 3, **f64, requires_grad=True)
        b = torch.randn(*cs, 3, **f64, requires_grad=True)
        assert torch.autograd.gradcheck(stream_write_lean, (h, r, b, f))
        assert torch.autograd.gradcheck(stream_read_lean, (h, b))
    z = torch.randn(2, 3, 3, **f64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: sinkhorn_knopp_lean(z, 4), (z,))
    tied = torch.zeros(3, 3, **f64, requires_grad=True)  # every logit a maximum
    assert torch.autograd.gradcheck(lambda z: sinkhorn_knopp_lean(z, 3), (tied,))


def test_lean_sinkhorn_saves_only_its_logits():
    z = sinkhorn_logits((64,), 4).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        sinkhorn_knopp_lean(z)
    assert len(saved) == 1 and saved[0].shape == z.shape


def test_shape_errors_and_backend_name():
    h = torch.zeros(2, 5, 4)
    with pytest.raises(ValueError, match=r"stream_write: `r` must have shape \(4, 4\) or broadcast to \(2, 4, 4\)"):
        stream_write(h, torch.zeros(3, 4, 4), torch.zeros(4), torch.zeros(2, 5))
    with pytest.raises(ValueError, match=r"stream_write: `f` must have shape \(2, 5\)"):
        stream_write(h, torch.zeros(4, 4), torch.zeros(4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"stream_read: `a` must have shape \(4,\)"):
        stream_read(h, torch.zeros(3))
    with pytest.raises(ValueError, match="`backend` must be one of"):
        HyperResidual(5, torch.nn.Identity(), streams=4, backend="cuda")


# ----------------------------------------------------------------------------- whole model


@pytest.mark.parametrize("variant", ["hc", "mhc"])  # dynamic coefficients; the static ones are tested above
def test_hyper_model_on_triton_backend_matches_torch_backend(variant):
    ref, fast = tiny_model(variant, "torch"), tiny_model(variant, "triton")
    fast.load_state_dict(ref.state_dict())
    with torch.no_grad():  # move off the init, where the streams are copies and the coefficients symmetric
        for (name, pr), pf in zip(ref.named_parameters(), fast.parameters()):
            if name.rsplit(".", 1)[-1] in ("static_alpha", "static_beta", "bias_pre", "bias_post", "bias_res"):
                noise = 0.3 * torch.randn(pr.shape, generator=torch.Generator().manual_seed(len(name)))
                pr.add_(noise.to(DEVICE))
                pf.copy_(pr)
    assert_same_loss_and_grads(ref, fast)


def test_kernel_bench_triton_cases_compute_the_reference():
    """``ddl bench-kernels`` times ``_triton_fn(name)`` on CUDA only: check here (interpreter) that every op's
    Triton case is the op it names, on the bench's own inputs (forward values)."""
    from deep_delta.eval.kernel_bench import _triton_fn, op_inputs

    for op, (inputs, ref, _, tname) in op_inputs(16, 1, 3, "float32", torch.device(DEVICE)).items():
        with torch.no_grad():
            torch.testing.assert_close(_triton_fn(tname)(*inputs), ref(*inputs), rtol=1e-5, atol=1e-5, msg=op)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_stream_mixing_stays_fp32_under_autocast(backend):
    """Under bf16 autocast (fp32 state and coefficients, bf16 branch output, as training runs) the lean path
    and the kernels mix in fp32: the fp32 reference's values outside autocast (where the reference itself
    would run its matmuls in bf16)."""
    h, r, b, f, a, *_ = hyper_inputs((2, 3), 12, 4, "token", torch.float32, seed=6)
    f = f.bfloat16()
    with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16):
        out, h_in = stream_write(h, r, b, f, backend=backend), stream_read(h, a, backend=backend)
    assert out.dtype == h_in.dtype == torch.float32
    torch.testing.assert_close(out, stream_write_reference(h, r, b, f), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(h_in, stream_read_reference(h, a), rtol=1e-6, atol=1e-6)
