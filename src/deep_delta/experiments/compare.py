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

import math
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from deep_delta.experiments.finished_runs import FinishedRun

# the step costs an equal-cost comparison takes: a step between a hundredth and a hundred times the reference's
MIN_STEP_COST, MAX_STEP_COST = 0.01, 100.0
# how far a variant's whole steps may cost from the reference's budget and still be called equal cost
STEP_BUDGET_TOLERANCE = 0.05
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


def check_step_costs(step_costs: dict[str, float] | None, variants: list[str],
                     budgets: Sequence[int] = ()) -> dict[str, float]:
    """``step_costs`` validated against the comparison's variants: each a variant of it other than the reference
    (``baseline`` when present, else the first), with a cost in [MIN_STEP_COST, MAX_STEP_COST]; and against each of
    the reference's step ``budgets``: a variant's whole steps (:func:`cost_steps`) must cost that budget within
    ``STEP_BUDGET_TOLERANCE`` (6 reference steps at a cost of 100 would be one step costing 100: not equal cost)."""
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
            if abs(n * cost - steps) > STEP_BUDGET_TOLERANCE * steps:
                enough = math.ceil(cost / (2 * STEP_BUDGET_TOLERANCE))
                raise ValueError(
                    f"compare: `step_costs` for {variant!r} ({cost:g}) with `steps` {steps}: {variant} would train "
                    f"{n} step(s), which cost {n * cost:g} of the reference's steps, not {steps} (off by "
                    f"{abs(n * cost - steps) / steps:.0%}, more than {STEP_BUDGET_TOLERANCE:.0%}): not an equal cost; "
                    f"allowed: `steps` of at least {enough} at this cost, so that whole steps come within "
                    f"{STEP_BUDGET_TOLERANCE:.0%} of the budget")
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
    from deep_delta.train.run_dir import RESULT_NEUTRAL, RUN_FILE, read_run_file

    run_file = Path(cfg.out) / RUN_FILE
    if overwrite or not run_file.is_file():
        return
    try:
        run = read_run_file(cfg.out)
    except ValueError as e:
        raise ValueError(f"{e}; retrain the run with `overwrite`") from None
    what = f"the run in {cfg.out}"
    data = run.get("data") if isinstance(run.get("data"), dict) else {}
    # the data is compared by its fingerprint, not by how its path was spelled
    check_belongs(run["train_config"], cfg.to_dict(), what=what, remedy=REUSE_REMEDY,
                  skip=RESULT_NEUTRAL | {"data"}, has="run has")
    check_same_data(data.get("fingerprint"), data_fingerprint, what=what,
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
    step_costs = check_step_costs(step_costs, variants, [base.steps])
    if base.wandb:
        base = replace(base, wandb_group=wandb_group(base, out))
    data = data if data is not None else TrainData.resolve(base.data)
    cfgs = {key: compare_config(base, key[0], out, key[1], len(seeds) > 1, step_costs.get(key[0]))
            for key in run_keys(variants, seeds)}
    say = (lambda msg: None) if quiet else (lambda msg: print(msg, flush=True))
    t0 = time.perf_counter()

    def train_one(key, index: str) -> None:
        """Train (or continue, or reuse) one run; a diverged run is a result too (its run.json says so)."""
        from deep_delta.train.trainer import NonFiniteLossError, train

        tag = f"{index} {key[0]}" + (f" seed {key[1]}" if len(seeds) > 1 else "")
        say(tag)
        if base.wandb:  # OUT is checked and locked by now
            _remember_group(out, base.wandb_group)
        end = None if overwrite else stored_end(cfgs[key].out)
        if end is not None and end["diverged"] is not None:  # a result: kept, not trained again (it would diverge)
            say(f"{tag}: diverged ({end['diverged']}); kept as a result")
            return
        if end is not None and end["step"] >= cfgs[key].steps:
            # a finished run is reused as its record (run.json, metrics.jsonl), with or without its checkpoints:
            # not resumed, which would rewrite run.json (its wall time, the last process's only)
            say(f"{tag}: finished at step {end['step']} (its record); kept")
            return
        try:
            train(cfgs[key], resume=True, overwrite=overwrite, progress=progress, desc=tag, quiet=quiet, data=data)
        except NonFiniteLossError as e:
            say(f"{tag}: {e.reason}")

    run_study(out, list(cfgs), check=lambda key: check_reusable(cfgs[key], data.fingerprint, overwrite=overwrite),
              train=train_one, outputs=[out / name for name in OUTPUTS], lock="ddl compare")
    # whether a run diverged is read from its record, as --report-only reads it: under either `on_divergence`
    diverged = {key: run_divergence(cfgs[key].out) for key in cfgs}
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
    step_costs = check_step_costs(step_costs, variants, [base.steps])
    data = data if data is not None else TrainData.resolve(base.data)
    check_grid_data(data)
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


def check_grid_data(data: TrainData) -> None:
    """An lr grid chooses each variant's lr on its final validation loss: refused, before anything trains, on data
    without a validation split (every run would count as diverged for want of a validation loss)."""
    if not data.has_validation:
        raise ValueError(f"`lrs`: an lr grid chooses each variant's lr on its final validation loss, but {data.dir} has "
                         "no validation split (no val_*.bin shards); allowed: data prepared with a validation "
                         "fraction > 0 (`ddl data prepare --val-fraction 0.05`), or one `lr` without a grid")


def _remember_group(out: Path, group: str) -> None:
    from deep_delta.train.wandb_sink import read_wandb_file, write_wandb_file

    if read_wandb_file(out).get("group") != group:
        write_wandb_file(out, group=group)


STEP_FIELDS = ("compile", "cuda_graphs", "activation_checkpointing", "grad_clip", "lr", "weight_decay", "betas")


def step_settings(base: TrainConfig) -> dict:
    """The fields of the runs' TrainConfig that decide how their step is built (``train.step.build_step``): the
    step :func:`measure_step_times` times is the one they trained."""
    return {name: getattr(base, name) for name in STEP_FIELDS}


def measure_step_times(base: TrainConfig, variants: list[str], data_vocab: int, *, repeats: int = 5,
                       warmup: int = 1) -> dict:
    """Median seconds per optimizer step of each variant at the comparison's shape (batch, sequence, model,
    device) and with the step the runs trained (:func:`step_settings`: compile, CUDA graphs, activation
    checkpointing, ...), timed in interleaved rounds so that a busy machine slows every variant alike; the
    sequential runs' own clocks are not used for this."""
    from deep_delta.eval.step_bench import StepSubject
    from deep_delta.eval.timing import interleaved_medians
    from deep_delta.runtime import resolve_device, trains_in_bf16
    from deep_delta.train.build import build_model_config

    vocab = build_model_config(base, data_vocab).vocab_size  # the model the runs trained
    device = resolve_device(base.device)
    dtype = "bfloat16" if trains_in_bf16(base.dtype, device) else "float32"
    subjects = {v: StepSubject(v, base.preset, batch_size=base.batch_size, seq_len=base.seq_len, device=device,
                               dtype=dtype, overrides={**base.model, "vocab_size": vocab}, seed=base.seed,
                               train=step_settings(base)) for v in variants}
    medians = interleaved_medians({v: s.train_step for v, s in subjects.items()}, device, repeats, warmup)
    return {"step_time_s": medians, "repeats": repeats, "device": str(device), "dtype": dtype}


__all__ = ["check_grid_data", "check_reusable", "check_step_costs", "collect_comparison", "compare_config",
           "cost_steps", "kept_timing", "measure_step_times", "step_settings", "reference_variant", "run_compare", "run_divergence",
           "run_lr_grid"]


def collect_comparison(out: str | os.PathLike) -> dict[str, Any]:
    """The comparison's report (compare.md, compare.json, curves.png; with an lr grid each lr's and the best-lr
    one) from the finished runs already in ``out``, training nothing: runs made in parts, on several machines,
    and brought together (their checkpoints are not needed, only run.json and metrics.jsonl). Each run is what its
    own run.json says (variant, seed, lr, steps, settings, its end and whether it diverged), checked against where
    it stands, its metrics and the other runs (:mod:`deep_delta.experiments.finished_runs`); any disagreement is
    refused, naming the run and the field. The step times an earlier ``ddl compare`` measured for these runs (its
    compare.json) are kept, with the equal-time columns. Each run's device is recorded in the summary."""
    from deep_delta.experiments.finished_runs import check_together, find_runs, lr_of_folder
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR, choose_lrs
    from deep_delta.train.build import build_model_config
    from deep_delta.variants import VARIANTS

    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"`out` got {str(out)!r}, which is not a directory; allowed: a comparison's or a "
                                "study's directory (the `out` of `ddl compare`)")
    lr_dirs = [d for d in sorted(out.iterdir()) if d.name.startswith("lr_") and d.is_dir()]
    if not lr_dirs:
        runs = find_runs(out)
        check_together(runs, out)
        summary = _collect_point(out, runs, kept_timing(out / "compare.json", runs))
        write_comparison(out, summary)
        return summary
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
        write_comparison(d, per_lr[lr])
    first = next(iter(per_lr.values()))
    all_runs = [r for _, runs in at_lr.values() for r in runs]
    base = TrainConfig.from_dict(first["settings"])
    variants, seeds, lrs = [r["variant"] for r in first["rows"]], first["seeds"], list(per_lr)
    vocab = first["data_vocab"]
    limit = DIVERGENCE_FACTOR * math.log(build_model_config(base, vocab).vocab_size)
    points = [p for lr, at in per_lr.items() for p in lm_grid_points(lr, at, limit)]
    chosen = choose_lrs(points, variants, lrs, higher_is_better=False)
    timing, note = kept_timing(out / "compare.json", all_runs)
    summary = grid_summary(base, variants, seeds, lrs, per_lr, points, chosen, timing, limit)
    summary.update({k: first[k] for k in ("data_fingerprint", "step_costs") if k in first},
                   devices={f"lr {lr:g}: {k}": v for lr, at in per_lr.items() for k, v in at["devices"].items()},
                   **({"notes": [note]} if note else {}))
    write_comparison(out, summary)
    return summary


