"""The untied gates in the model (issue 56): each ``-untied`` variant is its DDL variant at step 0 for the same seed;
with the same weights, tied gates give the DDL model and a zero erase gate the write-only twin; the gate's two
projections draw what one gate draws; ``ddl analyze`` reports both gates."""

from __future__ import annotations

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.layers import BetaGate
from deep_delta.variants import VARIANTS
from helpers import DEBUG

UNTIED = {"ddl-dv1": "ddl-dv1-untied", "ddl-cc": "ddl-cc-untied", "ddl-tc": "ddl-tc-untied"}


def _model(variant, seed=0):
    torch.manual_seed(seed)
    return DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **DEBUG)).eval()


def _ids():
    return torch.randint(0, DEBUG["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(5))


def test_the_untied_variants_are_their_ddl_variants_with_the_untied_rule():
    for ddl, untied in UNTIED.items():
        assert {k: v for k, v in VARIANTS[untied].items() if k != "update_rule"} == VARIANTS[ddl]
        assert VARIANTS[untied]["update_rule"] == "untied"


@pytest.mark.parametrize("ddl", list(UNTIED))
def test_at_initialisation_the_untied_model_is_its_ddl_variant(ddl):
    """The same seed gives the same weights (the gate's two rows both DDL's one) and the same logits (to the
    rounding of beta v - beta p against beta (v - p))."""
    base, untied = _model(ddl), _model(UNTIED[ddl])
    want = base.state_dict()
    got = untied.state_dict()
    assert set(got) == set(want)
    for name, w in want.items():
        if name.endswith("gate.proj.weight") or name.endswith("gate.proj.bias"):
            assert got[name].shape[0] == 2 and torch.equal(got[name][0], w[0]) and torch.equal(got[name][1], w[0])
        else:
            assert torch.equal(got[name], w), name
    ids = _ids()
    torch.testing.assert_close(untied(ids).logits, base(ids).logits, rtol=0, atol=1e-5)


def _moved(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def _untied_with(model_ddl, untied_name, erase_row):
    """The untied model with model_ddl's weights, its erase row set by ``erase_row(write_weight, write_bias)``."""
    untied = _model(untied_name)
    state = {}
    for name, w in model_ddl.state_dict().items():
        if name.endswith("gate.proj.weight") or name.endswith("gate.proj.bias"):
            state[name] = torch.cat([erase_row(name, w), w], dim=0)
        else:
            state[name] = w
    untied.load_state_dict(state)
    return untied


@pytest.mark.parametrize("ddl", list(UNTIED))
def test_with_the_same_weights_tied_gates_are_ddl_and_no_erase_is_the_twin(ddl):
    base = _moved(_model(ddl))
    ids = _ids()
    tied = _untied_with(base, UNTIED[ddl], lambda name, w: w)
    torch.testing.assert_close(tied(ids).logits, base(ids).logits, rtol=0, atol=1e-5)
    # an erase gate of exactly 0: weights 0 and bias -inf (beta_max sigmoid(-inf) = 0)
    twin = _model(f"{ddl}-write")
    twin.load_state_dict(base.state_dict())
    unerased = _untied_with(base, UNTIED[ddl], lambda name, w: torch.zeros_like(w) if name.endswith("weight")
                            else torch.full_like(w, -float("inf")))
    torch.testing.assert_close(unerased(ids).logits, twin(ids).logits, rtol=0, atol=1e-5)
    # and neither is the other: the erase changes the model
    assert (unerased(ids).logits - base(ids).logits).abs().max() > 1e-3


def test_training_moves_the_two_gates_apart():
    """One optimizer step: the erase and the write rows get different gradients (they are two gates, not one)."""
    model = _model("ddl-cc-untied").train()
    ids = _ids()
    model(ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        if name.endswith("gate.proj.weight"):
            assert not torch.allclose(p.grad[0], p.grad[1]), name


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_a_gate_of_two_outputs_draws_what_one_gate_draws(kind):
    torch.manual_seed(3)
    one = BetaGate(16, kind)
    after_one = torch.rand(4)
    torch.manual_seed(3)
    two = BetaGate(16, kind, outputs=2)
    after_two = torch.rand(4)
    assert torch.equal(after_one, after_two)  # the same random numbers were used
    assert torch.equal(two.proj.weight[0], one.proj.weight[0]) and torch.equal(two.proj.weight[1], one.proj.weight[0])
    c = torch.randn(3, 16)
    assert two(c).shape == (3, 2) and torch.equal(two(c)[..., 0], two(c)[..., 1])
    with pytest.raises(ValueError, match="`outputs` got 0"):
        BetaGate(16, kind, outputs=0)


def test_analyze_reports_both_gates(tmp_path):
    from deep_delta.experiments.analyze import analyze_model, format_analysis

    model = _moved(_model("ddl-cc-untied"))
    report = analyze_model(model, [_ids()])
    rows = report["sublayers"]
    assert rows and all("write_gate" in r for r in rows.values())
    text = format_analysis(report)
    assert "| sublayer | erase gate mean | write gate mean | erase / write |" in text
    # the DDL model has no write gate row
    assert "write gate" not in format_analysis(analyze_model(_moved(_model("ddl-cc")), [_ids()]))
