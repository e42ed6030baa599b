"""The training loop, as a :class:`Trainer` for one CPU, one GPU, or many GPUs under torchrun.

    trainer = Trainer(cfg)          # every check; nothing in OUT is written yet
    result = trainer.run()          # lock OUT, restore or build, train_step / evaluate / save / log

:func:`train` is the thin entry point the command line uses. Everything a run needs is checked before anything
in ``OUT`` is written (data shards and their vocabulary, the model config, the batch arithmetic, an existing run
in ``OUT`` and its checkpoint), so a refused run changes nothing. While it trains, the run directory is locked
(one process per ``OUT``), and SIGINT / SIGTERM end it after the current optimizer step with a checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deep_delta.models.utils import count_parameters
from deep_delta.train import checkpoint as ckpt
from deep_delta.train import distributed as distr
from deep_delta.train import provenance
from deep_delta.train.config import TrainConfig
from deep_delta.train.metrics import METRICS_FILE, MetricsLog, flops_per_token, peak_flops, truncate_metrics
from deep_delta.train.optim import WarmupCosine, build_optimizer, set_learning_rate
from deep_delta.train.wandb_sink import WANDB_FILE

RUN_FILE = "run.json"
# Settings a resumed run may change; every other TrainConfig field must match the run in OUT.
RESUMABLE_CHANGES = frozenset({
    "steps", "eval_every", "eval_batches", "save_every", "keep", "log_every", "device", "dtype", "compile",
    "activation_checkpointing", "distributed", "tensorboard", "peak_flops", "out",
    "wandb", "wandb_project", "wandb_run_name", "wandb_group",
})
# Settings that change nothing in a run's numbers (where it is written, how often it is logged or saved, how it is
# executed); every other TrainConfig field, the data and RESUMABLE_CHANGES' eval_batches / eval_every / steps /
# dtype / device among them, changes a result that `ddl compare` reuses (provenance.check_belongs).
RESULT_NEUTRAL = frozenset({
    "out", "log_every", "save_every", "keep", "tensorboard", "peak_flops", "compile", "activation_checkpointing",
    "distributed", "wandb", "wandb_project", "wandb_run_name", "wandb_group",
})
# config.json entries that describe the file, not the model: a resumed run may differ in these.
_CONFIG_BOOKKEEPING = frozenset({"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path"})


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss or gradient norm; the message names the step and the last good
    checkpoint (which is left untouched)."""


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM ended the run after a complete optimizer step; a checkpoint of that step exists."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as shells report them
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint {checkpoint}")


@dataclass
class TrainResult:
    out: Path
    step: int
    parameters: int
    val_loss: float | None
    val_ppl: float | None
    checkpoint: Path | None
    wall_s: float


