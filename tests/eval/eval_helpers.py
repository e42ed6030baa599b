"""Runs and byte-level data for the evaluation tests (everything in tmp_path, offline)."""

from __future__ import annotations

from pathlib import Path

from deep_delta import DDLForCausalLM
from helpers import tiny_model


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
