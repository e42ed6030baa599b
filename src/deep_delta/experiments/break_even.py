"""The break-even step-cost ratio of an equal-steps comparison: how much dearer a variant's step may be and still
tie the reference at equal cost. Plain Python (no PyTorch), checked against power-law curves with a known answer.

The reference trained ``N`` steps and reached ``L_b(N)``; the variant's validation curve, of a run of the same
``N`` steps, is ``L_v(s)``. The ratio ``r*`` solves ``L_v(N / r*) = L_b(N)``: a variant whose step costs ``r``
times the reference's would, at the reference's cost, train ``N / r`` steps; it ties when ``r = r*``, is ahead for
``r < r*`` and behind for ``r > r*`` (``r* > 1``: it may be up to ``r*`` times slower per step; ``r* < 1``: it is
behind even at equal steps and would need a faster step).

How it is read off the curve:

- between two validation points the curve is interpolated linearly in log(loss) against log(step) (a power law
  between them; exact for ``L = a * s**-alpha``);
- the step ``s*`` is where the curve comes down to ``L_b(N)`` for the last time (after it, every validation is
  at or below ``L_b(N)``), so that a noisy dip earlier in training does not count;
- outside the curve nothing is extrapolated: a variant already at or below ``L_b(N)`` at its first validation
  point ``s_1`` has ``r* > N / s_1`` (``outside`` "above"); one above ``L_b(N)`` at its last point (``N``) has
  ``r* < 1`` (``outside`` "below": behind at equal steps, by how much its curve cannot say).

The truncated-curve approximation: step ``s`` of an ``N``-step run is not the end of an ``s``-step run. The
N-step run's cosine schedule is still high at ``s``, while an ``s``-step run has decayed its learning rate by
then: the decay anneals the loss down, but the shorter schedule also spends fewer steps at a high lr, so
``L_v(N / r)`` may lie above or below what an ``N / r``-step run reaches. ``ddl compare --break-even-check
VARIANT=R`` trains the exact run (``N / R`` steps with its own schedule, as ``--step-costs`` does) and
:func:`check_row` states the error (measured on a 40-step debug study: +0.41 nats at N / R = 16 steps, the exact
run worse than its curve: the error is not small at short budgets and must be measured where it is used).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from deep_delta.experiments.report import ci_text, fmt
from deep_delta.experiments.stats import mean_sd, t975

METHOD = ("r* solves L_v(N / r*) = L_b(N) on the variant's validation curve, interpolated linearly in log(loss) "
          "against log(step) between validation points, at the last time it comes down to L_b(N); per seed, "
          "paired with the reference of that seed; interval: the 95% t-interval of the mean of log r* over the "
          "seeds, exponentiated (a geometric mean)")


def loglog_value(curve: Sequence[Sequence[float]], step: float) -> float | None:
    """The curve's loss at ``step`` (``curve``: ``[step, loss]`` pairs), interpolated linearly in log-log between
    its points; None outside ``[first step, last step]`` (nothing is extrapolated) or where a value is not > 0."""
    pts = _points(curve)
    if not pts or step < pts[0][0] or step > pts[-1][0]:
        return None
    for (s0, l0), (s1, l1) in zip(pts, pts[1:]):
        if s0 <= step <= s1:
            if s1 == s0:
                return l0
            w = (math.log(step) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return math.exp(math.log(l0) + w * (math.log(l1) - math.log(l0)))
    return pts[-1][1]


def _points(curve: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    pts = sorted((float(s), float(v)) for s, v in curve)
    if any(s <= 0 or not math.isfinite(v) or v <= 0 for s, v in pts):
        return []
    return pts


def crossing_step(curve: Sequence[Sequence[float]], target: float) -> tuple[float | None, str | None]:
    """``(s*, None)``: the step at which the curve comes down to ``target`` for the last time (log-log
    interpolated); ``(None, "above")`` when it is at or below ``target`` from its first point on; ``(None,
    "below")`` when its last point is above ``target`` (or the curve is empty)."""
    pts = _points(curve)
    if not pts or pts[-1][1] > target:
        return None, "below"
    above = [i for i, (_, v) in enumerate(pts) if v > target]
    if not above:
        return None, "above"
    (s0, l0), (s1, l1) = pts[above[-1]], pts[above[-1] + 1]
    if l1 == l0:
        return s1, None
    w = (math.log(target) - math.log(l0)) / (math.log(l1) - math.log(l0))
    return math.exp(math.log(s0) + w * (math.log(s1) - math.log(s0))), None


def break_even(curve: Sequence[Sequence[float]], steps: int, target: float) -> dict:
    """One seed's break-even ratio: ``r`` (``steps / s*``, None outside the curve), ``outside`` (None, "above" or
    "below": :func:`crossing_step`) and ``bound`` (outside the curve, the bound the curve does give: ``r* >
    bound`` above, ``r* < bound`` below)."""
    pts = _points(curve)
    if target is None or not math.isfinite(target) or target <= 0 or not pts:
        return {"r": None, "outside": "no curve", "bound": None}
    s, outside = crossing_step(pts, target)
    if outside == "above":
        return {"r": None, "outside": "above", "bound": steps / pts[0][0]}
    if outside == "below":
        return {"r": None, "outside": "below", "bound": steps / pts[-1][0]}
    return {"r": steps / s, "outside": None, "bound": None}


def summarize(per_seed: list[dict]) -> dict:
    """Over the seeds (each a :func:`break_even` result with its ``seed``): the geometric mean of ``r`` and the 95%
    t-interval of the mean of log r, exponentiated (None for fewer than two seeds); with any seed outside the curve,
    no mean or interval, and ``outside`` lists those seeds."""
    outside = [x["seed"] for x in per_seed if x["r"] is None]
    logs = [math.log(x["r"]) for x in per_seed if x["r"] is not None]
    result = {"per_seed": per_seed, "geo_mean": None, "ci95": None, "outside_seeds": outside, "n": len(per_seed)}
    if outside or not logs:
        return result
    mean, sd = mean_sd(logs)
    result["geo_mean"] = math.exp(mean)
    if sd is not None:
        half = t975(len(logs) - 1) * sd / math.sqrt(len(logs))
        result["ci95"] = [math.exp(mean - half), math.exp(mean + half)]
    return result


def verdict(summary: dict, measured: float | None, spread: Sequence[float] | None = None) -> str:
    """Whether a design pays on this machine: its measured step-cost ratio against r* (below the whole interval:
    it pays; above it: it does not; inside: undecided). ``spread``: the lowest and highest ratio over the timing
    rounds (``[low, high]``); a verdict that differs at either end of it is undecided, saying so (a rerun that timed
    the steps again may land anywhere in it)."""
    if measured is None:
        return "no step time measured"
    word, why = _call(summary, measured)
    if not spread or not _timed(summary):
        return f"{word} ({why})"
    rounds = f"{spread[0]:.3f}-{spread[1]:.3f}"
    if verdict_word(summary, measured, spread) == word:
        return (f"{word} ({why}, at every timing round's ratio too, {rounds})" if word != "undecided" else
                f"{word} ({why}; the timing rounds' ratios {rounds})")
    ends = ", ".join(f"{_call(summary, x)[0]} at {x:.3f}" for x in spread)
    return (f"undecided ({word} at the median ratio {measured:.3f}, but not over the timing rounds' ratios {rounds}: "
            f"{ends})")


def verdict_word(summary: dict, measured: float, spread: Sequence[float] | None = None) -> str:
    """The verdict's word at the measured ratio ("pays", "does not pay", "undecided"): "undecided" too where it
    differs at an end of the timing rounds' ``spread``."""
    word = _call(summary, measured)[0]
    return word if not spread or {_call(summary, x)[0] for x in spread} == {word} else "undecided"


