"""``ddl train``: train a variant from a YAML config and/or command-line settings (also under torchrun)."""

from __future__ import annotations

import argparse

from deep_delta.cli import options

# help of every TrainConfig field; the flag is --field-name, the default is TrainConfig's (added to the help)
FIELD_HELP = {
    "variant": "model variant",
    "preset": "model size: tiny (CPU), small (124M), medium (353M)",
    "data": "prepared data directory (none: the embedded text, prepared once into a cache)",
    "out": "run directory: metrics.jsonl, run.json, checkpoints/",
    "steps": "total optimizer steps of the run (also the length of the cosine schedule)",
    "batch_size": "sequences per micro-batch on each process",
    "grad_accum": "micro-batches per optimizer step (ignored when --global-batch-size is set)",
    "global_batch_size": "sequences per optimizer step over all processes; derives grad_accum",
    "seq_len": "tokens per sequence",
    "lr": "peak learning rate",
    "min_lr_ratio": "final learning rate as a fraction of --lr",
    "warmup_steps": "linear warm-up steps",
    "weight_decay": "AdamW weight decay on matrices",
    "betas": "AdamW betas",
    "grad_clip": "clip the gradient norm to this (0: off)",
    "eval_every": "validate every N steps (0: only at the end)",
    "eval_batches": "validation batches per evaluation",
    "save_every": "checkpoint every N steps (0: only at the end)",
    "keep": "keep the newest K checkpoints",
    "log_every": "print / update the progress bar every N steps (0: never)",
    "seed": "seed of the initialisation and the data order",
    "device": "; under torchrun, cuda is each process's LOCAL_RANK GPU",  # after options.DEVICE_HELP
    "dtype": "",  # options.add_dtype's text
    "compile": "torch.compile each block",
    "activation_checkpointing": "checkpoint each block: rerun its forward in backward (less activation memory)",
    "distributed": "under torchrun: auto (DDP when several processes), none, ddp or fsdp (FSDP2)",
    "tensorboard": "also write TensorBoard scalars to OUT/tensorboard",
    "peak_flops": "peak FLOP/s of one device for MFU (none: looked up for known GPUs; none on CPU)",
}


def add_parser(sub) -> None:
    from deep_delta.train.config import DTYPES, TrainConfig
    from deep_delta.variants import PRESETS, VARIANTS

    p = sub.add_parser(
        "train",
        help="train a baseline or DDL model",
        description="Train VARIANT at PRESET on prepared token data. Settings come from the defaults, then "
        "--config (a YAML file or a shipped name such as small/ddl-cc; see --list-configs), then the flags "
        "below and --set KEY=VALUE. Writes OUT/metrics.jsonl (one JSON object per optimizer step, validation "
        "records beside them) and atomic checkpoints OUT/checkpoints/step_N (a Hugging Face model directory "
        "plus the training state). Run it under `torchrun --nproc_per_node N` for DDP or --distributed fsdp.",
    )
    p.add_argument("--config", metavar="FILE|NAME",
                   help="YAML config: a path, or a shipped name (tiny/ddl-cc; see --list-configs); default: none")
    options.add_set(p)
    p.add_argument("--resume", action="store_true",
                   help="continue the run in OUT from its latest checkpoint up to --steps (fresh if none)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in OUT")
    p.add_argument("--stop-at", type=options.integer, metavar="N",
                   help="end this session after step N (checkpointed) without shortening the schedule")
    options.add_progress(p)
    options.add_threads(p, default=None)  # torchrun processes share the cores: PyTorch's choice unless asked
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.add_argument("--list-configs", action="store_true", help="list the shipped config names and exit")
    g = p.add_argument_group("settings (override the config file)")
    choices = {"variant": list(VARIANTS), "preset": list(PRESETS),
               "distributed": ["auto", "none", "ddp", "fsdp"]}
    integer, real = options.integer, options.real
    kinds = {"steps": integer, "batch_size": integer, "grad_accum": integer, "global_batch_size": integer,
             "seq_len": integer, "lr": real, "min_lr_ratio": real, "warmup_steps": integer, "weight_decay": real,
             "grad_clip": real, "eval_every": integer, "eval_batches": integer, "save_every": integer,
             "keep": integer, "log_every": integer, "seed": integer, "peak_flops": real}
    metavars = {"batch_size": "B", "seq_len": "T", "seed": "S", "data": "DIR", "out": "DIR"}
    defaults = TrainConfig.defaults()  # the fields' defaults, without validating (no model import)
    for name, text in FIELD_HELP.items():
        flag = "--" + name.replace("_", "-")
        default = defaults[name]
        if default is not None and name not in ("device", "dtype"):  # those two: the helpers' text
            text = f"{text} (default {' '.join(map(str, default)) if name == 'betas' else default})"
        if name == "device":
            options.add_device(g, default=argparse.SUPPRESS, note=text)
        elif name == "dtype":
            options.add_dtype(g, weights=False, default=argparse.SUPPRESS, choices=DTYPES)
        elif name in ("compile", "activation_checkpointing", "tensorboard"):
            g.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text)
        elif name == "betas":
            g.add_argument(flag, type=options.real, nargs=2, metavar=("B1", "B2"), default=argparse.SUPPRESS, help=text)
        else:
            g.add_argument(flag, type=kinds.get(name, str), choices=choices.get(name), default=argparse.SUPPRESS,
                           metavar=metavars.get(name), help=text)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """The TrainConfig of a parsed command line: defaults < --config < flags < --set."""
    from deep_delta.train.config import load_config

    overrides = {name: getattr(args, name) for name in FIELD_HELP if hasattr(args, name)}
    return load_config(args.config, overrides, args.assignments)


def run(args: argparse.Namespace) -> int:
    import sys

    from deep_delta.train.config import available_configs

    if args.list_configs:
        print("\n".join(available_configs()))
        return 0
    cfg = config_from_args(args)
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0

    from deep_delta.train.trainer import NonFiniteLossError, train

    options.apply_threads(args.threads)
    try:
        train(cfg, resume=args.resume, overwrite=args.overwrite, stop_at=args.stop_at,
              progress=not args.no_progress)
    except NonFiniteLossError as e:
        print(f"ddl train: error: {e}", file=sys.stderr)
        return 1
    return 0
