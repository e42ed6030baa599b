"""What one ``ddl compare`` trains and reports, decided in one place: the :class:`ComparePlan`.

A plan names the runs that select (each variant's lr grid at the selection seeds, on the ``val`` split) and the runs
that report (the same runs where there is no grid or no evaluation seed; else fresh evaluation seeds at each
variant's chosen lr, on the ``test`` split), the break-even checks and the width / length points. It is built once,
every setting checked before anything trains (:func:`build_plan`), or read back from what a comparison's directory
holds (:func:`recorded_mode`, for ``--report-only``); the runner (:func:`deep_delta.experiments.runner.
run_plan`), ``--report-only`` (:mod:`deep_delta.experiments.collect`) and the report (``summary["plan"]``,
:func:`plan_of`) all read it. Its modes stand beside each other:

- ``single``: every variant at one lr, the runs that train are the runs that report (on ``val``);
- ``grid``: every variant at every lr of its own grid; each reported at its best lr, chosen and reported on the same
  seeds and ``val`` sample (the report says so);
- ``held_out``: the grid at the selection seeds chooses; fresh runs at the chosen lrs with the evaluation seeds
  report, on ``test`` (and the break-even checks, at the first evaluation seed);
- ``scaling``: the ``single`` or ``grid`` plan at every (width, length), in ``d<W>_s<STEPS>/``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deep_delta.settings import MAX_SEEDS

if TYPE_CHECKING:
    from deep_delta.train.config import TrainConfig

# the step costs an equal-cost comparison takes: a step between a hundredth and a hundred times the reference's
MIN_STEP_COST, MAX_STEP_COST = 0.01, 100.0
# how far a variant's whole steps may cost from the reference's budget and still be called equal cost
STEP_BUDGET_TOLERANCE = 0.05
EVAL_DIR = "evaluation"
CHECK_DIR = "break_even"


def reference_variant(variants: Sequence[str]) -> str:
    """The variant a comparison measures the others against: ``baseline`` when compared, else the first."""
    return "baseline" if "baseline" in variants else variants[0]


def cost_steps(steps: int, cost: float) -> int:
    """The optimizer steps that cost what ``steps`` reference steps cost, for a step ``cost`` x as dear."""
    return max(1, round(steps / cost))


@dataclass(frozen=True)
class ComparePlan:
    """Which runs select and which report. ``seeds``: the selection seeds (with no evaluation seed, the seeds
    reported); ``grids``: each variant's lr grid (None: every variant at the settings' one lr); ``eval_seeds``: the
    fresh seeds reported on ``test`` at each variant's chosen lr (empty: none); ``test_tokens``: as asked (None: the
    default); ``step_costs``: {variant: its step's cost over the reference's} (an equal-cost comparison);
    ``checks``: {variant: r}, the break-even checks; ``widths`` / ``lengths``: the width / length study's points."""

    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    grids: dict[str, list[float]] | None = None
    eval_seeds: tuple[int, ...] = ()
    test_tokens: int | None = None
    step_costs: dict[str, float] = field(default_factory=dict)
    checks: dict[str, float] = field(default_factory=dict)
    widths: tuple[int, ...] | None = None
    lengths: tuple[int, ...] | None = None

    @property
    def mode(self) -> str:
        if self.widths is not None or self.lengths is not None:
            return "scaling"
        return "held_out" if self.eval_seeds else "grid" if self.grids is not None else "single"

    @property
    def reference(self) -> str:
        return reference_variant(self.variants)

    @property
    def lrs(self) -> list[float]:
        """Every lr of the variants' grids, each once, increasing: the grid's folders ``lr_<lr>``."""
        return sorted({lr for grid in (self.grids or {}).values() for lr in grid})

    def at(self, lr: float) -> list[str]:
        """The variants whose grid holds ``lr`` (they train at it)."""
        return [v for v in self.variants if lr in (self.grids or {}).get(v, ())]

    @property
    def selection(self) -> ComparePlan:
        """The runs that select: the grid at the selection seeds (``grid``; its report is ``selection.md`` in a
        held-out plan)."""
        return replace(self, eval_seeds=(), test_tokens=None, checks={})

    def at_lr(self, lr: float) -> ComparePlan:
        """The grid's comparison at ``lr`` (``OUT/lr_<lr>``): the variants whose grid holds it, at the selection
        seeds, one shared lr (``single``)."""
        return replace(self, variants=tuple(self.at(lr)), grids=None, eval_seeds=(), checks={}, widths=None,
                       lengths=None)

    @property
    def report_split(self) -> str:
        return "test" if self.eval_seeds else "val"

    @property
    def report_seeds(self) -> list[int]:
        return list(self.eval_seeds or self.seeds)

    def point(self) -> ComparePlan:
        """One point of the width / length study: this plan without its widths and lengths."""
        return replace(self, widths=None, lengths=None)

    def runs(self, base: TrainConfig, out: Path, variants: Sequence[str] | None = None,
             lrs: Mapping[str, float] | None = None, seeds: Sequence[int] | None = None) -> dict[tuple[str, int], Any]:
        """Every run of one comparison in ``out``, in training order (every variant of a seed, then the next seed):
        :func:`run_config` of each (variant, seed) of ``variants`` (default the plan's) and ``seeds`` (default the
        selection seeds), with the variant's step cost and, given ``lrs``, its own lr."""
        seeds = list(self.seeds if seeds is None else seeds)
        return {(v, s): run_config(replace(base, lr=lrs[v]) if lrs else base, v, out, s, len(seeds) > 1,
                                   self.step_costs.get(v))
                for s in seeds for v in (self.variants if variants is None else variants)}

    def report_runs(self, base: TrainConfig, out: Path, chosen: Mapping[str, float]) -> dict[tuple[str, int], Any]:
        """The evaluation runs: each variant of ``chosen`` ({variant: its chosen lr}) with every evaluation seed, in
        ``OUT/evaluation``."""
        return self.runs(base, out / EVAL_DIR, list(chosen), chosen, self.eval_seeds)

    def check_runs(self, base: TrainConfig, out: Path, chosen: Mapping[str, float | None]) -> dict[tuple[str, int], Any]:
        """The break-even checks' exact runs: each checked variant with an lr at its chosen lr and the first
        evaluation seed, trained ``cost_steps(N, r)`` steps with its own schedule, in ``OUT/break_even/r_<r>/VARIANT``."""
        return {(v, self.eval_seeds[0]): run_config(replace(base, lr=chosen[v]), v, check_dir(out, r),
                                                    self.eval_seeds[0], False, r)
                for v, r in self.checks.items() if chosen.get(v) is not None}

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "selection_split": "val", "report_split": self.report_split,
                "report_seeds": self.report_seeds, **asdict(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ComparePlan:
        names = ("variants", "seeds", "grids", "eval_seeds", "test_tokens", "step_costs", "checks", "widths",
                 "lengths")
        kw = {k: d[k] for k in names if k in d}
        for k in ("variants", "seeds", "eval_seeds", "widths", "lengths"):
            if kw.get(k) is not None:
                kw[k] = tuple(kw[k])
        return cls(**kw)

    def describe(self, base: TrainConfig, out: str, threads: int) -> str:
        """The line ``ddl compare`` starts with: what it trains, where, and how the lr is chosen and reported."""
        grids = self.grids or {}
        shared = {tuple(g) for g in grids.values()}
        if len(shared) > 1:
            grid = " each at every lr of its own grid (" + "; ".join(
                f"{v} {' '.join(f'{x:g}' for x in g)}" for v, g in grids.items()) + ")"
        else:
            grid = f" at every lr of {' '.join(f'{x:g}' for x in next(iter(grids.values())))}" if grids else ""
        if self.step_costs:
            grid += "; equal cost: " + ", ".join(f"{v}'s step {c:g}x the baseline's" for v, c in self.step_costs.items())
        steps = "/".join(map(str, self.lengths)) if self.lengths else str(base.steps)
        widths = f", widths {' '.join(map(str, self.widths))}" if self.widths else ""
        seeds = f"paired seeds {', '.join(map(str, self.seeds))}"
        if self.eval_seeds:
            seeds = (f"lr chosen on val at the selection seeds {', '.join(map(str, self.seeds))}, reported on test at "
                     f"the evaluation seeds {self.eval_seeds[0]}..{self.eval_seeds[-1]}")
        elif grids:
            seeds += " (lr chosen and reported on the same seeds and validation sample)"
        return (f"ddl compare: {', '.join(self.variants)} at preset {base.preset}{widths}, {steps} steps x "
                f"{base.batch_size} x {base.seq_len} tokens each{grid}, {seeds}; {threads} CPU thread(s); runs in {out}")


POINT_NAME = re.compile(r"d([0-9]+)_s([0-9]+)")  # a width / length study's point: d<W>_s<STEPS>/


def point_dir(out: str | os.PathLike, width: int, steps: int) -> Path:
    return Path(out) / f"d{width}_s{steps}"


def recorded_mode(out: str | os.PathLike) -> str:
    """The mode of the comparison whose records ``out`` holds (what ``--report-only`` reads back): ``scaling``
    (``d<W>_s<STEPS>/`` points), ``held_out`` (an lr grid and ``evaluation/``), ``grid`` (``lr_<lr>/`` folders)
    or ``single``; the runs themselves then say the rest (their variants, seeds and lrs)."""
    out = Path(out)
    if out.is_dir() and any(POINT_NAME.fullmatch(d.name) and d.is_dir() for d in out.iterdir()):
        return "scaling"  # a user's drafts_sorted/ or d1_s1.txt is not a point
    if not out.is_dir() or not any(d.name.startswith("lr_") and d.is_dir() for d in out.iterdir()):
        return "single"
    return "held_out" if (out / EVAL_DIR).is_dir() else "grid"


def plan_of(summary: Mapping[str, Any]) -> ComparePlan | None:
    """The plan a summary was made by (``summary["plan"]``), or, for a summary written before plans were recorded,
    the one its keys imply; None for a summary with neither (a hand-made one)."""
    if isinstance(summary.get("plan"), Mapping):
        return ComparePlan.from_dict(summary["plan"])
    rows = summary.get("rows") or []
    if not rows:
        return None
    held, grid = summary.get("held_out") or {}, summary.get("lr_selection")
    variants = tuple(r["variant"] for r in rows)
    grids = (grid.get("grids") or {v: list(grid["lrs"]) for v in variants}) if grid else None
    return ComparePlan(variants, tuple(held.get("selection_seeds") or summary.get("seeds") or ()), grids,
                       tuple(held.get("eval_seeds") or ()), step_costs=dict(summary.get("step_costs") or {}))


def run_dir(out: str | os.PathLike, variant: str, seed: int, per_seed_dirs: bool) -> Path:
    """Where a comparison keeps the run of ``variant`` and ``seed``: ``out/<variant>`` for one seed, ``out/seed_<s>/
    <variant>`` for several (``per_seed_dirs``): the one layout every writer and reader of a comparison uses."""
    return Path(out) / f"seed_{seed}" / variant if per_seed_dirs else Path(out) / variant


def check_dir(out: str | os.PathLike, ratio: float) -> Path:
    """Where a break-even check of ratio r keeps its exact runs: ``out/break_even/r_<r>``."""
    return Path(out) / CHECK_DIR / f"r_{ratio:g}"


def run_config(base: TrainConfig, variant: str, out: Path, seed: int | None = None, per_seed_dirs: bool = False,
               step_cost: float | None = None) -> TrainConfig:
    """The run of ``variant`` (with ``seed``): ``base`` with its own variant, seed and run directory,
    ``out/<variant>`` or, for several seeds, ``out/seed_<s>/<variant>``; with ``wandb``, the W&B run
    ``<variant>-seed<s>`` (in ``base.wandb_group``, the comparison's group). With ``step_cost`` (its step's
    cost relative to the reference's), :func:`cost_steps` of ``base.steps``: an equal-cost budget with its own
    full lr schedule."""
    seed = base.seed if seed is None else seed
    run = run_dir(out, variant, seed, per_seed_dirs)
    name = f"{variant}-seed{seed}" if base.wandb else base.wandb_run_name
    steps = base.steps if step_cost is None else cost_steps(base.steps, step_cost)
    return replace(base, variant=variant, seed=seed, out=str(run), wandb_run_name=name, steps=steps)


def build_plan(base: TrainConfig, variants: Sequence[str], *, seeds: Sequence[int] | None = None,
               lrs: Sequence[float] | Mapping[str, Sequence[float]] | None = None, eval_seeds: int | None = None,
               eval_seed_start: int = 100, test_tokens: int | None = None,
               step_costs: Mapping[str, float] | None = None, checks: Mapping[str, float] | None = None,
               widths: Sequence[int] | None = None, lengths: Sequence[int] | None = None,
               given: frozenset[str] = frozenset()) -> ComparePlan:
    """The plan of a comparison of ``variants`` on ``base``'s settings, every part checked before anything trains,
    each refusal naming the setting, what it got and what is allowed: the variants and seeds, each variant's lr grid
    (a list: every variant's; a mapping {variant: grid}, ``"*"`` for the variants not named), the evaluation seeds
    (``eval_seeds`` of them from ``eval_seed_start``, apart from the selection seeds; ``given``: the held-out
    settings given explicitly), the step costs and break-even checks against the budgets, and the widths / lengths.
    """
    from deep_delta.experiments.lr_grid import variant_grids

    variants = list(dict.fromkeys(variants))
    seeds = list(dict.fromkeys([base.seed] if seeds is None else seeds))
    if not variants:
        raise ValueError("compare: `variants` is empty; allowed: one or more variant names")
    if not seeds or len(seeds) > MAX_SEEDS or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"compare: `seeds` got {seeds!r}; allowed: 1 to {MAX_SEEDS} integers >= 0")
    scaling = widths is not None or lengths is not None
    if isinstance(lrs, Mapping) and scaling:
        raise ValueError("`lrs` with a grid per variant and `widths` / `lengths`: the width / length study "
                         "takes one grid for every variant; allowed: plain lrs (--lrs 1e-3 2e-3 4e-3)")
    grids = variant_grids(lrs, variants) if lrs is not None else None
    if widths is not None:
        widths = _sizes("widths", widths)
    if lengths is not None:
        lengths = _sizes("lengths", lengths)
    budgets = list(lengths) if lengths else [base.steps]
    costs = check_step_costs(step_costs, variants, budgets, "lengths" if lengths and len(lengths) > 1 else "steps")
    if "eval_seed_start" in given and eval_seeds is None:
        raise ValueError("`eval_seed_start` got a value without `eval_seeds`; allowed: with `eval_seeds` (the first "
                         "of the evaluation seeds; without them no evaluation seed is trained)")
    if eval_seeds is not None and grids is None:
        raise ValueError("`eval_seeds` reports fresh seeds at each variant's chosen lr, but no lr grid was given; "
                         "allowed: with `lrs` (e.g. --lrs 1e-3 2e-3 4e-3)")
    if eval_seeds is not None and scaling:
        raise ValueError("`eval_seeds` with `widths` / `lengths`: the width / length study reports its selection "
                         "runs; allowed: `eval_seeds` with one comparison (its `lrs`)")
    if checks and eval_seeds is None:
        raise ValueError("`break_even_checks` checks r* at the first evaluation seed; allowed: with `eval_seeds`")
    fresh = eval_seed_list(eval_seeds, eval_seed_start, seeds) if eval_seeds is not None else []
    checks = check_break_even_checks(checks, variants, costs, base.steps, base.eval_every)
    return ComparePlan(tuple(variants), tuple(seeds), grids, tuple(fresh), test_tokens, costs, checks,
                       None if widths is None else tuple(widths), None if lengths is None else tuple(lengths))


