"""How much of each held-out split occurs verbatim in train: the share of a split's aligned, non-overlapping chunks of
``chunk`` tokens (64 bytes with the byte tokenizer) found anywhere in the train split, at any position.

Whole documents are assigned to the splits and exact duplicates are removed before (a named corpus), but the same
paragraph, licence header or example can stand in two documents; a held-out loss over such text measures recall of
training text, not prediction. This counts it.

One pass over train, in blocks (memory a few hundred MB for any train split): every window of ``chunk`` tokens at
every position is hashed (a polynomial hash mod 2^64 of the tokens mapped through a fixed random table, built by
doubling: six vectorised steps for 64) and looked up among the hashes of the held-out chunks; a hash found is
confirmed token by token before the chunk counts as found, so a chunk counts only when its exact tokens occur in
train.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deep_delta.data.loader import split_shards
from deep_delta.data.shards import open_shard

CHUNK = 64  # tokens of a held-out chunk
BLOCK = 1 << 22  # train positions hashed at a time
_CONFIRM = 1 << 18  # candidate positions compared token by token at a time
_MASK = (1 << 64) - 1
_rng = np.random.default_rng(20260117)
_TABLE = _rng.integers(0, 1 << 63, size=1 << 16, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd, per token id
_BASE = int(_rng.integers(0, 1 << 62)) * 2 + 1


@dataclass
class SplitOverlap:
    """One held-out split: its ``chunks``, how many of them occur in train (``found``), and, given windows, the
    same counted over the chunks inside those windows (``windows_chunks``, ``windows_found``)."""

    split: str
    chunks: int
    found: int
    windows_chunks: int | None = None
    windows_found: int | None = None

    @property
    def share(self) -> float:
        return self.found / self.chunks if self.chunks else 0.0

    @property
    def windows_share(self) -> float | None:
        return None if not self.windows_chunks else self.windows_found / self.windows_chunks


@dataclass
class OverlapReport:
    """What :func:`held_out_overlap` found: each held-out split's overlap, the train positions searched and the
    seconds it took."""

    chunk: int
    train_positions: int
    seconds: float
    splits: list[SplitOverlap] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"chunk": self.chunk, "train_positions": self.train_positions, "seconds": self.seconds,
                "splits": [{"split": s.split, "chunks": s.chunks, "found": s.found, "share": s.share,
                            "windows_chunks": s.windows_chunks, "windows_found": s.windows_found,
                            "windows_share": s.windows_share} for s in self.splits]}


def window_hashes(tokens: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """The hash of every window of ``chunk`` tokens of ``tokens`` (a power of two), (len - chunk + 1,) uint64:
    sum over j of TABLE[token i + j] * BASE^(chunk - 1 - j), mod 2^64."""
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"`chunk` got {chunk!r}; allowed: a power of two (64: 64 bytes of the byte tokenizer)")
    h = _TABLE[np.asarray(tokens, dtype=np.int64)]
    span = 1
    while span < chunk:  # h[i] hashes tokens[i : i + span]: join two neighbours into windows of 2 * span
        h = h[:-span] * np.uint64(pow(_BASE, span, 1 << 64) & _MASK) + h[span:]
        span *= 2
    return h


def _stream(data_dir: Path, split: str) -> np.ndarray:
    shards = [np.asarray(open_shard(p)) for p in split_shards(data_dir, split)]
    return np.concatenate(shards) if len(shards) > 1 else (shards[0] if shards else np.empty(0, np.uint16))


def _in_windows(chunks: int, chunk: int, seq_len: int, starts: np.ndarray) -> np.ndarray:
    """Which of ``chunks`` aligned chunks lie wholly inside a window of ``seq_len + 1`` tokens starting at one of
    ``starts`` (token positions)."""
    inside = np.zeros(chunks, dtype=bool)
    first = -(-starts // chunk)  # the first chunk starting at or after the window's start
    last = (starts + seq_len + 1) // chunk  # chunks before this one end inside the window
    for a, b in zip(first.tolist(), last.tolist()):
        inside[a:min(b, chunks)] = True
    return inside


def _pairs(pos: np.ndarray, lo: np.ndarray, hashes: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each train position of ``pos`` with each held-out chunk whose hash is its hash (``hashes[lo[p]:...]``, one
    chunk almost always): (positions, chunk indices), repeated where several chunks share a hash."""
    count = np.searchsorted(hashes, h[pos], side="right") - lo[pos]
    first = np.repeat(lo[pos], count)
    step = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(pos, count), first + step


