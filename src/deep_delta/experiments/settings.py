"""What ``ddl coord-check`` runs, with no import of PyTorch (the command line reads the defaults from here to
build its parser; the check itself is :mod:`deep_delta.experiments.coord_check`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from deep_delta.settings import MAX_SEEDS, check_count, check_fields
from deep_delta.variants import VARIANTS

PARAMETRIZATIONS = ("sp", "mup")

# How far a slope under muP may stray from its order at the last step. Measured (docs/mup.md) at widths 32..256,
# 3 steps of 2 x 32 tokens, seeds 0, 1, 2: muP within 0.42 of its order; sp and muP without its learning-rate
# scaling 0.68 to 1.85 above it in the attention and MLP outputs (sp logits 0.93 to 1.16).
MUP_SLOPE_BOUND = 0.5


@dataclass
class CoordCheckSettings:
    """What a coordinate check runs; every model is ``variant`` at ``layers`` blocks of ``width / head_dim``
    heads of ``head_dim``, vocabulary 257 (bytes) and ``model`` (any DDLConfig field)."""

    variants: Sequence[str] = ("baseline", "ddl-cc")
    widths: Sequence[int] = (64, 128, 256, 512, 1024)
    parametrizations: Sequence[str] = PARAMETRIZATIONS
    steps: int = 4
    layers: int = 2
    head_dim: int = 32
    batch_size: int = 4
    seq_len: int = 64
    lr: float = 1e-2
    seeds: Sequence[int] = (0,)
    device: str = "cpu"
    model: dict[str, Any] = field(default_factory=dict)

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
