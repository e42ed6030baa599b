"""The paper's mathematics (sections 2-3) checked on ``delta_update`` and ``delta_operator``.

Expected values come from the definitions with dense float64 linear algebra (``A @ X + beta k v^T``,
``torch.linalg``), never from a copy of the implementation. Shapes and values are drawn by hypothesis:
0-2 leading dims, d in 1..64, d_v in 1..8; the tensors themselves come from a drawn seed and scale.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deep_delta.ops import delta_operator, delta_update, resolve_backend
from deep_delta.ops.delta import unit_direction

F64 = torch.float64
EPS = 1e-5  # the default eps guard of the direction normalisation
SETTINGS = settings(max_examples=25, deadline=None)

lead_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=2).map(tuple)
dims = st.integers(1, 64)
value_dims = st.integers(1, 8)
seeds = st.integers(0, 2**31 - 1)
scales = st.sampled_from([1e-2, 1.0, 30.0])


def make_inputs(lead, d, dv, seed, scale=1.0, dtype=F64, beta_range=(0.0, 2.0)):
    """x: (*lead, d, d_v), k~: (*lead, d) with |k~| bounded away from 0, v: (*lead, d_v), beta: (*lead)."""
    g = torch.Generator().manual_seed(seed)
    x = scale * torch.randn(lead + (d, dv), generator=g, dtype=F64)
    k = torch.randn(lead + (d,), generator=g, dtype=F64)
    k = k + torch.where(k >= 0, 0.1, -0.1)  # |k~| >= 0.1: no accidental zero direction
    k = scale * k
    v = scale * torch.randn(lead + (dv,), generator=g, dtype=F64)
    lo, hi = beta_range
    beta = lo + (hi - lo) * torch.rand(lead, generator=g, dtype=F64)
    return x.to(dtype), k.to(dtype), v.to(dtype), beta.to(dtype)


def unit(k: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The normalised direction from the definition: k~ / sqrt(|k~|^2 + eps^2)."""
    return k / torch.sqrt((k * k).sum(-1, keepdim=True) + eps * eps)


def flat(*tensors):
    """Flatten the leading dims so each example can be checked with plain 2-D linear algebra."""
    out = []
    for t, tail in tensors:
        out.append(t.reshape((-1,) + tuple(t.shape[t.dim() - tail:])))
    return out


# ----------------------------------------------------------------------------- eq. 2.4 == eq. 2.5


@SETTINGS
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds, scale=scales)
def test_eq_2_4_operator_form_equals_eq_2_5_update(lead, d, dv, seed, scale):
    x, k, v, beta = make_inputs(lead, d, dv, seed, scale)
    A = delta_operator(k, beta)  # (..., d, d)
    assert A.shape == (*lead, d, d) and A.dtype == F64
    ku = unit(k)
    expected = A @ x + beta[..., None, None] * ku.unsqueeze(-1) * v.unsqueeze(-2)  # A X + beta k v^T
    out = delta_update(x, k, v, beta, backend="torch")
    assert out.shape == x.shape and out.dtype == F64
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10 * scale)
    # beta given as (..., 1) is the same gate
    torch.testing.assert_close(delta_update(x, k, v, beta.unsqueeze(-1), backend="torch"), out, rtol=0, atol=0)


@SETTINGS
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds)
def test_eq_2_4_in_float32(lead, d, dv, seed):
    x, k, v, beta = make_inputs(lead, d, dv, seed)
    expected = delta_operator(k, beta) @ x + beta[..., None, None] * unit(k).unsqueeze(-1) * v.unsqueeze(-2)
    out = delta_update(x.float(), k.float(), v.float(), beta.float(), backend="torch")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds)
def test_auto_backend_on_cpu_is_the_reference(lead, d, dv, seed):
    x, k, v, beta = make_inputs(lead, d, dv, seed, dtype=torch.float32)
    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    torch.testing.assert_close(delta_update(x, k, v, beta), delta_update(x, k, v, beta, backend="torch"), rtol=0, atol=0)


# ----------------------------------------------------------------------------- eq. 2.6


