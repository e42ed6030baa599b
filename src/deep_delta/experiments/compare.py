"""Train several variants with the same seed, data and token budget, and compare them side by side.

Outputs in ``OUT``: one run directory per variant (``OUT/<variant>/``, or ``OUT/seed_<s>/<variant>/`` for several
seeds: a normal training run), ``compare.md`` (a Table-3-style table), ``compare.json`` (the same numbers plus
settings and machine) and ``curves.png`` (training and validation loss against optimizer steps). With an lr grid
(:func:`run_lr_grid`), one such comparison per lr in ``OUT/lr_<lr>/``, and in ``OUT`` the same outputs for each
variant at its own best lr plus ``lr_sensitivity.png``.

The runs go through the study engine (:mod:`deep_delta.experiments.study`: stored runs checked first, OUT
locked, interruption) and the trainer; the data is resolved once (:class:`~deep_delta.train.data.TrainData`)
and handed to every run; the report is :mod:`deep_delta.experiments.compare_report`.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from deep_delta.experiments.compare_report import (
    REUSE_REMEDY,
    cost_steps,
    grid_summary,
    lm_grid_points,
    log_comparison,
    reference_variant,
    summarize_runs,
    write_comparison,
)
from deep_delta.settings import MAX_SEEDS
from deep_delta.train.config import TrainConfig
from deep_delta.train.data import TrainData
from deep_delta.variants import DEFAULT_VARIANTS

# the step costs an equal-cost comparison takes: a step between a hundredth and a hundred times the reference's
MIN_STEP_COST, MAX_STEP_COST = 0.01, 100.0
OUTPUTS = ("compare.md", "compare.json", "curves.png")


def compare_config(base: TrainConfig, variant: str, out: Path, seed: int | None = None,
                   per_seed_dirs: bool = False, step_cost: float | None = None) -> TrainConfig:
    """The run of ``variant`` (with ``seed``): ``base`` with its own variant, seed and run directory,
    ``out/<variant>`` or, for several seeds, ``out/seed_<s>/<variant>``; with ``wandb``, the W&B run
    ``<variant>-seed<s>`` (in ``base.wandb_group``, the comparison's group). With ``step_cost`` (its step's
    cost relative to the reference's), :func:`cost_steps` of ``base.steps``: an equal-cost budget with its own
    full lr schedule."""
    seed = base.seed if seed is None else seed
    run = out / f"seed_{seed}" / variant if per_seed_dirs else out / variant
    name = f"{variant}-seed{seed}" if base.wandb else base.wandb_run_name
    steps = base.steps if step_cost is None else cost_steps(base.steps, step_cost)
    return replace(base, variant=variant, seed=seed, out=str(run), wandb_run_name=name, steps=steps)


def check_step_costs(step_costs: dict[str, float] | None, variants: list[str]) -> dict[str, float]:
    """``step_costs`` validated against the comparison's variants: each a variant of it other than the reference
    (``baseline`` when present, else the first), with a cost in [MIN_STEP_COST, MAX_STEP_COST]."""
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
    return step_costs


def check_study(variants, seeds: list[int] | None, base: TrainConfig) -> tuple[list[str], list[int]]:
    """The variants and seeds of a comparison (repeats dropped), refused when empty or out of bounds."""
    variants = list(dict.fromkeys(variants))
    seeds = list(dict.fromkeys([base.seed] if seeds is None else seeds))
    if not variants:
        raise ValueError("compare: `variants` is empty; allowed: one or more variant names")
    if not seeds or len(seeds) > MAX_SEEDS or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"compare: `seeds` got {seeds!r}; allowed: 1 to {MAX_SEEDS} integers >= 0")
    return variants, seeds


def wandb_group(base: TrainConfig, out: Path) -> str:
    """The comparison's W&B group: ``base.wandb_group`` when set, else the one ``out/wandb.json`` keeps from an
    earlier start of this comparison, else a new ``<out name>-<8 characters>``."""
    from deep_delta.train.wandb_sink import generate_id, read_wandb_file

    return base.wandb_group or read_wandb_file(out).get("group") or f"{out.resolve().name}-{generate_id()}"


def check_reusable(cfg: TrainConfig, data_fingerprint: str, *, overwrite: bool) -> None:
    """A run that compare continues or reuses must have been made with every result-changing setting of ``cfg``
    (all but :data:`~deep_delta.train.run_dir.RESULT_NEUTRAL`: the budget, the validation batches, the dtype, ...)
    and from the same data; else it is refused, naming the differences, before anything trains."""
    from deep_delta.train.provenance import check_belongs, check_same_data
    from deep_delta.train.run_dir import RESULT_NEUTRAL, RUN_FILE

    run_file = Path(cfg.out) / RUN_FILE
    if overwrite or not run_file.is_file():
        return
    try:
        run = json.loads(run_file.read_text())
    except ValueError as e:
        raise ValueError(f"{run_file} is not valid JSON ({e}); retrain the run with `overwrite`") from None
    what = f"the run in {cfg.out}"
    # the data is compared by its fingerprint, not by how its path was spelled
    check_belongs(run.get("train_config", {}), cfg.to_dict(), what=what, remedy=REUSE_REMEDY,
                  skip=RESULT_NEUTRAL | {"data"}, has="run has")
    check_same_data((run.get("data") or {}).get("fingerprint"), data_fingerprint, what=what,
                    data_dir=cfg.data or "the default data", remedy=REUSE_REMEDY)


def run_compare(base: TrainConfig, variants=DEFAULT_VARIANTS, out: str | os.PathLike = "runs/compare", *,
                seeds: list[int] | None = None, overwrite: bool = False, progress: bool = True, quiet: bool = False,
                time_repeats: int = 5, step_costs: dict[str, float] | None = None,
                data: TrainData | None = None) -> dict[str, Any]:
    """Train every variant with every seed and write the comparison.

    Seed ``s`` is paired: every variant trains from initialisation seed ``s`` on the data in the order seed
    ``s`` draws (``TrainConfig.seed``). One seed (default ``[base.seed]``) keeps one run directory per variant,
    ``out/<variant>``; several use ``out/seed_<s>/<variant>``. A finished identical run is reused and an
    interrupted one continued; a run with other settings is refused unless ``overwrite``. After training, the
    step time of each variant is measured interleaved (``time_repeats`` rounds; 0 skips it) for the
    equal-wall-clock view. ``step_costs`` ({variant: its step time over the reference's, e.g. measured by
    ``ddl bench`` on the machine the comparison stands for}) gives those variants the budget of the reference's
    ``steps`` at that cost (:func:`cost_steps`), each with its own full lr schedule: an equal-cost comparison.
    ``data``: the data resolved by the caller (default ``base.data``). Returns the summary (also compare.json).
    """
    from deep_delta.experiments.study import run_keys, run_study

    out = Path(out)
    variants, seeds = check_study(variants, seeds, base)
    step_costs = check_step_costs(step_costs, variants)
    if base.wandb:
        base = replace(base, wandb_group=wandb_group(base, out))
    data = data if data is not None else TrainData.resolve(base.data)
    cfgs = {key: compare_config(base, key[0], out, key[1], len(seeds) > 1, step_costs.get(key[0]))
            for key in run_keys(variants, seeds)}
    say = (lambda msg: None) if quiet else (lambda msg: print(msg, flush=True))
    t0 = time.perf_counter()

    def train_one(key, index: str) -> str | None:
        """Train (or continue, or reuse) one run; a diverged run is a result too: its message."""
        from deep_delta.train.trainer import NonFiniteLossError, train

        tag = f"{index} {key[0]}" + (f" seed {key[1]}" if len(seeds) > 1 else "")
        say(tag)
        if base.wandb:  # OUT is checked and locked by now
            _remember_group(out, base.wandb_group)
        try:
            train(cfgs[key], resume=True, overwrite=overwrite, progress=progress, desc=tag, quiet=quiet, data=data)
        except NonFiniteLossError as e:
            say(f"{tag}: {e}")
            return str(e)
        return None

    diverged = run_study(out, list(cfgs), check=lambda key: check_reusable(cfgs[key], data.fingerprint,
                                                                            overwrite=overwrite),
                         train=train_one, outputs=[out / name for name in OUTPUTS], lock="ddl compare")
    timing = measure_step_times(base, variants, data.vocab_size, repeats=time_repeats) if time_repeats else None
    summary = summarize_runs(out, variants, base, seeds=seeds, step_times=timing,
                             diverged={k: v for k, v in diverged.items() if v})
    summary.update(data_fingerprint=data.fingerprint, wall_s=time.perf_counter() - t0,
                   **({"step_costs": step_costs} if step_costs else {}))
    write_comparison(out, summary)
    if base.wandb:
        log_comparison(out, summary, base, say=say)
    return summary


def run_lr_grid(base: TrainConfig, variants=DEFAULT_VARIANTS, out: str | os.PathLike = "runs/compare",
                lrs: list[float] | tuple[float, ...] = (), *, seeds: list[int] | None = None,
                overwrite: bool = False, progress: bool = True, quiet: bool = False, time_repeats: int = 5,
                step_costs: dict[str, float] | None = None, data: TrainData | None = None) -> dict[str, Any]:
    """:func:`run_compare` at every lr of ``lrs`` (``out/lr_<lr>``, a complete comparison each, resumable as
    one), then each variant at its own best lr, chosen on the final validation loss alone
    (:func:`~deep_delta.experiments.lr_grid.choose_lrs`), paired by seed against the reference at its own
    best lr. A run diverges when its loss is non-finite or its final validation loss is above
    ``DIVERGENCE_FACTOR`` x ln(vocabulary size) (a uniform guess's loss); such a run is a grid point marked
    "diverged". Writes ``compare.md``, ``compare.json``, ``curves.png`` (each variant at its chosen lr) and
    ``lr_sensitivity.png`` in ``out``; returns the summary."""
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR
    from deep_delta.experiments.study import run_keys, run_lr_study
    from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results
    from deep_delta.train.build import build_model_config

    out = Path(out)
    variants, seeds = check_study(variants, seeds, base)
    step_costs = check_step_costs(step_costs, variants)
    data = data if data is not None else TrainData.resolve(base.data)
    limit = DIVERGENCE_FACTOR * math.log(build_model_config(base, data.vocab_size).vocab_size)
    refuse_replaced_dir(out)
    refuse_unwritable_results(out / name for name in (*OUTPUTS, "lr_sensitivity.png"))
    t0 = time.perf_counter()

    def check(lr: float, where: Path) -> None:
        for v, s in run_keys(variants, seeds):
            check_reusable(compare_config(replace(base, lr=lr), v, where, s, len(seeds) > 1, step_costs.get(v)),
                           data.fingerprint, overwrite=overwrite)

    def run_at(lr: float, where: Path) -> dict:
        return run_compare(replace(base, lr=lr), variants, where, seeds=seeds, overwrite=overwrite,
                           progress=progress, quiet=quiet, time_repeats=0, step_costs=step_costs, data=data)

    def finish(per_lr: dict, points: list[dict], chosen: dict) -> dict:
        timing = measure_step_times(base, variants, data.vocab_size, repeats=time_repeats) if time_repeats else None
        summary = grid_summary(base, variants, seeds, list(per_lr), per_lr, points, chosen, timing, limit)
        summary.update(data_fingerprint=data.fingerprint, wall_s=time.perf_counter() - t0,
                       **({"step_costs": step_costs} if step_costs else {}))
        write_comparison(out, summary)
        return summary

    say = (lambda msg: None) if quiet else (lambda msg: print(msg, flush=True))
    return run_lr_study(out, lrs, variants, check=check, run_at=run_at,
                        points_at=lambda lr, at_lr: lm_grid_points(lr, at_lr, limit), higher_is_better=False,
                        finish=finish, lock="ddl compare --lrs", say=say)


def _remember_group(out: Path, group: str) -> None:
    from deep_delta.train.wandb_sink import read_wandb_file, write_wandb_file

    if read_wandb_file(out).get("group") != group:
        write_wandb_file(out, group=group)


def measure_step_times(base: TrainConfig, variants: list[str], data_vocab: int, *, repeats: int = 5,
                       warmup: int = 1) -> dict:
    """Median seconds per optimizer step of each variant at the comparison's shape (batch, sequence, model,
    device), timed in interleaved rounds so that a busy machine slows every variant alike; the sequential
    runs' own clocks are not used for this."""
    from deep_delta.eval.step_bench import StepSubject
    from deep_delta.eval.timing import interleaved_medians
    from deep_delta.runtime import resolve_device
    from deep_delta.train.build import build_model_config

    vocab = build_model_config(base, data_vocab).vocab_size  # the model the runs trained
    device = resolve_device(base.device)
    dtype = "bfloat16" if base.dtype == "bfloat16" or (base.dtype == "auto" and device.type == "cuda") else "float32"
    subjects = {v: StepSubject(v, base.preset, batch_size=base.batch_size, seq_len=base.seq_len, device=device,
                               dtype=dtype, overrides={**base.model, "vocab_size": vocab}, seed=base.seed,
                               compile=base.compile) for v in variants}
    medians = interleaved_medians({v: s.train_step for v, s in subjects.items()}, device, repeats, warmup)
    return {"step_time_s": medians, "repeats": repeats, "device": str(device), "dtype": dtype}


__all__ = ["check_reusable", "check_step_costs", "compare_config", "cost_steps", "measure_step_times",
           "reference_variant", "run_compare", "run_lr_grid"]


def collect_comparison(out: str | os.PathLike) -> dict[str, Any]:
    """The comparison's report (compare.md, compare.json, curves.png; with an lr grid each lr's and the best-lr
    one) from the finished runs already in ``out``, training nothing: runs made in parts, on several machines,
    and brought together (their checkpoints are not needed, only run.json and metrics.jsonl). Every run must
    have finished (run.json records its end) and all must share every result-changing setting but variant, seed,
    lr and steps, and the data (by fingerprint); else they are refused, naming the difference. Each run's device
    is recorded in the summary."""
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR, choose_lrs
    from deep_delta.train.build import build_model_config

    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"`out` got {str(out)!r}, which is not a directory; allowed: a comparison's or a "
                                "study's directory (the `out` of `ddl compare`)")
    lr_dirs = sorted((float(d.name[3:]), d) for d in out.glob("lr_*") if d.is_dir() and _runs_in(d))
    if not lr_dirs:
        return _collect_point(out)
    per_lr = {lr: _collect_point(d) for lr, d in lr_dirs}
    first = next(iter(per_lr.values()))
    _check_same(per_lr, "lr_*")
    base = TrainConfig.from_dict(first["settings"])
    variants, seeds, lrs = [r["variant"] for r in first["rows"]], first["seeds"], list(per_lr)
    vocab = first["data_vocab"]
    limit = DIVERGENCE_FACTOR * math.log(build_model_config(base, vocab).vocab_size)
    points = [p for lr, at in per_lr.items() for p in lm_grid_points(lr, at, limit)]
    chosen = choose_lrs(points, variants, lrs, higher_is_better=False)
    summary = grid_summary(base, variants, seeds, lrs, per_lr, points, chosen, None, limit)
    summary.update({k: first[k] for k in ("data_fingerprint", "step_costs") if k in first},
                   devices={f"lr {lr:g}: {k}": v for lr, at in per_lr.items() for k, v in at["devices"].items()})
    write_comparison(out, summary)
    return summary


