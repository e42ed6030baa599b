"""Training metrics: ``metrics.jsonl`` (one JSON object per line), optional TensorBoard, FLOPs and MFU."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from deep_delta.fsutil import atomic_write

METRICS_FILE = "metrics.jsonl"

# Dense bf16 tensor-core peak of one device, FLOP/s (vendor datasheets; SXM parts where there are two).
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "A10G": 70e12,
    "A10": 125e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,
    "T4": 65e12,
}


def peak_flops(device_name: str) -> float | None:
    """The bf16 peak FLOP/s of a CUDA device by its name (longest matching key), or None if unknown."""
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key.lower() in device_name.lower():
            return PEAK_BF16_FLOPS[key]
    return None


def flops_per_token(num_params: int, num_layers: int, hidden_size: int, seq_len: int) -> float:
    """Training FLOPs per token, forward + backward: 6 N for the matrix multiplies (N counts the tied
    embedding once: it is the LM head's matrix) plus 12 L d T for attention scores and values (nanoGPT /
    PaLM appendix B). DDL's state updates are O(d d_v) per token and left out."""
    return 6.0 * num_params + 12.0 * num_layers * hidden_size * seq_len


class MetricsLog:
    """Appends records to ``OUT/metrics.jsonl`` (and TensorBoard scalars when enabled); rank 0 only."""

    def __init__(self, out_dir: str | os.PathLike, *, enabled: bool = True, tensorboard: bool = False):
        self.path = Path(out_dir) / METRICS_FILE
        self.enabled = enabled
        self._file = None
        self._tb = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a")
            if tensorboard:
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError as e:  # tensorboard is an optional extra
                    raise ValueError(
                        "TrainConfig: `tensorboard` got true but the tensorboard package is not installed; "
                        "install it (pip install 'deep-delta-learning[tensorboard]') or set tensorboard: false"
                    ) from e
                self._tb = SummaryWriter(str(Path(out_dir) / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            step = record["step"]
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` (a torn last line from a crash is ignored)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    records = []
    if not path.is_file():
        return records
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def truncate_metrics(path: str | os.PathLike, step: int) -> None:
    """Keep only the records with ``record["step"] <= step`` (a resumed run continues without duplicates)."""
    path = Path(path)
    if not path.is_file():
        return
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))