def _collect_point(where: Path, runs: list[FinishedRun], timing: tuple[dict | None, str | None] | None) -> dict[str, Any]:
    """One comparison's summary from its finished runs (checked by the caller, here checked to stand where the
    comparison puts them); ``timing``: the step times kept for it and why none were, if so (:func:`kept_timing`)."""
    _check_layout(runs, where)
    variants = reference_order([r.cfg.variant for r in runs])
    seeds = sorted({r.cfg.seed for r in runs})
    ref = next(r for r in runs if r.cfg.variant == variants[0])
    base = replace(ref.cfg, out=str(where), seed=seeds[0])
    steps = {r.cfg.variant: r.cfg.steps for r in runs}
    costs = {v: steps[variants[0]] / n for v, n in steps.items() if v != variants[0] and n != steps[variants[0]]}
    diverged = {(r.cfg.variant, r.cfg.seed): r.diverged for r in runs if r.diverged}
    step_times, note = timing or (None, None)
    summary = summarize_runs(where, variants, base, seeds=seeds, diverged=diverged, step_times=step_times)
    data = ref.record.get("data") if isinstance(ref.record.get("data"), dict) else {}
    summary.update(data_fingerprint=data.get("fingerprint"), data_vocab=data.get("vocab_size"),
                   devices={_name(r.cfg.variant, r.cfg.seed if len(seeds) > 1 else None):
                            (r.record.get("device") or {}).get("name", "not recorded") for r in runs},
                   wall_s=sum(r.end["wall_s"] for r in runs),
                   **({"step_costs": costs} if costs else {}), **({"notes": [note]} if note else {}))
    return summary


