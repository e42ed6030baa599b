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
from typing import Any

from deep_delta.experiments.compare_report import (
    grid_summary,
    lm_grid_points,
    log_comparison,
    reuse_remedy,
    summarize_runs,
    with_earlier,
    write_comparison,
)
from deep_delta.experiments.plan import ComparePlan
from deep_delta.train.config import TrainConfig, recorded
from deep_delta.train.data import TrainData

OUTPUTS = ("compare.md", "compare.json", "curves.png")


def wandb_group(base: TrainConfig, out: Path) -> str:
    """The comparison's W&B group: ``base.wandb_group`` when set, else the one ``out/wandb.json`` keeps from an
    earlier start of this comparison, else a new ``<out name>-<8 characters>``."""
    from deep_delta.train.wandb_sink import generate_id, read_wandb_file

    return base.wandb_group or read_wandb_file(out).get("group") or f"{out.resolve().name}-{generate_id()}"


def check_reusable(cfg: TrainConfig, data_fingerprint: str, *, overwrite: bool,
                   data_dir: Path | None = None) -> None:
    """A run that compare continues or reuses must have been made with every result-changing setting of ``cfg``
    (all but :data:`~deep_delta.train.run_dir.RESULT_NEUTRAL`: the budget, the validation batches, the dtype, ...)
    and from the same data, and a finished one must pass the one check of a finished run
    (:func:`~deep_delta.experiments.finished_runs.check_finished`: its metrics, its schedule, its checkpoint's own
    record, its model); else it is refused, one line naming the file and the differences, before anything
    trains, and saying how this run alone is retrained (its directory removed: the study trains what is missing) and
    what ``overwrite`` retrains instead (every run of the study). ``data_dir``: where the data is now (for the
    message)."""
    from deep_delta.experiments.finished_runs import NeedsRetraining, read_run, retrain_remedy
    from deep_delta.train.provenance import check_belongs, check_same_data, differences
    from deep_delta.train.run_dir import (
        RESULT_NEUTRAL,
        RUN_FILE,
        RunNotFinished,
        kernel_switches,
        read_run_file,
        run_end,
    )

    _check_layout_of(Path(cfg.out))
    run_file = Path(cfg.out) / RUN_FILE
    if overwrite or not run_file.is_file():
        return
    try:
        run = read_run_file(cfg.out)
    except ValueError as e:
        raise ValueError(f"{e}; {retrain_remedy(cfg.out)}") from None
    what = f"the run in {cfg.out}"
    remedy = reuse_remedy(cfg.out)
    data = run.get("data") if isinstance(run.get("data"), dict) else {}
    # the data is compared by its fingerprint, not by how its path was spelled
    check_belongs(recorded(run["train_config"]), cfg.to_dict(), what=what, remedy=remedy,
                  skip=RESULT_NEUTRAL | {"data"}, has="run has")
    if isinstance(run.get("kernel_switches"), dict):  # the kernel paths it trained on (older records do not say)
        switched = differences(run["kernel_switches"], kernel_switches(), has="run has")
        if switched:
            raise ValueError(f"{what} was made with other kernel paths (kernel switch {'; '.join(switched)}: "
                             f"deep_delta.ops.switches); {remedy}")
    if not check_same_data(data.get("fingerprint"), data_fingerprint, what=what, data_dir=data_dir or cfg.data or
                           "the default data", remedy=remedy, stored_dir=data.get("dir")):
        raise ValueError(f"{run_file} records no data fingerprint, so whether the run was made from "
                         f"{cfg.data or 'the default data'} cannot be checked; {retrain_remedy(cfg.out)}")
    try:
        run_end(cfg.out, run)
    except RunNotFinished:
        return  # continued from its checkpoint, which the trainer checks
    try:
        read_run(Path(cfg.out))
    except NeedsRetraining:
        raise  # its message says how the run is retrained
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"{e}; {retrain_remedy(cfg.out)}") from None


