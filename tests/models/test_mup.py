"""parametrization="sp" | "mup": sp keeps every number; muP's multipliers, groups, init and reload (docs/mup.md)."""

from __future__ import annotations

import math

import pytest
import torch

from deep_delta.models import DDLConfig, DDLForCausalLM
from deep_delta.train.optim import build_optimizer, param_groups

# Initial loss and the losses after 1, 2 and 3 AdamW steps (lr 1e-2, weight decay 0.1, betas 0.9/0.95, 1 CPU
# thread) of the model in `_sp_losses`. Computed from commit cdfd10f, before parametrization existed, by
# running the same code as `_sp_losses` against that commit's sources (`git archive cdfd10f src`, put first
# on PYTHONPATH) and printing repr(loss.item()); the tolerance allows only last-bit differences between CPUs
# (another BLAS kernel may sum in another order).
SP_LOSSES = {
    "baseline": [4.942051410675049, 4.472723007202148, 3.84450626373291, 3.3058810234069824],
    "ddl-dv1": [4.813842296600342, 4.667659282684326, 4.015152454376221, 3.450540065765381],
    "ddl-tc": [4.833569049835205, 4.621115684509277, 4.016873359680176, 3.3917365074157715],
    "ddl-cc": [4.833569049835205, 4.617937088012695, 4.019930839538574, 3.4003376960754395],
}


def _tiny(variant: str, **overrides) -> DDLConfig:
    fields = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=128,
                  max_position_embeddings=32)
    return DDLConfig.from_variant(variant, "tiny", **{**fields, **overrides})


def _sp_losses(variant: str, **overrides) -> list[float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = DDLForCausalLM(_tiny(variant, **overrides)).train()
        x = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
        opt = build_optimizer(model, 1e-2, 0.1, (0.9, 0.95))
        losses = []
        for _ in range(4):
            loss = model(x, labels=x).loss
            losses.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return losses
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("variant", list(SP_LOSSES))
def test_sp_keeps_every_number(variant):
    assert _sp_losses(variant) == pytest.approx(SP_LOSSES[variant], rel=1e-6, abs=0)


def test_mup_at_its_base_width_is_sp_but_for_the_zero_readouts():
    # the baseline has no DDL readouts: muP at m = 1 is the sp model, step for step
    assert _sp_losses("baseline", parametrization="mup", mup_base_width=64) == pytest.approx(
        SP_LOSSES["baseline"], rel=1e-6, abs=0)
    torch.manual_seed(0)
    sp = DDLForCausalLM(_tiny("ddl-cc")).state_dict()
    torch.manual_seed(0)
    mup = DDLForCausalLM(_tiny("ddl-cc", parametrization="mup", mup_base_width=64)).state_dict()
    readouts = {k for k in sp if k.endswith(("value_proj.weight", "gate.proj.weight"))}
    assert len(readouts) == 8 and all(not mup[k].any() for k in readouts)
    assert all(torch.equal(sp[k], mup[k]) for k in sp if k not in readouts)


def test_config_fields_are_validated():
    assert _tiny("baseline").parametrization == "sp" and _tiny("baseline").mup_base_width == 256
    assert _tiny("baseline").mup_width_mult == 1.0
    assert _tiny("baseline", parametrization="mup", mup_base_width=16).mup_width_mult == 4.0
    with pytest.raises(ValueError, match=r"`parametrization` got 'mu'; allowed: sp \| mup"):
        _tiny("baseline", parametrization="mu")
    with pytest.raises(ValueError, match=r"`mup_base_width` got 0; allowed: an integer >= 1"):
        _tiny("baseline", mup_base_width=0)
    with pytest.raises(ValueError, match=r"`gate_hidden_size` got 8; allowed: None with parametrization='mup'"):
        _tiny("ddl-dv1", parametrization="mup", gate="mlp", gate_hidden_size=8)
    _tiny("ddl-dv1", gate="mlp", gate_hidden_size=8)  # fine under sp


def test_mup_optimizer_groups_come_from_the_model():
    model = DDLForCausalLM(_tiny("ddl-cc", parametrization="mup", mup_base_width=16))  # m = 4
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, 0.1, lr=1e-2)
    assert len(groups) == 3 and "lr" not in groups[0] and "lr" not in groups[1]
    hidden = groups[2]
    assert hidden["lr"] == pytest.approx(1e-2 / 4) and hidden["weight_decay"] == pytest.approx(0.4)
    scaled = {names[id(p)] for p in hidden["params"]}
    assert "model.layers.0.attn.branch.q_proj.weight" in scaled
    assert "model.layers.1.mlp.branch.down_proj.weight" in scaled
    assert "model.layers.0.attn.gate.proj.weight" in scaled and "model.layers.0.mlp.value_proj.weight" in scaled
    base = {names[id(p)] for g in groups[:2] for p in g["params"]}
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.compressor.weight",
            "model.expander.weight", "model.layers.0.attn.value_proj.bias"} <= base
    assert len(scaled) + len(base) == len(list(model.parameters()))
    opt = build_optimizer(model, 1e-2, 0.1, (0.9, 0.95))
    assert [g["initial_lr"] for g in opt.param_groups] == pytest.approx([1e-2, 1e-2, 2.5e-3])
    with pytest.raises(ValueError, match="`lr` is needed"):
        param_groups(model, 0.1)


