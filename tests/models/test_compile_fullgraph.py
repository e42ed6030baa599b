"""``torch.compile(fullgraph=True)`` of one block compiles without a graph break for every variant (issue 13).

A graph break (a host read, an unsupported Python construct) is an error under ``fullgraph=True``. CPU has
no fast compiler backend for a test, so the graphs run on ``aot_eager``: Dynamo traces the forward (the same
trace inductor would get) and AOTAutograd traces the backward; values and gradients equal the eager block.
"""

from __future__ import annotations

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.designs.delta import fusion
from deep_delta.layers.carry import Carry
from deep_delta.variants import VARIANTS
from helpers import DEBUG


def block_inputs(model: DDLForCausalLM, b: int = 2, t: int = 8):
    """A state of the model's design, made by the design from a random embedding (and for AttnRes, whose state is the
    tuple of sources, two more sources beside it), and the rotary tables."""
    cfg = model.config
    pos = torch.arange(t).unsqueeze(0).expand(b, t)
    with torch.no_grad():
        state = cfg.design.embed(model.model, torch.randn(b, t, cfg.hidden_size), None, None)
    if isinstance(state, tuple):  # the state is the tuple of sources: the embedding and two earlier outputs
        x = tuple(torch.randn(state[0].shape, requires_grad=True) for _ in range(3))
        return x, model.model.rotary(pos, x[0].dtype)
    x = torch.randn(state.shape, requires_grad=True)
    return x, model.model.rotary(pos, x.dtype)


def run_block(block, x, rope, **kwargs):
    """Forward, then backward of a fixed random projection of every output; returns outputs and grads."""
    state, carry = block(x, Carry(), rope, **kwargs)  # (x_new, what its last update computed for the next sublayer)
    outs = (list(state) if isinstance(state, tuple) else [state]) + ([carry.read] if carry.read is not None else [])
    g = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs)
    read = kwargs["emits"][1].read if "emits" in kwargs else None
    params = [p for p in block.parameters()] + [p for p in (read or torch.nn.Module()).parameters()]
    grads = torch.autograd.grad(loss, (list(x) if isinstance(x, tuple) else [x]) + params)
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_block_compiles_as_one_graph(variant):
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **DEBUG)).train()
    block = model.model.layers[0]
    x, rope = block_inputs(model)
    kwargs = {}
    if model.config.compressor == "channel":  # the model's fused path: the update also reads for the next block
        kwargs["emits"] = fusion.plan(model.model, x, None, None)[0]
        assert kwargs["emits"][1].read is model.model.layers[1].compressor
    torch._dynamo.reset()  # each variant is a new graph of the same DDLBlock.forward: stay under the recompile limit
    compiled = torch.compile(block, fullgraph=True, dynamic=False, backend="eager")
    want_out, want_grads = run_block(block, x, rope, **kwargs)
    got_out, got_grads = run_block(compiled, x, rope, **kwargs)
    assert len(got_out) == len(want_out) and len(got_grads) == len(want_grads)
    for got, want in zip(got_out + list(got_grads), want_out + list(want_grads)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- whole model, inductor

# Every variant, compiled with inductor (the default backend: C++ kernels on CPU) as one graph, forward and
# backward. The DDL update and the fused update + read are custom ops (deep_delta.ops.delta.library), opaque
# to the compiler; the other state ops are autograd Functions that Dynamo traces. Three variants per test to
# share a process's warm compiler; gcc at -O0 (TORCHINDUCTOR_DEBUG_COMPILE) because the C++ build dominates
# the time and this test checks the graph and its values, not the speed of the kernels.
# Tolerance: inductor reorders reductions (fp32), so loss rtol 1e-5 and gradients rtol 1e-4 / atol 1e-6.
VARIANT_GROUPS = [
    ("baseline", "ddl-dv1", "ddl-dv1-vmap"),
    ("ddl-cc", "ddl-cc-noec", "ddl-tc"),
    ("ddl-tc-noec", "hc", "hc-static"),
    ("mhc", "mhc-static", "ddl-dv1-write"),
    ("ddl-tc-write", "ddl-cc-write", "peri-ln"),
    ("ddl-dv1-untied", "ddl-tc-untied", "ddl-cc-untied"),
    ("attnres", "attnres-block"),
]


def test_variant_groups_cover_every_variant():
    assert sorted(v for group in VARIANT_GROUPS for v in group) == sorted(VARIANTS)


@pytest.mark.parametrize("variants", VARIANT_GROUPS, ids=["-".join(g) for g in VARIANT_GROUPS])
def test_whole_model_compiles_fullgraph_with_inductor(variants, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_DEBUG_COMPILE", "1")
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(0))
    for variant in variants:
        torch.manual_seed(0)
        # 3 Sinkhorn-Knopp rounds, not 20: mHC's lean backward recomputes the rounds (O(iters^2)) and the
        # unrolled graph was most of this test's time; the code path is the same
        # one block: the compiled graph holds the embedding's expansion, a block (with its fused read of the
        # final compressor for CC) and the readout, every op a two-block model has; a second block doubles the
        # trace and the C++ build for nothing new (test_block_compiles_as_one_graph covers the block-to-block read)
        sinkhorn = {"hc_sinkhorn_iters": 3} if VARIANTS[variant].get("residual") == "hyper" else {}
        model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **sinkhorn,
                                                      **{**DEBUG, "num_hidden_layers": 1})).train()
        loss = model(ids, labels=ids).loss
        loss.backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, dynamic=False)
        closs = compiled(ids, labels=ids).loss
        closs.backward()
        torch.testing.assert_close(closs, loss, rtol=1e-5, atol=1e-6, msg=lambda m, v=variant: f"{v} loss: {m}")
        for n, p in model.named_parameters():
            assert p.grad is not None, f"{variant}: {n} got no gradient under compile"
            torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-6, msg=lambda m, v=variant, n=n: f"{v} {n}: {m}")