@SETTINGS
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds, scale=scales)
def test_eq_2_6_projected_dynamics(lead, d, dv, seed, scale):
    x, k, v, beta = make_inputs(lead, d, dv, seed, scale)
    out = delta_update(x, k, v, beta, backend="torch")
    ku = unit(k)
    proj_before = (ku.unsqueeze(-1) * x).sum(-2)  # k^T X: (..., d_v)
    proj_after = (ku.unsqueeze(-1) * out).sum(-2)
    b = beta.unsqueeze(-1)
    # exact for the guarded direction, whose squared norm is |k~|^2 / (|k~|^2 + eps^2) (< 1)
    n2 = (ku * ku).sum(-1, keepdim=True)
    torch.testing.assert_close(proj_after, proj_before + b * n2 * (v - proj_before), rtol=1e-10, atol=1e-10 * scale)
    # eq. 2.6 as printed (unit k): k^T X' = (1 - beta) k^T X + beta v^T, up to the eps guard's
    # deviation beta (1 - |k|^2) |v - k^T X| with 1 - |k|^2 = eps^2 / (|k~|^2 + eps^2)
    dev = (proj_after - ((1 - b) * proj_before + b * v)).abs()
    bound = b * (1 - n2) * (v - proj_before).abs() * 1.001 + 1e-12 * scale
    assert bool((dev <= bound).all())
    assert float((1 - n2).max()) <= EPS**2 / (0.1 * scale) ** 2  # |k~| >= 0.1 scale by construction


