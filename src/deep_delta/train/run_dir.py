"""A training run's directory: its identity (what a resumed run must share with it), its ownership (one process
at a time, what a killed writer left cleaned away, a run of other settings refused) and what ``overwrite``
removes.

``OUT/run.json`` records the run's settings (``identity``: every setting a resumed run may not change), its
model, data and size. A checkpoint records its own settings too, and resume trusts the checkpoint
(:func:`check_checkpoint_matches`), not run.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from deep_delta.train import checkpoint as ckpt
from deep_delta.train import provenance
from deep_delta.train.config import TrainConfig, recorded
from deep_delta.train.metrics import METRICS_FILE, PACKED_METRICS_FILE
from deep_delta.train.wandb_sink import WANDB_FILE

RUN_FILE = "run.json"
# Settings a resumed run may change; every other TrainConfig field must match the run in OUT.
RESUMABLE_CHANGES = frozenset({
    "steps", "eval_every", "eval_batches", "save_every", "keep", "log_every", "device", "dtype", "compile",
    "cuda_graphs", "activation_checkpointing", "distributed", "tensorboard", "peak_flops", "out", "on_divergence",
    "wandb", "wandb_project", "wandb_run_name", "wandb_group",
})
# Settings that change nothing in a run's numbers (where it is written, how often it is logged or saved, how it is
# executed, what happens after a divergence); every other TrainConfig field, the data and RESUMABLE_CHANGES'
# eval_batches / eval_every / steps / dtype / device among them, changes a result that `ddl compare` reuses
# (provenance.check_belongs).
RESULT_NEUTRAL = frozenset({
    "out", "log_every", "save_every", "keep", "tensorboard", "peak_flops", "compile", "cuda_graphs",
    "activation_checkpointing",
    "distributed", "on_divergence", "wandb", "wandb_project", "wandb_run_name", "wandb_group",
})
# config.json entries that describe the file, not the model: a resumed run may differ in these.
_CONFIG_BOOKKEEPING = frozenset({"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"})


def run_identity(cfg: TrainConfig | dict, data_dir: Path | str) -> dict[str, Any]:
    """The settings (and data directory) a run in OUT is made of, without what a resumed run may change; of a
    stored record (a dict), with the settings added since it was written as such a run had them
    (:func:`~deep_delta.train.config.recorded`)."""
    d = recorded(cfg) if isinstance(cfg, dict) else cfg.to_dict()
    d["data"] = str(data_dir)
    return {k: v for k, v in d.items() if k not in RESUMABLE_CHANGES}


def _differences(saved: dict, mine: dict, skip: frozenset = frozenset()) -> list[str]:
    return provenance.differences(saved, mine, skip=skip, has="run has")


def holds_run(out: Path) -> bool:
    return any((out / name).exists() for name in (RUN_FILE, METRICS_FILE, PACKED_METRICS_FILE, ckpt.CHECKPOINTS))


def check_out_dir(cfg: TrainConfig, data_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a run: OUT holding a run needs ``resume`` (same settings) or ``overwrite``."""
    from deep_delta.fsutil import refuse_replaced_dir

    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output directory {out} exists and is not a directory")
    refuse_replaced_dir(out)  # a run inside a checkpoint, model or data directory would be lost with it
    if not holds_run(out):
        return
    if overwrite:
        check_clearable(out)
        return
    if not resume:
        raise FileExistsError(
            f"output directory {out} already holds a training run; resume it (`resume`) or replace it "
            "(`overwrite`)"
        )
    if (out / RUN_FILE).is_file():
        try:
            saved = read_run_file(out).get("identity", {})
        except ValueError as e:
            raise ValueError(f"{e}; replace the run with `overwrite`") from None
        saved = recorded(saved) if isinstance(saved, dict) else {}
        refuse_other_run(out, _differences(saved, run_identity(cfg, data_dir)))


def read_run_file(out: str | os.PathLike) -> dict[str, Any]:
    """``OUT/run.json``, the run's record, checked to be one: a JSON object with the run's settings
    (``train_config``). A file that is missing, not UTF-8, not JSON, not an object or without settings is an
    error naming the file. Its ``train_config`` and ``identity`` are read with the settings added since it was
    written as such a run had them (:func:`~deep_delta.train.config.recorded`: a run.json without ``optimizer``
    trained with adamw)."""
    from deep_delta.fsutil import read_json_file

    path = Path(out) / RUN_FILE
    run = read_json_file(path, "a run record (the run.json `ddl train` writes)", limit=RUN_FILE_LIMIT)
    if not isinstance(run, dict):
        raise ValueError(f"{path} is not a run record: it holds a JSON {_json_kind(run)}, not the object `ddl train` "
                         "writes")
    if not isinstance(run.get("train_config"), dict):
        raise ValueError(f"{path}: `train_config` got {_shown(run.get('train_config'))}; allowed: the run's settings "
                         "(an object, as `ddl train` writes them): it is not a run record")
    run["train_config"] = recorded(run["train_config"])
    if isinstance(run.get("identity"), dict):
        run["identity"] = recorded(run["identity"])
    return run