# ----------------------------------------------------------------------------- the state rebuild under compile


def test_recompute_states_in_a_compiled_model_forward_is_refused():
    """The tape's saved-tensor hooks cannot be traced: a compiled DDLModel.forward says so instead of running
    without the rebuild (it used to switch the tape off silently)."""
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", recompute_states=True, **DEBUG)).train()
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 8))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="`recompute_states` cannot run inside a compiled DDLModel.forward"):
        torch.compile(model, fullgraph=True, backend="eager")(ids, labels=ids)


@pytest.mark.parametrize("variant", ["ddl-dv1", "ddl-cc", "ddl-tc"])
def test_recompute_states_with_compiled_blocks(variant):
    """Blocks compiled one by one (as ``ddl train --compile`` does), the tape around them: the custom ops record
    their updates when the compiled code runs, so saved states become rebuild handles, and the gradients equal
    the eager run without the tape to the rebuild's rounding (tests/ops/test_kernels_recompute.py: 1e-3)."""
    from deep_delta.ops.delta.recompute import observe

    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **DEBUG)).train()
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(0))
    model(ids, labels=ids).loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.model.recompute_states = True
    torch._dynamo.reset()
    for block in model.model.layers:
        block.compile(fullgraph=True, backend="aot_eager")
    kept = []
    with observe(kept):
        loss = model(ids, labels=ids).loss
    handles = sum(not isinstance(obj, torch.Tensor) for obj in kept)
    assert handles >= 2, f"{variant}: {handles} saved states are rebuild handles under compiled blocks"
    loss.backward()
    for n, p in model.named_parameters():
        rel = ((p.grad - want[n]).norm() / (want[n].norm() + 1e-30)).item()
        assert rel <= 1e-3, f"{variant} {n}: relative gradient error {rel:.2e} with the rebuild under compile"
