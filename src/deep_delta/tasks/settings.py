"""What a mechanism-task run depends on besides its task, variant and seed: :class:`TaskSettings`, with no import
of PyTorch (``ddl tasks``'s parser reads its defaults from here), and the task and model config they give.

    settings = TaskSettings().with_assignments(["steps=200", "model.num_hidden_layers=2"])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from deep_delta.settings import check_count, check_fields, parse_assignment, parse_assignments, setting
from deep_delta.tasks import Task, get_task
from deep_delta.variants import PRESETS

# The model: the tiny preset narrowed to d = 64 (4 layers, 4 heads of 16), so that a run of the default
# 1000 steps takes minutes on a CPU core; the vocabulary and the positions are the task's own (model_config).
# Embeddings drawn at std 0.3, not the presets' 0.02 (GPT-2's, for d = 768): at d = 64 and 0.02 a token's
# embedding (norm 0.16) is drowned by what the sublayers write, and no variant learned a content lookup (recall
# stayed at its shortcut for 15,000 steps); at 0.1 the baseline learns recall and the DDL variants, whose
# sublayers each write a value of size about 2 along k, do not; at 0.3 every variant does (docs/tasks.md).
MODEL_DEFAULTS: dict[str, Any] = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                      initializer_range=0.3)
GROUPS = ("model", "task")  # the settings that ``--set GROUP.NAME=VALUE`` fills one entry of


@dataclass
class TaskSettings:
    """Everything a (task, variant, seed) run depends on besides those three; ``--set KEY=VALUE`` sets a field,
    ``model.FIELD`` a DDLConfig field, ``task.PARAM`` a task parameter (``ddl tasks list`` shows them). Each
    field's metadata holds the help of its ``ddl tasks run`` flag (``--field-name``)."""

    preset: str = setting("tiny", "model size, before the model.FIELD settings narrow it (see --set)",
                          choices=tuple(PRESETS))
    steps: int = setting(1000, "optimizer steps per run")
    batch_size: int = setting(32, "sequences per step", metavar="B")
    lr: float = setting(2e-3, "peak learning rate")
    warmup_steps: int = setting(50, "linear warm-up steps")
    min_lr_ratio: float = setting(0.1, "final learning rate as a fraction of --lr")
    weight_decay: float = setting(0.1, "AdamW weight decay on matrices")
    betas: list[float] = setting(help="AdamW betas", factory=lambda: [0.9, 0.98], metavar=("B1", "B2"))
    grad_clip: float = setting(1.0, "clip the gradient norm to this (0: off)")
    log_every: int = setting(25, "the training-loss curve: the mean loss of each N steps")
    eval_every: int = setting(200, "the accuracy curve: accuracy on the first --eval-size test sequences every N "
                              "steps (0: only at the end)")
    eval_size: int = setting(500, "sequences of the accuracy curve, and of the validation set an lr grid chooses on")
    test_size: int = setting(2000, "sequences of the fixed test set (flip-flop: at most this many)")
    test_seed: int = setting(1234, "seed of the test and validation sequences (the same for every run)")
    model: dict[str, Any] = setting(help="DDLConfig fields over the preset's (--set model.FIELD=VALUE); default: "
                                    "width 64, 4 layers of 4 heads, embeddings drawn at std 0.3",
                                    factory=lambda: dict(MODEL_DEFAULTS))
    task: dict[str, Any] = setting(help="the task's parameters (--set task.PARAM=VALUE; `ddl tasks list` shows "
                                   "them)", factory=dict)

    def __post_init__(self):
        check_fields(self)  # the types, from the annotations
        for name in ("steps", "batch_size", "test_size", "log_every", "eval_size"):
            check_count(name, getattr(self, name), 1, owner="TaskSettings")
        for name in ("warmup_steps", "eval_every"):
            check_count(name, getattr(self, name), 0, owner="TaskSettings")
        if self.lr <= 0:
            raise _bad("lr", self.lr, "a number > 0")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise _bad(name, getattr(self, name), "a number >= 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise _bad("min_lr_ratio", self.min_lr_ratio, "a number in [0, 1]")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):  # numbers: check_fields
            raise _bad("betas", self.betas, "two numbers in [0, 1), e.g. [0.9, 0.98]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_assignments(self, assignments: list[str]) -> TaskSettings:
        """These settings with ``KEY=VALUE`` strings applied (:func:`deep_delta.settings.parse_assignments`, as
        ``ddl train --set``); ``model.FIELD`` and ``task.PARAM`` set one entry of ``model`` / ``task``."""
        given = parse_assignments(assignments, groups=GROUPS)
        values = self.to_dict()
        fields = sorted(f.name for f in dataclasses.fields(self) if f.name not in GROUPS)
        for key, value in given.items():
            if key in GROUPS and isinstance(value, dict):
                unknown = sorted(value.keys() - model_fields()) if key == "model" else []
                if unknown:
                    item = _item(assignments, f"model.{unknown[0]}", "model")
                    raise ValueError(f"`assignments` got {item!r}: DDLConfig has no field {unknown[0]!r}; allowed "
                                     f"model fields: {', '.join(sorted(model_fields()))}")
                values[key].update(value)
            elif key in fields:
                values[key] = value
            else:
                raise ValueError(f"`assignments` got {_item(assignments, key)!r}: no setting {key!r}; allowed: "
                                 f"{', '.join(fields)}, model.FIELD (a DDLConfig field) or task.PARAM "
                                 "(a task parameter, see `ddl tasks list`)")
        return TaskSettings(**values)


def _item(assignments: list[str], *keys: str) -> str:
    """The last of ``assignments`` that set one of ``keys`` (what an error about the first key quotes)."""
    return next((item for item in reversed(assignments) if parse_assignment(item)[0] in keys), keys[0])


def _bad(name: str, got: Any, allowed: str) -> ValueError:
    return ValueError(f"TaskSettings: `{name}` got {got!r}; allowed: {allowed}")


def model_fields() -> set[str]:
    """The DDLConfig fields ``model.FIELD`` may set (variant and preset are chosen by name, not set)."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    return DDLConfig.field_names() - {"variant", "preset"}


def resolve_task(name: str, settings: TaskSettings) -> Task:
    """The task ``name`` with the parameters of ``settings.task``."""
    return get_task(name, **settings.task)


def model_config(task: Task, variant: str, settings: TaskSettings):
    """The variant's DDLConfig at ``settings.preset``, narrowed by ``settings.model``, with the task's
    vocabulary and sequence length (unless ``settings.model`` sets them)."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    overrides = {"vocab_size": task.vocab_size, "max_position_embeddings": task.seq_len, **settings.model}
    cfg = DDLConfig.from_variant(variant, settings.preset, **overrides)  # a value of the wrong type is named here
    if cfg.vocab_size < task.vocab_size or cfg.max_position_embeddings < task.seq_len:
        raise ValueError(f"`model.vocab_size` {cfg.vocab_size} / `model.max_position_embeddings` "
                         f"{cfg.max_position_embeddings}; allowed: at least the task's vocabulary "
                         f"{task.vocab_size} and sequence length {task.seq_len}")
    return cfg
