"""lm-evaluation-harness for DDL models: the paper's eight tasks, 0-shot and 1-shot, as a Table-1-style table.

:class:`DDLHarnessLM` is lm-eval's own ``HFLM`` over a loaded model object and its HF tokenizer (it needs
``accelerate``, which HFLM imports); only HFLM's hub look-up of a commit sha is skipped, so nothing is reloaded
by name or fetched. Task data still comes from the datasets cache or local files.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

# The paper's tasks (Tables 1, 2, 7, 8) under lm-eval's names, with the column titles the paper uses.
PAPER_TASKS = ("arc_challenge", "arc_easy", "hellaswag", "openbookqa", "piqa", "sciq", "social_iqa", "winogrande")
TASK_TITLES = {
    "arc_challenge": "ARC-C",
    "arc_easy": "ARC-E",
    "hellaswag": "Hellaswag",
    "openbookqa": "OpenBookQA",
    "piqa": "PIQA",
    "sciq": "SciQ",
    "social_iqa": "Social IQA",
    "winogrande": "WG",
}
# The paper does not name its metric per task; we report the usual choice for small LMs: length-normalised
# accuracy where lm-eval offers it for multi-token answers, plain accuracy for SciQ, Social IQA and WinoGrande.
PAPER_METRICS = {
    "arc_challenge": "acc_norm",
    "arc_easy": "acc_norm",
    "hellaswag": "acc_norm",
    "openbookqa": "acc_norm",
    "piqa": "acc_norm",
    "sciq": "acc",
    "social_iqa": "acc",
    "winogrande": "acc",
}
METRIC_CHOICES = ("paper", "acc", "acc_norm")


def require_lm_eval():
    """Refuse (:class:`~deep_delta.extras.MissingExtra`, an ImportError naming the ``eval`` extra) unless lm-eval and
    accelerate (which lm-eval's ``HFLM`` imports) are installed."""
    from deep_delta.extras import require

    require("lm_eval", "`ddl eval lm-eval` (lm-evaluation-harness)")
    require("accelerate", "lm-evaluation-harness's HFLM, which scores the model,")


def make_harness_lm(model, tokenizer, *, batch_size: int = 8, max_length: int | None = None):
    """lm-eval's ``HFLM`` over an in-memory causal LM and its HF tokenizer (a :class:`DDLHarnessLM`).

    ``batch_size`` requests are scored per forward (longest first, right-padded); ``max_length`` defaults
    to the model's ``max_position_embeddings`` (longer contexts keep their end). Log-softmax runs in fp32
    whatever the model's dtype. Nothing is loaded by name and nothing is looked up on the hub.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: got {batch_size!r}; allowed: an integer >= 1")
    if max_length is None:
        max_length = model.config.max_position_embeddings
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length: got {max_length!r}; allowed: an integer >= 2 (or None: the model's context)")
    cls = _harness_class()
    import torch

    # HFLM warns at length that a model object (not a name) was passed; that is the intended use here
    hf_logger = logging.getLogger("lm_eval.models.huggingface")
    level = hf_logger.level
    hf_logger.setLevel(logging.ERROR)
    try:
        return cls(
            pretrained=model,
            tokenizer=tokenizer,
            backend="causal",  # our model_type is registered with AutoModelForCausalLM, not in HF's static table
            batch_size=batch_size,
            max_length=max_length,
            softmax_dtype=torch.float32,
            # HFLM's logits cache scores one forward per group of requests with equal context + continuation[:-1];
            # in lm-eval 0.4.13 a member with a shorter continuation than the group's longest is scored on the
            # group's first positions instead of its last (torch.gather without the trailing slice): wrong
            # numbers, e.g. in rolling windows over repetitive text. Off: every request gets its own row.
            logits_cache=False,
        )
    finally:
        hf_logger.setLevel(level)


_HARNESS_CLASS = None


def _harness_class():
    """``DDLHarnessLM``: HFLM without its hub look-up (built lazily so this module imports without lm-eval)."""
    global _HARNESS_CLASS
    if _HARNESS_CLASS is not None:
        return _HARNESS_CLASS
    require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    class DDLHarnessLM(HFLM):
        """lm-eval's ``HFLM`` over a model object: loglikelihood, rolling loglikelihood and ``generate_until``
        are HFLM's own. Changed: ``get_model_info`` asks no hub for a commit sha (HFLM's would, for a
        name), and the default generation budget fits inside short contexts."""

        def get_model_info(self) -> dict:
            model = self._model
            return {
                "model_num_parameters": sum(p.numel() for p in model.parameters()),
                "model_dtype": str(next(model.parameters()).dtype),
                "model_revision": None,
                "model_sha": "",
            }

        @property
        def max_gen_toks(self) -> int:
            # HFLM's default of 256 new tokens; at most max_length - 1, so one context token fits
            return max(1, min(256, self.max_length - 1))

    _HARNESS_CLASS = DDLHarnessLM
    return DDLHarnessLM


@dataclass
class HarnessRun:
    """Scores of one model: ``scores[shots][task]`` = {"acc": ..., "acc_norm": ..., ...} (fractions)."""

    name: str
    scores: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)
    raw: dict[int, Any] = field(default_factory=dict)


def task_manager(
    include_path: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    tasks: Sequence[str] | None = None,
):
    """lm-eval's TaskManager over ``include_path`` and its built-in tasks (cached per process).

    Indexing the ~200 built-in task folders takes seconds; when every name in ``tasks`` is defined under
    ``include_path``, a manager over those folders alone is returned.
    """
    if include_path is None:
        paths: tuple[str, ...] = ()
    elif isinstance(include_path, (str, os.PathLike)):
        paths = (str(include_path),)
    else:
        paths = tuple(str(p) for p in include_path)
    for p in paths:
        if not Path(p).exists():
            raise FileNotFoundError(f"`include_path`: {p} does not exist (expected a directory of task YAMLs)")
    if paths and tasks:
        local = _task_manager(paths, False)
        if set(tasks) <= set(local.all_tasks):
            return local
    return _task_manager(paths, True)


@lru_cache(maxsize=8)
def _task_manager(paths: tuple[str, ...], include_defaults: bool):
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths) or None, include_defaults=include_defaults)


def check_tasks(tasks: Sequence[str], manager) -> list[str]:
    """Refuse task names lm-eval does not know, listing close matches."""
    known = set(manager.all_tasks)
    out = []
    for t in tasks:
        t = t.strip()
        if not t:
            continue
        if t not in known:
            close = difflib.get_close_matches(t, sorted(known), n=6, cutoff=0.6)
            hint = f"close matches: {', '.join(close)}" if close else "no close match; see `lm-eval ls tasks`"
            raise ValueError(f"`tasks`: lm-eval does not know the task {t!r}; {hint}")
        out.append(t)
    if not out:
        raise ValueError("`tasks` got no task names")
    return out


def _load_tasks(manager, tasks: list[str]) -> list:
    try:
        loaded = manager.load(tasks)
    except (ConnectionError, OSError) as e:
        raise RuntimeError(
            f"cannot load the data of the lm-eval task(s) {', '.join(tasks)} ({type(e).__name__}: {e}). "
            "lm-eval reads task data through Hugging Face datasets: offline, set HF_DATASETS_OFFLINE=1 and "
            "HF_HUB_OFFLINE=1 with the data sets already in the cache ($HF_HOME), or point `include_path` at "
            "task YAMLs over local files"
        ) from e
    return list(loaded["tasks"].values())


def _metric_values(task_result: dict[str, Any]) -> dict[str, float]:
    """{"acc": 0.41, "acc_stderr": ..., "acc_norm": ...} from lm-eval's "acc,none"-style keys."""
    out = {}
    for key, value in task_result.items():
        if "," not in key or not isinstance(value, (int, float)):
            continue
        metric, filt = key.split(",", 1)
        if filt == "none":
            out[metric] = float(value)
    return out


