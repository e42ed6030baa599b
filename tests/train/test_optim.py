from __future__ import annotations

import math

import pytest
import torch

from deep_delta.models import DDLConfig, DDLForCausalLM
from deep_delta.train.build import model_vocab_size
from deep_delta.train.optim import WarmupCosine, build_optimizer, param_groups, set_learning_rate


def test_weight_decay_on_matrices_only():
    m = DDLForCausalLM(DDLConfig.from_variant("ddl-tc", "tiny", hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, vocab_size=64))
    decay, no_decay = param_groups(m, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(m.parameters()))  # tied embedding once
    assert any(p is m.model.embed_tokens.weight for p in decay["params"])  # embeddings decay (nanoGPT)
    assert any(p is m.model.norm.weight for p in no_decay["params"])


def test_warmup_then_cosine():
    f = WarmupCosine(warmup=10, total=110, min_ratio=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(10, 120))


def test_schedule_drives_optimizer_lr():
    p = torch.nn.Parameter(torch.zeros(2, 2))
    opt = build_optimizer(torch.nn.ParameterList([p]), 1e-3, 0.1, (0.9, 0.95))
    schedule = WarmupCosine(2, 10, 0.0)
    lrs = []
    for step in range(11):
        lrs.append(set_learning_rate(opt, schedule(step)))
        assert all(g["lr"] == lrs[-1] and g["initial_lr"] == 1e-3 for g in opt.param_groups)
        opt.step()
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)
    assert lrs[-2] < lrs[2] and lrs[-1] == pytest.approx(0.0)


@pytest.mark.parametrize("preset_vocab, data_vocab, want", [(512, 257, 512), (256, 257, 320), (50304, 50257, 50304),
                                                            (64, 50257, 50304)])
def test_model_vocab_is_padded_to_64(preset_vocab, data_vocab, want):
    assert model_vocab_size(preset_vocab, data_vocab) == want
