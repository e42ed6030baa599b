"""What a mechanism-task study reports: mean +- sd of test accuracy by difficulty over seeds per variant, the
paired difference of overall accuracy to the baseline, the shortcuts' scores, as ``tasks.md`` / ``tasks.json``
(every per-seed number) and a figure ``tasks.png``, and the study's W&B run; written through the shared report
stack (:mod:`deep_delta.experiments.report`)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from deep_delta.experiments.lr_grid import (
    DIVERGENCE_FACTOR,
    grid_table,
    plot_sensitivity,
    selection_sentence,
    shared_lr_sentence,
)
from deep_delta.experiments.report import log_study, machine, write_outputs
from deep_delta.experiments.stats import mean_sd, paired_difference
from deep_delta.fsutil import save_figure
from deep_delta.tasks.base import Task
from deep_delta.tasks.metrics import accuracy_by_difficulty
from deep_delta.variants import paper_name

REFERENCE = "baseline"


def score_shortcuts(task: Task, test) -> dict[str, dict]:
    """Accuracy of each of ``task.shortcuts()`` on the test set ``test``: overall and by level."""
    scores = {}
    for name, predict in task.shortcuts().items():
        acc = accuracy_by_difficulty(predict(test.inputs), test.labels, test.difficulty, task.levels)
        scores[name] = {"overall": acc["overall"],
                        "by_difficulty": {str(k): v["accuracy"] for k, v in acc["by_difficulty"].items()}}
    return scores


def summarize_tasks(task: Task, variants: list[str], seeds: list[int], results: dict[tuple[str, int], dict],
              settings, shortcuts: dict[str, dict] | None = None) -> dict[str, Any]:
    """One row per variant over the seeds it has results for: accuracy by level and overall (mean, sd, per
    seed), test loss, parameters, training time; with the baseline among the variants, the paired difference
    of each variant's overall accuracy to it (percentage points, over the seeds both have)."""
    rows = []
    for variant in variants:
        recs = {s: results[variant, s] for s in seeds if (variant, s) in results}
        overall = [r["accuracy"]["overall"] for r in recs.values()]
        row: dict[str, Any] = {"variant": variant, "seeds": list(recs), "overall_per_seed": overall}
        row["overall"] = dict(zip(("mean", "sd"), mean_sd(overall)))
        row["by_difficulty"] = {}
        for level in task.levels:
            accs = [r["accuracy"]["by_difficulty"][str(level)]["accuracy"] for r in recs.values()]
            row["by_difficulty"][str(level)] = {**dict(zip(("mean", "sd"), mean_sd(accs))), "per_seed": accs}
        losses = [r["test_loss"] for r in recs.values()]
        row["test_loss"] = {**dict(zip(("mean", "sd"), mean_sd(losses))), "per_seed": losses}
        row["train_s_per_seed"] = [r["train_s"] for r in recs.values()]
        row["parameters"] = next((r["parameters"] for r in recs.values()), None)
        row["train_s"] = statistics.fmean([r["train_s"] for r in recs.values()]) if recs else None
        row["diverged"] = {s: r["diverged"] for s, r in recs.items() if r.get("diverged")}
        rows.append(row)
    ref = next((r for r in rows if r["variant"] == REFERENCE), None)
    for row in rows:
        if ref is not None and row is not ref:
            mine = dict(zip(row["seeds"], row["overall_per_seed"]))
            theirs = dict(zip(ref["seeds"], ref["overall_per_seed"]))
            common = [s for s in seeds if s in mine and s in theirs]
            # "wins" of paired_difference count a < b: ask for baseline - variant, then flip the sign
            d = paired_difference([100 * theirs[s] for s in common], [100 * mine[s] for s in common])
            # 0.0 - x, not -x: an exact tie reads 0.0, not -0.0
            row["vs_baseline_pp"] = {"mean": None if d["mean"] is None else 0.0 - d["mean"],
                                     "ci95": None if d["ci95"] is None else [0.0 - d["ci95"][1], 0.0 - d["ci95"][0]],
                                     "higher": d["wins"], "n": d["n"]}
    if shortcuts is None:  # scored on the study's own test set (a study passes the scores it made once)
        shortcuts = score_shortcuts(task, task.test_set(settings.test_seed, settings.test_size))

    return {"task": task.name, "task_params": task.params(), "machine": machine(), "summary": task.summary, "probes": task.probes,
            "difficulty_name": task.difficulty_name, "levels": list(task.levels),
            "level_names": list(task.level_names), "chance": task.chance, "seq_len": task.seq_len,
            "vocab_size": task.vocab_size, "seeds": seeds, "variants": variants, "settings": settings.to_dict(),
            "rows": rows, "shortcuts": shortcuts, "curves": {f"{v}/{s}": {"loss": r["loss_curve"], "accuracy": r["accuracy_curve"]}
                                     for (v, s), r in sorted(results.items()) if v in variants and s in seeds}}


