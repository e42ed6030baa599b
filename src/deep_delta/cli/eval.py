"""``ddl eval``: validation loss / perplexity on a token split, and lm-evaluation-harness benchmarks."""

from __future__ import annotations

import argparse
import json
import sys

from deep_delta.cli import options


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a trained model (validation loss, lm-evaluation-harness)",
        description="Evaluate a trained model. `ddl eval loss`: loss and perplexity on a prepared token split. "
        "`ddl eval lm-eval`: lm-evaluation-harness tasks (default: the paper's eight), 0-shot and 1-shot, "
        "as a Table-1-style markdown table.",
    )
    evsub = p.add_subparsers(dest="eval_command", metavar="EVAL_COMMAND")
    p.set_defaults(func=lambda args: _missing(p))

    lo = evsub.add_parser(
        "loss",
        help="validation loss and perplexity on a token split",
        description="Mean next-token loss (nats/token) and perplexity of the model on SPLIT of a data directory "
        "made by `ddl data prepare` (a deterministic pass over sequential windows).",
    )
    options.add_model(lo)
    lo.add_argument("--data", required=True, metavar="DIR", help="prepared data directory")
    lo.add_argument("--split", default="val", help="split to evaluate (default val)")
    lo.add_argument("--max-batches", type=options.integer, default=None, metavar="N", help="evaluate at most N batches")
    add_eval_windows(lo)
    lo.add_argument("--by-source", action="store_true",
                    help="also the loss of each named source of the data (prose-v1: each package), where meta.json "
                    "records where their tokens lie (said in one line where it does not)")
    options.add_batch(lo, "sequences per batch (default 8)", "tokens per sequence (default: the model's context)",
                      batch_default=8)
    options.add_device(lo)
    options.add_dtype(lo, weights=True, default="float32")
    options.add_threads(lo, default=None)
    lo.add_argument("--json", action="store_true", help="print the result as JSON")
    lo.set_defaults(func=run_loss)

    from deep_delta.eval.harness import METRIC_CHOICES, PAPER_TASKS

    lm = evsub.add_parser(
        "lm-eval",
        help="lm-evaluation-harness tasks as a Table-1-style table",
        description="Run lm-evaluation-harness (optional extra: pip install 'deep-delta-learning[eval]') on "
        "each --model for each --num-fewshot, print a markdown table (one row per model and shot count, one "
        "column per task, then the average, in percent) and write it to --out (full results beside it as JSON).",
    )
    options.add_model(lm, repeat=True, help=options.MODEL_HELP + "; repeat to compare models")
    lm.add_argument("--name", action="append", default=None, metavar="NAME",
                    help="row label per --model (default: the variant's paper name)")
    lm.add_argument("--tasks", nargs="+", default=list(PAPER_TASKS), metavar="TASK",
                    help=f"lm-eval tasks, space-separated (default: {' '.join(PAPER_TASKS)})")
    lm.add_argument("--num-fewshot", nargs="+", default=["0", "1"], metavar="N",
                    help="few-shot counts, space-separated; one table row per model and count (default 0 1)")
    lm.add_argument("--limit", type=options.real, default=None, metavar="N",
                    help="at most N examples per task (N < 1: that fraction); for quick checks only")
    options.add_batch(lm, "requests scored per forward (default 8)", None, batch_default=8)
    options.add_device(lm)
    options.add_dtype(lm, weights=True)
    options.add_threads(lm, default=None)
    lm.add_argument("--tokenizer", default=None, choices=["byte", "gpt2"], help="override the saved tokenizer")
    lm.add_argument("--include-path", action="append", default=None, metavar="DIR",
                    help="extra directory of lm-eval task YAMLs (repeatable)")
    lm.add_argument("--metric", default="paper", choices=list(METRIC_CHOICES),
                    help="metric in the table: paper (acc_norm for ARC, HellaSwag, OpenBookQA, PIQA; acc otherwise), "
                    "acc or acc_norm (default paper)")
    lm.add_argument("--out", default="lm_eval_results.md", metavar="FILE",
                    help="markdown file to write (default lm_eval_results.md; results JSON beside it)")
    options.add_seed(lm, "seed of lm-eval's few-shot sampling (default 1234)", default=1234)
    options.add_wandb(lm, "the results table (one W&B run)")
    lm.set_defaults(func=run_lm_eval)


def add_eval_windows(p: argparse.ArgumentParser) -> None:
    """``--eval-windows``: TrainConfig's field (its choices and default), for a pass of part of a split."""
    from deep_delta.train.config import TrainConfig

    field = TrainConfig.__dataclass_fields__["eval_windows"]
    p.add_argument("--eval-windows", choices=field.metadata["choices"], default=field.default,
                   help="with --max-batches: which windows of the split, spread (evenly over the whole split) or first "
                   f"(its first windows, as runs before this option read them) (default {field.default})")


