"""A comparison brought together from its finished runs (``ddl compare --report-only``), training nothing: each
run read and checked by :mod:`deep_delta.experiments.finished_runs`, the report written as ``ddl compare`` writes
it (:mod:`deep_delta.experiments.compare_report`), with the step times an earlier ``ddl compare`` measured for
these runs kept."""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from deep_delta.experiments.compare_report import (
    grid_summary,
    lm_grid_points,
    summarize_runs,
    write_comparison,
)
from deep_delta.experiments.finished_runs import FinishedRun, runs_machine
from deep_delta.experiments.plan import ComparePlan, cost_steps, recorded_mode, reference_variant, run_config
from deep_delta.train.config import TrainConfig, recorded


def collect_comparison(out: str | os.PathLike, *, write: bool = True) -> dict[str, Any]:
    """The comparison's report (compare.md, compare.json, curves.png; with an lr grid each lr's and the best-lr
    one) from the finished runs already in ``out``, training nothing: runs made in parts, on several machines,
    and brought together (their checkpoints are not needed, only run.json and metrics.jsonl). Each run is what its
    own run.json says (variant, seed, lr, steps, settings, its end and whether it diverged), checked against where
    it stands, its metrics and the other runs (:mod:`deep_delta.experiments.finished_runs`); any disagreement is
    refused, naming the run and the field. The step times an earlier ``ddl compare`` measured for these runs (its
    compare.json) are kept, with the equal-time columns. Each run's device is recorded in the summary, and the
    summary's machine is the runs' own (their kernel switches, one set, threads, torch and commit:
    :func:`~deep_delta.experiments.finished_runs.runs_machine`), not this process's; its ``wall_s`` is this call's
    own (the runs' training time is each run's ``train_wall_s``, from its run.json). ``write`` False: the summary
    only, no file written (the width study recomputing a point from its runs)."""
    from deep_delta.experiments.finished_runs import check_together, find_runs, lr_of_folder
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR, choose_lrs
    from deep_delta.train.build import build_model_config
    from deep_delta.variants import VARIANTS

    t0 = time.perf_counter()
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"`out` got {str(out)!r}, which is not a directory; allowed: a comparison's or a "
                                "study's directory (the `out` of `ddl compare`)")
    mode = recorded_mode(out)
    if mode == "single":
        runs = find_runs(out)
        check_together(runs, out)
        summary = _collect_point(out, runs, kept_timing(out / "compare.json", runs))
        summary["wall_s"] = time.perf_counter() - t0  # this call's, which trained nothing (the runs': their run.json)
        if write:
            write_comparison(out, summary)
        return summary
    from deep_delta.experiments.held_out import collect_held_out

    held = mode == "held_out"
    lr_dirs = [d for d in sorted(out.iterdir()) if d.name.startswith("lr_") and d.is_dir()]
    beside = [d.name for d in out.iterdir() if d.name in VARIANTS or d.name.startswith("seed_")]
    if beside:
        raise ValueError(f"{out} holds an lr grid (lr_<lr>/ folders) and runs beside it ({beside[0]}/); allowed: "
                         "one comparison per `out`")
    at_lr = {}
    for d in lr_dirs:
        lr = lr_of_folder(d)
        at_lr[lr] = (d, find_runs(d, lr))
    check_together([r for _, runs in at_lr.values() for r in runs], out)
    per_lr = {}
    for lr, (d, runs) in sorted(at_lr.items()):
        per_lr[lr] = _collect_point(d, runs, None)  # a grid's lr is run without timing; the grid times once
        per_lr[lr]["wall_s"] = time.perf_counter() - t0
        if write:
            write_comparison(d, per_lr[lr])
    first = next(iter(per_lr.values()))
    all_runs = [r for _, runs in at_lr.values() for r in runs]
    base = TrainConfig.from_dict(first["settings"])
    seeds, lrs = first["seeds"], list(per_lr)
    # each variant's grid: the lrs whose folders hold its runs (one grid for all, or each variant's own)
    grids = {}
    for lr, at in per_lr.items():
        for r in at["rows"]:
            grids.setdefault(r["variant"], []).append(lr)
    variants = reference_order(list(grids))
    grids = {v: grids[v] for v in variants}
    vocab = first["data_vocab"]
    limit = DIVERGENCE_FACTOR * math.log(build_model_config(base, vocab).vocab_size)
    points = [p for lr, at in per_lr.items() for p in lm_grid_points(lr, at, limit)]
    chosen = choose_lrs(points, variants, grids, higher_is_better=False)
    timing, note = kept_timing(out / ("selection.json" if held else "compare.json"), all_runs)
    summary = grid_summary(base, variants, seeds, lrs, per_lr, points, chosen, timing, limit, grids)
    summary["machine"], differ = runs_machine(all_runs)
    notes = [note] if note else []
    notes = [*summary.get("notes", []), *notes, *differ]
    plan = ComparePlan(tuple(variants), tuple(seeds), grids, step_costs=first.get("step_costs") or {})
    summary.update({k: first[k] for k in ("data_fingerprint", "step_costs") if k in first}, plan=plan.to_dict(),
                   devices={f"lr {lr:g}: {k}": v for lr, at in per_lr.items() for k, v in at["devices"].items()},
                   **({"notes": notes} if notes else {}))
    summary["wall_s"] = time.perf_counter() - t0
    if write:
        write_comparison(out, summary, "selection" if held else "compare")
    return collect_held_out(out, base, summary, all_runs, started=t0) if held else summary


