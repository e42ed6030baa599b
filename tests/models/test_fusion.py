"""The delta design's fusion plan on its own (``deep_delta.designs.delta.fusion``): which sublayer's update emits what, for the
variants, both backends, the switch of the next norm, a cache, pads, the state tape and the model's and blocks'
``fuse_reads``. Each expectation is written out, not derived from the rules: "R" the next sublayer's read, "I" its
inputs (norm, gate and value), "-" nothing; one pair (attention, MLP) per block. That a plan changes no value is
tests/ops/test_kernels_fused_model.py's, test_update_and_norm.py's and tests/train/test_pinned_results.py's.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from deep_delta import DDLConfig, DDLForCausalLM  # noqa: E402
from deep_delta.designs.delta import fusion  # noqa: E402
from deep_delta.layers.carry import unfused as unfused_plan  # noqa: E402
from deep_delta.models.ddl.cache import DDLCache  # noqa: E402
from deep_delta.ops.delta.recompute import StateTape  # noqa: E402

LAYERS = 3
CODE = {"nothing": "-", "read": "R", "inputs": "I"}


def _model(variant: str, backend: str) -> DDLForCausalLM:
    return DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", num_hidden_layers=LAYERS, hidden_size=32,
                                                 num_attention_heads=2, vocab_size=64, delta_backend=backend))


def _state(model):
    shape = (2, 5, 32) + ((model.config.value_channels,) if model.config.value_channels > 1 else ())
    return torch.zeros(shape)


def _code(plan) -> str:
    return " ".join(CODE[a.what] + CODE[m.what] for a, m in plan)


def _plan(model, cache=None, pads=False):
    pad_mask = torch.ones(2, 5) if pads else None
    return fusion.plan(model.model, _state(model), cache, pad_mask)


# (variant, backend, next norm switched on) -> the plan of a training forward (no cache, no pads)
TRAINING = {
    ("baseline", "triton", True): "-- -- --",
    ("ddl-dv1", "torch", True): "-- -- --",
    ("ddl-dv1", "triton", False): "-- -- --",
    ("ddl-dv1", "triton", True): "II II I-",
    ("ddl-dv1-vmap", "triton", True): "-- -- --",  # the v-Map computes its inputs from the branch: no fused norm
    ("ddl-dv1-write", "triton", True): "-- -- --",  # the write-only control never fuses
    ("ddl-cc", "torch", True): "RR RR RR",
    ("ddl-cc", "triton", False): "RR RR RR",
    ("ddl-cc", "triton", True): "II II IR",
    ("ddl-cc-write", "triton", True): "RR RR RR",
    ("ddl-tc", "torch", True): "RR RR RR",
    ("ddl-tc", "triton", True): "RR RR RR",  # no fused norm through a token read
    ("ddl-tc-write", "torch", True): "RR RR RR",
    ("hc", "triton", True): "-- -- --",
}


@pytest.mark.parametrize(("variant", "backend", "fuse_norm"), list(TRAINING), ids=str)
def test_the_plan_of_a_training_forward(variant, backend, fuse_norm, set_switches):
    set_switches(fuse_next_norm=fuse_norm)
    model = _model(variant, backend)
    assert _code(_plan(model)) == TRAINING[(variant, backend, fuse_norm)]
    read = model.model.layers
    plan = _plan(model)
    if TRAINING[(variant, backend, fuse_norm)].endswith("R"):  # what each emit reads with and computes for
        assert plan[0][0].read is read[0].compressor and plan[0][1].read is read[1].compressor
        assert plan[-1][1].read is model.model.final_compressor
    if "I" in TRAINING[(variant, backend, fuse_norm)]:
        assert plan[0][0].nxt is read[0].mlp and plan[0][1].nxt is read[1].attn


# the write-only and untied rules: with the fused_rules switch on the plan of their delta variant (fused exactly where it
# is); off, as before the switch (the plan still names the reads, which the update then takes apart: _emit)
RULES = {
    ("ddl-dv1-write", True): "II II I-", ("ddl-dv1-write", False): "-- -- --",
    ("ddl-dv1-untied", True): "II II I-", ("ddl-dv1-untied", False): "-- -- --",
    ("ddl-cc-write", True): "II II IR", ("ddl-cc-write", False): "RR RR RR",
    ("ddl-cc-untied", True): "II II IR", ("ddl-cc-untied", False): "RR RR RR",
    ("ddl-tc-write", True): "RR RR RR", ("ddl-tc-untied", True): "RR RR RR",
}


@pytest.mark.parametrize(("variant", "fused_rules"), list(RULES), ids=str)
def test_the_plan_of_the_other_rules(variant, fused_rules, set_switches):
    set_switches(fuse_next_norm=True)
    set_switches(fused_rules=fused_rules)
    assert _code(_plan(_model(variant, "triton"))) == RULES[(variant, fused_rules)]
    assert _code(_plan(_model(variant, "torch"))) == ("-- -- --" if "dv1" in variant else "RR RR RR")


@pytest.mark.parametrize(("variant", "cached", "pads", "want"), [
    ("ddl-cc", True, False, "II II IR"),   # decoding an unpadded batch: a CC read needs no token history
    ("ddl-cc", False, True, "RR RR RR"),   # pads: reads only (the state is masked between the two)
    ("ddl-cc", True, True, "RR RR RR"),
    ("ddl-tc", True, False, "-- -- --"),   # a token read with history is not fused
    ("ddl-tc", False, True, "-- -- --"),   # nor with pads
    ("ddl-dv1", True, False, "II II I-"),
    ("ddl-dv1", False, True, "II II I-"),  # d_v = 1 has no read to mask
], ids=str)
def test_cache_and_pads(variant, cached, pads, want, set_switches):
    set_switches(fuse_next_norm=True)
    model = _model(variant, "triton")
    assert _code(_plan(model, DDLCache() if cached else None, pads)) == want


def test_a_recording_state_tape_turns_the_fused_norms_off(set_switches):
    set_switches(fuse_next_norm=True)
    for variant, want in (("ddl-dv1", "-- -- --"), ("ddl-cc", "RR RR RR")):
        model = _model(variant, "triton")
        with StateTape():
            assert _code(_plan(model)) == want, variant


def test_the_switches_of_model_and_blocks(set_switches):
    set_switches(fuse_next_norm=True)
    model = _model("ddl-cc", "triton")
    model.model.fuse_reads = False  # nothing across blocks (FSDP: each block reads inside its own unit)
    assert _code(_plan(model)) == "I- I- I-"
    model.model.fuse_reads = True
    # block 1's updates compute nothing for the sublayer after them; block 0's last update still computes block
    # 1's read (a read is block 1's input whoever computes it), but not its inputs
    model.model.layers[1].fuse_reads = False
    assert _code(_plan(model)) == "IR -- IR"
    assert _code(unfused_plan(LAYERS)) == "-- -- --"


def test_the_unfused_plan_is_what_the_model_runs_with_fuse_updates_off(monkeypatch):
    """``fuse_updates = False`` runs every update as a plain forward: the same loss and logits as the plan's."""
    model = _model("ddl-cc", "torch").eval()
    calls = []
    monkeypatch.setattr(fusion, "plan", lambda *a: calls.append(a) or unfused_plan(LAYERS))
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        unfused = model(ids).logits
    assert len(calls) == 1
    monkeypatch.undo()
    with torch.no_grad():
        fused = model(ids).logits
        model.model.fuse_updates = False
        off = model(ids).logits
    assert torch.equal(off, unfused) and torch.allclose(fused, unfused, atol=1e-6, rtol=1e-6)
