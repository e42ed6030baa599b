"""Merge `ddl compare` results of the same runs split across device calls (one call's seeds, then another's) into
one paired table: the rows, intervals and report of :mod:`deep_delta.experiments.compare_report`, over every seed.

    python benchmarks/tools/merge_compare.py OUT_DIR A/compare.json B/compare.json ...

Refuses to merge runs whose data fingerprint, variants or settings (other than the seed) differ, or that share a
seed. The step times of the equal-time view are the median over the inputs' interleaved timings. Writes
OUT_DIR/compare.md, compare.json and curves.png (validation curves, one line per seed).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from deep_delta.experiments.compare_report import compare_rows, comparison_report, variant_row


def merge(summaries: list[dict]) -> dict:
    first = summaries[0]
    variants = [r["variant"] for r in first["rows"]]
    settings = {k: v for k, v in first["settings"].items() if k != "seed"}
    seeds: list[int] = []
    for s in summaries:
        if s["data_fingerprint"] != first["data_fingerprint"]:
            raise SystemExit("merge_compare: the inputs were trained on different data (data_fingerprint differs)")
        if [r["variant"] for r in s["rows"]] != variants:
            raise SystemExit(f"merge_compare: variants differ: {variants} vs {[r['variant'] for r in s['rows']]}")
        other = {k: v for k, v in s["settings"].items() if k != "seed"}
        if other != settings:
            diff = sorted(k for k in set(other) | set(settings) if other.get(k) != settings.get(k))
            raise SystemExit(f"merge_compare: settings differ in {diff}")
        if set(seeds) & set(s["seeds"]):
            raise SystemExit(f"merge_compare: seed(s) {sorted(set(seeds) & set(s['seeds']))} appear twice")
        seeds += s["seeds"]
    step_times = {v: statistics.median(s["timing"]["step_time_s"][v] for s in summaries) for v in variants}
    timing = {k: v for k, v in first["timing"].items() if k not in ("step_time_rounds_s", "earlier")}
    timing.update(step_time_s=step_times, repeats=sum(s["timing"]["repeats"] for s in summaries))
    if all(s["timing"].get("step_time_rounds_s") for s in summaries):  # every call's rounds, each paired within it
        timing["step_time_rounds_s"] = {v: [t for s in summaries for t in s["timing"]["step_time_rounds_s"][v]]
                                        for v in variants}
    rows = []
    for v in variants:
        results = [x for s in summaries for r in s["rows"] if r["variant"] == v for x in r["per_seed"]]
        rows.append(variant_row(v, sorted(results, key=lambda x: x["seed"])))
    ref = next(r for r in rows if r["variant"] == first["reference"])
    for r in rows:
        compare_rows(r, ref, timing)
    return {"rows": rows, "reference": ref["variant"], "seeds": sorted(seeds), "settings": first["settings"],
            "timing": timing, "machine": first["machine"], "data_fingerprint": first["data_fingerprint"],
            "wall_s": sum(s["wall_s"] for s in summaries)}


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, r in enumerate(summary["rows"]):
        for j, x in enumerate(r["per_seed"]):
            steps, losses = zip(*x["val_curve"])
            ax.plot(steps, losses, color=f"C{i}", alpha=0.8, label=r["name"] if j == 0 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (nats / byte)")
    ax.set_ylim(top=min(3.0, ax.get_ylim()[1]))
    ax.legend()
    ax.set_title(f"validation loss, seeds {', '.join(map(str, summary['seeds']))}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        raise SystemExit(__doc__)
    out = Path(argv[0])
    summary = merge([json.loads(Path(p).read_text()) for p in argv[1:]])
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "compare.md").write_text(comparison_report(summary))
    plot(summary, out / "curves.png")
    print(comparison_report(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