def _collect_point(where: Path, runs: list[FinishedRun], timing: tuple[dict | None, str | None] | None) -> dict[str, Any]:
    """One comparison's summary from its finished runs (checked by the caller, here checked to stand where the
    comparison puts them); ``timing``: the step times kept for it and why none were, if so (:func:`kept_timing`)."""
    _check_layout(runs, where)
    variants = reference_order([r.cfg.variant for r in runs])
    seeds = sorted({r.cfg.seed for r in runs})
    ref = next(r for r in runs if r.cfg.variant == variants[0])
    base = replace(ref.cfg, out=str(where), seed=seeds[0])
    steps = {r.cfg.variant: r.cfg.steps for r in runs}
    costs, unequal = kept_costs(where / "compare.json", variants[0], steps)
    diverged = {(r.cfg.variant, r.cfg.seed): r.diverged for r in runs if r.diverged}
    step_times, note = timing or (None, None)
    notes = [note] if note else []
    if unequal:
        notes.append("the variants trained different numbers of steps (" + ", ".join(
            f"{v} {n}" for v, n in steps.items()) + ") and no step costs recorded with these runs account for them: "
            "this is not reported as an equal-cost comparison (`ddl compare --step-costs` records the costs it was "
            "given in its compare.json)")
    summary = summarize_runs(where, variants, base, seeds=seeds, diverged=diverged, step_times=step_times)
    summary["plan"] = ComparePlan(tuple(variants), tuple(seeds), step_costs=costs).to_dict()
    summary["machine"], differ = runs_machine(runs)  # the runs' own, not this process's
    notes = [*summary.get("notes", []), *notes, *differ]
    data = ref.record.get("data") if isinstance(ref.record.get("data"), dict) else {}
    summary.update(data_fingerprint=data.get("fingerprint"), data_vocab=data.get("vocab_size"),
                   devices={_name(r.cfg.variant, r.cfg.seed if len(seeds) > 1 else None):
                            (r.record.get("device") or {}).get("name", "not recorded") for r in runs},
                   **({"step_costs": costs} if costs else {}), **({"notes": notes} if notes else {}))
    return summary


def kept_costs(path: Path, reference: str, steps: dict[str, int]) -> tuple[dict[str, float], bool]:
    """The step costs an equal-cost ``ddl compare`` was given for these runs (``path``: its compare.json), kept
    when they give exactly the step counts the runs trained (:func:`~deep_delta.experiments.compare_report.
    cost_steps` of the reference's): (the costs, False); without such a record, (``{}``, whether the variants'
    step counts differ): unequal lengths are said to be such, never read as costs nobody gave."""
    from deep_delta.fsutil import read_json_file

    differ = {v for v, n in steps.items() if n != steps[reference]}
    if not differ:
        return {}, False
    try:
        old = read_json_file(path, "a comparison's summary (compare.json)", limit=256 << 20) if path.is_file() else {}
    except ValueError:
        old = {}
    costs = old.get("step_costs") if isinstance(old, dict) else None
    ok = isinstance(costs, dict) and set(costs) == differ and all(
        isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0
        and cost_steps(steps[reference], c) == steps[v] for v, c in costs.items())
    return (dict(costs), False) if ok else ({}, True)


