"""What a run trains on: prepared token data resolved once (:class:`TrainData`), and the batches the trainer
draws (a :class:`~deep_delta.data.TokenLoader` over it, or any object with ``next_batch()``).

``ddl compare`` resolves its data once and hands the same :class:`TrainData` to every run it trains; a run
without one resolves ``TrainConfig.data`` itself (the embedded default text when it is None).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch


class Batches(Protocol):
    """A training stream: ``next_batch() -> (x, y)``, the inputs and their next-token labels, (B, T) each (labels
    -100 where nothing is scored). A stream that can be resumed also has ``state_dict()`` and
    ``load_state_dict(state)``."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class TrainData:
    """A prepared data directory (``ddl data prepare``): where it is, its ``meta.json`` and its fingerprint
    (:func:`deep_delta.train.provenance.data_fingerprint`)."""

    dir: Path
    meta: dict[str, Any]
    fingerprint: str

    @classmethod
    def resolve(cls, data: str | None) -> TrainData:
        """The data directory ``data`` (None: the embedded default text, prepared on first use), checked."""
        from deep_delta.data import default_data_dir, read_meta
        from deep_delta.data.meta import require_data_dir
        from deep_delta.train.provenance import data_fingerprint

        data_dir = Path(data).expanduser() if data else default_data_dir()
        require_data_dir(data_dir)
        meta = read_meta(data_dir)
        for key in ("tokenizer", "vocab_size"):
            if key not in meta:
                raise ValueError(f"{data_dir}/meta.json lacks {key!r}; re-prepare the data with `ddl data prepare`")
        data_dir = data_dir.resolve()
        return cls(data_dir, meta, data_fingerprint(data_dir, meta))

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def has_validation(self) -> bool:
        """Whether preparation wrote a validation split (a shard missing since then is an error later)."""
        from deep_delta.data.loader import available_splits

        splits = self.meta.get("splits")
        if isinstance(splits, dict):
            return (splits.get("val") or {}).get("num_tokens", 0) > 0
        return "val" in available_splits(self.dir)

    def record(self) -> dict[str, Any]:
        """What run.json and W&B say of the data: its directory, tokenizer, vocabulary and fingerprint."""
        return {"dir": str(self.dir), "tokenizer": self.meta["tokenizer"], "vocab_size": self.vocab_size,
                "fingerprint": self.fingerprint}

    def loader(self, split: str, batch_size: int, seq_len: int, **kwargs):
        from deep_delta.data import TokenLoader

        return TokenLoader(self.dir, split, batch_size, seq_len, **kwargs)


def run_loaders(cfg, info, data: TrainData | None, batches: Batches | None, vocab_size: int, *, evaluates: bool):
    """A run's training stream (``batches``, else a loader over ``data``'s train split) and its validation loader
    (None when the run evaluates otherwise, ``evaluates``, or not at all); ``cfg`` a TrainConfig, ``info`` the
    process's place (rank, world size). A run that validates needs a validation split: refused without one."""
    kw = dict(seed=cfg.seed, rank=info.rank, world_size=info.world_size, vocab_size=vocab_size)
    train = batches if batches is not None else data.loader("train", cfg.batch_size, cfg.seq_len, **kw)
    if evaluates:
        return train, None
    if data is not None and data.has_validation:
        return train, data.loader("val", cfg.batch_size, cfg.seq_len, **kw)
    if cfg.eval_every:
        where = f"{data.dir} has no validation split (no val_*.bin shards)" if data is not None else \
            "the run trains on batches of its own, with no validation data and no `evaluate`"
        raise ValueError(f"{where} but `eval_every` is {cfg.eval_every}; allowed: `eval_every` 0 to train "
                         "without validation, or data prepared with a validation fraction > 0")
    return train, None


__all__ = ["BatchList", "Batches", "TrainData", "run_loaders"]


class BatchList:
    """A training stream of given batches, in order (``next_batch()`` past the end is an error): a fixed list of
    ``(x, y)`` pairs, e.g. the coordinate check's."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor]]):
        self.batches, self.position = list(batches), 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position >= len(self.batches):
            raise IndexError(f"BatchList: all {len(self.batches)} batches were drawn")
        self.position += 1
        return self.batches[self.position - 1]
