"""Learning-rate grids: every variant trained at every learning rate (and seed), each reported at its own best lr,
chosen on validation data only, and the sensitivity curve (the validation metric against lr, one line per
variant) with every grid point drawn. Shared by ``ddl compare --lrs`` (validation loss, lower is better) and
``ddl tasks run --lrs`` (validation accuracy, higher is better).

A grid point is one finished (variant, lr, seed) run, as a dict ``{"variant", "lr", "seed", "value",
"diverged"}``: ``value`` the run's final validation metric, ``diverged`` None or why the run counts as diverged
(a non-finite loss, or a loss above the stated limit), in which case ``value`` is None. Divergence is a data
point, never an error.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from deep_delta.experiments.stats import mean_sd
from deep_delta.fsutil import save_figure

# A run whose final loss is above this many times ln(vocabulary size), the loss of a uniform guess over the
# vocabulary (about where training starts), has diverged even when the loss stayed finite.
DIVERGENCE_FACTOR = 1.5


def check_lrs(lrs: Sequence[float]) -> list[float]:
    """The grid as floats, in the order given; refused when empty, with a value that is not a finite number > 0,
    with a value twice, or with two values that share a name (:func:`lr_name`: 6 significant digits), whose runs
    would share a directory."""
    values = list(lrs)
    bad = [x for x in values if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
           or x <= 0]
    twice = sorted({x for x in values if values.count(x) > 1})
    if not values or bad or twice:
        got = (f"{bad!r} (not a finite number > 0)" if bad else f"{twice!r} more than once" if twice
               else "no value")
        raise ValueError(f"`lrs` got {got}; allowed: one or more distinct finite learning rates > 0, "
                         "e.g. 5e-4 1e-3 2e-3 4e-3")
    names: dict[str, float] = {}
    for x in values:
        other = names.setdefault(lr_name(x), x)
        if other != x:
            raise ValueError(f"`lrs` got {other!r} and {x!r}, which share the name {lr_name(x)} (its runs' "
                             "directory; lrs are named with 6 significant digits); allowed: lrs that differ within "
                             "their first 6 significant digits")
    return [float(x) for x in values]


def variant_grids(lrs: Sequence[float] | Mapping[str, Sequence[float]], variants: Sequence[str]
                  ) -> dict[str, list[float]]:
    """Each variant's own grid: ``lrs`` a list (every variant's grid) or a mapping {variant: grid}, with the key
    ``"*"`` for the grid of the variants not named (``ddl compare --lrs 1e-3 2e-3 ddl-cc=8e-3,1.6e-2``). Refused:
    a variant without a grid, a grid for a variant not compared, a grid that :func:`check_lrs` refuses."""
    if not isinstance(lrs, Mapping):
        shared = check_lrs(lrs)
        return {v: list(shared) for v in variants}
    unknown = sorted(set(lrs) - set(variants) - {"*"})
    if unknown:
        raise ValueError(f"`lrs` gives a grid for {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} "
                         f"not compared; allowed: grids for the compared variants ({', '.join(variants)})")
    grids = {}
    for v in variants:
        grid = lrs.get(v, lrs.get("*"))
        if grid is None:
            raise ValueError(f"`lrs` gives no grid for {v!r}; allowed: a grid for every compared variant (a grid of "
                             "plain lrs serves the variants not named: --lrs 1e-3 2e-3 ddl-cc=4e-3,8e-3)")
        try:
            grids[v] = check_lrs(grid)
        except ValueError as e:
            raise ValueError(f"{v}'s grid: {e}") from None
    return grids


def shared_grid(grids: Mapping[str, Sequence[float]]) -> list[float] | None:
    """The one grid every variant has (sorted), or None when the variants have grids of their own."""
    found = {tuple(sorted(g)) for g in grids.values()}
    return list(found.pop()) if len(found) == 1 else None


def lr_name(lr: float) -> str:
    """How an lr names its runs and rows: ``lr_0.002`` (6 significant digits)."""
    return f"lr_{lr:g}"


def lr_dir(out: str | os.PathLike, lr: float) -> Path:
    """Where the runs at ``lr`` live: ``out/lr_<lr>`` (``lr_0.002``), one complete study per lr."""
    return Path(out) / lr_name(lr)


def divergence(loss: float | None, limit: float, what: str = "loss") -> str | None:
    """Why a run with final ``loss`` counts as diverged (NaN or inf, or above ``limit``; None: the run has no
    such loss to judge by), or None."""
    if loss is None:
        return f"no final {what}"
    if not math.isfinite(loss):
        return f"non-finite {what} ({loss})"
    if loss > limit:
        return f"{what} {loss:.4f} above the divergence limit {limit:.4f}"
    return None


def choose_lrs(points: list[dict], variants: Sequence[str], lrs: Sequence[float] | Mapping[str, Sequence[float]],
               *, higher_is_better: bool) -> dict[str, dict[str, Any]]:
    """Each variant's best lr from the grid points' validation ``value`` alone: the lr with the best mean over
    seeds among those at which no seed diverged. ``lrs``: every variant's grid, or each variant's own
    ({variant: grid}). Per variant: ``lr`` (None when every lr had a divergence), ``why`` (None, or a sentence
    saying why there is no lr), ``edge`` ("lowest" / "highest" when the chosen lr is the smallest / largest of
    several in the variant's grid: the optimum may lie beyond it; else None) and ``by_lr`` (mean, sd, n and
    diverged seeds per lr of its grid)."""
    chosen = {}
    for variant in variants:
        mine_lrs = lrs[variant] if isinstance(lrs, Mapping) else lrs
        by_lr, best = {}, None
        for lr in mine_lrs:
            mine = [p for p in points if p["variant"] == variant and p["lr"] == lr]
            values = [p["value"] for p in mine if not p["diverged"]]
            failed = [p["seed"] for p in mine if p["diverged"]]
            mean, sd = mean_sd(values)
            by_lr[f"{lr:g}"] = {"lr": lr, "mean": mean, "sd": sd, "n": len(values), "diverged_seeds": failed}
            if failed or mean is None:
                continue
            if best is None or (mean > by_lr[f"{best:g}"]["mean"] if higher_is_better
                                else mean < by_lr[f"{best:g}"]["mean"]):
                best = lr
        why = None
        if best is None:
            everywhere = all(cell["n"] == 0 for cell in by_lr.values())
            why = ("diverged at every lr" if everywhere else
                   "diverged in at least one seed at every lr")
        edge = None
        if best is not None and len(mine_lrs) > 1:
            edge = "lowest" if best == min(mine_lrs) else "highest" if best == max(mine_lrs) else None
        chosen[variant] = {"lr": best, "why": why, "edge": edge, "by_lr": by_lr}
    return chosen


# The widest step between neighbouring lrs of a grid that still brackets an optimum finely enough (issue 48): a
# loss-against-lr curve can have two basins (DDL-TC's did), and a step wider than 2x can jump one.
MAX_GRID_STEP = 2.0


def grid_gaps(lrs: Sequence[float]) -> list[tuple[float, float]]:
    """The neighbouring pairs (low, high) of the sorted grid more than ``MAX_GRID_STEP`` apart."""
    ordered = sorted(lrs)
    return [(lo, hi) for lo, hi in zip(ordered, ordered[1:]) if hi / lo > MAX_GRID_STEP * (1 + 1e-9)]


def _ratio_text(ratio: float) -> str:
    """A ratio above ``MAX_GRID_STEP`` with the digits that show it is above (2.000001, not 2)."""
    for digits in range(3, 13):
        text = f"{ratio:.{digits}g}"
        if float(text) > MAX_GRID_STEP:
            return text
    return repr(ratio)


def gap_warning(lrs: Sequence[float]) -> str | None:
    """A sentence naming the grid's gaps wider than 2x (an optimum inside one would be missed), or saying that a
    grid of one lr chooses nothing; None for a grid without either."""
    if len(set(lrs)) == 1:
        return (f"warning: the lr grid has one point ({lrs[0]:g}): it chooses nothing, every variant is reported at "
                "that lr (a grid of several lrs, in factors of 2, chooses each variant's own)")
    gaps = grid_gaps(lrs)
    if not gaps:
        return None
    spans = ", ".join(f"{lo:g} to {hi:g} ({_ratio_text(hi / lo)}x)" for lo, hi in gaps)
    return (f"warning: the lr grid has {'a gap' if len(gaps) == 1 else 'gaps'} wider than {MAX_GRID_STEP:g}x: "
            f"{spans}; a best lr inside {'it' if len(gaps) == 1 else 'them'} would be missed (docs/evidence.md: "
            "grids in factors of 2 without gaps)")


def grid_table(chosen: dict[str, dict], lrs: Sequence[float], fmt) -> str:
    """Markdown: a row per variant, a column per lr, each cell the mean +- sd over seeds of the validation metric
    (``fmt`` formats one number), "diverged" where every seed did, the chosen lr in bold, and a chosen lr at
    the grid's edge said to be one (the variant's optimum may lie beyond it: its comparison is then not at its
    best lr); below the table, a grid with a gap wider than 2x, or of one lr, said to be one (:func:`gap_warning`).
    The columns go from the lowest lr to the highest, whatever order the grid was given in."""
    lrs = sorted(lrs)
    head = "| variant | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | chosen lr |"
    lines = [head, "|" + " --- |" * (len(lrs) + 2)]
    own_grids = False
    for variant, c in chosen.items():
        cells = []
        for lr in lrs:
            cell = c["by_lr"].get(f"{lr:g}")
            if cell is None:  # not in this variant's own grid
                own_grids = True
                cells.append("-")
                continue
            text = "diverged" if cell["n"] == 0 else fmt(cell["mean"]) + (
                f" +- {fmt(cell['sd'])}" if cell["sd"] is not None else "")
            if cell["n"] and cell["diverged_seeds"]:
                text += f" (diverged in seed(s) {', '.join(map(str, cell['diverged_seeds']))})"
            cells.append(f"**{text}**" if lr == c["lr"] else text)
        if c["lr"] is None:
            cells.append(c["why"])
        elif len(c["by_lr"]) == 1:
            cells.append(f"{c['lr']:g} (the grid's only lr: nothing was chosen)")
        else:
            edge = c.get("edge")
            beyond = "below" if edge == "lowest" else "above"
            cells.append(f"{c['lr']:g}" + (f" (the grid's {edge}: the best may lie {beyond} it)" if edge else ""))
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    if own_grids:
        lines += ["", "Each variant has its own grid; `-`: an lr outside the variant's grid (not trained)."]
    warnings = {v: gap_warning([float(k) for k in c["by_lr"]]) for v, c in chosen.items()} if own_grids else {
        None: gap_warning(lrs)}
    for v, warning in warnings.items():
        if warning:
            lines += ["", (f"{v}'s grid: " if v else "") + (warning if v else warning[0].upper() + warning[1:])]
    return "\n".join(lines)


def sensitivity_figure(points: list[dict], variants: Sequence[str], ylabel: str, title: str):
    """The sensitivity curve: for each variant, the mean over seeds of the validation metric against lr (log
    scale; lrs where every seed diverged leave a gap), the band between its lowest and highest seed, every
    finished grid point as a dot (``gid`` ``"points:VARIANT"``) and every diverged one as an x above them all
    (``gid`` ``"diverged:VARIANT"``, a row per variant). Returns the matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    finite = [p["value"] for p in points if not p["diverged"]]
    top = max(finite) if finite else 1.0
    bottom = min(finite) if finite else 0.0
    span = top - bottom or 1.0
    for i, variant in enumerate(variants):
        color = f"C{i}"
        x_mark = top + (0.06 + 0.04 * i) * span  # a diverged point: above every finished one, a row per variant
        mine = [p for p in points if p["variant"] == variant]
        lrs = sorted({p["lr"] for p in mine})
        xs, mean, lo, hi = [], [], [], []
        for lr in lrs:
            values = [p["value"] for p in mine if p["lr"] == lr and not p["diverged"]]
            xs.append(lr)
            mean.append(statistics.fmean(values) if values else float("nan"))
            lo.append(min(values) if values else float("nan"))
            hi.append(max(values) if values else float("nan"))
        ax.plot(xs, mean, "-", color=color, label=variant)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)
        ok = [p for p in mine if not p["diverged"]]
        bad = [p for p in mine if p["diverged"]]
        ax.scatter([p["lr"] for p in ok], [p["value"] for p in ok], color=color, s=14, zorder=3,
                   gid=f"points:{variant}")
        ax.scatter([p["lr"] for p in bad], [x_mark] * len(bad), color=color, marker="x", s=40, zorder=3,
                   gid=f"diverged:{variant}", label=f"{variant}: diverged" if bad else None)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_sensitivity(points: list[dict], variants: Sequence[str], path: str | os.PathLike, ylabel: str,
                     title: str) -> Path:
    """:func:`sensitivity_figure` saved to ``path`` (replaced atomically)."""
    return save_figure(sensitivity_figure(points, variants, ylabel, title), path, dpi=120)


