"""DeltaResidual and BetaGate: the block-level math, the limits, gradients and errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from deep_delta.layers import AdditiveResidual, BetaGate, DeltaResidual
from deep_delta.models import count_parameters

F64 = torch.float64


def unit(k: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return k / torch.sqrt((k * k).sum(-1, keepdim=True) + eps * eps)


class Zero(nn.Module):
    """A branch with parameters whose output is exactly zero (k~ = 0)."""

    def __init__(self, d: int):
        super().__init__()
        self.lin = nn.Linear(d, d, bias=False)
        nn.init.zeros_(self.lin.weight)

    def forward(self, c):
        return self.lin(c)


def force_beta(layer: DeltaResidual, logit: float) -> None:
    """Make the gate constant: beta = 2 sigmoid(logit)."""
    with torch.no_grad():
        layer.gate.proj.weight.zero_()
        layer.gate.proj.bias.fill_(logit)


def gradcheck_module(module: nn.Module, x: torch.Tensor, x_in: torch.Tensor | None = None) -> bool:
    """gradcheck in float64 over the state, x_in (when given) AND every parameter of the module."""
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]
    inputs = (x,) if x_in is None else (x, x_in)

    def f(*args):
        kwargs = {} if x_in is None else {"x_in": args[1]}
        return functional_call(module, dict(zip(names, args[len(inputs):])), (args[0],), kwargs)

    return torch.autograd.gradcheck(f, inputs + tuple(params), eps=1e-6, atol=1e-7, rtol=1e-5)


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("residual_map", ["k", "v"])
@pytest.mark.parametrize("gate", ["linear", "mlp"])
def test_gradcheck_d_v_1(residual_map, gate):
    d = 6
    layer = DeltaResidual(d, nn.Linear(d, d), residual_map=residual_map, gate=gate, backend="torch").double()
    x = torch.randn(2, 3, d, dtype=F64, requires_grad=True)
    assert gradcheck_module(layer, x)


@pytest.mark.parametrize("residual_map", ["k", "v"])
def test_gradcheck_d_v_3_with_x_in(residual_map):
    d, dv = 6, 3
    layer = DeltaResidual(d, nn.Linear(d, d), value_channels=dv, residual_map=residual_map, backend="torch").double()
    x = torch.randn(2, 3, d, dv, dtype=F64, requires_grad=True)
    x_in = torch.randn(2, 3, d, dtype=F64, requires_grad=True)
    assert gradcheck_module(layer, x, x_in)


def test_float64_layer_keeps_float64():
    layer = DeltaResidual(4, nn.Linear(4, 4), value_channels=2).double()
    x = torch.randn(3, 4, 2, dtype=F64)
    assert layer(x).dtype == F64
    assert layer.gate(torch.randn(3, 4, dtype=F64)).dtype == F64


@pytest.mark.parametrize("dv", [1, 3])
def test_zero_branch_gives_finite_output_and_gradients(dv):
    d = 8
    layer = DeltaResidual(d, Zero(d), value_channels=dv)
    shape = (2, 5, d) if dv == 1 else (2, 5, d, dv)
    x = torch.randn(shape, requires_grad=True)
    out = layer(x)
    assert torch.equal(out, x.detach())  # k~ = 0: the state passes unchanged
    out.square().sum().backward()
    assert bool(torch.isfinite(x.grad).all())
    for name, p in layer.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
    # the zero branch still receives a (finite, non-zero) learning signal through k
    assert float(layer.branch.lin.weight.grad.abs().sum()) > 0


# ----------------------------------------------------------------------------- limits and semantics


@pytest.mark.parametrize("dv,residual_map", [(1, "k"), (1, "v"), (4, "k"), (4, "v")])
def test_beta_to_zero_is_the_identity_block(dv, residual_map):
    d = 16
    layer = DeltaResidual(d, nn.Linear(d, d), value_channels=dv, residual_map=residual_map)
    force_beta(layer, -60.0)  # beta = 2 sigmoid(-60) ~ 1.7e-26
    x = torch.randn((3, 7, d) if dv == 1 else (3, 7, d, dv))
    assert torch.equal(layer(x), x)


def test_beta_one_overwrites_the_k_component_with_v():
    d = 16
    torch.manual_seed(1)
    layer = DeltaResidual(d, nn.Linear(d, d), k_eps=0.0).double()
    force_beta(layer, 0.0)  # beta = 2 sigmoid(0) = 1
    x = torch.randn(4, d, dtype=F64)
    out = layer(x)
    k = layer.branch(layer.norm(x))  # the direction the layer wrote along (k-Map: k~ = F(c))
    k = k / k.norm(dim=-1, keepdim=True)
    v = 4.0 * torch.sigmoid(layer.value_proj(x)).squeeze(-1)  # s = 4 from the raw residual
    torch.testing.assert_close((k * out).sum(-1), v)
    # everything orthogonal to k is kept
    perp = lambda m: m - k * (k * m).sum(-1, keepdim=True)
    torch.testing.assert_close(perp(out), perp(x))


def test_expanded_state_update_uses_x_in():
    d, dv = 8, 3
    layer = DeltaResidual(d, nn.Linear(d, d), value_channels=dv, k_eps=0.0).double()
    force_beta(layer, 0.0)
    x = torch.randn(2, d, dv, dtype=F64)
    x_in = torch.randn(2, d, dtype=F64)
    out = layer(x, x_in=x_in)
    k = layer.branch(layer.norm(x_in))
    k = k / k.norm(dim=-1, keepdim=True)
    v = 4.0 * torch.sigmoid(layer.value_proj(x_in))  # (2, d_v), from the compressed read
    torch.testing.assert_close((k.unsqueeze(-1) * out).sum(-2), v)
    # without x_in the layer reads the mean over the value channels
    torch.testing.assert_close(layer(x), layer(x, x_in=x.mean(-1)))


def test_the_additive_residual_takes_the_same_call():
    """The A/B switch: AdditiveResidual is x + F(RMSNorm(x)) with DeltaResidual's call and parameter names (norm,
    branch), so one class swaps for the other."""
    d = 12
    branch = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
    layer = AdditiveResidual(d, branch)
    x = torch.randn(2, 5, d)
    assert torch.equal(layer(x), x + branch(layer.norm(x)))
    assert not hasattr(layer, "gate")
    assert count_parameters(layer) == d + count_parameters(branch)
    delta = DeltaResidual(d, branch)
    assert {n for n, _ in layer.named_parameters()} < {n for n, _ in delta.named_parameters()}
    with pytest.raises(ValueError, match=r"AdditiveResidual: expected a state of shape \(\.\.\., 12\), got \(2, 5, 13\)"):
        layer(torch.randn(2, 5, 13))


def test_branch_receives_extra_arguments():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, c, scale, *, shift=0.0):
            return self.lin(c) * scale + shift

    layer = AdditiveResidual(4, Scaled())
    x = torch.randn(3, 4)
    torch.testing.assert_close(layer(x, 2.0, shift=1.0), x + layer.branch.lin(layer.norm(x)) * 2.0 + 1.0)


# ----------------------------------------------------------------------------- the gate


@pytest.mark.parametrize("beta_init", [0.1, 1.0, 1.9])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_gate_range_init_and_fp32_logits(beta_init, kind):
    gate = BetaGate(32, kind, beta_init=beta_init)
    assert math.isclose(2 / (1 + math.exp(-float(gate.proj.bias))), beta_init, rel_tol=1e-6)
    c = torch.randn(5, 7, 32)
    beta = gate(c)
    assert beta.shape == (5, 7, 1) and beta.dtype == torch.float32
    assert bool(((beta > 0) & (beta < 2)).all())
    # at init (small weights on an RMS-normed input) beta sits near beta_init
    assert abs(float(beta.mean()) - beta_init) < 0.5
    assert gate(c.bfloat16()).dtype == torch.float32
    with torch.no_grad():
        gate.proj.weight.zero_()
    torch.testing.assert_close(gate(c), torch.full((5, 7, 1), beta_init))
    # extreme logits saturate inside [0, 2] without NaN
    with torch.no_grad():
        gate.proj.bias.fill_(1e4)
    assert torch.equal(gate(c), torch.full((5, 7, 1), 2.0))


def test_gate_errors():
    with pytest.raises(ValueError, match=r"`kind` must be one of \('linear', 'mlp'\), got 'tanh'"):
        BetaGate(8, "tanh")
    with pytest.raises(ValueError, match=r"beta_init must lie in the open interval \(0, beta_max=2\), got 2.0"):
        BetaGate(8, beta_init=2.0)
    with pytest.raises(ValueError, match=r"got 0.0"):
        DeltaResidual(8, nn.Identity(), beta_init=0.0)


# ----------------------------------------------------------------------------- errors


def test_constructor_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"`value_channels` must be >= 1, got 0"):
        DeltaResidual(8, nn.Identity(), value_channels=0)
    with pytest.raises(ValueError, match=r"`residual_map` must be one of \('k', 'v'\), got 'q'"):
        DeltaResidual(8, nn.Identity(), residual_map="q")
    with pytest.raises(ValueError, match=r"`norm_output` must be one of \('module', 'autocast'\), got 'fp8'"):
        AdditiveResidual(8, nn.Identity(), norm_output="fp8")
    with pytest.raises(ValueError, match=r"`backend` must be one of .*, got 'cuda'"):
        DeltaResidual(8, nn.Identity(), backend="cuda")


def test_shape_errors_say_expected_and_got():
    layer1 = DeltaResidual(8, nn.Identity())
    with pytest.raises(ValueError, match=r"expected a state of shape \(\.\.\., 8\), got \(2, 3, 7\)"):
        layer1(torch.zeros(2, 3, 7))
    with pytest.raises(ValueError, match=r"expected a state of shape \(\.\.\., 8\), got \(8,\)"):
        layer1(torch.zeros(8))
    layer4 = DeltaResidual(8, nn.Identity(), value_channels=4)
    with pytest.raises(ValueError, match=r"expected a state of shape \(\.\.\., 8, 4\), got \(2, 3, 8\)"):
        layer4(torch.zeros(2, 3, 8))
    with pytest.raises(ValueError, match=r"expected a state of shape \(\.\.\., 8, 4\), got \(2, 8, 3\)"):
        layer4(torch.zeros(2, 8, 3))
    with pytest.raises(ValueError, match=r"`x_in` must have shape \(2, 3, 8\), got \(2, 3, 4\)"):
        layer4(torch.zeros(2, 3, 8, 4), x_in=torch.zeros(2, 3, 4))
