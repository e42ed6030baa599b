"""The training loop: one function, :func:`train`, for one CPU, one GPU, or many GPUs under torchrun.

Everything a run needs is checked before anything in ``OUT`` is written (data shards and their vocabulary,
the model config, the batch arithmetic, an existing run in ``OUT``), so a refused run changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from deep_delta.train import checkpoint as ckpt
from deep_delta.train import distributed as distr
from deep_delta.train.config import TrainConfig
from deep_delta.train.metrics import METRICS_FILE, MetricsLog, flops_per_token, peak_flops, truncate_metrics
from deep_delta.train.optim import WarmupCosine, build_optimizer, build_scheduler

RUN_FILE = "run.json"
# Settings a resumed run may change; every other TrainConfig field must match the run in OUT.
RESUMABLE_CHANGES = frozenset({
    "steps", "eval_every", "eval_batches", "save_every", "keep", "log_every", "device", "dtype", "compile",
    "distributed", "tensorboard", "peak_flops", "out",
})


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss or gradient norm; the message names the step and the last good
    checkpoint (which is left untouched)."""


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
    from deep_delta.models.ddl.configuration_ddl import PRESETS, DDLConfig

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

    data_dir = Path(cfg.data).expanduser() if cfg.data else default_data_dir()
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data directory {data_dir} does not exist (prepare one with `ddl data prepare`)")
    meta = read_meta(data_dir)
    for key in ("tokenizer", "vocab_size"):
        if key not in meta:
            raise ValueError(f"{data_dir}/meta.json lacks {key!r}; re-prepare the data with `ddl data prepare`")
    return data_dir.resolve(), meta


def _run_identity(cfg: TrainConfig, data_dir: Path) -> dict[str, Any]:
    d = cfg.to_dict()
    d["data"] = str(data_dir)
    return {k: v for k, v in d.items() if k not in RESUMABLE_CHANGES}


def _holds_run(out: Path) -> bool:
    return any((out / name).exists() for name in (RUN_FILE, METRICS_FILE, ckpt.CHECKPOINTS))


def check_out_dir(cfg: TrainConfig, data_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to clobber a run: OUT holding a run needs ``resume`` (same settings) or ``overwrite``."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} exists and is not a directory")
    if not _holds_run(out) or overwrite:
        return
    if not resume:
        raise FileExistsError(
            f"--out {out} already holds a training run; pass --resume to continue it or --overwrite to replace it"
        )
    run_file = out / RUN_FILE
    if not run_file.is_file():
        return
    saved = json.loads(run_file.read_text()).get("identity", {})
    mine = _run_identity(cfg, data_dir)
    diff = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
    if diff:
        detail = "; ".join(f"{k}: run has {saved.get(k)!r}, now {mine.get(k)!r}" for k in diff)
        raise FileExistsError(
            f"--out {out} holds a different run ({detail}); --resume may only change "
            f"{', '.join(sorted(RESUMABLE_CHANGES))}. Use another --out, or --overwrite to replace it"
        )


