"""Weights & Biases beside ``metrics.jsonl``: :class:`WandbSink` takes the trainer's records, and the
comparison, the task studies and ``ddl eval lm-eval`` open a run through the same :func:`start_wandb` to log
their tables.

    sink = start_wandb(project=None, name="ddl-cc", config={...}, directory="runs/x", say=print)
    if sink is not None:            # None: no wandb package, or W&B refused the run (one line said why)
        sink.log({"step": 1, "loss": 2.3})
        sink.close()

W&B is optional and never stops the work it watches: a missing package, a refused login or an error inside
wandb is one line through ``say`` and no run (or, for a run already open, no more logging). The mode is
``WANDB_MODE`` when the environment sets it; otherwise online when an API key is configured
(``WANDB_API_KEY``, ``WANDB_IDENTITY_TOKEN_FILE`` or the netrc entry ``wandb login`` writes) and offline
when none is, said in one line: the run is then written under ``DIRECTORY/wandb/`` (``$WANDB_DIR/wandb/``
when that is set) for ``wandb sync`` to upload later.
"""

from __future__ import annotations

import json
import netrc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from deep_delta.fsutil import atomic_write
from deep_delta.train.metrics import MetricsSink, scalars

DEFAULT_PROJECT = "deep-delta-learning"
# The W&B run a directory belongs to (its id, project, group, name), written atomically: `ddl train --resume`
# continues that run, and `ddl compare` keeps its group here.
WANDB_FILE = "wandb.json"
INSTALL = "pip install 'deep-delta-learning[wandb]'"
MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # what wandb accepts as WANDB_MODE


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def has_credentials() -> bool:
    """Whether an API key is configured for the W&B host (``WANDB_BASE_URL``, default api.wandb.ai): in the
    environment, or in the netrc file (``$NETRC``, default ``~/.netrc``) where ``wandb login`` stores it."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    path = os.environ.get("NETRC") or Path.home() / ".netrc"
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def resolve_mode() -> tuple[str, bool]:
    """(mode, chosen): ``WANDB_MODE`` as set, else online with credentials and offline without; ``chosen`` is
    True when offline was chosen here for want of credentials."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], False
    return ("online", False) if has_credentials() else ("offline", True)


class WandbSink(MetricsSink):
    """One open W&B run: the trainer's records at their ``step`` (``step`` is every chart's x-axis, so a
    resumed run continues its curves), a summary, tables and figures. After the first error inside wandb it
    says one line, finishes the run and logs nothing more."""

    def __init__(self, run, wandb_module, say: Callable[[str], None] = print):
        self.run, self._wandb, self.say = run, wandb_module, say
        self.id: str = run.id
        self.mode: str = run.settings.mode
        self.directory = Path(run.dir).parent  # the run's own folder: OUT/wandb/offline-run-..._ID

    def _do(self, what: str, action: Callable[[], Any]) -> None:
        if self.run is None:
            return
        try:
            action()
        except Exception as e:  # wandb's errors are many and its own; none may stop training
            self.say(f"W&B: {what} failed ({_first_line(e)}); going on without W&B")
            self.close(exit_code=1)

    def log(self, record: dict[str, Any]) -> None:
        self._do("logging", lambda: self.run.log(scalars(record)))

    def summary(self, values: dict[str, Any]) -> None:
        self._do("the summary", lambda: self.run.summary.update(values))

    def table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        """``rows`` under ``key`` as a ``wandb.Table`` (one list per row, in ``columns`` order)."""
        self._do(f"the table {key!r}", lambda: self.run.log({key: self._wandb.Table(columns=columns, data=rows)}))

    def image(self, key: str, path: str | os.PathLike) -> None:
        self._do(f"the figure {key!r}", lambda: self.run.log({key: self._wandb.Image(str(path))}))

    def close(self, exit_code: int = 0) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        try:
            run.finish(exit_code=exit_code)
        except Exception as e:
            self.say(f"W&B: finishing run {self.id} failed ({_first_line(e)})")


