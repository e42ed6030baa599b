"""DDL minus baseline at each variant's own best learning rate, per width, from a mup_sweep.py record.

    python benchmarks/tools/width_trend.py benchmarks/records/2026-11-25-mup-sweep-transfer-cpu/mup_sweep.json \
        [--variant ddl-cc]

For each parametrization and width: each variant's best lr (lowest validation loss averaged over the seeds that
every grid point has), that loss, and the paired per-seed difference to the baseline at the baseline's own best
lr. The lr is chosen on the same validation loss that is reported (no separate test split), for every variant
alike. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def best_points(runs: list[dict]) -> dict:
    """{(variant, parametrization, width): (mean loss, lr, {seed: loss})} at the lowest mean over common seeds."""
    grid = defaultdict(dict)
    for r in runs:
        if not r["diverged"]:
            grid[(r["variant"], r["parametrization"], r["width"], r["lr"])][r["seed"]] = r["val_loss"]
    seeds = defaultdict(list)
    for (v, p, w, _), losses in grid.items():
        seeds[(v, p, w)].append(set(losses))
    best = {}
    for (v, p, w, lr), losses in grid.items():
        common = set.intersection(*seeds[(v, p, w)])
        point = (statistics.mean(losses[s] for s in common), lr, {s: losses[s] for s in common})
        if (v, p, w) not in best or point[0] < best[(v, p, w)][0]:
            best[(v, p, w)] = point
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record")
    ap.add_argument("--variant", default="ddl-cc")
    a = ap.parse_args()
    best = best_points(json.load(open(a.record))["runs"])
    print("| param | width | baseline: best lr, loss | " + a.variant + ": best lr, loss | d per seed | d mean |")
    print("| --- | ---: | --- | --- | --- | ---: |")
    for p in sorted({k[1] for k in best}, reverse=True):
        for w in sorted({k[2] for k in best if k[1] == p}):
            if (a.variant, p, w) not in best or ("baseline", p, w) not in best:
                continue
            b, v = best[("baseline", p, w)], best[(a.variant, p, w)]
            seeds = sorted(set(b[2]) & set(v[2]))
            d = [v[2][s] - b[2][s] for s in seeds]
            print(f"| {p} | {w} | {b[1]:g}, {b[0]:.3f} | {v[1]:g}, {v[0]:.3f} | "
                  f"{' / '.join(f'{x:+.3f}' for x in d)} | {statistics.mean(d):+.3f} |")


if __name__ == "__main__":
    main()
