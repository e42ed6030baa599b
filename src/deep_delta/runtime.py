"""Where and how computation runs: the device and dtype resolvers and the CPU thread count, shared by every
command and library entry point (one meaning of ``device``, ``dtype`` and ``threads`` everywhere)."""

from __future__ import annotations

import contextlib
import os
import re
import time

import torch

DEVICE_CHOICES = "auto | cpu | cuda | cuda:N"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_device(spec: str) -> str:
    """``spec`` if it is a device this library accepts (auto, cpu, cuda, cuda:N), else a ValueError."""
    if not isinstance(spec, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", spec):
        raise ValueError(f"`device` got {spec!r}; allowed: {DEVICE_CHOICES}")
    return spec


def resolve_device(spec: str | torch.device = "auto", local_rank: int | None = None) -> torch.device:
    """"auto" -> CUDA when available, else CPU; "cuda" -> the current GPU, or this process's GPU
    (``local_rank``) under torchrun; "cuda:N" and "cpu" as given. CUDA must exist when asked for."""
    if isinstance(spec, torch.device):
        return spec
    check_device(spec)
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"`device` got {spec!r} but CUDA is not available on this machine; allowed here: cpu, auto")
    dev = torch.device(spec)
    if dev.index is None:
        dev = torch.device("cuda", local_rank if local_rank is not None else torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise ValueError(f"`device` got {spec!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if local_rank is not None:
        torch.cuda.set_device(dev)
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """"auto" (or None) -> bfloat16 on a CUDA device that supports it, else float32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"`dtype` got {dtype!r}; allowed: auto | {' | '.join(DTYPES)}")
    return DTYPES[dtype]


def trains_in_bf16(dtype: str, device: torch.device) -> bool:
    """The training precision rule, one for every run and benchmark: bf16 autocast over fp32 weights for
    ``dtype="bfloat16"``, and for ``"auto"`` on CUDA; fp32 otherwise."""
    return dtype == "bfloat16" or (dtype == "auto" and torch.device(device).type == "cuda")


def training_autocast(dtype: str, device: torch.device, fsdp: bool = False):
    """The autocast context of a training step (:func:`trains_in_bf16`); a null context for fp32 and under FSDP's
    own mixed precision on CUDA (FSDP casts the parameters itself)."""
    device = torch.device(device)
    if not trains_in_bf16(dtype, device) or (fsdp and device.type == "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None where it does not exist."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(interval: float = 0.3) -> float:
    """How many cores other work keeps busy now: /proc/stat sampled over ``interval`` seconds (the 1-minute
    load average where /proc/stat is missing, which lags a job that just ended by a minute or more)."""
    cores = os.cpu_count() or 1
    first = _cpu_times()
    if first is not None:
        time.sleep(interval)
        second = _cpu_times()
        if second is not None and second[1] > first[1]:
            return cores * (second[0] - first[0]) / (second[1] - first[1])
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def cpu_threads(spec: str | int | None) -> int | None:
    """Intra-op CPU threads for ``--threads``: an integer, None (keep PyTorch's default), or "auto": the cores
    not already busy (cores minus :func:`busy_cores`, at least 1). On a shared machine, more OpenMP threads
    than free cores makes every step wait for a descheduled thread (measured here: 3-4x slower)."""
    return chosen_threads(spec)[0]


def chosen_threads(spec: str | int | None) -> tuple[int | None, str]:
    """:func:`cpu_threads` with the reason, for a command to say: (threads or None, why), e.g. ``(1, "auto: 2
    cores, 1.3 kept busy by other work")``."""
    if spec is None:
        return None, "PyTorch's own choice"
    if spec == "auto":
        cores = os.cpu_count() or 1
        busy = busy_cores()
        return max(1, min(cores, int(cores - busy + 0.5))), f"auto: {cores} cores, {busy:.1f} kept busy by other work"
    try:
        n = int(spec)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise ValueError(f"`threads` got {spec!r}; allowed: an integer >= 1 or 'auto'")
    return n, "as given"
