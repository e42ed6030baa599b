"""Selection apart from the result: each variant's lr chosen on the selection split at the selection seeds, then
fresh runs at the chosen lr with evaluation seeds, reported on the test split.

``ddl compare --lrs A B C --seeds 2 --eval-seeds 4 --eval-seed-start 100``:

1. the lr grid at the selection seeds (0, 1), each variant's lr chosen on its final validation loss on ``val``
   (:func:`~deep_delta.experiments.compare.run_lr_grid`; its report ``OUT/selection.md`` / ``selection.json``);
2. every variant at its chosen lr with the evaluation seeds (100..103) in ``OUT/evaluation/``, each run's final
   model measured on the first ``test_tokens`` of the ``test`` split (:mod:`deep_delta.experiments.held_out_split`);
3. ``OUT/compare.md`` / ``compare.json`` / ``curves.png``: the equal-steps differences to the reference on test,
   paired over the evaluation seeds, with the break-even step-cost ratio of each variant
   (:mod:`deep_delta.experiments.break_even`) from the evaluation runs' validation curves; with
   ``break_even_checks`` ({variant: r}), the exact run of N / r steps at the first evaluation seed
   (``OUT/break_even/r_<r>/VARIANT``) and the approximation's measured error.

Everything resumes as a comparison does (finished runs reused, interrupted ones continued, test losses kept in
``RUN/test.json``); while the evaluation runs train, ``compare.md`` is rewritten after each evaluation seed that
every variant has finished, labelled partial. ``ddl compare --report-only`` reads the same layout.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from deep_delta.experiments.compare import train_runs
from deep_delta.experiments.compare_report import seed_result, summarize_runs, write_comparison
from deep_delta.experiments.plan import CHECK_DIR, EVAL_DIR, ComparePlan, check_dir, cost_steps, run_dir
from deep_delta.train.config import TrainConfig
from deep_delta.train.data import TrainData

SELECTION_OUTPUTS = ("selection.md", "selection.json", "selection_curves.png")


def evaluation(plan: ComparePlan, base: TrainConfig, out: Path, data: TrainData, *, overwrite: bool, progress: bool,
               quiet: bool, t0: float):
    """What runs once the plan's grid has chosen, ``OUT`` still locked (:func:`~deep_delta.experiments.runner.
    run_plan`): ``evaluate(selection)``, the plan's evaluation runs at the lrs ``selection`` (the grid's summary)
    chose, each measured on the test split, then its break-even checks, and the evaluation's summary (also
    ``OUT/compare.json``), which it returns. What can be refused (the test split and its size) is refused here,
    before anything trains."""
    from deep_delta.experiments.held_out_split import (
        measure_test,
        measured_tokens,
        resolve_test_tokens,
        rounding_said,
        sources_note,
    )
    from deep_delta.fsutil import refuse_unwritable_results

    tokens = resolve_test_tokens(data, plan.test_tokens, base.seq_len)
    refuse_unwritable_results(out / name for name in SELECTION_OUTPUTS)
    say = (lambda msg: None) if quiet else (lambda msg: print(msg, flush=True))
    measured = measured_tokens(data, tokens, base.seq_len, base.batch_size)
    rounded = rounding_said(measured, tokens, base.seq_len, base.batch_size)
    if rounded:  # said before anything trains
        say(f"test tokens: each evaluation run will be measured on {measured:,} ({rounded})")
    note = sources_note(data)

    def evaluate(selection: dict) -> dict:
        chosen = {v: selection["lr_selection"]["chosen"][v]["lr"] for v in plan.variants}
        if chosen[plan.reference] is None:
            raise ValueError(f"the reference {plan.reference} diverged at every lr of the grid ({out / 'selection.md'}): "
                             "the evaluation seeds would have nothing to be paired with; allowed: a grid with an lr "
                             "at which the reference trains")
        live = {v: lr for v, lr in chosen.items() if lr is not None}
        cfgs = plan.report_runs(base, out, live)
        partial = _partial_report(out, base, selection, list(live), list(plan.eval_seeds), cfgs, t0)
        say(f"evaluation seeds {', '.join(map(str, plan.eval_seeds))} at the chosen lrs "
            f"({', '.join(f'{v} {lr:g}' for v, lr in live.items())}), reported on {measured:,} test tokens"
            f"{f' ({rounded})' if rounded else ''}: {out / EVAL_DIR}")
        if note:
            say(note)
        diverged = train_runs(cfgs, out / EVAL_DIR, data, overwrite=overwrite, progress=progress, quiet=quiet,
                              lock="ddl compare --eval-seeds", after_each=partial,
                              after_run=lambda key, cfg: measure_test(cfg, data, tokens, step=cfg.steps, say=say))
        check_cfgs = plan.check_runs(base, out, chosen)
        if check_cfgs:
            say(f"break-even checks: {', '.join(f'{v} at r = {plan.checks[v]:g}' for v, _ in check_cfgs)}")
            train_runs(check_cfgs, out / CHECK_DIR, data, overwrite=overwrite, progress=progress, quiet=quiet,
                       lock="ddl compare --break-even-check")
        summary = held_out_summary(out, base, selection, list(live), list(plan.eval_seeds), diverged,
                                   {v: plan.checks[v] for v, _ in check_cfgs})
        summary["wall_s"] = time.perf_counter() - t0
        write_comparison(out, summary)
        return summary

    return evaluate


def _partial_report(out: Path, base: TrainConfig, selection: dict, live: list[str], eval_seeds: list[int],
                    cfgs: dict, t0: float):
    """What runs after each evaluation run: ``compare.md`` rewritten over the evaluation seeds every variant has
    finished so far (with their test losses), labelled partial; nothing before the first such seed."""
    from deep_delta.experiments.compare import run_divergence, stored_end
    from deep_delta.experiments.held_out_split import read_test

    def done(key) -> bool:
        path = cfgs[key].out
        return stored_end(path) is not None and (run_divergence(path) is not None or read_test(path) is not None)

    def after_each(results: dict) -> None:
        complete = [s for s in eval_seeds if all(done((v, s)) for v in live)]
        if not complete or len(complete) == len(eval_seeds):
            return
        diverged = {k: run_divergence(cfgs[k].out) for k in cfgs if k[1] in complete and stored_end(cfgs[k].out)}
        summary = held_out_summary(out, base, selection, live, eval_seeds, {k: v for k, v in diverged.items() if v},
                                   {}, complete=complete)
        summary["wall_s"] = time.perf_counter() - t0
        write_comparison(out, summary)

    return after_each


def held_out_summary(out: Path, base: TrainConfig, selection: dict, live: list[str], eval_seeds: list[int],
                     diverged: dict, checks: dict[str, float], complete: list[int] | None = None,
                     training: bool = True) -> dict[str, Any]:
    """The evaluation's summary (``base``: the study's settings but lr): the runs of ``OUT/evaluation`` (each
    variant of ``live`` at its chosen lr, the
    evaluation seeds, or those of them ``complete``) on test, paired by seed, a variant without an lr (diverged at
    every lr) as its selection row says, the selection it comes from and the break-even checks (``checks``:
    {variant: r}). ``training``: whether the study is training the seeds not ``complete`` yet (False for
    ``--report-only``, which trains nothing), as the partial report's note says."""
    from deep_delta.experiments.held_out_split import measured_windows, read_test

    seeds = complete or eval_seeds
    several = (out / EVAL_DIR / f"seed_{seeds[0]}").is_dir()  # seed folders: a study of several evaluation seeds
    summary = summarize_runs(out / EVAL_DIR, live, base, seeds=seeds, diverged=diverged,
                             step_times=selection.get("timing"), split="test", per_seed_dirs=several)
    chosen = selection["lr_selection"]["chosen"]
    rows = {r["variant"]: {**r, "lr": chosen[r["variant"]]["lr"]} for r in summary["rows"]}
    for r in selection["rows"]:  # a variant with no lr free of divergence: its selection row says why
        rows.setdefault(r["variant"], r)
    tests = {(v, s): read_test(run_dir(out / EVAL_DIR, v, s, several)) for v in live for s in seeds if not diverged.get((v, s))}
    per_run = list(tests.values())
    test_tokens = sorted({t["tokens"] for t in per_run if t})
    if len(test_tokens) > 1:
        raise ValueError(f"the evaluation runs in {out / EVAL_DIR} were measured on different test tokens "
                         f"({', '.join(map(str, test_tokens))}); allowed: every run on the same test windows (run the "
                         "study again: it measures each run with the study's `test_tokens`)")
    asked = sorted({t.get("tokens_asked") for t in per_run if t and isinstance(t.get("tokens_asked"), int)})
    plans = sorted({measured_windows(t) for t in per_run if t})
    if len(plans) > 1:
        raise ValueError(f"the evaluation runs in {out / EVAL_DIR} were measured on test windows of different plans "
                         f"({', '.join(plans)}); allowed: every run on the same test windows (run the study again: it "
                         "measures each run with the study's `eval_windows`)")
    s = selection["settings"]
    held = {"selection_seeds": selection["seeds"], "eval_seeds": eval_seeds, "selection_split": "val",
            "report_split": "test", "selection_tokens": s["eval_batches"] * s["batch_size"] * s["seq_len"],
            "test_tokens": test_tokens[0] if test_tokens else None, "test_windows": plans[0] if plans else None,
            "test_tokens_asked": asked[0] if len(asked) == 1 else None,
            "runs": EVAL_DIR, **source_rows(tests, [r["variant"] for r in summary["rows"]], seeds,
                                            summary["reference"], s)}
    summary.update(rows=[rows[r["variant"]] for r in selection["rows"]], seeds=seeds, held_out=held,
                   settings=s, lr_selection=selection["lr_selection"], lr_grid=selection["lr_grid"],
                   data_fingerprint=selection.get("data_fingerprint"),
                   **({"step_costs": selection["step_costs"]} if selection.get("step_costs") else {}))
    if complete and len(complete) < len(eval_seeds):
        rest = ("the study goes on and rewrites this report" if training else
                "the other seeds' runs are not finished (this report trained nothing); the `ddl compare` that started "
                "the study finishes them and rewrites this report")
        summary.setdefault("notes", []).append(
            f"PARTIAL: {len(complete)} of {len(eval_seeds)} evaluation seeds finished "
            f"({', '.join(map(str, complete))}); {rest}")
    summary["break_even_checks"] = [_check(out, v, r, eval_seeds[0], rows, summary["reference"])
                                    for v, r in checks.items()]
    if selection.get("plan"):  # the selection's plan, with the seeds, test tokens (as resolved) and checks that report
        summary["plan"] = replace(ComparePlan.from_dict(selection["plan"]), eval_seeds=tuple(eval_seeds),
                                  test_tokens=held["test_tokens_asked"], checks=dict(checks)).to_dict()
    return summary


def source_rows(tests: dict[tuple[str, int], dict | None], variants: list[str], seeds: list[int], reference: str,
                settings: dict) -> dict[str, Any]:
    """The test loss per source (``test.json``'s ``sources``) of the evaluation runs ``tests`` ({(variant, seed):
    record}): ``{"sources": [{"source", "tokens", "variants": {variant: {"loss": mean over seeds, "d": mean paired
    difference to the reference, "ci95", "n"}}}]}`` in the order the records list them; when some runs' records hold
    none (measured before they were recorded, or data without source runs), ``{"sources_note": why there is no
    table}`` instead; ``{}`` when none does and the data (``settings["data"]``) names no sources."""
    from deep_delta.experiments.stats import mean_sd, paired_difference

    have = [t for t in tests.values() if t and isinstance(t.get("sources"), dict)]
    if not have or len(have) < len(tests):
        why = _no_sources(settings, len(tests) - len(have), len(tests))
        return {"sources_note": why} if why else {}
    names = list(dict.fromkeys(name for t in have for name in t["sources"]))

    def losses(v: str, name: str) -> list[float | None]:
        return [((tests.get((v, s)) or {}).get("sources") or {}).get(name, {}).get("loss") for s in seeds]

    rows = []
    for name in names:
        tokens = sorted({t["sources"][name]["tokens"] for t in have if name in t["sources"]})
        per_variant = {}
        for v in variants:
            mean = mean_sd(losses(v, name))[0]
            d = paired_difference(losses(v, name), losses(reference, name)) if v != reference else None
            per_variant[v] = {"loss": mean, **({"d": d["mean"], "ci95": d["ci95"], "n": d["n"]} if d else {})}
        rows.append({"source": name, "tokens": tokens[0] if len(tokens) == 1 else None, "variants": per_variant})
    return {"sources": rows}


def _no_sources(settings: dict, missing: int, runs: int) -> str | None:
    """Why the report has no test loss per source: ``missing`` of the ``runs`` evaluation runs' test.json hold none
    (measured before it was recorded), or the data, a named corpus, records no sources; None when none holds one and
    the data (``settings["data"]``) names no sources, or is not here to look at."""
    from deep_delta.data.corpora import named_corpus
    from deep_delta.data.loader import no_sources_reason, split_sources
    from deep_delta.data.meta import read_meta

    measured_before = (f"no test loss per source: {missing} of the {runs} evaluation runs' test.json record none "
                       "(measured before it was recorded; remove them and run the study's `ddl compare` again to "
                       "measure them from each run's final checkpoint)")
    if missing < runs:
        return measured_before
    data = settings.get("data")
    try:
        meta = read_meta(data) if data else None
    except (OSError, ValueError):
        return None
    if meta is None or named_corpus(meta.get("source")) is None:
        return None
    if split_sources(meta, "test") is not None:
        return measured_before
    return f"no test loss per source: the test split records no sources ({no_sources_reason(meta)})"


def collect_held_out(out: Path, base: TrainConfig, selection: dict, grid_runs=(),
                     started: float | None = None) -> dict[str, Any]:
    """``--report-only`` of a study with evaluation seeds: its evaluation runs (``OUT/evaluation``) and break-even
    checks read from their records, checked against the selection (each variant at its chosen lr, the selection's
    settings and data, evaluation seeds apart from the selection seeds) and their test records (the run's final
    step, its data, the same test windows for every run), then reported as the live study reports them. An
    evaluation seed that some variant has not finished is left out, and the report says it is partial. The kernel
    switches of every run (``grid_runs``, the selection's, among them) agree, and the report's machine record is the
    runs' own (:func:`~deep_delta.experiments.finished_runs.runs_machine`); its ``wall_s``, this call's (since
    ``started``, a ``time.perf_counter()``), which trained nothing."""
    from deep_delta.experiments.finished_runs import check_switches, read_run, runs_machine
    from deep_delta.experiments.held_out_split import measured_windows, read_test
    from deep_delta.train.provenance import differences
    from deep_delta.train.run_dir import RESULT_NEUTRAL, RunNotFinished, read_run_file, run_end

    chosen = {v: c["lr"] for v, c in selection["lr_selection"]["chosen"].items()}
    live = [v for v in chosen if chosen[v] is not None]
    where = out / EVAL_DIR
    seed_dirs = sorted(d for d in where.iterdir() if d.name.startswith("seed_"))
    several = bool(seed_dirs)
    found = [(d / v, int(d.name[5:]) if d.name[5:].isdigit() else None) for d in seed_dirs for v in live] \
        if several else [(where / v, None) for v in live]
    runs = {}
    for path, seed in found:
        if not (path / "run.json").is_file():
            continue
        try:
            run_end(path, read_run_file(path))
        except RunNotFinished:
            continue  # still training: its seed is left out (partial)
        run = read_run(path, seed)
        runs[run.cfg.variant, run.cfg.seed] = run
    free = RESULT_NEUTRAL | {"variant", "seed", "out", "lr", "wandb_run_name", "data", "steps"}
    for (v, s), run in runs.items():
        if run.cfg.lr != chosen[v]:
            raise ValueError(f"{run.dir / 'run.json'} records lr {run.cfg.lr:g}, but the grid chooses {chosen[v]:g} "
                             f"for {v} ({out / 'selection.md'}); allowed: evaluation runs at the chosen lr (remove "
                             f"{where} and run the study's `ddl compare` again: it trains the evaluation runs at the "
                             "chosen lrs and keeps the grid's; `overwrite` would retrain the grid too)")
        if s in selection["seeds"]:
            raise ValueError(f"{run.dir} is an evaluation run of seed {s}, a selection seed; allowed: evaluation "
                             "seeds apart from the selection seeds")
        diff = differences(base.to_dict(), run.cfg.to_dict(), skip=free, has="the selection has")
        if run.fingerprint != selection.get("data_fingerprint"):
            diff.append("the data (its fingerprint)")
        if diff:
            raise ValueError(f"{run.dir / 'run.json'} was not made with the selection's settings ({'; '.join(diff)}); "
                             "allowed: evaluation runs of this study")
        test = read_test(run.dir) if not run.diverged else None
        if not run.diverged and (test is None or test.get("step") != run.end["step"]
                                 or test.get("data_fingerprint") != run.fingerprint
                                 or measured_windows(test) != run.cfg.eval_windows):
            raise ValueError(f"{run.dir / 'test.json'} is missing or not of this run's final step, data and windows "
                             f"(`eval_windows` {run.cfg.eval_windows}); run the study's `ddl compare` again (it "
                             "measures what is missing)")
    eval_seeds = sorted({s for _, s in runs})
    complete = [s for s in eval_seeds if all((v, s) in runs for v in live)]
    if not complete:
        raise FileNotFoundError(f"{where} holds no evaluation seed that every variant ({', '.join(live)}) has "
                                "finished; finish the study with the `ddl compare` that started it")
    diverged = {k: r.diverged for k, r in runs.items() if r.diverged and k[1] in complete}
    checks, check_runs = {}, []
    for folder in sorted((out / CHECK_DIR).glob("r_*")) if (out / CHECK_DIR).is_dir() else []:
        for v in live:
            if (folder / v / "run.json").is_file():
                check_runs.append(read_run(folder / v))
                checks[v] = float(folder.name[2:])
    every = [*grid_runs, *runs.values(), *check_runs]
    check_switches(every)
    summary = held_out_summary(out, base, selection, live, eval_seeds, diverged, checks,
                               complete=complete if len(complete) < len(eval_seeds) else None, training=False)
    summary["machine"], differ = runs_machine(every)
    if differ:
        summary["notes"] = [*summary.get("notes", []), *differ]
    summary["wall_s"] = time.perf_counter() - (started if started is not None else time.perf_counter())
    write_comparison(out, summary)
    return summary


def _check(out: Path, variant: str, ratio: float, seed: int, rows: dict, reference: str) -> dict:
    """One break-even check: the exact run's final validation loss against its curve's estimate."""
    from deep_delta.experiments.break_even import check_row
    from deep_delta.experiments.compare import run_divergence

    mine = next(x for x in rows[variant]["per_seed"] if x["seed"] == seed)
    theirs = next(x for x in rows[reference]["per_seed"] if x["seed"] == seed)
    steps = cost_steps(mine["steps"], ratio)
    run = check_dir(out, ratio) / variant
    exact = seed_result(run, seed, run_divergence(run))
    return check_row(variant, ratio, steps, exact["val_loss"], mine["val_curve"], theirs["val_loss"], seed)


__all__ = ["collect_held_out", "evaluation", "held_out_summary", "source_rows"]