def run_end(out: str | os.PathLike, run: dict[str, Any]) -> dict[str, Any]:
    """The end of a finished run as its run.json (``run``, read by :func:`read_run_file`) records it: ``step``,
    ``evaluation``, ``diverged`` (None, or why the run diverged) and ``wall_s``. A run that has not finished, or a
    record of its end that is not one, is an error naming the file and the field."""
    path = Path(out) / RUN_FILE
    if "finished" not in run:
        raise RunNotFinished(f"{path} records no end: the run has not finished")
    end = run["finished"]
    if not isinstance(end, dict):
        raise ValueError(f"{path}: `finished` got {_shown(end)}; allowed: the record of the run's end (its step, "
                         "evaluation, divergence and wall time), as `ddl train` writes it when the run ends")
    checks = (("step", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
              ("evaluation", lambda v: isinstance(v, dict), "an object"),
              ("diverged", lambda v: v is None or isinstance(v, str), "null or why the run diverged"),
              ("wall_s", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"))
    for name, ok, allowed in checks:
        if not ok(end.get(name)):
            raise ValueError(f"{path}: `finished.{name}` got {_shown(end.get(name))}; allowed: {allowed}")
    return end


class RunNotFinished(ValueError):
    """A run whose run.json records no end (still training, interrupted, or stopped by an error)."""


# run.json is a few kilobytes; a file far larger is not one (and is not read into memory)
RUN_FILE_LIMIT = 4 << 20


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """A JSON value for an error message: short values as they are, others by their kind."""
    text = json.dumps(value)
    return text if len(text) <= 40 else f"a JSON {_json_kind(value)}"


def check_clearable(out: Path) -> None:
    """Refuse ``overwrite`` of the run in ``out`` when its ``checkpoints/`` holds anything training did not write
    (a user's file, an export): ``overwrite`` removes that directory whole."""
    foreign = ckpt.foreign_entries(out)
    if foreign:
        more = f", ... ({len(foreign)} in all)" if len(foreign) > 3 else ""
        raise FileExistsError(
            f"`overwrite` would remove {out / ckpt.CHECKPOINTS}, which holds {', '.join(p.name for p in foreign[:3])}"
            f"{more} that training did not write; move them out of it (training rotates and replaces that "
            "directory: nothing of yours belongs there), then run again")


def refuse_other_run(out: Path, diff: list[str], what: str = "a different run") -> None:
    if diff:
        raise FileExistsError(
            f"output directory {out} holds {what} ({'; '.join(diff)}); a resumed run may only change "
            f"{', '.join(sorted(RESUMABLE_CHANGES))}. Use another output directory, or `overwrite` to replace it"
        )


def check_checkpoint_matches(path: Path, meta: dict, cfg: TrainConfig, data_dir: Path, model_config,
                             data_fingerprint: str | None = None) -> None:
    """Resume trusts the checkpoint, not run.json: its model config and run settings must be the requested ones,
    and (``data_fingerprint`` given) the data the one it was trained on. A checkpoint written before data
    fingerprints were recorded resumes with a warning that its data could not be checked."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    try:
        saved_model = DDLConfig.from_json_file(str(path / "config.json")).to_dict()
    except (ValueError, TypeError) as e:
        raise ckpt.CheckpointError(f"{path / 'config.json'} is not a valid model config ({e})") from None
    diff = _differences(saved_model, model_config.to_dict(), _CONFIG_BOOKKEEPING)
    refuse_other_run(Path(cfg.out), [f"model.{d}" for d in diff], f"a checkpoint of another model ({path})")
    if "train_config" in meta:
        saved = run_identity(recorded(meta["train_config"]),
                             meta.get("data_dir", meta["train_config"].get("data")))
        refuse_other_run(Path(cfg.out), _differences(saved, run_identity(cfg, data_dir)),
                         f"a checkpoint of another run ({path})")
    if "kernel_switches" in meta:  # the kernel paths the run trained on (older checkpoints do not say)
        switched = _differences(meta["kernel_switches"], kernel_switches())
        refuse_other_run(Path(cfg.out), [f"kernel switch {d} (deep_delta.ops.switches)" for d in switched],
                         f"a checkpoint of a run made with other kernel paths ({path})")
    if data_fingerprint is not None and not provenance.check_same_data(
            meta.get("data_fingerprint"), data_fingerprint, what=f"checkpoint {path}", data_dir=data_dir,
            remedy="resume on the data it was trained on, or start a new run (`overwrite`, or another `out`)"):
        warnings.warn(f"checkpoint {path} was written before checkpoints recorded their data, so resuming cannot "
                      f"check that {data_dir} holds the data it was trained on", stacklevel=2)


def own_run_dir(stack: contextlib.ExitStack, cfg: TrainConfig, info, data_dir: Path, *, resume: bool,
                overwrite: bool) -> None:
    """Lock OUT (rank 0, released when ``stack`` closes), clean what a killed writer left, then check the run it
    holds (every rank)."""
    from deep_delta.train import distributed as distr

    out, refused = Path(cfg.out), None
    if info.is_main:
        try:
            stack.enter_context(ckpt.run_lock(out, f"ddl train {cfg.variant}"))
        except (ckpt.RunLockedError, OSError) as e:
            refused = e
    refused = distr.broadcast_object(refused, info)
    if refused is not None:
        raise refused
    if info.is_main:
        ckpt.clean_stale(out)
    check_out_dir(cfg, data_dir, resume=resume, overwrite=overwrite)


def clear_run(out: Path) -> None:
    """What ``overwrite`` removes: only the files a training run writes (a user's other files stay; a
    ``checkpoints/`` holding anything else is refused, :func:`check_clearable`)."""
    check_clearable(out)
    for name in (RUN_FILE, METRICS_FILE, PACKED_METRICS_FILE, "tensorboard", WANDB_FILE, ckpt.CHECKPOINTS):
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def write_run_file(out: Path, cfg: TrainConfig, data, model_config, world_size: int, parameters: int,
                   device, optimizer: dict[str, Any] | None = None, code: dict[str, Any] | None = None) -> None:
    """``OUT/run.json`` (atomically): the run's identity, settings, model, data (``data``: a
    :class:`~deep_delta.train.data.TrainData`, or None for a run on batches of its own), processes, size, the
    device it trains on (a study assembled from runs made on several machines says which ran where), its
    optimizer's groups (``optimizer``: :func:`~deep_delta.train.optim.optimizer_record`, which tensor trains in
    which group at which lr) and the code this process trains at (``code``:
    :func:`~deep_delta.train.provenance.code_record`; each segment of a resumed run records its own)."""
    ckpt.write_text_atomic(out / RUN_FILE, json.dumps({
        "identity": run_identity(cfg, data.dir if data is not None else "batches given to the trainer"),
        "train_config": cfg.to_dict(),
        "model_config": model_config.to_diff_dict(),
        "data": data.record() if data is not None else None,
        "world_size": world_size,
        "parameters": parameters,
        "device": device_record(device),
        "kernel_switches": kernel_switches(),
        "optimizer": optimizer,
        "code": code,
    }, indent=2, sort_keys=True))


def kernel_switches() -> dict[str, bool]:
    """The switches of the kernel paths not yet run on a GPU (:mod:`deep_delta.ops.switches`), as a run records them
    in run.json and its checkpoints: a run made with a path on is told from one made with it off, and is not
    resumed with another choice (:func:`check_checkpoint_matches`)."""
    from deep_delta.ops import switches

    return switches.current()


def device_record(device) -> dict[str, Any]:
    """The device a run trains on, as run.json records it: its name (the GPU's, or "cpu"), the torch, and the CPU
    threads PyTorch had when the run started (what a reproduction of its numbers on a CPU should match)."""
    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"type": device.type, "name": name, "torch": torch.__version__, "threads": torch.get_num_threads()}


def mark_finished(out: Path, result: dict[str, Any], segments: list[dict[str, Any]]) -> None:
    """Add the run's end (``result``: its step, last evaluation, why it diverged if it did) and its schedule
    ``segments`` (:func:`segment`, one per process that trained it) to run.json, with ``wall_s`` the sum of the
    segments' wall times: a run directory that says it finished can be reported without its checkpoints (``ddl
    compare --report-only``), and a run extended on a longer schedule (``ddl train --resume --steps N``) can be
    told from one trained on one schedule."""
    path = out / RUN_FILE
    run = read_run_file(out)
    run["finished"] = {**result, "wall_s": sum(s["wall_s"] for s in segments if s.get("wall_s") is not None)}
    run["segments"] = segments
    ckpt.write_text_atomic(path, json.dumps(run, indent=2, sort_keys=True))


def restore_stream(loader, state, out: Path) -> None:
    """Put the training stream ``loader`` at a checkpoint's data position ``state`` (refused for a checkpoint
    without one, or a stream that cannot resume)."""
    if state is None or not hasattr(loader, "load_state_dict"):
        raise ckpt.CheckpointError(f"{out}: resuming needs the training stream's position, which "
                                   f"{'the checkpoint' if state is None else 'the given `batches`'} does not "
                                   "hold; start a new run (`overwrite`)")
    loader.load_state_dict(state)


def load_weights_of(path: Path, model_config):
    """The checkpoint ``path``'s weights in a model built from ``model_config`` (:func:`check_checkpoint_matches`
    made it the checkpoint's): safetensors only, checksums verified, names and shapes checked; no Auto class."""
    from deep_delta.models.ddl.weights import load_weights
    from deep_delta.train.build import build_model

    model = build_model(model_config)
    load_weights(model, path)
    return model