def _clear_run(out: Path) -> None:
    for name in (RUN_FILE, METRICS_FILE, "tensorboard", ckpt.CHECKPOINTS):
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def _param_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


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
    checkpoint (or start fresh when there is none). Returns the final step and validation loss.

    ``stop_at`` ends this session after that many optimizer steps (validating and checkpointing there) while
    the schedule still runs to ``cfg.steps``: a time-limited job, continued later with ``resume``.

    Raises ValueError / FileNotFoundError / FileExistsError for bad input (nothing written) and
    :class:`NonFiniteLossError` when the loss diverges.
    """
    t_start = time.perf_counter()
    info = distr.setup(cfg.distributed, cfg.device)
    try:
        return _train(cfg, info, resume=resume, overwrite=overwrite, progress=progress, desc=desc, quiet=quiet,
                      stop_at=stop_at, t_start=t_start)
    finally:
        distr.teardown(info)


def _train(cfg: TrainConfig, info: distr.DistInfo, *, resume: bool, overwrite: bool, progress: bool,
           desc: str | None, quiet: bool, stop_at: int | None, t_start: float) -> TrainResult:
    from deep_delta.data import TokenLoader

    say = (lambda *a: None) if (quiet or not info.is_main) else _printer()
    out = Path(cfg.out)

    # ---- everything is checked before OUT is touched
    if stop_at is not None and not 1 <= stop_at:
        raise ValueError(f"`stop_at` got {stop_at!r}; allowed: an integer >= 1 (a step to stop this session at)")
    end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
    data_dir, data_meta = _resolve_data(cfg)
    model_config = build_model_config(cfg, int(data_meta["vocab_size"]))
    accum = cfg.accumulation(info.world_size)
    train_loader = TokenLoader(data_dir, "train", cfg.batch_size, cfg.seq_len, seed=cfg.seed, rank=info.rank,
                               world_size=info.world_size, vocab_size=model_config.vocab_size)
    val_loader = TokenLoader(data_dir, "val", cfg.batch_size, cfg.seq_len, seed=cfg.seed, rank=info.rank,
                             world_size=info.world_size, vocab_size=model_config.vocab_size)
    check_out_dir(cfg, data_dir, resume=resume, overwrite=overwrite)
    latest = ckpt.latest_checkpoint(out) if (resume and not overwrite) else None
    restored = ckpt.load_checkpoint(latest) if latest is not None else None
    if restored is not None:
        train_loader.load_state_dict(restored["state"]["data"])  # refuses a changed data set before any write

    # ---- model, on every rank from the same seed (or the checkpoint)
    torch.manual_seed(cfg.seed)
    if restored is not None:
        from deep_delta.models import DDLForCausalLM

        with _no_hf_progress_bar():
            model = DDLForCausalLM.from_pretrained(latest, dtype=torch.float32)
    else:
        model = build_model(model_config)
    n_params = _param_count(model)
    model.to(info.device)
    model.train()
    use_bf16 = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and info.device.type == "cuda")
    fsdp_mixed = use_bf16 and info.mode == "fsdp" and info.device.type == "cuda"  # FSDP casts parameters itself
    train_model = distr.parallelize(model, info, compile=cfg.compile, bf16=fsdp_mixed)
    autocast = (
        torch.autocast(info.device.type, dtype=torch.bfloat16) if use_bf16 and not fsdp_mixed
        else contextlib.nullcontext()
    )
    fused = True if info.device.type == "cuda" and info.mode != "fsdp" else None
    optimizer = build_optimizer(model, cfg.lr, cfg.weight_decay, cfg.betas, fused=fused)
    scheduler = build_scheduler(optimizer, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)

    step = 0
    if restored is not None:
        state = restored["state"]
        distr.load_optimizer_state(model, optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        # the schedule follows this run's settings (--steps may grow on resume)
        scheduler.lr_lambdas[0] = WarmupCosine(cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)
        step = int(state["step"])
        for group, lr in zip(optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = lr * scheduler.lr_lambdas[0](step)
        ckpt.set_rng_state(state["rng"])

    # ---- from here on OUT is ours; no rank writes before every rank has finished its checks above
    distr.barrier(info)
    if info.is_main:
        if overwrite:
            _clear_run(out)
        out.mkdir(parents=True, exist_ok=True)
        truncate_metrics(out / METRICS_FILE, step)
        ckpt.write_text_atomic(out / RUN_FILE, json.dumps({
            "identity": _run_identity(cfg, data_dir),
            "train_config": cfg.to_dict(),
            "model_config": model_config.to_diff_dict(),
            "data": {"dir": str(data_dir), "tokenizer": data_meta["tokenizer"],
                     "vocab_size": int(data_meta["vocab_size"])},
            "world_size": info.world_size,
            "parameters": n_params,
        }, indent=2, sort_keys=True))
    distr.barrier(info)
    log = MetricsLog(out, enabled=info.is_main, tensorboard=cfg.tensorboard)

    tokens_per_step = cfg.batch_size * accum * info.world_size * cfg.seq_len
    fpt = flops_per_token(n_params, model_config.num_hidden_layers, model_config.hidden_size, cfg.seq_len)
    peak = cfg.peak_flops
    if peak is None and info.device.type == "cuda":
        peak = peak_flops(torch.cuda.get_device_name(info.device))
    say(f"{desc or cfg.variant}: {cfg.variant} @ {cfg.preset}, {n_params:,} parameters, vocab "
        f"{model_config.vocab_size} ({data_meta['tokenizer']}), {info.device.type} x{info.world_size} "
        f"({info.mode}), {'bf16' if use_bf16 else 'fp32'}; {cfg.steps} steps x {tokens_per_step:,} tokens "
        f"(batch {cfg.batch_size} x accum {accum} x {info.world_size} x seq {cfg.seq_len})"
        + (f"; resuming at step {step} from {latest}" if restored is not None else ""))
    if peak is None:
        say("  (MFU not reported: no peak FLOP/s known for this device; pass --peak-flops)")
    elif info.device.type == "cpu":
        say(f"  (MFU is relative to the given --peak-flops {peak:.3g} FLOP/s per process)")

    def evaluate() -> tuple[float, float]:
        train_model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=info.device)
        with torch.no_grad():
            for x, y in val_loader.eval_batches(cfg.eval_batches):
                x, y = x.to(info.device), y.to(info.device)
                with autocast:
                    loss = train_model(x, shift_labels=y, use_cache=False).loss
                total[0] += loss.double() * y.numel()
                total[1] += y.numel()
        distr.all_reduce_sum(total, info)
        distr.reshard(train_model, info)
        train_model.train()
        val = float(total[0] / total[1])
        return val, math.exp(min(val, 700.0))

    last_saved = step if restored is not None else None

    def save(at: int) -> None:
        nonlocal last_saved
        optim_state = distr.full_optimizer_state(model, optimizer)
        model_state = distr.full_model_state(model) if info.mode == "fsdp" else None
        if info.is_main:
            def save_model(d: Path) -> None:
                target = model
                if model_state is not None:  # FSDP: write the gathered full weights through a CPU copy
                    target = build_model(model_config)
                    target.load_state_dict(model_state)
                with _no_hf_progress_bar():
                    target.save_pretrained(d, safe_serialization=True)

            ckpt.save_checkpoint(out, at, save_model=save_model, keep=cfg.keep, train_state={
                "step": at, "optimizer": optim_state, "scheduler": scheduler.state_dict(),
                "data": train_loader.state_dict(), "rng": ckpt.rng_state(), "world_size": info.world_size,
            }, meta={
                "variant": cfg.variant, "preset": cfg.preset, "tokenizer": data_meta["tokenizer"],
                "data_dir": str(data_dir), "vocab_size": model_config.vocab_size,
                "tokens": at * tokens_per_step, "train_config": cfg.to_dict(),
            })
        distr.barrier(info)
        last_saved = at

    bar = None
    if progress and info.is_main and step < end:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=step, desc=desc or cfg.variant, unit="step", dynamic_ncols=True,
                   leave=True)
    val_loss = val_ppl = None
    try:
        while step < end:
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), device=info.device)
            for micro in range(accum):
                x, y = train_loader.next_batch()
                x, y = x.to(info.device, non_blocking=True), y.to(info.device, non_blocking=True)
                distr.set_gradient_sync(train_model, info, micro == accum - 1)
                with autocast:
                    loss = train_model(x, shift_labels=y).loss
                (loss / accum).backward()
                loss_sum += loss.detach()
            loss_t = distr.all_reduce_sum(loss_sum, info) / (accum * info.world_size)
            if cfg.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            else:
                grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            loss_val, norm_val = float(loss_t), float(grad_norm)
            if not (math.isfinite(loss_val) and math.isfinite(norm_val)):
                what = "loss" if not math.isfinite(loss_val) else "gradient norm"
                kept = ckpt.latest_checkpoint(out)
                raise NonFiniteLossError(
                    f"non-finite {what} (loss {loss_val}, grad norm {norm_val}) at step {step + 1}; training "
                    f"stopped. The last good checkpoint is {kept if kept else 'none (no checkpoint was written)'}"
                    "; lower --lr or raise --warmup-steps, then --resume"
                )
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if info.device.type == "cuda":
                torch.cuda.synchronize(info.device)
            dt = time.perf_counter() - t0
            tok_s = tokens_per_step / dt
            record = {"step": step, "loss": loss_val, "lr": lr, "grad_norm": norm_val,
                      "tokens": step * tokens_per_step, "tokens_per_s": tok_s, "step_time_s": dt,
                      "flops_per_s": fpt * tok_s}
            if peak:
                record["mfu"] = fpt * tok_s / (peak * info.world_size)
            log.log(record)
            if bar is not None:
                bar.update(1)
                if cfg.log_every and (step % cfg.log_every == 0 or step == cfg.steps):
                    post = {"loss": f"{loss_val:.4f}", "lr": f"{lr:.2e}", "tok/s": f"{tok_s:,.0f}"}
                    if val_loss is not None:
                        post["val"] = f"{val_loss:.4f}"
                    bar.set_postfix(post, refresh=False)
            elif cfg.log_every and step % cfg.log_every == 0:
                mfu = f", mfu {100 * record['mfu']:.1f}%" if "mfu" in record else ""
                say(f"step {step}/{cfg.steps}: loss {loss_val:.4f}, lr {lr:.2e}, {tok_s:,.0f} tok/s{mfu}")
            if (cfg.eval_every and step % cfg.eval_every == 0) or step == end:
                val_loss, val_ppl = evaluate()
                log.log({"step": step, "val_loss": val_loss, "val_ppl": val_ppl, "tokens": step * tokens_per_step})
                msg = f"step {step}/{cfg.steps}: val_loss {val_loss:.4f}, val_ppl {val_ppl:.2f}"
                if bar is not None:
                    bar.set_postfix({"loss": f"{loss_val:.4f}", "val": f"{val_loss:.4f}"}, refresh=True)
                    if step != end:
                        bar.write(msg)
                else:
                    say(msg)
            if (cfg.save_every and step % cfg.save_every == 0) or step == end:
                save(step)
    finally:
        if bar is not None:
            bar.close()
        log.close()

    if val_loss is None:  # nothing left to do (resumed at the final step): report the logged values
        from deep_delta.train.metrics import read_metrics

        vals = [r for r in read_metrics(out / METRICS_FILE) if "val_loss" in r]
        if vals:
            val_loss, val_ppl = vals[-1]["val_loss"], vals[-1]["val_ppl"]
    final = ckpt.latest_checkpoint(out) if info.is_main else None
    wall = time.perf_counter() - t_start
    if val_loss is not None:
        say(f"{desc or cfg.variant}: step {step}, val_loss {val_loss:.4f}, val_ppl {val_ppl:.2f}; checkpoint "
            f"{final}; {wall:.1f} s")
    return TrainResult(out=out, step=step, parameters=n_params, val_loss=val_loss, val_ppl=val_ppl,
                       checkpoint=final, wall_s=wall)


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
    "build_model",
    "build_model_config",
    "check_out_dir",
    "model_vocab_size",
    "train",
]