def _check_layout(runs: list[FinishedRun], where: Path) -> None:
    """Each run of one comparison in ``where`` (an lr's folder, in a grid) must stand where ``ddl compare`` puts it
    (:func:`compare_config`) for the comparison's seeds: ``VARIANT/`` with one seed, ``seed_S/VARIANT/`` with
    several; within a comparison, one lr."""
    seeds = sorted({r.cfg.seed for r in runs})
    lrs = sorted({r.cfg.lr for r in runs})
    if len(lrs) > 1:
        a, b = (next(r for r in runs if r.cfg.lr == x) for x in lrs[:2])
        raise ValueError(f"{b.dir / 'run.json'} records lr {b.cfg.lr:g} (train_config.lr), {a.dir / 'run.json'} "
                         f"lr {a.cfg.lr:g}, in one comparison; allowed: one lr per comparison (an lr grid keeps each "
                         "lr in its lr_<lr>/ folder)")
    for run in runs:
        expected = Path(compare_config(run.cfg, run.cfg.variant, where, run.cfg.seed, len(seeds) > 1).out)
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
    diff = differences(old.get("settings") or {}, runs[0].cfg.to_dict(), skip=free, has="it was timed with")
    if diff:
        return None, (f"the step times in {path} were not kept: they were measured for other settings than these "
                      f"runs' ({'; '.join(diff)})")
    return timing, None


def _name(variant: str, seed: int | None) -> str:
    return variant if seed is None else f"{variant} seed {seed}"


def run_divergence(run_dir: str | os.PathLike) -> str | None:
    """Why a finished run diverged, as its run.json records it (None: it did not): the one reading of a divergence
    that ``ddl compare`` and its ``--report-only`` share."""
    from deep_delta.train.run_dir import read_run_file, run_end

    return run_end(run_dir, read_run_file(run_dir))["diverged"]


def stored_end(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The end of the run stored in ``run_dir`` as its run.json records it (its ``step``, ``diverged``, ...:
    :func:`~deep_delta.train.run_dir.run_end`); None when there is no run or it has not ended (its settings are
    checked by :func:`check_reusable`)."""
    from deep_delta.train.run_dir import RUN_FILE, RunNotFinished, read_run_file, run_end

    if not (Path(run_dir) / RUN_FILE).is_file():
        return None
    try:
        return run_end(run_dir, read_run_file(run_dir))
    except RunNotFinished:
        return None


def reference_order(variants: list[str]) -> list[str]:
    """The variants with the reference first (``baseline`` when there), the others in their order."""
    ref = reference_variant(variants)
    return [ref, *sorted(v for v in set(variants) if v != ref)]