def _missing(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def run_loss(args: argparse.Namespace) -> int:
    from deep_delta.eval.loss import evaluate_loss
    from deep_delta.hf.loading import load_model, quiet_transformers

    quiet_transformers()
    options.apply_threads(args.threads)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, require_tokenizer=False)
    _check_data_tokenizer(args.data, loaded)
    res = evaluate_loss(loaded.model, args.data, split=args.split, batch_size=args.batch_size,
                        seq_len=args.seq_len, max_batches=args.max_batches, eval_windows=args.eval_windows,
                        by_source=args.by_source, progress=sys.stderr.isatty())
    if args.json:
        print(json.dumps({"model": str(loaded.source.model_dir), **res.to_dict()}, indent=2))
    else:
        print(f"model       {loaded.source.model_dir}")
        print(f"data        {args.data} (split {res.split}, {res.batches} batches x seq_len {res.seq_len}, "
              f"{res.tokens:,} tokens, {res.windows})")
        print(f"val loss    {res.loss:.4f}")
        print(f"perplexity  {res.perplexity:.4f}")
        if res.sources_note:
            print(f"no loss per source: split {res.split} of {args.data} records no sources ({res.sources_note})")
        elif res.sources:
            width = max(len("source"), *map(len, res.sources))
            print(f"\n{'source':<{width}}  {'tokens':>12}  {'loss':>7}")
            for name, x in res.sources.items():
                print(f"{name:<{width}}  {x['tokens']:>12,}  {x['loss']:>7.4f}")
    return 0


def _check_data_tokenizer(data_dir: str, loaded) -> None:
    """A data directory tokenized differently from the model's training data gives meaningless losses."""
    from pathlib import Path

    meta_path = Path(data_dir) / "meta.json"
    if not meta_path.is_file() or loaded.tokenizer_name is None:
        return
    try:
        data_tok = json.loads(meta_path.read_text()).get("tokenizer")
    except json.JSONDecodeError:
        return
    if data_tok is not None and data_tok != loaded.tokenizer_name:
        raise ValueError(
            f"--data: {data_dir} was tokenized with {data_tok!r}, but the model was trained with "
            f"{loaded.tokenizer_name!r}; prepare the data with the model's tokenizer"
        )


def _int_list(values: list[str], flag: str) -> list[int]:
    try:
        out = [int(x) for x in values]
    except ValueError:
        raise ValueError(f"{flag}: got {' '.join(values)!r}; allowed: integers >= 0, e.g. 0 1") from None
    if not out or any(x < 0 for x in out):
        raise ValueError(f"{flag}: got {' '.join(values)!r}; allowed: integers >= 0, e.g. 0 1")
    return out


def run_lm_eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deep_delta.cli.main import UsageError
    from deep_delta.eval import harness
    from deep_delta.fsutil import refuse_replaced_dir, refuse_unwritable_results
    from deep_delta.hf.loading import load_model, quiet_transformers
    from deep_delta.variants import paper_name

    quiet_transformers()

    try:
        harness.require_lm_eval()
    except ImportError as e:
        raise UsageError(str(e)) from None
    project = options.wandb_project(args)
    options.apply_threads(args.threads)
    shots = _int_list(args.num_fewshot, "--num-fewshot")
    tasks = list(args.tasks)
    if args.name is not None and len(args.name) != len(args.model):
        raise ValueError(f"--name: got {len(args.name)} names for {len(args.model)} --model paths; give one per model")
    if args.limit is not None and args.limit <= 0:
        raise ValueError(f"--limit: got {args.limit}; allowed: a number > 0")
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    # refuse unknown task names and an unwritable result before loading any model
    tasks = harness.check_tasks(tasks, harness.task_manager(args.include_path, tasks))
    refuse_replaced_dir(args.out)
    refuse_unwritable_results([Path(args.out), Path(args.out).with_suffix(".json")])
    runs = []
    for i, path in enumerate(args.model):
        loaded = load_model(path, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer)
        cfg = loaded.model.config
        name = args.name[i] if args.name else paper_name(cfg.variant) if cfg.variant else str(path)
        lm = harness.make_harness_lm(loaded.model, loaded.tokenizer, batch_size=args.batch_size)
        try:
            runs.append(harness.evaluate_harness(lm, tasks, num_fewshot=shots, limit=limit,
                                                 include_path=args.include_path, name=name, seed=args.seed))
        except RuntimeError as e:
            raise UsageError(str(e)) from None
        del loaded, lm
    table = harness.results_table(runs, tasks, args.metric)
    header = "# lm-evaluation-harness results"
    if limit is not None:
        header += f"\n\n(--limit {limit}: a subset of each task; not comparable with full runs)"
    out = harness.write_results(args.out, table, runs, header)
    print(table)
    print(f"\nwrote {out} and {out.with_suffix('.json')}")
    if args.wandb:
        config = {"models": [str(m) for m in args.model], "names": [r.name for r in runs], "tasks": tasks,
                  "num_fewshot": shots, "limit": limit, "metric": args.metric, "seed": args.seed,
                  "batch_size": args.batch_size, "dtype": args.dtype}
        harness.log_to_wandb(runs, tasks, args.metric, config=config, directory=out.parent, project=project)
    return 0
