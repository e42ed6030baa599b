"""Learning-rate transfer across width, sp vs muP (issue 11): final validation loss against learning rate.

For each variant, parametrization and width (hidden_size, heads of --head-dim, --layers blocks, the byte
vocabulary), train a fresh model for --steps AdamW steps (warm-up then cosine, weight decay 0.1, clip 1.0, the
optimizer groups of ``deep_delta.train.optim.build_optimizer``: under muP the model's lr multipliers) on random
windows of the first 90% of the embedded text, then report the mean loss over --val-batches fixed windows of
the last 10%. Each
(variant, parametrization, width, lr) runs once per seed in --seeds (the seed draws the init and the batches);
the table gives the mean over seeds with each seed's value, the best lr by the mean, and says when that best
lr is at the edge of the grid (the optimum not bracketed). Under muP the base width is --base-width (64, the
smallest width of the sweeps in docs/mup.md: the proxy one tunes at), so one width can run on its own. --set model.FIELD=VALUE sets a model field for
every run, e.g. model.tie_word_embeddings=false (muP with its zero-init readout, docs/mup.md).

    nice -n 10 .venv/bin/python benchmarks/tools/mup_sweep.py --out benchmarks/records/YYYY-MM-DD-mup-sweep-cpu
    # writes OUT/mup_sweep.json, OUT/mup_sweep.md (table, best lr per width) and OUT/mup_sweep.png

The transfer sweep of issue 25 (item 3; not run yet: about 23 hours on the shared 2-core CPU, docs/mup.md):

    nice -n 10 .venv/bin/python benchmarks/tools/mup_sweep.py --steps 300 --warmup 30 --seeds 0 1 \
        --widths 64 128 256 512 --lrs 0.001 0.002 0.004 0.008 0.016 0.032 0.064 0.128 \
        --set model.tie_word_embeddings=false --out benchmarks/records/2026-11-25-mup-sweep-transfer-cpu

Every run is recorded as it finishes (OUT/mup_sweep.json), and a rerun skips the runs already there, so an
interrupted sweep continues. docs/mup.md reports what ran on which machine.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from deep_delta.data.sources import default_texts
from deep_delta.experiments.coord_check import model_config
from deep_delta.experiments.settings import CoordCheckSettings
from deep_delta.fsutil import atomic_write, save_figure
from deep_delta.models import DDLForCausalLM


def split_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.tensor(list("\n".join(default_texts()).encode("utf-8")), dtype=torch.long)
    cut = int(tokens.numel() * 0.9)
    return tokens[:cut], tokens[cut:]


def windows(tokens: torch.Tensor, batch: int, seq: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, tokens.numel() - seq - 1, (batch,), generator=g).tolist()
    w = torch.stack([tokens[s: s + seq + 1] for s in starts])
    return w[:, :-1], w[:, 1:]


class RandomWindows:
    """The trainer's data source of a sweep run: random windows of ``tokens``, drawn with the run's generator."""

    def __init__(self, tokens: torch.Tensor, batch: int, seq: int, seed: int):
        self.tokens, self.batch, self.seq = tokens, batch, seq
        self.g = torch.Generator().manual_seed(seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return windows(self.tokens, self.batch, self.seq, self.g)


def validation_loss(model, val: torch.Tensor, args) -> float:
    """The mean loss over ``args.val_batches`` fixed windows of the held-out tokens (the same for every run)."""
    model.eval()
    gv = torch.Generator().manual_seed(1234)
    losses = []
    with torch.no_grad():
        for _ in range(args.val_batches):
            x, y = windows(val, args.batch_size, args.seq_len, gv)
            losses.append(model(x, shift_labels=y).loss.item())
    return sum(losses) / len(losses)


def train_one(variant: str, param: str, width: int, lr: float, seed: int, args, train, val) -> dict:
    """One sweep run through the package's trainer (a run kept in memory): warm-up then cosine to 0.1 x lr,
    weight decay 0.1 on matrices, betas (0.9, 0.95), clipping at 1.0; a non-finite loss ends it (diverged) with
    no update; the validation loss is measured at the end of a run that did not diverge."""
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.trainer import Trainer

    s = CoordCheckSettings(variants=(variant,), widths=(width, width), layers=args.layers, head_dim=args.head_dim,
                           seq_len=args.seq_len, model={"mup_base_width": args.base_width} | args.model)
    cfg = model_config(variant, width, param, s)
    torch.manual_seed(seed)
    model = DDLForCausalLM(cfg)
    run = TrainConfig(variant=variant, out="runs/mup_sweep/unused", steps=args.steps, batch_size=args.batch_size,
                      seq_len=args.seq_len, lr=lr, warmup_steps=args.warmup, min_lr_ratio=0.1, weight_decay=0.1,
                      betas=(0.9, 0.95), grad_clip=1.0, eval_every=0, save_every=0, log_every=0, seed=seed,
                      device="cpu", dtype="float32", on_divergence="stop")
    t0 = time.perf_counter()
    trainer = Trainer(run, model=model, batches=RandomWindows(train, args.batch_size, args.seq_len, seed),
                      evaluate=lambda m: {"val_loss": validation_loss(m, val, args)}, persist=False, progress=False,
                      quiet=True)
    result = trainer.run()
    losses = [r["loss"] for r in trainer.records if "loss" in r]
    diverged = result.diverged is not None
    return {"variant": variant, "parametrization": param, "width": width, "lr": lr, "seed": seed,
            "train_loss": float("nan") if diverged or not losses else losses[-1],
            "val_loss": float("nan") if diverged else result.evaluation["val_loss"], "diverged": diverged,
            "seconds": round(time.perf_counter() - t0, 2), "parameters": sum(p.numel() for p in model.parameters())}


def mean_losses(runs: list[dict]) -> dict:
    """{(variant, param, width, lr): (mean validation loss over seeds, [each seed's])}; a diverged seed makes the
    mean inf."""
    by: dict = {}
    for r in runs:
        loss = r["val_loss"] if not r["diverged"] and math.isfinite(r["val_loss"]) else math.inf
        by.setdefault((r["variant"], r["parametrization"], r["width"], r["lr"]), []).append(loss)
    return {k: (sum(v) / len(v), v) for k, v in by.items()}


def best_lrs(runs: list[dict]) -> dict:
    """{(variant, param, width): (best lr by the mean over seeds, whether it is at the edge of the grid run)}."""
    means = mean_losses(runs)
    best: dict = {}
    for (variant, param, width, lr), (mean, _) in means.items():
        key = (variant, param, width)
        if math.isfinite(mean) and (key not in best or mean < means[key + (best[key],)][0]):
            best[key] = lr
    return {k: (lr, lr in (min(x[3] for x in means if x[:3] == k), max(x[3] for x in means if x[:3] == k)))
            for k, lr in best.items()}


def fitted_optimum(points: list[tuple[float, float]]) -> float | None:
    """The lr at the vertex of the parabola in log2(lr) through the lowest finite loss and its two neighbours on
    the grid (a finer estimate of the optimum than the best grid point); None when the lowest is at an edge."""
    pts = sorted((lr, loss) for lr, loss in points if math.isfinite(loss))
    if len(pts) < 3:
        return None
    i = min(range(len(pts)), key=lambda j: pts[j][1])
    if i in (0, len(pts) - 1):
        return None
    (x0, y0), (x1, y1), (x2, y2) = ((math.log2(lr), loss) for lr, loss in pts[i - 1: i + 2])
    den = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / den
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / den
    if a <= 0:
        return None
    return 2.0 ** min(max(-b / (2 * a), x0), x2)


def optimum_table(runs: list[dict]) -> str:
    """Per (variant, parametrization, width): each seed's best grid lr, the fitted optimum of the mean curve and
    of each seed's (:func:`fitted_optimum`; "edge" when the lowest point is at the grid's edge), and the best mean
    loss with each seed's."""
    seeds = sorted({r.get("seed", 0) for r in runs})
    lines = ["| variant | param | width | best grid lr per seed | fitted optimum (mean) | fitted per seed | "
             "best mean loss (per seed) |", "| --- | --- | ---: | --- | ---: | --- | --- |"]
    for key in sorted({(r["variant"], r["parametrization"], r["width"]) for r in runs}):
        mine = [r for r in runs if (r["variant"], r["parametrization"], r["width"]) == key]
        per_seed = {s: [(r["lr"], r["val_loss"] if not r["diverged"] else math.inf) for r in mine
                        if r.get("seed", 0) == s] for s in seeds}
        means = {lr: m for (_, _, _, lr), (m, _) in mean_losses(mine).items()}
        best = {s: min(pts, key=lambda p: p[1]) for s, pts in per_seed.items() if pts}
        fit = fitted_optimum(list(means.items()))
        fits = {s: fitted_optimum(pts) for s, pts in per_seed.items() if pts}
        lo = min(means, key=means.get)
        each = "/".join(f"{v:.3f}" for v in mean_losses(mine)[key + (lo,)][1])
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " / ".join(f"{b[0]:g}" for b in best.values())
                     + f" | {'edge' if fit is None else f'{fit:.3g}'} | "
                     + " / ".join("edge" if f is None else f"{f:.3g}" for f in fits.values())
                     + f" | {means[lo]:.3f} ({each}) at {lo:g} |")
    return "\n".join(lines)


def table(runs: list[dict], lrs: list[float]) -> str:
    lines = ["| variant | param | width | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " | best lr |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in lrs) + " | ---: |"]
    means, best = mean_losses(runs), best_lrs(runs)
    for key in sorted({k[:3] for k in means}):
        cells = []
        for lr in lrs:
            if key + (lr,) not in means:
                cells.append("-")
                continue
            mean, each = means[key + (lr,)]
            seeds = "/".join("div" if not math.isfinite(v) else f"{v:.2f}" for v in each)
            cells.append(("diverged" if not math.isfinite(mean) else f"{mean:.3f}")
                         + (f" ({seeds})" if len(each) > 1 else ""))
        b = best.get(key)
        tail = "-" if b is None else f"{b[0]:g}" + (" (grid edge)" if b[1] else "")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + f" | {tail} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = sorted({(r["variant"], r["parametrization"]) for r in runs})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.0), squeeze=False, sharey=True)
    widths = sorted({r["width"] for r in runs})
    for ax, (variant, param) in zip(axes[0], panels):
        for i, w in enumerate(widths):
            pts = sorted((k[3], m) for k, (m, _) in mean_losses(runs).items()
                         if k[:3] == (variant, param, w) and math.isfinite(m))
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"width {w}", color=plt.cm.viridis(i / max(1, len(widths) - 1)))
        ax.set_xscale("log")
        ax.set_title(f"{variant} {param}", fontsize=9)
        ax.set_xlabel("learning rate")
    axes[0][0].set_ylabel("validation loss")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["baseline", "ddl-cc"])
    p.add_argument("--parametrizations", nargs="+", default=["sp", "mup"], choices=["sp", "mup"])
    p.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--base-width", type=int, default=64, help="muP's base width (the width it is tuned at)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--set", dest="assignments", action="append", default=[], metavar="model.FIELD=VALUE",
                   help="a model (DDLConfig) field for every run, e.g. model.tie_word_embeddings=false; repeatable")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="runs/mup_sweep")
    args = p.parse_args()
    from deep_delta.train.config import parse_assignments

    sets = parse_assignments(args.assignments)
    if set(sets) - {"model"}:
        p.error("--set takes model.FIELD=VALUE only")
    args.model = sets.get("model", {})
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = out / "mup_sweep.json"
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "threads", "lrs", "widths", "variants",
                                                                  "parametrizations", "seeds", "assignments")}
    runs: list[dict] = []
    if record.exists():
        old = json.loads(record.read_text())
        there = old.get("settings", {})
        if there != settings:
            differ = ", ".join(f"{k}: {there.get(k)!r} there, {settings.get(k)!r} here"
                               for k in sorted(set(settings) | set(there)) if settings.get(k) != there.get(k))
            p.error(f"{record} holds runs with other settings ({differ}); use another --out")
        runs = old["runs"]
    train, val = split_tokens()
    for variant in args.variants:
        for param in args.parametrizations:
            for width in args.widths:
                for lr in args.lrs:
                    for seed in args.seeds:
                        if any((r["variant"], r["parametrization"], r["width"], r["lr"], r.get("seed", 0))
                               == (variant, param, width, lr, seed) for r in runs):
                            continue
                        r = train_one(variant, param, width, lr, seed, args, train, val)
                        runs.append(r)
                        print(f"{variant} {param} width {width} lr {lr:g} seed {seed}: val {r['val_loss']:.4f} "
                              f"({'diverged, ' if r['diverged'] else ''}{r['seconds']} s)", flush=True)
                        atomic_write(record, json.dumps({"settings": settings, "runs": runs}, indent=2))
    lrs = sorted({r["lr"] for r in runs})
    md = table(runs, lrs)
    drawn = plot(runs, out / "mup_sweep.png")
    atomic_write(out / "mup_sweep.md", "# muP learning-rate sweep\n\nValidation loss after "
                 f"{args.steps} steps of {args.batch_size} x {args.seq_len} tokens ({json.dumps(settings)}).\n\n"
                 f"{md}\n\nThe optimum per width ({', '.join(f'seed {x}' for x in sorted({r.get('seed', 0) for r in runs}))}):"
                 f"\n\n{optimum_table(runs)}\n" + ("\n![sweep](mup_sweep.png)\n" if drawn else ""))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
