"""``ddl train``: train a variant from a recipe or a YAML file and/or command-line settings (also under torchrun)."""

from __future__ import annotations

import argparse

from deep_delta.cli import options


def add_parser(sub) -> None:
    from deep_delta.train.config import TrainConfig

    p = sub.add_parser(
        "train",
        help="train a baseline or DDL model",
        description="Train VARIANT at PRESET on prepared token data. Settings come from the defaults, then "
        "--config (a YAML file or a shipped name such as small/ddl-cc; see --list-configs), then the flags "
        "below and --set KEY=VALUE. Writes OUT/metrics.jsonl (one JSON object per optimizer step, validation "
        "records beside them) and atomic checkpoints OUT/checkpoints/step_N (a Hugging Face model directory "
        "plus the training state). Run it under `torchrun --nproc_per_node N` for DDP or --distributed fsdp.",
        epilog="Recipe options of the model, for every variant (--set): model.embed_norm=true puts a learned "
        "RMSNorm on the embedding before the first sublayer (before a d_v > 1 state is expanded, HC's streams or "
        "AttnRes's sources formed; peri-ln has it by definition); docs/training.md, 'Recipe options'.",
    )
    p.add_argument("--config", metavar="FILE|NAME",
                   help="a YAML file, or a shipped recipe RECIPE or RECIPE/VARIANT (tiny/ddl-cc; see "
                   "--list-configs); default: none")
    options.add_set(p)
    p.add_argument("--resume", action="store_true",
                   help="continue the run in OUT from its latest checkpoint up to --steps (fresh if none)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in OUT")
    p.add_argument("--stop-at", type=options.integer, metavar="N",
                   help="end this session after step N (checkpointed) without shortening the schedule")
    options.add_progress(p)
    options.add_threads(p, default=None, shown="auto; under torchrun PyTorch's own choice, its processes sharing "
                        "the cores")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.add_argument("--list-configs", action="store_true", help="list the shipped config names and exit")
    options.add_settings(p.add_argument_group("settings (override the config file)"), TrainConfig)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    """The TrainConfig of a parsed command line: defaults < --config < flags < --set."""
    from deep_delta.train.config import TrainConfig, load_config

    overrides = options.given_settings(args, options.setting_names(TrainConfig))
    return load_config(args.config, overrides, args.assignments)


def run(args: argparse.Namespace) -> int:
    import sys

    from deep_delta.train.config import available_configs

    if args.list_configs:
        print("\n".join(available_configs()))
        return 0
    cfg = config_from_args(args)
    options.check_wandb_names([n for n in options.WANDB_NAMES if hasattr(args, n)], cfg.wandb, config=True)
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0

    from deep_delta.train.trainer import train

    _apply_threads(args.threads)
    # a divergence under `on_divergence` raise is the one error handler's (cli/main.py): one line, exit 1
    result = train(cfg, resume=args.resume, overwrite=args.overwrite, stop_at=args.stop_at,
                   progress=not args.no_progress)
    if result.diverged:
        kept = result.bad_weights or f"its checkpoint: {result.checkpoint}"
        print(f"ddl train: the run diverged ({result.diverged}) and stopped at step {result.step} "
              f"(--on-divergence stop); {kept}", file=sys.stderr)
    return 0


def _apply_threads(spec: str | None) -> None:
    """``--threads``, and the line that says what it chose and why. Not given: ``auto`` (the cores other work does
    not keep busy, as ``ddl compare``), except under torchrun, whose processes share the cores: there PyTorch's
    own choice (torchrun sets OMP_NUM_THREADS=1 per process unless it is set). Said by rank 0 only."""
    import os

    import torch

    from deep_delta.runtime import chosen_threads

    world = os.environ.get("WORLD_SIZE", "1")
    under_torchrun = world.isdigit() and int(world) > 1
    threads, why = chosen_threads("auto" if spec is None and not under_torchrun else spec)
    if threads is not None:
        torch.set_num_threads(threads)
    if os.environ.get("RANK", "0") != "0":
        return
    n = torch.get_num_threads()
    count = f"{n} CPU thread{'s' if n > 1 else ''}"
    if threads is None:
        said = (f"{count} per process, {why} (under torchrun its {world} processes share the cores; --threads N "
                "sets another)")
    elif spec is None:  # why: "auto: C cores, B kept busy by other work"
        said = f"{count} (--threads auto, the default{why[len('auto'):]}; --threads N sets another)"
    else:
        said = f"{count} (--threads {spec}{why[len('auto'):] if spec == 'auto' else ''})"
    print(f"ddl train: {said}", flush=True)
