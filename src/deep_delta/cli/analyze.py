"""``ddl analyze``: what a trained model does with its residual (DDL's beta and k, HC / mHC's stream
coefficients), per sublayer, over a data sample."""

from __future__ import annotations

import argparse
from pathlib import Path

from deep_delta.cli import options


def add_parser(sub) -> None:
    p = sub.add_parser(
        "analyze",
        help="look inside a trained model: DDL's beta regimes, erasure, directions and values, or HC / mHC's "
        "stream coefficients, per sublayer",
        description="Run the model at --model over windows of a prepared data split and report, per sublayer, "
        "what its residual does. Delta sublayers (DDL): the gate beta (mean, quantiles, share of tokens in the "
        "identity (< 0.1), projection (0.9-1.1) and reflection (> 1.9) regimes), how much of the state's "
        "k-component each update erases (|k^T X| after / before, sign flips), the cosine between successive "
        "directions k, the values v, and for d_v > 1 how far each compressor has moved from the plain mean read; "
        "figures beta_regimes.png, beta_quantiles.png. Hyper-connections (HC / mHC): the read and write weights "
        "per stream (mean and spread over tokens), the mean mixing matrix, its distance from the identity and "
        "its row / column sum error, and how far the streams drift apart (pairwise cosine, relative spread); "
        "figures stream_weights.png, stream_mixing.png, stream_drift.png. Writes OUT/analysis.json, "
        "OUT/analysis.md and the figures. Every model with a DeltaResidual (the baseline too): the state's norm "
        "entering and leaving each sublayer and the update's (state_norms.png); DDL: also the share of the state "
        "each update erases along k (0 for the write-only control, beside what the delta rule would erase).",
    )
    options.add_model(p)
    p.add_argument("--data", default=None, metavar="DIR", help="prepared data directory (default: the embedded text)")
    p.add_argument("--split", default="val", help="split to read (default val)")
    options.add_batch(p, "windows per batch (default 8)", "tokens per window (default: the model's context, "
                      "at most 256)", batch_default=8)
    p.add_argument("--batches", type=options.integer, default=4, metavar="N", help="batches to analyse (default 4)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output directory, never inside a checkpoint, model or data directory (those are rotated or "
                   "replaced by our commands). Default: RUN/analysis for a run, RUN/analysis/step_N for one of its "
                   "checkpoints, runs/analysis/NAME for another model directory")
    options.add_device(p)
    options.add_threads(p)
    options.add_progress(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from deep_delta.data import TokenLoader, default_data_dir
    from deep_delta.experiments.analyze import analyze_model, format_analysis, plot_analysis
    from deep_delta.experiments.report import figures_note, has_matplotlib
    from deep_delta.fsutil import atomic_write, refuse_replaced_dir, refuse_unwritable_results
    from deep_delta.hf.loading import load_model, quiet_transformers, resolve_model_dir

    out = Path(args.out) if args.out else default_out(resolve_model_dir(args.model))
    refuse_replaced_dir(out)  # before the model runs: a refused --out costs nothing
    refuse_unwritable_results([out / "analysis.json", out / "analysis.md"])
    data = Path(args.data) if args.data else default_data_dir()
    quiet_transformers()
    options.apply_threads(args.threads)
    loaded = load_model(args.model, device=args.device, dtype="float32", require_tokenizer=False)
    model = loaded.model
    seq_len = args.seq_len or min(256, model.config.max_position_embeddings)
    loader = TokenLoader(data, args.split, args.batch_size, seq_len, vocab_size=model.config.vocab_size)
    device = next(model.parameters()).device
    # the first windows of the split, as the analyses docs/evidence.md and docs/rivals.md quote were made
    batches = loader.eval_batches(args.batches, windows="first")
    report = analyze_model(model, batches, device=device, progress=not args.no_progress)
    report.update(model=str(args.model), data=str(data), split=args.split, seq_len=seq_len)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "analysis.json", json.dumps(report, indent=2))
    table = format_analysis(report)
    drawn = has_matplotlib()  # without the plot extra: the tables alone, saying which extra draws the figures
    figures = plot_analysis(report, out) if drawn else []
    images = "".join(f"\n\n![{f.stem.replace('_', ' ')}]({f.name})" for f in figures)
    note = "" if drawn else f"\n\n{figures_note()}"
    atomic_write(out / "analysis.md", f"# ddl analyze {args.model}\n\n{report['windows']} windows of {seq_len} "
                 f"tokens from {data} ({args.split}).\n\n{table}{images}{note}\n")
    print(table)
    print(f"wrote {out}/analysis.json, analysis.md" + "".join(f", {f.name}" for f in figures)
          + ("" if drawn else f"; {figures_note()}"))
    return 0


def default_out(source) -> Path:
    """Where the analysis of ``source`` (a :class:`~deep_delta.hf.loading.ModelSource`) goes without ``--out``:
    RUN/analysis for a run, RUN/analysis/step_N for one of its checkpoints (training rotates the checkpoints, not
    the run directory), runs/analysis/NAME for any other model directory (export replaces those)."""
    ckpt = source.model_dir.resolve()
    if ckpt.parent.name == "checkpoints":
        run = ckpt.parent.parent
        return run / "analysis" if source.kind == "run" else run / "analysis" / ckpt.name
    return Path("runs/analysis") / ckpt.name