def _timed(summary: dict) -> bool:
    """Whether the verdict on ``summary`` depends on the measured ratio (not where every seed is behind at equal
    steps)."""
    seeds = summary.get("per_seed") or []
    return summary.get("geo_mean") is not None or not (seeds and all(x["outside"] == "below" for x in seeds))


def _call(summary: dict, measured: float) -> tuple[str, str]:
    """The verdict at the measured ratio ``measured``: ("pays" / "does not pay" / "undecided", why)."""
    r, ci = summary.get("geo_mean"), summary.get("ci95")
    if r is None:
        seeds = summary.get("per_seed") or []
        if seeds and all(x["outside"] == "below" for x in seeds):
            return "does not pay", "behind at equal steps in every seed"
        if seeds and all(x["outside"] == "above" and measured < x["bound"] for x in seeds):
            return "pays", "r* above the measured ratio in every seed"
        return "undecided", "r* outside the curve in some seeds"
    low, high = ci if ci else (r, r)
    if measured < low:
        return "pays", "measured ratio below r*"
    if measured > high:
        return "does not pay", "measured ratio above r*"
    return "undecided", "measured ratio inside the interval of r*"


def seed_text(x: dict) -> str:
    """One seed's r* as the report shows it: ``1.31``, ``> 4.00`` (above the curve), ``< 1.00`` (below)."""
    if x["r"] is not None:
        return f"{x['r']:.3f}"
    if x["outside"] == "above":
        return f"> {x['bound']:.3f}"
    if x["outside"] == "below":
        return f"< {x['bound']:.3f}"
    return "-"


def check_row(variant: str, ratio: float, steps: int, exact_loss: float | None, curve: Sequence[Sequence[float]],
              reference_loss: float | None, seed: int) -> dict:
    """The exact run's check of the truncated-curve approximation: the variant trained ``steps`` (= N / ``ratio``)
    with its own schedule reached ``exact_loss``; its N-step curve says ``estimate`` at that step. ``error`` =
    exact - estimate (negative: the curve overstates the loss there; positive: it understates it); ``tie``: whether the
    exact run is below (``"ahead"``) or above (``"behind"``) the reference's ``reference_loss`` at equal cost, so
    the true r* is above or below ``ratio``."""
    estimate = loglog_value(curve, steps)
    error = exact_loss - estimate if exact_loss is not None and estimate is not None else None
    tie = None
    if exact_loss is not None and reference_loss is not None:
        tie = "ahead" if exact_loss < reference_loss else "behind"
    return {"variant": variant, "ratio": ratio, "steps": steps, "seed": seed, "exact_loss": exact_loss,
            "estimate": estimate, "error": error, "reference_loss": reference_loss, "tie": tie,
            "why": None if estimate is not None else "the step falls outside the variant's validation curve"}


