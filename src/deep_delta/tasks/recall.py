"""Multi-query associative recall (MQAR): ``num_pairs`` key-value pairs, then every key once more as a query
in random order, each followed by its value; at a query the model names the key's value.

A control: one attention head that matches the query against the keys and copies the next token solves it
at any depth, so the residual form should matter little here. Difficulty is the queried pair's position in
the list (1 = shown first, farthest back).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from deep_delta.tasks.base import BOS, IGNORE, NO_LEVEL, SEP, SPECIALS, Batch, Task, _positive, interleave


@dataclass(frozen=True)
class AssociativeRecall(Task):
    num_keys: int = 16
    num_values: int = 16
    num_pairs: int = 8

    name = "recall"
    summary = "multi-query associative recall: the value of each queried key"
    probes = "control: attention lookup (one head that matches keys and copies values suffices)"
    difficulty_name = "pair position"
    layout = "BOS k1 v1 ... k8 v8 SEP q1 a1 ... q8 a8; label at each q: its key's value"

    def __post_init__(self):
        _positive("num_keys", self.num_keys, 1)
        _positive("num_values", self.num_values, 2)
        _positive("num_pairs", self.num_pairs)
        if self.num_pairs > self.num_keys:
            raise ValueError(f"task parameter `num_pairs` got {self.num_pairs}; allowed: at most num_keys="
                             f"{self.num_keys} (keys are distinct)")

    @property
    def roles(self) -> dict[str, range]:
        return {"keys": self._range(SPECIALS, self.num_keys),
                "values": self._range(SPECIALS + self.num_keys, self.num_values)}

    @property
    def seq_len(self) -> int:
        return 2 + 4 * self.num_pairs

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(range(1, self.num_pairs + 1))

    @property
    def chance(self) -> float:
        return 1.0 / self.num_values

    def shortcuts(self) -> dict:
        """Without looking any key up, the best guess for a query is a value shown most often among the pairs
        not yet answered (the answers before it are in the sequence); ties go to the lowest id, which is
        unrelated to the answer. At 8 pairs and 16 values this scores about 42% at every pair position."""
        p = self.num_pairs

        def most_frequent_unanswered(inputs: np.ndarray) -> np.ndarray:
            pred = np.zeros_like(inputs)
            for r, row in enumerate(inputs):
                left = collections.Counter(row[2:2 + 2 * p:2].tolist())
                for q in range(p):
                    at = 2 + 2 * p + 2 * q
                    top = max(left.values())
                    pred[r, at] = min(v for v, c in left.items() if c == top)
                    answer = int(row[at + 1])
                    left[answer] -= 1
                    if left[answer] <= 0:
                        del left[answer]
            return pred

        return {"most frequent unanswered value": most_frequent_unanswered}

    def sample(self, rng: np.random.Generator, n: int, split: str = "train") -> Batch:
        p = self.num_pairs
        key0, val0 = self.roles["keys"].start, self.roles["values"].start
        keys = np.argsort(rng.random((n, self.num_keys)), axis=1)[:, :p]  # distinct keys
        values = rng.integers(0, self.num_values, (n, p))
        asked = np.argsort(rng.random((n, p)), axis=1)  # which pair each query asks for
        q_keys = np.take_along_axis(keys, asked, axis=1)
        q_values = np.take_along_axis(values, asked, axis=1)
        inputs = np.concatenate([np.full((n, 1), BOS), interleave(key0 + keys, val0 + values),
                                 np.full((n, 1), SEP), interleave(key0 + q_keys, val0 + q_values)],
                                axis=1).astype(np.int64)
        labels = np.full_like(inputs, IGNORE)
        difficulty = np.full_like(inputs, NO_LEVEL)
        at = 2 + 2 * p + 2 * np.arange(p)  # the query positions
        labels[:, at] = val0 + q_values
        difficulty[:, at] = asked + 1
        return Batch(inputs, labels, difficulty)
