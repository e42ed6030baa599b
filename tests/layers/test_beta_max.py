"""The gate-range ablation: beta = beta_max * sigmoid(.), beta_max = 2 the paper's gate, 1 without reflection."""

import math

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.layers.gate import BetaGate, gate_bias_for


@pytest.mark.parametrize("beta_max, beta_init", [(2.0, 1.0), (1.0, 0.5), (1.0, 0.9), (1.5, 0.3)])
def test_gate_starts_at_beta_init_and_stays_below_beta_max(beta_max, beta_init):
    torch.manual_seed(0)
    gate = BetaGate(16, beta_init=beta_init, beta_max=beta_max)
    torch.nn.init.zeros_(gate.proj.weight)
    beta = gate(torch.randn(8, 16))
    torch.testing.assert_close(beta, torch.full_like(beta, beta_init))
    gate.proj.bias.data.fill_(40.0)  # saturated: sigmoid -> 1
    assert torch.allclose(gate(torch.randn(8, 16)), torch.full((8, 1), beta_max))
    gate.proj.bias.data.fill_(-40.0)
    assert gate(torch.randn(8, 16)).max() < 1e-6


def test_bias_formula():
    assert gate_bias_for(1.0) == 0.0  # the paper's gate at beta = 1: sigmoid(0) * 2
    assert math.isclose(gate_bias_for(0.5, 1.0), 0.0)
    assert math.isclose(1.0 / (1.0 + math.exp(-gate_bias_for(0.3, 1.5))) * 1.5, 0.3)


def test_default_is_the_paper_gate_bit_for_bit():
    torch.manual_seed(0)
    a = DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", num_hidden_layers=1))
    torch.manual_seed(0)
    b = DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", num_hidden_layers=1, beta_max=2.0))
    ids = torch.randint(0, 512, (2, 12))
    assert torch.equal(a(ids).logits, b(ids).logits)


def test_beta_max_one_model_never_reflects():
    cfg = DDLConfig.from_variant("ddl-dv1", "tiny", num_hidden_layers=2, beta_max=1.0, beta_init=0.5)
    model = DDLForCausalLM(cfg)
    for module in model.modules():
        if isinstance(module, BetaGate):
            module.proj.bias.data.fill_(30.0)
            assert module(torch.randn(4, cfg.hidden_size)).max() <= 1.0
    out = model(torch.randint(0, 512, (2, 12)), labels=torch.randint(0, 512, (2, 12)))
    assert torch.isfinite(out.loss)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"beta_max": 0.0}, r"`beta_max` got 0\.0; allowed: a float in \(0, 2\]"),
        ({"beta_max": 3.0}, r"`beta_max` got 3\.0; allowed: a float in \(0, 2\]"),
        ({"beta_max": 1.0}, r"`beta_init` got 1\.0; allowed: a float in the open interval \(0, beta_max=1\)"),
        ({"beta_max": "one"}, r"`beta_max` got 'one'; allowed: a number$"),
    ],
)
def test_bad_beta_max_is_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        DDLConfig.from_variant("ddl-dv1", "tiny", **fields)