def _runs_in(where: Path) -> list[tuple[str, int, Path]]:
    """(variant, seed, run directory) of every run under ``where``: ``VARIANT/`` or ``seed_S/VARIANT/``."""
    from deep_delta.variants import VARIANTS

    runs = [(d.name, None, d) for d in where.iterdir() if d.name in VARIANTS and (d / "run.json").is_file()]
    for seed_dir in where.glob("seed_*"):
        runs += [(d.name, int(seed_dir.name[5:]), d) for d in seed_dir.iterdir()
                 if d.name in VARIANTS and (d / "run.json").is_file()]
    return sorted(runs, key=lambda r: (r[1] or 0, r[0]))


def _collect_point(where: Path) -> dict[str, Any]:
    """One comparison's summary from its finished run directories (see :func:`collect_comparison`)."""
    found = _runs_in(where) if where.is_dir() else []
    if not found:
        raise FileNotFoundError(f"{where} holds no run directories (VARIANT/run.json or seed_S/VARIANT/run.json); "
                                "allowed: the `out` of a `ddl compare` whose runs have finished")
    runs = {(v, s): json.loads((d / "run.json").read_text()) for v, s, d in found}
    for (v, s), run in runs.items():
        if "finished" not in run:
            raise ValueError(f"the run of {_name(v, s)} in {where} has not finished (its run.json records no end); "
                             "finish it with the `ddl compare` that started it")
    variants = reference_order([v for v, _ in runs])
    seeds = sorted({s for _, s in runs if s is not None}) or [next(iter(runs.values()))["train_config"]["seed"]]
    ref = runs[next(k for k in runs if k[0] == variants[0])]
    _check_runs_agree(where, ref, runs)
    base = TrainConfig.from_dict({**ref["train_config"], "out": str(where), "seed": seeds[0]})
    steps = {v: next(r["train_config"]["steps"] for (w, _), r in runs.items() if w == v) for v in variants}
    costs = {v: steps[variants[0]] / n for v, n in steps.items() if v != variants[0] and n != steps[variants[0]]}
    diverged = {(v, seeds[0] if s is None else s): r["finished"]["diverged"] for (v, s), r in runs.items()
                if r["finished"].get("diverged")}
    summary = summarize_runs(where, variants, base, seeds=seeds, diverged=diverged)
    data = ref.get("data") or {}
    summary.update(data_fingerprint=data.get("fingerprint"), data_vocab=data.get("vocab_size"),
                   devices={_name(v, s): (r.get("device") or {}).get("name", "not recorded")
                            for (v, s), r in runs.items()},
                   wall_s=sum(r["finished"].get("wall_s", 0.0) for r in runs.values()),
                   **({"step_costs": costs} if costs else {}))
    write_comparison(where, summary)
    return summary


