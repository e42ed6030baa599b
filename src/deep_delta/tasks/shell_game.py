"""Swap tracking ("shell game"): a ball under one of ``num_cups`` cups, then ``num_swaps`` swaps of two cups;
after each swap the model names the cup that now hides the ball.

Every swap is a transposition of the cups, so the answer after t swaps is the start cup sent through a product
of t transpositions. An additive residual stream must build that product from attention over the swaps; a
delta sublayer with beta near 2 applies a Householder reflection, which is exactly a transposition of two
coordinates (reflect along e_i - e_j), so a DDL model can in principle carry the ball's position in its state
and swap it in place, one sublayer update per swap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deep_delta.tasks.base import BOS, IGNORE, NO_LEVEL, SEP, SPECIALS, Batch, Task, _positive, interleave


@dataclass(frozen=True)
class ShellGame(Task):
    num_cups: int = 5
    num_swaps: int = 8

    name = "shell-game"
    summary = "swap tracking: where is the ball after each swap of two cups"
    probes = "reflection (beta near 2: a Householder reflection is a transposition)"
    difficulty_name = "swaps"
    layout = "BOS s SEP i1 j1 ... im jm; label at each j_t: the ball's cup after t swaps"

    def __post_init__(self):
        _positive("num_cups", self.num_cups, 2)
        _positive("num_swaps", self.num_swaps)

    @property
    def roles(self) -> dict[str, range]:
        return {"cups": self._range(SPECIALS, self.num_cups)}

    @property
    def seq_len(self) -> int:
        return 3 + 2 * self.num_swaps

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(range(1, self.num_swaps + 1))

    @property
    def chance(self) -> float:
        return 1.0 / self.num_cups

    def shortcuts(self) -> dict:
        """Naming the cup the ball started under is right after t swaps with probability
        1/c + (1 - 1/c) (1 - 2 / (c - 1))^t (a swap moves the ball with probability 2/c, to a uniform other
        cup): 60%, 40%, 30%, 25%, ... at 5 cups, tending to chance, with no swap tracked."""

        def repeat_start(inputs: np.ndarray) -> np.ndarray:
            return np.repeat(inputs[:, 1:2], inputs.shape[1], axis=1)

        return {"the starting cup": repeat_start}

    def sample(self, rng: np.random.Generator, n: int, split: str = "train") -> Batch:
        c, m, cup0 = self.num_cups, self.num_swaps, self.roles["cups"].start
        start = rng.integers(0, c, n)
        first = rng.integers(0, c, (n, m))
        second = (first + rng.integers(1, c, (n, m))) % c  # a different cup, uniformly
        where = np.empty((n, m), dtype=np.int64)
        ball = start
        for t in range(m):
            ball = np.where(ball == first[:, t], second[:, t], np.where(ball == second[:, t], first[:, t], ball))
            where[:, t] = ball
        inputs = np.concatenate([np.full((n, 1), BOS), cup0 + start[:, None], np.full((n, 1), SEP),
                                 interleave(cup0 + first, cup0 + second)], axis=1).astype(np.int64)
        labels = np.full_like(inputs, IGNORE)
        difficulty = np.full_like(inputs, NO_LEVEL)
        at = 4 + 2 * np.arange(m)  # the position of j_t
        labels[:, at] = cup0 + where
        difficulty[:, at] = np.arange(1, m + 1)
        return Batch(inputs, labels, difficulty)