def model_vocab_size(preset_vocab: int, data_vocab: int) -> int:
    """The preset's vocabulary if it covers the data's, else the data's padded up to a multiple of 64."""
    if preset_vocab >= data_vocab:
        return preset_vocab
    return -(-data_vocab // 64) * 64


def build_model_config(cfg: TrainConfig, data_vocab: int):
    """``DDLConfig`` of the run: variant at preset, vocabulary sized to the data, ``cfg.model`` overrides."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig
    from deep_delta.variants import PRESETS

    overrides = dict(cfg.model)
    if "vocab_size" in overrides:
        if overrides["vocab_size"] < data_vocab:
            raise ValueError(
                f"TrainConfig: `model.vocab_size` got {overrides['vocab_size']}, but the data's tokenizer has "
                f"{data_vocab} token ids (tokens >= the model vocabulary); allowed: an integer >= {data_vocab}"
            )
    else:
        overrides["vocab_size"] = model_vocab_size(PRESETS[cfg.preset]["vocab_size"], data_vocab)
    mcfg = DDLConfig.from_variant(cfg.variant, cfg.preset, **overrides)
    if cfg.seq_len > mcfg.max_position_embeddings:
        raise ValueError(
            f"TrainConfig: `seq_len` got {cfg.seq_len}; allowed: at most the model's max_position_embeddings="
            f"{mcfg.max_position_embeddings} (raise it with model.max_position_embeddings)"
        )
    return mcfg


def build_model(model_config):
    """A freshly initialised ``DDLForCausalLM`` (seed the RNG before calling: every rank must agree)."""
    from deep_delta.models import DDLForCausalLM

    return DDLForCausalLM(model_config)


def _resolve_data(cfg: TrainConfig) -> tuple[Path, dict]:
    from deep_delta.data import default_data_dir, read_meta
    from deep_delta.data.meta import require_data_dir

    data_dir = Path(cfg.data).expanduser() if cfg.data else default_data_dir()
    require_data_dir(data_dir)
    meta = read_meta(data_dir)
    for key in ("tokenizer", "vocab_size"):
        if key not in meta:
            raise ValueError(f"{data_dir}/meta.json lacks {key!r}; re-prepare the data with `ddl data prepare`")
    return data_dir.resolve(), meta


def _run_identity(cfg: TrainConfig | dict, data_dir: Path | str) -> dict[str, Any]:
    d = dict(cfg) if isinstance(cfg, dict) else cfg.to_dict()
    d["data"] = str(data_dir)
    return {k: v for k, v in d.items() if k not in RESUMABLE_CHANGES}


def _differences(saved: dict, mine: dict, skip: frozenset = frozenset()) -> list[str]:
    return provenance.differences(saved, mine, skip=skip, has="run has")


def _holds_run(out: Path) -> bool:
    return any((out / name).exists() for name in (RUN_FILE, METRICS_FILE, ckpt.CHECKPOINTS))


def check_out_dir(cfg: TrainConfig, data_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a run: OUT holding a run needs ``resume`` (same settings) or ``overwrite``."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"output directory {out} exists and is not a directory")
    if not _holds_run(out) or overwrite:
        return
    if not resume:
        raise FileExistsError(
            f"output directory {out} already holds a training run; resume it (`resume`) or replace it "
            "(`overwrite`)"
        )
    run_file = out / RUN_FILE
    if run_file.is_file():
        try:
            saved = json.loads(run_file.read_text()).get("identity", {})
        except ValueError as e:
            raise ValueError(f"{run_file} is not valid JSON ({e}); replace the run with `overwrite`") from None
        _refuse_other_run(out, _differences(saved, _run_identity(cfg, data_dir)))


def _refuse_other_run(out: Path, diff: list[str], what: str = "a different run") -> None:
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
    _refuse_other_run(Path(cfg.out), [f"model.{d}" for d in diff], f"a checkpoint of another model ({path})")
    if "train_config" in meta:
        saved = _run_identity(meta["train_config"], meta.get("data_dir", meta["train_config"].get("data")))
        _refuse_other_run(Path(cfg.out), _differences(saved, _run_identity(cfg, data_dir)),
                          f"a checkpoint of another run ({path})")
    if data_fingerprint is not None and not provenance.check_same_data(
            meta.get("data_fingerprint"), data_fingerprint, what=f"checkpoint {path}", data_dir=data_dir,
            remedy="resume on the data it was trained on, or start a new run (`overwrite`, or another `out`)"):
        warnings.warn(f"checkpoint {path} was written before checkpoints recorded their data, so resuming cannot "
                      f"check that {data_dir} holds the data it was trained on", stacklevel=2)


def _clear_run(out: Path) -> None:
    """What --overwrite removes: only the files a training run writes (a user's other files stay)."""
    for name in (RUN_FILE, METRICS_FILE, "tensorboard", WANDB_FILE, ckpt.CHECKPOINTS):
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches, *, accum: int = 1,
                   train_model: torch.nn.Module | None = None, autocast=None, grad_clip: float = 1.0,
                   info: distr.DistInfo | None = None, before_update=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step: forward + backward of ``accum`` ``(x, y)`` micro-batches (gradients averaged, synced
    on the last one under DDP/FSDP), gradient clipping at ``grad_clip`` (0: only measure the norm), then
    ``before_update(loss, grad_norm)`` (may raise to skip the update), AdamW, zero_grad. Returns the mean
    loss (all-reduced over ranks) and the gradient norm as tensors: nothing here waits on the device.

    The trainer, ``ddl compare`` (through it) and the step benchmarks all run this function.
    """
    info = info or distr.DistInfo()
    train_model = train_model if train_model is not None else model
    autocast = autocast if autocast is not None else contextlib.nullcontext()
    loss_sum = torch.zeros((), device=info.device)
    for micro, (x, y) in enumerate(batches):
        x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
        distr.set_gradient_sync(train_model, info, micro == accum - 1)
        with autocast:
            loss = train_model(x, shift_labels=y).loss
        (loss / accum).backward()
        loss_sum += loss.detach()
    loss_t = distr.all_reduce_sum(loss_sum, info) / (accum * info.world_size)
    params = [p for p in model.parameters() if p.grad is not None]
    if grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    if before_update is not None:
        before_update(loss_t, grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_t, grad_norm


class _StopSignals:
    """While active (main thread only), the first SIGINT/SIGTERM is recorded in ``requested`` so the loop can
    stop after its current step; a second one raises ``KeyboardInterrupt`` at once."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopped at once")
        self.requested = signum

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    """One training run. Construction checks everything and writes nothing; :meth:`run` does the work through
    :meth:`setup` (lock, restore or build), :meth:`train_step`, :meth:`evaluate`, :meth:`save` and :meth:`log`.

    ``stop_at`` ends this session after that many optimizer steps (validating and checkpointing there) while the
    schedule still runs to ``cfg.steps``: a time-limited job, continued later with ``resume``.
    """

    def __init__(self, cfg: TrainConfig, info: distr.DistInfo | None = None, *, resume: bool = False,
                 overwrite: bool = False, progress: bool = True, desc: str | None = None, quiet: bool = False,
                 stop_at: int | None = None):
        from deep_delta.data import TokenLoader
        from deep_delta.data.loader import available_splits

        if stop_at is not None and not 1 <= stop_at:
            raise ValueError(f"`stop_at` got {stop_at!r}; allowed: an integer >= 1 (a step to stop this session at)")
        self.cfg, self.info = cfg, info or distr.DistInfo()
        self.resume, self.overwrite, self.progress = resume, overwrite, progress
        self.desc = desc or cfg.variant
        self.out = Path(cfg.out)
        self.end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        self.say = (lambda *a: None) if (quiet or not self.info.is_main) else _printer()
        self.data_dir, self.data_meta = _resolve_data(cfg)
        self.data_fingerprint = provenance.data_fingerprint(self.data_dir, self.data_meta)
        self.model_config = build_model_config(cfg, int(self.data_meta["vocab_size"]))
        self.accum = cfg.accumulation(self.info.world_size)
        loader = dict(seed=cfg.seed, rank=self.info.rank, world_size=self.info.world_size,
                      vocab_size=self.model_config.vocab_size)
        self.train_loader = TokenLoader(self.data_dir, "train", cfg.batch_size, cfg.seq_len, **loader)
        self.val_loader = None
        splits = self.data_meta.get("splits")  # what preparation wrote; a shard missing since then is an error
        has_val = (splits.get("val") or {}).get("num_tokens", 0) > 0 if isinstance(splits, dict) else (
            "val" in available_splits(self.data_dir))
        if has_val:
            self.val_loader = TokenLoader(self.data_dir, "val", cfg.batch_size, cfg.seq_len, **loader)
        elif cfg.eval_every:
            raise ValueError(
                f"{self.data_dir} has no validation split (no val_*.bin shards) but `eval_every` is {cfg.eval_every}; "
                "allowed: `eval_every` 0 to train without validation, or prepare the data with a "
                "validation fraction > 0"
            )
        self.tokens_per_step = cfg.batch_size * self.accum * self.info.world_size * cfg.seq_len
        self.step = 0
        self.val_loss: float | None = None
        self.val_ppl: float | None = None
        self.last_saved: int | None = None

    # ------------------------------------------------------------------ the whole run
    def run(self) -> TrainResult:
        """Train to ``cfg.steps`` (or ``stop_at``); returns the final step and validation loss."""
        t_start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            stack.callback(self._release)
            self._own_out_dir(stack)
            self.setup()
            stack.push(self._close_metrics)
            self._announce()
            loaders = [loader for loader in (self.train_loader, self.val_loader) if loader is not None]
            for loader in loaders:  # every shard's tokens, beside the training: a short run names a bad one too
                loader.check_tokens_in_background()
            stop = stack.enter_context(_StopSignals())
            bar = stack.enter_context(self._progress_bar())
            while self.step < self.end:
                self._after_step(self.train_step(), bar)
                if self._agree_to_stop(stop):
                    self.save(self.step)
                    raise TrainingInterrupted(stop.requested, self.step, ckpt.latest_checkpoint(self.out))
            for loader in loaders:
                loader.wait_for_token_check()
            result = self._result(time.perf_counter() - t_start)
            self.metrics.summary({"step": result.step, "val_loss": result.val_loss, "val_ppl": result.val_ppl,
                                  "parameters": result.parameters, "tokens": result.step * self.tokens_per_step,
                                  "wall_s": result.wall_s, "checkpoint": str(result.checkpoint)})
        return result

    def _close_metrics(self, exc_type, exc, tb) -> None:
        """Close the metrics sinks as the run ends; a W&B run is marked failed with the exit code of the error
        or signal that ended it (130 / 143 for SIGINT / SIGTERM)."""
        self.metrics.close(0 if exc is None else getattr(exc, "exit_code", 1))

    def _release(self) -> None:
        """Drop the wrapped model and optimizer when the run ends, before the process group is torn down: a
        DDP module destroyed after ``destroy_process_group`` (say, kept alive by an exception's traceback)
        can block its process for ever."""
        for name in ("train_model", "optimizer"):
            self.__dict__.pop(name, None)

    def _own_out_dir(self, stack: contextlib.ExitStack) -> None:
        """Lock OUT (rank 0), clean what a killed writer left, then check the run it holds (every rank)."""
        refused = None
        if self.info.is_main:
            try:
                stack.enter_context(ckpt.run_lock(self.out, f"ddl train {self.cfg.variant}"))
            except (ckpt.RunLockedError, OSError) as e:
                refused = e
        refused = distr.broadcast_object(refused, self.info)
        if refused is not None:
            raise refused
        if self.info.is_main:
            ckpt.clean_stale(self.out)
        check_out_dir(self.cfg, self.data_dir, resume=self.resume, overwrite=self.overwrite)

    def setup(self) -> None:
        """Restore the latest checkpoint (with ``resume``) or build the model; optimizer; run.json, metrics."""
        cfg, info = self.cfg, self.info
        latest = ckpt.latest_checkpoint(self.out) if (self.resume and not self.overwrite) else None
        restored = ckpt.load_checkpoint(latest) if latest is not None else None
        if restored is not None:
            check_checkpoint_matches(latest, restored["meta"], cfg, self.data_dir, self.model_config,
                                     self.data_fingerprint)
            self.train_loader.load_state_dict(restored["state"]["data"])  # refuses a changed data set
        torch.manual_seed(cfg.seed)
        self.model = self._load_weights(latest) if restored is not None else build_model(self.model_config)
        self.n_params = count_parameters(self.model)
        self.model.to(info.device).train()
        if cfg.activation_checkpointing:  # before compile and FSDP wrap the blocks
            self.model.activation_checkpointing_enable()
        self.use_bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and info.device.type == "cuda")
        fsdp_mixed = self.use_bf16 and info.mode == "fsdp" and info.device.type == "cuda"  # FSDP casts itself
        self.train_model = distr.parallelize(self.model, info, compile=cfg.compile, bf16=fsdp_mixed)
        self.autocast = (torch.autocast(info.device.type, dtype=torch.bfloat16) if self.use_bf16 and not fsdp_mixed
                         else contextlib.nullcontext())
        fused = True if info.device.type == "cuda" and info.mode != "fsdp" else None
        self.optimizer = build_optimizer(self.model, cfg.lr, cfg.weight_decay, cfg.betas, fused=fused)
        self.schedule = WarmupCosine(cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
        if restored is not None:
            self.restore(restored)
        self._start_run_dir()

    def _load_weights(self, path: Path):
        """The checkpoint's weights in a model built from ``model_config`` (the checks above made it the
        checkpoint's): safetensors only, checksums verified, names and shapes checked; no Auto class."""
        from deep_delta.models.ddl.weights import load_weights

        model = build_model(self.model_config)
        load_weights(model, path)
        return model

    def restore(self, restored: dict[str, Any]) -> None:
        """Optimizer, step, data position and RNG from a checkpoint (the weights are loaded by :meth:`setup`)."""
        state = restored["state"]
        distr.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.step = self.last_saved = int(state["step"])
        ckpt.set_rng_state(state["rng"])
        self.restored_from = restored["path"]

    def _start_run_dir(self) -> None:
        """From here on OUT is ours; no rank writes before every rank has finished its checks."""
        distr.barrier(self.info)
        if self.info.is_main:
            if self.overwrite:
                _clear_run(self.out)
            truncate_metrics(self.out / METRICS_FILE, self.step)
            ckpt.write_text_atomic(self.out / RUN_FILE, json.dumps({
                "identity": _run_identity(self.cfg, self.data_dir),
                "train_config": self.cfg.to_dict(),
                "model_config": self.model_config.to_diff_dict(),
                "data": self._data_record(),
                "world_size": self.info.world_size,
                "parameters": self.n_params,
            }, indent=2, sort_keys=True))
        distr.barrier(self.info)
        wandb = self._start_wandb() if self.cfg.wandb and self.info.is_main else None
        self.metrics = MetricsLog(self.out, enabled=self.info.is_main, tensorboard=self.cfg.tensorboard,
                                  sinks=[wandb] if wandb is not None else [])

    def _data_record(self) -> dict[str, Any]:
        """What run.json and the W&B config say of the data: its directory, tokenizer, vocabulary, fingerprint."""
        return {"dir": str(self.data_dir), "tokenizer": self.data_meta["tokenizer"],
                "vocab_size": int(self.data_meta["vocab_size"]), "fingerprint": self.data_fingerprint}

    def _start_wandb(self):
        """The run's W&B run (rank 0): its config, the model, parameter count and data fingerprint; a resumed
        run continues the W&B run whose id ``OUT/wandb.json`` holds. None (said in one line) without one."""
        from deep_delta.train.wandb_sink import read_wandb_file, start_wandb, write_wandb_file

        cfg = self.cfg
        saved = read_wandb_file(self.out, say=self.say) if self.resume and not self.overwrite else {}
        config = {**cfg.to_dict(), "model_overrides": cfg.model, "model": self.model_config.to_dict(),
                  "parameters": self.n_params, "world_size": self.info.world_size, "grad_accum": self.accum,
                  "tokens_per_step": self.tokens_per_step,
                  "data": self._data_record()}
        name = cfg.wandb_run_name or f"{cfg.variant}-{cfg.preset}-s{cfg.seed}"
        sink = start_wandb(project=cfg.wandb_project, name=name, group=cfg.wandb_group, config=config,
                           directory=self.out, run_id=saved.get("id"), say=self.say)
        if sink is not None:
            write_wandb_file(self.out, id=sink.id, project=sink.run.project, name=name, group=cfg.wandb_group,
                             mode=sink.mode)
            if saved.get("id"):
                self.say(f"W&B: continuing run {sink.id} ({sink.mode})")
            elif self.step > 0:  # a run that logs to W&B from a resumed session on: its earlier records first
                from deep_delta.train.metrics import read_metrics

                for record in read_metrics(self.out / METRICS_FILE):
                    sink.log(record)
        return sink

    # ------------------------------------------------------------------ one optimizer step
    def train_step(self) -> dict[str, Any]:
        """Forward, backward over ``accum`` micro-batches, clip, AdamW; returns the step's metrics record."""
        info = self.info
        t0 = time.perf_counter()
        seen: dict[str, float] = {}

        def before_update(loss_t: torch.Tensor, grad_norm: torch.Tensor) -> None:
            seen["loss"], seen["grad_norm"] = float(loss_t), float(grad_norm)
            self._check_finite(seen["loss"], seen["grad_norm"])
            seen["lr"] = set_learning_rate(self.optimizer, self.schedule(self.step))

        batches = (self.train_loader.next_batch() for _ in range(self.accum))
        optimizer_step(self.model, self.optimizer, batches, accum=self.accum, train_model=self.train_model,
                       autocast=self.autocast, grad_clip=self.cfg.grad_clip, info=info, before_update=before_update)
        self.step += 1
        if info.device.type == "cuda":
            torch.cuda.synchronize(info.device)
        dt = time.perf_counter() - t0
        tok_s = self.tokens_per_step / dt
        record = {"step": self.step, "loss": seen["loss"], "lr": seen["lr"], "grad_norm": seen["grad_norm"],
                  "tokens": self.step * self.tokens_per_step, "tokens_per_s": tok_s, "step_time_s": dt,
                  "flops_per_s": self.flops_per_token * tok_s}
        if self.peak:
            record["mfu"] = self.flops_per_token * tok_s / (self.peak * info.world_size)
        return record

    def _check_finite(self, loss_val: float, norm_val: float) -> None:
        if math.isfinite(loss_val) and math.isfinite(norm_val):
            return
        what = "loss" if not math.isfinite(loss_val) else "gradient norm"
        kept = ckpt.latest_checkpoint(self.out)
        raise NonFiniteLossError(
            f"non-finite {what} (loss {loss_val}, grad norm {norm_val}) at step {self.step + 1}; training "
            f"stopped. The last good checkpoint is {kept if kept else 'none (no checkpoint was written)'}"
            "; lower `lr` or raise `warmup_steps`, then `resume`"
        )

    def _agree_to_stop(self, stop: _StopSignals) -> bool:
        """Whether a signal asked this run to stop (on any rank: every rank stops after the same step)."""
        if not (self.info.distributed and self.info.world_size > 1):
            return stop.requested is not None
        flag = torch.tensor([0.0 if stop.requested is None else float(stop.requested)], device=self.info.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        if flag.item() and stop.requested is None:
            stop.requested = int(flag.item())
        return stop.requested is not None

    def _after_step(self, record: dict[str, Any], bar) -> None:
        cfg, step = self.cfg, self.step
        self.log(record, bar)
        if self.val_loader is not None and ((cfg.eval_every and step % cfg.eval_every == 0) or step == self.end):
            self.val_loss, self.val_ppl = self.evaluate()
            self.metrics.log({"step": step, "val_loss": self.val_loss, "val_ppl": self.val_ppl,
                              "tokens": step * self.tokens_per_step, "eval_batches": cfg.eval_batches})
            msg = f"step {step}/{cfg.steps}: val_loss {self.val_loss:.4f}, val_ppl {self.val_ppl:.2f}"
            if bar is not None:
                bar.set_postfix({"loss": f"{record['loss']:.4f}", "val": f"{self.val_loss:.4f}"}, refresh=True)
                if step != self.end:
                    bar.write(msg)
            else:
                self.say(msg)
        if (cfg.save_every and step % cfg.save_every == 0) or step == self.end:
            self.save(step)

    # ------------------------------------------------------------------ evaluate, save, log
    def evaluate(self) -> tuple[float, float]:
        """Validation loss and perplexity over ``cfg.eval_batches`` batches of the val split (all ranks)."""
        from deep_delta.train.validation import perplexity, summed_loss

        total = summed_loss(self.train_model, self.val_loader.eval_batches(self.cfg.eval_batches),
                            device=self.info.device, autocast=self.autocast)
        distr.all_reduce_sum(total, self.info)
        distr.reshard(self.train_model, self.info)
        val = float(total[0] / total[1])
        return val, perplexity(val)

    def save(self, at: int) -> None:
        """Checkpoint step ``at`` atomically (a collective under FSDP: every rank calls it)."""
        if self.last_saved == at and ckpt.latest_checkpoint(self.out) is not None:
            return
        optim_state = distr.full_optimizer_state(self.model, self.optimizer)
        model_state = distr.full_model_state(self.model) if self.info.mode == "fsdp" else None
        if self.info.is_main:
            def save_model(d: Path) -> None:
                target = self.model
                if model_state is not None:  # FSDP: write the gathered full weights through a CPU copy
                    target = build_model(self.model_config)
                    target.load_state_dict(model_state)
                with _no_hf_progress_bar():
                    target.save_pretrained(d, safe_serialization=True)

            ckpt.save_checkpoint(self.out, at, save_model=save_model, keep=self.cfg.keep, train_state={
                "step": at, "optimizer": optim_state, "data": self.train_loader.state_dict(),
                "rng": ckpt.rng_state(), "world_size": self.info.world_size,
            }, meta={
                "variant": self.cfg.variant, "preset": self.cfg.preset, "tokenizer": self.data_meta["tokenizer"],
                "data_dir": str(self.data_dir), "vocab_size": self.model_config.vocab_size,
                "tokens": at * self.tokens_per_step, "train_config": self.cfg.to_dict(),
                "data_fingerprint": self.data_fingerprint,
            })
        distr.barrier(self.info)
        self.last_saved = at

    def log(self, record: dict[str, Any], bar=None) -> None:
        """Append ``record`` to metrics.jsonl and show it (progress bar postfix or a line every log_every)."""
        self.metrics.log(record)
        every, step = self.cfg.log_every, record["step"]
        due = every and (step % every == 0 or step == self.cfg.steps)
        if bar is not None:
            bar.update(1)
            if due:
                post = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}",
                        "tok/s": f"{record['tokens_per_s']:,.0f}"}
                if self.val_loss is not None:
                    post["val"] = f"{self.val_loss:.4f}"
                bar.set_postfix(post, refresh=False)
        elif every and step % every == 0:
            mfu = f", mfu {100 * record['mfu']:.1f}%" if "mfu" in record else ""
            self.say(f"step {step}/{self.cfg.steps}: loss {record['loss']:.4f}, lr {record['lr']:.2e}, "
                     f"{record['tokens_per_s']:,.0f} tok/s{mfu}")

    # ------------------------------------------------------------------ around the loop
    @property
    def flops_per_token(self) -> float:
        m = self.model_config
        return flops_per_token(self.n_params, m.num_hidden_layers, m.hidden_size, self.cfg.seq_len)

    def _announce(self) -> None:
        cfg, info, m = self.cfg, self.info, self.model_config
        self.peak = cfg.peak_flops
        if self.peak is None and info.device.type == "cuda":
            self.peak = peak_flops(torch.cuda.get_device_name(info.device))
        resumed = getattr(self, "restored_from", None)
        self.say(f"{self.desc}: {cfg.variant} @ {cfg.preset}, {self.n_params:,} parameters, vocab {m.vocab_size} "
                 f"({self.data_meta['tokenizer']}), {info.device.type} x{info.world_size} ({info.mode}), "
                 f"{'bf16' if self.use_bf16 else 'fp32'}; {cfg.steps} steps x {self.tokens_per_step:,} tokens "
                 f"(batch {cfg.batch_size} x accum {self.accum} x {info.world_size} x seq {cfg.seq_len})"
                 + (f"; resuming at step {self.step} from {resumed}" if resumed else ""))
        if self.val_loader is None:
            self.say("  (no validation split in the data and eval_every is 0: training without validation)")
        if self.peak is None:
            self.say("  (MFU not reported: no peak FLOP/s known for this device; set `peak_flops`, in ddl train "
                     "--peak-flops)")
        elif info.device.type == "cpu":
            self.say(f"  (MFU is relative to the given `peak_flops`, {self.peak:.3g} FLOP/s per process)")

    @contextlib.contextmanager
    def _progress_bar(self):
        if not (self.progress and self.info.is_main and self.step < self.end):
            yield None
            return
        from tqdm.auto import tqdm

        bar = tqdm(total=self.cfg.steps, initial=self.step, desc=self.desc, unit="step", dynamic_ncols=True,
                   leave=True)
        try:
            yield bar
        finally:
            bar.close()

    def _result(self, wall: float) -> TrainResult:
        if self.val_loss is None:  # nothing left to do (resumed at the final step): report the logged values
            from deep_delta.train.metrics import read_metrics

            vals = [r for r in read_metrics(self.out / METRICS_FILE) if "val_loss" in r]
            if vals:
                self.val_loss, self.val_ppl = vals[-1]["val_loss"], vals[-1]["val_ppl"]
        final = ckpt.latest_checkpoint(self.out) if self.info.is_main else None
        if self.val_loss is not None:
            self.say(f"{self.desc}: step {self.step}, val_loss {self.val_loss:.4f}, val_ppl {self.val_ppl:.2f}; "
                     f"checkpoint {final}; {wall:.1f} s")
        return TrainResult(out=self.out, step=self.step, parameters=self.n_params, val_loss=self.val_loss,
                           val_ppl=self.val_ppl, checkpoint=final, wall_s=wall)


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    desc: str | None = None,
    quiet: bool = False,
    stop_at: int | None = None,
) -> TrainResult:
    """Train ``cfg`` to ``cfg.steps`` optimizer steps; with ``resume``, continue from ``OUT``'s latest
    checkpoint (or start fresh when there is none). See :class:`Trainer`.

    Raises ValueError / FileNotFoundError / FileExistsError for bad input (nothing written),
    :class:`NonFiniteLossError` when the loss diverges and :class:`TrainingInterrupted` after SIGINT/SIGTERM.
    """
    info = distr.setup(cfg.distributed, cfg.device)
    try:
        return Trainer(cfg, info, resume=resume, overwrite=overwrite, progress=progress, desc=desc, quiet=quiet,
                       stop_at=stop_at).run()
    finally:
        distr.teardown(info)


@contextlib.contextmanager
def _no_hf_progress_bar():
    """Silence transformers' "Writing model shards" bar (it would break our progress bar)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _printer():
    from tqdm.auto import tqdm

    return lambda msg: tqdm.write(msg)


__all__ = [
    "NonFiniteLossError",
    "TrainResult",
    "Trainer",
    "TrainingInterrupted",
    "build_model",
    "build_model_config",
    "check_out_dir",
    "model_vocab_size",
    "optimizer_step",
    "train",
]