def evaluate_harness(
    lm,
    tasks: Sequence[str],
    *,
    num_fewshot: Sequence[int] = (0, 1),
    limit: int | float | None = None,
    include_path: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    name: str = "model",
    seed: int = 1234,
) -> HarnessRun:
    """Run lm-eval's ``simple_evaluate`` on ``lm`` for each few-shot count; the same path ``ddl eval lm-eval`` uses."""
    require_lm_eval()
    from lm_eval import evaluator

    manager = task_manager(include_path, tasks)
    tasks = check_tasks(tasks, manager)
    run = HarnessRun(name)
    for shots in num_fewshot:
        if shots < 0:
            raise ValueError(f"`num_fewshot` got {shots}; allowed: integers >= 0")
        task_objs = _load_tasks(manager, tasks)
        res = evaluator.simple_evaluate(
            model=lm,
            tasks=task_objs,
            num_fewshot=shots,
            limit=limit,
            task_manager=manager,
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
        run.raw[shots] = {k: res[k] for k in ("results", "n-shot", "n-samples", "versions") if k in res}
        run.scores[shots] = {t: _metric_values(r) for t, r in res["results"].items()}
    return run


def pick_metric(task: str, scores: dict[str, float], metric: str = "paper") -> tuple[str, float | None]:
    """The metric reported for ``task``: the paper's choice (acc_norm falls back to acc), or as asked."""
    if metric not in METRIC_CHOICES:
        raise ValueError(f"`metric` got {metric!r}; allowed: {' | '.join(METRIC_CHOICES)}")
    want = PAPER_METRICS.get(task, "acc_norm") if metric == "paper" else metric
    for m in (want, "acc"):
        if m in scores:
            return m, scores[m]
    return want, None


def results_rows(runs: Sequence[HarnessRun], tasks: Sequence[str], metric: str = "paper") -> list[list]:
    """The table's rows: [model, shots, each task's score in % (None where missing), the average in % (None
    unless every task has a score)], one per model and few-shot count."""
    rows = []
    for run in runs:
        for shots, per_task in sorted(run.scores.items()):
            vals = [pick_metric(t, per_task.get(t, {}), metric)[1] for t in tasks]
            pcts = [None if v is None else 100 * v for v in vals]
            avg = sum(pcts) / len(pcts) if pcts and None not in pcts else None
            rows.append([run.name, shots, *pcts, avg])
    return rows


def results_table(runs: Sequence[HarnessRun], tasks: Sequence[str], metric: str = "paper") -> str:
    """Markdown, Table 1 style: a row per model and few-shot count, a column per task, then the average (%)."""
    titles = [TASK_TITLES.get(t, t) for t in tasks]
    lines = ["| Model | Shots | " + " | ".join(titles) + " | Avg. |", "|---|---|" + "---|" * (len(tasks) + 1)]
    for name, shots, *cells in results_rows(runs, tasks, metric):
        lines.append(f"| {name} | {shots} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in cells) + " |")
    used = []
    for t in tasks:
        scores = next((r.scores[s].get(t, {}) for r in runs for s in r.scores), {})
        used.append(f"{TASK_TITLES.get(t, t)}: {pick_metric(t, scores, metric)[0]}")
    lines += ["", "Metric per task: " + ", ".join(used) + "."]
    return "\n".join(lines)


def write_results(path: str | os.PathLike, table: str, runs: Sequence[HarnessRun], header: str = "") -> Path:
    """Write the markdown table to ``path`` and the full lm-eval results beside it (``.json``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from deep_delta.fsutil import atomic_write

    atomic_write(path, (header + "\n\n" if header else "") + table + "\n")
    raw = {r.name: {str(s): v for s, v in r.raw.items()} for r in runs}
    atomic_write(path.with_suffix(".json"), json.dumps(raw, indent=2, default=str) + "\n")
    return path


def log_to_wandb(runs: Sequence[HarnessRun], tasks: Sequence[str], metric: str, *, config: dict[str, Any],
                 directory: str | os.PathLike, project: str | None = None, say=print) -> None:
    """The results as one W&B run (``lm-eval``, job type ``eval``): the table as printed (``lm_eval``: a row per
    model and few-shot count, scores in %), every metric lm-eval returned (``lm_eval_metrics``: model, shots,
    task, metric, value as a fraction) and ``config`` (models, tasks, shots, limit, ...)."""
    from deep_delta.train.wandb_sink import start_wandb

    sink = start_wandb(project=project, name="lm-eval", job_type="eval", config=config, directory=directory,
                       say=say)
    if sink is None:
        return
    titles = [TASK_TITLES.get(t, t) for t in tasks]
    sink.table("lm_eval", ["model", "shots", *titles, "Avg."], results_rows(runs, tasks, metric))
    sink.table("lm_eval_metrics", ["model", "shots", "task", "metric", "value"], [
        [run.name, shots, task, name, value] for run in runs for shots, per_task in sorted(run.scores.items())
        for task, values in per_task.items() for name, value in values.items()])
    sink.close()
