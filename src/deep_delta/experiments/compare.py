"""Train several variants with the same seed, data and token budget, and compare them side by side.

Outputs in ``OUT``: one run directory per variant (``OUT/<variant>/``, a normal training run), ``compare.md``
(a Table-3-style table), ``compare.json`` (the same numbers plus settings and machine) and ``curves.png``
(training and validation loss against optimizer steps). With an lr grid (:func:`run_lr_grid`), one such
comparison per lr in ``OUT/lr_<lr>/``, and in ``OUT`` the same outputs for each variant at its own best lr
plus ``lr_sensitivity.png``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from deep_delta.experiments.lr_grid import (
    DIVERGENCE_FACTOR,
    grid_table,
    selection_sentence,
    shared_lr_sentence,
)
from deep_delta.experiments.stats import mean_sd, paired_difference, value_at
from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results, save_figure
from deep_delta.settings import MAX_SEEDS
from deep_delta.train.config import TrainConfig
from deep_delta.train.metrics import read_metrics
from deep_delta.train.provenance import data_fingerprint
from deep_delta.variants import DEFAULT_VARIANTS, paper_name


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


# the step costs an equal-cost comparison takes: a step between a hundredth and a hundred times the reference's
MIN_STEP_COST, MAX_STEP_COST = 0.01, 100.0


def cost_steps(steps: int, cost: float) -> int:
    """The optimizer steps that cost what ``steps`` reference steps cost, for a step ``cost`` x as dear."""
    return max(1, round(steps / cost))


def reference_variant(variants: list[str]) -> str:
    """The variant a comparison measures the others against: ``baseline`` when compared, else the first."""
    return "baseline" if "baseline" in variants else variants[0]


def check_step_costs(step_costs: dict[str, float] | None, variants: list[str]) -> dict[str, float]:
    """``step_costs`` validated against the comparison's variants: each a variant of it other than the reference
    (``baseline`` when present, else the first), with a finite cost > 0."""
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


def wandb_group(base: TrainConfig, out: Path) -> str:
    """The comparison's W&B group: ``base.wandb_group`` when set, else the one ``out/wandb.json`` keeps from an
    earlier start of this comparison, else a new ``<out name>-<8 characters>``."""
    from deep_delta.train.wandb_sink import generate_id, read_wandb_file

    return base.wandb_group or read_wandb_file(out).get("group") or f"{out.resolve().name}-{generate_id()}"


REUSE_REMEDY = ("a comparison never mixes results made with different settings or data: rerun with the settings "
                "it was made with, `overwrite` to retrain it, or another `out`")


def check_reusable(cfg: TrainConfig, data_fingerprint: str, *, overwrite: bool) -> None:
    """A run that compare continues or reuses must have been made with every result-changing setting of ``cfg``
    (all but :data:`~deep_delta.train.trainer.RESULT_NEUTRAL`: the budget, the validation batches, the dtype, ...)
    and from the same data; else it is refused, naming the differences, before anything trains."""
    from deep_delta.train.provenance import check_belongs, check_same_data
    from deep_delta.train.trainer import RESULT_NEUTRAL

    run_file = Path(cfg.out) / "run.json"
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
    check_same_data(run.get("data", {}).get("fingerprint"), data_fingerprint, what=what, data_dir=cfg.data or
                    "the default data", remedy=REUSE_REMEDY)


def run_compare(
    base: TrainConfig,
    variants: list[str] | tuple[str, ...] = DEFAULT_VARIANTS,
    out: str | os.PathLike = "runs/compare",
    *,
    seeds: list[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    quiet: bool = False,
    time_repeats: int = 5,
    step_costs: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Train every variant with every seed and write the comparison.

    Seed ``s`` is paired: every variant trains from initialisation seed ``s`` on the data in the order seed
    ``s`` draws (``TrainConfig.seed``). One seed (default ``[base.seed]``) keeps one run directory per variant,
    ``out/<variant>``; several use ``out/seed_<s>/<variant>``. A finished identical run is reused and an
    interrupted one continued; a run with other settings is refused unless ``overwrite``. After training, the
    step time of each variant is measured interleaved (``time_repeats`` rounds; 0 skips it) for the
    equal-wall-clock view. ``step_costs`` ({variant: its step time over the reference's, e.g. measured by
    ``ddl bench`` on the machine the comparison stands for}) gives those variants the budget of the reference's
    ``steps`` at that cost (:func:`cost_steps`), each with its own full lr schedule: an equal-cost comparison.
    ``out`` is locked while the comparison runs. Returns the summary (also ``compare.json``).
    """
    out = Path(out)
    variants = list(dict.fromkeys(variants))
    seeds = list(dict.fromkeys([base.seed] if seeds is None else seeds))
    if not variants:
        raise ValueError("compare: `variants` is empty; allowed: one or more variant names")
    if not seeds or len(seeds) > MAX_SEEDS or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"compare: `seeds` got {seeds!r}; allowed: 1 to {MAX_SEEDS} integers >= 0")
    step_costs = check_step_costs(step_costs, variants)
    if base.wandb:
        base = replace(base, wandb_group=wandb_group(base, out))
    from deep_delta.train.trainer import _resolve_data

    runs = {(v, s): compare_config(base, v, out, s, len(seeds) > 1, step_costs.get(v)) for s in seeds
            for v in variants}
    data_dir, data_meta = _resolve_data(base)
    fingerprint = data_fingerprint(data_dir, data_meta)
    for cfg in runs.values():  # validated before anything runs
        check_reusable(cfg, fingerprint, overwrite=overwrite)
    refuse_replaced_dir(out)
    refuse_unwritable_results(out / name for name in ("compare.md", "compare.json", "curves.png"))
    from deep_delta.train.checkpoint import run_lock

    with run_lock(out, "ddl compare"):
        if base.wandb:
            _remember_group(out, base.wandb_group)
        t0 = time.perf_counter()
        diverged = _train_all(runs, len(variants), overwrite=overwrite, progress=progress, quiet=quiet)
        timing = measure_step_times(base, variants, repeats=time_repeats) if time_repeats else None
        summary = summarize(out, variants, base, seeds=seeds, diverged=diverged, step_times=timing)
        summary["data_fingerprint"] = fingerprint
        if step_costs:
            summary["step_costs"] = step_costs
        summary["wall_s"] = time.perf_counter() - t0
        write_outputs(out, summary)
        if base.wandb:
            log_to_wandb(out, summary, base, say=(lambda msg: None) if quiet else print)
    return summary


