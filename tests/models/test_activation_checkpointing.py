"""Activation checkpointing per block (issue 9): transformers' ``activation_checkpointing_enable()`` and the
training setting ``activation_checkpointing``.

A checkpointed block keeps only its inputs for backward and runs its forward again there, so the loss and
every gradient equal the plain run's (up to the order of gradient accumulation into shared weights).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.variants import VARIANTS
from helpers import DEBUG


def build(variant: str, **overrides) -> DDLForCausalLM:
    torch.manual_seed(0)
    return DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **{**DEBUG, **overrides})).train()


def loss_and_grads(model: DDLForCausalLM, ids: torch.Tensor, mask: torch.Tensor | None = None):
    model.zero_grad(set_to_none=True)
    loss = model(ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def count_recomputes(model: DDLForCausalLM) -> list[int]:
    """Forward calls of each block's attention branch (a checkpointed block runs it again in backward)."""
    calls = [0] * len(model.model.layers)
    for i, block in enumerate(model.model.layers):
        block.attn.branch.register_forward_pre_hook(lambda m, a, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


def assert_same(got, want, rtol=1e-6, atol=1e-7):
    (loss_g, grads_g), (loss_w, grads_w) = got, want
    torch.testing.assert_close(loss_g, loss_w, rtol=0, atol=0)
    assert grads_g.keys() == grads_w.keys()
    for name in grads_w:
        torch.testing.assert_close(grads_g[name], grads_w[name], rtol=rtol, atol=atol, msg=name)


# the state rebuild inverts the delta update: the write-only controls refuse it (their config says so)
CASES = [(v, r) for v in VARIANTS for r in (False, True) if not (r and VARIANTS[v].get("update_rule") == "write")]


@pytest.mark.parametrize(("variant", "recompute"), CASES,
                         ids=[f"{v}-{'recompute_states' if r else 'plain'}" for v, r in CASES])
def test_checkpointed_gradients_equal_the_plain_run(variant, recompute):
    ids = torch.randint(0, 64, (2, 12))
    # reference: no checkpointing and no state rebuild (recompute_states rounds its rebuilt states)
    want = loss_and_grads(build(variant), ids)
    model = build(variant, recompute_states=recompute)
    assert model.supports_gradient_checkpointing
    model.activation_checkpointing_enable()
    assert all(block.gradient_checkpointing for block in model.model.layers)
    calls = count_recomputes(model)
    got = loss_and_grads(model, ids)
    assert calls == [2] * len(calls)  # each block ran twice: forward, and again in backward
    assert_same(got, want)


@pytest.mark.parametrize("variant", ["ddl-cc", "ddl-tc"])
def test_checkpointed_gradients_with_padding(variant):
    ids = torch.randint(0, 64, (2, 12))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    want = loss_and_grads(build(variant), ids, mask)
    model = build(variant)
    model.activation_checkpointing_enable()
    assert_same(loss_and_grads(model, ids, mask), want)


def test_the_deprecated_name_and_disable():
    model = build("ddl-cc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5: the old name is a deprecated alias
        model.gradient_checkpointing_enable()
    assert model.is_activation_checkpointing
    model.activation_checkpointing_disable()
    assert not model.is_activation_checkpointing
    calls = count_recomputes(model)
    loss_and_grads(model, torch.randint(0, 64, (2, 8)))
    assert calls == [1] * len(calls)


def test_eval_and_cached_generation_are_unchanged():
    """Checkpointing only acts in training mode; decoding with the cache is the plain model's."""
    plain = build("ddl-tc").eval()
    model = build("ddl-tc")
    model.activation_checkpointing_enable()
    model.eval()
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        want = plain.generate(ids, max_new_tokens=4, do_sample=False)
        got = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)
