"""The model's initialisation is the layers' own ``reset_parameters``; parameter counting.

``DDLPreTrainedModel._init_weights`` picks a std and calls each module's ``reset_parameters`` (the gate,
the residual's projections, attention, the MLP, the compressors, EC). Checked here: the gate bias follows
``beta_init`` (the model used to zero it: beta = 1 whatever ``beta_init`` said), a checkpoint with keys
missing gets exactly those keys initialised, the rest loaded bit for bit, and ``count_parameters``.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.layers import BetaGate, DeltaResidual
from deep_delta.layers.gate import gate_bias_for
from deep_delta.models import count_parameters
from helpers import DEBUG


@pytest.mark.parametrize("beta_init", [0.3, 1.0, 1.7])
@pytest.mark.parametrize("gate", ["linear", "mlp"])
def test_beta_init_reaches_every_gate(beta_init, gate):
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-tc", "tiny", beta_init=beta_init, gate=gate, **DEBUG))
    gates = [m for m in model.modules() if isinstance(m, BetaGate)]
    assert len(gates) == 2 * DEBUG["num_hidden_layers"]
    for g in gates:
        assert g.proj.bias.item() == pytest.approx(gate_bias_for(beta_init), abs=1e-7)


def test_residual_projections_use_the_hidden_std():
    """The residual's own projections get the model's hidden std (hidden_init_scale / sqrt(d)) from
    ``reset_projections``; at d = 32 with a 64-wide draw per matrix the sample std is within 30%."""
    cfg = DDLConfig.from_variant("ddl-dv1-vmap", "tiny", **{**DEBUG, "hidden_size": 64})
    model = DDLForCausalLM(cfg)
    std = cfg.hidden_init_scale / cfg.hidden_size**0.5
    for res in (m for m in model.modules() if isinstance(m, DeltaResidual)):
        for lin in (res.key_down, res.key_up, res.value_proj, res.gate.proj):
            assert abs(lin.weight.std().item() / std - 1) < 0.3


def test_missing_keys_are_initialised_and_the_rest_loaded(tmp_path):
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-tc", "tiny", beta_init=0.5, **DEBUG))
    with torch.no_grad():  # away from the init, so that a re-initialised tensor would show
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    state = load_file(weights)
    dropped = {k for k in state if k.endswith("gate.proj.bias") or k == "model.final_compressor.conv_weight"}
    assert len(dropped) == 2 * DEBUG["num_hidden_layers"] + 1
    save_file({k: v for k, v in state.items() if k not in dropped}, weights, metadata={"format": "pt"})

    back = DDLForCausalLM.from_pretrained(tmp_path)
    ref = model.state_dict()
    for name, t in back.state_dict().items():
        if name not in dropped:
            assert torch.equal(t, ref[name]), name
        elif name.endswith("bias"):
            assert t.item() == pytest.approx(gate_bias_for(0.5), abs=1e-7), name
        else:  # identity taps
            assert torch.equal(t[0], torch.ones_like(t[0])) and not t[1:].any(), name


def test_count_parameters_counts_the_tied_embedding_once():
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", **DEBUG))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    assert count_parameters(model) == sum(unique.values()) == model.num_parameters()
    assert count_parameters(model.model.layers[0]) == sum(p.numel() for p in model.model.layers[0].parameters())
