"""Attention Residuals (issue 56): the block partition, the layer against a plain reference (values and
gradients), Full AttnRes at initialisation as the pre-norm baseline, the Block form's sources, the readout,
and ``ddl analyze``'s depth weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.layers import AttnResidual, DepthReadout, block_starts
from deep_delta.ops.depth import depth_attention_reference
from helpers import DEBUG


def test_block_starts_split_the_sublayers_into_near_equal_blocks():
    assert block_starts(4, None) == (True, True, True, True)  # Full: a block per sublayer
    assert block_starts(16, 8) == (True, False) * 8  # 8 blocks of 2
    assert block_starts(24, 8) == (True, False, False) * 8  # the paper's 8 blocks of a 12-layer model
    assert block_starts(5, 2) == (True, False, False, True, False)
    assert block_starts(4, 8) == block_starts(4, None)  # more blocks than sublayers: Full
    assert block_starts(6, 1) == (True,) + (False,) * 5  # one block: the running sum, read with the embedding
    with pytest.raises(ValueError, match="`blocks` got 0"):
        block_starts(4, 0)


def _reference_forward(layer: AttnResidual, sources, branch_args=()):
    """The layer written out with the plain reference of the depth attention."""
    h = depth_attention_reference(sources, layer.query, layer.key_norm.weight, layer.key_norm.eps)
    out = layer.branch(layer.norm(h), *branch_args)
    return (*sources, out) if layer.starts_block else (*sources[:-1], sources[-1] + out)


@pytest.mark.parametrize("starts", [True, False])
def test_the_layer_equals_its_reference_values_and_gradients(starts):
    torch.manual_seed(0)
    layer = AttnResidual(16, nn.Linear(16, 16), starts_block=starts)
    with torch.no_grad():
        layer.query.normal_()
        layer.key_norm.weight.add_(0.2 * torch.randn(16))
    sources = tuple(torch.randn(2, 5, 16, requires_grad=True) for _ in range(3))
    got, want = layer(sources), _reference_forward(layer, sources)
    assert len(got) == (4 if starts else 3)
    params = [layer.query, layer.key_norm.weight, *layer.branch.parameters(), *sources]
    g = [torch.randn_like(t) for t in got]
    got_grads = torch.autograd.grad(got, params, g)
    want_grads = torch.autograd.grad(want, params, g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_state_is_a_tuple_of_sources():
    layer = AttnResidual(8, nn.Identity())
    with pytest.raises(ValueError, match="expected the state as a non-empty tuple of sources"):
        layer(torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"expected sources of shape \(\.\.\., 8\), got \(2, 4\)"):
        layer((torch.randn(2, 4),))


def test_full_attnres_at_initialisation_is_the_prenorm_baseline():
    """Zero queries read the plain mean of the sources, the baseline's running sum over their count, which each
    sublayer's RMSNorm cancels: with the norms' eps near 0 the two models compute the same (the same seed draws
    the same weights: AttnRes's own parameters draw nothing)."""
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 10), generator=torch.Generator().manual_seed(1))
    out = {}
    for variant in ("baseline", "attnres"):
        torch.manual_seed(0)
        model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **{**DEBUG, "rms_norm_eps": 1e-12})).eval()
        out[variant] = model(ids).logits
    torch.testing.assert_close(out["attnres"], out["baseline"], rtol=1e-4, atol=1e-5)
    # and with the default eps the two differ (a check that the comparison above can fail)
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("attnres", "tiny", **{**DEBUG, "rms_norm_eps": 1e-2})).eval()
    assert (model(ids).logits - out["baseline"]).abs().max() > 1e-3


@pytest.mark.parametrize(("blocks", "sources"), [(None, 9), (8, 9), (3, 4), (1, 2)])
def test_the_readout_sees_the_embedding_and_one_source_per_block(blocks, sources):
    """4 layers = 8 sublayers: Full AttnRes ends with the embedding and 8 outputs, Block AttnRes with the embedding and
    one sum per block; the readout is the depth attention over them with its own query."""
    torch.manual_seed(0)
    cfg = DDLConfig.from_variant("attnres" if blocks is None else "attnres-block", "tiny",
                                 **{**DEBUG, "num_hidden_layers": 4, "attnres_blocks": blocks})
    model = DDLForCausalLM(cfg).eval()
    seen = {}
    readout = model.model.final_compressor
    assert isinstance(readout, DepthReadout)
    readout.register_forward_hook(lambda mod, args, out: seen.update(sources=args[0], read=out[0]))
    with torch.no_grad():
        readout.query.normal_()
        model(torch.randint(0, DEBUG["vocab_size"], (2, 6)))
    assert len(seen["sources"]) == sources
    want = depth_attention_reference(seen["sources"], readout.query, readout.key_norm.weight, readout.key_norm.eps)
    torch.testing.assert_close(seen["read"], want)
    # the sources sum to what the baseline's residual stream would hold: the embedding plus every output
    assert torch.isfinite(torch.stack(seen["sources"])).all()


def test_the_block_sums_are_the_sums_of_the_block_outputs():
    torch.manual_seed(0)
    cfg = DDLConfig.from_variant("attnres-block", "tiny", **{**DEBUG, "num_hidden_layers": 3, "attnres_blocks": 2})
    model = DDLForCausalLM(cfg).eval()
    outputs, final = [], {}
    for block in model.model.layers:
        for sub in (block.attn, block.mlp):
            sub.branch.register_forward_hook(lambda mod, args, out: outputs.append(out))
    model.model.final_compressor.register_forward_hook(lambda mod, args, out: final.update(s=args[0]))
    with torch.no_grad():
        model(torch.randint(0, DEBUG["vocab_size"], (1, 5)))
    assert block_starts(6, 2) == (True, False, False, True, False, False)
    e, b1, b2 = final["s"]
    torch.testing.assert_close(b1, outputs[0] + outputs[1] + outputs[2])
    torch.testing.assert_close(b2, outputs[3] + outputs[4] + outputs[5])


def test_analyze_reports_the_depth_weights(tmp_path):
    from deep_delta.experiments.analyze import analyze_model, format_analysis, plot_analysis

    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("attnres", "tiny", **DEBUG)).eval()
    report = analyze_model(model, [torch.randint(0, DEBUG["vocab_size"], (2, 8))])
    depth = report["depth"]
    assert list(depth)[-1] == "model.final_compressor" and depth["model.layers.0.attn"]["sources"] == 1
    # at initialisation the weights are uniform: 1/n on every source
    for r in depth.values():
        assert r["weights_mean"] == pytest.approx([1 / r["sources"]] * r["sources"])
    assert "| sublayer | sources | on the embedding | on the newest | entropy / log n |" in format_analysis(report)
    pytest.importorskip("matplotlib")
    assert [p.name for p in plot_analysis(report, tmp_path)] == ["depth_weights.png"]