def _sizes(name: str, values: Sequence[int]) -> list[int]:
    values = list(values)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    twice = sorted({v for v in values if values.count(v) > 1})
    if not values or bad or twice:
        got = f"{bad!r}" if bad else f"{twice!r} more than once" if twice else "no value"
        raise ValueError(f"`{name}` got {got}; allowed: one or more distinct integers >= 1")
    return values


def parse_step_costs(items: Sequence[str] | None, name: str = "step_costs") -> dict[str, float]:
    """``--step-costs VARIANT=RATIO ...`` (or ``--break-even-check``: ``name``) as {variant: ratio}; a malformed
    item is an error naming it."""
    costs = {}
    for item in items or []:
        variant, sep, ratio = item.partition("=")
        try:
            value = float(ratio) if sep and variant else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError(f"`{name}` got {item!r}; allowed: VARIANT=RATIO, e.g. ddl-cc=1.22")
        if variant in costs:
            raise ValueError(f"`{name}` names {variant!r} twice; allowed: each variant once")
        costs[variant] = value
    return costs


def check_step_costs(step_costs: Mapping[str, float] | None, variants: Sequence[str],
                     budgets: Sequence[int] = (), budget: str = "steps") -> dict[str, float]:
    """``step_costs`` validated against the comparison's variants: each a variant of it other than the reference
    (``baseline`` when present, else the first), with a cost in [MIN_STEP_COST, MAX_STEP_COST]; and against each of
    the reference's step ``budgets``: a variant's whole steps (:func:`cost_steps`) must cost that budget within
    ``STEP_BUDGET_TOLERANCE`` (6 reference steps at a cost of 100 would be one step costing 100: not equal cost);
    ``budget``: the setting the budgets come from (``steps``, or the study's ``lengths``), which a refusal names."""
    step_costs = dict(step_costs or {})
    reference = reference_variant(variants)
    for variant, cost in step_costs.items():
        if variant not in variants:
            raise ValueError(f"compare: `step_costs` names {variant!r}, which is not compared; allowed: one of "
                             f"{', '.join(v for v in variants if v != reference)}")
        if variant == reference:
            raise ValueError(f"compare: `step_costs` names the reference {variant!r}, whose steps are the budget "
                             "(`steps`); allowed: the other variants")
        if (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost)
                or not MIN_STEP_COST <= cost <= MAX_STEP_COST):
            raise ValueError(f"compare: `step_costs` for {variant!r} got {cost!r}; allowed: a number in "
                             f"[{MIN_STEP_COST:g}, {MAX_STEP_COST:g}] (the variant's step time over the reference's)")
        for steps in budgets:
            n = cost_steps(steps, cost)
            # "within 5%" includes 5% exactly: 6 x 1.05 is 6.300000000000001 in binary floating point
            if abs(n * cost - steps) > STEP_BUDGET_TOLERANCE * steps * (1 + 1e-9):
                enough = math.ceil(cost / (2 * STEP_BUDGET_TOLERANCE))
                raise ValueError(
                    f"compare: `step_costs` for {variant!r} ({cost:g}) with `{budget}` {steps}: {variant} would train "
                    f"{n} step(s), which cost {n * cost:g} of the reference's steps, not {steps} (off by "
                    f"{abs(n * cost - steps) / steps:.0%}, more than {STEP_BUDGET_TOLERANCE:.0%}): not an equal cost; "
                    f"allowed: `{budget}` of at least {enough} at this cost, so that whole steps come within "
                    f"{STEP_BUDGET_TOLERANCE:.0%} of the budget")
    return step_costs


