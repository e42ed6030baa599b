"""Peri-LN (issues 56, 64): the baseline with a learned RMSNorm on each sublayer's output before the add,
``x + norm_out(F(norm_in(x)))``, and one on the embedding (the paper's form); nothing else differs from the
baseline."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.layers import NormedBranch
from helpers import DEBUG


def test_normed_branch_is_the_norm_of_the_branch_and_passes_arguments():
    inner = nn.Linear(8, 8)
    branch = NormedBranch(inner, 8)
    with torch.no_grad():
        branch.norm.weight.uniform_(0.5, 1.5)
    c = torch.randn(3, 8)
    torch.testing.assert_close(branch(c), nn.functional.rms_norm(inner(c), (8,), branch.norm.weight, 1e-5))

    class Two(nn.Module):
        def forward(self, c, scale, *, shift):
            return c * scale + shift

    torch.testing.assert_close(NormedBranch(Two(), 8)(c, 2.0, shift=1.0), NormedBranch(nn.Identity(), 8)(c * 2 + 1))


def test_a_peri_ln_sublayer_is_x_plus_the_normed_branch_of_the_normed_input():
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("peri-ln", "tiny", **DEBUG)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, 5, DEBUG["hidden_size"])
    inner, out_norm = mlp.branch.inner, mlp.branch.norm
    want = x + out_norm(inner(mlp.norm(x)))
    torch.testing.assert_close(mlp(x), want)


def test_peri_ln_is_the_baseline_with_output_norms_and_an_embedding_norm_and_nothing_else():
    torch.manual_seed(0)
    base = DDLForCausalLM(DDLConfig.from_variant("baseline", "tiny", **DEBUG))
    torch.manual_seed(0)
    peri = DDLForCausalLM(DDLConfig.from_variant("peri-ln", "tiny", **DEBUG))
    assert peri.config.embed_norm and peri.config.output_norm and not base.config.embed_norm
    bs, ps = base.state_dict(), peri.state_dict()
    new = [k for k in ps if ".branch.norm." in k or k.startswith("model.embed_norm.")]
    renamed = {k.replace(".branch.inner.", ".branch."): v for k, v in ps.items() if k not in new}
    assert set(renamed) == set(bs)
    for k, v in bs.items():
        assert torch.equal(renamed[k], v), k  # the same seed draws the same weights
    assert len(new) == 2 * DEBUG["num_hidden_layers"] + 1 and "model.embed_norm.weight" in new
    assert all(torch.equal(ps[k], torch.ones_like(ps[k])) for k in new)


def test_peri_ln_norms_the_embedding_before_the_first_sublayer():
    torch.manual_seed(0)
    peri = DDLForCausalLM(DDLConfig.from_variant("peri-ln", "tiny", **DEBUG)).eval()
    seen = []
    peri.model.layers[0].attn.register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 7))
    with torch.no_grad():
        peri(ids)
    want = nn.functional.rms_norm(peri.model.embed_tokens(ids), (DEBUG["hidden_size"],),
                                  peri.model.embed_norm.weight, peri.config.rms_norm_eps)
    torch.testing.assert_close(seen[0], want, rtol=0, atol=0)


@pytest.mark.parametrize("residual", ["delta", "hyper", "attnres"])
def test_the_output_norm_belongs_to_the_additive_baseline(residual):
    extra = {"value_channels": 1} if residual == "delta" else {}
    with pytest.raises(ValueError, match=f"`output_norm` got True; allowed: its default \\(False\\) with "
                       f"residual='{residual}': it is a setting of the design 'additive'"):
        DDLConfig(residual=residual, output_norm=True, **extra)
