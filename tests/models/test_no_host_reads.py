"""The model's default forward and backward read no tensor value on the host (issue 13).

A host read (``.item()``, ``int(t)``, ``bool(t)``, ...) of a CUDA tensor waits for the GPU and breaks CUDA
graphs and ``torch.compile(fullgraph=True)``. On CPU we make every such conversion raise while a step runs,
for every variant: a training step (forward and backward, no mask), a forward with an attention mask of a
batch without padding, and one cached decoding step. ``validate_inputs=True`` brings the range check back.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.models.ddl import output_cache
from deep_delta.variants import VARIANTS
from helpers import DEBUG

HOST_READS = ("item", "tolist", "__int__", "__bool__", "__float__", "__index__")


class HostRead(AssertionError):
    pass


@contextlib.contextmanager
def no_host_reads():
    """Every Tensor -> Python value conversion raises :class:`HostRead` inside the block."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def forbid(name):
        def raiser(self, *args, **kwargs):
            raise HostRead(f"host read: Tensor.{name} on a tensor of shape {tuple(self.shape)}")

        return raiser

    for name in HOST_READS:
        setattr(torch.Tensor, name, forbid(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


def build(variant: str, **overrides) -> DDLForCausalLM:
    torch.manual_seed(0)
    return DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **{**DEBUG, **overrides}))


def test_the_guard_catches_host_reads():
    t = torch.tensor([3])
    with no_host_reads():
        for read in (lambda: t.item(), lambda: int(t), lambda: bool(t), lambda: float(t), lambda: t.tolist(),
                     lambda: [0, 1, 2, 3, 4][t]):
            with pytest.raises(HostRead):
                read()
    assert int(t) == 3  # restored


# the state rebuild inverts the delta update: the write-only controls refuse it (their config says so)
CASES = [(v, r) for v in VARIANTS for r in (False, True) if not (r and VARIANTS[v].get("update_rule") == "write")]


@pytest.mark.parametrize(("variant", "recompute"), CASES,
                         ids=[f"{v}-{'recompute_states' if r else 'plain'}" for v, r in CASES])
def test_train_step_reads_nothing_on_the_host(variant, recompute):
    model = build(variant, recompute_states=recompute).train()
    ids = torch.randint(0, 64, (2, 12))
    with no_host_reads():
        loss = model(ids, labels=ids).loss
        loss.backward()
    assert torch.isfinite(loss.detach()).all()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_masked_forward_and_cached_step_read_nothing_on_the_host(variant):
    model = build(variant).eval()
    ids = torch.randint(0, 64, (2, 8))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = model(ids).logits
        with no_host_reads():
            masked = model(ids, attention_mask=mask).logits
            out = model(ids, attention_mask=mask, use_cache=True)
            nxt = torch.randint(0, 64, (2, 1))
            step = model(nxt, attention_mask=torch.ones(2, 9, dtype=torch.long), cache=output_cache(out),
                         use_cache=True).logits
        full = model(torch.cat([ids, nxt], 1)).logits
    torch.testing.assert_close(masked, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


def test_out_of_range_ids_fail_with_the_embedding_index_error_by_default():
    model = build("ddl-cc").eval()
    for bad in (64, -1):
        ids = torch.tensor([[1, 2, bad]])
        with pytest.raises(IndexError, match="index out of range"):
            model(ids)


def test_validate_inputs_keeps_the_range_check():
    model = build("ddl-cc", validate_inputs=True).eval()
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, vocab_size=64\), got range \[1, 64\]"):
        model(torch.tensor([[1, 2, 64]]))
    with pytest.raises(ValueError, match=r"got range \[-1, 2\]"):
        model(torch.tensor([[-1, 2]]))
    assert model(torch.tensor([[0, 63]])).logits.shape == (1, 2, 64)


def test_validate_inputs_is_a_checked_config_field():
    assert DDLConfig().validate_inputs is False
    with pytest.raises(ValueError, match="`validate_inputs` got 'yes'"):
        DDLConfig(validate_inputs="yes")