def _check_layout_of(run: Path) -> None:
    """A comparison keeps one layout: ``VARIANT/`` for one seed, ``seed_S/VARIANT/`` for several. A run of one
    layout where the comparison's directory holds runs of the other is refused (a one-seed rerun of a several-seed
    comparison would train its seed again beside the seed folders)."""
    from deep_delta.variants import VARIANTS

    several = run.parent.name.startswith("seed_")
    where = run.parent.parent if several else run.parent
    if not where.is_dir():
        return
    other = ([d for d in sorted(where.iterdir()) if d.name in VARIANTS and (d / "run.json").is_file()] if several
             else [d for d in sorted(where.iterdir()) if d.name.startswith("seed_") and d.is_dir()])
    if other:
        holds = (f"runs of one seed ({other[0].name}/)" if several else
                 f"the runs of several seeds ({', '.join(d.name + '/' for d in other[:3])})")
        runs = "several seeds (seed_S/VARIANT/)" if several else "one seed (VARIANT/)"
        raise ValueError(f"{where} holds {holds}, but this comparison runs {runs}; allowed: the `seeds` that "
                         "comparison was run with (finished runs are reused), or another `out`")


def train_runs(cfgs: dict[tuple[str, int], TrainConfig], out: Path, data: TrainData, *, overwrite: bool,
               progress: bool, quiet: bool, outputs: Sequence[Path] = (), lock: str = "ddl compare",
               wandb_group: str | None = None, after_run=None, after_each=None) -> dict[tuple[str, int], str]:
    """Train, continue or reuse every run of ``cfgs`` in ``out`` through the study engine (every stored run checked
    first, ``out`` locked); ``after_run(key, cfg)`` after each run that did not diverge (the test loss of an
    evaluation run), and ``after_each(results)`` after each run but the last (a report rewritten as runs come in).
    Returns why each diverged run diverged, read from its record (as ``--report-only`` reads it,
    under either ``on_divergence``)."""
    from deep_delta.experiments.study import run_study

    say = (lambda msg: None) if quiet else (lambda msg: print(msg, flush=True))
    several = len({s for _, s in cfgs}) > 1

    def train_one(key, index: str) -> None:
        tag = f"{index} {key[0]}" + (f" seed {key[1]}" if several else "")
        say(tag)
        if wandb_group:  # OUT is checked and locked by now
            _remember_group(out, wandb_group)
        train_or_reuse(cfgs[key], tag, data, overwrite=overwrite, progress=progress, quiet=quiet, say=say)
        if after_run is not None and not run_divergence(cfgs[key].out):
            after_run(key, cfgs[key])

    from deep_delta.experiments.finished_runs import check_copies, check_models, read_run

    def check(key) -> None:
        check_reusable(cfgs[key], data.fingerprint, overwrite=overwrite, data_dir=data.dir)
        if key == last and not overwrite:  # then the finished runs together: no copies, one model per variant
            done = [read_run(Path(c.out)) for c in cfgs.values() if stored_end(c.out) is not None]
            check_copies(done)
            check_models(done)

    last = list(cfgs)[-1]
    run_study(out, list(cfgs), check=check, train=train_one, outputs=outputs, lock=lock, after_each=after_each)
    check_models([read_run(Path(cfg.out)) for cfg in cfgs.values()])  # the runs trained now too
    diverged = {key: run_divergence(cfgs[key].out) for key in cfgs}
    return {k: v for k, v in diverged.items() if v}


def train_or_reuse(cfg: TrainConfig, tag: str, data: TrainData, *, overwrite: bool, progress: bool, quiet: bool,
                   say) -> None:
    """Train (or continue, or reuse) one run; a diverged run is a result too (its run.json says so). A finished
    run is reused as its record (run.json, metrics.jsonl), with or without its checkpoints: not resumed, which
    would rewrite run.json (its wall time, the last process's only)."""
    from deep_delta.train.trainer import NonFiniteLossError, train

    end = None if overwrite else stored_end(cfg.out)
    if end is not None and end["diverged"] is not None:  # a result: kept, not trained again (it would diverge)
        say(f"{tag}: diverged ({end['diverged']}); kept as a result")
        return
    if end is not None and end["step"] >= cfg.steps:
        say(f"{tag}: finished at step {end['step']} (its record); kept")
        return
    try:
        train(cfg, resume=True, overwrite=overwrite, progress=progress, desc=tag, quiet=quiet, data=data)
    except NonFiniteLossError as e:
        say(f"{tag}: {e.reason}")


