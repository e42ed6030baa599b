"""HyperResidual (HC / mHC) and StreamReadout: known answers at init, the mHC constraints, gradients, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from deep_delta.layers import AdditiveResidual
from deep_delta.layers.hyper_connections import HyperResidual, StreamReadout

F64 = torch.float64
FORMS = [("hc", True), ("hc", False), ("mhc", True), ("mhc", False)]
IDS = ["hc", "hc-static", "mhc", "mhc-static"]


def branch(d: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))


def additive(d: int, seed: int = 0) -> AdditiveResidual:
    return AdditiveResidual(d, branch(d, seed))


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_hc_one_stream_at_init_is_the_additive_residual_exactly(dynamic):
    d = 16
    base = additive(d)
    hc = HyperResidual(d, branch(d), streams=1, kind="hc", dynamic=dynamic, sublayer=5)
    x = torch.randn(3, 7, d)
    assert torch.equal(hc(x.unsqueeze(-1)).squeeze(-1), base(x))


@pytest.mark.parametrize("kind,dynamic", FORMS, ids=IDS)
@pytest.mark.parametrize("sublayer", [0, 3])
def test_copied_streams_at_init_follow_the_additive_residual(kind, dynamic, sublayer):
    """Streams that are copies of x (the model's expansion) stay copies of the additive update x + F(norm x).

    HC exactly (dynamic parts are 0 at init); mHC with its dynamic part zeroed (alpha = 0), up to the rounding
    of sigmoid and Sinkhorn.
    """
    d, n = 16, 4
    base = additive(d)
    layer = HyperResidual(d, branch(d), streams=n, kind=kind, dynamic=dynamic, sublayer=sublayer)
    if kind == "mhc" and dynamic:
        with torch.no_grad():
            layer.alpha.zero_()
    x = torch.randn(3, 7, d)
    out = layer(x.unsqueeze(-1).expand(3, 7, d, n))
    want = base(x).unsqueeze(-1).expand_as(out)
    if kind == "hc":
        assert torch.equal(out, want)
    else:
        torch.testing.assert_close(out, want, atol=2e-6, rtol=2e-6)


def test_mhc_dynamic_at_init_is_close_to_the_additive_residual():
    """With alpha = 0.01 (the paper's init) the dynamic part only nudges the update."""
    d, n = 32, 4
    base = additive(d)
    layer = HyperResidual(d, branch(d), streams=n, kind="mhc", sublayer=1)
    x = torch.randn(4, 9, d)
    out = layer(x.unsqueeze(-1).expand(4, 9, d, n))
    want = base(x).unsqueeze(-1)
    assert (out - want).abs().max() < 0.05 * want.abs().max()


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "static"])
def test_mhc_residual_matrix_doubly_stochastic_and_maps_non_negative(dynamic):
    torch.manual_seed(0)
    d, n = 32, 4
    layer = HyperResidual(d, branch(d), streams=n, kind="mhc", dynamic=dynamic, sublayer=2)
    checks = [layer]
    moved = HyperResidual(d, branch(d), streams=n, kind="mhc", dynamic=dynamic, sublayer=2)
    with torch.no_grad():  # a layer away from its init: biases and gates as training might leave them
        moved.bias_pre.normal_(0, 2)
        moved.bias_post.normal_(0, 2)
        moved.bias_res.add_(torch.randn(n, n) * 0.5)
        if dynamic:
            moved.alpha.fill_(0.1)
    checks.append(moved)
    for m in checks:
        for scale in (1e-3, 1.0, 30.0):
            h = torch.randn(8, 11, d, n) * scale
            a, r, b = m.coefficients(h)
            assert r.dtype == a.dtype == b.dtype == torch.float32
            assert (r.sum(-1) - 1).abs().max() < 1e-5 and (r.sum(-2) - 1).abs().max() < 1e-5
            assert (r >= 0).all() and (a >= 0).all() and (b >= 0).all()


def test_init_values():
    n, d = 4, 8
    hc = HyperResidual(d, nn.Identity(), streams=n, kind="hc", sublayer=6)
    a, r, b = hc.coefficients(torch.randn(2, d, n))
    assert torch.equal(a, torch.eye(n)[2].expand(2, n)) and torch.equal(r, torch.eye(n).expand(2, n, n))
    assert torch.equal(b, torch.ones(2, n))
    mhc = HyperResidual(d, nn.Identity(), streams=n, kind="mhc", dynamic=False, sublayer=6)
    a, r, b = mhc.coefficients(torch.randn(2, d, n))
    torch.testing.assert_close(a, (torch.eye(n)[2] + 1 / n) / 2)
    torch.testing.assert_close(r, (torch.eye(n) + 1 / n) / 2, atol=1e-6, rtol=0)
    torch.testing.assert_close(b, torch.ones(n))


def test_hc_init_draws_no_random_numbers():
    torch.manual_seed(0)
    HyperResidual(8, nn.Identity(), streams=4, kind="hc")
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))


def gradcheck_module(module: nn.Module, x: torch.Tensor) -> bool:
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]

    def f(x, *ps):
        return functional_call(module, dict(zip(names, ps)), (x,))

    return torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind,dynamic", FORMS, ids=IDS)
def test_gradcheck(kind, dynamic):
    torch.manual_seed(0)
    d, n = 4, 3
    layer = HyperResidual(d, nn.Linear(d, d), streams=n, kind=kind, dynamic=dynamic, sublayer=1).double()
    with torch.no_grad():  # away from the init, so that every parameter gets a generic gradient
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, d, n, dtype=F64, requires_grad=True)
    assert gradcheck_module(layer, x)


def test_bf16_state_keeps_its_dtype():
    layer = HyperResidual(8, nn.Linear(8, 8).bfloat16(), streams=4, kind="mhc").bfloat16()
    out = layer(torch.randn(2, 3, 8, 4, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


def test_readout_is_the_mean():
    h = torch.randn(2, 3, 8, 4)
    out, nxt = StreamReadout(8, 4)(h)
    assert nxt is None and torch.equal(out, h.mean(-1))


@pytest.mark.parametrize("kwargs,match", [
    (dict(kind="dhc"), "`kind` must be one of"),
    (dict(kind="mhc", streams=1), "`streams` must be >= 2"),
    (dict(kind="hc", streams=0), "`streams` must be >= 1"),
    (dict(sublayer=-1), "`sublayer` must be >= 0"),
    (dict(sinkhorn_iters=0), "`sinkhorn_iters`"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HyperResidual(8, nn.Identity(), **kwargs)


def test_bad_state_shape():
    layer = HyperResidual(8, nn.Identity(), streams=4)
    with pytest.raises(ValueError, match=r"expected a state of shape \(\.\.\., 8, 4\), got \(2, 3, 8\)"):
        layer(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="StreamReadout: expected"):
        StreamReadout(8, 4)(torch.randn(2, 3, 8, 2))
