"""What every benchmark here measures with: one timer, one interleaving, the device and the dtype.

- :func:`timed`: wall seconds of one call, the device synchronised before and after (CUDA runs
  asynchronously: without the syncs a timer measures the launches, not the work).
- :func:`interleaved`: round-robin over the cases, the starting case rotating each round so that none
  always runs first (after the others have warmed caches, or heated the chip); ``warmup`` untimed rounds
  first. :func:`interleaved_times` times plain callables that way, round by round; :func:`interleaved_medians`
  keeps the median of each.
- :data:`BENCH_DTYPES` and :func:`autocast_for`: ``dtype`` "bfloat16"/"float16" means autocast over fp32
  weights, as training runs (``ddl train``), in ``ddl bench`` and ``ddl bench-kernels`` alike (the names and
  their check live in ``eval/settings.py``, which the command line reads without PyTorch).

Errors name the Python parameters in backticks (```batch_size` got 0``); the CLI shows its flags instead.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from deep_delta.eval.settings import BENCH_DTYPE_NAMES, check_dtype
from deep_delta.settings import check_count

T = TypeVar("T")

# dtype name (BENCH_DTYPE_NAMES) -> autocast dtype over fp32 weights (None: plain fp32)
BENCH_DTYPES: dict[str, torch.dtype | None] = {
    name: None if name == "float32" else getattr(torch, name) for name in BENCH_DTYPE_NAMES
}
DTYPE_HELP = "float32, or bfloat16 / float16 autocast over fp32 weights, as in training"


def sync(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes, ``device`` synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def interleaved(cases: Mapping[str, Callable[[], T]], repeats: int, warmup: int = 0, *,
                progress: Callable[[str], None] | None = None) -> dict[str, list[T]]:
    """Call every case once per round for ``warmup`` untimed rounds, then ``repeats`` rounds whose results
    are returned (``{name: [result per round]}``). Round ``r`` starts at case ``r mod len(cases)``.

    A case is a measurement: it returns what it measured (seconds from :func:`timed`, or several figures).
    """
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    names = list(cases)
    samples: dict[str, list[T]] = {name: [] for name in names}
    for r in range(warmup + repeats):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            if progress is not None:
                what = f"warm-up {r + 1}/{warmup}" if r < warmup else f"repeat {r - warmup + 1}/{repeats}"
                progress(f"{what}: {name}")
            result = cases[name]()
            if r >= warmup:
                samples[name].append(result)
    return samples


def interleaved_times(cases: Mapping[str, Callable[[], object]], device: torch.device, repeats: int,
                      warmup: int = 0) -> dict[str, list[float]]:
    """Seconds of each callable in each of ``repeats`` rounds (``{name: [seconds per round]}``), timed with
    :func:`timed` in :func:`interleaved` rounds: round ``i`` of every case ran under the same load."""
    return interleaved({name: (lambda fn=fn: timed(fn, device)) for name, fn in cases.items()}, repeats, warmup)


def interleaved_medians(cases: Mapping[str, Callable[[], object]], device: torch.device, repeats: int,
                        warmup: int = 0) -> dict[str, float]:
    """Median seconds of each callable, timed in :func:`interleaved_times` rounds."""
    return {name: statistics.median(ts) for name, ts in interleaved_times(cases, device, repeats, warmup).items()}


def check_int(name: str, value: int, lo: int) -> None:
    """Refuse ``value`` outside [``lo``, MAX_COUNT] (or a non-integer), naming the parameter ``name``."""
    check_count(name, value, lo)


def autocast_for(dtype: str, device: torch.device):
    """The autocast context training would run under for ``dtype`` (a null context for float32)."""
    check_dtype(dtype)
    amp = BENCH_DTYPES[dtype]
    return torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext()


def dtype_label(dtype: str) -> str:
    """How a table header names the precision: "float32", or "bfloat16 autocast (fp32 weights)"."""
    return dtype if BENCH_DTYPES[dtype] is None else f"{dtype} autocast (fp32 weights)"


# Peak DRAM bandwidth of one device, bytes/s (vendor datasheets; the most common part where a name covers several:
# "H100" is the SXM part, "A100" the 40 GB one). Matched by the longest key the device's name contains.
PEAK_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "L4": 0.3e12,
    "RTX 4090": 1.008e12,
    "V100": 0.9e12,
    "T4": 0.32e12,
}


def peak_bandwidth(device_name: str) -> float | None:
    """The peak memory bandwidth (bytes/s) of a CUDA device by its name (longest matching key), or None if
    unknown."""
    for key in sorted(PEAK_BANDWIDTH, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_BANDWIDTH[key]
    return None
