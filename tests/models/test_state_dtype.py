"""The residual state stored in lower precision (``DDLConfig.state_dtype``), against the fp64 model.

``state_dtype="bfloat16"`` keeps the state that passes between sublayers (the DDL (d, d_v) state, the
baseline's residual stream) in bf16: half the bytes every kernel reads and writes. Every read of it is
computed in the model's dtype and every kernel accumulates in fp32, so the model stays close to the same
weights run in fp64. Measured on the 2-core CPU (debug shape, weights perturbed off their init, 2 x 12
tokens), relative to the fp64 model: logits 0.6-0.9%, loss within 2.5e-3 nats, gradients (all parameters as
one vector) 0.8-2.2%, the lean path and the Triton kernels (interpreter) alike; an fp32 state is at 2e-6.
Tolerances: three times the largest of these (logits 3%, loss 1e-2, gradients 6%).
"""

from __future__ import annotations

import os
import types

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from deep_delta.models import DDLForCausalLM  # noqa: E402
from deep_delta.models.ddl import output_cache  # noqa: E402
from deep_delta.variants import VARIANTS  # noqa: E402
from helpers import debug_config, rel_error, tiny_model  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton cases (the interpreter on CPU)
STORED = [v for v, row in VARIANTS.items() if row.get("residual") != "hyper"]


def _states(model) -> list[torch.dtype]:
    """Installs hooks that record the dtype of every block's output state; returns the list they fill."""
    seen: list[torch.dtype] = []
    for block in model.model.layers:
        # an AttnRes state is its tuple of sources: every one is stored in the state's dtype
        block.register_forward_hook(lambda mod, args, out: seen.extend(
            t.dtype for t in (out[0] if isinstance(out[0], tuple) else (out[0],))))
    return seen


def _loss_grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    grads = torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])
    return out, grads



CASES = [(v, "torch") for v in STORED] + [("ddl-cc", "triton"), ("ddl-tc", "triton")]


@pytest.mark.parametrize(("variant", "backend"), CASES)
def test_bf16_state_close_to_fp64(variant, backend):
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    device = DEVICE if backend == "triton" else "cpu"
    model = tiny_model(variant, state_dtype="bfloat16", delta_backend=backend).to(device).train()
    seen = _states(model)
    out, grads = _loss_grads(model, ids.to(device))
    out.logits, grads = out.logits.cpu(), grads.cpu()
    assert seen and set(seen) == {torch.bfloat16}, seen
    assert out.logits.dtype == torch.float32  # the readout is computed in the model's dtype
    ref = tiny_model(variant).double().train()
    ref_out, ref_grads = _loss_grads(ref, ids)
    assert rel_error(out.logits, ref_out.logits) < 0.03
    assert abs(out.loss.item() - ref_out.loss.item()) < 1e-2
    assert rel_error(grads, ref_grads) < 0.06


def test_default_state_is_the_embeddings_dtype_and_cpu_autocast_keeps_it():
    model = DDLForCausalLM(debug_config("ddl-cc")).train()
    seen = _states(model)
    ids = torch.randint(0, 64, (2, 8))
    model(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids)
    assert set(seen) == {torch.float32}


def test_auto_is_the_autocast_dtype_for_a_wide_state_under_cuda_autocast(monkeypatch):
    """"auto" on CUDA (no GPU here: the autocast query is stubbed) gives the autocast dtype to d_v > 1 only."""
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device=None: device == "cuda")
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device: torch.bfloat16)
    cuda = types.SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)
    cpu = types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)

    def state_dtype(config, embeds):  # the design's rule
        return config.design.state_dtype(config, embeds)

    assert state_dtype(debug_config("ddl-cc"), cuda) == torch.bfloat16
    assert state_dtype(debug_config("ddl-tc"), cuda) == torch.bfloat16
    assert state_dtype(debug_config("ddl-dv1"), cuda) == torch.float32
    assert state_dtype(debug_config("baseline"), cuda) == torch.float32
    assert state_dtype(debug_config("ddl-cc"), cpu) == torch.float32
    assert state_dtype(debug_config("ddl-cc", state_dtype="float32"), cuda) == torch.float32
    assert state_dtype(debug_config("ddl-dv1", state_dtype="float16"), cpu) == torch.float16


def test_cached_generation_with_a_bf16_state_matches_the_full_forward():
    torch.manual_seed(0)
    model = tiny_model("ddl-tc", state_dtype="bfloat16")
    ids = torch.randint(0, 320, (1, 10))
    with torch.no_grad():
        full = model(ids).logits[:, -1]
        out = model(ids[:, :6], use_cache=True)
        cache = output_cache(out)
        for t in range(6, 10):
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
    assert (out.logits[:, -1] - full).abs().max().item() < 1e-4


@pytest.mark.parametrize("bad", ["bf16", "float64", ""])
def test_unknown_state_dtype_is_refused(bad):
    with pytest.raises(ValueError, match="`state_dtype` got"):
        debug_config("ddl-cc", state_dtype=bad)


def test_hyper_connections_refuse_a_stored_dtype():
    with pytest.raises(ValueError, match="`state_dtype` got 'bfloat16'.*residual='hyper'"):
        debug_config("hc", state_dtype="bfloat16")
