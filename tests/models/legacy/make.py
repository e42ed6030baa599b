"""Writes the small saved models that tests/models/test_legacy_models.py loads: one per variant, made by the code
of before the residual-interface refactor (issue 65; commit ee2c356), so that the test shows a model saved then
still loads with identical logits. Run from the repository root: ``python tests/models/legacy/make.py``.

Each ``<variant>/`` holds what ``save_pretrained`` wrote (config.json, model.safetensors) and ``expected.safetensors``:
the token ids, the logits of the model that was saved, and its greedy continuation with the cache."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import torch
from safetensors.torch import save_file

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.variants import VARIANTS

HERE = Path(__file__).parent
SHAPE = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32, vocab_size=320)


def make(variant: str, extra: dict) -> None:
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **SHAPE, **extra))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    model.eval()
    name = variant + ("-embednorm" if extra else "")
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out)
    for extra_file in out.glob("generation_config.json"):
        extra_file.unlink()
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 12), generator=g)
    with torch.no_grad():
        logits = model(ids).logits
        gen = model.generate(ids[:1, :5], max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
    save_file({"ids": ids, "logits": logits.contiguous(), "generated": gen.contiguous()},
              str(out / "expected.safetensors"))


def make_run() -> None:
    """A training run of ddl-cc (2 steps on the embedded text) whose checkpoint loads as a model (``load_model(run)``)
    and resumes; its expected logits beside it."""
    from deep_delta.cli.main import main
    from deep_delta.hf import load_model

    out = HERE / "run-ddl-cc"
    shutil.rmtree(out, ignore_errors=True)
    sets = [x for k, v in SHAPE.items() for x in ("--set", f"model.{k}={v}")]
    assert main(["train", "--config", "debug/ddl-cc", "--steps", "2", "--eval-every", "0", "--save-every", "2",
                 "--threads", "1", "--no-progress", "--out", str(out), *sets]) == 0
    model = load_model(out, tokenizer="byte").model.eval()
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        save_file({"ids": ids, "logits": model(ids).logits.contiguous()}, str(HERE / "run-ddl-cc.expected.safetensors"))


if __name__ == "__main__":
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    for v in VARIANTS:
        make(v, {})
    make("ddl-cc", {"embed_norm": True})
    make_run()
    (HERE / "COMMIT").write_text(commit + "\n")
    print(f"wrote {len(VARIANTS) + 1} models at {commit} into {HERE}")
