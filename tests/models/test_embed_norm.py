"""The embedding norm (issue 64): ``embed_norm=True`` puts a learned RMSNorm on the embedding output before the
first sublayer, for every family of residual: before the state expansion of a d_v > 1 state, before HC's streams
are formed and before AttnRes's first source. Off by default (every earlier record reproduces)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.hf import load_model
from helpers import tiny_model

# one variant of each family: additive, delta d_v = 1, delta d_v = 4 with EC, the write-only twin, HC, mHC, AttnRes
FAMILIES = ["baseline", "ddl-dv1", "ddl-cc", "ddl-tc", "ddl-cc-write", "hc", "mhc", "attnres-block"]


def test_off_by_default_and_on_for_peri_ln():
    assert DDLConfig().embed_norm is False
    for variant in ("baseline", "ddl-cc", "hc", "attnres"):
        assert DDLConfig.from_variant(variant).embed_norm is False
    assert DDLConfig.from_variant("peri-ln").embed_norm is True
    assert DDLForCausalLM(DDLConfig.from_variant("baseline", num_hidden_layers=1)).model.embed_norm is None


@pytest.mark.parametrize("variant", FAMILIES)
def test_the_norm_is_applied_once_to_the_embedding_before_anything_else(variant):
    """The model with the norm, fed token ids, equals the same weights without the norm fed the normed embedding
    as ``inputs_embeds``: the norm sits exactly at the embedding output, before the expansion / streams / sources
    and the blocks, and nowhere else."""
    model = tiny_model(variant, embed_norm=True)  # weights moved off their init: the norm's gain is not all ones
    gain = model.model.embed_norm.weight
    assert not torch.equal(gain, torch.ones_like(gain))
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        got = model(ids).logits
        normed = nn.functional.rms_norm(model.model.embed_tokens(ids), gain.shape, gain, model.config.rms_norm_eps)
        norm, model.model.embed_norm = model.model.embed_norm, None
        want = model(inputs_embeds=normed).logits
        plain = model(ids).logits
        model.model.embed_norm = norm
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (got - plain).abs().max() > 1e-3  # the norm changes the model


@pytest.mark.parametrize("variant", ["baseline", "ddl-cc", "hc", "attnres-block"])
def test_the_first_sublayer_reads_the_normed_embedding_at_its_scale(variant):
    """At init the state entering the first block has the normed embedding's RMS ~1 (the norm's gain starts at
    ones), not the raw embedding's ~initializer_range."""
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", num_hidden_layers=2, embed_norm=True)).eval()
    seen = []
    model.model.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    with torch.no_grad():
        model(torch.randint(0, model.config.vocab_size, (2, 16)))
    state = seen[0][0] if isinstance(seen[0], tuple) else seen[0]  # AttnRes: its sources, the embedding first
    rms = state.pow(2).mean().sqrt()
    assert 0.9 < float(rms) < 1.1, float(rms)


def test_the_norm_trains():
    model = tiny_model("ddl-cc", embed_norm=True).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    model(ids, labels=ids).loss.backward()
    assert model.model.embed_norm.weight.grad is not None and model.model.embed_norm.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("variant", ["baseline", "ddl-cc", "peri-ln"])
def test_round_trip_with_the_embedding_norm(tmp_path, variant):
    from transformers import AutoModelForCausalLM

    model = tiny_model(variant, embed_norm=True)
    model.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert back.config.embed_norm is True and back.model.embed_norm is not None
    assert torch.equal(back.model.embed_norm.weight, model.model.embed_norm.weight)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path, tokenizer="byte").model(ids).logits, model(ids).logits)


def test_a_model_saved_without_the_field_loads_without_the_norm(tmp_path):
    """A config.json written before the field existed (a Peri-LN run of before issue 64) loads as it was trained:
    no embedding norm, although the variant ``peri-ln`` now has one."""
    import json

    model = tiny_model("peri-ln", embed_norm=False)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("embed_norm", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    loaded = load_model(tmp_path, tokenizer="byte").model
    assert loaded.config.embed_norm is False and loaded.model.embed_norm is None
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_under_mup_the_norm_gain_trains_at_the_base_rate():
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", num_hidden_layers=1, embed_norm=True,
                                                  parametrization="mup", mup_base_width=64))
    assert "model.embed_norm.weight" not in model.lr_multipliers()  # a per-feature gain: width-independent
