"""What a training run shows while it runs: the opening line, the progress bar (or a line every ``log_every``
steps), each evaluation, the closing line. Rank 0 only; nothing with ``quiet``."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


class RunDisplay:
    """The display of one :class:`~deep_delta.train.trainer.Trainer` run."""

    def __init__(self, trainer, *, progress: bool, quiet: bool):
        self.trainer, self.progress = trainer, progress
        self.say = (lambda *a: None) if (quiet or not trainer.info.is_main) else _printer()

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
            self.say("  (MFU not reported: no peak FLOP/s known for this device; set `peak_flops`, in ddl train "
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


__all__ = ["RunDisplay", "no_hf_progress_bar", "peak_of"]