def run_compare(base: TrainConfig, plan: ComparePlan, out: str | os.PathLike = "runs/compare", *,
                overwrite: bool = False, progress: bool = True, quiet: bool = False, time_repeats: int = 5,
                data: TrainData | None = None) -> dict[str, Any]:
    """Train every variant of ``plan`` with every seed at ``base.lr`` and write the comparison.

    Seed ``s`` is paired: every variant trains from initialisation seed ``s`` on the data in the order seed
    ``s`` draws (``TrainConfig.seed``). One seed keeps one run directory per variant, ``out/<variant>``; several use
    ``out/seed_<s>/<variant>``. A finished identical run is reused and an interrupted one continued; a run with
    other settings is refused unless ``overwrite``. After training, the step time of each variant is measured
    interleaved (``time_repeats`` rounds; 0 skips it) for the equal-wall-clock view. The plan's ``step_costs``
    ({variant: its step time over the reference's}) give those variants the budget of the reference's ``steps`` at
    that cost (:func:`~deep_delta.experiments.plan.cost_steps`), each with its own full lr schedule: an equal-cost
    comparison. Returns the summary (also compare.json)."""
    out = Path(out)
    variants = list(plan.variants)
    if base.wandb:
        base = replace(base, wandb_group=wandb_group(base, out))
    data = data if data is not None else TrainData.resolve(base.data)
    t0 = time.perf_counter()
    diverged = train_runs(plan.runs(base, out), out, data, overwrite=overwrite,
                          progress=progress, quiet=quiet, outputs=[out / name for name in OUTPUTS],
                          wandb_group=base.wandb_group if base.wandb else None)
    timing = measure_step_times(base, variants, data.vocab_size, repeats=time_repeats) if time_repeats else None
    timing = with_earlier(timing, out / "compare.json", base.to_dict())
    summary = summarize_runs(out, variants, base, seeds=list(plan.seeds), step_times=timing, diverged=diverged)
    summary.update(data_fingerprint=data.fingerprint, wall_s=time.perf_counter() - t0, plan=plan.to_dict(),
                   **({"step_costs": plan.step_costs} if plan.step_costs else {}))
    write_comparison(out, summary)
    if base.wandb:
        log_comparison(out, summary, base, say=print if not quiet else (lambda msg: None))
    return summary