def grid_text(lrs: Sequence[float], grids: Mapping[str, Sequence[float]] | None = None) -> str:
    """How a report names the grid: "the grid 1e-3, 2e-3" (one grid), or each variant's own."""
    if grids and shared_grid(grids) is None:
        return "its own grid (" + "; ".join(f"{v} {', '.join(f'{lr:g}' for lr in sorted(g))}"
                                            for v, g in grids.items()) + ")"
    return f"the grid {', '.join(f'{lr:g}' for lr in lrs)}"


def selection_sentence(lrs: Sequence[float], metric: str, grids: Mapping[str, Sequence[float]] | None = None) -> str:
    """The report's header line saying how the lr was chosen."""
    return (f"Learning rate: each variant at its own best lr of {grid_text(lrs, grids)}, "
            f"chosen on the {metric} alone (the best mean over seeds among the lrs at which no seed diverged); "
            "the numbers below are that lr's runs, paired by seed.")


def shared_lr_sentence(lr: float | None) -> str:
    """The header line of a report without a grid."""
    return (f"Learning rate: one shared lr ({lr:g}) for every variant, not tuned per variant (`--lrs` tunes it: "
            "each variant at its own best lr on validation data)." if lr is not None else
            "Learning rate: one shared lr for every variant, not tuned per variant.")
