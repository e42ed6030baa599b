"""The cost table (Tables 4 and 5 of the paper): parameters, throughput and peak memory of each variant.

All variants are built in one process and measured interleaved (:func:`deep_delta.eval.timing.interleaved`:
every repeat runs each variant once, the order rotating between repeats so no variant always runs first),
after ``warmup`` untimed rounds; each figure is the median over repeats. Per variant and repeat:

- train tokens/s: ``steps`` optimizer steps on a (B, T) batch, each the trainer's own step
  (:meth:`deep_delta.eval.step_bench.StepSubject.train_step`: forward + backward under the training autocast,
  gradient clipping at 1.0, AdamW, zero_grad); with ``compile`` the blocks are compiled as the trainer
  compiles them (inference then runs them eagerly);
- prefill tokens/s: one forward over (B, T) tokens with the cache on (what generation does first);
- decode tokens/s: ``decode_tokens`` one-token steps with the cache after a prefill of T - decode_tokens
  tokens (B sequences each): eager with the dynamic cache (what ``generate()`` does), or with ``compile`` the
  fixed-shape cache and one compiled step (:class:`deep_delta.hf.decode.StaticDecoder`; CUDA graphs on CUDA).

Peak memory of a training step (measured once per variant, after the timed runs) is the variant's own
persistent tensors (weights, AdamW state) plus the highest transient allocation (activations, gradients)
during a step (:meth:`deep_delta.eval.step_bench.StepSubject.peak_train_memory`).

``dtype`` "bfloat16" / "float16" is autocast over fp32 weights, as in training. Invalid settings raise
``ValueError`` naming the field (```seq_len` got 999; ...``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from deep_delta.eval.settings import BenchSettings
from deep_delta.eval.step_bench import StepSubject
from deep_delta.eval.timing import (
    dtype_label,
    interleaved,
    timed,
)
from deep_delta.models.ddl import output_cache


@dataclass
class BenchRow:
    variant: str
    name: str
    params: int
    train_tokens_per_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    peak_memory_bytes: int
    train_samples: list[float] = field(default_factory=list)
    prefill_samples: list[float] = field(default_factory=list)
    decode_samples: list[float] = field(default_factory=list)


class BenchSubject(StepSubject):
    """One variant: the training step of :class:`StepSubject`, plus prefill and decode."""

    def __init__(self, variant: str, s: BenchSettings, device: torch.device):
        super().__init__(variant, s.preset, batch_size=s.batch_size, seq_len=s.seq_len, device=device,
                         dtype=s.dtype, overrides=s.model, seed=s.seed, compile=s.compile,
                         cuda_graphs=s.cuda_graphs)
        self.s = s
        self.decoder = None  # the StaticDecoder of a compiled bench, made at the first decode

    def _eager(self):
        """Inference runs the blocks eagerly also when training compiles them (one token at a time would
        recompile for each new shape)."""
        import contextlib

        return torch.compiler.set_stance("force_eager") if self.compiled else contextlib.nullcontext()

    @torch.no_grad()
    def prefill(self) -> None:
        self.model.eval()
        with self.autocast, self._eager():
            self.model(input_ids=self.x, use_cache=True, logits_to_keep=1)

    @torch.no_grad()
    def decode(self, static: bool | None = None) -> float:
        """Prefill T - n tokens (untimed), then time n one-token steps; returns the decode seconds. ``static``:
        the fixed-shape cache and the compiled step (default: when the bench compiles), else the dynamic cache."""
        self.model.eval()
        if self.compiled if static is None else static:
            return self._decode_static()
        n = self.s.decode_tokens
        with self.autocast, self._eager():
            out = self.model(input_ids=self.x[:, : self.s.seq_len - n], use_cache=True, logits_to_keep=1)

            def steps() -> None:
                o = out
                for _ in range(n):
                    nxt = o.logits[:, -1:].argmax(-1)
                    o = self.model(input_ids=nxt, cache=output_cache(o), use_cache=True)

            return timed(steps, self.device)

    def _decode_static(self) -> float:
        """The same with the fixed-shape cache and the compiled step (compiled in the first, untimed, round)."""
        from deep_delta.hf.decode import StaticDecoder

        s, n = self.s, self.s.decode_tokens
        if self.decoder is None:
            self.decoder = StaticDecoder(self.model, s.batch_size, s.seq_len, compile=True)
        with self.autocast:
            self.decoder.reset()
            with self._eager():  # the prompt's shape is not the step's: no compilation for it
                first = self.decoder.prefill(self.x[:, : s.seq_len - n])

            def steps() -> None:
                logits = first
                for _ in range(n):
                    logits = self.decoder.step(logits.argmax(-1))

            return timed(steps, self.device)

    def measure(self) -> dict[str, float]:
        """One repeat: train, prefill and decode tokens/s."""
        s, tokens = self.s, self.s.batch_size * self.s.seq_len

        def train() -> None:
            for _ in range(s.steps):
                self.train_step()

        return {"train": tokens * s.steps / timed(train, self.device),
                "prefill": tokens / timed(self.prefill, self.device),
                "decode": s.batch_size * s.decode_tokens / self.decode() if s.decode_tokens else math.nan}


def run_bench(settings: BenchSettings, progress: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Measure every variant of ``settings``; returns one row per variant in the order given."""
    from deep_delta.variants import paper_name

    s = settings.resolved()
    device = torch.device(s.device)
    say = progress or (lambda msg: None)
    subjects = {}
    for v in s.variants:
        say(f"building {v}")
        subjects[v] = BenchSubject(v, s, device)
    # Every variant's blocks run through the same code objects (the block's forward), and each variant's structure
    # is one more compilation of them: torch's limit of 8 per code object is per variant here, and a variant
    # past it must fail loudly, not fall back to eager and be timed as compiled.
    with torch._dynamo.config.patch(recompile_limit=8 * len(subjects), fail_on_recompile_limit_hit=True):
        samples = interleaved({v: sub.measure for v, sub in subjects.items()}, s.repeats, s.warmup, progress=say)
    rows = []
    for v, sub in subjects.items():
        say(f"peak memory {v}")
        sm = {key: [x[key] for x in samples[v]] for key in ("train", "prefill", "decode")}
        rows.append(BenchRow(
            v, paper_name(v), sub.params,
            statistics.median(sm["train"]), statistics.median(sm["prefill"]), statistics.median(sm["decode"]),
            sub.peak_train_memory(), sm["train"], sm["prefill"], sm["decode"],
        ))
    return rows


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    n = torch.get_num_threads()
    return f"CPU ({os.cpu_count()} cores, {n} torch thread{'s' if n != 1 else ''})"


