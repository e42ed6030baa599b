"""What ``ddl coord-check`` and ``ddl tasks run`` run, with no import of PyTorch (the command line reads the
defaults from here to build its parser): :class:`CoordCheckSettings` (the check itself is
:mod:`deep_delta.experiments.coord_check`) and :class:`TaskSettings`, with the task and model config they give
(the runs: :mod:`deep_delta.experiments.task_runs`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deep_delta.settings import (
    MAX_SEEDS,
    check_count,
    check_fields,
    parse_assignment,
    parse_assignments,
    setting,
)
from deep_delta.tasks import Task, get_task
from deep_delta.variants import VARIANTS

PARAMETRIZATIONS = ("sp", "mup")

# How far a slope under muP may stray from its order at the last step. Measured (docs/mup.md) at widths 32..256,
# 3 steps of 2 x 32 tokens, seeds 0, 1, 2: muP within 0.42 of its order; sp and muP without its learning-rate
# scaling 0.68 to 1.85 above it in the attention and MLP outputs (sp logits 0.93 to 1.16).
MUP_SLOPE_BOUND = 0.5


@dataclass
class CoordCheckSettings:
    """What a coordinate check runs; every model is ``variant`` at ``layers`` blocks of ``width / head_dim``
    heads of ``head_dim``, vocabulary 257 (bytes) and ``model`` (any DDLConfig field). Each field's metadata holds
    the help of its ``ddl coord-check`` flag (``--field-name``)."""

    variants: Sequence[str] = setting(("baseline", "ddl-cc"))  # the text of --variants everywhere (cli/options.py)
    widths: Sequence[int] = setting((64, 128, 256, 512, 1024), "hidden sizes, multiples of --head-dim", metavar="W")
    parametrizations: Sequence[str] = setting(PARAMETRIZATIONS, "which to run", choices=PARAMETRIZATIONS)
    steps: int = setting(4, "optimizer steps recorded")
    layers: int = setting(2, "blocks")
    head_dim: int = setting(32, "head size, fixed across widths")
    batch_size: int = setting(4, "sequences per step", metavar="B")
    seq_len: int = setting(64, "tokens per sequence", metavar="T")
    lr: float = setting(1e-2, "AdamW learning rate at the base width")
    seeds: Sequence[int] = setting((0,), "seeds averaged per point: a list, or one number N for seeds 0..N-1")
    device: str = setting("cpu")  # a device, not auto: `ddl coord-check` resolves its --device (default auto)
    model: dict[str, Any] = setting(help="DDLConfig fields set for every model (--set model.FIELD=VALUE)",
                                    factory=dict)

    def __post_init__(self):
        check_fields(self)

    def validate(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise ValueError(f"`variants` got {list(self.variants)!r}; allowed: one or more of {', '.join(VARIANTS)}")
        bad = [p for p in self.parametrizations if p not in PARAMETRIZATIONS]
        if bad or not self.parametrizations:
            raise ValueError(f"`parametrizations` got {list(self.parametrizations)!r}; allowed: sp, mup")
        for name in ("steps", "layers", "head_dim", "batch_size", "seq_len"):
            check_count(name, getattr(self, name), 1)
        if len(set(self.widths)) < 2 or any(w < 1 or w % self.head_dim for w in self.widths):
            raise ValueError(f"`widths` got {list(self.widths)!r}; allowed: two or more different multiples of "
                             f"head_dim={self.head_dim} (a slope needs two widths)")
        if not self.lr > 0:
            raise ValueError(f"`lr` got {self.lr!r}; allowed: a float > 0")
        if not self.seeds or len(self.seeds) > MAX_SEEDS:
            raise ValueError(f"`seeds` got {len(self.seeds)} seeds; allowed: 1 to {MAX_SEEDS}")


# ------------------------------------------------------------------------------------------------ ddl compare
@dataclass
class HeldOutSettings:
    """How ``ddl compare --lrs`` reports apart from where it chose (:mod:`deep_delta.experiments.held_out`): the
    evaluation seeds and the test tokens. Without ``eval_seeds`` the lr is chosen and reported on the same seeds and
    validation sample (the report says so). Each field's metadata holds the help of its ``ddl compare`` flag."""

    eval_seeds: int | None = setting(None, "with --lrs: choose each variant's lr on the val split at the --seeds "
                                     "(the selection seeds), then train N FRESH seeds (--eval-seed-start ...) at the "
                                     "chosen lr and report those on the test split (test_*.bin), paired by seed; "
                                     "runs in OUT/evaluation/ (default: report the selection runs themselves, "
                                     "labelled so)", metavar="N")
    eval_seed_start: int = setting(100, "the first evaluation seed (seeds START..START+N-1; apart from the "
                                   "selection seeds)", metavar="START")
    test_tokens: int | None = setting(None, "test tokens each evaluation run's final model is measured on, the "
                                      "same windows for every run, rounded up to whole batches of windows (the "
                                      "report says the tokens measured) (default 250K, or the whole test split where "
                                      "it is smaller; more than the split holds is refused)", metavar="N",
                                      parse="count")

    def __post_init__(self):
        check_fields(self)
        if self.eval_seeds is not None:
            check_count("eval_seeds", self.eval_seeds, 1, MAX_SEEDS)
        check_count("eval_seed_start", self.eval_seed_start, 0)
        if self.test_tokens is not None:
            check_count("test_tokens", self.test_tokens, 1)
        if self.eval_seeds is None and self.test_tokens is not None:
            raise ValueError("`test_tokens` got a value without `eval_seeds`; allowed: with `eval_seeds` (the test "
                             "split reports the evaluation seeds only)")


