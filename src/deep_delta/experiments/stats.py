"""Small statistics for seeded comparisons: mean and sd, paired differences with a t-interval, and the value
a curve had reached at a given step. Plain Python (no SciPy), checked against hand-computed examples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# Two-sided 95% quantiles of Student's t, t_{0.975}(df), df = 1..30 (standard tables, 3 decimals).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """t_{0.975} with ``df`` degrees of freedom (beyond 30: the normal quantile with a 1/df correction)."""
    if df < 1:
        raise ValueError(f"`df` got {df}; allowed: an integer >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    return 1.959964 + 2.37 / df  # within 0.002 of the exact quantile for df > 30


def mean_sd(xs: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None where there are too few values)."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)


def paired_difference(a: Sequence[float | None], b: Sequence[float | None]) -> dict:
    """Paired differences ``a[i] - b[i]`` over the pairs where both exist: their mean, sd, the 95% t-interval
    of the mean (None for fewer than two pairs), how many pairs have ``a < b`` ("wins" when lower is better)
    and how many pairs there are."""
    diffs = [x - y for x, y in zip(a, b) if x is not None and y is not None and math.isfinite(x - y)]
    mean, sd = mean_sd(diffs)
    ci = None
    if sd is not None:
        half = t975(len(diffs) - 1) * sd / math.sqrt(len(diffs))
        ci = [mean - half, mean + half]
    return {"mean": mean, "sd": sd, "ci95": ci, "wins": sum(d < 0 for d in diffs), "n": len(diffs)}


def value_at(curve: Sequence[tuple[float, float]], x: float) -> float | None:
    """The curve's value at ``x`` by linear interpolation between its points (sorted by x); None before its
    first point; its last value beyond the last point only when ``x`` equals it (no extrapolation)."""
    pts = sorted(curve)
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]