def test_mup_logits_and_readouts():
    torch.manual_seed(0)
    sp = DDLForCausalLM(_tiny("baseline"))
    mup = DDLForCausalLM(_tiny("baseline", parametrization="mup", mup_base_width=16))
    mup.load_state_dict(sp.state_dict())
    x = torch.randint(0, 128, (2, 8))
    torch.testing.assert_close(mup(x).logits, sp(x).logits / 4)  # logits times base/width
    torch.manual_seed(0)
    sp_cc = DDLForCausalLM(_tiny("ddl-cc", hidden_size=1024, num_attention_heads=8))
    torch.manual_seed(0)
    mup_cc = DDLForCausalLM(_tiny("ddl-cc", hidden_size=1024, num_attention_heads=8, parametrization="mup"))
    a, b = sp_cc.model.layers[0].attn, mup_cc.model.layers[0].attn
    assert b.value_scale == a.value_scale * 2  # v = s sqrt(m) sigmoid(.), m = 4
    assert not b.value_proj.weight.any() and not b.gate.proj.weight.any()  # readouts start at zero
    torch.testing.assert_close(b.branch.q_proj.weight, a.branch.q_proj.weight)  # hidden: as today (1/fan_in)
    assert math.isclose(mup_cc.config.mup_width_mult, 4.0)


def test_mup_untied_lm_head_starts_at_zero_and_keeps_its_rate(tmp_path):
    # muP's readout init (docs/mup.md); a tied head is the embedding and keeps its init; sp draws it as before
    torch.manual_seed(0)
    mup = DDLForCausalLM(_tiny("baseline", parametrization="mup", mup_base_width=16, tie_word_embeddings=False))
    assert mup.lm_head.weight is not mup.model.embed_tokens.weight
    assert not mup.lm_head.weight.any() and mup.model.embed_tokens.weight.std() > 0.01
    assert "lm_head.weight" not in mup.lr_multipliers()  # lr unscaled: its 1/m is the logit multiplier
    torch.manual_seed(0)
    sp = DDLForCausalLM(_tiny("baseline", tie_word_embeddings=False))
    assert sp.lm_head.weight.std() > 0.01
    torch.manual_seed(0)
    tied = DDLForCausalLM(_tiny("baseline", parametrization="mup", mup_base_width=16))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight and tied.lm_head.weight.std() > 0.01
    with torch.no_grad():
        mup.lm_head.weight.normal_()  # trained: a reload keeps it (the init does not touch loaded tensors)
    mup.save_pretrained(tmp_path)
    assert torch.equal(DDLForCausalLM.from_pretrained(tmp_path).lm_head.weight, mup.lm_head.weight)


def test_mup_model_reloads_identically(tmp_path):
    from deep_delta.models.ddl.weights import load_ddl_model

    torch.manual_seed(0)
    model = DDLForCausalLM(_tiny("ddl-cc", parametrization="mup", mup_base_width=16)).eval()
    x = torch.randint(0, 128, (2, 8))
    ref = model(x).logits
    model.save_pretrained(tmp_path)
    loaded = load_ddl_model(tmp_path)
    assert loaded.config.parametrization == "mup" and loaded.config.mup_base_width == 16
    assert torch.equal(loaded.eval()(x).logits, ref)
    assert torch.equal(DDLForCausalLM.from_pretrained(tmp_path).eval()(x).logits, ref)


