"""What every mechanism task shares: token batches with labels at the positions that matter, the train / test
split by hashing, seeded generation, and the parameters a task takes.

A task is a seeded generator of token sequences. ``Task.sample(rng, n, split)`` draws ``n`` sequences from the
task's distribution for ``split`` (a task may test on another distribution than it trains on, e.g. sparser
flip-flops); ``Task.generate`` keeps only the sequences that belong to ``split``: a sequence is a test sequence
when the hash of its tokens falls in the test bucket (:func:`split_of`), so no test sequence can ever be drawn
for training, whatever the seeds.

Token layout: every task has ``PAD`` = 0, ``BOS`` = 1 and ``SEP`` = 2, then one disjoint range of ids per
role (cups, symbols, keys, values, instructions, bits, ...), listed in ``Task.roles``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

IGNORE = -100  # label of a position that is not scored (the model's ignore_index)
NO_LEVEL = -1  # difficulty of such a position
PAD, BOS, SEP = 0, 1, 2
SPECIALS = 3
TEST_BUCKETS = 8  # one hash bucket in TEST_BUCKETS holds the test sequences
GIVE_UP_ROUNDS = 20  # rounds of drawing without one sequence of the split: the task's space is too small


@dataclass(frozen=True)
class Batch:
    """``n`` sequences of one length: ``inputs`` token ids, ``labels`` the answer token at the scored positions
    (``IGNORE`` elsewhere), ``difficulty`` the level of each scored position (``NO_LEVEL`` elsewhere). All
    ``int64`` arrays of shape ``[n, seq_len]``; the label at position t is predicted from tokens 0..t."""

    inputs: np.ndarray
    labels: np.ndarray
    difficulty: np.ndarray

    def __len__(self) -> int:
        return len(self.inputs)

    def take(self, rows) -> Batch:
        return Batch(self.inputs[rows], self.labels[rows], self.difficulty[rows])

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        return Batch(*(np.concatenate([getattr(b, f) for b in batches]) for f in ("inputs", "labels", "difficulty")))


def sequence_hash(row: np.ndarray) -> bytes:
    """A stable 8-byte digest of one sequence of token ids (independent of platform and dtype)."""
    return hashlib.blake2b(np.ascontiguousarray(row, dtype="<i8").tobytes(), digest_size=8).digest()


def split_of(row: np.ndarray) -> str:
    """"test" when the sequence's hash falls in the test bucket, else "train": the split by construction."""
    return _bucket_of(sequence_hash(row))


def _bucket_of(digest: bytes) -> str:
    return "test" if int.from_bytes(digest, "little") % TEST_BUCKETS == 0 else "train"


def data_rng(seed: int, stream: str) -> np.random.Generator:
    """The generator of one data stream ("train", "test") of a seed: independent streams, same on every run."""
    return np.random.default_rng([int(seed), zlib.crc32(stream.encode())])


def interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[n, m]`` and ``[n, m]`` -> ``[n, 2m]`` as a1 b1 a2 b2 ..."""
    return np.stack([a, b], axis=2).reshape(a.shape[0], -1)


def _positive(name: str, value: Any, low: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"task parameter `{name}` got {value!r}; allowed: an integer >= {low}")


@dataclass(frozen=True)
class Task:
    """Base class of the tasks: a frozen dataclass of the task's parameters plus the generator.

    Subclasses set ``name``, ``summary``, ``probes``, ``difficulty_name`` and implement ``roles``, ``seq_len``,
    ``levels`` (the difficulty levels, in order; ``level_names`` label them), ``chance`` and ``sample``.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    probes: ClassVar[str] = ""
    difficulty_name: ClassVar[str] = ""
    layout: ClassVar[str] = ""  # the sequence format, for docs and `ddl tasks list`

    # ------------------------------------------------------------------ what a subclass defines
    @property
    def roles(self) -> dict[str, range]:
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        raise NotImplementedError

    @property
    def levels(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def level_names(self) -> tuple[str, ...]:
        return tuple(str(level) for level in self.levels)

    @property
    def chance(self) -> float:
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, n: int, split: str = "train") -> Batch:
        """``n`` sequences of ``split``'s distribution, not yet filtered by the hash split."""
        raise NotImplementedError

    def shortcuts(self) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
        """Named heuristics that score above chance without solving the task: each maps inputs (N, T) to
        predicted token ids (N, T). The report scores them on the test set beside the trained models, so that a
        model at a shortcut's accuracy is not read as having learned the task. None by default."""
        return {}

    # ------------------------------------------------------------------ shared
    @property
    def vocab_size(self) -> int:
        return max(r.stop for r in self.roles.values())

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_params(self, **params: Any) -> Task:
        """This task with other parameters; unknown names are refused."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"task {self.name}: unknown parameter(s) {unknown}; allowed: {sorted(known)}")
        return dataclasses.replace(self, **params)

    def _range(self, offset: int, size: int) -> range:
        return range(offset, offset + size)

    def generate(self, rng: np.random.Generator, n: int, split: str = "train") -> Batch:
        """``n`` sequences of ``split`` only: drawn by :meth:`sample`, those of the other split dropped."""
        if split not in ("train", "test"):
            raise ValueError(f"`split` got {split!r}; allowed: train | test")
        _positive("n", n, 0)
        parts, have, drawn, seen = [], 0, 0, set()
        for round_ in range(1000):
            if have >= n:
                break
            if have == 0 and round_ == GIVE_UP_ROUNDS:
                raise self._too_small(n, split, drawn, len(seen))
            batch = self.sample(rng, max(16, (n - have) * 5 // 4), split)
            hashes = [sequence_hash(row) for row in batch.inputs]
            seen.update(hashes)
            keep = np.array([_bucket_of(h) == split for h in hashes], dtype=bool)
            parts.append(batch.take(keep))
            have, drawn = have + int(keep.sum()), drawn + len(batch)
        else:
            raise self._too_small(n, split, drawn, len(seen))
        return Batch.concat(parts).take(slice(0, n)) if parts else self.sample(rng, 0, split)

    def _too_small(self, n: int, split: str, drawn: int, distinct: int) -> ValueError:
        params = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return ValueError(f"task {self.name} ({params}): could not draw {n} {split} sequences from {drawn:,} drawn "
                          f"({distinct:,} distinct); these parameters allow too few distinct sequences to fill the {split} split "
                          f"(1 in {TEST_BUCKETS} sequences is a test sequence); allowed: larger parameters (see "
                          f"`ddl tasks list`), or a smaller `test_size`")

    def batches(self, seed: int, batch_size: int) -> TaskBatches:
        """The training stream of ``seed``: fresh sequences of the train split, ``batch_size`` a draw, from the
        seed's own numpy stream (the same for every variant)."""
        return TaskBatches(self, seed, batch_size)

    def test_set(self, seed: int, size: int) -> Batch:
        """The fixed evaluation set: ``size`` test sequences from ``seed`` (every level represented)."""
        return self.generate(data_rng(seed, f"{self.name}/test"), size, "test")

    def describe(self) -> str:
        ranges = ", ".join(f"{role} {r.start}-{r.stop - 1}" for role, r in self.roles.items())
        return (f"{self.name}: {self.summary}\n  probes: {self.probes}\n  sequence ({self.seq_len} tokens): "
                f"{self.layout}\n  tokens: PAD 0, BOS 1, SEP 2, {ranges} (vocabulary {self.vocab_size})\n"
                f"  accuracy by {self.difficulty_name}: {', '.join(self.level_names)}; chance "
                f"{100 * self.chance:.1f}%\n  parameters: "
                + ", ".join(f"{k}={v}" for k, v in self.params().items()))


class TaskBatches:
    """A task as the trainer's data source: ``next_batch()`` draws ``batch_size`` fresh train sequences from the
    seed's stream (``data_rng(seed, "<task>/train")``) as ``(inputs, labels)`` tensors (labels ``IGNORE`` where
    nothing is scored)."""

    def __init__(self, task: Task, seed: int, batch_size: int):
        self.task, self.batch_size = task, batch_size
        self.rng = data_rng(seed, f"{task.name}/train")

    def next_batch(self):
        import torch

        batch = self.task.generate(self.rng, self.batch_size, "train")
        return torch.from_numpy(batch.inputs), torch.from_numpy(batch.labels)
