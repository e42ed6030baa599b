"""Tiny models, runs and byte-level data for the evaluation tests (everything in tmp_path, offline)."""

from __future__ import annotations

from pathlib import Path

import torch

from deep_delta import DDLConfig, DDLForCausalLM

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=320, max_position_embeddings=64)


def tiny_model(variant: str = "ddl-cc", seed: int = 0, **overrides) -> DDLForCausalLM:
    """A tiny model with weights moved off their init (so every branch matters), in eval mode."""
    torch.manual_seed(seed)
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **{**TINY, **overrides}))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def make_run(root: Path, variant: str = "ddl-cc", tokenizer: str = "byte", **overrides) -> tuple[Path, DDLForCausalLM]:
    """A training-run directory written with the trainer's own checkpoint writer."""
    from deep_delta.train.checkpoint import save_checkpoint

    model = tiny_model(variant, **overrides)
    save_checkpoint(root, 5, save_model=lambda d: model.save_pretrained(d), train_state={"step": 5},
                    meta={"variant": variant, "preset": "tiny", "tokenizer": tokenizer})
    return root, model


def make_byte_data(root: Path) -> Path:
    """Train/val byte shards of English text (~5,000 tokens, ~1,000 of them in val)."""
    from pydoc_data.topics import topics

    from deep_delta.data import ByteTokenizer, write_dataset

    docs = [topics[k][:800] for k in sorted(topics)[:6]]
    write_dataset(docs, ByteTokenizer(), root, val_fraction=0.2)
    return root
