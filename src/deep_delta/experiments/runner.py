"""The runner of ``ddl compare``: what a :class:`~deep_delta.experiments.plan.ComparePlan` says, each mode beside
the others and none built on another's code path: one comparison (``single``), an lr grid (``grid``), the grid then
the evaluation seeds in one hold of ``OUT`` (``held_out``: the evaluation, :func:`~deep_delta.experiments.held_out.
evaluation`, once the grid has chosen), or one of the first two at every width and length (``scaling``, each point in
``OUT/d<W>_s<STEPS>/``, then the study's summary)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from deep_delta.experiments.compare import check_grid_data, run_compare, run_lr_grid
from deep_delta.experiments.plan import ComparePlan, point_dir
from deep_delta.train.config import TrainConfig
from deep_delta.train.data import TrainData


def run_plan(plan: ComparePlan, base: TrainConfig, out: str | os.PathLike = "runs/compare", *,
             overwrite: bool = False, progress: bool = True, quiet: bool = False, time_repeats: int = 5,
             data: TrainData | None = None) -> dict[str, Any]:
    """Train and report ``plan`` on ``base``'s settings in ``out``; ``data``: the data resolved by the caller
    (default ``base.data``). Returns the summary (also compare.json, or scaling.json for the width / length
    study)."""
    kw = dict(overwrite=overwrite, progress=progress, quiet=quiet, time_repeats=time_repeats)
    if plan.mode == "scaling":
        return _run_points(plan, base, Path(out), **kw)
    data = data if data is not None else TrainData.resolve(base.data)
    if plan.mode == "single":
        return run_compare(base, plan, out, data=data, **kw)
    if plan.mode == "grid":
        return run_lr_grid(base, plan, out, data=data, **kw)
    from deep_delta.experiments.held_out import evaluation
    from deep_delta.train.checkpoint import run_lock

    evaluate = evaluation(plan, base, Path(out), data, overwrite=overwrite, progress=progress, quiet=quiet,
                          t0=time.perf_counter())  # what can be refused is, before anything trains
    with run_lock(out, "ddl compare --lrs"):  # the grid, then its evaluation, in one hold of OUT
        return evaluate(run_lr_grid(base, plan.selection, out, data=data, stem="selection", lock=None, **kw))


def _run_points(plan: ComparePlan, base: TrainConfig, out: Path, **kw) -> dict[str, Any]:
    """The plan's comparison (one lr, or its grid) at every width (``model.hidden_size``; the preset's heads, layers
    and the rest stay) and every length (``steps``), each in its own directory and resumable, then the study's
    summary (``scaling.json``; :mod:`deep_delta.experiments.scaling`). A width the heads cannot divide, and the
    data an lr grid needs, are refused before anything trains."""
    from deep_delta.experiments.scaling import summarize_scaling, write_scaling
    from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results
    from deep_delta.models.ddl.configuration_ddl import PRESETS, DDLConfig

    widths = list(plan.widths or [base.model.get("hidden_size", PRESETS[base.preset]["hidden_size"])])
    lengths = list(plan.lengths or [base.steps])
    for w in widths:
        DDLConfig.from_variant(plan.variants[0], base.preset, **{**base.model, "hidden_size": w})
    refuse_replaced_dir(out)
    refuse_unwritable_results(out / f"scaling.{ext}" for ext in ("md", "json", "png"))
    data = TrainData.resolve(base.data)  # once, for every point
    if plan.grids is not None:
        check_grid_data(data)
    studies = {}
    for i, (w, n) in enumerate([(w, n) for w in widths for n in lengths], 1):
        where = point_dir(out, w, n)
        if not kw["quiet"]:
            print(f"width {w}, {n} steps ({i}/{len(widths) * len(lengths)} of the study): {where}", flush=True)
        studies[w, n] = run_plan(plan.point(), replace(base, steps=n, model={**base.model, "hidden_size": w}), where,
                                 data=data, **kw)
    summary = summarize_scaling(studies, base.to_dict(), plan.lrs or None)
    if plan.step_costs:
        summary["step_costs"] = plan.step_costs
    write_scaling(out, summary)
    return summary


__all__ = ["run_plan"]