@SETTINGS
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds)
def test_eq_2_6_exact_with_unit_direction(lead, d, dv, seed):
    x, k, v, beta = make_inputs(lead, d, dv, seed)
    out = delta_update(x, k, v, beta, k_eps=0.0, backend="torch")
    ku = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    proj_before = (ku.unsqueeze(-1) * x).sum(-2)
    proj_after = (ku.unsqueeze(-1) * out).sum(-2)
    b = beta.unsqueeze(-1)
    torch.testing.assert_close(proj_after, (1 - b) * proj_before + b * v, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- Theorem 3.1


@SETTINGS
@given(lead=lead_shapes, d=dims, seed=seeds)
def test_theorem_3_1_spectrum(lead, d, seed):
    # beta kept away from 0 so the eigenvalue 1 - beta is separated from the eigenvalue 1
    _, k, _, beta = make_inputs(lead, d, 1, seed, beta_range=(0.05, 1.95))
    A = delta_operator(k, beta, k_eps=0.0)
    ku = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    (A2, ku2, beta2) = flat((A, 2), (ku, 1), (beta, 0))
    for a, kk, b in zip(A2, ku2, beta2):
        torch.testing.assert_close(a, a.T, rtol=0, atol=1e-15)  # symmetric
        evals, evecs = torch.linalg.eigh(a)
        expected = torch.cat([torch.full((d - 1,), 1.0, dtype=F64), (1 - b).reshape(1)]).sort().values
        torch.testing.assert_close(evals, expected, rtol=0, atol=1e-12)
        # eigenvector of 1 - beta is +-k
        i = int(torch.argmin((evals - (1 - b)).abs()))
        torch.testing.assert_close(evecs[:, i].dot(kk).abs(), torch.tensor(1.0, dtype=F64), rtol=0, atol=1e-10)
        torch.testing.assert_close(a @ kk, (1 - b) * kk, rtol=0, atol=1e-12)
        # the eigenvalue-1 eigenvectors span k-perp: orthogonal to k, and A fixes every vector of k-perp
        others = torch.cat([evecs[:, :i], evecs[:, i + 1:]], dim=1)  # (d, d-1)
        torch.testing.assert_close(kk @ others, torch.zeros(d - 1, dtype=F64), rtol=0, atol=1e-10)
        if d > 1:
            assert torch.linalg.matrix_rank(others).item() == d - 1
        g = torch.Generator().manual_seed(seed + 1)
        u = torch.randn(d, 5, generator=g, dtype=F64)
        u = u - kk[:, None] * (kk @ u)[None]  # project onto k-perp
        torch.testing.assert_close(a @ u, u, rtol=0, atol=1e-12)


@SETTINGS
@given(lead=lead_shapes, d=dims, seed=seeds)
def test_determinant_is_one_minus_beta(lead, d, seed):
    _, k, _, beta = make_inputs(lead, d, 1, seed)
    A = delta_operator(k, beta, k_eps=0.0)
    torch.testing.assert_close(torch.linalg.det(A), 1 - beta, rtol=1e-10, atol=1e-10)
    # with the eps guard |k|^2 < 1 by eps^2 / |k~|^2 only
    torch.testing.assert_close(torch.linalg.det(delta_operator(k, beta)), 1 - beta, rtol=1e-6, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(lead=lead_shapes, d=st.integers(1, 32), dv=value_dims, seed=seeds)
def test_lifted_operator_kron_determinant_and_action(lead, d, dv, seed):
    x, k, v, beta = make_inputs(lead, d, dv, seed)
    A = delta_operator(k, beta, k_eps=0.0)
    out = delta_update(x, k, v, beta, k_eps=0.0, backend="torch")
    ku = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    for a, b, xx, oo, kk, vv in zip(*flat((A, 2), (beta, 0), (x, 2), (out, 2), (ku, 1), (v, 1))):
        lifted = torch.kron(torch.eye(dv, dtype=F64), a)  # I_{d_v} (x) A: (d d_v, d d_v)
        assert lifted.shape == (d * dv, d * dv)
        torch.testing.assert_close(torch.linalg.det(lifted), (1 - b) ** dv, rtol=1e-9, atol=1e-12)
        # the lifted operator is the homogeneous part of the update on vec(X) (columns stacked)
        homogeneous = oo - b * kk[:, None] * vv[None, :]
        torch.testing.assert_close(lifted @ xx.T.reshape(-1), homogeneous.T.reshape(-1), rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- limits of the gate


@SETTINGS
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds, scale=scales)
def test_beta_zero_leaves_the_state_unchanged(lead, d, dv, seed, scale):
    x, k, v, _ = make_inputs(lead, d, dv, seed, scale)
    for dtype in (F64, torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        out = delta_update(xd, k.to(dtype), v.to(dtype), torch.zeros(lead, dtype=dtype), backend="torch")
        assert torch.equal(out, xd)
    # and the change vanishes linearly with beta: |X' - X| <= beta |k| |v - k^T X|
    tiny = torch.full(lead, 1e-9, dtype=F64)
    out = delta_update(x, k, v, tiny, backend="torch")
    ku = unit(k)
    gap = (v - (ku.unsqueeze(-1) * x).sum(-2)).abs()  # (..., d_v)
    # (plus the rounding of x + update, a few ulp of x)
    bound = 1e-9 * gap.unsqueeze(-2) * (1 + 1e-6) + 4 * torch.finfo(F64).eps * x.abs()
    assert bool(((out - x).abs() <= bound).all())


@SETTINGS
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds, scale=scales)
def test_beta_one_overwrites_the_k_component(lead, d, dv, seed, scale):
    x, k, v, _ = make_inputs(lead, d, dv, seed, scale)
    one = torch.ones(lead, dtype=F64)
    out = delta_update(x, k, v, one, k_eps=0.0, backend="torch")
    ku = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True)
    torch.testing.assert_close((ku.unsqueeze(-1) * out).sum(-2), v, rtol=1e-10, atol=1e-10 * scale)  # k^T X' = v^T
    # the part of the state orthogonal to k is untouched
    perp = lambda m: m - ku.unsqueeze(-1) * (ku.unsqueeze(-1) * m).sum(-2, keepdim=True)
    torch.testing.assert_close(perp(out), perp(x), rtol=1e-10, atol=1e-10 * scale)


@SETTINGS
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds)
def test_beta_two_is_an_orthogonal_involution(lead, d, dv, seed):
    x, k, _, _ = make_inputs(lead, d, dv, seed)
    two = torch.full(lead, 2.0, dtype=F64)
    A = delta_operator(k, two, k_eps=0.0)
    eye = torch.eye(d, dtype=F64).expand_as(A)
    torch.testing.assert_close(A @ A.mT, eye, rtol=0, atol=1e-12)  # orthogonal
    torch.testing.assert_close(A @ A, eye, rtol=0, atol=1e-12)  # involution
    torch.testing.assert_close(torch.linalg.det(A), -torch.ones(lead, dtype=F64), rtol=0, atol=1e-10)
    # the update with v = 0 applies the Householder reflection: norms kept, applying it twice restores X
    zero_v = torch.zeros(*lead, dv, dtype=F64)
    once = delta_update(x, k, zero_v, two, k_eps=0.0, backend="torch")
    torch.testing.assert_close(torch.linalg.vector_norm(once, dim=-2), torch.linalg.vector_norm(x, dim=-2))
    torch.testing.assert_close(delta_update(once, k, zero_v, two, k_eps=0.0, backend="torch"), x, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- section 3.4


@SETTINGS
@given(lead=lead_shapes, d=dims, seed=seeds)
def test_diagonal_state_coupling(lead, d, seed):
    _, k, _, beta = make_inputs(lead, d, 1, seed)
    g = torch.Generator().manual_seed(seed + 7)
    s = torch.randn(lead + (d,), generator=g, dtype=F64)
    X = torch.diag_embed(s)  # d_v = d, diagonal state
    ku = unit(k)
    b = beta[..., None, None]
    # (A diag(s))_ij = s_i delta_ij - beta s_j k_i k_j
    expected = X - b * s.unsqueeze(-2) * ku.unsqueeze(-1) * ku.unsqueeze(-2)
    torch.testing.assert_close(delta_operator(k, beta) @ X, expected, rtol=1e-12, atol=1e-12)
    # the shortcut of the update (v = 0) is exactly that map
    out = delta_update(X, k, torch.zeros(*lead, d, dtype=F64), beta, backend="torch")
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    # diagonal: s_i (1 - beta k_i^2)
    torch.testing.assert_close(out.diagonal(dim1=-2, dim2=-1), s * (1 - beta.unsqueeze(-1) * ku * ku))


# ----------------------------------------------------------------------------- the eps guard


@SETTINGS
@given(lead=lead_shapes, d=dims, seed=seeds, mag=st.sampled_from([1e-7, 1e-5, 1e-3, 1.0, 1e3]))
def test_normalisation_is_k_over_sqrt_norm2_plus_eps2(lead, d, seed, mag):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(lead + (d,), generator=g, dtype=F64)
    k = mag * k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(1e-30)
    expected = unit(k)
    # with X = 0, v = 1, beta = 1 the update writes the normalised direction itself: X' = k
    x = torch.zeros(*lead, d, 1, dtype=F64)
    one_v, one_b = torch.ones(*lead, 1, dtype=F64), torch.ones(lead, dtype=F64)
    out = delta_update(x, k, one_v, one_b, backend="torch").squeeze(-1)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-300)
    out32 = delta_update(x.float(), k.float(), one_v.float(), one_b.float(), backend="torch").squeeze(-1)
    torch.testing.assert_close(out32.double(), expected, rtol=1e-5, atol=1e-7 * mag)
    # the one helper every path calls (reference, lean, state rebuild): u and rho = 1 / sqrt(|k~|^2 + eps^2)
    u, rho = unit_direction(k, EPS)
    torch.testing.assert_close(u, expected, rtol=1e-12, atol=1e-300)
    rho_def = 1 / torch.sqrt((k * k).sum(-1, keepdim=True) + EPS * EPS)
    torch.testing.assert_close(rho, rho_def, rtol=1e-12, atol=0)
    # and the operator uses the same direction: I - A = beta k k^T
    A = delta_operator(k, one_b)
    eye = torch.eye(d, dtype=F64)
    torch.testing.assert_close(A, eye - expected.unsqueeze(-1) * expected.unsqueeze(-2), rtol=0, atol=1e-15)