def break_even_table(summary: dict[str, Any]) -> list[str]:
    """The break-even step-cost ratio r* of every equal-steps row beside the step-cost ratio measured on this
    machine, and the exact runs that check the approximation (``break_even_checks``); [] when there is none."""
    rows = [r for r in summary["rows"] if r.get("break_even")]
    if not rows:
        return []
    lines = ["| variant | r* per seed | r* (geometric mean) | 95% CI of r* | measured step ratio | here |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    for r in rows:
        b = r["break_even"]
        seeds = ", ".join(f"{x['seed']}: {seed_text(x)}" for x in b["per_seed"])
        mean = fmt(b["geo_mean"], ".3f") if b["geo_mean"] is not None else (
            f"outside the curve in seed(s) {', '.join(map(str, b['outside_seeds']))}")
        spread = r.get("time_ratio_spread")
        measured = fmt(r.get("time_ratio"), ".3f") + (f" ({spread[0]:.3f}-{spread[1]:.3f})" if spread else "")
        lines.append(f"| {r['variant']} | {seeds} | {mean} | {ci_text(b['ci95'], '.3f')} "
                     f"| {measured} | {verdict(b, r.get('time_ratio'), spread)} |")
    lines += retimed_lines(summary, rows)
    for c in summary.get("break_even_checks") or []:
        if c["error"] is None:
            lines.append(f"\nCheck of {c['variant']} at r = {c['ratio']:g} ({c['steps']} steps, seed {c['seed']}): "
                         f"{c['why'] or 'no final validation loss'}.")
            continue
        side = ("below" if c["tie"] == "ahead" else "above") if c["tie"] else None
        lines.append(
            f"\nCheck of {c['variant']} at r = {c['ratio']:g} (seed {c['seed']}): the exact run of {c['steps']} steps "
            f"with its own schedule reached {c['exact_loss']:.4f}; its {summary['settings'].get('steps') or 'N'}-step "
            f"curve says {c['estimate']:.4f} at step {c['steps']}: measured error (exact minus the curve's estimate) "
            f"{c['error']:+.4f} nats."
            + (f" The exact run is {'ahead of' if c['tie'] == 'ahead' else 'behind'} {summary['reference']} "
               f"({c['reference_loss']:.4f}) at equal cost, so the true r* lies "
               f"{'above' if side == 'below' else 'below'} {c['ratio']:g}." if side else ""))
    return lines


def retimed_lines(summary: dict[str, Any], rows: list[dict]) -> list[str]:
    """Where the step times were measured again after an earlier report had measured them (``timing.earlier``):
    each variant's ratio then and now, and its verdict where it changed; [] otherwise."""
    changed = [r for r in rows if r.get("earlier_time_ratio") is not None and r.get("time_ratio") is not None]
    if not changed:
        return []
    parts = []
    for r in changed:
        b, then, now = r["break_even"], r["earlier_time_ratio"], r["time_ratio"]
        before, after = verdict_word(b, then), verdict_word(b, now, r.get("time_ratio_spread"))
        parts.append(f"{r['variant']} {then:.3f} then, {now:.3f} now"
                     + (f" ('{before}' then, '{after}' now)" if before != after else ""))
    earlier = summary["timing"]["earlier"]
    return [f"\nThe step times were measured again (the earlier report's, in {earlier.get('file', 'its summary')}, "
            f"{earlier.get('repeats', '?')} rounds): measured step ratio " + "; ".join(parts) + "."]


NOTE = (
    "r*: the step-cost ratio at which the variant's loss would equal the reference's at equal cost: with the "
    "reference at L_b(N) after N steps and the variant's validation curve L_v(s) (r* > 1: its step may be up to r* "
    "times dearer and still tie; r* < 1: behind even at equal steps), {method}. "
    "'> x': the variant is already at L_b(N) at its first validation point (r* above x); '< x': it is above L_b(N) "
    "at its last (r* below x); neither is extrapolated. The curve is of an N-step run: at step N / r its cosine "
    "schedule has not decayed as an N / r-step run's has, so the two losses differ, in either direction (the decay "
    "anneals the loss down; a shorter schedule also spends fewer steps at a high lr); `--break-even-check "
    "VARIANT=R` trains the exact run and states the error. "
    "Measured step ratio: the variant's step time over the reference's, timed in this process (step ms), the median "
    "over the interleaved timing rounds (`--time-repeats`), and in brackets the lowest and highest ratio of one round "
    "(every variant is timed once per round, under one load); the design pays on this machine when the ratio is "
    "below r*, and a verdict that would differ anywhere in that spread is undecided.")


__all__ = ["METHOD", "NOTE", "break_even", "break_even_table", "check_row", "crossing_step", "loglog_value",
           "retimed_lines", "seed_text", "summarize", "verdict", "verdict_word"]