def run_lr_grid(
    base: TrainConfig,
    variants: list[str] | tuple[str, ...] = DEFAULT_VARIANTS,
    out: str | os.PathLike = "runs/compare",
    lrs: list[float] | tuple[float, ...] = (),
    *,
    seeds: list[int] | None = None,
    overwrite: bool = False,
    progress: bool = True,
    quiet: bool = False,
    time_repeats: int = 5,
    step_costs: dict[str, float] | None = None,
) -> dict[str, Any]:
    """:func:`run_compare` at every lr of ``lrs`` (``out/lr_<lr>``, a complete comparison each, resumable as
    one), then each variant at its own best lr, chosen on the final validation loss alone
    (:func:`~deep_delta.experiments.lr_grid.choose_lrs`), paired by seed against the reference at its own
    best lr. A run diverges when its loss is non-finite or its final validation loss is above
    ``DIVERGENCE_FACTOR`` x ln(vocabulary size) (a uniform guess's loss); such a run is a grid point marked
    "diverged". Writes ``compare.md``, ``compare.json``, ``curves.png`` (each variant at its chosen lr) and
    ``lr_sensitivity.png`` in ``out``; returns the summary."""
    from deep_delta.experiments.lr_grid import DIVERGENCE_FACTOR, check_lrs, choose_lrs, divergence, lr_dir
    from deep_delta.train.trainer import _resolve_data, build_model_config

    out = Path(out)
    lrs = check_lrs(lrs)
    variants = list(dict.fromkeys(variants))
    seeds = list(dict.fromkeys([base.seed] if seeds is None else seeds))
    if not variants:
        raise ValueError("compare: `variants` is empty; allowed: one or more variant names")
    step_costs = check_step_costs(step_costs, variants)
    data_dir, data_meta = _resolve_data(base)
    fingerprint = data_fingerprint(data_dir, data_meta)
    for lr in lrs:  # every stored run is checked before anything trains
        for s in seeds:
            for v in variants:
                check_reusable(compare_config(replace(base, lr=lr), v, lr_dir(out, lr), s, len(seeds) > 1,
                                              step_costs.get(v)), fingerprint, overwrite=overwrite)
    refuse_replaced_dir(out)
    refuse_unwritable_results(out / name for name in ("compare.md", "compare.json", "curves.png",
                                                      "lr_sensitivity.png"))
    limit = DIVERGENCE_FACTOR * math.log(build_model_config(base, int(data_meta["vocab_size"])).vocab_size)
    t0 = time.perf_counter()
    from deep_delta.train.checkpoint import run_lock

    with run_lock(out, "ddl compare --lrs"):
        per_lr = {}
        for i, lr in enumerate(lrs, 1):
            if not quiet:
                print(f"lr {lr:g} ({i}/{len(lrs)} of the grid): {lr_dir(out, lr)}", flush=True)
            per_lr[lr] = run_compare(replace(base, lr=lr), variants, lr_dir(out, lr), seeds=seeds,
                                     overwrite=overwrite, progress=progress, quiet=quiet, time_repeats=0,
                                     step_costs=step_costs)
        points = []
        for lr, at_lr in per_lr.items():
            for row in at_lr["rows"]:
                for x in row["per_seed"]:
                    why = x["diverged"] or divergence(x["val_loss"], limit, "validation loss")
                    points.append({"variant": row["variant"], "lr": lr, "seed": x["seed"],
                                   "value": None if why else x["val_loss"], "diverged": why})
        chosen = choose_lrs(points, variants, lrs, higher_is_better=False)
        rows = []
        for v in variants:
            lr = chosen[v]["lr"]
            at = next(r for r in per_lr[lrs[0] if lr is None else lr]["rows"] if r["variant"] == v)
            results = at["per_seed"] if lr is not None else [
                {**x, "val_loss": None, "val_ppl": None, "val_curve": [], "diverged": chosen[v]["why"]}
                for x in at["per_seed"]]
            rows.append({**_variant_row(v, results), "lr": lr})
            if lr is None:
                rows[-1]["diverged"] = chosen[v]["why"]
        timing = measure_step_times(base, variants, repeats=time_repeats) if time_repeats else None
        ref = next(r for r in rows if r["variant"] == reference_variant([x["variant"] for x in rows]))
        for r in rows:
            _compare_to(r, ref, timing)
        settings = {**base.to_dict(), "lr": None}  # no one lr: each row has its own
        summary = {"rows": rows, "reference": ref["variant"], "seeds": seeds, "settings": settings,
                   "timing": timing, "machine": _machine(),
                   "lr_selection": {"method": "per-variant best on the final validation loss", "lrs": lrs,
                                    "divergence_limit": limit, "chosen": chosen},
                   "lr_grid": points, "data_fingerprint": fingerprint, "wall_s": time.perf_counter() - t0}
        if step_costs:
            summary["step_costs"] = step_costs
        write_outputs(out, summary)
    return summary


