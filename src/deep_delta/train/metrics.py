"""Training metrics: ``metrics.jsonl`` (one JSON object per line) and the sinks beside it (TensorBoard here,
Weights & Biases in :mod:`deep_delta.train.wandb_sink`), FLOPs and MFU.

A run writes ``metrics.jsonl`` as it trains (a line appended per record). A record kept for good (studies/) may
instead hold ``metrics.jsonl.gz``: the same bytes, gzip-compressed deterministically (:func:`pack_metrics`;
``zcat`` reads it). Every reader takes either (:func:`metrics_file`, :func:`metrics_text`, :func:`read_metrics`);
a run directory holding both is refused, since nothing says which is the run's.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from pathlib import Path
from typing import Any

from deep_delta.fsutil import atomic_write

METRICS_FILE = "metrics.jsonl"
PACKED_METRICS_FILE = METRICS_FILE + ".gz"  # the same bytes, packed for keeps (:func:`pack_metrics`)

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


def metrics_file(run_dir: str | os.PathLike) -> Path | None:
    """The metrics of the run in ``run_dir``: ``metrics.jsonl`` (a run as it trains) or ``metrics.jsonl.gz`` (the
    same, packed for keeps); None when it has neither. Both at once are refused (a ``ValueError`` naming them):
    nothing says which one is the run's."""
    run_dir = Path(run_dir)
    plain, packed = run_dir / METRICS_FILE, run_dir / PACKED_METRICS_FILE
    if plain.is_file() and packed.is_file():
        raise ValueError(f"{run_dir} holds both {METRICS_FILE} and {PACKED_METRICS_FILE}, so which one is the run's "
                         "metrics is ambiguous; allowed: one of them (remove the one that is not the run's)")
    return plain if plain.is_file() else packed if packed.is_file() else None


def metrics_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of the metrics file ``path`` as a run wrote them: a ``.gz`` one decompressed (a file that is not
    gzip, or is cut short, is a ``ValueError`` naming it)."""
    path = Path(path)
    data = path.read_bytes()
    if path.name != PACKED_METRICS_FILE:
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path} is not a complete gzip file ({e}); allowed: a run's metrics.jsonl packed by "
                         "`pack_metrics`") from None


def metrics_text(path: str | os.PathLike) -> str:
    """The text of the metrics file ``path`` (:func:`metrics_bytes`), UTF-8; anything else is a ``ValueError``
    naming the file."""
    try:
        return metrics_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}): not a run's metrics") from None


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a run's metrics (a torn last line from a crash is ignored): ``path`` a run directory, its
    ``metrics.jsonl`` (the packed ``metrics.jsonl.gz`` read in its place where only that is there:
    :func:`metrics_file`) or a metrics file of either form. No metrics: no records."""
    path = Path(path)
    if path.is_dir():
        path = metrics_file(path)
    elif path.name == METRICS_FILE:
        path = metrics_file(path.parent)
    records = []
    if path is None or not path.is_file():
        return records
    for line in metrics_text(path).splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def truncate_metrics(run_dir: str | os.PathLike, step: int) -> None:
    """Keep only the records with ``record["step"] <= step`` (a resumed run continues without duplicates), in the
    plain ``metrics.jsonl`` a run appends to: a packed record continued is unpacked (written plain, then the packed
    file removed)."""
    run_dir = Path(run_dir)
    path = metrics_file(run_dir)
    if path is None:
        return
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    atomic_write(run_dir / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in kept))
    if path.name == PACKED_METRICS_FILE:
        path.unlink()


def pack_bytes(data: bytes) -> bytes:
    """``data`` gzip-compressed the same way every time (level 9, no file name, modification time 0), so that a
    record packed twice gives the same bytes (and git stores it once)."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def pack_metrics(run_dir: str | os.PathLike) -> Path | None:
    """Pack the run's ``metrics.jsonl`` into ``metrics.jsonl.gz`` (:func:`pack_bytes`, written atomically), read it
    back from disk and compare it with the plain file byte for byte, and only then remove the plain one. A run
    already packed is left as it is; where both are there and hold the same bytes (a packing stopped before its
    removal), the plain one is removed, and where they differ that is refused. Returns the packed file (None: the
    run has no metrics)."""
    run_dir = Path(run_dir)
    plain, packed = run_dir / METRICS_FILE, run_dir / PACKED_METRICS_FILE
    if not plain.is_file():
        return packed if packed.is_file() else None
    data = plain.read_bytes()
    if packed.is_file():
        if metrics_bytes(packed) != data:
            metrics_file(run_dir)  # both, not the same: refused
        plain.unlink()
        return packed
    atomic_write(packed, pack_bytes(data))
    if metrics_bytes(packed) != data:  # what is on disk, read back
        packed.unlink()
        raise ValueError(f"{packed} does not read back as {plain} (the write did not keep it); {plain} is kept")
    plain.unlink()
    return packed


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
