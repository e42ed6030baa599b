"""Training metrics: ``metrics.jsonl`` (one JSON object per line) and the sinks beside it (TensorBoard here,
Weights & Biases in :mod:`deep_delta.train.wandb_sink`), FLOPs and MFU."""

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


class MetricsSink:
    """Somewhere beside ``metrics.jsonl`` that a run's records also go: TensorBoard, Weights & Biases."""

    def log(self, record: dict[str, Any]) -> None:
        """One record of ``metrics.jsonl`` (a step's or a validation's; ``record["step"]`` is the x-axis)."""
        raise NotImplementedError

    def summary(self, values: dict[str, Any]) -> None:
        """The run's final values (step, validation loss, parameters, ...); a sink without summaries keeps none."""

    def close(self, exit_code: int = 0) -> None:
        """Flush and release; ``exit_code`` != 0 marks a run that ended with an error or a signal."""


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a record (what a sink plots), ``step`` included."""
    return {k: v for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardSink(MetricsSink):
    """TensorBoard scalars in ``log_dir``, one per number of a record, at ``record["step"]``."""

    def __init__(self, log_dir: str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # tensorboard is an optional extra
            raise ValueError(
                "TrainConfig: `tensorboard` got true but the tensorboard package is not installed; "
                "install it (pip install 'deep-delta-learning[tensorboard]') or set tensorboard: false"
            ) from e
        self._writer = SummaryWriter(str(log_dir))

    def log(self, record: dict[str, Any]) -> None:
        values = scalars(record)
        step = values.pop("step")
        for key, value in values.items():
            self._writer.add_scalar(key, value, step)

    def close(self, exit_code: int = 0) -> None:
        self._writer.close()


class MetricsLog:
    """Appends records to ``OUT/metrics.jsonl`` and hands each to the sinks (TensorBoard with ``tensorboard``,
    and any given in ``sinks``); rank 0 only (``enabled`` False elsewhere: nothing is written)."""

    def __init__(self, out_dir: str | os.PathLike, *, enabled: bool = True, tensorboard: bool = False,
                 sinks: list[MetricsSink] | tuple[MetricsSink, ...] = ()):
        self.path = Path(out_dir) / METRICS_FILE
        self.enabled = enabled
        self._file = None
        self.sinks: list[MetricsSink] = []
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a")
            if tensorboard:
                self.sinks.append(TensorBoardSink(Path(out_dir) / "tensorboard"))
            self.sinks.extend(sinks)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for sink in self.sinks:
            sink.log(record)

    def summary(self, values: dict[str, Any]) -> None:
        """The run's final values, to every sink that keeps a summary (metrics.jsonl has its records)."""
        for sink in self.sinks:
            sink.summary(values)

    def close(self, exit_code: int = 0) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            sink.close(exit_code)


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


class MemoryLog:
    """The records of a run that writes nothing (``Trainer(..., persist=False)``), kept in ``records``, with
    :class:`MetricsLog`'s interface."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.final: dict[str, Any] = {}

    def log(self, record: dict[str, Any]) -> None:
        self.records.append(dict(record))

    def summary(self, values: dict[str, Any]) -> None:
        self.final = dict(values)

    def close(self, exit_code: int = 0) -> None:
        pass