def run_lr_grid(base: TrainConfig, plan: ComparePlan, out: str | os.PathLike = "runs/compare", *,
                overwrite: bool = False, progress: bool = True, quiet: bool = False, time_repeats: int = 5,
                data: TrainData | None = None, stem: str = "compare", lock: str | None = "ddl compare --lrs"
                ) -> dict[str, Any]:
    """:func:`run_compare` at every lr of the plan's grids (``out/lr_<lr>``, a complete comparison each of the
    variants whose grid holds that lr, resumable as one), then each variant at its own best lr, chosen on the final
    validation loss alone (:func:`~deep_delta.experiments.lr_grid.choose_lrs`), paired by seed against the reference
    at its own best lr. A run diverges when its loss is non-finite or its final validation loss is above
    ``DIVERGENCE_FACTOR`` x ln(vocabulary size) (a uniform guess's loss); such a run is a grid point marked
    "diverged". Writes ``compare.md``, ``compare.json``, ``curves.png`` (each variant at its chosen lr) and
    ``lr_sensitivity.png`` in ``out`` (``stem`` "selection": ``selection.md``, ... , the grid of a held-out plan);
    returns the summary. ``lock``: what ``out``'s lock names (None: the caller holds it)."""
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR
    from deep_delta.experiments.study import run_lr_study
    from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results
    from deep_delta.train.build import build_model_config

    out = Path(out)
    variants, grids = list(plan.variants), plan.grids
    data = data if data is not None else TrainData.resolve(base.data)
    check_grid_data(data)
    limit = DIVERGENCE_FACTOR * math.log(build_model_config(base, data.vocab_size).vocab_size)
    refuse_replaced_dir(out)
    refuse_unwritable_results(out / name for name in (*OUTPUTS, "lr_sensitivity.png"))
    t0 = time.perf_counter()

    def check(lr: float, where: Path) -> None:
        for cfg in plan.at_lr(lr).runs(replace(base, lr=lr), where).values():
            check_reusable(cfg, data.fingerprint, overwrite=overwrite, data_dir=data.dir)

    def run_at(lr: float, where: Path) -> dict:
        return run_compare(replace(base, lr=lr), plan.at_lr(lr), where,
                           overwrite=overwrite, progress=progress, quiet=quiet, time_repeats=0, data=data)

    def finish(per_lr: dict, points: list[dict], chosen: dict) -> dict:
        timing = measure_step_times(base, variants, data.vocab_size, repeats=time_repeats) if time_repeats else None
        timing = with_earlier(timing, out / f"{stem}.json", base.to_dict())
        summary = grid_summary(base, variants, list(plan.seeds), plan.lrs, per_lr, points, chosen, timing, limit,
                               grids)
        summary.update(data_fingerprint=data.fingerprint, wall_s=time.perf_counter() - t0,
                       plan=plan.selection.to_dict(), **({"step_costs": plan.step_costs} if plan.step_costs else {}))
        write_comparison(out, summary, stem)
        return summary

    say = (lambda msg: None) if quiet else (lambda msg: print(msg, flush=True))
    return run_lr_study(out, plan.lrs, variants, check=check, run_at=run_at,
                        points_at=lambda lr, at_lr: lm_grid_points(lr, at_lr, limit), higher_is_better=False,
                        finish=finish, lock=lock, say=say, grids=grids)


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


STEP_FIELDS = ("compile", "cuda_graphs", "activation_checkpointing", "grad_clip", "lr", "weight_decay", "betas",
               "optimizer", "adamw_lr_ratio")


def step_settings(base: TrainConfig) -> dict:
    """The fields of the runs' TrainConfig that decide how their step is built (``train.step.build_step``): the
    step :func:`measure_step_times` times is the one they trained."""
    return {name: getattr(base, name) for name in STEP_FIELDS}


def measure_step_times(base: TrainConfig, variants: list[str], data_vocab: int, *, repeats: int = 5,
                       warmup: int = 1) -> dict:
    """Median seconds per optimizer step of each variant at the comparison's shape (batch, sequence, model,
    device) and with the step the runs trained (:func:`step_settings`: compile, CUDA graphs, activation
    checkpointing, ...), timed in interleaved rounds so that a busy machine slows every variant alike; the
    sequential runs' own clocks are not used for this. ``step_time_rounds_s``: every round's seconds of each
    variant (round i of every variant under one load: the spread of a ratio of step times over the rounds)."""
    import statistics

    from deep_delta.eval.step_bench import StepSubject
    from deep_delta.eval.timing import interleaved_times
    from deep_delta.runtime import resolve_device, trains_in_bf16
    from deep_delta.train.build import build_model_config

    vocab = build_model_config(base, data_vocab).vocab_size  # the model the runs trained
    device = resolve_device(base.device)
    dtype = "bfloat16" if trains_in_bf16(base.dtype, device) else "float32"
    subjects = {v: StepSubject(v, base.preset, batch_size=base.batch_size, seq_len=base.seq_len, device=device,
                               dtype=dtype, overrides={**base.model, "vocab_size": vocab}, seed=base.seed,
                               train=step_settings(base)) for v in variants}
    rounds = interleaved_times({v: s.train_step for v, s in subjects.items()}, device, repeats, warmup)
    return {"step_time_s": {v: statistics.median(ts) for v, ts in rounds.items()}, "step_time_rounds_s": rounds,
            "repeats": repeats, "device": str(device), "dtype": dtype}


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


__all__ = ["check_grid_data", "check_reusable", "measure_step_times", "run_compare", "run_divergence", "run_lr_grid",
           "step_settings", "stored_end", "train_runs"]
