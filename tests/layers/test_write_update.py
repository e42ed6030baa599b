"""The write-only control (issue 48): ``x + beta k v^T`` with everything else of a DDL variant the same.

The op against its plain reference (values and gradients, fp64 gradcheck); the twin variants with the same
parameters and the same initialisation as their DDL variant for one seed; with the same weights, the DDL update
minus the twin's is exactly the erased part ``-beta k k^T x``; the model's forward, backward, fused and unfused
paths, generation with the cache and a save / load round trip for each twin.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from torch import nn  # noqa: E402

from deep_delta import DDLConfig, DDLForCausalLM, DeltaResidual  # noqa: E402
from deep_delta.ops.delta import apply_update, delta_update_reference, unit_direction, write_update  # noqa: E402
from deep_delta.variants import PAPER_NAMES, VARIANTS, twin_of  # noqa: E402

TWINS = {"ddl-dv1": "ddl-dv1-write", "ddl-cc": "ddl-cc-write", "ddl-tc": "ddl-tc-write"}


def _inputs(lead, d, dv, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, d, dv, generator=g, dtype=dtype)
    k = torch.randn(*lead, d, generator=g, dtype=dtype)
    v = torch.randn(*lead, dv, generator=g, dtype=dtype)
    beta = 2 * torch.rand(*lead, 1, generator=g, dtype=dtype)
    return [t.requires_grad_() for t in (x, k, v, beta)]


@pytest.mark.parametrize("backend", ["torch", "auto", "triton"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_write_update_equals_x_plus_beta_k_v(backend, dtype):
    x, k, v, beta = _inputs((3, 5), 16, 4, dtype)
    got = write_update(x, k, v, beta, backend=backend)
    u, _ = unit_direction(k.detach().double())
    want = x.detach().double() + beta.detach().double().unsqueeze(-1) * u.unsqueeze(-1) * v.detach().double().unsqueeze(-2)
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    assert got.dtype == dtype and ((got.double() - want).norm() / want.norm()) < tol
    ref = delta_update_reference(x, k, v, beta, erase=False)
    g = torch.randn_like(got)
    grads = torch.autograd.grad(got, (x, k, v, beta), g)
    want_grads = torch.autograd.grad(ref, (x, k, v, beta), g)
    for a, b in zip(grads, want_grads):
        assert ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)) < tol


def test_write_update_gradcheck():
    assert torch.autograd.gradcheck(lambda *a: write_update(*a, backend="torch"), _inputs((2,), 6, 3))


def test_apply_update_names_the_rule():
    x, k, v, beta = (t.detach() for t in _inputs((2,), 6, 3))
    assert torch.equal(apply_update("write", x, k, v, beta), write_update(x, k, v, beta))
    with pytest.raises(ValueError, match=r"`rule` got 'erase'; allowed: delta \| write"):
        apply_update("erase", x, k, v, beta)


@pytest.mark.parametrize("dv", [1, 4])
def test_with_the_same_weights_the_two_updates_differ_by_the_erased_part(dv):
    """DDL's new state minus the twin's is exactly ``-beta u (u^T x)``: what the delta rule's read erases."""
    torch.manual_seed(0)
    d = 16
    ddl = DeltaResidual(d, nn.Linear(d, d), value_channels=dv, backend="torch").double()
    twin = DeltaResidual(d, nn.Linear(d, d), value_channels=dv, backend="torch", update_rule="write").double()
    twin.load_state_dict(ddl.state_dict())
    x = torch.randn(3, 7, d, dtype=torch.float64) if dv == 1 else torch.randn(3, 7, d, dv, dtype=torch.float64)
    k, v, beta = ddl._update_inputs(x, None, (), {}, None)
    state = x.unsqueeze(-1) if dv == 1 else x
    u, _ = unit_direction(k)
    erased = -beta.unsqueeze(-1) * u.unsqueeze(-1) * (u.unsqueeze(-2) @ state)
    diff = (ddl(x) - twin(x)).reshape(state.shape)
    assert torch.allclose(diff, erased, atol=1e-12, rtol=1e-10)
    assert "update_rule=write" in twin.extra_repr() and "update_rule" not in ddl.extra_repr()


def test_the_rule_is_refused_where_it_does_not_apply():
    with pytest.raises(ValueError, match="DeltaResidual: `update_rule` got 'erase'; allowed: delta | write"):
        DeltaResidual(8, nn.Identity(), update_rule="erase")
    for refused in (lambda: DDLConfig.from_variant("baseline", update_rule="write"),
                    lambda: DDLConfig(residual="additive", update_rule="write")):
        with pytest.raises(ValueError, match="`update_rule` got 'write'; allowed: its default \\('delta'\\) with "
                           "residual='additive': it is a setting of the design 'delta'"):
            refused()
    with pytest.raises(ValueError, match="`recompute_states` got True; allowed: False with update_rule='write'"):
        DDLConfig.from_variant("ddl-cc-write", recompute_states=True)


@pytest.mark.parametrize("variant", sorted(TWINS))
def test_twin_has_the_same_parameters_and_initialisation(variant):
    twin = TWINS[variant]
    assert twin_of(variant) == twin and VARIANTS[twin]["update_rule"] == "write" and twin in PAPER_NAMES
    assert {k: v for k, v in VARIANTS[twin].items() if k != "update_rule"} == {
        k: v for k, v in VARIANTS[variant].items() if k != "update_rule"}
    models = []
    for name in (variant, twin):
        torch.manual_seed(7)
        models.append(DDLForCausalLM(DDLConfig.from_variant(name, "tiny", num_hidden_layers=2)))
    a, b = (m.state_dict() for m in models)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("twin", sorted(TWINS.values()))
def test_twin_model_trains_decodes_and_round_trips(twin, backend, tmp_path):
    """Forward and backward (fused reads and not: the same values), decoding with the cache equal to a full
    forward, and save / load; the twin's loss differs from its DDL variant's with the same weights."""
    cfg = DDLConfig.from_variant(twin, "tiny", num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                 vocab_size=64, delta_backend=backend)
    torch.manual_seed(0)
    model = DDLForCausalLM(cfg)
    ids = torch.randint(0, 64, (2, 6))
    out = model(ids, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.model.fuse_reads = False
    unfused = model(ids, labels=ids)
    model.model.fuse_reads = True
    assert torch.allclose(out.logits, unfused.logits, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        full = model(ids).logits
        step = model(ids[:, :4], use_cache=True)
        nxt = model(ids[:, 4:], past_key_values=step.past_key_values, use_cache=True)
    assert torch.allclose(nxt.logits, full[:, 4:], atol=1e-4, rtol=1e-4)
    model.save_pretrained(tmp_path)
    again = DDLForCausalLM.from_pretrained(tmp_path)
    assert again.config.update_rule == "write"
    with torch.no_grad():
        assert torch.equal(again(ids).logits, full)
    ddl_cfg = DDLConfig.from_variant(twin.removesuffix("-write"), "tiny", num_hidden_layers=2, hidden_size=32,
                                     num_attention_heads=2, vocab_size=64, delta_backend=backend)
    ddl = DDLForCausalLM(ddl_cfg)
    ddl.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.allclose(ddl(ids).logits, full)
