"""One figure of several ``ddl analyze`` reports side by side, through the depth: the state each sublayer reads
(the residual state's mean norm per token entering it, for every model with a ``DeltaResidual``; for Attention
Residuals the norm of the depth attention's output it reads), the share of the state each DDL update erases, and the
untied gates' means. For a study's "why": one model per variant, the same data sample.

    python benchmarks/tools/why_figure.py --out why.png LABEL=path/analysis.json [LABEL=path/analysis.json ...]

Bad input is refused in one line on stderr (exit 1) before anything is written: an ``--out`` that is not an image
matplotlib writes (its suffix) or whose folder does not exist, a report that is missing, not JSON, or not a
``ddl analyze`` report (an object with its ``windows``, ``probes`` and at least one of ``states``, ``depth``,
``sublayers``: a compare.json is not one).
"""

from __future__ import annotations

import argparse
from pathlib import Path

FIGURE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg", "tif", "tiff", "webp", "eps", "ps")
REPORT = "a `ddl analyze` report (the analysis.json it writes)"
SECTIONS = ("states", "depth", "sublayers")  # what the figure draws from


class Refused(Exception):
    """Bad input: main prints it as one line and exits 1."""


def read_report(item: str) -> tuple[str, dict]:
    """``LABEL=path`` as (label, the report there), the report checked to be one ``ddl analyze`` wrote."""
    from deep_delta.fsutil import read_json_file

    label, sep, path = item.partition("=")
    if not sep or not label or not Path(path).is_file():
        raise Refused(f"got {item!r}; allowed: LABEL=path/to/analysis.json (an existing file)")
    report = read_json_file(path, REPORT)
    if not isinstance(report, dict):
        raise Refused(f"{path} is not {REPORT}: it holds a JSON {type(report).__name__}, not an object")
    missing = [k for k in ("windows", "probes") if k not in report]
    if missing or not any(isinstance(report.get(k), dict) and report[k] for k in SECTIONS):
        what = f"it has no {' or '.join(missing)}" if missing else f"it has none of {', '.join(SECTIONS)}"
        raise Refused(f"{path} is not {REPORT}: {what}; allowed: the analysis.json of `ddl analyze --model RUN` (an "
                      f"object with windows, probes and at least one of {', '.join(SECTIONS)})")
    return label, report


def check_out(path: Path) -> None:
    """Refuse, before anything is read or drawn, an ``--out`` matplotlib cannot write: a suffix it has no writer for
    (``.json``, ``.md``, none), or a folder that does not exist."""
    if path.suffix.lower().lstrip(".") not in FIGURE_FORMATS:
        raise Refused(f"--out got {str(path)!r}; allowed: a path ending in one of "
                      f"{', '.join('.' + f for f in FIGURE_FORMATS)} (an image matplotlib writes)")
    if not path.parent.is_dir():
        raise Refused(f"--out got {str(path)!r}, but its folder {path.parent} does not exist; allowed: a path in an "
                      "existing folder")


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", metavar="LABEL=ANALYSIS_JSON")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        check_out(Path(args.out))
        runs = []
        for item in args.reports:
            label, report = read_report(item)
            try:
                runs.append((label, series(report)))
            except (KeyError, TypeError, AttributeError, IndexError) as e:
                raise Refused(f"{item.partition('=')[2]} is not {REPORT}: its {', '.join(SECTIONS)} are not as "
                              f"`ddl analyze` writes them ({type(e).__name__}: {e})") from None
        draw(runs, Path(args.out))
    except (Refused, ValueError, OSError) as e:  # bad input: one line, never a traceback
        raise SystemExit(f"why_figure.py: {e}") from None
    print(f"wrote {args.out}")
    return 0


def draw(runs: list[tuple[str, dict[str, list[float]]]], out: Path) -> None:
    """The three panels, one line per report, written to ``out``."""
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
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