def _remember_group(out: Path, group: str) -> None:
    from deep_delta.train.wandb_sink import read_wandb_file, write_wandb_file

    saved = read_wandb_file(out)
    if saved.get("group") != group:
        write_wandb_file(out, group=group)


def log_to_wandb(out: Path, summary: dict[str, Any], base: TrainConfig, say=print) -> None:
    """The comparison as one more W&B run, ``comparison``, in the group of its training runs: the table (one
    row per variant), every seed's numbers, the validation curves (variant, seed, step, loss) and curves.png.
    A later start of the same comparison logs into the same run (its id is kept in ``out/wandb.json``)."""
    from deep_delta.train.wandb_sink import read_wandb_file, start_wandb, write_wandb_file

    saved = read_wandb_file(out, say=say)
    config = {"settings": summary["settings"], "variants": [r["variant"] for r in summary["rows"]],
              "seeds": summary["seeds"], "reference": summary["reference"], "machine": summary["machine"]}
    sink = start_wandb(project=base.wandb_project, name="comparison", group=base.wandb_group, job_type="compare",
                       config=config, directory=out, run_id=saved.get("id"), say=say)
    if sink is None:
        return
    write_wandb_file(out, group=base.wandb_group, id=sink.id)
    columns = ["variant", "name", "parameters", "val_loss", "val_loss_sd", "val_ppl", "d_val_loss", "d_val_loss_ci95",
               "wins", "n_paired", "d_val_ppl", "tokens_per_s", "speed_ratio", "step_time_s", "equal_time_val_loss",
               "equal_time_d_val_loss", "diverged"]
    sink.table("comparison", columns, [[_cell(r.get(c)) for c in columns] for r in summary["rows"]])
    seed_columns = ["seed", "steps", "tokens", "final_train_loss", "val_loss", "val_ppl", "tokens_per_s", "diverged"]
    sink.table("per_seed", ["variant", *seed_columns],
               [[r["variant"], *(_cell(x.get(c)) for c in seed_columns)] for r in summary["rows"] for x in r["per_seed"]])
    sink.table("val_curves", ["variant", "seed", "step", "val_loss"],
               [[r["variant"], x["seed"], step, loss] for r in summary["rows"] for x in r["per_seed"]
                for step, loss in x["val_curve"]])
    sink.image("curves", out / "curves.png")
    sink.summary({f"{r['variant']}/val_loss": r["val_loss"] for r in summary["rows"]})
    sink.close()


