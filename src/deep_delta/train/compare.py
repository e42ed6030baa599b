"""Train several variants with the same seed, data and token budget, and compare them side by side.

Outputs in ``OUT``: one run directory per variant (``OUT/<variant>/``, a normal training run), ``compare.md``
(a Table-3-style table), ``compare.json`` (the same numbers plus settings and machine) and ``curves.png``
(training and validation loss against optimizer steps).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from deep_delta.train.checkpoint import run_lock
from deep_delta.train.config import TrainConfig
from deep_delta.train.metrics import read_metrics

DEFAULT_VARIANTS = ("baseline", "ddl-dv1", "ddl-tc", "ddl-cc")

# The main job's defaults: the tiny preset (d=256, 4 layers, 4 heads) on the embedded text, sized so that the
# four default variants finish in about ten minutes on 2 CPU cores (see docs/training.md for the measurement).
COMPARE_DEFAULTS: dict[str, Any] = dict(
    preset="tiny",
    steps=600,
    batch_size=16,
    seq_len=64,
    lr=2e-3,
    min_lr_ratio=0.1,
    warmup_steps=60,
    eval_every=100,
    eval_batches=16,
    save_every=100,  # an interrupted `ddl compare` continues from here
    keep=1,
    log_every=5,
    seed=0,
)


def compare_config(base: TrainConfig, variant: str, out: Path) -> TrainConfig:
    """The run of ``variant``: ``base`` with its own variant and run directory."""
    return replace(base, variant=variant, out=str(out / variant))


def _check_same_budget(cfg: TrainConfig, *, overwrite: bool) -> None:
    """A run reused by compare must have been trained for the same number of steps."""
    run_file = Path(cfg.out) / "run.json"
    if overwrite or not run_file.is_file():
        return
    saved = json.loads(run_file.read_text()).get("train_config", {})
    if saved.get("steps") != cfg.steps:
        raise FileExistsError(
            f"{cfg.out} holds a run of {saved.get('steps')} steps, this comparison asks for {cfg.steps}; pass "
            "`overwrite` to retrain it, or another `out`"
        )


def run_compare(
    base: TrainConfig,
    variants: list[str] | tuple[str, ...] = DEFAULT_VARIANTS,
    out: str | os.PathLike = "runs/compare",
    *,
    overwrite: bool = False,
    progress: bool = True,
    quiet: bool = False,
) -> dict[str, Any]:
    """Train every variant (``base`` with the variant swapped in, run directory ``out/<variant>``) and
    write the comparison. A finished identical run in ``out`` is reused and an interrupted one continued;
    a run with other settings is refused unless ``overwrite``. Returns the summary (also ``compare.json``).
    ``out`` is locked while the comparison runs (a second compare on it is refused)."""
    out = Path(out)
    variants = list(dict.fromkeys(variants))
    if not variants:
        raise ValueError("compare: `variants` is empty; allowed: one or more variant names")
    configs = [compare_config(base, v, out) for v in variants]  # validated before anything runs
    for cfg in configs:
        _check_same_budget(cfg, overwrite=overwrite)
    with run_lock(out, "ddl compare"):
        return _train_and_summarize(base, configs, variants, out, overwrite=overwrite, progress=progress,
                                    quiet=quiet)


def _train_and_summarize(base: TrainConfig, configs: list[TrainConfig], variants: list[str], out: Path, *,
                         overwrite: bool, progress: bool, quiet: bool) -> dict[str, Any]:
    from deep_delta.train.trainer import NonFiniteLossError, train

    t0 = time.perf_counter()
    walls: dict[str, float] = {}
    diverged: dict[str, str] = {}
    for i, cfg in enumerate(configs, 1):
        if not quiet:
            print(f"[{i}/{len(configs)}] {cfg.variant}", flush=True)
        t = time.perf_counter()
        try:
            train(cfg, resume=True, overwrite=overwrite, progress=progress,
                  desc=f"[{i}/{len(configs)}] {cfg.variant}", quiet=quiet)
        except NonFiniteLossError as e:  # a diverging variant is a result too: report it, train the others
            diverged[cfg.variant] = str(e)
            if not quiet:
                print(f"[{i}/{len(configs)}] {cfg.variant}: {e}", flush=True)
        walls[cfg.variant] = time.perf_counter() - t
    summary = summarize(out, variants, base, diverged=diverged)
    summary["wall_s"] = time.perf_counter() - t0
    summary["train_wall_s"] = walls
    write_outputs(out, summary)
    return summary


def _median_tokens_per_s(records: list[dict]) -> float | None:
    rates = [r["tokens_per_s"] for r in records if "loss" in r and "tokens_per_s" in r]
    if len(rates) > 1:
        rates = rates[1:]  # the first step pays for warm-up (allocations, compilation)
    return statistics.median(rates) if rates else None


def summarize(out: str | os.PathLike, variants: list[str], base: TrainConfig | None = None,
              diverged: dict[str, str] | None = None) -> dict[str, Any]:
    """Rows of the comparison from the run directories ``out/<variant>`` (their metrics.jsonl and run.json).
    ``diverged`` maps variants whose loss became non-finite to the trainer's message: they get no val loss."""
    import torch

    from deep_delta.models.ddl.configuration_ddl import PAPER_NAMES

    out = Path(out)
    rows = []
    for v in variants:
        run_dir = out / v
        records = read_metrics(run_dir)
        train_recs = [r for r in records if "loss" in r]
        vals = [r for r in records if "val_loss" in r]
        run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else {}
        rows.append({
            "variant": v,
            "name": PAPER_NAMES.get(v, v),
            "parameters": run.get("parameters"),
            "steps": train_recs[-1]["step"] if train_recs else 0,
            "tokens": train_recs[-1]["tokens"] if train_recs else 0,
            "final_train_loss": train_recs[-1]["loss"] if train_recs else None,
            "val_loss": vals[-1]["val_loss"] if vals else None,
            "val_ppl": vals[-1]["val_ppl"] if vals else None,
            "tokens_per_s": _median_tokens_per_s(records),
            "diverged": (diverged or {}).get(v),
        })
        if rows[-1]["diverged"]:
            rows[-1]["val_loss"] = rows[-1]["val_ppl"] = None
    ref = next((r for r in rows if r["variant"] == "baseline"), rows[0])
    for r in rows:
        r["reference"] = ref["variant"]
        r["d_val_loss"] = _diff(r["val_loss"], ref["val_loss"])
        r["d_val_ppl"] = _diff(r["val_ppl"], ref["val_ppl"])
        r["d_parameters_pct"] = (
            100.0 * (r["parameters"] - ref["parameters"]) / ref["parameters"]
            if r["parameters"] and ref["parameters"] else None
        )
        r["speed_ratio"] = (
            r["tokens_per_s"] / ref["tokens_per_s"] if r["tokens_per_s"] and ref["tokens_per_s"] else None
        )
    return {
        "rows": rows,
        "reference": ref["variant"],
        "settings": base.to_dict() if base is not None else None,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        },
    }


