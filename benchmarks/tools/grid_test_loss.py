"""Test loss against lr for a study of ``ddl compare --lrs ... --eval-seeds N``: every finished run of the grid (the
selection seeds, ``OUT/lr_*/seed_*/VARIANT``) measured on the same test windows as the evaluation runs, beside the
evaluation seeds' test loss at each variant's chosen lr. The lr was chosen on the val split; this figure shows, after
the fact, whether the test split agrees with that choice (the chosen lr's test loss against its neighbours').

Each grid run's test loss is kept in its ``test.json`` (the record and the reuse rule of
``deep_delta.experiments.test_split``: measured from the run's final checkpoint, reused when it holds the same
windows of the same data at the final step), so a second call measures nothing again. A run that diverged, or whose
final checkpoint is gone without a record, is left out and named.

    python benchmarks/tools/grid_test_loss.py OUT --data DIR [--test-tokens 250K] [--figure OUT/test_vs_lr.png]

Writes the figure and ``OUT/test_vs_lr.json`` (every point) and prints a table (mean over the selection seeds per
lr; the chosen lr marked).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path

LR_DIR = re.compile(r"lr_(.+)")
SEED_DIR = re.compile(r"seed_(\d+)")


def grid_runs(out: Path) -> list[tuple[float, int, Path]]:
    """Every (lr, seed, run directory) of the grid under ``out``, in order."""
    found = []
    for lr_dir in sorted(out.glob("lr_*")):
        m = LR_DIR.fullmatch(lr_dir.name)
        if m is None or not lr_dir.is_dir():
            continue
        for seed_dir in sorted(lr_dir.glob("seed_*")):
            s = SEED_DIR.fullmatch(seed_dir.name)
            if s is None:
                continue
            for run in sorted(p for p in seed_dir.iterdir() if (p / "run.json").is_file()):
                found.append((float(m.group(1)), int(s.group(1)), run))
    return found


def measure(out: Path, data_dir: str, tokens: int | None, say=print) -> dict:
    """Every grid run's test loss (measured or reused) and the evaluation runs' (their own test.json)."""
    from deep_delta.experiments.finished_runs import read_run
    from deep_delta.experiments.held_out import EVAL_DIR
    from deep_delta.experiments.test_split import measure_test, read_test, resolve_test_tokens
    from deep_delta.train.data import TrainData

    data = TrainData.resolve(data_dir)
    points, left_out = [], []
    runs = grid_runs(out)
    if not runs:
        raise SystemExit(f"grid_test_loss.py: {out} holds no grid runs (lr_*/seed_*/VARIANT/run.json); allowed: the "
                         "OUT of `ddl compare --lrs ... --eval-seeds N`")
    size = None
    for i, (lr, seed, run_dir) in enumerate(runs, 1):
        try:
            run = read_run(run_dir, seed, lr)
        except (ValueError, FileNotFoundError) as e:
            left_out.append(f"{run_dir}: {e}")
            continue
        if run.end["diverged"] is not None:
            left_out.append(f"{run_dir}: diverged")
            continue
        cfg = replace(run.cfg, out=str(run_dir))
        size = size or resolve_test_tokens(data, tokens, cfg.seq_len)
        try:
            record = measure_test(cfg, data, size, step=cfg.steps, say=lambda msg: None)
        except FileNotFoundError as e:
            left_out.append(f"{run_dir}: {e}")
            continue
        say(f"[{i}/{len(runs)}] {cfg.variant} lr {lr:g} seed {seed}: test {record['loss']:.4f}")
        points.append({"variant": cfg.variant, "lr": lr, "seed": seed, "test_loss": record["loss"],
                       "tokens": record["tokens"]})
    evaluation = []
    for run_dir in sorted((out / EVAL_DIR).glob("seed_*/*")) if (out / EVAL_DIR).is_dir() else []:
        record = read_test(run_dir)
        if record is None:
            continue
        cfg = json.loads((run_dir / "run.json").read_text())["train_config"]
        evaluation.append({"variant": cfg["variant"], "lr": cfg["lr"], "seed": cfg["seed"],
                           "test_loss": record["loss"], "tokens": record["tokens"]})
    sizes = {p["tokens"] for p in points + evaluation}
    if len(sizes) > 1:
        raise SystemExit(f"grid_test_loss.py: the runs were measured on different test tokens ({sorted(sizes)}); "
                         "allowed: one --test-tokens for the grid and the evaluation runs")
    return {"points": points, "evaluation": evaluation, "left_out": left_out, "test_tokens": size}


def table(result: dict, chosen: dict[str, float]) -> str:
    """Markdown: a row per variant, a column per lr, the mean test loss over the selection seeds (n in brackets
    when a seed is missing), the lr chosen on val in bold; the evaluation seeds' mean in the last column."""
    points, evaluation = result["points"], result["evaluation"]
    variants = list(dict.fromkeys(p["variant"] for p in points))
    lrs = sorted({p["lr"] for p in points})
    seeds = len({p["seed"] for p in points})
    lines = ["| variant | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | evaluation seeds at the chosen lr |",
             "|" + " --- |" * (len(lrs) + 2)]
    for v in variants:
        cells = []
        for lr in lrs:
            values = [p["test_loss"] for p in points if p["variant"] == v and p["lr"] == lr]
            text = "-" if not values else f"{statistics.fmean(values):.4f}" + (
                f" (n {len(values)})" if len(values) < seeds else "")
            cells.append(f"**{text}**" if chosen.get(v) == lr and values else text)
        mine = [e["test_loss"] for e in evaluation if e["variant"] == v]
        cells.append(f"{statistics.fmean(mine):.4f} (n {len(mine)})" if mine else "-")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(result: dict, chosen: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    points, evaluation = result["points"], result["evaluation"]
    for i, v in enumerate(dict.fromkeys(p["variant"] for p in points)):
        mine = [p for p in points if p["variant"] == v]
        lrs = sorted({p["lr"] for p in mine})
        mean = [statistics.fmean(p["test_loss"] for p in mine if p["lr"] == lr) for lr in lrs]
        ax.plot(lrs, mean, "-", color=f"C{i}", label=v)
        ax.scatter([p["lr"] for p in mine], [p["test_loss"] for p in mine], color=f"C{i}", s=12, zorder=3)
        ev = [e["test_loss"] for e in evaluation if e["variant"] == v]
        if ev and v in chosen:
            ax.scatter([chosen[v]] * len(ev), ev, color=f"C{i}", marker="*", s=70, zorder=4, edgecolors="black",
                       linewidths=0.4)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("test loss")
    ax.set_title("test loss against lr (dots: selection seeds; stars: evaluation seeds at the lr chosen on val)",
                 fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the OUT of `ddl compare --lrs ... --eval-seeds N`")
    ap.add_argument("--data", required=True, help="the prepared data directory the study trained on")
    from deep_delta.cli.options import count

    ap.add_argument("--test-tokens", type=count, default=None,
                    help="test tokens per run, e.g. 250K (default: the evaluation runs')")
    ap.add_argument("--figure", default=None, help="where the figure goes (default OUT/test_vs_lr.png)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    selection = out / "selection.json"
    if not selection.is_file():
        raise SystemExit(f"grid_test_loss.py: {selection} is missing; allowed: the OUT of a finished selection of "
                         "`ddl compare --lrs ... --eval-seeds N`")
    chosen = {v: c["lr"] for v, c in json.loads(selection.read_text())["lr_selection"]["chosen"].items()
              if c["lr"] is not None}
    tokens = args.test_tokens
    if tokens is None:
        kept = sorted(out.glob("evaluation/seed_*/*/test.json"))
        tokens = json.loads(kept[0].read_text())["tokens_asked"] if kept else None
    result = measure(out, args.data, tokens)
    result["chosen_on_val"] = chosen
    (out / "test_vs_lr.json").write_text(json.dumps(result, indent=2) + "\n")
    figure(result, chosen, Path(args.figure) if args.figure else out / "test_vs_lr.png")
    print(table(result, chosen))
    for line in result["left_out"]:
        print(f"left out: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
