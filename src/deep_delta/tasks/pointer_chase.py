"""Pointer chasing with overwrite: a random permutation f of ``num_symbols`` symbols, shown as its
``num_symbols`` pairs ``x f(x)`` in random order, then a start symbol s and ``num_hops`` hop tokens H; at the
j-th H the model names f^j(s). With ``first_answer="start"`` the first hop is answered at s itself and the
j-th H answers hop j + 1 (one H fewer): hop 1 is then a lookup of the token in place, as in recall, instead of a
lookup of the token one position back.

Each hop replaces the current pointer by its image: the old value has to be erased and the new one written.
Nothing but H is shown after s, so every hop happens inside the network. A delta sublayer with beta near 1
does exactly that to one direction of its state (erase the k-component, write v), while an additive residual
can only add the new pointer on top of the old one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deep_delta.tasks.base import BOS, IGNORE, NO_LEVEL, SEP, SPECIALS, Batch, Task, _positive, interleave


def _permutations(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """``n`` uniform random permutations of 0..k-1, one per row."""
    return np.argsort(rng.random((n, k)), axis=1)


@dataclass(frozen=True)
class PointerChase(Task):
    num_symbols: int = 16
    num_hops: int = 5
    first_answer: str = "hop"  # where hop 1 is answered: "hop" (the first H) or "start" (at s)

    name = "pointer-chase"
    summary = "follow a permutation shown as pairs for up to num_hops hops from a start symbol"
    probes = "erase / overwrite (beta near 1 replaces the k-component of the state)"
    difficulty_name = "hop"
    layout = ("BOS x1 y1 ... x16 y16 SEP s H H H H H; label at the j-th H: f^j(s) (first_answer=start: "
              "SEP s H H H H, label at s: f(s), at the j-th H: f^(j+1)(s))")

    def __post_init__(self):
        _positive("num_symbols", self.num_symbols, 2)
        _positive("num_hops", self.num_hops)
        if self.first_answer not in ("hop", "start"):
            raise ValueError(f"task parameter `first_answer` got {self.first_answer!r}; allowed: 'hop' | 'start'")

    @property
    def _first(self) -> int:
        """The position of hop 1's label: the first H, or s."""
        return 2 + 2 * self.num_symbols + (self.first_answer == "hop")

    @property
    def roles(self) -> dict[str, range]:
        return {"symbols": self._range(SPECIALS, self.num_symbols),
                "hop": self._range(SPECIALS + self.num_symbols, 1)}

    @property
    def seq_len(self) -> int:
        return self._first + self.num_hops

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(range(1, self.num_hops + 1))

    @property
    def chance(self) -> float:
        return 1.0 / self.num_symbols

    def shortcuts(self) -> dict:
        """Repeating the start symbol s at every hop is right whenever the cycle of f through s has a length
        dividing the hop count; that length is uniform on 1..num_symbols for a random permutation, so this
        scores (number of divisors of j that are <= num_symbols) / num_symbols at hop j: 1/16, 2/16, 2/16, 3/16,
        2/16 for hops 1..5 at 16 symbols (12.5% overall), with no pointer followed."""
        at = 2 + 2 * self.num_symbols

        def repeat_start(inputs: np.ndarray) -> np.ndarray:
            return np.repeat(inputs[:, at:at + 1], inputs.shape[1], axis=1)

        return {"repeat the start symbol": repeat_start}

    def sample(self, rng: np.random.Generator, n: int, split: str = "train") -> Batch:
        k, hops = self.num_symbols, self.num_hops
        sym0, hop = self.roles["symbols"].start, self.roles["hop"].start
        f = _permutations(rng, n, k)  # f[r, x]: the image of x in row r
        shown = _permutations(rng, n, k)  # the order in which the pairs are shown
        image = np.take_along_axis(f, shown, axis=1)
        start = rng.integers(0, k, n)
        chain = np.empty((n, hops), dtype=np.int64)
        cur = start
        for j in range(hops):
            cur = f[np.arange(n), cur]
            chain[:, j] = cur
        inputs = np.concatenate([np.full((n, 1), BOS), interleave(sym0 + shown, sym0 + image),
                                 np.full((n, 1), SEP), sym0 + start[:, None],
                                 np.full((n, self.seq_len - 3 - 2 * k), hop)], axis=1).astype(np.int64)
        labels = np.full_like(inputs, IGNORE)
        difficulty = np.full_like(inputs, NO_LEVEL)
        at = self._first + np.arange(hops)
        labels[:, at] = sym0 + chain
        difficulty[:, at] = np.arange(1, hops + 1)
        return Batch(inputs, labels, difficulty)