def _diff(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def _fmt(x: float | None, spec: str, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, ("+" if signed else "") + spec)


def format_table(summary: dict[str, Any]) -> str:
    """The comparison as a markdown table (the columns of the paper's Table 3 plus cost)."""
    ref = summary["reference"]
    head = ("| model | variant | params | val loss | ppl | d loss | d ppl | train tok/s | speed |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    lines = [head]
    for r in summary["rows"]:
        params = f"{r['parameters']:,}" if r["parameters"] else "-"
        if r["variant"] != ref and r["d_parameters_pct"] is not None:
            params += f" ({r['d_parameters_pct']:+.2f}%)"
        is_ref = r["variant"] == ref
        val = "diverged" if r.get("diverged") else _fmt(r["val_loss"], ".4f")
        lines.append(
            f"| {r['name']} | {r['variant']} | {params} | {val} | {_fmt(r['val_ppl'], '.3f')} "
            f"| {'-' if is_ref else _fmt(r['d_val_loss'], '.4f', True)} "
            f"| {'-' if is_ref else _fmt(r['d_val_ppl'], '.3f', True)} "
            f"| {_fmt(r['tokens_per_s'], ',.0f')} | {_fmt(r['speed_ratio'], '.2f')}x |"
        )
    return "\n".join(lines)


def format_report(summary: dict[str, Any]) -> str:
    """``compare.md``: the table with the settings and the machine it was measured on."""
    s = summary.get("settings") or {}
    m = summary["machine"]
    rows = summary["rows"]
    tokens = rows[0]["tokens"] if rows else 0
    notes = [f"- {r['variant']}: {r['diverged']}" for r in rows if r.get("diverged")]
    lines = [
        "# Variant comparison",
        "",
        format_table(summary),
        "",
        *([*notes, ""] if notes else []),
        f"d loss / d ppl: difference to `{summary['reference']}` (negative is better). train tok/s: median over "
        "the optimizer steps after the first (training only; validation excluded); speed: ratio to the reference.",
        "",
        f"Same seed ({s.get('seed')}), data ({s.get('data') or 'the embedded default text'}) and token budget for "
        f"every variant: preset {s.get('preset')}, {s.get('steps')} steps x {s.get('batch_size')} x "
        f"{s.get('seq_len')} tokens ({tokens:,} tokens), lr {s.get('lr')} (warm-up {s.get('warmup_steps')}, "
        f"cosine to {s.get('min_lr_ratio')} x lr), validation on {s.get('eval_batches')} batches every "
        f"{s.get('eval_every')} steps.",
        "",
        f"Machine: {m['device'] if m['device'] != 'cpu' else 'CPU only (no GPU)'}, {m['cpu_count']} CPU cores ({m['processor']}), torch {m['torch']} with "
        f"{m['torch_threads']} thread(s). Wall time {summary.get('wall_s', 0):.0f} s.",
        "",
        "![training and validation loss](curves.png)",
        "",
    ]
    return "\n".join(lines)


def plot_curves(out: str | os.PathLike, variants: list[str], path: str | os.PathLike) -> Path:
    """Training loss (light: per step; dark: moving average) and validation loss against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from deep_delta.models.ddl.configuration_ddl import PAPER_NAMES

    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, v in enumerate(variants):
        color = f"C{i}"
        records = read_metrics(Path(out) / v)
        tr = [(r["step"], r["loss"]) for r in records if "loss" in r]
        va = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
        if tr:
            steps, losses = zip(*tr)
            ax_t.plot(steps, losses, color=color, alpha=0.25, linewidth=0.8)
            ax_t.plot(steps, _moving_average(losses, max(1, len(losses) // 20)), color=color,
                      label=PAPER_NAMES.get(v, v))
        if va:
            steps, losses = zip(*va)
            ax_v.plot(steps, losses, "o-", color=color, markersize=3, label=PAPER_NAMES.get(v, v))
    for ax, title in ((ax_t, "training loss"), (ax_v, "validation loss")):
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss (nats / token)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _moving_average(xs, window: int) -> list[float]:
    """Trailing mean over up to ``window`` points (same length as ``xs``)."""
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x
        if i >= window:
            total -= xs[i - window]
        out.append(total / min(i + 1, window))
    return out


def write_outputs(out: str | os.PathLike, summary: dict[str, Any]) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    variants = [r["variant"] for r in summary["rows"]]
    plot_curves(out, variants, out / "curves.png")
    (out / "compare.md").write_text(format_report(summary))
    (out / "compare.json").write_text(json.dumps(summary, indent=2))