def test_eps_guard_halves_the_norm_at_eps():
    # |k~| = eps gives |k| = 1/sqrt(2): the guard, not a plain division
    k = torch.zeros(1, 4, dtype=F64)
    k[0, 0] = EPS
    out = delta_update(torch.zeros(1, 4, 1, dtype=F64), k, torch.ones(1, 1, dtype=F64), torch.ones(1, dtype=F64))
    torch.testing.assert_close(out[0, 0, 0], torch.tensor(1 / math.sqrt(2), dtype=F64))


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dv", [1, 3])
def test_zero_direction_gives_finite_output_and_gradients(dtype, dv):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dv, dtype=dtype, requires_grad=True)
    k = torch.zeros(2, 5, 8, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 5, dv, dtype=dtype, requires_grad=True)
    beta = torch.rand(2, 5, dtype=dtype).mul(2).requires_grad_()
    out = delta_update(x, k, v, beta, backend="torch")
    assert torch.equal(out, x.detach())  # k = 0: nothing written, nothing erased
    out.square().sum().backward()
    for name, t in (("x", x), ("k", k), ("v", v), ("beta", beta)):
        assert t.grad is not None and bool(torch.isfinite(t.grad).all()), name
    # d out / d k~ at 0 is beta (v - 0)^T / eps: finite, and equal to that value
    g = torch.ones_like(out)
    x2, k2 = x.detach().double(), torch.zeros(2, 5, 8, dtype=F64, requires_grad=True)
    delta_update(x2, k2, v.detach().double(), beta.detach().double()).backward(g.double())
    expected = beta.detach().double()[..., None] * v.detach().double().sum(-1, keepdim=True) / EPS
    torch.testing.assert_close(k2.grad, expected.expand(2, 5, 8), rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- gradcheck and bf16


@pytest.mark.parametrize(
    "lead,d,dv", [((), 5, 1), ((3,), 4, 2), ((2, 3), 6, 3), ((2,), 1, 4)], ids=["d5dv1", "b3-d4dv2", "b2x3-d6dv3", "d1"]
)
def test_gradcheck_delta_update(lead, d, dv):
    x, k, v, beta = make_inputs(lead, d, dv, seed=sum(lead) + d + dv)
    inputs = tuple(t.clone().requires_grad_() for t in (x, k, v, beta))
    f = lambda x, k, v, b: delta_update(x, k, v, b, backend="torch")
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-8, rtol=1e-6)
    assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_delta_operator():
    _, k, _, beta = make_inputs((2,), 5, 1, seed=3)
    inputs = (k.clone().requires_grad_(), beta.clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda k, b: delta_operator(k, b), inputs, eps=1e-6, atol=1e-8)


