"""``ddl train``: train a variant from a recipe or a YAML file and/or command-line settings (also under torchrun)."""

from __future__ import annotations

import argparse

from deep_delta.cli import options

WANDB_NAMES = ("wandb_project", "wandb_run_name", "wandb_group")


def add_parser(sub) -> None:
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
                   help="a YAML file, or a shipped recipe RECIPE or RECIPE/VARIANT (tiny/ddl-cc; see "
                   "--list-configs); default: none")
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
    for f in setting_fields():
        add_setting(g, f)
    p.set_defaults(func=run)


def setting_fields() -> list:
    """The TrainConfig fields with a flag: every one whose metadata has its help (``model`` is set with --set)."""
    import dataclasses

    from deep_delta.train.config import TrainConfig

    return [f for f in dataclasses.fields(TrainConfig) if "help" in f.metadata]


def add_setting(g, f) -> None:
    """The flag ``--field-name`` of TrainConfig field ``f``: its type from the annotation, its help, metavar and
    choices from the field's metadata, its default (shown in the help) the field's."""
    import typing

    from deep_delta.train.config import TrainConfig

    kind = typing.get_type_hints(TrainConfig)[f.name]
    default = TrainConfig.defaults()[f.name]
    text = f.metadata["help"]
    if default is not None and f.name not in ("device", "dtype"):  # those two: the helpers' text
        text = f"{text} (default {' '.join(map(str, default)) if isinstance(default, list) else default})"
    flag, metavar = "--" + f.name.replace("_", "-"), f.metadata.get("metavar")
    number = {int: options.integer, float: options.real}
    if f.name == "device":
        options.add_device(g, default=argparse.SUPPRESS, note=text)
    elif f.name == "dtype":
        options.add_dtype(g, weights=False, default=argparse.SUPPRESS, choices=f.metadata["choices"])
    elif kind is bool:
        g.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text)
    elif typing.get_origin(kind) is tuple:
        (element,) = set(typing.get_args(kind))
        g.add_argument(flag, type=number[element], nargs=len(typing.get_args(kind)), metavar=metavar,
                       default=argparse.SUPPRESS, help=text)
    else:
        (plain,) = [k for k in typing.get_args(kind) or (kind,) if k is not type(None)]  # int | None -> int
        choices = f.metadata.get("choices")
        g.add_argument(flag, type=number.get(plain, str), choices=list(choices) if choices else None,
                       default=argparse.SUPPRESS, metavar=metavar, help=text)


def config_from_args(args: argparse.Namespace):
    """The TrainConfig of a parsed command line: defaults < --config < flags < --set."""
    from deep_delta.train.config import load_config

    overrides = {f.name: getattr(args, f.name) for f in setting_fields() if hasattr(args, f.name)}
    return load_config(args.config, overrides, args.assignments)


def run(args: argparse.Namespace) -> int:
    import sys

    from deep_delta.train.config import available_configs

    if args.list_configs:
        print("\n".join(available_configs()))
        return 0
    cfg = config_from_args(args)
    given = [n for n in WANDB_NAMES if hasattr(args, n)]
    if given and not cfg.wandb:
        from deep_delta.cli.main import UsageError

        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise UsageError(f"{flags} given, but W&B logging is off; add --wandb (or wandb: true in the config)")
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0

    from deep_delta.train.trainer import NonFiniteLossError, train

    options.apply_threads(args.threads)
    try:
        result = train(cfg, resume=args.resume, overwrite=args.overwrite, stop_at=args.stop_at,
                       progress=not args.no_progress)
    except NonFiniteLossError as e:
        print(f"ddl train: error: {e}", file=sys.stderr)
        return 1
    if result.diverged:
        print(f"ddl train: the run diverged ({result.diverged}) and stopped at step {result.step} "
              f"(--on-divergence stop); its checkpoint: {result.checkpoint}", file=sys.stderr)
    return 0