def _fmt_rate(x: float) -> str:
    if math.isnan(x):  # not measured (decode_tokens 0)
        return "-"
    return f"{x / 1e3:.1f}K" if x >= 1e3 else f"{x:.0f}"


def _fmt_factor(x: float, base: float) -> str:
    return "-" if math.isnan(x) else f"{x / base:.2f}"


def bench_table(rows: Sequence[BenchRow], settings: BenchSettings) -> str:
    """Markdown: a row per variant, each cost and its factor over the baseline (the first row if no baseline)."""
    s = settings
    base = next((r for r in rows if r.variant == "baseline"), rows[0])
    mem_method = ("torch.cuda.max_memory_allocated" if s.device.startswith("cuda")
                  else "torch profiler CPU allocation events")
    graphs = {"off": "", "blocks": ", each replayed as CUDA graphs", "model": " (the whole model, replayed as CUDA "
              "graphs)"}[s.cuda_graphs]
    compiled = (f" (blocks compiled with torch.compile for training{graphs}; prefill eager; decode: one compiled step "
                "over the fixed-shape cache)" if s.compile else "")
    lines = [
        f"Cost of one training step{compiled} (the trainer's: clip 1.0, AdamW) and of inference, preset {s.preset}, "
        f"{dtype_label(s.dtype)}, batch {s.batch_size} x {s.seq_len} tokens, on {_device_name(s.device)}; median of {s.repeats} interleaved repeats "
        f"({s.steps} train steps each; decode: "
        + (f"{s.decode_tokens} tokens after a {s.seq_len - s.decode_tokens}-token prefill" if s.decode_tokens
           else "not measured") + "). "
        f"Peak memory: weights + grads + AdamW state + peak transient of a step ({mem_method}). "
        f"Factors (x) are relative to {base.name}.",
        "",
        "| Model | Params | Train tok/s | x | Prefill tok/s | x | Decode tok/s | x | Peak train memory | x |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.params / 1e6:.3f}M ({100 * (r.params - base.params) / base.params:+.2f}%) "
            f"| {_fmt_rate(r.train_tokens_per_s)} | {r.train_tokens_per_s / base.train_tokens_per_s:.2f} "
            f"| {_fmt_rate(r.prefill_tokens_per_s)} | {r.prefill_tokens_per_s / base.prefill_tokens_per_s:.2f} "
            f"| {_fmt_rate(r.decode_tokens_per_s)} | {_fmt_factor(r.decode_tokens_per_s, base.decode_tokens_per_s)} "
            f"| {r.peak_memory_bytes / 2**20:.1f} MiB | {r.peak_memory_bytes / base.peak_memory_bytes:.2f} |"
        )
    return "\n".join(lines)


def write_bench(path: str | os.PathLike, rows: Sequence[BenchRow], settings: BenchSettings) -> Path:
    """Write the markdown table to ``path`` and every sample to ``path`` with suffix .json."""
    from deep_delta.fsutil import atomic_write

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, "# ddl bench\n\n" + bench_table(rows, settings) + "\n")
    from deep_delta.ops import switches

    payload = {"settings": asdict(settings) | {"device_name": _device_name(settings.device)},
               "kernel_switches": switches.current(),  # the kernel paths the figures were measured with
               "rows": [asdict(r) for r in rows]}
    atomic_write(path.with_suffix(".json"), json.dumps(payload, indent=2, default=list) + "\n")
    return path