# ------------------------------------------------------------------------------------------------ ddl tasks run
# The TrainConfig fields a mechanism-task run takes from its settings (``ddl tasks run``'s flags, defaults from
# the recipe ``tasks``); the run sets every other one itself (:meth:`TaskSettings.train_config`: the variant and
# seed, the task's sequence length, float32, no checkpoints, a divergence ends the run as a result).
TRAIN_FIELDS = ("preset", "steps", "batch_size", "lr", "warmup_steps", "min_lr_ratio", "weight_decay", "betas",
                "grad_clip", "log_every", "eval_every", "model")
GROUPS = ("model", "task")  # the settings that ``--set GROUP.NAME=VALUE`` fills one entry of


def task_training_defaults() -> dict[str, Any]:
    """The :data:`TRAIN_FIELDS` of the recipe ``tasks`` over TrainConfig's defaults."""
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.recipes import tasks

    values = {**TrainConfig.defaults(), **tasks()}
    return {name: values[name] for name in TRAIN_FIELDS}


@dataclass
class TaskSettings:
    """Everything a (task, variant, seed) run depends on besides those three. ``train``: the TrainConfig fields of
    :data:`TRAIN_FIELDS` (the recipe ``tasks``' values unless given; checked by TrainConfig), the others the
    task's measure and its parameters. ``--set KEY=VALUE`` sets any of them by name (:meth:`with_assignments`:
    ``lr=1e-3``, ``test_size=500``), ``model.FIELD`` a DDLConfig field, ``task.PARAM`` a task parameter (``ddl
    tasks list`` shows them). Each field's metadata holds the help of its ``ddl tasks run`` flag (``--field-name``;
    the training fields' flags are TrainConfig's).

        settings = TaskSettings().with_values(steps=200, test_size=300)
        settings = TaskSettings().with_assignments(["steps=200", "model.num_hidden_layers=2"])
    """

    train: dict[str, Any] = setting(help="the training settings, TrainConfig fields by name (their flags, or --set "
                                    "NAME=VALUE; model.FIELD=VALUE)",
                                    factory=task_training_defaults)
    eval_size: int = setting(500, "sequences of the accuracy curve (the run's validation every --eval-every steps: "
                             "the first N test sequences), and of the validation set an lr grid chooses on")
    test_size: int = setting(2000, "sequences of the fixed test set (flip-flop: at most this many)")
    test_seed: int = setting(1234, "seed of the test and validation sequences (the same for every run)")
    task: dict[str, Any] = setting(help="the task's parameters (--set task.PARAM=VALUE; `ddl tasks list` shows "
                                   "them)", factory=dict)

    def __post_init__(self):
        check_fields(self)  # the types, from the annotations
        for name in ("test_size", "eval_size"):
            check_count(name, getattr(self, name), 1, owner="TaskSettings")
        unknown = sorted(set(self.train) - set(TRAIN_FIELDS))
        if unknown:
            raise ValueError(f"TaskSettings: `train` got {unknown[0]!r}; allowed: {', '.join(TRAIN_FIELDS)} (a task "
                             "run sets the other TrainConfig fields itself)")
        model = self.train.get("model", {})
        if not isinstance(model, dict):
            raise ValueError(f"TaskSettings: `model` got {model!r}; allowed: a mapping of DDLConfig fields")
        from deep_delta.train.config import TrainConfig

        base = task_training_defaults()
        values = {**base, **self.train, "model": {**base["model"], **model}}
        checked = TrainConfig.from_dict(values).to_dict()  # a bad value: TrainConfig's error naming the field
        self.train = {name: checked[name] for name in TRAIN_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        """Every setting by name, the training fields among them (what a stored result's identity holds)."""
        values = dataclasses.asdict(self)
        train = values.pop("train")
        model, task = train.pop("model"), values.pop("task")
        return {**train, **values, "model": model, "task": task}

    def with_values(self, **values: Any) -> TaskSettings:
        """These settings with fields set by name (a training field goes into ``train``; ``model`` and ``task``
        add their entries to those mappings)."""
        unknown = self._unknown(values)
        if unknown:
            raise ValueError(f"TaskSettings: {self._no_setting(unknown)}")
        for group in GROUPS:
            if group in values and not isinstance(values[group], dict):
                raise ValueError(f"TaskSettings: `{group}` got {values[group]!r}; allowed: a mapping "
                                 f"(--set {group}.NAME=VALUE)")
        train = {**self.train, **{k: v for k, v in values.items() if k in TRAIN_FIELDS}}
        train["model"] = {**self.train["model"], **values.get("model", {})}
        own_values = {k: v for k, v in values.items() if k not in TRAIN_FIELDS}
        own_values["task"] = {**self.task, **values.get("task", {})}
        return dataclasses.replace(self, train=train, **own_values)

    def with_assignments(self, assignments: list[str]) -> TaskSettings:
        """These settings with ``KEY=VALUE`` strings applied (:func:`deep_delta.settings.parse_assignments`, as
        ``ddl train --set``); ``model.FIELD`` and ``task.PARAM`` set one entry of ``model`` / ``task``."""
        given = parse_assignments(assignments, groups=GROUPS)
        for key, value in given.items():
            if key in GROUPS and not isinstance(value, dict):
                raise ValueError(f"`assignments` got {_item(assignments, key)!r}: no setting {key!r}; set one entry: "
                                 f"{key}.NAME=VALUE")
        unknown = self._unknown(given)
        if unknown:  # checked here too, to quote the item
            raise ValueError(f"`assignments` got {_item(assignments, unknown)!r}: {self._no_setting(unknown)}")
        unknown = sorted(given.get("model", {}).keys() - model_fields())
        if unknown:
            raise ValueError(f"`assignments` got {_item(assignments, f'model.{unknown[0]}', 'model')!r}: DDLConfig "
                             f"has no field {unknown[0]!r}; allowed model fields: {', '.join(sorted(model_fields()))}")
        return self.with_values(**given)

    def _names(self) -> set[str]:
        """Every setting by name (``train`` is set by its fields' names)."""
        return {*TRAIN_FIELDS, *(f.name for f in dataclasses.fields(self))} - {"train"}

    def _unknown(self, values: dict[str, Any]) -> str | None:
        """The first of ``values``' keys that is no setting, or None."""
        return min(set(values) - self._names(), default=None)

    def _no_setting(self, key: str) -> str:
        return (f"no setting {key!r}; allowed: {', '.join(sorted(self._names() - set(GROUPS)))}, model.FIELD (a "
                "DDLConfig field) or task.PARAM (a task parameter, see `ddl tasks list`)")

    def train_config(self, task: Task, variant: str, seed: int, device: str):
        """The TrainConfig of one task run: ``train``'s fields, ``task.seq_len`` tokens per sequence, float32, no
        checkpoints (the run is kept in memory), and a divergence that ends the run as a result."""
        from deep_delta.train.config import TrainConfig

        return TrainConfig(**self.train, variant=variant, out=f"tasks/{task.name}", seq_len=task.seq_len,
                           save_every=0, seed=seed, device=device, dtype="float32", on_divergence="stop")


def _item(assignments: list[str], *keys: str) -> str:
    """The last of ``assignments`` that set one of ``keys`` (what an error about the first key quotes)."""
    return next((item for item in reversed(assignments) if parse_assignment(item)[0] in keys), keys[0])


def model_fields() -> set[str]:
    """The DDLConfig fields ``model.FIELD`` may set (variant and preset are chosen by name, not set)."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    return DDLConfig.field_names() - {"variant", "preset"}


def resolve_task(name: str, settings: TaskSettings) -> Task:
    """The task ``name`` with the parameters of ``settings.task``."""
    return get_task(name, **settings.task)


def model_config(task: Task, variant: str, settings: TaskSettings):
    """The variant's DDLConfig at the settings' preset, narrowed by their ``model``, with the task's vocabulary and
    sequence length (unless ``model`` sets them)."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    model = settings.train["model"]
    overrides = {"vocab_size": task.vocab_size, "max_position_embeddings": task.seq_len, **model}
    cfg = DDLConfig.from_variant(variant, settings.train["preset"], **overrides)  # a bad type is named here
    if cfg.vocab_size < task.vocab_size or cfg.max_position_embeddings < task.seq_len:
        raise ValueError(f"`model.vocab_size` {cfg.vocab_size} / `model.max_position_embeddings` "
                         f"{cfg.max_position_embeddings}; allowed: at least the task's vocabulary "
                         f"{task.vocab_size} and sequence length {task.seq_len}")
    return cfg