def _cell(value: Any) -> Any:
    """A table cell: numbers and text as they are, a list (a confidence interval) as its text."""
    return str(value) if isinstance(value, (list, tuple, dict)) else value


def _train_all(runs: dict, n_variants: int, *, overwrite: bool, progress: bool, quiet: bool) -> dict:
    """Train the runs in seed-major order; a diverging run is a result too (its message is kept)."""
    from deep_delta.train.trainer import NonFiniteLossError, train

    diverged: dict[tuple[str, int], str] = {}
    for i, ((variant, seed), cfg) in enumerate(runs.items(), 1):
        tag = f"[{i}/{len(runs)}] {variant}" + (f" seed {seed}" if len(runs) > n_variants else "")
        if not quiet:
            print(tag, flush=True)
        try:
            train(cfg, resume=True, overwrite=overwrite, progress=progress, desc=tag, quiet=quiet)
        except NonFiniteLossError as e:
            diverged[(variant, seed)] = str(e)
            if not quiet:
                print(f"{tag}: {e}", flush=True)
    return diverged


def measure_step_times(base: TrainConfig, variants: list[str], *, repeats: int = 5, warmup: int = 1) -> dict:
    """Median seconds per optimizer step of each variant at the comparison's shape (batch, sequence, model,
    device), timed in interleaved rounds so that a busy machine slows every variant alike; the sequential
    runs' own clocks are not used for this."""
    from deep_delta.eval.step_bench import StepSubject
    from deep_delta.eval.timing import interleaved_medians
    from deep_delta.runtime import resolve_device
    from deep_delta.train.trainer import _resolve_data, build_model_config

    _, data_meta = _resolve_data(base)
    vocab = build_model_config(base, int(data_meta["vocab_size"])).vocab_size  # the model the runs trained
    device = resolve_device(base.device)
    dtype = "bfloat16" if base.dtype == "bfloat16" or (base.dtype == "auto" and device.type == "cuda") else "float32"
    subjects = {v: StepSubject(v, base.preset, batch_size=base.batch_size, seq_len=base.seq_len, device=device,
                               dtype=dtype, overrides={**base.model, "vocab_size": vocab}, seed=base.seed,
                               compile=base.compile) for v in variants}
    medians = interleaved_medians({v: s.train_step for v, s in subjects.items()}, device, repeats, warmup)
    return {"step_time_s": medians, "repeats": repeats, "device": str(device), "dtype": dtype}


def _median_tokens_per_s(records: list[dict]) -> float | None:
    rates = [r["tokens_per_s"] for r in records if "loss" in r and "tokens_per_s" in r]
    if len(rates) > 1:
        rates = rates[1:]  # the first step pays for warm-up (allocations, compilation)
    return statistics.median(rates) if rates else None