def start_wandb(*, project: str | None, name: str | None, config: dict[str, Any], directory: str | os.PathLike,
                group: str | None = None, job_type: str = "train", run_id: str | None = None,
                say: Callable[[str], None] = print) -> WandbSink | None:
    """Open a W&B run (``run_id``: continue that run, ``resume="allow"``), or say in one line why there is none
    and return None. ``project`` None is :data:`DEFAULT_PROJECT`; the files go under ``directory/wandb/``
    unless ``WANDB_DIR`` is set."""
    try:
        import wandb
    except ImportError:
        say(f"W&B: the wandb package is not installed ({INSTALL}); going on without W&B")
        return None
    mode, chosen = resolve_mode()
    if mode not in MODES:
        say(f"W&B: WANDB_MODE got {mode!r}; allowed: {', '.join(MODES[:3])}; going on without W&B")
        return None
    root = Path(os.environ.get("WANDB_DIR") or directory)
    if chosen:
        say(f"W&B: no API key configured (WANDB_API_KEY or `wandb login`): logging offline under {root / 'wandb'}; "
            f"upload with `wandb sync {root / 'wandb'}/offline-run-*`")
    try:
        root.mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=project or DEFAULT_PROJECT, name=name, group=group, job_type=job_type,
                         config=config, id=run_id, resume="allow" if run_id else None, dir=str(root), mode=mode)
        run.define_metric("step")
        run.define_metric("*", step_metric="step")
    except Exception as e:  # a refused login, no network: said, and the work goes on
        say(f"W&B: could not start a run ({_first_line(e)}); going on without W&B")
        return None
    return WandbSink(run, wandb, say)


def read_wandb_file(directory: str | os.PathLike, say: Callable[[str], None] = print) -> dict[str, Any]:
    """``DIRECTORY/wandb.json`` (the W&B run or group the directory belongs to), or {} when there is none or it
    cannot be read (said in one line: a new W&B run is then started)."""
    path = Path(directory) / WANDB_FILE
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        say(f"W&B: {path} cannot be read ({_first_line(e)}); starting a new W&B run")
        return {}
    if not isinstance(values, dict):
        say(f"W&B: {path} holds no JSON object; starting a new W&B run")
        return {}
    return values


def write_wandb_file(directory: str | os.PathLike, **values: Any) -> None:
    atomic_write(Path(directory) / WANDB_FILE, json.dumps(values, indent=2, sort_keys=True) + "\n")


def generate_id() -> str:
    """A fresh W&B-style run or group id (8 characters of [a-z0-9])."""
    import secrets
    import string

    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def start_run_sink(trainer) -> WandbSink | None:
    """The W&B run of a training run (rank 0): its config, the model, parameter count and data; a resumed run
    continues the W&B run whose id ``OUT/wandb.json`` holds, and a run that logs to W&B from a resumed session
    on sends its earlier records first. None (said in one line) without W&B."""
    cfg, out, say = trainer.cfg, trainer.out, trainer.say
    saved = read_wandb_file(out, say=say) if trainer.resume and not trainer.overwrite else {}
    config = {**cfg.to_dict(), "model_overrides": cfg.model, "model": trainer.model_config.to_dict(),
              "parameters": trainer.n_params, "world_size": trainer.info.world_size, "grad_accum": trainer.accum,
              "tokens_per_step": trainer.tokens_per_step,
              "data": trainer.data.record() if trainer.data is not None else None}
    name = cfg.wandb_run_name or f"{cfg.variant}-{cfg.preset}-s{cfg.seed}"
    sink = start_wandb(project=cfg.wandb_project, name=name, group=cfg.wandb_group, config=config,
                       directory=out, run_id=saved.get("id"), say=say)
    if sink is None:
        return None
    write_wandb_file(out, id=sink.id, project=sink.run.project, name=name, group=cfg.wandb_group, mode=sink.mode)
    if saved.get("id"):
        say(f"W&B: continuing run {sink.id} ({sink.mode})")
    elif trainer.step > 0:
        from deep_delta.train.metrics import METRICS_FILE, read_metrics

        for record in read_metrics(out / METRICS_FILE):
            sink.log(record)
    return sink
