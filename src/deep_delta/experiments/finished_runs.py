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
  run ended, with the validation loss run.json records; it trained one warm-up and cosine schedule of its length (as
  run.json's ``segments`` record it, or, in a record written before segments were, as its metrics' lr column shows);
- against the others: each (variant, seed, lr) once, and never two copies of one run (the same run.json's
  identity in two places, or the same metrics in two runs); every result-changing setting but variant, seed, lr
  and steps and the data shared, and the kernel switches (where recorded); one step count per variant; every
  variant with every seed (and at every lr). What differs without changing a loss (the CPU threads, the torch, the
  code's commit) is said in the report (:func:`runs_machine`), whose machine record is the runs' own.

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

from deep_delta.train.config import TrainConfig, recorded

SEED_DIR = re.compile(r"seed_(0|[1-9][0-9]*)")
# the train_config fields a run's identity is read from (the defaults never stand in for them)
IDENTITY = ("variant", "seed", "lr", "steps")


def retrain_remedy(run_dir: Path | str) -> str:
    """How one run is trained again, and only that one: what a refusal of a run that only retraining mends ends
    with (``overwrite`` retrains every run of the study, the finished ones too)."""
    return (f"to retrain this run alone, remove {run_dir} and run the study's `ddl compare` again (it trains only the "
            "runs that are missing; `overwrite` would retrain every run in `out`)")


class NeedsRetraining(ValueError):
    """A finished run whose record cannot be reused as it is (another schedule than its length, a checkpoint it
    contradicts, a schedule that cannot be checked): its message ends with :func:`retrain_remedy`."""


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
        cfg = TrainConfig.from_dict(recorded(settings))  # a field it predates: as runs were made then
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    run = FinishedRun(run_dir, cfg, record, end, folder_seed)
    here = [(run_dir.name, cfg.variant, "variant", f"{run_dir.name}/")]
    if folder_seed is not None:
        here.append((folder_seed, cfg.seed, "seed", f"seed_{folder_seed}/"))
    if folder_lr is not None:
        from deep_delta.experiments.lr_grid import lr_name

        here.append((folder_lr, cfg.lr, "lr", f"{lr_name(folder_lr)}/"))
    for where, stored, field, folder in here:
        if where != stored:
            raise ValueError(f"{path} records {field} {stored!r} (train_config.{field}), but the run stands in "
                             f"{folder}; allowed: each run in the folders of its own variant, seed and lr, as `ddl "
                             "compare` wrote it (a run copied or linked into another's place is refused)")
    check_finished(run)
    return run


def check_finished(run: FinishedRun) -> list[dict[str, Any]]:
    """The one check of a finished run, before any report uses it (``ddl compare`` reusing it, ``--report-only``,
    the width / length study): its record and its metrics agree (the end at the claimed step, with its validation
    loss, and every validation the report reads: :func:`check_metrics`); it trained one continuous schedule of its
    claimed length (run.json's ``segments``: a run extended with ``ddl train --resume --steps N`` warm-restarted
    its schedule and is not an N-step run); where checkpoints exist, the latest one's own record (train_meta.json)
    holds the settings, variant, lr, seed and data run.json holds; and its model is its variant's. Any
    disagreement is one ``ValueError`` naming the file. Returns the metrics records."""
    from deep_delta.train.run_dir import RUN_FILE

    path, cfg, end = run.dir / RUN_FILE, run.cfg, run.end
    if end["step"] > cfg.steps or (end["diverged"] is None and end["step"] != cfg.steps):
        raise ValueError(f"{path}: finished.step is {end['step']}, but the run's train_config.steps is "
                         f"{cfg.steps} and it did not diverge; allowed: the record of a run that trained all its steps")
    _check_segments(run)
    _check_checkpoint(run)
    model = run.record.get("model_config")
    if isinstance(model, dict) and model.get("variant", cfg.variant) != cfg.variant:
        raise ValueError(f"{path}: model_config is a {model.get('variant')!r} model, but train_config.variant is "
                         f"{cfg.variant!r}; allowed: a run's own record (a run copied and relabelled is refused)")
    if isinstance(model, dict):  # a run is the design its name says (the one check: variants.check_variant)
        from deep_delta.variants import ROW_DEFAULTS, check_variant

        try:  # model_config holds the fields that differ from the defaults: a field it lacks has its default
            check_variant(cfg.variant, {**ROW_DEFAULTS, **model}, owner=f"{path}: model_config")
        except ValueError as e:
            raise ValueError(f"{e} (a run trained before the check, under another variant's name, is reported as what "
                             "it is only by training it again under its own)") from None
    records = check_metrics(run)
    if run.record.get("segments") is None:  # a record written before segments were: its lr column tells
        _check_lr_column(run, records)
    return records


def _check_segments(run: FinishedRun) -> None:
    """One schedule: every segment of run.json's ``segments`` (when recorded) on the run's own length, the
    segments contiguous from step 0 to the run's end."""
    segments = run.record.get("segments")
    if segments is None:
        return  # a run recorded before segments were: its metrics' lr column tells (_check_lr_column)
    path, steps = run.dir / "run.json", run.cfg.steps
    ok = isinstance(segments, list) and segments and all(isinstance(s, dict) for s in segments)
    if ok:
        starts = [s.get("from") for s in segments]
        ends = [s.get("to") for s in segments]
        ok = starts[0] == 0 and ends[-1] == run.end["step"] and starts[1:] == ends[:-1]
    if not ok:
        raise ValueError(f"{path}: `segments` is not one run's record of its schedule (contiguous steps from 0 to "
                         f"the end, step {run.end['step']}); allowed: the run's own run.json")
    other = [s for s in segments if s.get("steps") != steps]
    if other:
        parts = ", ".join(f"steps {s['from']}-{s['to']} on a {s.get('steps')}-step schedule" for s in segments)
        raise NeedsRetraining(f"{path}: the run trained {parts}: resumed with a changed `steps`, which restarts the "
                              f"warm-up and cosine schedule, so it is not one {steps}-step run; allowed: a run trained "
                              f"on one {steps}-step schedule; {retrain_remedy(run.dir)}")


# how close a recorded lr must be to the schedule's (both are one float64 product; the slack is for rounding only)
LR_TOLERANCE = 1e-9


def _check_lr_column(run: FinishedRun, records: list[dict[str, Any]]) -> None:
    """A run recorded without ``segments`` (before they were) trained one schedule of its length when its metrics'
    lr column is the warm-up and cosine of ``train_config`` (``warmup_steps``, ``steps``, ``min_lr_ratio``;
    :class:`~deep_delta.train.optim.WarmupCosine`) at every recorded step, scaled by the lr of its first step (the
    optimizer's first group may carry a multiplier; a ratio is what the schedule fixes). A column that leaves it is
    refused, naming the step where the schedule restarted (a run resumed with a changed ``steps``) or, where no tail
    of it fits, the first step that does not; one that cannot be checked is refused as unverifiable."""
    from deep_delta.train.metrics import metrics_file
    from deep_delta.train.optim import WarmupCosine

    path, run_file, steps = metrics_file(run.dir), run.dir / "run.json", run.cfg.steps
    settings = run.record["train_config"]
    trained = [r for r in records if "loss" in r]
    why = None
    missing = [k for k in ("warmup_steps", "min_lr_ratio") if k not in settings]
    if missing:
        why = f"its train_config records no {' or '.join(missing)}"
    elif not trained:
        why = f"{path} records no training step"
    else:
        bad = next((r["step"] for r in trained if isinstance(r.get("lr"), bool)
                    or not isinstance(r.get("lr"), (int, float)) or not math.isfinite(r["lr"]) or r["lr"] < 0), None)
        if bad is not None:
            why = f"{path} records no usable lr at step {bad}"
        elif trained[0]["lr"] == 0:
            why = f"{path} records lr 0 at its first step, {trained[0]['step']}: nothing to scale the schedule by"
    if why is not None:
        raise NeedsRetraining(f"{run_file} records no `segments` (written before they were), and whether the run "
                              f"trained one {steps}-step schedule cannot be checked from its metrics either ({why}): "
                              f"the record is unverifiable; allowed: a run whose record shows one schedule of its "
                              f"length; {retrain_remedy(run.dir)}")
    schedule = WarmupCosine(run.cfg.warmup_steps, steps, run.cfg.min_lr_ratio)
    first = trained[0]
    scale = first["lr"] / schedule(first["step"] - 1)  # record k holds the lr of the update of step k - 1 -> k
    expected = {r["step"]: scale * schedule(r["step"] - 1) for r in trained}
    off = [r for r in trained if not math.isclose(r["lr"], expected[r["step"]], rel_tol=LR_TOLERANCE, abs_tol=0.0)]
    if not off:
        return
    shape = (f"one {steps}-step warm-up and cosine schedule (`warmup_steps` {run.cfg.warmup_steps}, `min_lr_ratio` "
             f"{run.cfg.min_lr_ratio}, scaled by the lr of step {first['step']})")
    last = off[-1]
    if last["step"] < trained[-1]["step"]:
        restart = next(r["step"] for r in trained if r["step"] > last["step"])
        what = (f"its lr column follows {shape} only from step {restart}: at step {last['step']} it has "
                f"{last['lr']!r} where that schedule has {expected[last['step']]!r}, so the schedule restarted at step "
                f"{restart} (a run resumed with a changed `steps`) and this is not one {steps}-step run")
    else:
        what = (f"its lr at step {off[0]['step']} ({off[0]['lr']!r}) is not the one of {shape} "
                f"({expected[off[0]['step']]!r}): not the record of one {steps}-step run")
    raise NeedsRetraining(f"{path}: {what} ({run_file} records no `segments`, written before they were); allowed: a "
                          f"run trained on one {steps}-step schedule; {retrain_remedy(run.dir)}")


def _check_checkpoint(run: FinishedRun) -> None:
    """Where the run keeps checkpoints, the latest one's train_meta.json must record the settings (variant, lr,
    seed and every other result-changing one) and data of run.json."""
    from deep_delta.fsutil import read_json_file
    from deep_delta.train.checkpoint import CheckpointError, latest_checkpoint
    from deep_delta.train.provenance import differences
    from deep_delta.train.run_dir import run_identity

    try:
        latest = latest_checkpoint(run.dir)
    except (CheckpointError, FileNotFoundError) as e:
        raise ValueError(f"{run.dir}: {e}") from None
    if latest is None:
        return
    meta = read_json_file(latest / "train_meta.json", "a checkpoint's record (train_meta.json)")
    saved = meta.get("train_config") if isinstance(meta, dict) else None
    if not isinstance(saved, dict):
        raise ValueError(f"{latest / 'train_meta.json'} records no train_config; allowed: a checkpoint `ddl train` wrote")
    saved, mine = recorded(saved), run.cfg.to_dict()
    # its identity (what a resumed run may not change) and its length, which a finished run's last checkpoint shares
    diff = differences({**run_identity(saved, ""), "steps": saved.get("steps")},
                       {**run_identity(mine, ""), "steps": mine["steps"]}, skip={"data"}, has="the checkpoint has")
    diff = [d.replace(", now ", ", run.json ") for d in diff]
    stored = meta.get("data_fingerprint")
    if stored is not None and run.fingerprint is not None and stored != run.fingerprint:
        diff.append("the data (its fingerprint)")
    if diff:
        raise NeedsRetraining(f"{run.dir / 'run.json'} does not describe its own checkpoint {latest} "
                              f"({'; '.join(diff)}): the record was changed after training; allowed: a run's own "
                              f"record; {retrain_remedy(run.dir)}")


def check_metrics(run: FinishedRun) -> list[dict[str, Any]]:
    """The records of the run's metrics (``metrics.jsonl``, or the same packed, ``metrics.jsonl.gz``), every line of
    which must be one (a torn or truncated file is refused), the last training step the one run.json records as the
    run's end and the last validation loss the one it records there. Returns the records."""
    from deep_delta.train.metrics import METRICS_FILE, PACKED_METRICS_FILE, metrics_file, metrics_text
    from deep_delta.train.run_dir import RUN_FILE

    path = metrics_file(run.dir)
    if path is None:
        raise FileNotFoundError(f"{run.dir / METRICS_FILE} is missing (and so is its packed form, "
                                f"{PACKED_METRICS_FILE}); a finished run is reported from its metrics: copy them with "
                                "the run's run.json")
    text = metrics_text(path)
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
    _check_validations(run, records, path)
    val = end["evaluation"].get("val_loss")
    if val is not None:
        vals = [r for r in records if "val_loss" in r]
        got = (vals[-1]["step"], vals[-1]["val_loss"]) if vals else None
        if got is None or got[0] != end["step"] or not _same(got[1], val):
            shown = "none" if got is None else f"{got[1]!r} at step {got[0]}"
            raise ValueError(f"{path}: its last validation loss ({shown}) is not the one {run.dir / RUN_FILE} records "
                             f"at the run's end ({val!r} at step {end['step']}); allowed: the run's own metrics.jsonl")
    return records


def _check_validations(run: FinishedRun, records: list[dict[str, Any]], path: Path) -> None:
    """Every validation the report reads (the curve: every ``eval_every`` steps and the end) is in the metrics,
    each measured on the run's ``eval_batches``."""
    cfg, end = run.cfg, run.end
    vals = {r["step"]: r for r in records if "val_loss" in r}
    if not vals or end["diverged"] is not None:
        return  # a run without validation data, or one whose divergence ended it: its end is checked alone
    wanted = set(range(cfg.eval_every, end["step"] + 1, cfg.eval_every)) if cfg.eval_every else set()
    missing = sorted((wanted | {end["step"]}) - set(vals))
    if missing:
        raise ValueError(f"{path} has no validation record at step {missing[0]}, where a run validating every "
                         f"{cfg.eval_every} steps validated; allowed: the run's own metrics.jsonl, complete")
    other = sorted({r["eval_batches"] for r in vals.values() if r.get("eval_batches", cfg.eval_batches)
                    != cfg.eval_batches})
    if other:
        raise ValueError(f"{path} holds validation losses measured on {other[0]} batches, this comparison on "
                         f"{cfg.eval_batches} (`eval_batches`) as its run.json records it; allowed: the run's own "
                         "metrics.jsonl, every validation on the run's batches")


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
    check_copies(runs)
    check_switches(runs)
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
    check_models(runs)
    variants = sorted({r.cfg.variant for r in runs})
    seeds = sorted({r.cfg.seed for r in runs})
    for v in variants:
        lrs = sorted({r.cfg.lr for r in runs if r.cfg.variant == v})  # its grid (each variant may have its own)
        for s in seeds:
            for lr in lrs:
                if (v, s, lr) not in seen:
                    raise FileNotFoundError(f"{where} has no run of {v} seed {s} at lr {lr:g}, but has runs of that "
                                            "variant, seed and lr with the others; allowed: every variant with every "
                                            "seed (and at every lr of its grid)")


def check_copies(runs: list[FinishedRun]) -> None:
    """No two runs with the same metrics (their records, not their bytes: a blank line or a reformatting does not
    make a copy another run's): one run copied and its run.json changed is refused, naming both."""
    from deep_delta.train.metrics import metrics_file, metrics_text

    digests: dict[str, FinishedRun] = {}
    for run in runs:
        lines = metrics_text(metrics_file(run.dir)).splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        digest = hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()
        other = digests.setdefault(digest, run)
        if other is not run:
            raise ValueError(f"{run.dir} and {other.dir} hold the same metrics.jsonl: one run copied, its run.json "
                             f"changed to {run.name}; allowed: each run trained once")


def check_switches(runs: list[FinishedRun]) -> None:
    """The kernel switches each run trained with (run.json's ``kernel_switches``; older records do not say) agree
    across the runs brought together: a run made with a kernel path on beside one made with it off is refused, as
    plain ``ddl compare`` refuses such a run against its own process's switches. A ``ValueError`` names both runs
    and the switch."""
    recorded = [r for r in runs if isinstance(r.record.get("kernel_switches"), dict)]
    if not recorded:
        return
    first = recorded[0]
    for run in recorded[1:]:
        mine, theirs = run.record["kernel_switches"], first.record["kernel_switches"]
        keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if keys:
            switched = "; ".join(f"{k} {mine.get(k)!r}, there {theirs.get(k)!r}" for k in keys)
            raise ValueError(f"{run.dir / 'run.json'} records kernel switch {switched} ({first.dir / 'run.json'}; "
                             "deep_delta.ops.switches): runs made on other kernel paths are not one comparison; "
                             "allowed: runs made with one set of kernel switches (retrain the ones made with the "
                             f"other: {retrain_remedy(run.dir)}, with the switches set as the others had them)")


def _recorded(runs: list[FinishedRun], field: str) -> dict[str, Any]:
    """{run name: what its run.json records of ``field`` ("threads", "torch", "name": its ``device``'s; "code": its
    ``code``, the commit it trained at where recorded)}; None where a run does not say."""
    def get(run: FinishedRun) -> Any:
        if field == "code":
            return run.record.get("code") if isinstance(run.record.get("code"), dict) else None
        device = run.record.get("device")
        return device.get(field) if isinstance(device, dict) else None
    return {run.name: get(run) for run in runs}


def _one(values: dict[str, Any]) -> Any:
    """The one value every run records (None: none records it), or {run: value} where they differ."""
    distinct = {json.dumps(v, sort_keys=True) for v in values.values()}
    return next(iter(values.values())) if len(distinct) == 1 else dict(values)


def runs_machine(runs: list[FinishedRun]) -> tuple[dict[str, Any], list[str]]:
    """The machine record of a report brought together from finished runs (``--report-only``): what the runs' own
    run.json records (their kernel switches, which :func:`check_switches` made one set; their CPU threads, torch,
    device and the code's commit, each one value where they agree, else {run: value}), not what the reporting
    process has; that process's platform is kept apart (``report_written_on``). Returns it with the notes the
    report shows where the runs differ in threads, torch or commit (a difference that changes no loss, said, not
    refused)."""
    from deep_delta.experiments.report import machine

    switches = next((r.record["kernel_switches"] for r in runs if isinstance(r.record.get("kernel_switches"), dict)),
                    None)
    fields = {"torch_threads": _recorded(runs, "threads"), "torch": _recorded(runs, "torch"),
              "device": _recorded(runs, "name"), "code": _recorded(runs, "code")}
    record = {"of": "the runs (their run.json)", "kernel_switches": switches,
              **{k: _one(v) for k, v in fields.items()}, "report_written_on": machine()}
    notes = []
    for key, what in (("torch_threads", "CPU threads"), ("torch", "torch versions"), ("code", "code commits")):
        distinct = {json.dumps(v, sort_keys=True) for v in fields[key].values()}
        if len(distinct) > 1 and not (key == "code" and not any(fields[key].values())):
            shown = "; ".join(f"{name}: {_shown_value(v)}" for name, v in fields[key].items())
            notes.append(f"the runs were trained with different {what} ({shown}); each run's losses are its own, but "
                         "its speed (tokens/s) and its bits are those of its own setting")
    return record, notes


def _shown_value(value: Any) -> str:
    if value is None:
        return "not recorded"
    if isinstance(value, dict) and "commit" in value:
        return f"{str(value['commit'])[:12]}{'' if value.get('clean', True) else ' (with uncommitted changes)'}"
    return str(value)


# model_config entries that describe the file, not the model (a transformers upgrade between two runs changes them)
_BOOKKEEPING = frozenset({"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"})


def check_models(runs: list[FinishedRun]) -> None:
    """Within a variant, one model: every run's ``model_config`` (but its bookkeeping) and ``parameters`` those of
    the variant's first run; a run whose record says otherwise is refused, naming its run.json."""
    first: dict[str, FinishedRun] = {}
    for run in runs:
        ref = first.setdefault(run.cfg.variant, run)
        if ref is run:
            continue
        mine, theirs = run.record.get("model_config") or {}, ref.record.get("model_config") or {}
        keys = sorted(k for k in set(mine) | set(theirs) if k not in _BOOKKEEPING and mine.get(k) != theirs.get(k))
        if keys or run.record.get("parameters") != ref.record.get("parameters"):
            what = (f"model_config.{keys[0]} {mine.get(keys[0])!r}" if keys else
                    f"parameters {run.record.get('parameters')!r}")
            theirs_text = (f"{theirs.get(keys[0])!r}" if keys else f"{ref.record.get('parameters')!r}")
            raise ValueError(f"{run.dir / 'run.json'} records {what}, but {ref.dir / 'run.json'} of the same variant "
                             f"({run.cfg.variant}) records {theirs_text}; allowed: one model per variant (a run "
                             "copied from another variant and relabelled is refused)")


__all__ = ["FinishedRun", "NeedsRetraining", "check_copies", "check_models", "check_finished", "check_metrics",
           "check_switches", "check_together", "find_runs", "lr_of_folder", "read_run", "retrain_remedy",
           "runs_machine"]
