"""The width / length study: the same comparison at several model widths and training lengths, to see whether a
variant's difference to the baseline grows or shrinks with scale.

One complete comparison per (width, length) in ``OUT/d<width>_s<steps>/`` (:func:`~deep_delta.experiments.runner.
run_plan`; with an lr grid each variant is at its own best lr at every width); then in ``OUT``:
``scaling.md`` and ``scaling.json`` (per variant and point: the paired difference of the final validation loss
to the reference, its 95% t-interval, the seeds in which it was lower, the chosen lrs, parameters, tokens and
training compute) and ``scaling.png`` (the difference against width, one line per training length, and against
training compute, with the intervals as error bars).

A study run in parts (a width added later, with its own seeds or lr grid) is summarised afterwards from the
points already on disk by :func:`collect_scaling` (``ddl compare --out OUT --report-only``), training nothing.

Training compute is estimated as 6 x parameters x training tokens (the usual forward + backward count of a
dense model's matrix products; attention's own products and the delta update are left out), so it ranks the
points; it is not a measurement of time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from deep_delta.experiments.plan import POINT_NAME
from deep_delta.fsutil import save_figure
from deep_delta.train.config import TrainConfig, recorded

# settings in which the points of one summary may differ: the point's own width and length, its lr and seeds (each
# point's grid and seeds are recorded with it), how often it validated (the final loss is what is compared), the
# data's path (the data is compared by fingerprint) and what never changes a result
_POINTS_MAY_DIFFER = frozenset({"steps", "lr", "seed", "eval_every", "data", "variant", "model"})


def collect_scaling(out: str | os.PathLike, *, widths: list[int] | None = None,
                    lengths: list[int] | None = None) -> dict[str, Any]:
    """The study's summary from the finished points already in ``out`` (every ``d<W>_s<N>/compare.json``; with
    ``widths`` / ``lengths`` only those, each of which must be there), training nothing; written as
    :func:`~deep_delta.experiments.runner.run_plan` writes it. Each point keeps its own seeds and lr grid; the
    points must share the reference, the data (by fingerprint), the step costs and every setting that changes a
    result except width, length, lr and seeds, else they are refused, naming the differences."""
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"`out` got {str(out)!r}, which is not a directory; allowed: a study's directory "
                                "(the `out` of `ddl compare --widths ...`)")
    found = {}
    for d in sorted(out.iterdir()):
        m = POINT_NAME.fullmatch(d.name)
        if m and d.is_dir():
            found[int(m.group(1)), int(m.group(2))] = d
    keep = {k: d for k, d in found.items()
            if (widths is None or k[0] in widths) and (lengths is None or k[1] in lengths)}
    missing = [f"width {w}" for w in widths or [] if all(k[0] != w for k in keep)]
    missing += [f"length {n}" for n in lengths or [] if all(k[1] != n for k in keep)]
    if missing or not keep:
        raise FileNotFoundError(
            f"{out} holds no finished point for {', '.join(missing) or 'the study'} (points found: "
            f"{', '.join(d.name for d in found.values()) or 'none'}); allowed: the d<W>_s<STEPS> directories a "
            "finished `ddl compare --widths ...` leaves in its `out`")
    from deep_delta.experiments.collect import collect_comparison

    studies, unchecked = {}, []
    for key, d in sorted(keep.items()):
        path = d / "compare.json"
        studies[key] = read_point(path, key)
        if check_point_runs(d, studies[key]):
            # a derived file is not trusted: the point's numbers are recomputed from its runs (checked on the way)
            studies[key] = collect_comparison(d, write=False)
        else:
            unchecked.append(d.name)
    _check_points_agree(studies)
    first = next(iter(studies.values()))
    grids = [(s.get("lr_selection") or {}).get("lrs") for s in studies.values()]
    settings = {k: v for k, v in first["settings"].items() if k != "steps"}  # a point's own, not the study's
    settings["model"] = {k: v for k, v in (settings.get("model") or {}).items() if k != "hidden_size"}
    summary = summarize_scaling(studies, settings, grids[0] if all(g == grids[0] for g in grids) else None)
    if first.get("step_costs"):
        summary["step_costs"] = first["step_costs"]
    if unchecked:
        summary["runs_not_on_disk"] = unchecked
    write_scaling(out, summary)
    return summary


def read_point(path: Path, key: tuple[int, int]) -> dict[str, Any]:
    """A point's compare.json (``key``: its width and length, from its directory's name), checked to be a
    comparison's summary of that point: an object with its settings, reference, seeds and rows, each row's numbers
    numbers (a difference inside its own interval). Anything else is one error naming the file and the field."""
    from deep_delta.fsutil import read_json_file

    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the point {path.parent.name} has not finished; finish it with the "
                                "`ddl compare` that started it (runs are resumed)")
    summary = read_json_file(path, "a comparison's summary (the compare.json `ddl compare` writes)", limit=256 << 20)

    def bad(field: str, got: Any, allowed: str) -> ValueError:
        shown = json.dumps(got) if len(json.dumps(got)) <= 40 else f"a JSON {type(got).__name__}"
        return ValueError(f"{path}: `{field}` got {shown}; allowed: {allowed} (rebuild it from the point's runs: "
                          f"ddl compare --out {path.parent} --report-only)")

    if not isinstance(summary, dict):
        raise bad("(the file)", summary, "a comparison's summary, an object")
    settings = summary.get("settings")
    if not isinstance(settings, dict) or not isinstance(settings.get("model"), dict):
        raise bad("settings", settings, "the comparison's settings, an object with its model")
    if settings["model"].get("hidden_size") != key[0] or settings.get("steps") != key[1]:
        raise ValueError(f"{path} holds hidden_size {settings['model'].get('hidden_size')} and "
                         f"{settings.get('steps')} steps, not what its directory's name says ({path.parent.name}); "
                         "allowed: a point directory as `ddl compare --widths` wrote it")
    rows, seeds = summary.get("rows"), summary.get("seeds")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise bad("rows", rows, "a row per variant")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(x, int) for x in seeds):
        raise bad("seeds", seeds, "the point's seeds, a list of integers")
    if summary.get("reference") not in [r.get("variant") for r in rows]:
        raise bad("reference", summary.get("reference"), "the variant of one of its rows")
    for i, r in enumerate(rows):
        _check_row(r, f"rows[{i}]", bad)
    return summary


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _check_row(r: dict, where: str, bad) -> None:
    for name in ("val_loss", "d_val_loss"):
        if r.get(name) is not None and not _number(r[name]):
            raise bad(f"{where}.{name}", r[name], "a number or null")
    for name in ("parameters", "tokens", "wins", "n_paired"):
        if r.get(name) is not None and (not isinstance(r[name], int) or isinstance(r[name], bool) or r[name] < 0):
            raise bad(f"{where}.{name}", r[name], "an integer >= 0 or null")
    ci, d = r.get("d_val_loss_ci95"), r.get("d_val_loss")
    if ci is not None:
        if not (isinstance(ci, list) and len(ci) == 2 and all(_number(x) for x in ci) and ci[0] <= ci[1]):
            raise bad(f"{where}.d_val_loss_ci95", ci, "null or [low, high], two numbers")
        if d is None or not ci[0] <= d <= ci[1]:
            raise bad(f"{where}.d_val_loss", d, f"the mean of its interval's pairs, inside {ci}")


def check_point_runs(point: Path, summary: dict) -> bool:
    """Refuse a point whose ``compare.json`` no longer describes its run directories: every run it summarises
    (each variant and seed, at each lr of its grid) must still hold a ``run.json`` made with the settings and
    data the summary records. A rerun with other settings and ``--overwrite`` that was stopped part-way leaves
    the old summary beside some new runs; a report from it would mix the two. A point with none of its runs on
    disk (a record kept without them, as studies/ keeps its points) is taken as recorded: returns False
    for it, True for a point whose runs were checked."""
    from deep_delta.experiments.compare import check_reusable
    from deep_delta.experiments.lr_grid import lr_dir
    from deep_delta.experiments.plan import ComparePlan

    settings = recorded(summary.get("settings") or {})
    seeds, costs = summary.get("seeds") or [settings.get("seed")], summary.get("step_costs") or {}
    grid = (summary.get("lr_selection") or {}).get("lrs")
    where = {lr: lr_dir(point, lr) for lr in grid} if grid else {settings.get("lr"): point}
    plan = ComparePlan(tuple(r["variant"] for r in summary.get("rows", [])), tuple(seeds), step_costs=costs)
    runs = []
    for lr, root in where.items():
        base = TrainConfig.from_dict({**settings, "lr": lr}, origin=f" ({point / 'compare.json'})")
        runs += list(plan.runs(base, root).values())
    if not any(Path(cfg.out).exists() for cfg in runs):
        return False
    for cfg in runs:
        if not (Path(cfg.out) / "run.json").is_file():
            raise FileNotFoundError(f"{cfg.out}/run.json is missing, but {point / 'compare.json'} summarises that "
                                    "run; finish the point's `ddl compare` (its summary is rewritten at the end)")
        try:
            check_reusable(cfg, summary.get("data_fingerprint"), overwrite=False)
        except FileExistsError as e:
            raise ValueError(f"{point / 'compare.json'} no longer describes its runs: {e}. Finish the `ddl compare` "
                             "that replaced them (the point's summary is rewritten at the end)") from None
    return True


def _check_points_agree(studies: dict[tuple[int, int], dict]) -> None:
    from deep_delta.train.provenance import differences
    from deep_delta.train.run_dir import RESULT_NEUTRAL

    (w0, n0), first = next(iter(studies.items()))

    def comparable(s: dict) -> dict:
        settings = recorded(s.get("settings") or {})  # a point recorded before a setting existed: as it trained
        model = {k: v for k, v in (settings.get("model") or {}).items() if k != "hidden_size"}
        return {**{k: v for k, v in settings.items() if k not in RESULT_NEUTRAL | _POINTS_MAY_DIFFER},
                "model (but hidden_size)": model, "reference": s.get("reference"),
                "data fingerprint": s.get("data_fingerprint"), "step_costs": s.get("step_costs")}

    for (w, n), s in studies.items():
        diff = differences(comparable(first), comparable(s), has=f"d{w0}_s{n0} has")
        if diff:
            raise ValueError(f"the point d{w}_s{n} differs from d{w0}_s{n0} in more than width, length, lr and "
                             f"seeds ({'; '.join(diff)}); allowed: points of one study (summarise the others from "
                             "their own directory)")


def summarize_scaling(studies: dict[tuple[int, int], dict], settings: dict | None,
                      lrs: list[float] | None) -> dict[str, Any]:
    """One point per (variant other than the reference, width, length), from each comparison's summary; each
    point records its comparison's seeds and lr grid (``lrs``: the grid every point shares, if one)."""
    points = []
    for (width, steps), summary in sorted(studies.items()):
        ref = next(r for r in summary["rows"] if r["variant"] == summary["reference"])
        grid = (summary.get("lr_selection") or {}).get("lrs")
        lr = (summary.get("settings") or {}).get("lr")  # without a grid, every variant's
        for r in summary["rows"]:
            if r is ref:
                continue
            points.append({
                "variant": r["variant"], "width": width, "steps": steps, "tokens": r["tokens"],
                "parameters": r["parameters"],
                "compute": 6 * r["parameters"] * r["tokens"] if r["parameters"] and r["tokens"] else None,
                "d_val_loss": r["d_val_loss"], "ci95": r.get("d_val_loss_ci95"), "wins": r.get("wins"),
                "n": r.get("n_paired"), "lr": r.get("lr") if grid else lr,
                "reference_lr": ref.get("lr") if grid else lr,
                "diverged": r.get("diverged"), "seeds": summary["seeds"], "lrs": grid,
            })
    first = next(iter(studies.values()))
    seeds = [s["seeds"] for s in studies.values()]
    return {"reference": first["reference"], "seeds": first["seeds"] if all(x == seeds[0] for x in seeds) else None,
            "lrs": lrs, "points": points, "widths": sorted({w for w, _ in studies}),
            "lengths": sorted({n for _, n in studies}), "settings": settings, "machine": first["machine"]}


