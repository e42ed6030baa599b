"""What a language-model comparison reports: each run's numbers read from its run directory, a row per variant
(mean +- sd over seeds, the paired difference to the reference with its 95% t-interval, the seeds in which it
was lower, the equal-wall-clock view), a Table-3-style markdown table, a plain verdict per variant, the report
``compare.md`` with settings and machine, the loss curves ``curves.png``, and the comparison's W&B run.
Written through the shared report stack (:mod:`deep_delta.experiments.report`)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from deep_delta.experiments.held_out_split import TEST_FILE, read_test, rounding_said
from deep_delta.experiments.lr_grid import (
    DIVERGENCE_FACTOR,
    grid_table,
    grid_text,
    selection_sentence,
    shared_lr_sentence,
)
from deep_delta.experiments.plan import cost_steps, plan_of, reference_variant, run_dir
from deep_delta.experiments.report import ci_text, fmt, log_study, machine, write_outputs
from deep_delta.experiments.stats import mean_sd, paired_difference, value_at
from deep_delta.fsutil import save_figure
from deep_delta.train.config import TrainConfig, recorded
from deep_delta.train.metrics import metrics_file, read_metrics
from deep_delta.train.run_dir import read_run_file
from deep_delta.variants import paper_name


def reuse_remedy(run_dir: Path | str) -> str:
    """What a comparison refusing a stored run of other settings or data says can be done: each choice with what it
    retrains (the run alone, or every run of the study)."""
    return (f"a comparison never mixes results made with different settings or data: rerun with the settings it was "
            f"made with; or retrain this run alone (remove {run_dir} and run again: only the runs that are missing "
            "train); or `overwrite`, which retrains every run in `out`; or another `out`")


def windows_text(plan: str | None) -> str:
    """How an evaluation of part of a split chose its windows (``eval_windows``), as a report says it."""
    return {"spread": "windows spread evenly over the split", "first": "the split's first windows"}.get(
        plan, "windows not recorded")


def _median_tokens_per_s(records: list[dict]) -> float | None:
    rates = [r["tokens_per_s"] for r in records if "loss" in r and "tokens_per_s" in r]
    if len(rates) > 1:
        rates = rates[1:]  # the first step pays for warm-up (allocations, compilation)
    return statistics.median(rates) if rates else None


def seed_result(run_dir: Path, seed: int, diverged: str | None, eval_batches: int | None = None,
                split: str = "val") -> dict[str, Any]:
    """One run's numbers from its directory: its final training and validation loss, validation curve and speed;
    with ``split`` "test", its test loss too (``RUN/test.json``: :mod:`deep_delta.experiments.held_out_split`)."""
    records = read_metrics(run_dir)
    train_recs = [r for r in records if "loss" in r]
    vals = [r for r in records if "val_loss" in r]
    measured = sorted({r["eval_batches"] for r in vals if "eval_batches" in r})  # older records have none
    if eval_batches is not None and measured and measured != [eval_batches]:
        from deep_delta.train.provenance import StoredResultMismatch

        raise StoredResultMismatch(
            f"{metrics_file(run_dir)} holds validation losses measured on {' and '.join(map(str, measured))} "
            f"batches, this comparison on {eval_batches} (`eval_batches`); {reuse_remedy(run_dir)}")
    run = read_run_file(run_dir) if (run_dir / "run.json").is_file() else {}
    bad = diverged is not None
    test = read_test(run_dir) if split == "test" and not bad else None
    if split == "test" and not bad and test is None:
        raise FileNotFoundError(f"{run_dir / TEST_FILE} is missing: the run's test loss was not measured; run the "
                                "`ddl compare` that trained it again (it measures what is missing)")
    extra = {} if split != "test" else {"test_loss": test and test["loss"], "test_ppl": test and test.get("ppl"),
                                        "test_tokens": test and test["tokens"]}
    return {**extra,
        "seed": seed,
        "parameters": run.get("parameters"),
        "steps": train_recs[-1]["step"] if train_recs else 0,
        "tokens": train_recs[-1]["tokens"] if train_recs else 0,
        "final_train_loss": train_recs[-1]["loss"] if train_recs else None,
        "val_loss": None if bad or not vals else vals[-1]["val_loss"],
        "val_ppl": None if bad or not vals else vals[-1]["val_ppl"],
        "val_curve": [] if bad else [[r["step"], r["val_loss"]] for r in vals],
        "tokens_per_s": _median_tokens_per_s(records),
        "train_wall_s": (run.get("finished") or {}).get("wall_s"),  # every session of the run (its run.json)
        "diverged": diverged,
    }


def summarize_runs(out: str | os.PathLike, variants: list[str], base: TrainConfig | None = None, *,
                   seeds: list[int] | None = None, diverged: dict | None = None,
                   step_times: dict | None = None, split: str = "val",
                   per_seed_dirs: bool | None = None) -> dict[str, Any]:
    """Rows of the comparison from the run directories (their metrics.jsonl and run.json).

    Per variant: every seed's numbers (``per_seed``), the mean +- sd of the final validation loss, the paired
    difference to the reference (``baseline`` when present) with its 95% t-interval and the number of seeds in
    which the variant was lower, and, with ``step_times``, the equal-wall-clock view: the validation loss
    each variant had reached when the reference finished (interpolated on its validation curve). ``split``
    "test": the final test losses (``RUN/test.json``) too, which the report then shows (``reported_split``).
    ``per_seed_dirs``: whether the runs stand in ``seed_<s>/`` folders (default: with several ``seeds``; a report on
    some of a study's seeds says).
    """
    out = Path(out)
    seeds = [base.seed if base is not None else 0] if seeds is None else seeds
    diverged = diverged or {}
    per_seed_dirs = len(seeds) > 1 if per_seed_dirs is None else per_seed_dirs
    rows = []
    for v in variants:
        results = [seed_result(run_dir(out, v, s, per_seed_dirs), s, diverged.get((v, s)),
                               base.eval_batches if base is not None else None, split) for s in seeds]
        rows.append(variant_row(v, results))
    ref = next(r for r in rows if r["variant"] == reference_variant([x["variant"] for x in rows]))
    for r in rows:
        compare_rows(r, ref, step_times)
    notes = design_notes(base, variants)
    return {"rows": rows, "reference": ref["variant"], "seeds": seeds,
            "settings": base.to_dict() if base is not None else None, "timing": step_times,
            "machine": machine(), "reported_split": split, **({"notes": notes} if notes else {})}


def design_notes(base: TrainConfig | None, variants: list[str]) -> list[str]:
    """A note for each compared variant whose design has a caveat at the runs' settings
    (:meth:`~deep_delta.designs.base.ResidualDesign.caveat`: Block AttnRes with as many blocks as sublayers is Full
    AttnRes), saying what its residual is (the design's own one line, ``describe``)."""
    if base is None:
        return []
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    notes = []
    for v in variants:
        cfg = DDLConfig.from_variant(v, base.preset, **base.model)
        if cfg.design.caveat(cfg):
            notes.append(f"{v} ({paper_name(v)}) at these settings: {cfg.design.describe(cfg)}")
    return notes


def loss_keys(split: str) -> dict[str, str]:
    """The keys of a row's numbers on ``split`` ("val" or "test"): its mean loss, sd, perplexity, the paired
    difference to the reference, its interval and perplexity difference, and the seeds in which it was lower."""
    if split == "val":
        return {"loss": "val_loss", "sd": "val_loss_sd", "ppl": "val_ppl", "d": "d_val_loss",
                "ci": "d_val_loss_ci95", "d_ppl": "d_val_ppl", "wins": "wins", "n": "n_paired"}
    return {"loss": f"{split}_loss", "sd": f"{split}_loss_sd", "ppl": f"{split}_ppl", "d": f"d_{split}_loss",
            "ci": f"d_{split}_loss_ci95", "d_ppl": f"d_{split}_ppl", "wins": f"{split}_wins", "n": f"{split}_n_paired"}


def variant_row(variant: str, results: list[dict]) -> dict[str, Any]:
    rates = [r["tokens_per_s"] for r in results if r["tokens_per_s"]]
    failed = [(f"seed {r['seed']}: " if len(results) > 1 else "") + r["diverged"] for r in results if r["diverged"]]
    row = {
        "variant": variant, "name": paper_name(variant), "parameters": results[0]["parameters"],
        "steps": results[0]["steps"], "tokens": results[0]["tokens"],
        "final_train_loss": mean_sd([r["final_train_loss"] for r in results])[0],
        "tokens_per_s": statistics.median(rates) if rates else None,
        "diverged": "; ".join(failed) if failed else None, "per_seed": results,
    }
    for split in ("val", "test") if "test_loss" in results[0] else ("val",):
        keys = loss_keys(split)
        row[keys["loss"]], row[keys["sd"]] = mean_sd([r[keys["loss"]] for r in results])
        row[keys["ppl"]] = mean_sd([r[keys["ppl"]] for r in results])[0]
    return row


def compare_rows(r: dict, ref: dict, step_times: dict | None) -> None:
    """Fill the differences of row ``r`` to the reference row (paired by seed), on validation and, where the runs
    were measured on it, on test; the break-even step-cost ratio of an equal-steps row
    (:mod:`deep_delta.experiments.break_even`); with ``step_times``, the equal-time view."""
    r["reference"] = ref["variant"]
    mine, theirs = r["per_seed"], ref["per_seed"]
    for split in ("val", "test") if "test_loss" in r else ("val",):
        keys = loss_keys(split)
        paired = paired_difference([x[keys["loss"]] for x in mine], [y.get(keys["loss"]) for y in theirs])
        r[keys["d"]], r[keys["ci"]], r[keys["wins"]], r[keys["n"]] = (
            paired["mean"], paired["ci95"], paired["wins"], paired["n"])
        r[keys["d_ppl"]] = _diff(r[keys["ppl"]], ref.get(keys["ppl"]))
    r["break_even"] = _break_even(r, ref)
    r["d_parameters_pct"] = (100.0 * (r["parameters"] - ref["parameters"]) / ref["parameters"]
                             if r["parameters"] and ref["parameters"] else None)
    r["speed_ratio"] = r["tokens_per_s"] / ref["tokens_per_s"] if r["tokens_per_s"] and ref["tokens_per_s"] else None
    if not step_times:
        return
    t_v, t_ref = step_times["step_time_s"][r["variant"]], step_times["step_time_s"][ref["variant"]]
    r["step_time_s"], r["time_ratio"] = t_v, t_v / t_ref
    r["time_ratio_spread"] = ratio_spread(step_times.get("step_time_rounds_s"), r["variant"], ref["variant"])
    r["time_rounds"] = len((step_times.get("step_time_rounds_s") or {}).get(r["variant"]) or [])
    earlier = (step_times.get("earlier") or {}).get("step_time_s") or {}
    if isinstance(earlier.get(r["variant"]), (int, float)) and isinstance(earlier.get(ref["variant"]), (int, float)):
        r["earlier_time_ratio"] = earlier[r["variant"]] / earlier[ref["variant"]]
    at = [value_at(x["val_curve"], x["steps"] * t_ref / t_v) if x["steps"] else None for x in mine]
    for x, v in zip(mine, at):
        x["val_loss_at_reference_time"] = v
    r["equal_time_val_loss"] = mean_sd(at)[0]
    eq = paired_difference(at, [y["val_loss"] for y in theirs])
    r["equal_time_d_val_loss"], r["equal_time_ci95"], r["equal_time_wins"] = eq["mean"], eq["ci95"], eq["wins"]


def with_earlier(timing: dict | None, path: Path, settings: dict[str, Any]) -> dict | None:
    """``timing`` (step times just measured) with ``earlier``: the step times that the report in ``path`` (a
    comparison's compare.json or selection.json, about to be replaced) had measured for the same step (every setting
    that shapes it the same: :func:`timing_differences`), which these replace; the report then says each variant's
    ratio then and now. ``timing`` as it is without such a report."""
    from deep_delta.fsutil import read_json_file

    if not timing or not path.is_file():
        return timing
    try:
        old = read_json_file(path, "a comparison's summary (compare.json)", limit=256 << 20)
    except ValueError:
        return timing
    before = old.get("timing") if isinstance(old, dict) else None
    times = before.get("step_time_s") if isinstance(before, dict) else None
    if not isinstance(times, dict) or timing_differences(old.get("settings") or {}, settings):
        return timing
    kept = {k: before[k] for k in ("step_time_s", "step_time_rounds_s", "repeats") if k in before}
    return {**timing, "earlier": {**kept, "file": path.name}}


def timing_differences(timed: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """How the settings a step was timed with (``timed``, a summary's ``settings``) differ from ``settings`` in what
    shapes the step (the model, batch, sequence, device, dtype, compile, CUDA graphs, activation checkpointing,
    ...; not the variant, seed, lr, length, data or bookkeeping): [] where the same step was timed."""
    from deep_delta.train.provenance import differences
    from deep_delta.train.run_dir import RESULT_NEUTRAL

    shaping = {"compile", "cuda_graphs", "activation_checkpointing"}
    free = (RESULT_NEUTRAL - shaping) | {"variant", "seed", "out", "steps", "lr", "wandb_run_name", "data"}
    return differences(recorded(timed), recorded(settings), skip=free, has="it was timed with")


def ratio_spread(rounds: dict | None, variant: str, reference: str) -> list[float] | None:
    """The lowest and highest ratio of ``variant``'s step time to the ``reference``'s over the interleaved timing
    rounds (``rounds``: each variant's seconds per round; round i of both under one load), [low, high]; None
    without the rounds (a record written before they were kept)."""
    mine, theirs = (rounds or {}).get(variant), (rounds or {}).get(reference)
    if not mine or not theirs or len(mine) != len(theirs) or not all(t > 0 for t in theirs):
        return None
    ratios = [a / b for a, b in zip(mine, theirs)]
    return [min(ratios), max(ratios)]


def _diff(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _break_even(r: dict, ref: dict) -> dict | None:
    """Row ``r``'s break-even step-cost ratio against ``ref``, seed by seed (None for the reference itself, and for
    a row whose runs trained another number of steps than the reference's: an equal-cost row)."""
    from deep_delta.experiments.break_even import break_even, summarize

    if r is ref or r["variant"] == ref["variant"]:
        return None
    theirs = {y["seed"]: y for y in ref["per_seed"]}
    per_seed = []
    for x in r["per_seed"]:
        y = theirs.get(x["seed"])
        if y is None or x["steps"] != y["steps"] or x["diverged"] or y["diverged"] or y["val_loss"] is None:
            return None
        per_seed.append({"seed": x["seed"], **break_even(x["val_curve"], y["steps"], y["val_loss"])})
    return summarize(per_seed) if per_seed else None


def comparison_table(summary: dict[str, Any]) -> str:
    """The comparison as a markdown table: the columns of the paper's Table 3 (on the split the report is on:
    validation, or test for evaluation seeds), the seeds' spread and paired interval, one measure of the cost, and
    the validation loss at equal wall-clock time. The cost is the step time measured interleaved in one process
    after training where it was (every variant under the same load); else each run's median throughput while it
    trained, labelled as that run-average (sequential runs: a busy machine distorts it, so the two measures can
    disagree on which variant is faster, and only one is shown)."""
    ref = summary["reference"]
    split = summary.get("reported_split", "val")
    k = loss_keys(split)
    n = len(summary.get("seeds") or [None])
    timed = any(r.get("step_time_s") for r in summary["rows"])
    cost = ("| step ms (interleaved) | step vs ref. | val loss at ref. time | d at ref. time |" if timed else
            "| run-avg train tok/s | run-avg speed vs ref. |")
    head = (f"| model | variant | params | {split} loss | ppl | d loss | 95% CI of d | lower in | d ppl " + cost + "\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * (cost.count("|") - 1))
    lines = [head]
    for r in summary["rows"]:
        params = f"{r['parameters']:,}" if r["parameters"] else "-"
        if r["variant"] != ref and r.get("d_parameters_pct") is not None:
            params += f" ({r['d_parameters_pct']:+.2f}%)"
        is_ref = r["variant"] == ref
        val = fmt(r.get(k["loss"]), ".4f") + (f" +- {r[k['sd']]:.4f}" if r.get(k["sd"]) else "")
        if r.get("diverged") and r.get(k["loss"]) is None:
            val = "diverged"
        step_ms = fmt(1000 * r["step_time_s"], ".1f") if r.get("step_time_s") else "-"
        costs = (f"| {step_ms} | {_times(r.get('time_ratio'))} | {fmt(r.get('equal_time_val_loss'), '.4f')} "
                 f"| {'-' if is_ref else fmt(r.get('equal_time_d_val_loss'), '.4f', True)} |" if timed else
                 f"| {fmt(r.get('tokens_per_s'), ',.0f')} | {_times(r.get('speed_ratio'))} |")
        lines.append(
            f"| {r['name']} | {r['variant']} | {params} | {val} | {fmt(r.get(k['ppl']), '.3f')} "
            f"| {'-' if is_ref else fmt(r.get(k['d']), '.4f', True)} "
            f"| {'-' if is_ref else ci_text(r.get(k['ci']))} "
            f"| {'-' if is_ref else str(r.get(k['wins'], 0)) + '/' + str(r.get(k['n'], n))} "
            f"| {'-' if is_ref else fmt(r.get(k['d_ppl']), '.3f', True)} " + costs
        )
    return "\n".join(lines)


def source_section(summary: dict[str, Any]) -> list[str]:
    """compare.md's test loss per source of a study with evaluation seeds (``held_out.sources``, one row per source:
    the reference's mean, each other variant's paired difference to it), or the one line that says why there is
    none; [] for a study whose data names no sources."""
    held = summary.get("held_out") or {}
    if held.get("sources_note"):
        return ["", f"Test loss per source: {held['sources_note']}."]
    rows = held.get("sources")
    if not rows:
        return []
    ref = summary["reference"]
    others = [r["variant"] for r in summary["rows"] if r["variant"] != ref]
    lines = ["", "## Test loss per source", "",
             f"| source | tokens | {ref} loss | " + " | ".join(f"{v} d loss (95% CI)" for v in others) + " |",
             "| --- | ---: | ---: |" + " ---: |" * len(others)]
    for row in rows:
        cells = [f"{fmt(row['variants'][v].get('d'), '.4f', True)} {ci_text(row['variants'][v].get('ci95'))}"
                 if row["variants"][v].get("d") is not None else "-" for v in others]
        lines.append(f"| {row['source']} | {fmt(row['tokens'], ',d')} | {fmt(row['variants'][ref]['loss'], '.4f')} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Each test token counted for the source of its target token (a window that straddles two sources "
              "split between them), on the same test windows as the table above; loss: the mean over the evaluation "
              "seeds; d loss: the variant's minus the reference's, paired by seed, with its 95% t-interval. A source "
              "with few tokens has a wide interval, and the intervals are not corrected for reading many sources at "
              "once: a single interval that excludes 0 among them is weak evidence by itself."]
    return lines


def _times(ratio: float | None) -> str:
    return "-" if fmt(ratio, ".2f") == "-" else f"{ratio:.2f}x"


def verdicts(summary: dict[str, Any]) -> list[str]:
    """One plain sentence per variant: better, worse, or not distinguishable from the reference (on the split the
    report is on); the report's last line says what the comparison found (:func:`conclusion`)."""
    ref, lines = summary["reference"], []
    split = summary.get("reported_split", "val")
    k = loss_keys(split)
    on = " on test" if split == "test" else ""
    plan = plan_of(summary)
    held = plan.mode == "held_out" if plan is not None else bool(summary.get("held_out"))
    more = "--eval-seeds 3" if held else "--seeds 3"  # the seeds the numbers come from
    for r in summary["rows"]:
        if r["variant"] == ref or r.get(k["d"]) is None:
            continue
        d, ci, n, wins = r[k["d"]], r.get(k["ci"]), r.get(k["n"], 0), r.get(k["wins"], 0)
        if ci is None:
            what = f"{d:+.4f} nats{on} in one seed: an anecdote, not evidence (use {more} or more)"
        elif ci[1] < 0:
            what = f"lower{on} by {-d:.4f} nats (95% CI {ci_text(ci)}, lower in {wins}/{n} seeds)"
        elif ci[0] > 0:
            what = f"HIGHER (worse){on} by {d:.4f} nats (95% CI {ci_text(ci)}, lower in {wins}/{n} seeds)"
        else:
            what = (f"not distinguishable from {ref}{on} at this budget (d = {d:+.4f}, 95% CI {ci_text(ci)} "
                    f"contains 0; lower in {wins}/{n} seeds)")
        at = f" at lr {r['lr']:g}" if r.get("lr") is not None else ""
        lines.append(f"- {r['variant']}{at}: {what}.")
    return lines


def conclusion(summary: dict[str, Any]) -> str:
    """What the comparison found, in one sentence: each variant against the reference at equal steps (lower,
    higher, or not distinguishable where the seeds give an interval) and, where it was measured, what its step
    costs next to the reference's (interleaved, on the machine of the report)."""
    rows, ref = summary["rows"], summary["reference"]
    split = summary.get("reported_split", "val")
    k, loss = loss_keys(split), "validation" if split == "val" else split
    ref_name = next(r["name"] for r in rows if r["variant"] == ref)
    n = len(summary.get("seeds") or [None])
    parts = []
    for r in rows:
        if r["variant"] == ref:
            continue
        d, ci = r.get(k["d"]), r.get(k["ci"])
        if d is None:
            parts.append(f"{r['name']} {'diverged' if r.get('diverged') else f'has no {loss} loss'}")
            continue
        if ci is None:
            found = "the same" if d == 0 else f"{'lower' if d < 0 else 'higher'} by {abs(d):.4f} nats"
        elif ci[1] < 0 or ci[0] > 0:
            found = f"{'lower' if d < 0 else 'higher'} by {abs(d):.4f} nats (95% CI {ci_text(ci)})"
        else:
            found = f"not distinguishable (d = {d:+.4f}, 95% CI {ci_text(ci)})"
        spread, rounds = r.get("time_ratio_spread"), r.get("time_rounds")
        cost = (f", its step {r['time_ratio']:.2f}x the {ref_name}'s" if r.get("time_ratio") else "") + (
            f" ({spread[0]:.2f}x-{spread[1]:.2f}x over {rounds} timing rounds)" if r.get("time_ratio") and spread
            else "")
        parts.append(f"{r['name']} {found}{cost}")
    seeds = "one seed, so no interval: an anecdote" if n == 1 else f"{n} paired seeds"
    timed = " (step times measured interleaved on this machine)" if any(r.get("time_ratio") for r in rows) else ""
    return (f"Found ({seeds}): {lengths_text(summary)}, against the {ref_name}'s {loss} loss, " + "; ".join(parts)
            + f"{timed}.")


def run_lengths(summary: dict[str, Any]) -> dict[str, int]:
    """The optimizer steps each variant's runs trained ({variant: steps}), those that diverged left out (a run
    stopped by its divergence is shorter by that)."""
    return {r["variant"]: r["steps"] for r in summary["rows"] if not r.get("diverged")}


def lengths_text(summary: dict[str, Any]) -> str:
    """How the compared runs' lengths relate, as the closing sentence says it: "at equal steps"; at equal cost by
    the step costs given (``step_costs``: each such variant's steps at its cost); or, for runs of other lengths that
    no given cost accounts for (runs brought together by ``--report-only``), each variant's steps, called neither."""
    steps = run_lengths(summary)
    ref = summary["reference"]
    if len(set(steps.values())) <= 1 or ref not in steps:
        return "at equal steps"
    if unequal_lengths(summary):
        return ("at unequal lengths (" + ", ".join(f"{v} {n} steps" for v, n in steps.items())
                + ": neither equal steps nor an equal cost given)")
    costs = summary["step_costs"]
    return (f"at equal cost by the step costs given ({ref} {steps[ref]} steps; "
            + ", ".join(f"{v} {n} at {costs[v]:g}x" for v, n in steps.items() if n != steps[ref]) + ")")


def unequal_lengths(summary: dict[str, Any]) -> bool:
    """Whether some variant trained another number of steps than the reference with no step cost given for it
    (``step_costs``) that accounts for it: runs of unequal lengths, compared neither at equal steps nor at cost."""
    steps, ref = run_lengths(summary), summary["reference"]
    costs = summary.get("step_costs") or {}
    return ref in steps and any(n != steps[ref] and v not in costs for v, n in steps.items())


def tokens_text(summary: dict[str, Any]) -> str:
    """The training tokens of the compared runs in a few words: "N training tokens per variant" when every variant
    trained as many; the reference's, then those of the variants with a step cost, at equal cost; else each
    variant's."""
    tokens = {r["variant"]: r["tokens"] for r in summary["rows"] if not r.get("diverged")} or {
        r["variant"]: r["tokens"] for r in summary["rows"]}
    ref, costs = summary["reference"], summary.get("step_costs") or {}
    if len(set(tokens.values())) == 1:
        return f"{next(iter(tokens.values())):,} training tokens per variant"
    if ref in tokens and costs and not unequal_lengths(summary):
        return f"{tokens[ref]:,} training tokens for {ref} (" + ", ".join(
            f"{v} {n:,}" for v, n in tokens.items() if v in costs) + ")"
    return "training tokens per variant: " + ", ".join(f"{v} {n:,}" for v, n in tokens.items())


def lr_sentence(summary: dict[str, Any]) -> str:
    """The report's line on the learning rate and where the numbers come from: one shared lr; a grid whose lr was
    chosen and reported on the same seeds and validation sample (labelled so); or a grid chosen on the selection
    split and seeds, reported on fresh evaluation seeds and the test split (``held_out``)."""
    s, grid, held = summary.get("settings") or {}, summary.get("lr_selection"), summary.get("held_out")
    plan = plan_of(summary)
    mode = plan.mode if plan is not None else "held_out" if held else "grid" if grid else "single"
    muon = _muon_sentence(s)
    if mode == "single" or grid is None:
        return shared_lr_sentence(s.get("lr")) + muon
    chosen = selection_sentence(grid["lrs"], "final validation loss", grid.get("grids"))
    rounded = held and rounding_said(held["test_tokens"], held.get("test_tokens_asked"), s.get("seq_len"),
                                     s.get("batch_size"))
    rounded = f"; {rounded}" if rounded else ""
    if mode != "held_out" or held is None:
        return (chosen + " The lr was chosen and reported on the same seeds and validation sample: the loss "
                "reported is the one the lr was chosen on (optimistic, for every variant alike; `--eval-seeds N` "
                "reports fresh seeds on the test split instead)." + muon)
    return (f"Learning rate: each variant at its own best lr of {grid_text(grid['lrs'], grid.get('grids'))}, "
            f"chosen on the final validation loss of the `val` split (the selection split, {held['selection_tokens']:,} "
            f"tokens in {windows_text(recorded(s).get('eval_windows'))}) at the selection seeds {', '.join(map(str, held['selection_seeds']))} (the best mean among the "
            f"lrs at which no seed diverged). The numbers below are fresh runs at that lr with the evaluation seeds "
            f"{', '.join(map(str, held['eval_seeds']))}, reported on the `test` split ({held['test_tokens']:,} tokens "
            f"in {windows_text(held.get('test_windows'))}, the same windows for every run{rounded}), paired by seed: "
            "no number below chose an lr." + muon)


def optimizer_text(settings: dict[str, Any]) -> str:
    """The runs' optimizer in a few words (``settings``: their TrainConfig as a dict; a record made before the
    field existed trained with AdamW)."""
    if settings.get("optimizer", "adamw") != "muon":
        return "optimizer AdamW"
    return (f"optimizer Muon on the hidden matrices (match_rms_adamw) with AdamW on the rest at "
            f"{settings.get('adamw_lr_ratio', 1.0):g} x lr")


def _muon_sentence(settings: dict[str, Any]) -> str:
    """Under Muon, what the lr means: Muon's, with AdamW's group at a fixed ratio to it."""
    if settings.get("optimizer", "adamw") != "muon":
        return ""
    return (f" Optimizer: Muon on the hidden matrices and AdamW on the rest; every lr here is Muon's, AdamW's is "
            f"{settings.get('adamw_lr_ratio', 1.0):g} x it (docs/training.md, 'Optimizers').")


def terminal_report(summary: dict[str, Any]) -> str:
    """What ``ddl compare`` prints at the end, live or ``--report-only`` alike: where the lr and the numbers come
    from, the grid (with its gap warning), the table, the verdicts and the break-even ratios, and last the one
    sentence of what it found."""
    from deep_delta.experiments.break_even import break_even_table

    grid = summary.get("lr_selection")
    parts = [lr_sentence(summary), ""]
    if grid is not None:
        seeds = (summary.get("held_out") or {}).get("selection_seeds") or summary.get("seeds")
        parts += [f"final validation loss at every lr, seeds {', '.join(map(str, seeds))} (bold: each variant's "
                  "chosen lr)", grid_table(grid["chosen"], grid["lrs"], lambda x: format(x, ".4f")), ""]
    parts += [comparison_table(summary), *verdicts(summary)]
    table = break_even_table(summary)
    if table:
        parts += ["", "break-even step-cost ratio r* (log-log interpolation of the validation curve; see compare.md)",
                  *table]
    return "\n".join([*parts, "", conclusion(summary)])


def comparison_report(summary: dict[str, Any], curves: str = "curves.png") -> str:
    """``compare.md``: the table, a plain verdict per variant, the break-even ratios, the settings and the
    machine."""
    from deep_delta.experiments.break_even import METHOD, NOTE, break_even_table

    s = summary.get("settings") or {}
    m = summary["machine"]
    rows = summary["rows"]
    seeds = summary.get("seeds") or [s.get("seed")]
    split = summary.get("reported_split", "val")
    tokens = rows[0]["tokens"] if rows else 0
    notes = [f"- {r['variant']} diverged: {r['diverged']}" for r in rows if r.get("diverged")]
    notes += [f"- {note}" for note in summary.get("notes", [])]
    timing = summary.get("timing")
    grid = summary.get("lr_selection")
    lr_text = (f"lr {s.get('lr')}" if grid is None else
               "lr per variant (" + ", ".join(f"{r['variant']} {fmt(r['lr'], 'g')}" for r in rows) + ")")
    lines = [
        "# Variant comparison",
        "",
        lr_sentence(summary),
        "",
        comparison_table(summary),
        "",
        *verdicts(summary),
        *notes,
        "",
        f"{split} loss: mean over {len(seeds)} seed(s) ({', '.join(map(str, seeds))}), +- the sample sd. d loss / d "
        f"ppl: difference to `{summary['reference']}` (negative is better), paired by seed; 95% CI: t-interval of the "
        "mean paired difference; lower in: seeds in which the variant's loss was lower. "
        + ("The run-average throughput (each run's median tokens/s while it trained, sequential runs under whatever "
           "load the machine had then) is in compare.json (`tokens_per_s`), not in the table: the interleaved step "
           "time is the one measure of cost here." if timing else
           "run-avg train tok/s: each run's median over its optimizer steps after the first, while it trained "
           "(sequential runs: a busy machine distorts it; `--time-repeats` measures the steps interleaved instead); "
           "run-avg speed: its ratio to the reference's."),
    ]
    lines += source_section(summary)
    table = break_even_table(summary)
    if table:
        lines += ["", "## Break-even step-cost ratio", "", *table, "", NOTE.format(method=METHOD)]
    lines += _settings_lines(summary, s, m, tokens, lr_text, timing, curves)
    if grid is not None:
        held = summary.get("held_out")
        where = (f" (selection seeds {', '.join(map(str, held['selection_seeds']))}, the `val` split)" if held else "")
        lines += [
            f"## Final validation loss at every lr{where}",
            "",
            grid_table(grid["chosen"], grid["lrs"], lambda x: format(x, ".4f")),
            "",
            f"Mean +- sd over the seeds; bold: the chosen lr. A run counts as diverged when its loss was "
            f"non-finite or its final validation loss was above {grid['divergence_limit']:.4f} = "
            f"{DIVERGENCE_FACTOR:g} x ln(vocabulary size), a uniform guess's loss; an lr at which any seed diverged "
            "is not chosen. Each lr's own comparison is in `lr_<lr>/compare.md`"
            + ("; the evaluation runs are in `evaluation/`." if held else "."),
            "",
            "![final validation loss against lr](lr_sensitivity.png)",
            "",
        ]
    return "\n".join([*lines, conclusion(summary), ""])


def _settings_lines(summary: dict[str, Any], s: dict, m: dict, tokens: int, lr_text: str, timing,
                    curves: str = "curves.png") -> list[str]:
    """compare.md's paragraphs on the step timing, the settings, the data and the machine."""
    lines = []
    if timing:
        lines += [
            "",
            f"step ms: median of {timing['repeats']} interleaved rounds of the same optimizer step per variant "
            f"({timing['device']}, {timing['dtype']}), measured after training. val loss at ref. time: the "
            "validation loss each variant had reached when the reference finished its steps, at this step time "
            "(interpolated on its validation curve; '-' where that falls before its first validation)."
            + _retimed_sentence(summary),
        ]
    steps_text, tokens_said = f"{s.get('steps')} steps", f"{tokens:,} tokens"
    if unequal_lengths(summary):  # runs brought together: each variant's own length, none of them "the" steps
        steps_text = "steps per variant (" + ", ".join(f"{v} {n}" for v, n in run_lengths(summary).items()) + ")"
        tokens_said = tokens_text(summary)
    lines += [
        "",
        f"Seed s means the same initialisation seed and the same data order for every variant. Data "
        f"{s.get('data') or 'the embedded default text'}; preset {s.get('preset')}, {steps_text} x "
        f"{s.get('batch_size')} x {s.get('seq_len')} tokens ({tokens_said}), {optimizer_text(s)}, {lr_text} "
        f"(warm-up {s.get('warmup_steps')}, cosine to {s.get('min_lr_ratio')} x lr), validation on "
        f"{s.get('eval_batches')} batches ({windows_text(recorded(s).get('eval_windows'))}) every "
        f"{s.get('eval_every')} steps.{cost_sentence(summary)}",
        "",
        f"{machine_sentence(m)} {_wall_sentence(summary)}{_devices_sentence(summary)}",
        "",
        f"![training and validation loss]({curves})",
        "",
    ]
    return lines


def _retimed_sentence(summary: dict[str, Any]) -> str:
    """' ...': where these step times replace those an earlier report in the same directory had measured
    (``timing.earlier``), each variant's ratio to the reference then and now; else ''."""
    earlier = (summary.get("timing") or {}).get("earlier")
    rows = [r for r in summary["rows"] if r.get("earlier_time_ratio") is not None and r.get("time_ratio")
            and r["variant"] != summary["reference"]]
    if not earlier or not rows:
        return ""
    return (f" These step times were measured again; the earlier report's ({earlier.get('file', 'its summary')}, "
            f"{earlier.get('repeats', '?')} rounds) had the step ratio " + ", ".join(
                f"{r['variant']} {r['earlier_time_ratio']:.2f}x (now {r['time_ratio']:.2f}x)" for r in rows) + ".")


def machine_sentence(m: dict[str, Any]) -> str:
    """The machine record of a report in words: the process that trained and wrote it, or, for runs brought together
    (``--report-only``: a record with ``report_written_on``), what the runs' own run.json records (where the runs
    differ, each run's), then the machine that wrote the report."""
    if "report_written_on" not in m:
        return (f"Machine: {_device_text(m['device'])}, {m['cpu_count']} CPU cores ({m['processor']}), torch "
                f"{m['torch']} with {m['torch_threads']} thread(s).")
    w = m["report_written_on"]
    switches = m.get("kernel_switches")
    on = [k for k, v in (switches or {}).items() if v]
    switch_text = ("not recorded" if switches is None else f"on: {', '.join(on)}" if on else "all off")
    code = m.get("code")
    code_text = "" if code is None else f"; code {_recorded_text(code)}"
    threads = m.get("torch_threads")
    threads_text = ("CPU threads not recorded" if threads is None else f"CPU threads {_recorded_text(threads)}"
                    if isinstance(threads, dict) else f"{threads} CPU thread(s)")
    return (f"Machine: the runs' own, as their run.json records it: {_recorded_text(m.get('device'), _device_text)}, "
            f"torch {_recorded_text(m.get('torch'))}, {threads_text}, kernel switches {switch_text}{code_text}. This "
            f"report was written on {w['cpu_count']} CPU cores ({w['processor']}), torch {w['torch']}.")


def _device_text(name: Any) -> str:
    return "CPU only (no GPU)" if name == "cpu" else str(name)


def _recorded_text(value: Any, show=None) -> str:
    """A value the runs record: itself where they agree, each run's where they differ ({run: value})."""
    def one(v: Any) -> str:
        if v is None:
            return "not recorded"
        if isinstance(v, dict) and "commit" in v:
            return f"{str(v['commit'])[:12]}{'' if v.get('clean', True) else ' (uncommitted changes)'}"
        return show(v) if show is not None else str(v)
    if isinstance(value, dict) and not (value and "commit" in value):
        return "per run (" + "; ".join(f"{run}: {one(v)}" for run, v in value.items()) + ")"
    return one(value)


def _wall_sentence(summary: dict[str, Any]) -> str:
    """How long it took: the runs' training, every session of an interrupted and resumed run counted (each run's
    run.json), and the call that wrote the report, which may have trained only a part of it (or nothing)."""
    runs = runs_training_s(summary)
    trained = (f"Training time of the runs: {runs:.0f} s in all (every session of a resumed run counted). "
               if runs is not None else "")
    return f"{trained}Wall time of the call that wrote this report: {summary.get('wall_s', 0):.0f} s."


def runs_training_s(summary: dict[str, Any]) -> float | None:
    """The training time of the reported runs, every session of a resumed run counted (each run's run.json); None
    where a run does not record it."""
    runs = [x.get("train_wall_s") for r in summary["rows"] for x in r["per_seed"]]
    return sum(runs) if runs and all(isinstance(x, (int, float)) for x in runs) else None


def _devices_sentence(summary: dict[str, Any]) -> str:
    """For a report brought together from finished runs (``--report-only``): which device made which runs."""
    devices = summary.get("devices")
    if not devices:
        return ""
    by_device: dict[str, list[str]] = {}
    for run, name in devices.items():
        by_device.setdefault(name, []).append(run)
    return " The runs were brought together from finished run directories (`--report-only`): " + "; ".join(
        f"{name}: {', '.join(runs)}" for name, runs in by_device.items()) + "."


def _band(curves: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Mean, min and max over the curves at the steps they all have."""
    common = sorted(set.intersection(*(set(dict(c)) for c in curves))) if curves else []
    cols = [[dict(c)[x] for c in curves] for x in common]
    return common, [statistics.fmean(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def plot_curves(out: str | os.PathLike, variants: list[str], path: str | os.PathLike,
                seeds: list[int] | None = None, roots: dict[str, Path | None] | None = None,
                costs: dict[str, float] | None = None) -> Path:
    """Training loss (moving average) and validation loss against the step: the mean over seeds, with the
    band between the lowest and highest seed. ``roots``: where each variant's runs are, when not in ``out``
    (an lr grid: its chosen lr's directory; None leaves the variant out). ``costs`` (each variant's measured step
    time over the reference's): a third panel, the validation loss against the cost spent, optimizer steps x that
    ratio (in the reference's steps): a run read where its cost equals another's, mid-schedule (the
    truncated-curve view; the break-even table says how far it is from a run of that length)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = seeds or [0]
    fig, axes = plt.subplots(1, 3 if costs else 2, figsize=(16.5 if costs else 11, 4.2))
    ax_t, ax_v = axes[0], axes[1]
    for i, v in enumerate(variants):
        color, label = f"C{i}", paper_name(v)
        root = roots.get(v) if roots is not None else Path(out)
        if root is None:
            continue
        records = [read_metrics(run_dir(root, v, s, len(seeds) > 1)) for s in seeds]
        train = []
        for recs in records:
            pts = [(r["step"], r["loss"]) for r in recs if "loss" in r]
            smooth = _moving_average([y for _, y in pts], max(1, len(pts) // 20))
            train.append(list(zip([x for x, _ in pts], smooth)))
        val = [[(r["step"], r["val_loss"]) for r in recs if "val_loss" in r] for recs in records]
        panels = [(ax_t, train, "-", 1.0), (ax_v, val, "o-", 1.0)]
        if costs and v in costs:
            panels.append((axes[2], val, "o-", costs[v]))
        for ax, curves, style, scale in panels:
            steps, mean, lo, hi = _band([c for c in curves if c])
            if steps:
                steps = [x * scale for x in steps]
                ax.plot(steps, mean, style, color=color, markersize=3, label=label)
                if len(seeds) > 1:
                    ax.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
    titled = [(ax_t, "training loss (moving average)", "optimizer step"), (ax_v, "validation loss", "optimizer step")]
    if costs:
        titled.append((axes[2], "validation loss against cost", "cost: steps x the step time's ratio to the reference's"))
    for ax, title, xlabel in titled:
        ax.set_xlabel(xlabel)
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
    parts = [f"{v} {cost_steps(steps, c)} steps (its step {c:g}x the reference's; together "
             f"{cost_steps(steps, c) * c:g} reference steps)" for v, c in costs.items()]
    return (f" Equal cost: the budget is {steps} steps of `{summary['reference']}`; {', '.join(parts)}, each with "
            "its own warm-up and cosine schedule over its steps (the costs are given, not measured here).")


def write_comparison(out: str | os.PathLike, summary: dict[str, Any], stem: str = "compare") -> list[Path]:
    """compare.md, compare.json (every per-seed number) and curves.png, each replaced atomically; for an lr grid
    also lr_sensitivity.png (the figures only with matplotlib: :func:`~deep_delta.experiments.report.
    write_outputs`). ``stem`` "selection": the same as selection.md, selection.json and selection_curves.png (an
    lr grid whose report is on evaluation seeds: the grid's own best-lr comparison). Returns the paths written."""
    from deep_delta.experiments.lr_grid import lr_dir, plot_sensitivity

    out = Path(out)
    variants = [r["variant"] for r in summary["rows"]]
    roots = None
    figures = {}
    if summary.get("lr_selection"):
        held = summary.get("held_out")
        roots = {r["variant"]: None if r["lr"] is None else out / held["runs"] if held else lr_dir(out, r["lr"])
                 for r in summary["rows"]}
        grid_seeds = held["selection_seeds"] if held else summary["seeds"]
        figures["lr_sensitivity.png"] = lambda path: plot_sensitivity(
            summary["lr_grid"], variants, path, "final validation loss (nats / token)",
            f"validation loss against lr, {len(grid_seeds)} seed(s) per point")
    curves = "curves.png" if stem == "compare" else f"{stem}_curves.png"
    costs = {r["variant"]: r["time_ratio"] for r in summary["rows"] if r.get("time_ratio")}
    figures[curves] = lambda path: plot_curves(out, variants, path, summary.get("seeds"), roots, costs or None)
    return write_outputs(out, stem, summary, comparison_report(summary, curves), figures)


def log_comparison(out: Path, summary: dict[str, Any], base: TrainConfig, say=print) -> None:
    """The comparison as one more W&B run, ``comparison``, in the group of its training runs: the table (one
    row per variant), every seed's numbers, the validation curves (variant, seed, step, loss) and curves.png.
    A later start of the same comparison logs into the same run (its id is kept in ``out/wandb.json``)."""
    rows = summary["rows"]
    config = {"settings": summary["settings"], "variants": [r["variant"] for r in rows], "seeds": summary["seeds"],
              "reference": summary["reference"], "machine": summary["machine"]}
    columns = ["variant", "name", "parameters", "val_loss", "val_loss_sd", "val_ppl", "d_val_loss", "d_val_loss_ci95",
               "wins", "n_paired", "d_val_ppl", "tokens_per_s", "speed_ratio", "step_time_s", "equal_time_val_loss",
               "equal_time_d_val_loss", "diverged"]
    seed_columns = ["seed", "steps", "tokens", "final_train_loss", "val_loss", "val_ppl", "tokens_per_s", "diverged"]
    tables = {
        "comparison": (columns, [[r.get(c) for c in columns] for r in rows]),
        "per_seed": (["variant", *seed_columns], [[r["variant"], *(x.get(c) for c in seed_columns)] for r in rows
                                                  for x in r["per_seed"]]),
        "val_curves": (["variant", "seed", "step", "val_loss"], [[r["variant"], x["seed"], step, loss] for r in rows
                                                                for x in r["per_seed"] for step, loss in x["val_curve"]]),
    }
    log_study(out, project=base.wandb_project, name="comparison", job_type="compare", config=config, tables=tables,
              images={"curves": out / "curves.png"}, summary={f"{r['variant']}/val_loss": r["val_loss"] for r in rows},
              group=base.wandb_group, keep_id=True, say=say)


def lm_grid_points(lr: float, at_lr: dict[str, Any], limit: float) -> list[dict]:
    """The grid points of one lr's comparison: each (variant, seed)'s final validation loss, or why it counts as
    diverged (a non-finite loss, or a validation loss above ``limit``)."""
    from deep_delta.experiments.lr_grid import divergence

    points = []
    for row in at_lr["rows"]:
        for x in row["per_seed"]:
            why = x["diverged"] or divergence(x["val_loss"], limit, "validation loss")
            points.append({"variant": row["variant"], "lr": lr, "seed": x["seed"],
                           "value": None if why else x["val_loss"], "diverged": why})
    return points


def grid_summary(base: TrainConfig, variants: list[str], seeds: list[int], lrs: list[float],
                 per_lr: dict[float, dict], points: list[dict], chosen: dict, timing: dict | None,
                 limit: float, grids: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """The comparison of each variant at its own best lr (its row from that lr's comparison; a variant with no lr
    free of divergence has a row saying why), paired by seed against the reference at its own best lr, with the
    grid (``lr_selection``, ``lr_grid``; ``grids``: each variant's own, None: ``lrs`` for every variant)."""
    from deep_delta.experiments.lr_grid import shared_grid

    grids = grids or {v: list(lrs) for v in variants}
    rows = []
    for v in variants:
        lr = chosen[v]["lr"]
        at = next(r for r in per_lr[min(grids[v]) if lr is None else lr]["rows"] if r["variant"] == v)
        results = at["per_seed"] if lr is not None else [
            {**x, "val_loss": None, "val_ppl": None, "val_curve": [], "diverged": chosen[v]["why"]}
            for x in at["per_seed"]]
        rows.append({**variant_row(v, results), "lr": lr})
        if lr is None:
            rows[-1]["diverged"] = chosen[v]["why"]
    ref = next(r for r in rows if r["variant"] == reference_variant([x["variant"] for x in rows]))
    for r in rows:
        compare_rows(r, ref, timing)
    notes = design_notes(base, variants)
    return {"rows": rows, "reference": ref["variant"], "seeds": seeds,
            "settings": {**base.to_dict(), "lr": None},  # no one lr: each row has its own
            "timing": timing, "machine": machine(), **({"notes": notes} if notes else {}),
            "lr_selection": {"method": "per-variant best on the final validation loss", "lrs": lrs,
                             **({} if shared_grid(grids) is not None else {"grids": grids}),
                             "divergence_limit": limit, "chosen": chosen},
            "lr_grid": points}
