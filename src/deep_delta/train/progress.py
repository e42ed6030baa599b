"""What a training run shows while it runs: the opening line, the progress bar (or a line every ``log_every``
steps), an estimate of its length after its first steps, each evaluation, the closing line. Rank 0 only; nothing
with ``quiet``."""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar
from typing import Any

import torch

# The estimate of a run's length is said after this many steps of a session (the first ones pay for warm-up).
ESTIMATE_AFTER = 10
# How many runs of a study follow the one training now (set by the study around each run: :func:`runs_after`).
_RUNS_AFTER: ContextVar[int] = ContextVar("runs_after", default=0)
# Start-up notes said once per process: a study's runs would repeat them (the MFU note four times on a CPU).
_SAID: set[str] = set()


@contextlib.contextmanager
def runs_after(count: int):
    """While a study trains one of its runs: ``count`` runs follow it, which the run's estimate of its length
    adds (at the pace of this one)."""
    token = _RUNS_AFTER.set(count)
    try:
        yield
    finally:
        _RUNS_AFTER.reset(token)


def duration(seconds: float) -> str:
    """``seconds`` as a person says it: 40 s, 12 min, 1.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


class RunDisplay:
    """The display of one :class:`~deep_delta.train.trainer.Trainer` run."""

    def __init__(self, trainer, *, progress: bool, quiet: bool):
        self.trainer, self.progress = trainer, progress
        self.silent = quiet or not trainer.info.is_main
        self.say = (lambda *a: None) if self.silent else _printer()
        self.started: tuple[int, float] | None = None  # (step, time) this session's first step ended at

    def say_once(self, note: str) -> None:
        """A start-up note, said once per process."""
        if note not in _SAID and not self.silent:
            _SAID.add(note)
            self.say(note)

    def announce(self) -> None:
        """The run's opening line: model, data, device, precision, batch arithmetic, resume point, MFU basis."""
        t = self.trainer
        cfg, info, m = t.cfg, t.info, t.model_config
        resumed = getattr(t, "restored_from", None)
        source = t.data.meta["tokenizer"] if t.data is not None else "batches of its own"
        self.say(f"{t.desc}: {cfg.variant} @ {cfg.preset}, {t.n_params:,} parameters, vocab {m.vocab_size} "
                 f"({source}), {info.device.type} x{info.world_size} ({info.mode}), "
                 f"{'bf16' if t.use_bf16 else 'fp32'}; {cfg.steps} steps x {t.tokens_per_step:,} tokens "
                 f"(batch {cfg.batch_size} x accum {t.accum} x {info.world_size} x seq {cfg.seq_len})"
                 + (f"; resuming at step {t.step} from {resumed}" if resumed else ""))
        if t.val_loader is None and t.evaluator is None and t.data is not None:
            self.say("  (no validation split in the data and eval_every is 0: training without validation)")
        if t.peak is None:
            self.say_once("  (MFU not reported: no peak FLOP/s known for this device; set `peak_flops`, in ddl train "
                          "--peak-flops)")
        elif info.device.type == "cpu":
            self.say(f"  (MFU is relative to the given `peak_flops`, {t.peak:.3g} FLOP/s per process)")

    @contextlib.contextmanager
    def bar(self):
        """A tqdm bar over the run's steps (None without ``progress``, off rank 0, or with nothing to do)."""
        t = self.trainer
        if not (self.progress and t.info.is_main and t.step < t.end):
            yield None
            return
        from tqdm.auto import tqdm

        bar = tqdm(total=t.cfg.steps, initial=t.step, desc=t.desc, unit="step", dynamic_ncols=True,
                   leave=t.persist)
        try:
            yield bar
        finally:
            bar.close()

    def step(self, record: dict[str, Any], bar) -> None:
        """One step: the bar moves (its postfix every ``log_every``), or a line every ``log_every`` steps."""
        t = self.trainer
        every, step = t.cfg.log_every, record["step"]
        self._estimate(step, bar)
        if bar is not None:
            bar.update(1)
            if every and (step % every == 0 or step == t.cfg.steps):
                post = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}",
                        "tok/s": f"{record['tokens_per_s']:,.0f}"}
                first = next(iter(t.last_eval.values()), None)
                if isinstance(first, float):
                    post["val"] = f"{first:.4f}"
                bar.set_postfix(post, refresh=False)
        elif every and step % every == 0:
            mfu = f", mfu {100 * record['mfu']:.1f}%" if "mfu" in record else ""
            self.say(f"step {step}/{t.cfg.steps}: loss {record['loss']:.4f}, lr {record['lr']:.2e}, "
                     f"{record['tokens_per_s']:,.0f} tok/s{mfu}")

    def _estimate(self, step: int, bar) -> None:
        """After :data:`ESTIMATE_AFTER` steps of this session: how long the rest of the run will take at the pace of
        those steps (timed from the end of the first, which pays for warm-up), and with the runs of its study that
        follow it, each at this run's pace (a busy machine, or a dearer variant, makes it longer)."""
        t, now = self.trainer, time.perf_counter()
        if self.silent:
            return
        if self.started is None:
            self.started = (step, now)
            return
        first, since = self.started
        if step - first != ESTIMATE_AFTER or t.end - step < ESTIMATE_AFTER:
            return
        pace = (now - since) / (step - first)
        left = pace * (t.end - step)
        msg = f"{t.desc}: about {duration(left)} left for this run ({1000 * pace:.0f} ms a step so far"
        after = _RUNS_AFTER.get()
        if after:
            msg += (f"); with the {after} run(s) of the study after it, about {duration(left + after * pace * t.end)}, "
                    "if each costs as much (a DDL variant's step costs more")
        msg += "; a busy machine takes longer)"
        if bar is not None:
            bar.write(msg)
        else:
            self.say(msg)

    def evaluation(self, numbers: dict[str, Any], record: dict[str, Any] | None, bar) -> None:
        """An evaluation's numbers: a line (above the bar), the first one in the bar's postfix."""
        t = self.trainer
        shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in numbers.items())
        msg = f"step {t.step}/{t.cfg.steps}: {shown}"
        if bar is None:
            self.say(msg)
            return
        first = next(iter(numbers.values()), None)
        post = {"val": f"{first:.4f}"} if isinstance(first, float) else {}
        if record is not None:
            post = {"loss": f"{record['loss']:.4f}", **post}
        bar.set_postfix(post, refresh=True)
        if t.step != t.end:
            bar.write(msg)


@contextlib.contextmanager
def no_hf_progress_bar():
    """Silence transformers' "Writing model shards" bar (it would break our progress bar)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def peak_of(cfg, info) -> float | None:
    """Peak FLOP/s of one device for MFU: ``cfg.peak_flops``, else looked up for a known GPU, else None."""
    from deep_delta.train.metrics import peak_flops

    if cfg.peak_flops is None and info.device.type == "cuda":
        return peak_flops(torch.cuda.get_device_name(info.device))
    return cfg.peak_flops


def _printer():
    from tqdm.auto import tqdm

    return lambda msg: tqdm.write(msg)


__all__ = ["ESTIMATE_AFTER", "RunDisplay", "duration", "no_hf_progress_bar", "peak_of", "runs_after"]