def segment(start: int, to: int, steps: int, wall_s: float | None, code: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """One process's part of a run: steps ``start`` to ``to`` on a schedule of ``steps`` steps (warm-up and
    cosine over ``steps``), in ``wall_s`` seconds (None: not recorded), at the code ``code``
    (:func:`~deep_delta.train.provenance.code_record`; None: not in a git checkout, or not recorded)."""
    return {"from": start, "to": to, "steps": steps, "wall_s": wall_s, "code": code}


def prior_segments(meta: dict[str, Any], step: int) -> list[dict[str, Any]]:
    """The schedule segments a checkpoint of ``step`` records (its ``train_meta.json``: ``meta``); a checkpoint
    written before segments were recorded counts as one segment of its own settings' schedule."""
    kept = meta.get("segments")
    if isinstance(kept, list) and all(isinstance(s, dict) for s in kept) and kept:
        return [s for s in kept if isinstance(s.get("to"), int) and s["to"] <= step]
    steps = (meta.get("train_config") or {}).get("steps")
    return [segment(0, step, steps, None)]


def save_checkpoint(trainer, at: int) -> None:
    """Checkpoint step ``at`` of ``trainer``'s run atomically into OUT/checkpoints (rank 0 writes; the optimizer
    state, and under FSDP the weights, are gathered on every rank first): the model, the optimizer, the data
    position, the RNG, and what the run is (settings, data, tokens)."""
    from deep_delta.train import distributed as distr
    from deep_delta.train.build import build_model
    from deep_delta.train.progress import no_hf_progress_bar

    t = trainer
    optim_state = distr.full_optimizer_state(t.model, t.optimizer)
    model_state = distr.full_model_state(t.model) if t.info.mode == "fsdp" else None
    if not t.info.is_main:
        return

    def save_model(d: Path) -> None:
        target = t.model
        if model_state is not None:  # FSDP: write the gathered full weights through a CPU copy
            target = build_model(t.model_config)
            target.load_state_dict(model_state)
        with no_hf_progress_bar():
            target.save_pretrained(d, safe_serialization=True)

    data = ({"tokenizer": t.data.meta["tokenizer"], "data_dir": str(t.data.dir), "data_fingerprint": t.data.fingerprint}
            if t.data is not None else {"tokenizer": None, "data_dir": None})
    ckpt.save_checkpoint(t.out, at, save_model=save_model, keep=t.cfg.keep, train_state={
        "step": at, "optimizer": optim_state, "rng": ckpt.rng_state(), "world_size": t.info.world_size,
        **({"data": t.train_loader.state_dict()} if hasattr(t.train_loader, "state_dict") else {}),
    }, meta={
        "variant": t.cfg.variant, "preset": t.cfg.preset, "vocab_size": t.model_config.vocab_size,
        "tokens": at * t.tokens_per_step, "train_config": t.cfg.to_dict(), "segments": t.segments(at),
        "kernel_switches": kernel_switches(), **data,
    })


__all__ = ["RESULT_NEUTRAL", "RESUMABLE_CHANGES", "RUN_FILE", "RunNotFinished", "check_checkpoint_matches",
           "check_clearable", "check_out_dir", "clear_run", "holds_run", "kernel_switches", "load_weights_of",
           "own_run_dir", "prior_segments", "read_run_file", "refuse_other_run", "restore_stream", "run_end",
           "run_identity", "save_checkpoint", "segment",
           "write_run_file"]
