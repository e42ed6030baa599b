"""The training loop: a :class:`Trainer` for one CPU, one GPU, or many GPUs under torchrun. Every run in the
package trains here: ``ddl train``, every ``ddl compare`` run, the mechanism tasks, the coordinate check and
the muP sweeps.

    trainer = Trainer(cfg)          # every check; nothing in OUT is written yet
    result = trainer.run()          # lock OUT, restore or build, then step / evaluate / save / log

By default a run trains on prepared token data (``cfg.data``, or a :class:`~deep_delta.train.data.TrainData`
the caller resolved once), validates on its validation split and keeps a locked, resumable run directory (OUT:
run.json, metrics.jsonl, atomic checkpoints). What other experiments need, the same loop takes: ``batches``
(any object with ``next_batch() -> (x, y)``: fresh task sequences, a fixed list), ``model`` (built and seeded
by the caller), ``evaluate`` (``evaluate(model) -> dict`` of numbers instead of the validation loss),
``callbacks`` (``on_train_start(trainer)``, ``on_before_update(trainer)``: the clipped gradients, before the
optimizer steps, ``on_step_end(trainer, record)``), ``persist=False`` (nothing
written; the records in ``trainer.records``) and ``cfg.on_divergence="stop"`` (a non-finite loss ends the run
at its last good step, as a result). Everything is checked before anything in OUT is written; SIGINT / SIGTERM
end a run after its current step (with a checkpoint when it keeps them).
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from deep_delta.models.utils import count_parameters
from deep_delta.train import checkpoint as ckpt
from deep_delta.train import distributed as distr
from deep_delta.train import run_dir
from deep_delta.train.build import build_model, build_model_config, check_context, require_extras
from deep_delta.train.config import TrainConfig
from deep_delta.train.data import Batches, TrainData, run_loaders
from deep_delta.train.metrics import METRICS_FILE, MemoryLog, MetricsLog, flops_per_token
from deep_delta.train.optim import WarmupCosine, set_learning_rate
from deep_delta.train.progress import RunDisplay, peak_of
from deep_delta.train.signals import StopSignals
from deep_delta.train.step import build_step


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss or gradient norm; the message names the step and the last good
    checkpoint (which is left untouched) and what to do. ``reason``: what diverged, at which step (what run.json
    records as the run's divergence); ``step``: the last good step."""

    def __init__(self, message: str, reason: str | None = None, step: int | None = None):
        super().__init__(message)
        self.reason, self.step = reason or message, step


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM ended the run after a complete optimizer step; a checkpoint of that step exists when
    the run keeps them."""

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
    evaluation: dict[str, Any] = field(default_factory=dict)  # the last evaluation's numbers
    diverged: str | None = None  # why a run with on_divergence="stop" ended early
    bad_weights: str | None = None  # after such a divergence: the last step's weights are not good, and what was kept


class _Diverged(Exception):
    """Raised inside a step (before its update) when ``on_divergence`` is "stop"."""


class Trainer:
    """One training run (see the module docstring for what it takes). Construction checks everything and writes
    nothing; :meth:`run` does the work through :meth:`setup` (lock, restore or build), :meth:`train_step`,
    :meth:`evaluate`, :meth:`save` and :meth:`log`.

    ``stop_at`` ends this session after that many optimizer steps (evaluating and checkpointing there) while the
    schedule still runs to ``cfg.steps``: a time-limited job, continued later with ``resume``.
    """

    def __init__(self, cfg: TrainConfig, info: distr.DistInfo | None = None, *, resume: bool = False,
                 overwrite: bool = False, progress: bool = True, desc: str | None = None, quiet: bool = False,
                 stop_at: int | None = None, data: TrainData | None = None, batches: Batches | None = None,
                 model: torch.nn.Module | None = None, evaluate: Callable[[Any], dict] | None = None,
                 callbacks: Sequence[Any] = (), persist: bool = True):
        if stop_at is not None and not 1 <= stop_at:
            raise ValueError(f"`stop_at` got {stop_at!r}; allowed: an integer >= 1 (a step to stop this session at)")
        if not persist and resume:
            raise ValueError("`resume` got true with `persist` false; allowed: resume a run that keeps a run "
                             "directory (a run kept in memory has no checkpoint to continue from)")
        self.cfg, self.info = cfg, info or distr.DistInfo()
        self.resume, self.overwrite, self.progress, self.persist = resume, overwrite, progress, persist
        self.desc, self.out = desc or cfg.variant, Path(cfg.out)
        self.end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
        self.display = RunDisplay(self, progress=progress, quiet=quiet)
        self.say = self.display.say
        self.data = data if data is not None or batches is not None else TrainData.resolve(cfg.data)
        self.given_model, self.evaluator, self.callbacks = model, evaluate, list(callbacks)
        if model is not None:
            self.model_config = check_context(cfg, model.config)
        elif self.data is not None:
            self.model_config = build_model_config(cfg, self.data.vocab_size)
        else:
            raise ValueError("Trainer: `batches` without `model` or `data`; allowed: a model to train on them, or "
                             "the data whose vocabulary sizes the model")
        # the optional packages the run needs, named before anything is built or written
        require_extras(cfg, self.model_config, loggers=persist and self.info.is_main)
        self.accum = cfg.accumulation(self.info.world_size)
        self.train_loader, self.val_loader = run_loaders(cfg, self.info, self.data, batches, self.model_config.vocab_size,
                                                         evaluates=evaluate is not None)
        self.tokens_per_step = cfg.batch_size * self.accum * self.info.world_size * cfg.seq_len
        self.step, self.last_saved = 0, None
        # the run's schedule segments before this process (one per process that trained it; run_dir.segment)
        self.prior_segments: list[dict[str, Any]] = []
        self.start_step, self.t_start = 0, time.perf_counter()
        self.last_eval: dict[str, Any] = {}
        self.code: dict[str, Any] | None = None  # the code this process trains at (run.json, its segment)
        self.diverged: str | None = None
        self.bad_weights: str | None = None  # why a divergence left the last step's weights unfit, and what was kept

    @property
    def data_dir(self) -> Path | str:
        return self.data.dir if self.data is not None else "batches given to the trainer"

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record of a run that writes nothing (``persist=False``), in order."""
        return self.metrics.records if isinstance(self.metrics, MemoryLog) else []

    # ------------------------------------------------------------------ the whole run
    def run(self) -> TrainResult:
        """Train to ``cfg.steps`` (or ``stop_at``, or a divergence under ``on_divergence="stop"``)."""
        t_start = self.t_start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            stack.callback(self._release)
            if self.persist:
                run_dir.own_run_dir(stack, self.cfg, self.info, self.data_dir, resume=self.resume,
                                    overwrite=self.overwrite)
            self.setup()
            stack.push(self._close_metrics)
            self.peak = peak_of(self.cfg, self.info)
            self.display.announce()
            loaders = self._check_tokens()
            stop = stack.enter_context(StopSignals())
            bar = stack.enter_context(self.display.bar())
            self._notify("on_train_start")
            try:
                while self.step < self.end and self.diverged is None:
                    record = self.train_step()
                    if record is not None:
                        self._after_step(record, bar)
                    stop.requested = distr.agreed_signal(stop.requested, self.info)
                    if stop.requested is not None:
                        self.save(self.step)
                        latest = ckpt.latest_checkpoint(self.out) if self.persist else None
                        raise TrainingInterrupted(stop.requested, self.step, latest)
            except NonFiniteLossError as e:
                # a divergence ends the run as a result under either `on_divergence`: run.json records it the same
                # way, so every report of the run (ddl compare and its --report-only) says "diverged"
                if self.persist and self.info.is_main:
                    run_dir.mark_finished(self.out, {"step": self.step, "evaluation": {}, "diverged": e.reason},
                                          self.segments(self.step))
                raise
            if self.diverged is not None:
                self._end_diverged(bar)
            for loader in loaders:
                loader.wait_for_token_check()
            result = self._result(time.perf_counter() - t_start)
            if self.persist and self.info.is_main and (result.step == self.cfg.steps or result.diverged):
                run_dir.mark_finished(self.out, {"step": result.step, "evaluation": result.evaluation,
                                                 "diverged": result.diverged}, self.segments(result.step))
            self.metrics.summary({"step": result.step, "val_loss": result.val_loss, "val_ppl": result.val_ppl,
                                  "parameters": result.parameters, "tokens": result.step * self.tokens_per_step,
                                  "wall_s": result.wall_s, "checkpoint": str(result.checkpoint),
                                  **({"diverged": result.diverged} if result.diverged else {})})
        return result

    def _check_tokens(self) -> list:
        """Every shard's tokens checked beside the training (a short run names a bad one too)."""
        loaders = [x for x in (self.train_loader, self.val_loader) if hasattr(x, "check_tokens_in_background")]
        for loader in loaders:
            loader.check_tokens_in_background()
        return loaders

    def _notify(self, event: str, *args) -> None:
        for callback in self.callbacks:
            hook = getattr(callback, event, None)
            if hook is not None:
                hook(self, *args)

    def _close_metrics(self, exc_type, exc, tb) -> None:
        """Close the metrics sinks as the run ends; a W&B run is marked failed with the exit code of the error
        or signal that ended it (130 / 143 for SIGINT / SIGTERM)."""
        self.metrics.close(0 if exc is None else getattr(exc, "exit_code", 1))

    def _release(self) -> None:
        """Drop the wrapped model and optimizer when the run ends, before the process group is torn down: a
        DDP module destroyed after ``destroy_process_group`` (say, kept alive by an exception's traceback)
        can block its process for ever."""
        for name in ("train_model", "optimizer", "step_fn"):
            self.__dict__.pop(name, None)

    def setup(self) -> None:
        """Restore the latest checkpoint (with ``resume``) or build the model; optimizer; run.json, metrics."""
        cfg, info = self.cfg, self.info
        latest = ckpt.latest_checkpoint(self.out) if (self.resume and not self.overwrite) else None
        restored = ckpt.load_checkpoint(latest) if latest is not None else None
        if restored is not None:
            run_dir.check_checkpoint_matches(latest, restored["meta"], cfg, self.data_dir, self.model_config,
                                             self.data.fingerprint if self.data is not None else None)
            run_dir.restore_stream(self.train_loader, restored["state"].get("data"), self.out)
        torch.manual_seed(cfg.seed)
        self.model = (self.given_model if self.given_model is not None else
                      run_dir.load_weights_of(latest, self.model_config) if restored is not None else
                      build_model(self.model_config))
        self.n_params = count_parameters(self.model)
        self.model.to(info.device).train()
        built = build_step(self.model, cfg, info)
        self.train_model, self.optimizer, self.step_fn, self.use_bf16 = (built.train_model, built.optimizer,
                                                                          built.step, built.bf16)
        self.schedule = WarmupCosine(cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
        if restored is not None:
            self.restore(restored)
        self._start_run_dir()

    @property
    def autocast(self):
        return self.step_fn.autocast

    def restore(self, restored: dict[str, Any]) -> None:
        """Optimizer, step, data position and RNG from a checkpoint (the weights are loaded by :meth:`setup`)."""
        state = restored["state"]
        distr.load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        self.step = self.last_saved = self.start_step = int(state["step"])
        self.prior_segments = run_dir.prior_segments(restored["meta"], self.step)
        ckpt.set_rng_state(state["rng"])
        self.restored_from = restored["path"]

    def _start_run_dir(self) -> None:
        """From here on OUT is ours; no rank writes before every rank has finished its checks."""
        if not self.persist:
            self.metrics = MemoryLog()
            return
        from deep_delta.train.metrics import truncate_metrics

        distr.barrier(self.info)
        if self.info.is_main:
            from deep_delta.train.optim import optimizer_record
            from deep_delta.train.provenance import code_record

            if self.overwrite:
                run_dir.clear_run(self.out)
            truncate_metrics(self.out, self.step)
            self.code = code_record()
            run_dir.write_run_file(self.out, self.cfg, self.data, self.model_config, self.info.world_size,
                                   self.n_params, self.info.device,
                                   optimizer_record(self.optimizer, self.model, self.cfg.optimizer), self.code)
        distr.barrier(self.info)
        from deep_delta.train.wandb_sink import start_run_sink

        wandb = start_run_sink(self) if self.cfg.wandb and self.info.is_main else None
        self.metrics = MetricsLog(self.out, enabled=self.info.is_main, tensorboard=self.cfg.tensorboard,
                                  sinks=[wandb] if wandb is not None else [])

    # ------------------------------------------------------------------ one optimizer step
    def train_step(self) -> dict[str, Any] | None:
        """Forward, backward over ``accum`` micro-batches, clip, the optimizer's update; returns the step's metrics
        record (None when the step diverged and ``on_divergence`` is "stop": no update, ``self.diverged`` says
        why)."""
        info, t0, seen = self.info, time.perf_counter(), {}

        def before_update(loss_t: torch.Tensor, grad_norm: torch.Tensor) -> None:
            seen["loss"], seen["grad_norm"] = float(loss_t), float(grad_norm)
            self._check_finite(seen["loss"], seen["grad_norm"])
            seen["lr"] = set_learning_rate(self.optimizer, self.schedule(self.step))
            self._notify("on_before_update")  # the gradients, clipped, before the optimizer uses them

        batches = (self.train_loader.next_batch() for _ in range(self.accum))
        try:
            self.step_fn(batches, accum=self.accum, before_update=before_update)
        except _Diverged as e:
            self.optimizer.zero_grad(set_to_none=True)
            self.diverged = str(e)
            return None
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
        found = f"non-finite {what} (loss {loss_val}, grad norm {norm_val}) at step {self.step + 1}"
        if self.cfg.on_divergence == "stop":
            raise _Diverged(found)
        kept = ckpt.latest_checkpoint(self.out) if self.persist else None
        raise NonFiniteLossError(
            f"{found}; training stopped. The last good checkpoint is "
            f"{kept if kept else 'none (no checkpoint was written)'}. A resumed run keeps its `lr` and "
            "`warmup_steps` and repeats the same steps, so it would diverge again: train it anew with a lower `lr` "
            "or more `warmup_steps` (`overwrite`, or another `out`), or set `on_divergence` to stop to keep the run "
            "up to its last good step as a result",
            reason=found, step=self.step)

    def _after_step(self, record: dict[str, Any], bar) -> None:
        cfg, step = self.cfg, self.step
        self.log(record, bar)
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == self.end:
            self._evaluate_and_log(bar, record)
        if (cfg.save_every and step % cfg.save_every == 0) or step == self.end:
            self.save(step)
        self._notify("on_step_end", record)

    def _end_diverged(self, bar) -> None:
        """A run stopped by a divergence: evaluated at its last step, and checkpointed there when those weights are
        good (finite, with a finite validation loss); weights that are not (an update can ruin them while its own
        loss was finite) are not kept, and what was is said (:attr:`bad_weights`)."""
        where = f"{self.desc}: {self.diverged}; stopped at step {self.step} (`on_divergence` stop)"
        self._evaluate_and_log(bar, None)
        val = self.last_eval.get("val_loss")
        if (not isinstance(val, float) or math.isfinite(val)) and all(
                bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            self.say(where)
            if self.step:
                self.save(self.step)
            return
        kept = ckpt.latest_checkpoint(self.out) if self.persist else None
        held = kept is not None and ckpt.step_dir_name(self.step) == kept.name
        self.bad_weights = (f"the weights of step {self.step} are not good (non-finite weights or validation loss): "
                            + (f"its checkpoint {kept} holds them; do not resume or use it" if held else
                               "not checkpointed; the last checkpoint is " + (f"{kept}" if kept else "none")))
        self.say(f"{where}; {self.bad_weights}")

    def _evaluate_and_log(self, bar, record: dict[str, Any] | None) -> None:
        numbers = self.evaluate()
        if numbers is None:
            return
        self.last_eval = numbers
        extra = {"tokens": self.step * self.tokens_per_step}
        if self.evaluator is None:
            extra["eval_batches"] = self.cfg.eval_batches
        self.metrics.log({"step": self.step, **numbers, **extra})
        self.display.evaluation(numbers, record, bar)

    def segments(self, to: int) -> list[dict[str, Any]]:
        """The run's schedule segments up to step ``to``: those of the processes before this one (from the
        checkpoint it resumed) and this process's, from its first step to ``to`` on a schedule of ``cfg.steps``, at
        the code it trains at."""
        return [*self.prior_segments, run_dir.segment(self.start_step, to, self.cfg.steps,
                                                      time.perf_counter() - self.t_start, self.code)]

    # ------------------------------------------------------------------ evaluate, save, log
    def evaluate(self) -> dict[str, Any] | None:
        """The run's evaluation: ``evaluate(model)`` when given, else the validation loss and perplexity over
        ``cfg.eval_batches`` batches of the val split (``cfg.eval_windows``: which windows; all ranks); None when the
        run has neither."""
        if self.evaluator is not None:
            return dict(self.evaluator(self.model))
        if self.val_loader is None:
            return None
        from deep_delta.train.validation import validation_numbers

        batches = self.val_loader.eval_batches(self.cfg.eval_batches, windows=self.cfg.eval_windows)
        return validation_numbers(self.train_model, batches, self.info, autocast=self.autocast)

    def save(self, at: int) -> None:
        """Checkpoint step ``at`` atomically (a collective under FSDP: every rank calls it); nothing for a run
        that writes nothing."""
        if not self.persist or (self.last_saved == at and ckpt.latest_checkpoint(self.out) is not None):
            return
        run_dir.save_checkpoint(self, at)
        distr.barrier(self.info)
        self.last_saved = at

    def log(self, record: dict[str, Any], bar=None) -> None:
        """Append ``record`` to the metrics and show it."""
        self.metrics.log(record)
        self.display.step(record, bar)

    # ------------------------------------------------------------------ around the loop
    @property
    def flops_per_token(self) -> float:
        m = self.model_config
        return flops_per_token(self.n_params, m.num_hidden_layers, m.hidden_size, self.cfg.seq_len)

    def _result(self, wall: float) -> TrainResult:
        if not self.last_eval and self.persist:  # resumed at the final step: report the logged values
            from deep_delta.train.metrics import read_metrics

            vals = [r for r in read_metrics(self.out / METRICS_FILE) if "val_loss" in r]
            if vals:
                self.last_eval = {"val_loss": vals[-1]["val_loss"], "val_ppl": vals[-1]["val_ppl"]}
        final = ckpt.latest_checkpoint(self.out) if self.info.is_main and self.persist else None
        val_loss, val_ppl = self.last_eval.get("val_loss"), self.last_eval.get("val_ppl")
        if self.last_eval:
            shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.last_eval.items())
            self.say(f"{self.desc}: step {self.step}, {shown}; checkpoint {final}; {wall:.1f} s")
        return TrainResult(out=self.out, step=self.step, parameters=self.n_params, val_loss=val_loss,
                           val_ppl=val_ppl, checkpoint=final, wall_s=wall, evaluation=dict(self.last_eval),
                           diverged=self.diverged, bad_weights=self.bad_weights)


def train(cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True,
          desc: str | None = None, quiet: bool = False, stop_at: int | None = None,
          data: TrainData | None = None) -> TrainResult:
    """Train ``cfg`` to ``cfg.steps`` optimizer steps; with ``resume``, continue from ``OUT``'s latest
    checkpoint (or start fresh when there is none); ``data``: the data resolved by the caller (default
    ``cfg.data``). See :class:`Trainer`.

    Raises ValueError / FileNotFoundError / FileExistsError for bad input (nothing written),
    :class:`NonFiniteLossError` when the loss diverges (``on_divergence`` "raise") and
    :class:`TrainingInterrupted` after SIGINT/SIGTERM.
    """
    info = distr.setup(cfg.distributed, cfg.device)
    try:
        return Trainer(cfg, info, resume=resume, overwrite=overwrite, progress=progress, desc=desc, quiet=quiet,
                       stop_at=stop_at, data=data).run()
    finally:
        distr.teardown(info)


__all__ = ["NonFiniteLossError", "TrainResult", "Trainer", "TrainingInterrupted", "train"]