def _pct(m: dict[str, float | None]) -> str:
    if m["mean"] is None:
        return "–"
    return f"{100 * m['mean']:.1f}" + (f" ± {100 * m['sd']:.1f}" if m["sd"] is not None else "")


def task_table(summary: dict[str, Any]) -> str:
    """The markdown table: a row per variant, a column per difficulty level, then overall and test loss."""
    names = summary["level_names"]
    head = ["variant", *names, "all", "test loss", "params", "train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in summary["rows"]:
        loss = r["test_loss"]
        cells = [paper_name(r["variant"]), *(_pct(r["by_difficulty"][str(lv)]) for lv in summary["levels"]),
                 _pct(r["overall"]),
                 "–" if loss["mean"] is None else f"{loss['mean']:.3f}",
                 "–" if r["parameters"] is None else f"{r['parameters']:,}",
                 "–" if r["train_s"] is None else f"{r['train_s']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    chance = f"{100 * summary['chance']:.1f}"
    lines.append("| chance | " + " | ".join([chance] * (len(names) + 1)) + " | | | |")
    for name, acc in summary.get("shortcuts", {}).items():  # heuristics that solve nothing (Task.shortcuts)
        cells = [acc["by_difficulty"][str(lv)] for lv in summary["levels"]] + [acc["overall"]]
        pcts = [_pct({"mean": a, "sd": None}) for a in cells]
        lines.append(f"| shortcut: {name} | " + " | ".join(pcts) + " | | | |")
    return "\n".join(lines)


def task_report(summary: dict[str, Any]) -> str:
    s, st, m = summary, summary["settings"], summary["machine"]
    model = ", ".join(f"{k} {v}" for k, v in st["model"].items())
    grid = s.get("lr_selection")
    lr_text = (f"lr {st['lr']:g}" if grid is None else "lr per variant (" + ", ".join(
        f"{paper_name(r['variant'])} {'none' if r['lr'] is None else format(r['lr'], 'g')}" for r in s["rows"]) + ")")
    seeds = s["seeds"]
    n_done = max((len(r["seeds"]) for r in s["rows"]), default=0)
    lines = [
        f"# Mechanism task `{s['task']}`", "",
        (shared_lr_sentence(st["lr"]) if grid is None else
         selection_sentence(grid["lrs"], "validation accuracy") + f" The validation set: {st['eval_size']} "
         "held-out sequences of the train split, never the test set."),
        "",
        f"{s['summary']}. Probes: {s['probes']}.", "",
        f"Task parameters: {', '.join(f'{k}={v}' for k, v in s['task_params'].items())}; "
        f"{s['seq_len']} tokens per sequence, vocabulary {s['vocab_size']}.",
        f"Model: preset {st['preset']} with {model}. Training: {st['steps']} steps x {st['batch_size']} fresh "
        f"sequences, AdamW {lr_text} (warm-up {st['warmup_steps']}, cosine to {st['min_lr_ratio']:g}x), "
        f"weight decay {st['weight_decay']:g}, clip {st['grad_clip']:g}. Test: a fixed set of up to "
        f"{st['test_size']} held-out sequences (test seed {st['test_seed']}).",
        f"Machine: {m['processor']}, {m['cpu_count']} CPU(s), {m['torch_threads']} torch thread(s), device "
        f"{m['device']}, torch {m['torch']}.", "",
        f"Test accuracy (%) by {s['difficulty_name']}, mean ± sd over seeds {', '.join(map(str, seeds))}"
        + (f" ({n_done} finished so far)" if any(len(r['seeds']) < len(seeds) for r in s["rows"]) else "")
        + "; greedy over the whole vocabulary; \"train s\": mean seconds of training per run.", "",
        task_table(s), "",
    ]
    if s.get("shortcuts"):
        lines += ["\"shortcut\" rows: a fixed heuristic scored on the same test set, which follows no rule of the "
                  "task; a model at or below a shortcut's accuracy has not shown that it learned the task.", ""]
    diffs = [r for r in s["rows"] if "vs_baseline_pp" in r]
    if diffs:
        lines += ["Overall accuracy minus the baseline's, paired by seed (percentage points, 95% t-interval):", ""]
        for r in diffs:
            d = r["vs_baseline_pp"]
            if d["mean"] is None:
                continue
            ci = f" [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]" if d["ci95"] else ""
            lines.append(f"- {paper_name(r['variant'])}: {d['mean']:+.1f}{ci}, higher in {d['higher']} of {d['n']} "
                         "seeds")
        lines.append("")
    lines += ["Overall test accuracy (%) per seed:", "",
              "| variant | " + " | ".join(f"seed {x}" for x in seeds) + " |", "|" + " --- |" * (len(seeds) + 1)]
    for r in s["rows"]:
        per = dict(zip(r["seeds"], r["overall_per_seed"]))
        lines.append(f"| {paper_name(r['variant'])} | "
                     + " | ".join("–" if x not in per else f"{100 * per[x]:.1f}" for x in seeds) + " |")
    for r in s["rows"]:
        for seed, why in r["diverged"].items():
            lines.append(f"\n{paper_name(r['variant'])} seed {seed}: {why}.")
    if grid is not None:
        lines += _grid_lines(grid)
    return "\n".join(lines) + "\n"


def _grid_lines(grid: dict[str, Any]) -> list[str]:
    """tasks.md's section on the lr grid: the validation accuracy at every lr and how the lr was chosen."""
    return ["", "## Validation accuracy (%) at every lr", "",
            grid_table(grid["chosen"], grid["lrs"], lambda x: f"{100 * x:.1f}"), "",
            "Mean +- sd over the seeds of the accuracy on the validation set; bold: the chosen lr. A run "
            "counts as diverged when its training loss was non-finite or its last logged training loss was "
            f"above {grid['divergence_limit']:.3f} = {DIVERGENCE_FACTOR:g} x ln(vocabulary size), a uniform "
            "guess's loss being ln(vocabulary size), and no lower than its first logged loss; an lr at "
            "which any seed diverged is not chosen. Each lr's own study is in `lr_<lr>/tasks.md`.", "",
            "![validation accuracy against lr](lr_sensitivity.png)"]


def plot_tasks(summary: dict[str, Any], path: str | os.PathLike) -> Path:
    """Left: test accuracy by difficulty (mean over seeds, bars = sd), chance dashed. Right: the training
    loss at the scored positions against the step (mean over seeds), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_a, ax_l) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = list(range(len(summary["levels"])))
    for i, r in enumerate(summary["rows"]):
        if not r["seeds"]:
            continue
        color, label = f"C{i}", paper_name(r["variant"])
        cells = [r["by_difficulty"][str(lv)] for lv in summary["levels"]]
        ys = [100 * c["mean"] if c["mean"] is not None else float("nan") for c in cells]
        err = [100 * c["sd"] if c["sd"] is not None else 0.0 for c in cells]
        ax_a.errorbar(xs, ys, yerr=err, fmt="o-", color=color, markersize=4, capsize=3, label=label)
        curves = [summary["curves"][f"{r['variant']}/{s}"]["loss"] for s in r["seeds"]]
        common = sorted(set.intersection(*(set(x for x, _ in c) for c in curves)))
        if common:
            mean = [statistics.fmean(dict(map(tuple, c))[x] for c in curves) for x in common]
            ax_l.plot(common, mean, "-", color=color, label=label)
    ax_a.axhline(100 * summary["chance"], color="gray", linestyle="--", linewidth=1, label="chance")
    for name, acc in summary.get("shortcuts", {}).items():
        ax_a.plot(xs, [100 * acc["by_difficulty"][str(lv)] for lv in summary["levels"]], ":", color="black",
                  linewidth=1, label=f"shortcut: {name}")
    ax_a.set_xticks(xs, summary["level_names"])
    ax_a.set_ylim(0, 102)
    ax_a.set_xlabel(summary["difficulty_name"])
    ax_a.set_ylabel("test accuracy (%)")
    n = len(summary["seeds"])
    ax_a.set_title(f"{summary['task']}: accuracy" + (f", mean ± sd over {n} seeds" if n > 1 else ""))
    ax_l.set_yscale("log")
    ax_l.set_xlabel("optimizer step")
    ax_l.set_ylabel("training loss at scored positions (nats)")
    ax_l.set_title("training loss" + (f", mean over {n} seeds" if n > 1 else ""))
    for ax in (ax_a, ax_l):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def write_tasks(out: str | os.PathLike, summary: dict[str, Any]) -> None:
    """tasks.md, tasks.json and tasks.png in ``out``, each replaced atomically; for an lr grid also
    lr_sensitivity.png (the figures only with matplotlib installed: :func:`~deep_delta.experiments.report.
    write_outputs`)."""
    figures = {"tasks.png": lambda path: plot_tasks(summary, path)}
    if summary.get("lr_selection"):
        figures["lr_sensitivity.png"] = lambda path: plot_sensitivity(
            summary["lr_grid"], summary["variants"], path, "validation accuracy (fraction correct)",
            f"{summary['task']}: validation accuracy against lr, {len(summary['seeds'])} seed(s)")
    write_outputs(out, "tasks", summary, task_report(summary), figures)


def log_tasks(summary: dict[str, Any], out: str | os.PathLike, project: str | None = None, say=print) -> None:
    """The study as one W&B run (``tasks-TASK``, job type ``tasks``): the table of ``tasks.md`` with numbers
    (accuracy by difficulty, overall, test loss: means and sds over the seeds), every (variant, seed) result, the
    shortcuts, the training-loss curves and ``tasks.png``. Without W&B (no package, a refused login) one line
    says so."""
    out = Path(out)
    config = {k: summary[k] for k in ("task", "task_params", "settings", "variants", "seeds", "chance", "seq_len",
                                      "vocab_size", "machine")}
    levels = [str(lv) for lv in summary["levels"]]
    level_columns = [f"{summary['difficulty_name']} {name}" for name in summary["level_names"]]
    columns = ["variant", "seeds", *(x for name in [*level_columns, "overall"] for x in (name, f"{name} sd")),
               "test_loss", "parameters", "train_s"]
    rows = []
    for r in summary["rows"]:
        cells = [r["by_difficulty"][lv] for lv in levels] + [r["overall"]]
        rows.append([r["variant"], len(r["seeds"]), *(x for c in cells for x in (c["mean"], c["sd"])),
                     r["test_loss"]["mean"], r["parameters"], r["train_s"]])
    tables = {"accuracy": (columns, rows), "per_seed": (["variant", "seed", *level_columns, "overall", "test_loss"], [
        [r["variant"], seed, *(r["by_difficulty"][lv]["per_seed"][i] for lv in levels), r["overall_per_seed"][i],
         r["test_loss"]["per_seed"][i]] for r in summary["rows"] for i, seed in enumerate(r["seeds"])])}
    if summary.get("shortcuts"):
        tables["shortcuts"] = (["shortcut", *level_columns, "overall"], [
            [name, *(acc["by_difficulty"][lv] for lv in levels), acc["overall"]]
            for name, acc in summary["shortcuts"].items()])
    curves = [(*key.rsplit("/", 1), curve["loss"]) for key, curve in summary["curves"].items()]
    tables["loss_curves"] = (["variant", "seed", "step", "loss"], [
        [variant, int(seed), step, loss] for variant, seed, curve in curves for step, loss in curve])
    log_study(out, project=project, name=f"tasks-{summary['task']}", job_type="tasks", config=config, tables=tables,
              images={"accuracy_and_loss": out / "tasks.png"},
              summary={f"{r['variant']}/overall": r["overall"]["mean"] for r in summary["rows"]}, say=say)