def eval_seed_list(count: int, start: int, selection: Sequence[int]) -> list[int]:
    """The evaluation seeds ``start .. start + count - 1``, refused when empty, too many, or sharing a seed with
    the ``selection`` seeds (fresh seeds: no evaluation run repeats a run that chose an lr)."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SEEDS:
        raise ValueError(f"`eval_seeds` got {count!r}; allowed: a count of evaluation seeds, 1 to {MAX_SEEDS}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"`eval_seed_start` got {start!r}; allowed: an integer >= 0")
    seeds = list(range(start, start + count))
    shared = sorted(set(seeds) & set(selection))
    if shared:
        raise ValueError(f"`eval_seed_start` {start} with `eval_seeds` {count} gives the seeds {seeds[0]}..{seeds[-1]}, "
                         f"which share {', '.join(map(str, shared))} with the selection seeds "
                         f"({', '.join(map(str, selection))}); allowed: evaluation seeds apart from the selection "
                         f"seeds, e.g. `eval_seed_start` {max(selection) + 1} or 100")
    return seeds


def check_break_even_checks(checks: Mapping[str, float] | None, variants: Sequence[str],
                            step_costs: Mapping[str, float], steps: int | None = None,
                            eval_every: int = 0) -> dict[str, float]:
    """``checks`` ({variant: r}) validated: each a compared variant other than the reference, trained the
    reference's steps (not an equal-cost variant), with r in [MIN_STEP_COST, MAX_STEP_COST]; given the runs'
    ``steps`` N and ``eval_every``, each r one whose exact run can be checked (:func:`check_on_curve`)."""
    checks = dict(checks or {})
    reference = reference_variant(variants)
    for variant, r in checks.items():
        if variant not in variants or variant == reference or variant in step_costs:
            allowed = ", ".join(v for v in variants if v != reference and v not in step_costs)
            raise ValueError(f"`break_even_checks` names {variant!r}; allowed: a compared variant that trains the "
                             f"reference's steps, not the reference ({allowed or 'none'})")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not MIN_STEP_COST <= r <= MAX_STEP_COST:
            raise ValueError(f"`break_even_checks` for {variant!r} got {r!r}; allowed: a ratio in "
                             f"[{MIN_STEP_COST:g}, {MAX_STEP_COST:g}] (near the variant's r*)")
        if steps is not None:
            check_on_curve(variant, r, steps, eval_every)
    return checks


def check_on_curve(variant: str, r: float, steps: int, eval_every: int) -> None:
    """Refuse a break-even check whose exact run cannot check the curve, before anything trains: its
    :func:`cost_steps` ``n`` of N = ``steps`` must fall on the variant's validation curve (from its first
    validation, at ``eval_every``, to N: r in [1, N / first]; r < 1 never does), and cost N within
    ``STEP_BUDGET_TOLERANCE``, as ``step_costs`` must (6 steps at r = 1.1 train 5, which cost 5.5: not equal cost);
    the refusal names the nearest ratios that fit."""
    first = min(eval_every, steps) if eval_every else steps
    n = cost_steps(steps, r)
    if r < 1 or not first <= n <= steps:
        fits = _fitting_ratios(steps, first, STEP_BUDGET_TOLERANCE)
        run = (f"below 1, its exact run (N / r = {steps / r:.4g} steps) would reach past the variant's {steps}-step "
               "curve" if r < 1 else f"its exact run of {n} step(s) would fall before the variant's first "
               f"validation, at step {first} (`eval_every` {eval_every}" + (")" if eval_every else
                                                                             ": none before the end)"))
        raise ValueError(
            f"`break_even_checks` for {variant!r} got {r:g}: {run}: its curve gives no estimate to check there; "
            f"allowed: a ratio in [1, {max((hi for _, _, hi in fits), default=1):g}] (N / r steps on the curve, "
            f"from step {first} to {steps})")
    if abs(n * r - steps) <= STEP_BUDGET_TOLERANCE * steps * (1 + 1e-9):
        return
    fits = _fitting_ratios(steps, first, STEP_BUDGET_TOLERANCE)
    below = max(((hi, m) for m, lo, hi in fits if hi < r), default=None)
    above = min(((lo, m) for m, lo, hi in fits if lo > r), default=None)
    near = " or ".join(f"{what} {pick[0]:g} ({pick[1]} steps)" for what, pick in (("up to", below), ("from", above))
                       if pick is not None)
    raise ValueError(
        f"`break_even_checks` for {variant!r} got {r:g}: its exact run would train {n} step(s), which cost "
        f"{n * r:g} of the reference's {steps} steps (off by {abs(n * r - steps) / steps:.0%}, more than "
        f"{STEP_BUDGET_TOLERANCE:.0%}): not at equal cost; allowed: a ratio whose whole steps cost {steps} within "
        f"{STEP_BUDGET_TOLERANCE:.0%}, the nearest {near}")


def _fitting_ratios(steps: int, first: int, tolerance: float) -> list[tuple[int, float, float]]:
    """Each step count ``n`` on the curve (``first`` to ``steps``) with the ratios r >= 1 that train it and cost
    ``steps`` within ``tolerance``: ``(n, lo, hi)``, the ends rounded inward to 3 decimals (each end fits)."""
    out = []
    for n in range(first, steps + 1):
        lo = max(1.0, steps * (1 - tolerance) / n, steps / (n + 0.5))
        hi = min(steps * (1 + tolerance) / n, steps / (n - 0.5))  # n >= 1
        lo, hi = math.ceil(lo * 1000 - 1e-9) / 1000, math.floor(hi * 1000 + 1e-9) / 1000
        while lo <= hi and cost_steps(steps, lo) != n:
            lo = round(lo + 0.001, 3)
        while hi >= lo and (cost_steps(steps, hi) != n or abs(n * hi - steps) > tolerance * steps * (1 + 1e-9)):
            hi = round(hi - 0.001, 3)
        if lo <= hi:
            out.append((n, lo, hi))
    return out


__all__ = ["CHECK_DIR", "EVAL_DIR", "ComparePlan", "build_plan", "check_break_even_checks", "check_step_costs",
           "cost_steps", "eval_seed_list", "parse_step_costs", "plan_of", "point_dir", "recorded_mode", "reference_variant", "run_config",
           "run_dir", "check_dir"]
