"""Models saved by earlier code load and compute what they computed then (issue 65, item 6): one small saved model
of every variant (tests/models/legacy/, written by its make.py at the commit in legacy/COMMIT, before the residual
designs became components of one interface) and a training run's checkpoint. Each loads through the library's
loader and the transformers Auto classes with the logits it had when it was saved, and generates the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deep_delta.hf import load_model
from deep_delta.variants import VARIANTS

LEGACY = Path(__file__).parent / "legacy"
SAVED = sorted(d.name for d in LEGACY.iterdir() if (d / "expected.safetensors").is_file())


def test_every_variant_has_a_saved_model():
    from deep_delta.designs.registry import BUILTIN

    shipped = {v for v, row in VARIANTS.items() if row.get("residual", "additive") in BUILTIN}  # not a user's own
    assert shipped <= set(SAVED) and "ddl-cc-embednorm" in SAVED
    assert (LEGACY / "COMMIT").read_text().strip()


@pytest.mark.parametrize("name", SAVED)
def test_a_saved_model_loads_with_its_logits_and_generates_the_same(name):
    from transformers import AutoModelForCausalLM

    import deep_delta.models  # noqa: F401  (the Auto classes)

    want = load_file(str(LEGACY / name / "expected.safetensors"))
    model = load_model(LEGACY / name, tokenizer="byte").model.eval()
    with torch.no_grad():
        assert torch.equal(model(want["ids"]).logits, want["logits"])
        gen = model.generate(want["ids"][:1, :5], max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    assert torch.equal(gen, want["generated"])
    auto = AutoModelForCausalLM.from_pretrained(LEGACY / name).eval()
    with torch.no_grad():  # memory-mapped weights may round differently (~1e-7): see test_hf_roundtrip
        torch.testing.assert_close(auto(want["ids"]).logits, want["logits"], rtol=0, atol=2e-6)


def test_a_training_run_of_before_loads_from_its_checkpoint():
    want = load_file(str(LEGACY / "run-ddl-cc.expected.safetensors"))
    model = load_model(LEGACY / "run-ddl-cc", tokenizer="byte").model.eval()
    with torch.no_grad():
        assert torch.equal(model(want["ids"]).logits, want["logits"])