# The hyper-connection variants under sp, the model of `_sp_losses`, computed at commit 73d3f3e (before their muP
# rule) the same way as SP_LOSSES. The first loss must match to the last bits; after AdamW steps the tolerance
# leaves room for the HC backends' rounding in backward (ops/hyper), far below what a changed learning rate or
# init moves (a factor on the dynamic projections' rate, or phi zeroed, changes these at 1e-3 and more).
HYPER_SP_LOSSES = {
    "hc": [4.942051410675049, 4.472278118133545, 3.8353524208068848, 3.289358377456665],
    "mhc": [4.896922588348389, 4.478539943695068, 3.8399858474731445, 3.370474100112915],
}


@pytest.mark.parametrize("variant", list(HYPER_SP_LOSSES))
def test_sp_keeps_the_hyper_connections_numbers(variant):
    losses, want = _sp_losses(variant), HYPER_SP_LOSSES[variant]
    assert losses[0] == pytest.approx(want[0], rel=1e-6, abs=0)
    assert losses[1:] == pytest.approx(want[1:], rel=1e-4, abs=0)


READOUT = {"hc": "dynamic_proj", "mhc": "phi", "hc-static": None, "mhc-static": None}


@pytest.mark.parametrize("variant", list(READOUT))
def test_mup_scales_the_hyper_connections_dynamic_projections_only(variant):
    """HC's dynamic_proj (d -> n+2) and mHC's phi (n d -> 2n+n^2) are readouts: lr / m and zero init under muP.
    The static coefficients, the scales and the coefficient norm keep lr and init; sp is untouched."""
    torch.manual_seed(0)
    sp = DDLForCausalLM(_tiny(variant))
    torch.manual_seed(0)
    mup = DDLForCausalLM(_tiny(variant, parametrization="mup", mup_base_width=16))  # m = 4
    assert sp.lr_multipliers() == {} and len(param_groups(sp, 0.1, lr=1e-2)) == 2
    own = {n for n in sp.state_dict() if n.startswith("model.layers.") and ".branch." not in n
           and not n.endswith(".norm.weight")}  # the hyper-connections' own parameters
    assert own and all(".attn." in n or ".mlp." in n for n in own)
    readouts = {n for n in own if READOUT[variant] and n.endswith("." + READOUT[variant])}
    assert len(readouts) == (4 if READOUT[variant] else 0)  # one per sublayer
    mult = mup.lr_multipliers()
    assert {n for n in own if n in mult} == readouts and all(mult[n] == 0.25 for n in readouts)
    names = {id(p): n for n, p in mup.named_parameters()}
    scaled = next(g for g in param_groups(mup, 0.1, lr=1e-2) if g.get("lr") == pytest.approx(2.5e-3))
    assert scaled["weight_decay"] == pytest.approx(0.4) and readouts <= {names[id(p)] for p in scaled["params"]}
    s, m = sp.state_dict(), mup.state_dict()
    for n in s:
        if n in readouts:
            assert not m[n].any()  # muP's readout init
            assert s[n].any() == (variant == "mhc")  # sp: phi ~ N(0, .), HC's projection 0 (its paper)
        else:
            assert torch.equal(s[n], m[n]), n


def test_mup_mhc_reload_keeps_a_trained_phi(tmp_path):
    from deep_delta.models.ddl.weights import load_ddl_model

    torch.manual_seed(0)
    model = DDLForCausalLM(_tiny("mhc", parametrization="mup", mup_base_width=16)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.attn.phi.normal_(0.0, 0.02)
    x = torch.randint(0, 128, (2, 8))
    ref = model(x).logits
    model.save_pretrained(tmp_path)
    loaded = load_ddl_model(tmp_path).eval()
    assert torch.equal(loaded.model.layers[0].attn.phi, model.model.layers[0].attn.phi)
    assert torch.equal(loaded(x).logits, ref)