def _name(variant: str, seed: int | None) -> str:
    return variant if seed is None else f"{variant} seed {seed}"


def _check_runs_agree(where: Path, ref: dict, runs: dict) -> None:
    """Every run of a comparison brought together must share the reference run's result-changing settings but
    variant, seed, lr and steps, and its data."""
    from deep_delta.train.provenance import differences
    from deep_delta.train.run_dir import RESULT_NEUTRAL

    free = RESULT_NEUTRAL | {"variant", "seed", "out", "steps", "wandb_run_name", "data"}
    fingerprint = (ref.get("data") or {}).get("fingerprint")
    for (v, s), run in runs.items():
        diff = differences(ref["train_config"], run["train_config"], skip=free, has="the reference run has")
        if (run.get("data") or {}).get("fingerprint") != fingerprint:
            diff.append("the data (its fingerprint)")
        if diff:
            raise ValueError(f"the runs in {where} were not made with the same settings ({_name(v, s)}: "
                             f"{'; '.join(diff)}); allowed: runs of one comparison, made with one command's "
                             "settings (variant, seed, lr and steps may differ)")


def reference_order(variants: list[str]) -> list[str]:
    """The variants with the reference first (``baseline`` when there), the others in their order."""
    ref = reference_variant(variants)
    return [ref, *sorted(v for v in set(variants) if v != ref)]


def _check_same(per_lr: dict[float, dict], where: str) -> None:
    """The lrs of a grid must hold the same variants and seeds, from the same data."""
    first = next(iter(per_lr.values()))
    for lr, at in per_lr.items():
        same = ([r["variant"] for r in at["rows"]], at["seeds"], at["data_fingerprint"])
        if same != ([r["variant"] for r in first["rows"]], first["seeds"], first["data_fingerprint"]):
            raise ValueError(f"the lr {lr:g} of the grid in {where} holds other variants, seeds or data than the "
                             "first; allowed: one grid's comparisons")