def _seed_result(run_dir: Path, seed: int, diverged: str | None, eval_batches: int | None = None) -> dict[str, Any]:
    records = read_metrics(run_dir)
    train_recs = [r for r in records if "loss" in r]
    vals = [r for r in records if "val_loss" in r]
    measured = sorted({r["eval_batches"] for r in vals if "eval_batches" in r})  # older records have none
    if eval_batches is not None and measured and measured != [eval_batches]:
        from deep_delta.train.provenance import StoredResultMismatch

        raise StoredResultMismatch(
            f"{run_dir / 'metrics.jsonl'} holds validation losses measured on {' and '.join(map(str, measured))} "
            f"batches, this comparison on {eval_batches} (`eval_batches`); {REUSE_REMEDY}")
    run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
    bad = diverged is not None
    return {
        "seed": seed,
        "parameters": run.get("parameters"),
        "steps": train_recs[-1]["step"] if train_recs else 0,
        "tokens": train_recs[-1]["tokens"] if train_recs else 0,
        "final_train_loss": train_recs[-1]["loss"] if train_recs else None,
        "val_loss": None if bad or not vals else vals[-1]["val_loss"],
        "val_ppl": None if bad or not vals else vals[-1]["val_ppl"],
        "val_curve": [] if bad else [[r["step"], r["val_loss"]] for r in vals],
        "tokens_per_s": _median_tokens_per_s(records),
        "diverged": diverged,
    }


def summarize(out: str | os.PathLike, variants: list[str], base: TrainConfig | None = None, *,
              seeds: list[int] | None = None, diverged: dict | None = None,
              step_times: dict | None = None) -> dict[str, Any]:
    """Rows of the comparison from the run directories (their metrics.jsonl and run.json).

    Per variant: every seed's numbers (``per_seed``), the mean +- sd of the final validation loss, the paired
    difference to the reference (``baseline`` when present) with its 95% t-interval and the number of seeds in
    which the variant was lower, and, with ``step_times``, the equal-wall-clock view: the validation loss
    each variant had reached when the reference finished (interpolated on its validation curve).
    """
    out = Path(out)
    seeds = [base.seed if base is not None else 0] if seeds is None else seeds
    diverged = diverged or {}
    per_seed_dirs = len(seeds) > 1
    rows = []
    for v in variants:
        results = [_seed_result(out / f"seed_{s}" / v if per_seed_dirs else out / v, s, diverged.get((v, s)),
                                base.eval_batches if base is not None else None) for s in seeds]
        rows.append(_variant_row(v, results))
    ref = next(r for r in rows if r["variant"] == reference_variant([x["variant"] for x in rows]))
    for r in rows:
        _compare_to(r, ref, step_times)
    return {"rows": rows, "reference": ref["variant"], "seeds": seeds,
            "settings": base.to_dict() if base is not None else None, "timing": step_times,
            "machine": _machine()}


def _variant_row(variant: str, results: list[dict]) -> dict[str, Any]:
    val_mean, val_sd = mean_sd([r["val_loss"] for r in results])
    ppl_mean, _ = mean_sd([r["val_ppl"] for r in results])
    rates = [r["tokens_per_s"] for r in results if r["tokens_per_s"]]
    failed = [(f"seed {r['seed']}: " if len(results) > 1 else "") + r["diverged"] for r in results if r["diverged"]]
    return {
        "variant": variant, "name": paper_name(variant), "parameters": results[0]["parameters"],
        "steps": results[0]["steps"], "tokens": results[0]["tokens"],
        "final_train_loss": mean_sd([r["final_train_loss"] for r in results])[0],
        "val_loss": val_mean, "val_loss_sd": val_sd, "val_ppl": ppl_mean,
        "tokens_per_s": statistics.median(rates) if rates else None,
        "diverged": "; ".join(failed) if failed else None, "per_seed": results,
    }


