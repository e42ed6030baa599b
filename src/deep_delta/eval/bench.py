"""The cost table (Tables 4 and 5 of the paper): parameters, throughput and peak memory of each variant.

All variants are built in one process and measured interleaved: every repeat runs each variant once
(the order rotates between repeats, so no variant always runs first), and each figure is the median
over repeats. Per variant and repeat:

- train tokens/s: ``steps`` optimizer steps (zero_grad, forward, backward, AdamW step) on a (B, T) batch;
- prefill tokens/s: one forward over (B, T) tokens with the cache on (what generation does first);
- decode tokens/s: ``decode_tokens`` one-token steps with the cache after a prefill of T - decode_tokens
  tokens (B sequences each).

Peak memory of a training step (measured once per variant, outside the timed runs) is the variant's own
persistent tensors (weights, gradients, AdamW state) plus the highest transient allocation during a step:
on CUDA from ``torch.cuda.max_memory_allocated`` relative to the allocation before the step; on CPU from
torch's profiler (``profile_memory=True``): the running sum of its allocation and free events.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

DEFAULT_VARIANTS = ("baseline", "ddl-dv1", "ddl-tc", "ddl-cc")
# (batch size, sequence length) per preset when not given
DEFAULT_SHAPES = {"tiny": (4, 256), "small": (8, 1024), "medium": (8, 1024)}
BENCH_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BenchSettings:
    preset: str = "tiny"
    variants: Sequence[str] = DEFAULT_VARIANTS
    device: str = "auto"
    dtype: str = "float32"  # float32, or bfloat16/float16 autocast over fp32 weights (as in training)
    batch_size: int | None = None
    seq_len: int | None = None
    steps: int = 2  # timed optimizer steps per repeat
    repeats: int = 5
    warmup: int = 1
    decode_tokens: int = 32
    seed: int = 0
    overrides: dict = field(default_factory=dict)  # extra DDLConfig fields for every variant

    def resolved(self) -> BenchSettings:
        from deep_delta.hf.loading import resolve_device
        from deep_delta.models.ddl.configuration_ddl import PRESETS, VARIANTS

        if self.preset not in PRESETS:
            raise ValueError(f"--preset: got {self.preset!r}; allowed: {' | '.join(PRESETS)}")
        variants = list(self.variants)
        if not variants:
            raise ValueError("--variants: got no variant names")
        for v in variants:
            if v not in VARIANTS:
                raise ValueError(f"--variants: got {v!r}; allowed: {' | '.join(VARIANTS)}")
        if len(set(variants)) != len(variants):
            raise ValueError(f"--variants: got a variant twice in {','.join(variants)}")
        from deep_delta.models.ddl.configuration_ddl import DDLConfig

        for v in variants:  # bad overrides fail here, before anything is built
            DDLConfig.from_variant(v, self.preset, **self.overrides)
        if self.dtype not in BENCH_DTYPES:
            raise ValueError(f"--dtype: got {self.dtype!r}; allowed: {' | '.join(BENCH_DTYPES)}")
        device = str(resolve_device(self.device))
        b, t = DEFAULT_SHAPES.get(self.preset, (8, 1024))
        b = self.batch_size or b
        ctx = self.overrides.get("max_position_embeddings", PRESETS[self.preset]["max_position_embeddings"])
        t = self.seq_len or min(t, ctx)
        for name, value, lo in (("--batch-size", b, 1), ("--seq-len", t, 2), ("--steps", self.steps, 1),
                                ("--repeats", self.repeats, 1), ("--warmup", self.warmup, 0),
                                ("--decode-tokens", self.decode_tokens, 1)):
            if value < lo:
                raise ValueError(f"{name}: got {value}; allowed: an integer >= {lo}")
        if t > ctx:
            raise ValueError(f"--seq-len: got {t}; allowed: 2..{ctx} (the preset's context)")
        if self.decode_tokens >= t:
            raise ValueError(f"--decode-tokens: got {self.decode_tokens}; allowed: 1..{t - 1} (below --seq-len)")
        return BenchSettings(self.preset, variants, device, self.dtype, b, t, self.steps, self.repeats,
                             self.warmup, self.decode_tokens, self.seed, dict(self.overrides))


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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], None], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


class _Subject:
    """One variant: its model, optimizer, batch and the three measured workloads."""

    def __init__(self, variant: str, s: BenchSettings, device: torch.device):
        from deep_delta.models import DDLConfig, DDLForCausalLM

        self.variant = variant
        torch.manual_seed(s.seed)
        cfg = DDLConfig.from_variant(variant, s.preset, **s.overrides)
        self.model = DDLForCausalLM(cfg).to(device)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
        g = torch.Generator().manual_seed(s.seed)
        tokens = torch.randint(0, cfg.vocab_size, (s.batch_size, s.seq_len + 1), generator=g).to(device)
        self.x, self.y = tokens[:, :-1], tokens[:, 1:]
        self.s, self.device = s, device
        amp = BENCH_DTYPES[s.dtype]
        self.autocast = (lambda: torch.autocast(device.type, dtype=amp)) if amp is not None else nullcontext

    def train_step(self) -> None:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.model(input_ids=self.x, shift_labels=self.y).loss
        loss.backward()
        self.opt.step()

    @torch.no_grad()
    def prefill(self) -> None:
        self.model.eval()
        with self.autocast():
            self.model(input_ids=self.x, use_cache=True, logits_to_keep=1)

    @torch.no_grad()
    def decode(self) -> float:
        """Prefill T - n tokens (untimed), then time n one-token steps; returns the decode seconds."""
        self.model.eval()
        n = self.s.decode_tokens
        with self.autocast():
            out = self.model(input_ids=self.x[:, : self.s.seq_len - n], use_cache=True, logits_to_keep=1)

            def steps() -> None:
                o = out
                for _ in range(n):
                    nxt = o.logits[:, -1:].argmax(-1)
                    o = self.model(input_ids=nxt, past_key_values=o.past_key_values, use_cache=True)

            return _timed(steps, self.device)

    def persistent_bytes(self) -> int:
        """Bytes of the weights, gradients and optimizer state (each storage once)."""
        seen, total = set(), 0
        tensors = [p for p in self.model.parameters()] + [p.grad for p in self.model.parameters() if p.grad is not None]
        for state in self.opt.state.values():
            tensors += [t for t in state.values() if torch.is_tensor(t)]
        for t in tensors:
            st = t.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
        return total

    def peak_train_memory(self) -> int:
        """Peak bytes of one training step (see the module docstring for the method per device)."""
        self.train_step()  # optimizer state and gradients exist from here on
        base = self.persistent_bytes()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.train_step()
            torch.cuda.synchronize(self.device)
            return base + torch.cuda.max_memory_allocated(self.device) - before
        return base + cpu_transient_peak(self.train_step)


def cpu_transient_peak(fn: Callable[[], None]) -> int:
    """Highest net CPU tensor allocation (bytes) while ``fn`` runs, from torch's profiler memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    cur = best = 0
    for e in sorted(prof.events(), key=lambda e: e.time_range.start):
        # "[memory]" events are allocations/frees outside any op; an op's own (self) net allocation otherwise
        cur += e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        best = max(best, cur)
    return best