def held_out_overlap(data_dir: str | os.PathLike, splits: tuple[str, ...] = ("val", "test"), *, chunk: int = CHUNK,
                     windows: dict[str, tuple[int, np.ndarray]] | None = None) -> OverlapReport:
    """The share of each held-out split's aligned chunks of ``chunk`` tokens (at 0, chunk, 2 chunk, ...; a last
    partial chunk left out) that occur verbatim anywhere in the train split (:mod:`this module's docstring
    <deep_delta.data.overlap>`). ``splits`` without shards are left out. ``windows``: per split, ``(seq_len, window
    indices)`` of the windows an evaluation reads (:func:`~deep_delta.data.loader.eval_windows`): the same counted
    over the chunks inside them."""
    start = time.perf_counter()
    data_dir = Path(data_dir)
    held = {s: _stream(data_dir, s) for s in splits if split_shards(data_dir, s)}
    rows = {s: t[: len(t) // chunk * chunk].reshape(-1, chunk) for s, t in held.items()}
    every = np.concatenate(list(rows.values())) if rows else np.empty((0, chunk), np.uint16)
    # one entry per distinct chunk, sorted by hash (distinct chunks of one hash are each compared)
    distinct, inverse = np.unique(every, axis=0, return_inverse=True)
    hashes = window_hashes(distinct.reshape(-1), chunk)[::chunk] if len(distinct) else np.empty(0, np.uint64)
    order = np.argsort(hashes, kind="stable")
    hashes, distinct = hashes[order], distinct[order]
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    found = np.zeros(len(hashes), dtype=bool)
    positions = 0
    carry = np.empty(0, dtype=np.uint16)
    offsets = np.arange(chunk)
    for path in split_shards(data_dir, "train") if len(hashes) else []:
        shard = open_shard(path)
        for a in range(0, len(shard), BLOCK):
            tokens = np.concatenate([carry, shard[a : a + BLOCK]])
            carry = tokens[-(chunk - 1):] if chunk > 1 else tokens[:0]
            if len(tokens) < chunk:
                continue
            h = window_hashes(tokens, chunk)
            positions += len(h)
            lo = np.searchsorted(hashes, h)
            hits = np.flatnonzero(lo < np.searchsorted(hashes, h, side="right"))
            for b in range(0, len(hits), _CONFIRM):
                pos, idx = _pairs(hits[b : b + _CONFIRM], lo, hashes, h)  # each position with each chunk of its hash
                keep = ~found[idx]
                pos, idx = pos[keep], idx[keep]
                same = (tokens[pos[:, None] + offsets] == distinct[idx]).all(axis=1)
                found[idx[same]] = True
    seen = found[rank[inverse.reshape(-1)]] if len(every) else np.zeros(0, dtype=bool)
    report = OverlapReport(chunk, positions, 0.0)
    i = 0
    for s, r in rows.items():
        mine = seen[i : i + len(r)]
        i += len(r)
        item = SplitOverlap(s, len(r), int(mine.sum()))
        if windows and s in windows:
            seq_len, picked = windows[s]
            inside = _in_windows(len(r), chunk, seq_len, np.asarray(picked, dtype=np.int64) * seq_len)
            item.windows_chunks, item.windows_found = int(inside.sum()), int((mine & inside).sum())
        report.splits.append(item)
    report.seconds = time.perf_counter() - start
    return report


__all__ = ["CHUNK", "OverlapReport", "SplitOverlap", "held_out_overlap", "window_hashes"]