def _compare_to(r: dict, ref: dict, step_times: dict | None) -> None:
    """Fill the differences of row ``r`` to the reference row (paired by seed)."""
    r["reference"] = ref["variant"]
    mine, theirs = r["per_seed"], ref["per_seed"]
    paired = paired_difference([x["val_loss"] for x in mine], [y["val_loss"] for y in theirs])
    r["d_val_loss"], r["d_val_loss_ci95"], r["wins"], r["n_paired"] = (
        paired["mean"], paired["ci95"], paired["wins"], paired["n"])
    r["d_val_ppl"] = _diff(r["val_ppl"], ref["val_ppl"])
    r["d_parameters_pct"] = (100.0 * (r["parameters"] - ref["parameters"]) / ref["parameters"]
                             if r["parameters"] and ref["parameters"] else None)
    r["speed_ratio"] = r["tokens_per_s"] / ref["tokens_per_s"] if r["tokens_per_s"] and ref["tokens_per_s"] else None
    if not step_times:
        return
    t_v, t_ref = step_times["step_time_s"][r["variant"]], step_times["step_time_s"][ref["variant"]]
    r["step_time_s"], r["time_ratio"] = t_v, t_v / t_ref
    at = [value_at(x["val_curve"], x["steps"] * t_ref / t_v) if x["steps"] else None for x in mine]
    for x, v in zip(mine, at):
        x["val_loss_at_reference_time"] = v
    r["equal_time_val_loss"] = mean_sd(at)[0]
    eq = paired_difference(at, [y["val_loss"] for y in theirs])
    r["equal_time_d_val_loss"], r["equal_time_ci95"], r["equal_time_wins"] = eq["mean"], eq["ci95"], eq["wins"]


def _machine() -> dict[str, Any]:
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }


