"""The untied gates (issue 56): ``x + k (beta_w v^T - beta_e k^T x)``, the delta update with its erase and its write
gated apart. The op against the plain reference (values and gradients, every dtype and backend; fp64 gradcheck),
and the two rules it must reduce to: tied gates are the delta rule, a zero erase gate the write-only control."""

from __future__ import annotations

import pytest
import torch

from deep_delta.ops.delta import (
    RULE_GATES,
    apply_update,
    delta_update,
    delta_update_reference,
    untied_update,
    write_update,
)


def _inputs(lead=(3, 5), d=16, dv=4, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, d, dv, generator=g, dtype=dtype)
    k = torch.randn(*lead, d, generator=g, dtype=dtype)
    v = torch.randn(*lead, dv, generator=g, dtype=dtype)
    erase = 2 * torch.rand(*lead, 1, generator=g, dtype=dtype)
    write = 2 * torch.rand(*lead, 1, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (x, k, v, erase, write)]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("backend", ["torch", "auto", "triton"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dv", [1, 4])
def test_untied_update_equals_the_reference_values_and_gradients(backend, dtype, dv):
    x, k, v, erase, write = _inputs(dv=dv, dtype=dtype)
    got = untied_update(x, k, v, erase, write, backend=backend)
    args = [t.detach().double().requires_grad_() for t in (x, k, v, erase, write)]
    want = delta_update_reference(args[0], args[1], args[2], args[4], beta_erase=args[3])
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    assert got.dtype == dtype and _rel(got, want) < tol
    g = torch.randn(got.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grads = torch.autograd.grad(got, (x, k, v, erase, write), g.to(dtype))
    want_grads = torch.autograd.grad(want, args, g)
    for name, a, b in zip(("x", "k", "v", "erase", "write"), grads, want_grads):
        assert a.dtype == dtype and _rel(a, b) < 4 * tol, name


def test_untied_update_gradcheck():
    assert torch.autograd.gradcheck(lambda *a: untied_update(*a, backend="torch"), _inputs((2,), 6, 3))


def test_reference_writes_the_formula():
    """The reference itself against the formula written out: x + u (beta_w v^T - beta_e u^T x)."""
    x, k, v, erase, write = (t.detach() for t in _inputs())
    u = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-10)
    p = (u.unsqueeze(-1) * x).sum(-2)
    want = x + u.unsqueeze(-1) * (write * v - erase * p).unsqueeze(-2)
    assert _rel(delta_update_reference(x, k, v, write, beta_erase=erase), want) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tied_gates_are_the_delta_rule_and_no_erase_the_write_only_control(dtype):
    x, k, v, _, beta = (t.detach() for t in _inputs(dtype=dtype))
    tied, delta = untied_update(x, k, v, beta, beta), delta_update(x, k, v, beta, backend="torch")
    torch.testing.assert_close(tied, delta, rtol=0, atol=1e-12 if dtype == torch.float64 else 2e-6)
    unerased = untied_update(x, k, v, torch.zeros_like(beta), beta)
    torch.testing.assert_close(unerased, write_update(x, k, v, beta), rtol=0, atol=1e-12 if dtype == torch.float64
                               else 2e-6)
    # and the erase gate matters: a half erase is neither
    half = untied_update(x, k, v, beta / 2, beta)
    assert _rel(half, delta) > 1e-3 and _rel(half, unerased) > 1e-3


def test_apply_update_takes_the_gates_in_the_rule_order():
    x, k, v, erase, write = (t.detach() for t in _inputs())
    assert RULE_GATES["untied"] == ("erase", "write")
    both = torch.cat([erase, write], dim=-1)
    assert torch.equal(apply_update("untied", x, k, v, both), untied_update(x, k, v, erase, write))
    with pytest.raises(ValueError, match=r"the untied rule takes beta \(\.\.\., 2\) \(erase, write\), got \(3, 5, 1\)"):
        apply_update("untied", x, k, v, write)
    with pytest.raises(ValueError, match="`rule` got 'erase'; allowed: delta | write | untied"):
        apply_update("erase", x, k, v, write)


def test_a_misshapen_gate_names_it():
    x, k, v, erase, write = (t.detach() for t in _inputs())
    with pytest.raises(ValueError, match="`beta` must have shape"):
        untied_update(x, k, v, erase[..., :1, :], write)
