"""Test loss against lr for a study of ``ddl compare --lrs ... --eval-seeds N``: every finished run of the grid (the
selection seeds, ``OUT/lr_*/seed_*/VARIANT`` or, for one selection seed, ``OUT/lr_*/VARIANT``) measured on the same
test windows as the evaluation runs, beside the evaluation seeds' test loss at each variant's chosen lr (their runs
in ``OUT/evaluation/seed_*/VARIANT`` or ``OUT/evaluation/VARIANT``). The lr was chosen on the val split; this figure
shows, after the fact, whether the test split agrees with that choice (the chosen lr's test loss against its
neighbours').

Each grid run's test loss is kept in its ``test.json`` (the record and the reuse rule of
``deep_delta.experiments.held_out_split``: measured from the run's final checkpoint, reused when it holds the same
windows of the same data at the final step), so a second call measures nothing again. A run that diverged, or whose
final checkpoint is gone without a record, is left out and named.

Bad input is refused in one line on stderr (exit 1), before anything is measured or written: a selection.json,
run.json or test.json that is not what ``ddl compare`` writes, a missing evaluation run.json, ``--data`` that is not
a prepared directory, has no test split or is other data than the runs record (their run.json's data fingerprint
against the given data's, computed as the library computes it), a ``--figure`` matplotlib cannot write (its
suffix) or whose folder does not exist.

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

SEED_DIR = re.compile(r"seed_(0|[1-9][0-9]*)")
LAYOUTS = "lr_*/seed_*/VARIANT/run.json for several selection seeds, lr_*/VARIANT/run.json for one"
FIGURE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "tif", "tiff", "webp", "eps", "ps")


class Refused(Exception):
    """Bad input: main prints it as one line and exits 1."""


def _runs_in(folder: Path) -> list[tuple[int | None, Path]]:
    """The runs of one comparison's folder: (the seed folder's seed, run) for ``seed_S/VARIANT/`` (several seeds),
    (None, run) for ``VARIANT/`` (one seed); a folder holding both layouts is refused."""
    from deep_delta.variants import VARIANTS

    entries = sorted(folder.iterdir())
    variants = [(None, d) for d in entries if d.name in VARIANTS and (d / "run.json").is_file()]
    seeds = []
    for d in entries:
        m = SEED_DIR.fullmatch(d.name)
        if m is not None and d.is_dir():
            seeds += [(int(m.group(1)), r) for r in sorted(d.iterdir()) if (r / "run.json").is_file()]
    if variants and seeds:
        raise Refused(f"{folder} holds runs of one seed ({variants[0][1].name}/) and seed folders "
                      f"(seed_{seeds[0][0]}/); allowed: one layout, as `ddl compare` writes it")
    return variants or seeds


def grid_runs(out: Path) -> list[tuple[float, int | None, Path]]:
    """Every (lr, seed folder's seed or None, run directory) of the grid under ``out``, in order: ``lr_*/seed_*/
    VARIANT/`` for several selection seeds, ``lr_*/VARIANT/`` for one (its seed then read from its run.json)."""
    from deep_delta.experiments.finished_runs import lr_of_folder

    found = []
    for lr_dir in sorted(p for p in out.glob("lr_*") if p.is_dir()):
        lr = lr_of_folder(lr_dir)
        found += [(lr, seed, run) for seed, run in _runs_in(lr_dir)]
    return found


def check_data(run, data) -> None:
    """Refuse a run made from other data than ``data`` (its run.json's fingerprint against the given data's), or
    one whose record names no data."""
    from deep_delta.train.provenance import check_same_data

    recorded = run.record.get("data") if isinstance(run.record.get("data"), dict) else {}
    remedy = ("allowed: --data the data directory the study trained on (its runs' run.json record it"
              + (f": {recorded['dir']}" if recorded.get("dir") else "") + ")")
    try:
        checked = check_same_data(run.fingerprint, data.fingerprint, what=f"the run {run.dir}", data_dir=data.dir,
                                  remedy=remedy, stored_dir=recorded.get("dir"))
    except FileExistsError as e:
        raise Refused(str(e)) from None
    if not checked:
        raise Refused(f"{run.dir}/run.json records no data fingerprint, so whether the run was made from {data.dir} "
                      "cannot be checked; allowed: a study whose runs record their data (run.json's data, as `ddl "
                      "train` writes it)")


def evaluation_runs(out: Path) -> list[tuple[object, dict]]:
    """The evaluation runs with a test loss: (the run, its test.json) for every run of ``OUT/evaluation``
    (``seed_S/VARIANT/`` or ``VARIANT/``) with a test.json, read with its run.json. A damaged record, or a test.json
    without its run.json, is refused (these are the study's reported results)."""
    from deep_delta.experiments.finished_runs import read_run
    from deep_delta.experiments.held_out import EVAL_DIR
    from deep_delta.experiments.held_out_split import read_test

    where = out / EVAL_DIR
    if not where.is_dir():
        return []
    for d in sorted(where.glob("seed_*/*")) + sorted(where.glob("*")):
        if (d / "test.json").is_file() and not (d / "run.json").is_file():
            raise Refused(f"{d}/run.json is missing, but {d}/test.json is there; allowed: an evaluation run with its "
                          "run.json (its variant, seed and lr), as `ddl compare --eval-seeds` writes it")
    found = []
    for seed, run_dir in _runs_in(where):
        record = read_test(run_dir)
        if record is not None:
            found.append((read_run(run_dir, seed), record))
    return found


def measure(out: Path, data_dir: str, tokens: int | None, say=print) -> dict:
    """Every grid run's test loss (measured or reused) and the evaluation runs' (their own test.json). Every check
    (the runs' records, ``data_dir``'s test split, the runs' data against it) comes before the first measurement."""
    from deep_delta.experiments.finished_runs import read_run
    from deep_delta.experiments.held_out_split import measure_test, resolve_test_tokens
    from deep_delta.train.data import TrainData

    runs = grid_runs(out)
    if not runs:
        raise Refused(f"{out} holds no grid runs ({LAYOUTS}); allowed: the OUT of `ddl compare --lrs ... "
                      "--eval-seeds N`")
    data = TrainData.resolve(data_dir)
    read, left_out = [], []
    for lr, seed, run_dir in runs:
        try:
            read.append((lr, read_run(run_dir, seed, lr)))
        except (ValueError, FileNotFoundError) as e:
            left_out.append(f"{run_dir}: {e}")
    evaluation = evaluation_runs(out)
    size = resolve_test_tokens(data, tokens, read[0][1].cfg.seq_len) if read else None
    for run in [run for _, run in read] + [run for run, _ in evaluation]:
        check_data(run, data)
    for run, record in evaluation:
        if record.get("data_fingerprint") not in (None, data.fingerprint):
            raise Refused(f"{run.dir}/test.json was measured on other data than {data.dir} (data fingerprint "
                          f"{str(record['data_fingerprint'])[:12]}, {data.dir}'s {data.fingerprint[:12]}); allowed: "
                          "--data the data directory the study trained and measured on")
    finished = []
    for lr, run in read:
        if run.end["diverged"] is not None:
            left_out.append(f"{run.dir}: diverged")
        else:
            finished.append((lr, run))
    points = []
    for i, (lr, run) in enumerate(finished, 1):
        cfg = replace(run.cfg, out=str(run.dir))
        try:
            record = measure_test(cfg, data, size, step=cfg.steps, say=lambda msg: None)
        except FileNotFoundError as e:
            left_out.append(f"{run.dir}: {e}")
            continue
        say(f"[{i}/{len(finished)}] {cfg.variant} lr {lr:g} seed {cfg.seed}: test {record['loss']:.4f}")
        points.append({"variant": cfg.variant, "lr": lr, "seed": cfg.seed, "test_loss": record["loss"],
                       "tokens": record["tokens"]})
    evaluation = [{"variant": run.cfg.variant, "lr": run.cfg.lr, "seed": run.cfg.seed, "test_loss": record["loss"],
                   "tokens": record["tokens"]} for run, record in evaluation]
    sizes = {p["tokens"] for p in points + evaluation}
    if len(sizes) > 1:
        raise Refused(f"the runs were measured on different test tokens ({sorted(sizes)}); allowed: one "
                      "--test-tokens for the grid and the evaluation runs")
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


def read_selection(out: Path) -> dict[str, float]:
    """Each variant's lr chosen on val, from ``OUT/selection.json`` (variants without one left out); a file that is
    not a selection record is refused."""
    from deep_delta.fsutil import read_json_file

    path = out / "selection.json"
    what = "the lr selection `ddl compare --lrs ... --eval-seeds N` writes (selection.json)"
    if not path.is_file():
        raise Refused(f"{path} is missing; allowed: the OUT of a finished selection of `ddl compare --lrs ... "
                      "--eval-seeds N`")
    record = read_json_file(path, what)
    chosen = record.get("lr_selection", {}).get("chosen") if isinstance(record, dict) and isinstance(
        record.get("lr_selection"), dict) else None
    ok = isinstance(chosen, dict) and all(
        isinstance(c, dict) and (c.get("lr") is None or isinstance(c.get("lr"), (int, float))) for c in chosen.values())
    if not ok:
        raise Refused(f"{path} is not a selection record (no lr_selection.chosen with each variant's lr); expected "
                      f"{what}")
    return {v: float(c["lr"]) for v, c in chosen.items() if c["lr"] is not None}


def asked_tokens(out: Path) -> int | None:
    """The test tokens the evaluation runs were asked for (their first test.json's ``tokens_asked``), or None."""
    from deep_delta.experiments.held_out_split import read_test

    for path in sorted(out.glob("evaluation/seed_*/*/test.json")) + sorted(out.glob("evaluation/*/test.json")):
        asked = read_test(path.parent).get("tokens_asked")
        if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
            raise Refused(f"{path}: tokens_asked got {asked!r}; allowed: a whole number of tokens, as `ddl compare "
                          "--eval-seeds` writes it (or give --test-tokens)")
        return asked
    return None


def check_figure(path: Path) -> None:
    """Refuse, before any work, a figure path matplotlib cannot write: a suffix it has no writer for, or a folder
    that does not exist."""
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FIGURE_FORMATS:
        raise Refused(f"--figure got {str(path)!r}; allowed: a path ending in one of "
                      f"{', '.join('.' + f for f in FIGURE_FORMATS)} (an image matplotlib writes)")
    if not path.parent.is_dir():
        raise Refused(f"--figure got {str(path)!r}, but its folder {path.parent} does not exist; allowed: a path in "
                      "an existing folder")


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
    try:
        figure_path = Path(args.figure) if args.figure else out / "test_vs_lr.png"
        check_figure(figure_path)
        chosen = read_selection(out)
        tokens = args.test_tokens if args.test_tokens is not None else asked_tokens(out)
        result = measure(out, args.data, tokens)
        result["chosen_on_val"] = chosen
        from deep_delta.fsutil import atomic_write

        atomic_write(out / "test_vs_lr.json", json.dumps(result, indent=2) + "\n")
        figure(result, chosen, figure_path)
    except (Refused, ValueError, OSError) as e:  # bad input: one line, never a traceback
        raise SystemExit(f"grid_test_loss.py: {e}") from None
    print(table(result, chosen))
    for line in result["left_out"]:
        print(f"left out: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
