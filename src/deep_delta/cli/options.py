"""The command-line grammar shared by every ``ddl`` subcommand: one flag name, one meaning (docs/cli.md).

Each ``add_*`` helper adds one option to a parser with the same spelling, metavar, choices and help text in
every command that has it; :func:`add_settings` adds a flag for every field of a settings dataclass, from the
field's annotation and metadata (:func:`deep_delta.settings.setting`), and :func:`given_settings` reads the
given ones back; :func:`integer` and :func:`real` are the types of every numeric option (finite, scientific
notation read), :func:`count` (``10M``) and :func:`fraction` those of token counts and shares; ``apply_threads``
and ``variant_list`` turn parsed values into what the library takes. Library functions name their Python
parameters in errors; :func:`deep_delta.cli.main.as_flags` turns those into these flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

# Every --dtype takes some of these (a command lists only what it can run); what the value means is stated
# by add_dtype: the dtype of the weights, or the autocast compute dtype over float32 weights.
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
DEVICE_METAVAR = "auto|cpu|cuda|cuda:N"
DEVICE_HELP = "where to run: auto (CUDA when available, else CPU) | cpu | cuda | cuda:N"
THREADS_HELP = ("CPU threads for PyTorch: N, or auto = the cores other work does not keep busy, at least 1 "
                "(default {default})")
SET_HELP = ("override a setting: KEY=VALUE, the value parsed as YAML; model.FIELD=VALUE sets a model (DDLConfig) "
            "field, e.g. --set model.hidden_size=64. Repeatable")


def integer(text: str) -> int:
    """The type of every integer option: ``1000`` or ``1e3`` (:func:`deep_delta.settings.parse_number`)."""
    from deep_delta.settings import parse_number

    try:
        return parse_number(text, integer=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def real(text: str) -> float:
    """The type of every real-valued option: a finite number, ``0.5`` or ``1e-3``; nan and inf are refused."""
    from deep_delta.settings import parse_number

    try:
        return parse_number(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


_COUNT = re.compile(r"(\d+(?:\.\d+)?)([kKmMbBgG]?)")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}


def count(text: str) -> int:
    """The type of a count of tokens (or processes): ``1000000``, ``1_000_000``, ``1e6``, ``500k``, ``10M``,
    ``2B``; positive, at most 64 bits."""
    from deep_delta.settings import MAX_INT, parse_number

    t = text.replace("_", "").strip()
    m = _COUNT.fullmatch(t)
    try:
        value = parse_number(m.group(1)) * _SCALE[m.group(2).lower()] if m else parse_number(t)
    except ValueError:
        value = 0.0
    if not 1 <= value <= MAX_INT or value != int(value):
        raise argparse.ArgumentTypeError(f"expected a positive whole number of at most 64 bits such as 1000000, 1e6, "
                                         f"500k or 10M, got {text!r}")
    return int(value)


def fraction(text: str) -> float:
    """The type of a fraction: a number in [0, 1)."""
    from deep_delta.settings import parse_number

    try:
        value = parse_number(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}")
    return value


# The grammars a settings field may name for its flag instead of its annotation's (setting(..., parse="count")).
PARSERS = {"count": count, "fraction": fraction}


def add_device(p, default: str = "auto", note: str = "") -> argparse.Action:
    """``--device``; ``note`` follows the shared text."""
    return p.add_argument("--device", default=default, metavar=DEVICE_METAVAR,
                          help=f"{DEVICE_HELP}{note} (default {default})")


def add_dtype(p, *, weights: bool, default: str = "auto",
              choices: Sequence[str] = DTYPE_CHOICES) -> argparse.Action:
    """``--dtype``: for commands that run a model as it was trained, the dtype of the weights (``weights``); for
    commands that train or time training, the autocast compute dtype over float32 weights."""
    assert set(choices) <= set(DTYPE_CHOICES), choices
    what = ("dtype of the weights" if weights else
            "compute dtype: autocast over float32 weights, as training runs")
    auto = "; auto = bfloat16 on a CUDA device that supports it, else float32" if "auto" in choices else ""
    return p.add_argument("--dtype", default=default, choices=list(choices), help=f"{what}{auto} (default {default})")


def add_threads(p: argparse.ArgumentParser, default: str | None = "auto", shown: str | None = None) -> None:
    """``--threads``; ``shown``: what the help says the default is, where the command resolves a None default
    itself (``ddl train``: auto, except under torchrun)."""
    p.add_argument("--threads", default=default, metavar="N|auto",
                   help=THREADS_HELP.format(default=shown or default or "PyTorch's own choice"))


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


def add_variants(p: argparse.ArgumentParser, default: Sequence[str], note: str = "") -> argparse.Action:
    """``--variants VARIANT ...``; ``note`` follows the shared text; :func:`variant_list` reads it."""
    from deep_delta.variants import VARIANTS

    return p.add_argument("--variants", nargs="+", default=list(default), metavar="VARIANT",
                          help=f"variants, space-separated, in table order (default: {' '.join(default)}); one of "
                          f"{', '.join(VARIANTS)}{note}")


def variant_list(values: list[str]) -> list[str]:
    """``--variants`` values (space-separated), checked against the variants; a repeated name counts once."""
    from deep_delta.variants import VARIANTS

    unknown = [v for v in values if v not in VARIANTS]
    if unknown or not values:
        got = ", ".join(map(repr, unknown)) if unknown else "no variant names"
        raise ValueError(f"`variants` got {got}; allowed: one or more of {', '.join(VARIANTS)}")
    return list(dict.fromkeys(values))


def add_batch(p, batch_help: str, seq_help: str | None, *, batch_default=None,
              seq_default=None) -> None:
    p.add_argument("--batch-size", type=integer, default=batch_default, metavar="B", help=batch_help)
    if seq_help is not None:
        p.add_argument("--seq-len", type=integer, default=seq_default, metavar="T", help=seq_help)


def add_seed(p, help: str, default: int | None = None) -> None:
    p.add_argument("--seed", type=integer, default=default, metavar="S", help=help)


def add_seeds(p, help: str, default: list[int] | None = None) -> argparse.Action:
    """``--seeds S ...``: several paired seeds, a list or one count N (seeds 0..N-1); :func:`seed_list` reads it."""
    return p.add_argument("--seeds", type=integer, nargs="+", default=default, metavar="S", help=help)


def seed_list(values: list[int] | None, seed: int) -> list[int]:
    """``--seeds``: None -> [seed]; one number N -> 0..N-1; several -> those seeds (at most
    :data:`~deep_delta.settings.MAX_SEEDS`)."""
    from deep_delta.settings import MAX_SEEDS

    if not values:
        return [seed]
    if any(v < 0 for v in values) or values == [0]:
        raise ValueError(f"`seeds` got {values}; allowed: a count N >= 1 (seeds 0..N-1) or a list of seeds >= 0")
    if (values[0] if len(values) == 1 else len(values)) > MAX_SEEDS:
        got = f"a count of {values[0]:,}" if len(values) == 1 else f"{len(values):,} seeds"
        raise ValueError(f"`seeds` got {got}; allowed: at most {MAX_SEEDS} seeds (each is a full run of every "
                         "variant)")
    return list(range(values[0])) if len(values) == 1 else list(dict.fromkeys(values))


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bars (plain lines instead)")


MODEL_HELP = "a training run (its latest checkpoint), a checkpoint directory or a Hugging Face model directory"


def add_model(p: argparse.ArgumentParser, required: bool = True, *, repeat: bool = False, dest: str | None = None,
              help: str = MODEL_HELP) -> None:
    """``--model PATH``; ``repeat``: several models, one per ``--model``."""
    kwargs = {"dest": dest} if dest else {}
    if repeat:
        kwargs["action"] = "append"
    p.add_argument("--model", required=required, metavar="PATH", help=help, **kwargs)


def add_wandb(p: argparse.ArgumentParser, what: str) -> None:
    """``--wandb`` and ``--wandb-project P`` of a command that logs ``what`` to Weights & Biases; :func:`wandb_project`
    reads them."""
    p.add_argument("--wandb", action="store_true",
                   help=f"also log {what} to Weights & Biases (offline when no API key is configured; needs the "
                   "wandb package: refused without it)")
    p.add_argument("--wandb-project", default=None, metavar="P",
                   help="W&B project, with --wandb (default deep-delta-learning)")


def wandb_project(args: argparse.Namespace) -> str | None:
    """The W&B project of ``--wandb`` / ``--wandb-project`` (None: the default project); a project given without
    ``--wandb`` is refused rather than ignored."""
    check_wandb_names(["wandb_project"] if args.wandb_project is not None else [], args.wandb)
    return args.wandb_project


# The W&B names of TrainConfig: given while W&B logging is off, they would be ignored (check_wandb_names).
WANDB_NAMES = ("wandb_project", "wandb_run_name", "wandb_group")


def check_wandb_names(given: Sequence[str], wandb: bool, *, config: bool = False) -> None:
    """Refuse W&B names (``given``: ``wandb_project``, ...) while W&B logging is off (``wandb``) rather than ignore
    them; ``config``: the command also reads ``wandb: true`` from a config. W&B logging without the wandb package is
    refused too, before any work, as ``--tensorboard`` without tensorboard is (one line naming the extra)."""
    if wandb:
        from deep_delta.extras import EXTRAS, require

        require("wandb", f"`wandb` ({EXTRAS['wandb'][1]})")
    if given and not wandb:
        from deep_delta.cli.main import UsageError

        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        raise UsageError(f"{flags} given, but W&B logging is off; add --wandb"
                         + (" (or wandb: true in the config)" if config else ""))


# What argparse reads as a negative number rather than an option (its own pattern misses 1e-3's exponent: `--lrs
# -1e-3` was "expected at least one argument"); a value it lets through is then refused by the option's own check.
NEGATIVE_NUMBER = re.compile(r"^-\d*\.?\d+(?:[eE][-+]?\d+)?$")


def add_lrs(p: argparse.ArgumentParser, what: str, *, per_variant: bool = False) -> None:
    """``--lrs LR ...``: a learning-rate grid; :func:`lr_grid` reads it (a negative lr reaches its check). With
    ``per_variant``, an item ``VARIANT=LR,LR,...`` gives that variant a grid of its own."""
    p._negative_number_matcher = NEGATIVE_NUMBER
    own = (" An item VARIANT=LR,LR,... gives that variant a grid of its own (--lrs 2e-3 4e-3 "
           "ddl-cc=8e-3,1.6e-2,3.2e-2): the plain lrs are the grid of the variants not named; each lr's runs are "
           "in OUT/lr_<lr>/, which holds the variants whose grid has that lr.") if per_variant else ""
    p.add_argument("--lrs", type=lr_item if per_variant else real, nargs="+", default=None,
                   metavar="LR|VARIANT=LR,..." if per_variant else "LR",
                   help=f"a learning-rate grid (--lrs 5e-4 1e-3 2e-3 4e-3): {what} is trained at every lr and "
                   "every seed, and reported at its own best lr, chosen on validation data only; also writes "
                   f"the sensitivity plot OUT/lr_sensitivity.png (default: one lr).{own}")


def lr_item(text: str) -> float | tuple[str, list[float]]:
    """The type of a ``--lrs`` item where a variant may have a grid of its own: a learning rate (:func:`real`), or
    ``VARIANT=LR,LR,...`` as (variant, [lrs])."""
    if "=" not in text:
        return real(text)
    variant, _, values = text.partition("=")
    lrs = [x for x in values.split(",") if x.strip()]
    if not variant.strip() or not lrs:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: a learning rate, or VARIANT=LR,LR,... e.g. "
                                         "ddl-cc=8e-3,1.6e-2")
    try:
        return variant.strip(), [real(x) for x in lrs]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"got {text!r}: {e}") from None


def _grid_items(items: list) -> list[float] | dict[str, list[float]]:
    """``--lrs`` items as one grid (every item a number) or as {variant: grid} with ``"*"`` for the plain lrs."""
    shared, own = [], {}
    for item in items:
        if isinstance(item, tuple):
            variant, values = item
            if variant in own:
                raise ValueError(f"`lrs` names {variant!r} twice; allowed: VARIANT=LR,LR,... with each variant once")
            own[variant] = values
        else:
            shared.append(item)
    if not own:
        return shared
    return {**({"*": shared} if shared else {}), **own}


def lr_grid(lrs: list | None, lr: float | None, assignments: list[str]) -> list[float] | dict[str, list[float]] | None:
    """``--lrs`` checked (finite, > 0, distinct), and refused beside a single lr (``--lr`` or ``--set lr=...``):
    one of them would be ignored. None without ``--lrs``; a dict {variant: grid} (``"*"``: the plain lrs) when an
    item names a variant (:func:`deep_delta.experiments.lr_grid.variant_grids` resolves it against the variants)."""
    if lrs is None:
        return None
    from deep_delta.experiments.lr_grid import check_lrs

    grid = _grid_items(lrs)
    single = ([f"--lr {lr:g}"] if lr is not None else []) + [
        f"--set {a}" for a in assignments if a.partition("=")[0].strip() == "lr"]
    if single:
        shown = " ".join(f"{x:g}" if isinstance(x, float) else f"{x[0]}={','.join(f'{y:g}' for y in x[1])}"
                         for x in lrs)
        raise ValueError(f"`lrs` got {shown} together with one learning rate "
                         f"({', '.join(single)}); allowed: either the grid or one lr, not both")
    if isinstance(grid, dict):
        for variant, values in grid.items():
            try:
                check_lrs(values)
            except ValueError as e:
                raise ValueError(f"{'the plain lrs' if variant == '*' else variant + chr(39) + 's grid'}: {e}") \
                    from None
        return grid
    return check_lrs(grid)


# ------------------------------------------------------------------------------------------- settings flags
# A settings field of one of these names gets the shared option of that name (one text in every command).
SHARED_SETTINGS = ("device", "dtype", "variants", "seeds")


def setting_names(cls: type, skip: Sequence[str] = ()) -> list[str]:
    """The fields of the settings dataclass ``cls`` that :func:`add_settings` gives a flag: every one but those
    in ``skip`` and the mappings (``model``, ``task``: ``--set GROUP.NAME=VALUE`` sets those)."""
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls)
            if f.name not in skip and (typing.get_origin(hints[f.name]) or hints[f.name]) is not dict]


def add_settings(p, cls: type, *, skip: Sequence[str] = (), defaults: dict[str, Any] | None = None) -> list[str]:
    """Add ``--field-name`` to ``p`` (a parser or group) for every field of the settings dataclass ``cls`` of
    :func:`setting_names`; returns their names, what :func:`given_settings` reads back.

    Each flag's type comes from the annotation (int: :func:`integer`, float: :func:`real`, bool: ``--x`` /
    ``--no-x``, a tuple, list or sequence: several values, ``X | None``: X) or the metadata's ``parse`` (a name of
    :data:`PARSERS`), its help, metavar and choices from the field's metadata
    (:func:`deep_delta.settings.setting`), the default its help shows from the class or ``defaults`` (a command's
    own, e.g. a recipe's; None or an empty list: the help says what nothing means); a field without a default is
    a required flag; a field named as a shared option (:data:`SHARED_SETTINGS`) gets that option. A flag not given
    leaves nothing in the namespace (``argparse.SUPPRESS``), so only the flags given override the settings' own
    defaults."""
    hints = typing.get_type_hints(cls)
    names = setting_names(cls, skip)
    for f in dataclasses.fields(cls):
        if f.name in names:
            default = (defaults or {}).get(f.name, _field_default(f))
            action = _add_setting(p, f, hints[f.name], default)
            action.default = argparse.SUPPRESS  # the help shows the default; the settings apply it
    return names


def given_settings(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    """The settings among ``names`` (:func:`add_settings`) given on the command line, as field -> value: the
    values a settings class takes (``--variants`` checked by :func:`variant_list`, ``--seeds`` read by
    :func:`seed_list`); a flag not given is absent."""
    given = {n: getattr(args, n) for n in names if hasattr(args, n)}
    if "variants" in given:
        given["variants"] = variant_list(given["variants"])
    if "seeds" in given:
        given["seeds"] = seed_list(given["seeds"], 0)
    return given


def _field_default(f: dataclasses.Field) -> Any:
    """The default of ``f``: its value, its factory's, or ``MISSING`` for a required field."""
    return f.default if f.default_factory is dataclasses.MISSING else f.default_factory()


def _add_setting(p, f: dataclasses.Field, kind: Any, default: Any) -> argparse.Action:
    """The flag of the settings field ``f`` annotated ``kind``, showing ``default`` in its help."""
    note = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
    metavar, choices = f.metadata.get("metavar"), f.metadata.get("choices")
    if f.name == "device":
        return add_device(p, default=default, note=note)
    if f.name == "dtype":  # a settings class trains or times training: its dtype is the compute dtype
        return add_dtype(p, weights=False, default=default, choices=choices or DTYPE_CHOICES)
    if f.name == "variants":
        return add_variants(p, default, note=note)
    if f.name == "seeds":  # shown as --seeds reads it: seeds 0..N-1 as the count N
        counted = list(default) == list(range(len(default)))
        return add_seeds(p, f"{note} (default {len(default) if counted else ' '.join(map(str, default))})")
    required = default is dataclasses.MISSING
    parse = PARSERS[f.metadata["parse"]] if "parse" in f.metadata else None
    nothing = required or default is None or (isinstance(default, (list, tuple)) and not default)
    text = note if nothing else f"{note} (default {_listed(default, parse)})"
    flag = "--" + f.name.replace("_", "-")
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None: X (None is its default)
        (kind,) = [k for k in typing.get_args(kind) if k is not type(None)]
    if kind is bool:
        return p.add_argument(flag, action=argparse.BooleanOptionalAction, help=text)
    nargs = None
    if typing.get_origin(kind) in (tuple, list, Sequence):
        items = typing.get_args(kind)
        fixed = typing.get_origin(kind) is tuple and items[-1] is not Ellipsis
        nargs = len(items) if fixed else len(metavar) if isinstance(metavar, tuple) else "+"
        kind = items[0]
    return p.add_argument(flag, type=parse or {int: integer, float: real}.get(kind), nargs=nargs, metavar=metavar,
                          required=required, choices=list(choices) if choices else None, help=text)


def _listed(value: Any, parse: Any = None) -> str:
    """A default as its flag reads it: a list space-separated, a :func:`count` with its suffix (``100M``)."""
    if parse is count:
        return next((f"{value // scale}{suffix}" for suffix, scale in (("B", 10**9), ("M", 10**6), ("k", 10**3))
                     if value % scale == 0), str(value))
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