def _diff(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _fmt(x: float | None, spec: str, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, ("+" if signed else "") + spec)


def _ci(ci: list[float] | None) -> str:
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else "-"


def format_table(summary: dict[str, Any]) -> str:
    """The comparison as a markdown table: the columns of the paper's Table 3, the seeds' spread and paired
    interval, the cost, and the loss at equal wall-clock time."""
    ref = summary["reference"]
    n = len(summary.get("seeds") or [None])
    head = ("| model | variant | params | val loss | ppl | d loss | 95% CI of d | lower in | d ppl | train tok/s | speed "
            "| step ms | val loss at ref. time | d at ref. time |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    lines = [head]
    for r in summary["rows"]:
        params = f"{r['parameters']:,}" if r["parameters"] else "-"
        if r["variant"] != ref and r["d_parameters_pct"] is not None:
            params += f" ({r['d_parameters_pct']:+.2f}%)"
        is_ref = r["variant"] == ref
        val = _fmt(r["val_loss"], ".4f") + (f" +- {r['val_loss_sd']:.4f}" if r.get("val_loss_sd") else "")
        if r.get("diverged") and r["val_loss"] is None:
            val = "diverged"
        step_ms = _fmt(1000 * r["step_time_s"], ".1f") if r.get("step_time_s") else "-"
        lines.append(
            f"| {r['name']} | {r['variant']} | {params} | {val} | {_fmt(r['val_ppl'], '.3f')} "
            f"| {'-' if is_ref else _fmt(r['d_val_loss'], '.4f', True)} "
            f"| {'-' if is_ref else _ci(r.get('d_val_loss_ci95'))} "
            f"| {'-' if is_ref else str(r.get('wins', 0)) + '/' + str(r.get('n_paired', n))} "
            f"| {'-' if is_ref else _fmt(r['d_val_ppl'], '.3f', True)} "
            f"| {_fmt(r['tokens_per_s'], ',.0f')} | {_fmt(r['speed_ratio'], '.2f')}x | {step_ms} "
            f"| {_fmt(r.get('equal_time_val_loss'), '.4f')} "
            f"| {'-' if is_ref else _fmt(r.get('equal_time_d_val_loss'), '.4f', True)} |"
        )
    return "\n".join(lines)


def verdicts(summary: dict[str, Any]) -> list[str]:
    """One plain sentence per variant: better, worse, or not distinguishable from the reference."""
    ref, lines = summary["reference"], []
    for r in summary["rows"]:
        if r["variant"] == ref or r["d_val_loss"] is None:
            continue
        ci, n = r.get("d_val_loss_ci95"), r.get("n_paired", 0)
        if ci is None:
            what = f"{r['d_val_loss']:+.4f} nats in one seed: an anecdote, not evidence (use --seeds 3 or more)"
        elif ci[1] < 0:
            what = f"lower by {-r['d_val_loss']:.4f} nats (95% CI {_ci(ci)}, lower in {r['wins']}/{n} seeds)"
        elif ci[0] > 0:
            what = f"HIGHER (worse) by {r['d_val_loss']:.4f} nats (95% CI {_ci(ci)}, lower in {r['wins']}/{n} seeds)"
        else:
            what = (f"not distinguishable from {ref} at this budget (d = {r['d_val_loss']:+.4f}, 95% CI {_ci(ci)} "
                    f"contains 0; lower in {r['wins']}/{n} seeds)")
        at = f" at lr {r['lr']:g}" if r.get("lr") is not None else ""
        lines.append(f"- {r['variant']}{at}: {what}.")
    return lines


def format_report(summary: dict[str, Any]) -> str:
    """``compare.md``: the table, a plain verdict per variant, the settings and the machine."""
    s = summary.get("settings") or {}
    m = summary["machine"]
    rows = summary["rows"]
    seeds = summary.get("seeds") or [s.get("seed")]
    tokens = rows[0]["tokens"] if rows else 0
    notes = [f"- {r['variant']} diverged: {r['diverged']}" for r in rows if r.get("diverged")]
    timing = summary.get("timing")
    grid = summary.get("lr_selection")
    lr_text = (f"lr {s.get('lr')}" if grid is None else
               "lr per variant (" + ", ".join(f"{r['variant']} {_fmt(r['lr'], 'g')}" for r in rows) + ")")
    lines = [
        "# Variant comparison",
        "",
        (shared_lr_sentence(s.get("lr")) if grid is None else
         selection_sentence(grid["lrs"], "final validation loss") + " The loss reported is the same validation "
         "loss the lr was chosen on (slightly optimistic, for every variant alike)."),
        "",
        format_table(summary),
        "",
        *verdicts(summary),
        *notes,
        "",
        f"val loss: mean over {len(seeds)} seed(s) ({', '.join(map(str, seeds))}), +- the sample sd. d loss / d ppl: "
        f"difference to `{summary['reference']}` (negative is better), paired by seed; 95% CI: t-interval of the "
        "mean paired difference; lower in: seeds in which the variant's loss was lower. train tok/s: median over "
        "the optimizer steps after the first (sequential runs; a busy machine distorts it); speed: ratio to the "
        "reference.",
    ]
    if timing:
        lines += [
            "",
            f"step ms: median of {timing['repeats']} interleaved rounds of the same optimizer step per variant "
            f"({timing['device']}, {timing['dtype']}), measured after training. val loss at ref. time: the "
            "validation loss each variant had reached when the reference finished its steps, at this step time "
            "(interpolated on its validation curve; '-' where that falls before its first validation).",
        ]
    lines += [
        "",
        f"Seed s means the same initialisation seed and the same data order for every variant. Data "
        f"{s.get('data') or 'the embedded default text'}; preset {s.get('preset')}, {s.get('steps')} steps x "
        f"{s.get('batch_size')} x {s.get('seq_len')} tokens ({tokens:,} tokens), {lr_text} (warm-up "
        f"{s.get('warmup_steps')}, cosine to {s.get('min_lr_ratio')} x lr), validation on {s.get('eval_batches')} "
        f"batches every {s.get('eval_every')} steps.{cost_sentence(summary)}",
        "",
        f"Machine: {m['device'] if m['device'] != 'cpu' else 'CPU only (no GPU)'}, {m['cpu_count']} CPU cores "
        f"({m['processor']}), torch {m['torch']} with {m['torch_threads']} thread(s). Wall time "
        f"{summary.get('wall_s', 0):.0f} s.",
        "",
        "![training and validation loss](curves.png)",
        "",
    ]
    if grid is not None:
        lines += [
            "## Final validation loss at every lr",
            "",
            grid_table(grid["chosen"], grid["lrs"], lambda x: format(x, ".4f")),
            "",
            f"Mean +- sd over the seeds; bold: the chosen lr. A run counts as diverged when its loss was "
            f"non-finite or its final validation loss was above {grid['divergence_limit']:.4f} = "
            f"{DIVERGENCE_FACTOR:g} x ln(vocabulary size), a uniform guess's loss; an lr at which any seed diverged is not chosen. Each lr's own "
            "comparison is in `lr_<lr>/compare.md`.",
            "",
            "![final validation loss against lr](lr_sensitivity.png)",
            "",
        ]
    return "\n".join(lines)


def _run_dirs(out: Path, variant: str, seeds: list[int]) -> list[Path]:
    return [out / f"seed_{s}" / variant for s in seeds] if len(seeds) > 1 else [out / variant]


def _band(curves: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Mean, min and max over the curves at the steps they all have."""
    common = sorted(set.intersection(*(set(dict(c)) for c in curves))) if curves else []
    cols = [[dict(c)[x] for c in curves] for x in common]
    return common, [statistics.fmean(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def plot_curves(out: str | os.PathLike, variants: list[str], path: str | os.PathLike,
                seeds: list[int] | None = None, roots: dict[str, Path | None] | None = None) -> Path:
    """Training loss (moving average) and validation loss against the step: the mean over seeds, with the
    band between the lowest and highest seed. ``roots``: where each variant's runs are, when not in ``out``
    (an lr grid: its chosen lr's directory; None leaves the variant out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = seeds or [0]
    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, v in enumerate(variants):
        color, label = f"C{i}", paper_name(v)
        root = roots.get(v) if roots is not None else Path(out)
        if root is None:
            continue
        records = [read_metrics(d) for d in _run_dirs(root, v, seeds)]
        train = []
        for recs in records:
            pts = [(r["step"], r["loss"]) for r in recs if "loss" in r]
            smooth = _moving_average([y for _, y in pts], max(1, len(pts) // 20))
            train.append(list(zip([x for x, _ in pts], smooth)))
        val = [[(r["step"], r["val_loss"]) for r in recs if "val_loss" in r] for recs in records]
        for ax, curves, style in ((ax_t, train, "-"), (ax_v, val, "o-")):
            steps, mean, lo, hi = _band([c for c in curves if c])
            if steps:
                ax.plot(steps, mean, style, color=color, markersize=3, label=label)
                if len(seeds) > 1:
                    ax.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
    for ax, title in ((ax_t, "training loss (moving average)"), (ax_v, "validation loss")):
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss (nats / token)")
        ax.set_title(title + (f", mean and range over {len(seeds)} seeds" if len(seeds) > 1 else ""))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # none when every variant diverged
            ax.legend()
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def _moving_average(xs, window: int) -> list[float]:
    """Trailing mean over up to ``window`` points (same length as ``xs``)."""
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x
        if i >= window:
            total -= xs[i - window]
        out.append(total / min(i + 1, window))
    return out


def cost_sentence(summary: dict[str, Any]) -> str:
    """' Equal cost: ...' for a comparison with step costs (each such variant's steps and cost), else ''."""
    costs = summary.get("step_costs")
    if not costs:
        return ""
    steps = summary["settings"].get("steps")
    parts = [f"{v} {cost_steps(steps, c)} steps (its step {c:g}x the reference's)" for v, c in costs.items()]
    return (f" Equal cost: the budget is {steps} steps of `{summary['reference']}`; {', '.join(parts)}, each with "
            "its own warm-up and cosine schedule over its steps (the costs are given, not measured here).")


def write_outputs(out: str | os.PathLike, summary: dict[str, Any]) -> None:
    """compare.md, compare.json (every per-seed number) and curves.png, each replaced atomically; for an lr grid
    also lr_sensitivity.png."""
    from deep_delta.experiments.lr_grid import lr_dir, plot_sensitivity
    from deep_delta.fsutil import atomic_write

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    variants = [r["variant"] for r in summary["rows"]]
    roots = None
    if summary.get("lr_selection"):
        roots = {r["variant"]: None if r["lr"] is None else lr_dir(out, r["lr"]) for r in summary["rows"]}
        plot_sensitivity(summary["lr_grid"], variants, out / "lr_sensitivity.png",
                         "final validation loss (nats / token)",
                         f"validation loss against lr, {len(summary['seeds'])} seed(s) per point")
    tmp = out / ".curves.tmp.png"
    plot_curves(out, variants, tmp, summary.get("seeds"), roots)
    os.replace(tmp, out / "curves.png")
    atomic_write(out / "compare.md", format_report(summary))
    atomic_write(out / "compare.json", json.dumps(summary, indent=2))