def _grid(lrs: list[float]) -> str:
    return ", ".join(f"{x:g}" for x in lrs)


def format_scaling(summary: dict[str, Any]) -> str:
    from deep_delta.experiments.lr_grid import gap_warning

    ref, seeds, points = summary["reference"], summary["seeds"], summary["points"]
    grids = {(p["width"], p["steps"]): p.get("lrs") for p in points}
    if summary["lrs"]:
        how = f"each variant at its own best lr of the grid {_grid(summary['lrs'])}, chosen on the final validation " \
              "loss at every point"
    elif any(grids.values()):
        how = "each variant at its own best lr of its point's grid (below), chosen on the final validation loss"
    elif len({p["lr"] for p in points} | {p["reference_lr"] for p in points}) <= 1:
        how = f"one shared lr ({(summary['settings'] or {}).get('lr')}) for every variant"
    else:
        how = "one lr shared by the variants of each point (the lr column)"
    paired = (f"{len(seeds)} seed(s): {', '.join(map(str, seeds))}" if seeds is not None else
              "each point's own seeds, below; `lower in` counts them")
    lines = [
        "# Width and length study", "",
        f"Final validation loss of each variant minus `{ref}`'s, paired by seed ({paired}); learning rate: {how}. "
        "Compute: 6 x parameters x training tokens.", "",
        "| variant | width | steps | tokens | parameters | compute (FLOPs) | d loss | 95% CI of d | lower in | lr | "
        f"{ref} lr |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in summary["points"]:
        d = "diverged" if p["d_val_loss"] is None and p["diverged"] else (
            "-" if p["d_val_loss"] is None else f"{p['d_val_loss']:+.4f}")
        ci = f"[{p['ci95'][0]:+.4f}, {p['ci95'][1]:+.4f}]" if p["ci95"] else "-"
        lr = "-" if p["lr"] is None else f"{p['lr']:g}"
        ref_lr = "-" if p["reference_lr"] is None else f"{p['reference_lr']:g}"
        compute = "-" if p["compute"] is None else f"{p['compute']:.3g}"
        lines.append(f"| {p['variant']} | {p['width']} | {p['steps']} | {p['tokens']:,} | {p['parameters']:,} | "
                     f"{compute} | {d} | {ci} | {p['wins']}/{p['n']} | {lr} | {ref_lr} |")
    if seeds is None or (not summary["lrs"] and any(grids.values())):
        lines += ["", "| point | seeds | lr grid |", "| --- | --- | --- |"]
        lines += [f"| d{w}_s{n} | {', '.join(map(str, p['seeds']))} | {_grid(p['lrs']) if p.get('lrs') else '-'} |"
                  for (w, n), p in {(p["width"], p["steps"]): p for p in points}.items()]
    gaps = sorted({w for p in points for w in [gap_warning(p.get("lrs") or [])] if w})
    if gaps:  # where the result is read: each variant "at its own best lr" of a grid that may miss it
        lines += ["", *(w[0].upper() + w[1:] for w in gaps)]
    if summary.get("step_costs"):
        costs = ", ".join(f"{v} {c:g}x" for v, c in summary["step_costs"].items())
        lines += ["", f"Equal cost: `steps` is `{ref}`'s; a variant whose step costs c x as much ({costs}; given, "
                  "not measured here) trained steps / c steps with its own schedule (its tokens above)."]
    if summary.get("runs_not_on_disk"):
        lines += ["", f"The runs of {', '.join(summary['runs_not_on_disk'])} are not on disk: their compare.json is "
                  "taken as recorded (the other points' runs were checked against it)."]
    lines += ["", "Each point's own comparison is in `d<width>_s<steps>/compare.md`.", "",
              "![the difference against width and compute](scaling.png)", ""]
    return "\n".join(lines)


def scaling_figure(summary: dict[str, Any]):
    """Left: d loss against width, a line per (variant, length); right: d loss against compute (log scale), a
    line per variant; error bars: the 95% t-interval (none with one seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_w, ax_c) = plt.subplots(1, 2, figsize=(11, 4.2))
    variants = list(dict.fromkeys(p["variant"] for p in summary["points"]))
    styles = ["o-", "s--", "^:", "d-."]
    for i, v in enumerate(variants):
        mine = [p for p in summary["points"] if p["variant"] == v and p["d_val_loss"] is not None]
        for j, n in enumerate(summary["lengths"]):
            pts = sorted((p for p in mine if p["steps"] == n), key=lambda p: p["width"])
            _errorbar(ax_w, pts, "width", f"C{i}", styles[j % len(styles)], f"{v}, {n} steps")
        _errorbar(ax_c, sorted((p for p in mine if p["compute"]), key=lambda p: p["compute"]), "compute", f"C{i}",
                  "o-", v)
    for ax, xlabel in ((ax_w, "width (hidden size)"), (ax_c, "training compute (6 x parameters x tokens, FLOPs)")):
        ax.axhline(0.0, color="gray", linewidth=1)
        ax.set_xscale("log", base=2 if ax is ax_w else 10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"final val loss minus {summary['reference']}'s (nats)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax_w.set_xticks(summary["widths"], [str(w) for w in summary["widths"]])
    ax_w.minorticks_off()
    ax_w.set_title("difference against width (95% t-interval)")
    ax_c.set_title("difference against compute")
    fig.tight_layout()
    return fig


def _errorbar(ax, pts: list[dict], x: str, color: str, style: str, label: str) -> None:
    if not pts:
        return
    ys = [p["d_val_loss"] for p in pts]
    err = [[max(0.0, y - p["ci95"][0]) if p["ci95"] else 0.0 for y, p in zip(ys, pts)],
           [max(0.0, p["ci95"][1] - y) if p["ci95"] else 0.0 for y, p in zip(ys, pts)]]
    ax.errorbar([p[x] for p in pts], ys, yerr=err, fmt=style, color=color, capsize=3, markersize=4, label=label)


def write_scaling(out: str | os.PathLike, summary: dict[str, Any]) -> None:
    """scaling.md, scaling.json and scaling.png in ``out`` (the shared report stack)."""
    from deep_delta.experiments.report import write_outputs

    write_outputs(out, "scaling", summary, format_scaling(summary),
                  {"scaling.png": lambda path: save_figure(scaling_figure(summary), path, dpi=120)})
