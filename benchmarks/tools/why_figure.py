"""One figure of several ``ddl analyze`` reports side by side, through the depth: the state each sublayer reads
(the residual state's mean norm per token entering it, for every model with a ``DeltaResidual``; for Attention
Residuals the norm of the depth attention's output it reads), the share of the state each DDL update erases, and the
untied gates' means. For a study's "why": one model per variant, the same data sample.

    python benchmarks/tools/why_figure.py --out why.png LABEL=path/analysis.json [LABEL=path/analysis.json ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def series(report: dict) -> dict[str, list[float]]:
    """What the figure draws of one report, each a list over the sublayers in order (empty when it has none)."""
    out: dict[str, list[float]] = {"state": [], "erased": [], "erase gate": [], "write gate": []}
    if report.get("states"):
        rows = list(report["states"].values())
        out["state"] = [r["norm_before"] for r in rows] + [rows[-1]["norm_after"]]
    elif report.get("depth"):
        out["state"] = [r["read_norm"] for r in report["depth"].values()]
    for r in (report.get("sublayers") or {}).values():
        out["erased"].append(r.get("erased") or 0.0)
        if "write_gate" in r:
            out["erase gate"].append(r["beta"]["mean"])
            out["write gate"].append(r["write_gate"]["mean"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", metavar="LABEL=ANALYSIS_JSON")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    runs = []
    for item in args.reports:
        label, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"why_figure.py: got {item!r}; allowed: LABEL=path/to/analysis.json (an existing file)")
        runs.append((label, series(json.loads(Path(path).read_text()))))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_s, ax_e, ax_g) = plt.subplots(1, 3, figsize=(16, 4.2))
    for i, (label, s) in enumerate(runs):
        color = f"C{i}"
        if s["state"]:
            ax_s.plot(range(len(s["state"])), s["state"], "o-", color=color, markersize=3, label=label)
        if any(s["erased"]):
            ax_e.plot(range(len(s["erased"])), s["erased"], "o-", color=color, markersize=3, label=label)
        for key, style in (("erase gate", "o-"), ("write gate", "s--")):
            if s[key]:
                ax_g.plot(range(len(s[key])), s[key], style, color=color, markersize=3, label=f"{label}: {key}")
    ax_s.set_yscale("log")
    from matplotlib.ticker import MaxNLocator
    for ax, title, ylabel in ((ax_s, "the state each sublayer reads", "mean norm per token (log)"),
                              (ax_e, "share of the state an update erases", "beta |k^T X| / |X|"),
                              (ax_g, "the untied gates (both start at 1)", "gate mean")):
        ax.set_title(title)
        ax.set_xlabel("sublayer (attention, MLP, ...; the last state point: the output)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
