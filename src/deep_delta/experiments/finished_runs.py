"""Finished runs brought together (``ddl compare --report-only``): each run is what its own record says, never
what its directory's name says.

A comparison made in parts, on several machines, is summarised from its run directories alone (their run.json and
metrics.jsonl; no checkpoint). Everything the report uses is read from each run's ``run.json``: its variant, seed,
lr, steps and settings (``train_config``), its end (``finished``: the step, the last evaluation, why it diverged)
and its data. Then each run is checked:

- against where it stands: the folder of its variant, of its seed (``seed_S/``, several seeds) and of its lr
  (``lr_<lr>/``, a grid); a folder name that is not one ``ddl compare`` writes (``seed_abc``, ``lr_nan``,
  ``lr_4e-3`` for the lr it names ``lr_0.004``) is refused (and :func:`deep_delta.experiments.compare.
  collect_comparison` checks that each run stands exactly where ``ddl compare`` puts it);
- against itself: its metrics.jsonl must be there, complete (every line a record) and end where run.json says the
  run ended, with the validation loss run.json records;
- against the others: each (variant, seed, lr) once, and never two copies of one run (the same run.json's
  identity in two places, or the same metrics in two runs); every result-changing setting but variant, seed, lr
  and steps and the data shared; one step count per variant; every variant with every seed (and at every lr).

Any disagreement is one refusal naming the run and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deep_delta.train.config import TrainConfig

SEED_DIR = re.compile(r"seed_(0|[1-9][0-9]*)")
# the train_config fields a run's identity is read from (the defaults never stand in for them)
IDENTITY = ("variant", "seed", "lr", "steps")


@dataclass
class FinishedRun:
    """One finished run as its own record describes it."""

    dir: Path
    cfg: TrainConfig  # its settings, from run.json's train_config
    record: dict[str, Any]  # run.json
    end: dict[str, Any]  # run.json's `finished`
    folder_seed: int | None  # the seed of the seed_S/ folder it stands in (None: VARIANT/ directly)

    @property
    def key(self) -> tuple[str, int, float]:
        return self.cfg.variant, self.cfg.seed, self.cfg.lr

    @property
    def name(self) -> str:
        return f"{self.cfg.variant} seed {self.cfg.seed} at lr {self.cfg.lr:g}"

    @property
    def diverged(self) -> str | None:
        return self.end["diverged"]

    @property
    def fingerprint(self) -> str | None:
        data = self.record.get("data")
        return data.get("fingerprint") if isinstance(data, dict) else None


def lr_of_folder(folder: Path) -> float:
    """The lr a grid's folder stands for: ``lr_<lr>`` exactly as ``ddl compare --lrs`` names it
    (:func:`~deep_delta.experiments.lr_grid.lr_name`: 6 significant digits, ``lr_0.004`` for 4e-3); any other
    name is refused, naming the folder."""
    from deep_delta.experiments.lr_grid import lr_name

    try:
        lr = float(folder.name[3:])
    except ValueError:
        lr = math.nan
    if not math.isfinite(lr) or lr <= 0 or lr_name(lr) != folder.name:
        named = f" (`ddl compare --lrs` names the folder of lr {lr:g} {lr_name(lr)})" if math.isfinite(lr) \
            and lr > 0 else ""
        raise ValueError(f"{folder} is not an lr folder of a grid{named}; allowed: lr_<lr> with a finite lr > 0, "
                         "named as `ddl compare --lrs` names it (6 significant digits, e.g. lr_0.004)")
    return lr


def find_runs(where: Path, lr: float | None = None) -> list[FinishedRun]:
    """Every run under ``where`` (one comparison: ``VARIANT/`` for one seed, ``seed_S/VARIANT/`` for several;
    ``lr``: the lr of the grid folder ``where`` is), each read and checked on its own (:func:`read_run`). A folder of
    a variant's name without a finished run, a seed folder without runs or of a name ``ddl compare`` never writes,
    and both layouts in one place are refused."""
    from deep_delta.variants import VARIANTS

    entries = sorted(where.iterdir())
    variant_dirs = [d for d in entries if d.name in VARIANTS]
    seed_dirs = [d for d in entries if d.name.startswith("seed_")]
    if variant_dirs and seed_dirs:
        raise ValueError(f"{where} holds runs of one seed ({variant_dirs[0].name}/) and seed folders "
                         f"({seed_dirs[0].name}/); allowed: one layout, VARIANT/ for one seed or seed_S/VARIANT/ for "
                         "several, as `ddl compare` writes it")
    found: list[tuple[Path, int | None]] = [(d, None) for d in variant_dirs]
    for folder in seed_dirs:
        m = SEED_DIR.fullmatch(folder.name)
        if m is None or not folder.is_dir():
            raise ValueError(f"{folder} is not a seed folder of a comparison; allowed: seed_<integer>/ (seed_0, "
                             "seed_1, ...) holding that seed's runs, as `ddl compare --seeds` writes them")
        runs = [d for d in sorted(folder.iterdir()) if d.name in VARIANTS]
        if not runs:
            raise FileNotFoundError(f"{folder} holds no run (VARIANT/ folders); allowed: a seed folder of a "
                                    "comparison with its finished runs")
        found += [(d, int(m.group(1))) for d in runs]
    if not found:
        raise FileNotFoundError(f"{where} holds no run directories (VARIANT/run.json or seed_S/VARIANT/run.json); "
                                "allowed: the `out` of a `ddl compare` whose runs have finished")
    return [read_run(d, seed, lr) for d, seed in found]


def read_run(run_dir: Path, folder_seed: int | None = None, folder_lr: float | None = None) -> FinishedRun:
    """One finished run from its run.json, checked against the folders it stands in (its variant's, its seed's
    ``folder_seed``, its lr's ``folder_lr``) and against its own metrics.jsonl (:func:`check_metrics`)."""
    from deep_delta.train.run_dir import RUN_FILE, RunNotFinished, read_run_file, run_end

    path = run_dir / RUN_FILE
    record = read_run_file(run_dir)
    try:
        end = run_end(run_dir, record)
    except RunNotFinished as e:
        raise ValueError(f"{e}; finish it with the `ddl compare` that started it (runs are resumed), or leave it "
                         "out of the comparison") from None
    settings = record["train_config"]
    missing = [k for k in IDENTITY if k not in settings]
    if missing:
        raise ValueError(f"{path}: train_config has no {', '.join(missing)}; allowed: a run "
                         "record naming its variant, seed, lr and steps, as `ddl train` writes it")
    try:
        cfg = TrainConfig.from_dict(settings)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    run = FinishedRun(run_dir, cfg, record, end, folder_seed)
    here = [(run_dir.name, cfg.variant, "variant", f"{run_dir.name}/")]
    if folder_seed is not None:
        here.append((folder_seed, cfg.seed, "seed", f"seed_{folder_seed}/"))
    if folder_lr is not None:
        from deep_delta.experiments.lr_grid import lr_name

        here.append((folder_lr, cfg.lr, "lr", f"{lr_name(folder_lr)}/"))
    for where, recorded, field, folder in here:
        if where != recorded:
            raise ValueError(f"{path} records {field} {recorded!r} (train_config.{field}), but the run stands in "
                             f"{folder}; allowed: each run in the folders of its own variant, seed and lr, as `ddl "
                             "compare` wrote it (a run copied or linked into another's place is refused)")
    if end["step"] > cfg.steps or (end["diverged"] is None and end["step"] != cfg.steps):
        raise ValueError(f"{path}: finished.step is {end['step']}, but the run's train_config.steps is "
                         f"{cfg.steps} and it did not diverge; allowed: the record of a run that trained all its steps")
    check_metrics(run)
    return run


def check_metrics(run: FinishedRun) -> list[dict[str, Any]]:
    """The records of the run's metrics.jsonl, every line of which must be one (a torn or truncated file is
    refused), the last training step the one run.json records as the run's end and the last validation loss the
    one it records there. Returns the records."""
    from deep_delta.train.metrics import METRICS_FILE
    from deep_delta.train.run_dir import RUN_FILE

    path = run.dir / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; a finished run is reported from its metrics.jsonl: copy it with "
                                "the run's run.json")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}): not a run's metrics") from None
    records = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise ValueError(f"{path}, line {i}: not a metrics record (the file is truncated or damaged); allowed: "
                             "the run's own metrics.jsonl, complete")
        records.append(rec)
    end, ran = run.end, [r for r in records if "loss" in r]
    last = ran[-1]["step"] if ran else 0
    if last != end["step"]:
        what = "is empty" if not records else f"ends at step {last}"
        raise ValueError(f"{path} {what}, but {run.dir / RUN_FILE} records the run's end at step {end['step']}: the "
                         "file is truncated or of another run; allowed: the run's own metrics.jsonl, complete")
    val = end["evaluation"].get("val_loss")
    if val is not None:
        vals = [r for r in records if "val_loss" in r]
        got = (vals[-1]["step"], vals[-1]["val_loss"]) if vals else None
        if got is None or got[0] != end["step"] or not _same(got[1], val):
            shown = "none" if got is None else f"{got[1]!r} at step {got[0]}"
            raise ValueError(f"{path}: its last validation loss ({shown}) is not the one {run.dir / RUN_FILE} records "
                             f"at the run's end ({val!r} at step {end['step']}); allowed: the run's own metrics.jsonl")
    return records


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def check_together(runs: list[FinishedRun], where: Path) -> None:
    """The runs of one comparison (or of every lr of a grid) brought together: each (variant, seed, lr) once and no
    two copies of one run; every result-changing setting but variant, seed, lr and steps, and the data, the same;
    one step count per variant; every variant with every seed at every lr; within an lr, one lr."""
    from deep_delta.train.provenance import differences
    from deep_delta.train.run_dir import RESULT_NEUTRAL

    seen: dict[tuple, FinishedRun] = {}
    for run in runs:
        other = seen.setdefault(run.key, run)
        if other is not run:
            raise ValueError(f"the run of {run.name} stands twice, in {other.dir} and {run.dir} (copies or links of "
                             "one run); allowed: each variant, seed and lr once")
    digests: dict[str, FinishedRun] = {}
    for run in runs:
        digest = hashlib.sha256((run.dir / "metrics.jsonl").read_bytes()).hexdigest()
        other = digests.setdefault(digest, run)
        if other is not run:
            raise ValueError(f"{run.dir} and {other.dir} hold the same metrics.jsonl: one run copied, its run.json "
                             f"changed to {run.name}; allowed: each run trained once")
    reference = runs[0]
    free = RESULT_NEUTRAL | {"variant", "seed", "out", "steps", "lr", "wandb_run_name", "data"}
    for run in runs:
        diff = differences(reference.cfg.to_dict(), run.cfg.to_dict(), skip=free, has="the reference run has")
        if run.fingerprint != reference.fingerprint:
            diff.append("the data (its fingerprint)")
        if diff:
            raise ValueError(f"the runs in {where} were not made with the same settings ({run.cfg.variant} seed "
                             f"{run.cfg.seed}: {'; '.join(diff)}); allowed: runs of one comparison, made with one "
                             f"command's settings (variant, seed, lr and steps may differ); the reference run: "
                             f"{reference.dir}")
    steps: dict[str, FinishedRun] = {}
    for run in runs:
        first = steps.setdefault(run.cfg.variant, run)
        if first.cfg.steps != run.cfg.steps:
            raise ValueError(f"{run.dir / 'run.json'} records steps {run.cfg.steps} (train_config.steps), but "
                             f"{first.dir} of the same variant trained {first.cfg.steps}; allowed: one step count per "
                             "variant (seeds and lrs of other lengths are not averaged)")
    variants = sorted({r.cfg.variant for r in runs})
    seeds = sorted({r.cfg.seed for r in runs})
    lrs = sorted({r.cfg.lr for r in runs})
    for v in variants:
        for s in seeds:
            for lr in lrs:
                if (v, s, lr) not in seen:
                    raise FileNotFoundError(f"{where} has no run of {v} seed {s} at lr {lr:g}, but has runs of that "
                                            "variant, seed and lr with the others; allowed: every variant with every "
                                            "seed (and at every lr of a grid)")


__all__ = ["FinishedRun", "check_metrics", "check_together", "find_runs", "lr_of_folder", "read_run"]
