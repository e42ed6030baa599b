"""The command-line grammar shared by every ``ddl`` subcommand: one flag name, one meaning (docs/cli.md).

Each ``add_*`` helper adds one option to a parser with the same spelling, metavar, choices and help text in
every command that has it; ``apply_threads`` and ``variant_list`` turn parsed values into what the library
takes. Library functions name their Python parameters in errors; :func:`deep_delta.cli.main.as_flags`
turns those into these flags.
"""

from __future__ import annotations

import argparse

DEVICE_HELP = "where to run: auto (CUDA when available, else CPU) | cpu | cuda | cuda:N (default auto)"
THREADS_HELP = ("CPU threads for PyTorch: N, or auto = the cores other work does not keep busy, at least 1 "
                "(default {default})")
SET_HELP = ("override a setting: KEY=VALUE, the value parsed as YAML; model.FIELD=VALUE sets a model (DDLConfig) "
            "field, e.g. --set model.hidden_size=64. Repeatable")


def add_device(p: argparse.ArgumentParser, default: str | None = "auto") -> None:
    p.add_argument("--device", default=default, metavar="auto|cpu|cuda|cuda:N", help=DEVICE_HELP)


def add_dtype(p: argparse.ArgumentParser, *, weights: bool, default: str | None = "auto",
              choices: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")) -> None:
    """``--dtype``: for commands that run a model as it was trained, the dtype of the weights (``weights``); for
    commands that train or time training, the autocast compute dtype over float32 weights."""
    what = ("dtype of the weights" if weights else
            "compute dtype: autocast over float32 weights, as training runs")
    p.add_argument("--dtype", default=default, choices=list(choices),
                   help=f"{what}; auto = bfloat16 on a CUDA device that supports it, else float32 "
                   f"(default {default})")


def add_threads(p: argparse.ArgumentParser, default: str | None = "auto") -> None:
    p.add_argument("--threads", default=default, metavar="N|auto",
                   help=THREADS_HELP.format(default=default or "PyTorch's own choice"))


def apply_threads(spec: str | None) -> int | None:
    """Set PyTorch's intra-op CPU threads from ``--threads``; returns the number set (None: left alone)."""
    from deep_delta.runtime import cpu_threads

    threads = cpu_threads(spec)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return threads


def add_set(p: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    p.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_variants(p: argparse.ArgumentParser, default: tuple[str, ...] | list[str]) -> None:
    from deep_delta.models.ddl.configuration_ddl import VARIANTS

    p.add_argument("--variants", nargs="+", default=list(default), metavar="VARIANT",
                   help=f"variants, space-separated, in table order (default: {' '.join(default)}); one of "
                   f"{', '.join(VARIANTS)}")


def variant_list(values: list[str]) -> list[str]:
    """``--variants`` values (space-separated; a comma list is accepted too), checked against the variants."""
    from deep_delta.models.ddl.configuration_ddl import VARIANTS

    names = [v for item in values for v in item.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise ValueError(f"`variants` got {values!r}; allowed: one or more of {', '.join(VARIANTS)}")
    return list(dict.fromkeys(names))


def add_batch(p: argparse.ArgumentParser, batch_help: str, seq_help: str, *, batch_default=None,
              seq_default=None) -> None:
    p.add_argument("--batch-size", type=int, default=batch_default, metavar="B", help=batch_help)
    p.add_argument("--seq-len", type=int, default=seq_default, metavar="T", help=seq_help)


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bars (plain lines instead)")


def add_model(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, metavar="PATH",
                   help="a training run (its latest checkpoint), a checkpoint directory or a Hugging Face model "
                   "directory")