@settings(max_examples=20, deadline=None)
@given(lead=lead_shapes, d=dims, dv=value_dims, seed=seeds, scale=st.sampled_from([0.1, 1.0, 10.0]))
def test_bf16_inputs_stay_bf16_and_match_fp32(lead, d, dv, seed, scale):
    x, k, v, beta = (t.to(torch.bfloat16) for t in make_inputs(lead, d, dv, seed, scale))
    out = delta_update(x, k, v, beta, backend="torch")
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    ref = delta_update(x.float(), k.float(), v.float(), beta.float(), backend="torch")  # same rounded inputs
    # Tolerance, elementwise: |out - ref| <= 2^-8 (|x| + 4 |update|), 2^-8 being bf16's unit roundoff.
    # A bf16 implementation may round the direction, the correction beta (v - k^T x) and their product
    # (<= 3 roundings on the update) and then x + update once (on the whole output).
    upd = (ref - x.float()).abs()
    bound = 2**-8 * (x.float().abs() + 4 * upd) * 1.01 + 1e-30
    err = (out.float() - ref).abs()
    assert bool((err <= bound).all()), float((err / bound).max())


# ----------------------------------------------------------------------------- shape errors


def test_shape_errors_name_expected_and_got():
    x, k, v, b = torch.zeros(2, 3, 5, 4), torch.zeros(2, 3, 5), torch.zeros(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"`x` must have shape \(\.\.\., d, d_v\), got \(5,\)"):
        delta_update(torch.zeros(5), torch.zeros(5), torch.zeros(1), torch.zeros(()))
    with pytest.raises(ValueError, match=r"`k` must have shape \(2, 3, 5\), got \(2, 3, 4\)"):
        delta_update(x, torch.zeros(2, 3, 4), v, b)
    with pytest.raises(ValueError, match=r"`k` must have shape \(2, 3, 5\), got \(3, 5\)"):
        delta_update(x, torch.zeros(3, 5), v, b)
    with pytest.raises(ValueError, match=r"`v` must have shape \(2, 3, 4\), got \(2, 3, 1\)"):
        delta_update(x, k, torch.zeros(2, 3, 1), b)
    with pytest.raises(ValueError, match=r"`beta` must have shape \(2, 3\) or \(2, 3, 1\), got \(2, 3, 4\)"):
        delta_update(x, k, v, torch.zeros(2, 3, 4))
    with pytest.raises(TypeError, match=r"`k` must be a floating-point tensor, got torch.int64"):
        delta_update(x, k.long(), v, b)
    with pytest.raises(ValueError, match=r"`backend` must be one of .*'torch'.*, got 'cuda'"):
        delta_update(x, k, v, b, backend="cuda")
    with pytest.raises(ValueError, match=r"delta_operator: `beta` must have shape \(2, 3\) or \(2, 3, 1\), got \(3,\)"):
        delta_operator(k, torch.zeros(3))
    with pytest.raises(ValueError, match=r"delta_operator: `k` must have shape \(\.\.\., d\), got \(\)"):
        delta_operator(torch.zeros(()), torch.zeros(()))


@pytest.mark.parametrize("lead", [(0,), (2, 0)], ids=["0", "2x0"])
def test_empty_leading_dims(lead):
    x, k, v, beta = torch.zeros(*lead, 4, 2), torch.zeros(*lead, 4), torch.zeros(*lead, 2), torch.zeros(lead)
    assert delta_update(x, k, v, beta).shape == (*lead, 4, 2)
    assert delta_operator(k, beta).shape == (*lead, 4, 4)