def _check_layout(runs: list[FinishedRun], where: Path) -> None:
    """Each run of one comparison in ``where`` (an lr's folder, in a grid) must stand where ``ddl compare`` puts it
    (:func:`~deep_delta.experiments.plan.run_config`) for the comparison's seeds: ``VARIANT/`` with one seed, ``seed_S/VARIANT/`` with
    several; within a comparison, one lr."""
    seeds = sorted({r.cfg.seed for r in runs})
    lrs = sorted({r.cfg.lr for r in runs})
    if len(lrs) > 1:
        a, b = (next(r for r in runs if r.cfg.lr == x) for x in lrs[:2])
        raise ValueError(f"{b.dir / 'run.json'} records lr {b.cfg.lr:g} (train_config.lr), {a.dir / 'run.json'} "
                         f"lr {a.cfg.lr:g}, in one comparison; allowed: one lr per comparison (an lr grid keeps each "
                         "lr in its lr_<lr>/ folder)")
    for run in runs:
        expected = Path(run_config(run.cfg, run.cfg.variant, where, run.cfg.seed, len(seeds) > 1).out)
        if expected != run.dir:
            layout = "seed_S/VARIANT/ (several seeds)" if len(seeds) > 1 else "VARIANT/ (one seed)"
            raise ValueError(f"{run.dir} is the run of {run.name}, which `ddl compare` puts in {expected} (seeds "
                             f"{', '.join(map(str, seeds))}: {layout}); allowed: each run where the comparison "
                             "writes it")


def kept_timing(path: Path, runs: list[FinishedRun]) -> tuple[dict | None, str | None]:
    """The step times an earlier ``ddl compare`` measured for these runs (``path``: its compare.json), so that a
    report brought together keeps its step-ms and equal-time columns: (the timing, None) when compare.json has one
    for every variant, measured at these runs' settings; (None, why it was not kept) when it has one that does not
    fit; (None, None) when there is none (the comparison measured none)."""
    from deep_delta.fsutil import read_json_file
    from deep_delta.train.provenance import differences
    from deep_delta.train.run_dir import RESULT_NEUTRAL

    if not path.is_file():
        return None, None
    try:
        old = read_json_file(path, "a comparison's summary (compare.json)", limit=256 << 20)
    except ValueError as e:
        return None, f"the step times of an earlier report were not kept: {e}"
    timing = old.get("timing") if isinstance(old, dict) else None
    if not timing:
        return None, None
    times = timing.get("step_time_s") if isinstance(timing, dict) else None
    variants = sorted({r.cfg.variant for r in runs})
    if not isinstance(times, dict) or any(not isinstance(times.get(v), (int, float)) for v in variants):
        return None, (f"the step times in {path} were not kept: they do not time every variant of these runs "
                      f"({', '.join(variants)})")
    free = RESULT_NEUTRAL | {"variant", "seed", "out", "steps", "lr", "wandb_run_name", "data"}
    diff = differences(recorded(old.get("settings") or {}), runs[0].cfg.to_dict(), skip=free, has="it was timed with")
    if diff:
        return None, (f"the step times in {path} were not kept: they were measured for other settings than these "
                      f"runs' ({'; '.join(diff)})")
    return timing, None


def _name(variant: str, seed: int | None) -> str:
    return variant if seed is None else f"{variant} seed {seed}"


def reference_order(variants: list[str]) -> list[str]:
    """The variants with the reference first (``baseline`` when there), the others in their order."""
    ref = reference_variant(variants)
    return [ref, *sorted(v for v in set(variants) if v != ref)]


__all__ = ["collect_comparison", "kept_costs", "kept_timing", "reference_order"]
