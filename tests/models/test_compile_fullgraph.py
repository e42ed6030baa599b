"""``torch.compile(fullgraph=True)`` of one block compiles without a graph break for every variant (issue 13).

A graph break (a host read, an unsupported Python construct) is an error under ``fullgraph=True``. CPU has
no fast compiler backend for a test, so the graphs run on ``aot_eager``: Dynamo traces the forward (the same
trace inductor would get) and AOTAutograd traces the backward; values and gradients equal the eager block.
"""

from __future__ import annotations

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.variants import VARIANTS
from helpers import DEBUG


def block_inputs(model: DDLForCausalLM, b: int = 2, t: int = 8):
    cfg = model.config
    channels = cfg.hc_streams if cfg.is_hyper else cfg.value_channels if cfg.value_channels > 1 else None
    shape = (b, t, cfg.hidden_size) + ((channels,) if channels else ())
    x = torch.randn(shape, requires_grad=True)
    pos = torch.arange(t).unsqueeze(0).expand(b, t)
    return x, model.model.rotary(pos, x.dtype)


def run_block(block, x, rope, **kwargs):
    """Forward, then backward of a fixed random projection of every output; returns outputs and grads."""
    outs = [o for o in block(x, None, rope, **kwargs) if o is not None]  # (x_new, x_in_next or None)
    g = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs)
    params = [p for p in block.parameters()] + [p for p in (kwargs.get("next_read") or torch.nn.Module()).parameters()]
    grads = torch.autograd.grad(loss, [x] + params)
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_block_compiles_as_one_graph(variant):
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **DEBUG)).train()
    block = model.model.layers[0]
    x, rope = block_inputs(model)
    kwargs = {}
    if model.config.compressor == "channel":  # the model's fused path: the update also reads for the next block
        kwargs["next_read"] = model.model.layers[1].compressor
    torch._dynamo.reset()  # each variant is a new graph of the same DDLBlock.forward: stay under the recompile limit
    compiled = torch.compile(block, fullgraph=True, dynamic=False, backend="eager")
    want_out, want_grads = run_block(block, x, rope, **kwargs)
    got_out, got_grads = run_block(compiled, x, rope, **kwargs)
    assert len(got_out) == len(want_out) and len(got_grads) == len(want_grads)
    for got, want in zip(got_out + list(got_grads), want_out + list(want_grads)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