def run_bench(settings: BenchSettings, progress: Callable[[str], None] | None = None) -> list[BenchRow]:
    """Measure every variant of ``settings``; returns one row per variant in the order given."""
    from deep_delta.models.ddl.configuration_ddl import PAPER_NAMES

    s = settings.resolved()
    device = torch.device(s.device)
    say = progress or (lambda msg: None)
    subjects = []
    for v in s.variants:
        say(f"building {v}")
        subjects.append(_Subject(v, s, device))
    peaks = {}
    for sub in subjects:
        say(f"peak memory {sub.variant}")
        for _ in range(s.warmup):
            sub.train_step()
            sub.prefill()
            sub.decode()
        peaks[sub.variant] = sub.peak_train_memory()
    samples = {sub.variant: {"train": [], "prefill": [], "decode": []} for sub in subjects}
    tokens = s.batch_size * s.seq_len
    for rep in range(s.repeats):
        k = rep % len(subjects)
        for sub in subjects[k:] + subjects[:k]:  # rotate the order each repeat
            say(f"repeat {rep + 1}/{s.repeats}: {sub.variant}")
            t = _timed(lambda sub=sub: [sub.train_step() for _ in range(s.steps)], device)
            samples[sub.variant]["train"].append(tokens * s.steps / t)
            t = _timed(sub.prefill, device)
            samples[sub.variant]["prefill"].append(tokens / t)
            t = sub.decode()
            samples[sub.variant]["decode"].append(s.batch_size * s.decode_tokens / t)
    rows = []
    for sub in subjects:
        sm = samples[sub.variant]
        rows.append(BenchRow(
            sub.variant, PAPER_NAMES.get(sub.variant, sub.variant), sub.params,
            statistics.median(sm["train"]), statistics.median(sm["prefill"]), statistics.median(sm["decode"]),
            peaks[sub.variant], sm["train"], sm["prefill"], sm["decode"],
        ))
    return rows


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    n = torch.get_num_threads()
    return f"CPU ({os.cpu_count()} cores, {n} torch thread{'s' if n != 1 else ''})"


def _fmt_rate(x: float) -> str:
    return f"{x / 1e3:.1f}K" if x >= 1e3 else f"{x:.0f}"


def bench_table(rows: Sequence[BenchRow], settings: BenchSettings) -> str:
    """Markdown: a row per variant, each cost and its factor over the baseline (the first row if no baseline)."""
    s = settings
    base = next((r for r in rows if r.variant == "baseline"), rows[0])
    mem_method = ("torch.cuda.max_memory_allocated" if s.device.startswith("cuda")
                  else "torch profiler CPU allocation events")
    lines = [
        f"Cost of one training step and of inference, preset {s.preset}, {s.dtype}, batch {s.batch_size} x "
        f"{s.seq_len} tokens, on {_device_name(s.device)}; median of {s.repeats} interleaved repeats "
        f"({s.steps} train steps each; decode: {s.decode_tokens} tokens after a {s.seq_len - s.decode_tokens}-token "
        f"prefill). Peak memory: weights + grads + AdamW state + peak transient of a step ({mem_method}). "
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
            f"| {_fmt_rate(r.decode_tokens_per_s)} | {r.decode_tokens_per_s / base.decode_tokens_per_s:.2f} "
            f"| {r.peak_memory_bytes / 2**20:.1f} MiB | {r.peak_memory_bytes / base.peak_memory_bytes:.2f} |"
        )
    return "\n".join(lines)


def write_bench(path: str | os.PathLike, rows: Sequence[BenchRow], settings: BenchSettings) -> Path:
    """Write the markdown table to ``path`` and every sample to ``path`` with suffix .json."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# ddl bench\n\n" + bench_table(rows, settings) + "\n")
    payload = {"settings": asdict(settings) | {"device_name": _device_name(settings.device)},
               "rows": [asdict(r) for r in rows]}
    path.with_suffix(".json").write_text(json.dumps(payload, indent=2, default=list) + "\n")
    return path
