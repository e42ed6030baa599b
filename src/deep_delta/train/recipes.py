"""The shipped training recipes: each a function returning the settings in which it differs from
``TrainConfig``'s defaults (nothing else), as torchtitan's config registry does.

``--config NAME`` takes a recipe (``small``), or a recipe with a variant (``small/ddl-cc``: the recipe with
``variant="ddl-cc"`` and ``out="runs/small/ddl-cc"``); ``ddl train --list-configs`` lists every such name.
A recipe never sets ``variant``: every recipe serves every variant. Users write their own settings as YAML
(``--config path.yaml``); a recipe we ship is a function here. No PyTorch import: the command line's parser
lists the recipes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def debug() -> dict[str, Any]:
    """Smoke runs and the test suite: the tiny preset narrowed to width 32, 2 layers and 2 heads, 6 steps of
    4 x 32 tokens on the embedded text; every phase of a run (warm-up, validation, checkpoint) happens in
    seconds on a CPU core."""
    return dict(
        model=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64),
        steps=6, batch_size=4, seq_len=32, warmup_steps=2, eval_every=3, eval_batches=2, save_every=3,
    )


def tiny() -> dict[str, Any]:
    """The tiny preset (d=256, 4 layers, 4 heads) on the embedded default text (byte tokens), sized for a
    CPU: 600 steps x 16 x 128 tokens (~1.2M tokens). ``ddl train --config tiny/ddl-cc``."""
    return dict(steps=600, batch_size=16, seq_len=128, warmup_steps=50, eval_every=100, save_every=200)


def compare() -> dict[str, Any]:
    """``ddl compare``'s defaults (without ``--config``): the tiny preset on the embedded text, sized so that
    the four default variants finish in about ten minutes on 2 idle CPU cores (about an hour with one core that
    other work keeps busy; docs/training.md has both measurements). ``save_every`` 100: an interrupted comparison continues from there."""
    return dict(steps=600, batch_size=16, seq_len=64, lr=2e-3, warmup_steps=60, eval_every=100, eval_batches=16,
                save_every=100, keep=1, log_every=5)


def tasks() -> dict[str, Any]:
    """``ddl tasks run``'s training settings (a mechanism task gives the data, its sequence length and the
    vocabulary): the tiny preset narrowed to d = 64 (4 layers, 4 heads of 16), so that a run of 1000 steps (the
    default) of 32 sequences takes minutes on a CPU core. Embeddings drawn at std 0.3, not the presets' 0.02 (GPT-2's, for
    d = 768): at d = 64 and 0.02 a token's embedding (norm 0.16) is drowned by what the sublayers write, and no
    variant learned a content lookup (recall stayed at its shortcut for 15,000 steps); at 0.1 the baseline learns
    recall and the DDL variants, whose sublayers each write a value of size about 2 along k, do not; at 0.3 every
    variant does (docs/tasks.md). AdamW betas (0.9, 0.98)."""
    return dict(model=dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, initializer_range=0.3),
                batch_size=32, lr=2e-3, warmup_steps=50, betas=(0.9, 0.98), log_every=25,
                eval_every=200)


def deep12() -> dict[str, Any]:
    """The deep study's shape and schedule with the strong baseline's recipe (issue 64; docs/evidence.md): the tiny
    preset narrowed to width 64 and deepened to 12 layers (2 heads, context 256, the byte vocabulary 257), the
    embedding normed (``embed_norm``, for every variant), 300 steps x 16 x 256 tokens with 30 warm-up steps,
    validation every 50 steps on 16 batches, compiled blocks (the default seq_len, 256). Meant for the prose corpus
    (``ddl data prepare --source prose-v1 ...``; studies/deep12e): ``ddl compare --config deep12 --data DIR``."""
    return dict(
        model=dict(hidden_size=64, num_hidden_layers=12, num_attention_heads=2, max_position_embeddings=256,
                   vocab_size=257, embed_norm=True),
        steps=300, batch_size=16, warmup_steps=30, eval_every=50, eval_batches=16, save_every=50,
        keep=1, compile=True,
    )


def _paper(preset: str, batch_size: int) -> dict[str, Any]:
    """The paper's section 5.1 recipe at ``preset``: FineWeb-Edu with the GPT-2 tokenizer
    (``ddl data prepare --source fineweb-edu:sample-100BT --tokenizer gpt2 --out data/fineweb-edu-gpt2``);
    100,000 steps x 480 sequences x 1,024 tokens (49.15B tokens); AdamW (0.9, 0.95), weight decay 0.1 on
    matrices, lr 1e-3 with 2,000 warm-up steps and cosine decay, gradient clipping 1.0, bf16 autocast (dtype
    auto on CUDA); those not listed here are TrainConfig's defaults. The paper ran 4 GPUs: 4 x ``batch_size``
    sequences per micro-batch, the accumulation derived from ``global_batch_size``. muP as the paper
    (docs/mup.md): base width 256 (the tiny preset's), so hidden matrices train at lr / m (m = width / 256)
    and logits are scaled by 1/m; ``--set model.parametrization=sp`` switches back. The decay floor
    (``min_lr_ratio`` 0.1, the default) is not stated in the paper."""
    return dict(
        preset=preset, model=dict(parametrization="mup", mup_base_width=256), data="data/fineweb-edu-gpt2",
        steps=100_000, batch_size=batch_size, global_batch_size=480, seq_len=1024, warmup_steps=2000,
        eval_every=1000, eval_batches=100, save_every=5000,
    )


def small() -> dict[str, Any]:
    """The paper's Small (124M: 12 layers, width 768, 6 heads), 20 sequences per micro-batch (:func:`_paper`).
    ``torchrun --nproc_per_node 4 -m deep_delta.cli.main train --config small/ddl-cc``."""
    return _paper("small", batch_size=20)


def medium() -> dict[str, Any]:
    """The paper's Medium (353M: 24 layers, width 1024, 8 heads), 10 sequences per micro-batch
    (:func:`_paper`)."""
    return _paper("medium", batch_size=10)


RECIPES: dict[str, Callable[[], dict[str, Any]]] = {
    "debug": debug, "tiny": tiny, "compare": compare, "tasks": tasks, "deep12": deep12, "small": small,
    "medium": medium,
}

