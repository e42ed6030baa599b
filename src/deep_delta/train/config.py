"""``TrainConfig``: every setting of a training run, from a shipped recipe or a YAML file with command-line
overrides.

Precedence: dataclass defaults < ``--config`` (a recipe of :mod:`deep_delta.train.recipes`, or a YAML file)
< command-line flags and ``--set key=value``.
Unknown keys are refused (the error names the key and lists the allowed ones); types are checked.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deep_delta.data.loader import EVAL_WINDOWS
from deep_delta.settings import MAX_INT, check_count, check_fields, parse_assignments, setting
from deep_delta.train.recipes import RECIPES
from deep_delta.variants import PRESETS, VARIANTS, check_variant

DTYPES = ("auto", "float32", "bfloat16")
DISTRIBUTED = ("auto", "none", "ddp", "fsdp")
ON_DIVERGENCE = ("raise", "stop")
CUDA_GRAPHS = ("off", "blocks", "model")  # deep_delta.train.distributed.parallelize
OPTIMIZERS = ("adamw", "muon")  # deep_delta.train.optim.build_optimizer
# Settings added after runs were first recorded, with the value every run recorded before the field existed trained
# with: a stored run.json or checkpoint without one is read as that value (`recorded`), so that adding a setting
# leaves every earlier run resumable and reusable.
ADDED_FIELDS: dict[str, Any] = {"optimizer": "adamw", "adamw_lr_ratio": 1.0, "eval_windows": "first"}
WANDB_PROJECT_FORBIDDEN = ("/", "\\", "#", "?", "%", ":")  # characters W&B refuses in a project name


@dataclass
class TrainConfig:
    """One training run.

    Model: ``variant`` and ``preset`` pick ``DDLConfig.from_variant(variant, preset)``; ``model`` holds overrides
    of any DDLConfig field (e.g. ``{"hidden_size": 64}``). ``vocab_size`` defaults to the preset's vocabulary, or
    the data's vocabulary padded up to a multiple of 64 when the preset's is smaller.

    Batch: every optimizer step sees ``batch_size * grad_accum * world_size`` sequences of ``seq_len`` tokens.
    ``global_batch_size`` (sequences), when set, fixes that product: ``grad_accum`` is derived from it and the
    number of processes.

    Schedule: linear warm-up over ``warmup_steps`` to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at
    ``steps``. ``optimizer`` "adamw": AdamW(``betas``) with ``weight_decay`` on matrices (dim >= 2) only;
    "muon": Muon (momentum 0.95, Nesterov, ``weight_decay``, its update scaled to AdamW's RMS) on the hidden
    matrices at ``lr`` and AdamW as above on the rest at ``lr * adamw_lr_ratio`` (docs/training.md,
    "Optimizers"). Gradients clipped to ``grad_clip`` (0 disables).

    Memory: ``activation_checkpointing`` keeps only each block's input for backward and runs the block's forward
    again there (transformers' ``activation_checkpointing_enable()``): activation memory of about one block
    instead of all, for one more forward of the blocks per step. Gradients equal the plain run's.

    Tracking: ``tensorboard`` writes scalars to ``OUT/tensorboard``; ``wandb`` logs the run to Weights & Biases
    (project ``wandb_project``, default deep-delta-learning; run name ``wandb_run_name``, default
    VARIANT-PRESET-sSEED; W&B group ``wandb_group``), offline when no API key is configured (docs/training.md).
    """

    # Each field's metadata holds the help of its flag (--field-name: `ddl train`, and `ddl compare` but for
    # variant, out and wandb_run_name), and its metavar or choices; the command line builds the flags from them
    # (deep_delta/cli/options.py::add_settings). `model` is set with --set model.FIELD=VALUE.
    variant: str = setting("baseline", f"model variant: {', '.join(VARIANTS)}, or a variant a design of your own "
                           "registers (with --set model.design_module=MODULE; docs/designs.md)", metavar="VARIANT")
    preset: str = setting("tiny", "model size: tiny (CPU), small (124M), medium (353M)", choices=tuple(PRESETS))
    model: dict[str, Any] = setting(help="DDLConfig fields over the preset's (--set model.FIELD=VALUE)", factory=dict)
    data: str | None = setting(None, "prepared data directory (none: the embedded text, prepared once into a "
                               "cache)", metavar="DIR")
    out: str = setting("runs/train", "run directory: metrics.jsonl, run.json, checkpoints/", metavar="DIR")
    steps: int = setting(1000, "total optimizer steps of the run (also the length of the cosine schedule)")
    batch_size: int = setting(8, "sequences per micro-batch on each process", metavar="B")
    grad_accum: int = setting(1, "micro-batches per optimizer step (ignored when --global-batch-size is set)")
    global_batch_size: int | None = setting(None, "sequences per optimizer step over all processes; derives "
                                            "grad_accum")
    seq_len: int = setting(256, "tokens per sequence", metavar="T")
    lr: float = setting(1e-3, "peak learning rate")
    min_lr_ratio: float = setting(0.1, "final learning rate as a fraction of --lr")
    warmup_steps: int = setting(100, "linear warm-up steps")
    optimizer: str = setting("adamw", "adamw: AdamW on every parameter; muon: torch.optim.Muon on the hidden "
                             "matrices (attention q, k, v, o and the MLP's gate, up, down) and AdamW on the rest "
                             "(docs/training.md, 'Optimizers')", choices=OPTIMIZERS)
    adamw_lr_ratio: float = setting(1.0, "with optimizer muon: the AdamW group's peak lr as a fraction of --lr "
                                    "(Muon's). 1 by default because Muon's update is scaled to AdamW's RMS "
                                    "(0.2 sqrt(max(A, B)), Moonlight's 'Muon is Scalable for LLM Training'), which "
                                    "lets both groups use one lr and weight decay; refused with adamw unless 1",
                                    metavar="R")
    weight_decay: float = setting(0.1, "weight decay on matrices (AdamW's; with muon, Muon's too)")
    betas: tuple[float, float] = setting((0.9, 0.95), "AdamW betas", metavar=("B1", "B2"))
    grad_clip: float = setting(1.0, "clip the gradient norm to this (0: off)")
    on_divergence: str = setting("raise", "a non-finite loss or gradient norm: raise (an error naming the step; "
                                 "the last checkpoint kept) or stop (end the run at the last good step, validate and "
                                 "checkpoint it, and report the run as diverged)", choices=ON_DIVERGENCE)
    eval_every: int = setting(250, "validate every N steps (0: only at the end)")
    eval_batches: int = setting(20, "validation batches per evaluation")
    eval_windows: str = setting("spread", "which windows of the split an evaluation of part of it reads (validation, "
                                "and the test split of `ddl compare --eval-seeds`): spread (evenly over the whole "
                                "split, the same for every run) or first (its first windows, as runs before this "
                                "setting did); the whole split is the same for both", choices=EVAL_WINDOWS)
    save_every: int = setting(1000, "checkpoint every N steps (0: only at the end)")
    keep: int = setting(2, "keep the newest K checkpoints")
    log_every: int = setting(10, "print / update the progress bar every N steps (0: never)")
    seed: int = setting(0, "seed of the initialisation and the data order", metavar="S")
    device: str = setting("auto", "; under torchrun, cuda is each process's LOCAL_RANK GPU")  # after --device's
    dtype: str = setting("auto", "", choices=DTYPES)  # the text of --dtype everywhere (cli/options.add_dtype)
    compile: bool = setting(False, "torch.compile each block")
    cuda_graphs: str = setting("off", "with compile on a CUDA device, replay the training step's forward and backward "
                               "as CUDA graphs (torch.compile's mode='reduce-overhead'; no host work per kernel): "
                               "blocks (each block compiled and captured on its own), model (the whole model as one "
                               "compiled graph); one process, no activation checkpointing or state rebuild; "
                               "docs/training.md, 'CUDA graphs'", choices=CUDA_GRAPHS)
    activation_checkpointing: bool = setting(False, "checkpoint each block: rerun its forward in backward (less "
                                             "activation memory)")
    distributed: str = setting("auto", "under torchrun: auto (DDP when several processes), none, ddp or fsdp "
                               "(FSDP2)", choices=DISTRIBUTED)
    tensorboard: bool = setting(False, "also write TensorBoard scalars to OUT/tensorboard (needs the "
                                "tensorboard package: refused without it)")
    peak_flops: float | None = setting(None, "peak FLOP/s of one device for MFU (none: looked up for known GPUs; "
                                       "none on CPU)")
    wandb: bool = setting(False, "also log to Weights & Biases (offline when no API key is configured; needs the "
                          "wandb package: refused without it)")
    wandb_project: str | None = setting(None, "W&B project (none: deep-delta-learning)", metavar="P")
    wandb_run_name: str | None = setting(None, "W&B run name (none: VARIANT-PRESET-sSEED)", metavar="N")
    wandb_group: str | None = setting(None, "W&B group of the run (none: no group)", metavar="G")

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check types and ranges; raise ValueError naming the field, the value and what is allowed."""
        check_fields(self)  # the types, from the annotations
        from deep_delta.models.ddl.configuration_ddl import DDLConfig
        from deep_delta.runtime import check_device

        for f in dataclasses.fields(self):
            if "choices" in f.metadata:
                _choice(f.name, getattr(self, f.name), f.metadata["choices"])
        check_device(self.device)
        if self.model.get("design_module"):  # a design of the user's own: its module registers it and its variants
            from deep_delta.designs.registry import load_design_module

            load_design_module(self.model["design_module"])
        if self.variant not in VARIANTS:
            raise _bad("variant", self.variant, f"{' | '.join(VARIANTS)} (or a variant registered by a design's module: "
                       "`model.design_module`)")
        known = DDLConfig.field_names() - {"variant", "preset"}
        unknown = sorted(set(self.model) - known)
        if unknown:
            raise ValueError(
                f"TrainConfig: unknown model field(s) {unknown} in `model`; allowed: {', '.join(sorted(known))}"
            )
        check_variant(self.variant, self.model)
        for name in ("steps", "batch_size", "grad_accum", "seq_len", "keep", "eval_batches"):
            check_count(name, getattr(self, name), 1, owner="TrainConfig")
        for name in ("warmup_steps", "eval_every", "save_every", "log_every"):
            check_count(name, getattr(self, name), 0, owner="TrainConfig")
        check_count("seed", self.seed, 0, MAX_INT, owner="TrainConfig")
        if self.global_batch_size is not None:
            check_count("global_batch_size", self.global_batch_size, 1, owner="TrainConfig")
        if not self.lr > 0:
            raise _bad("lr", self.lr, "a float > 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise _bad("min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")
        if self.weight_decay < 0:
            raise _bad("weight_decay", self.weight_decay, "a float >= 0")
        if self.grad_clip < 0:
            raise _bad("grad_clip", self.grad_clip, "a float >= 0 (0 disables clipping)")
        if not (math.isfinite(self.adamw_lr_ratio) and self.adamw_lr_ratio > 0):
            raise _bad("adamw_lr_ratio", self.adamw_lr_ratio, "a finite float > 0")
        if self.optimizer != "muon" and self.adamw_lr_ratio != 1.0:
            raise _bad("adamw_lr_ratio", self.adamw_lr_ratio, "1.0 unless `optimizer` is muon (with adamw every "
                       "parameter trains at `lr`)")
        if self.optimizer == "muon" and self.distributed == "fsdp":
            raise _bad("optimizer", self.optimizer, "adamw under `distributed` fsdp (Muon orthogonalises each whole "
                       "matrix, and FSDP shards them across processes; not implemented): use `distributed` ddp")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise _bad("betas", list(self.betas), "two floats in [0, 1)")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise _bad("peak_flops", self.peak_flops, "a float > 0 (FLOP/s of one device) or null")
        if not self.out:
            raise _bad("out", self.out, "a directory path")
        if self.cuda_graphs != "off" and not self.compile:
            raise _bad("cuda_graphs", self.cuda_graphs, "off unless compile is true (the graphs are captured by "
                       "torch.compile's mode='reduce-overhead'): set compile=true as well")
        if self.cuda_graphs != "off" and self.activation_checkpointing:
            raise _bad("cuda_graphs", self.cuda_graphs, "off with activation_checkpointing (the two have not been "
                       "tested together)")
        if self.cuda_graphs != "off" and self.model.get("recompute_states"):
            raise _bad("cuda_graphs", self.cuda_graphs, "off with model.recompute_states (the state rebuild's "
                       "saved-tensor hooks cannot run inside a graph)")
        for name in ("wandb_project", "wandb_run_name", "wandb_group"):
            value = getattr(self, name)
            if value is not None and not (value.strip() and len(value) <= 128):
                raise _bad(name, value, "null or a non-empty name of at most 128 characters")
        if self.wandb_project is not None and set(self.wandb_project) & set(WANDB_PROJECT_FORBIDDEN):
            raise _bad("wandb_project", self.wandb_project,
                       f"a name without any of {' '.join(WANDB_PROJECT_FORBIDDEN)}")

    def accumulation(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each of ``world_size`` processes."""
        if self.global_batch_size is None:
            return self.grad_accum
        per_step = self.batch_size * world_size
        if self.global_batch_size % per_step:
            raise ValueError(
                f"TrainConfig: `global_batch_size` got {self.global_batch_size}, which is not a multiple of "
                f"batch_size ({self.batch_size}) x processes ({world_size}) = {per_step}; choose a batch_size "
                "that divides it"
            )
        return self.global_batch_size // per_step

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The default of every field, as :meth:`to_dict` writes it, read from the fields (nothing validated)."""
        d = {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
             for f in dataclasses.fields(cls)}
        return {**d, "betas": list(d["betas"])}

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, base: TrainConfig | None = None, origin: str = "") -> TrainConfig:
        """``base`` (or the defaults) updated with ``values``; unknown keys refused."""
        if not isinstance(values, dict):
            raise ValueError(f"TrainConfig{origin}: expected a mapping of settings, got {type(values).__name__}")
        allowed = cls.field_names()
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(
                f"TrainConfig{origin}: unknown key(s) {unknown}; allowed keys: {', '.join(allowed)}"
            )
        merged = (base or cls()).to_dict()
        for key, value in values.items():
            if key == "model" and value is not None:
                if not isinstance(value, dict):
                    raise _bad("model", value, "a mapping of DDLConfig fields to values")
                merged["model"] = {**merged["model"], **value}
            else:
                merged[key] = value
        return cls(**merged)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, *, base: TrainConfig | None = None) -> TrainConfig:
        return cls.from_dict(_read_yaml(Path(path)), base=base, origin=f" (from {path})")

    def with_overrides(self, assignments: list[str]) -> TrainConfig:
        """Apply ``key=value`` strings (:func:`parse_assignments`)."""
        return self.from_dict(parse_assignments(assignments), base=self, origin=" (from `assignments`)")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def recorded(values: dict[str, Any]) -> dict[str, Any]:
    """Settings as a stored record holds them (run.json's ``train_config`` or ``identity``, a checkpoint's
    ``train_meta.json``, a study's summary's ``settings``), with each field of :data:`ADDED_FIELDS` that a record
    written before it existed lacks set to the value such a run was made with (``optimizer`` adamw, ``eval_windows``
    first: every run validated on the split's first windows until it existed), not today's default; what the record
    holds is kept as it is."""
    return {**{k: v for k, v in ADDED_FIELDS.items() if k not in values}, **values}


# ---------------------------------------------------------------------- recipes shipped with the package
def recipes() -> list[str]:
    """Names of the shipped recipes (``deep_delta/train/recipes.py``): ``debug``, ``tiny``, ``small``, ..."""
    return sorted(RECIPES)


def available_configs() -> list[str]:
    """Names of the shipped configs, ``RECIPE/VARIANT`` (e.g. ``small/ddl-cc``, usable as ``--config``): every
    recipe with every variant."""
    return [f"{r}/{v}" for r in recipes() for v in sorted(VARIANTS)]


def config_values(spec: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """The settings of ``spec`` and their origin: a YAML file, a recipe (``small``: its settings) or a name
    ``RECIPE/VARIANT`` (``small/ddl-cc``: the recipe with that variant, run directory ``runs/small/ddl-cc``)."""
    path = Path(spec)
    if path.is_file():
        return _read_yaml(path), f" (from {spec})"
    name, _, variant = str(spec).partition("/")
    if name not in RECIPES or (variant and variant not in VARIANTS):
        raise FileNotFoundError(
            f"config {str(spec)!r}: no such file, and not a shipped config name; shipped: RECIPE or RECIPE/VARIANT "
            f"with RECIPE one of {', '.join(recipes())} and VARIANT one of {', '.join(sorted(VARIANTS))} "
            f"(e.g. {available_configs()[0]})"
        )
    values = RECIPES[name]()
    if variant:
        values = {**values, "variant": variant, "out": f"runs/{name}/{variant}"}
    return values, f" (from {spec})"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"config file {path}: not valid YAML: {e}") from e
    return values or {}


def load_config(spec: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None,
                assignments: list[str] | None = None) -> TrainConfig:
    """Defaults < ``spec`` (YAML path, recipe or ``RECIPE/VARIANT``) < ``overrides`` (field -> value) <
    ``assignments``."""
    cfg = TrainConfig()
    if spec:
        values, origin = config_values(spec)
        cfg = TrainConfig.from_dict(values, origin=origin)
    if overrides:
        cfg = TrainConfig.from_dict(overrides, base=cfg, origin=" (from the command line)")
    if assignments:
        cfg = cfg.with_overrides(assignments)
    return cfg


def _bad(name: str, got: Any, allowed: str) -> ValueError:
    return ValueError(f"TrainConfig: `{name}` got {got!r}; allowed: {allowed}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise _bad(name, value, " | ".join(allowed))
