"""lm-evaluation-harness for DDL models: the paper's eight tasks, 0-shot and 1-shot, as a Table-1-style table.

:class:`DDLHarnessLM` is a small ``lm_eval.api.model.TemplateLM`` over a loaded model and its HF tokenizer.
It needs neither ``accelerate`` nor network access (lm-eval's own ``HFLM`` requires accelerate and
reloads models by name); task data still comes from the datasets cache or local files.
"""

from __future__ import annotations

import difflib
import json
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
    try:
        import lm_eval  # noqa: F401
        from lm_eval.api.model import TemplateLM  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "lm-evaluation-harness is not installed; it is an optional extra: "
            "pip install 'deep-delta-learning[eval]' (or pip install lm-eval)"
        ) from e


def _template_lm_base():
    require_lm_eval()
    from lm_eval.api.model import TemplateLM

    return TemplateLM


def make_harness_lm(model, tokenizer, *, batch_size: int = 8, max_length: int | None = None):
    """A :class:`DDLHarnessLM` (built lazily so this module imports without lm-eval)."""
    cls = _harness_class()
    return cls(model, tokenizer, batch_size=batch_size, max_length=max_length)


_HARNESS_CLASS = None


def _harness_class():
    global _HARNESS_CLASS
    if _HARNESS_CLASS is not None:
        return _HARNESS_CLASS
    TemplateLM = _template_lm_base()
    import torch
    import torch.nn.functional as F
    from lm_eval import utils as lm_utils
    from tqdm.auto import tqdm

    class DDLHarnessLM(TemplateLM):
        """lm-eval model over a causal LM and an HF tokenizer: loglikelihood, rolling loglikelihood and greedy
        ``generate_until``. Requests are scored in batches of ``batch_size``, longest first, right-padded
        (a causal model never looks at the padding after a row's last token)."""

        def __init__(self, model, tokenizer, batch_size: int = 8, max_length: int | None = None):
            super().__init__()
            if batch_size < 1:
                raise ValueError(f"--batch-size: got {batch_size}; allowed: an integer >= 1")
            self.model, self.tokenizer = model, tokenizer
            self.batch_size = int(batch_size)
            self._max_length = int(max_length or model.config.max_position_embeddings)
            self._device = next(model.parameters()).device

        @property
        def eot_token_id(self) -> int:
            return self.tokenizer.eos_token_id

        @property
        def max_length(self) -> int:
            return self._max_length

        def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
            return self.tokenizer.encode(string, add_special_tokens=False, verbose=False)

        def tok_decode(self, tokens) -> str:
            return self.tokenizer.decode(tokens)

        @torch.no_grad()
        def _logprobs(self, rows: list[list[int]]) -> list[torch.Tensor]:
            """Log-softmax (fp32) of the model's logits for each row of token ids: [(len_i, V)]."""
            n = max(len(r) for r in rows)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eot_token_id
            batch = torch.full((len(rows), n), pad, dtype=torch.long)
            for i, r in enumerate(rows):
                batch[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            logits = self.model(input_ids=batch.to(self._device), use_cache=False).logits
            return [F.log_softmax(logits[i, : len(r)].float(), dim=-1) for i, r in enumerate(rows)]

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            """requests: [((context, continuation), context_ids, continuation_ids)] -> [(logprob, is_greedy)]."""
            prepared = []
            for idx, (_, ctx, cont) in enumerate(requests):
                if not cont:
                    raise ValueError("lm-eval request with an empty continuation")
                cont = cont[-self.max_length:]  # a continuation longer than the context keeps its end
                inp = (ctx + cont)[-(self.max_length + 1):][:-1]
                prepared.append((idx, inp, cont))
            prepared.sort(key=lambda r: -len(r[1]))  # similar lengths together; the longest batch first
            out: list[tuple[float, bool] | None] = [None] * len(requests)
            bar = tqdm(total=len(prepared), desc="loglikelihood", disable=disable_tqdm)
            for start in range(0, len(prepared), self.batch_size):
                chunk = prepared[start : start + self.batch_size]
                logps = self._logprobs([inp for _, inp, _ in chunk])
                for (idx, inp, cont), lp in zip(chunk, logps):
                    tail = lp[len(inp) - len(cont):]  # predictions of the continuation tokens
                    target = torch.tensor(cont, device=tail.device)
                    logprob = float(tail.gather(-1, target[:, None]).sum())
                    greedy = bool((tail.argmax(-1) == target).all())
                    out[idx] = (logprob, greedy)
                    if requests[idx][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[idx][0], out[idx])
                bar.update(len(chunk))
            bar.close()
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            results = []
            for (string,) in tqdm([r.args for r in requests], desc="rolling loglikelihood", disable=disable_tqdm):
                windows = [
                    lm_utils.make_disjoint_window(w)
                    for w in lm_utils.get_rolling_token_windows(
                        token_list=self.tok_encode(string),
                        prefix_token=self.prefix_token_id,
                        max_seq_len=self.max_length,
                        context_len=1,
                    )
                ]
                scores = self._loglikelihood_tokens([(None, c, t) for c, t in windows], disable_tqdm=True)
                total = sum(s for s, _ in scores)
                self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
                results.append(total)
            return results

        @torch.no_grad()
        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            """Greedy generation until a stop string (``until``) or ``max_gen_toks`` tokens."""
            from transformers import GenerationConfig

            results = []
            for context, gen_kwargs in tqdm([r.args for r in requests], desc="generate", disable=disable_tqdm):
                kwargs = dict(gen_kwargs or {})
                until = kwargs.get("until") or [self.tok_decode([self.eot_token_id])]
                until = [until] if isinstance(until, str) else list(until)
                max_gen = int(kwargs.get("max_gen_toks", 256))
                max_gen = max(1, min(max_gen, self.max_length - 1))
                ids = self.tok_encode(context)[-(self.max_length - max_gen):] or [self.eot_token_id]
                cfg = GenerationConfig(max_new_tokens=max_gen, do_sample=False, eos_token_id=self.eot_token_id,
                                       pad_token_id=self.eot_token_id)
                out = self.model.generate(input_ids=torch.tensor([ids], device=self._device), generation_config=cfg)
                text = self.tok_decode(out[0, len(ids):].tolist())
                for stop in until:
                    if stop:
                        text = text.split(stop)[0]
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                results.append(text)
            return results

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
            raise FileNotFoundError(f"--include-path: {p} does not exist (expected a directory of task YAMLs)")
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
            raise ValueError(f"--tasks: lm-eval does not know the task {t!r}; {hint}")
        out.append(t)
    if not out:
        raise ValueError("--tasks: got no task names")
    return out


def _load_tasks(manager, tasks: list[str]) -> list:
    try:
        loaded = manager.load(tasks)
    except (ConnectionError, OSError) as e:
        raise RuntimeError(
            f"cannot load the data of the lm-eval task(s) {', '.join(tasks)} ({type(e).__name__}: {e}). "
            "lm-eval reads task data through Hugging Face datasets: offline, set HF_DATASETS_OFFLINE=1 and "
            "HF_HUB_OFFLINE=1 with the data sets already in the cache ($HF_HOME), or point --include-path at "
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
            raise ValueError(f"--num-fewshot: got {shots}; allowed: integers >= 0")
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
        raise ValueError(f"--metric: got {metric!r}; allowed: {' | '.join(METRIC_CHOICES)}")
    want = PAPER_METRICS.get(task, "acc_norm") if metric == "paper" else metric
    for m in (want, "acc"):
        if m in scores:
            return m, scores[m]
    return want, None


def results_table(runs: Sequence[HarnessRun], tasks: Sequence[str], metric: str = "paper") -> str:
    """Markdown, Table 1 style: a row per model and few-shot count, a column per task, then the average (%)."""
    titles = [TASK_TITLES.get(t, t) for t in tasks]
    lines = ["| Model | Shots | " + " | ".join(titles) + " | Avg. |", "|---|---|" + "---|" * (len(tasks) + 1)]
    for run in runs:
        for shots, per_task in sorted(run.scores.items()):
            vals = [pick_metric(t, per_task.get(t, {}), metric)[1] for t in tasks]
            cells = ["-" if v is None else f"{100 * v:.2f}" for v in vals]
            got = [v for v in vals if v is not None]
            avg = f"{100 * sum(got) / len(got):.2f}" if len(got) == len(vals) and got else "-"
            lines.append(f"| {run.name} | {shots} | " + " | ".join(cells) + f" | {avg} |")
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
    path.write_text((header + "\n\n" if header else "") + table + "\n")
    raw = {r.name: {str(s): v for s, v in r.raw.items()} for r in runs}
    path.with_suffix(".json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    return path
