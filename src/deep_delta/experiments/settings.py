"""What ``ddl coord-check`` runs, with no import of PyTorch (the command line reads the defaults from here to
build its parser; the check itself is :mod:`deep_delta.experiments.coord_check`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deep_delta.settings import MAX_SEEDS, check_count, check_fields, setting
from deep_delta.variants import VARIANTS

PARAMETRIZATIONS = ("sp", "mup")

# How far a slope under muP may stray from its order at the last step. Measured (docs/mup.md) at widths 32..256,
# 3 steps of 2 x 32 tokens, seeds 0, 1, 2: muP within 0.42 of its order; sp and muP without its learning-rate
# scaling 0.68 to 1.85 above it in the attention and MLP outputs (sp logits 0.93 to 1.16).
MUP_SLOPE_BOUND = 0.5


@dataclass
class CoordCheckSettings:
    """What a coordinate check runs; every model is ``variant`` at ``layers`` blocks of ``width / head_dim``
    heads of ``head_dim``, vocabulary 257 (bytes) and ``model`` (any DDLConfig field). Each field's metadata holds
    the help of its ``ddl coord-check`` flag (``--field-name``)."""

    variants: Sequence[str] = setting(("baseline", "ddl-cc"))  # the text of --variants everywhere (cli/options.py)
    widths: Sequence[int] = setting((64, 128, 256, 512, 1024), "hidden sizes, multiples of --head-dim", metavar="W")
    parametrizations: Sequence[str] = setting(PARAMETRIZATIONS, "which to run", choices=PARAMETRIZATIONS)
    steps: int = setting(4, "optimizer steps recorded")
    layers: int = setting(2, "blocks")
    head_dim: int = setting(32, "head size, fixed across widths")
    batch_size: int = setting(4, "sequences per step", metavar="B")
    seq_len: int = setting(64, "tokens per sequence", metavar="T")
    lr: float = setting(1e-2, "AdamW learning rate at the base width")
    seeds: Sequence[int] = setting((0,), "seeds averaged per point: a list, or one number N for seeds 0..N-1")
    device: str = setting("cpu")  # a device, not auto: `ddl coord-check` resolves its --device (default auto)
    model: dict[str, Any] = setting(help="DDLConfig fields set for every model (--set model.FIELD=VALUE)",
                                    factory=dict)

    def __post_init__(self):
        check_fields(self)

    def validate(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise ValueError(f"`variants` got {list(self.variants)!r}; allowed: one or more of {', '.join(VARIANTS)}")
        bad = [p for p in self.parametrizations if p not in PARAMETRIZATIONS]
        if bad or not self.parametrizations:
            raise ValueError(f"`parametrizations` got {list(self.parametrizations)!r}; allowed: sp, mup")
        for name in ("steps", "layers", "head_dim", "batch_size", "seq_len"):
            check_count(name, getattr(self, name), 1)
        if len(set(self.widths)) < 2 or any(w < 1 or w % self.head_dim for w in self.widths):
            raise ValueError(f"`widths` got {list(self.widths)!r}; allowed: two or more different multiples of "
                             f"head_dim={self.head_dim} (a slope needs two widths)")
        if not self.lr > 0:
            raise ValueError(f"`lr` got {self.lr!r}; allowed: a float > 0")
        if not self.seeds or len(self.seeds) > MAX_SEEDS:
            raise ValueError(f"`seeds` got {len(self.seeds)} seeds; allowed: 1 to {MAX_SEEDS}")
