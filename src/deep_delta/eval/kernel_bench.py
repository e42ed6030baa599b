"""The kernel benchmark (``ddl bench-kernels``): the DDL ops and whole training steps, as ratios, in one run.

Two tables:

1. ops, forward + backward, at the preset's width (d_v = 4, 4 taps; the rivals' HC / mHC stream ops at the
   config's n = 4 streams, per-token coefficients as in the dynamic forms, Sinkhorn-Knopp with its 20
   rounds): the plain reference (naive), the lean PyTorch path, ``torch.compile`` of the reference and the
   Triton kernel (CUDA only: on CPU the kernels run only in the interpreter, which is not a speed
   measurement). Ratios are against the reference.
2. the training step of each variant against the baseline (:meth:`StepSubject.train_step`, the trainer's
   own step (``deep_delta.train.step.OptimizerStep``): forward + backward, gradient clipping at 1.0, AdamW), with the activation bytes
   autograd saves (with and without ``recompute_states``) and the peak training memory of each variant.

Every figure is a median over ``repeats`` interleaved rounds (:func:`deep_delta.eval.timing.interleaved`,
after ``warmup`` untimed rounds). ``dtype`` "bfloat16" / "float16" is autocast over fp32 weights, as in
training: the ops then get what the model hands them under autocast (fp32 states and weights, the branch
output k in the low precision) and run under the same autocast.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from deep_delta.eval.settings import KernelBenchSettings
from deep_delta.eval.step_bench import StepSubject
from deep_delta.eval.timing import (
    BENCH_DTYPES,
    autocast_for,
    dtype_label,
    interleaved,
    interleaved_medians,
    timed,
)

OPS = ("delta update", "CC read", "TC read", "EC expand", "HC write", "HC read", "Sinkhorn")
IMPLS = ("ref", "lean", "compiled", "triton")
VALUE_CHANNELS, TAPS = 4, 4  # d_v and kernel size of the op shapes


# ----------------------------------------------------------------------------------------------- ops


@dataclass
class OpTiming:
    op: str
    seconds: dict[str, float]  # impl (IMPLS) -> median seconds; an impl not timed is missing
    triton_bytes: int | None = None  # what the Triton kernels' launches move, forward + backward (counted, dry)


NORM_CONSTS = dict(eps=1e-5, beta_max=2.0, value_scale=4.0)  # the sublayer norm's constants (DDLConfig's defaults)


def _fwd_bwd(fn, args: tuple, autocast) -> Callable[[], None]:
    """fn(*args) under ``autocast`` and its backward with a fixed random output gradient (made on the first
    call, which runs here: it also compiles what needs compiling)."""
    grad = None

    def call() -> None:
        nonlocal grad
        with autocast:
            out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        if grad is None:
            g = torch.Generator().manual_seed(1)
            grad = [torch.randn(o.shape, generator=g).to(device=o.device, dtype=o.dtype) for o in outs]
        inputs = [a for a in args if torch.is_tensor(a) and a.requires_grad]  # none accumulated into .grad
        torch.autograd.grad(outs, inputs, grad, allow_unused=True)

    call()
    return call


def op_inputs(hidden_size: int, batch_size: int, seq_len: int, dtype: str, device: torch.device) -> dict:
    """The inputs of each op as the model gives them: ``{op: (inputs, reference fn, lean fn, triton name)}``.

    Under autocast (``dtype`` not float32) only the branch output (k; HC's f) is in the low precision: states,
    embeddings, gate values, compressor weights and the HC / mHC coefficients are fp32, as the model's fp32
    weights make them. The HC / mHC ops take ``DDLConfig``'s n streams and Sinkhorn rounds. The sublayer's norm,
    gate and value (:func:`deep_delta.ops.norm.norm_gate_value`) read an fp32 src (the module casts it) with the
    width's d_v; its output gradients are (c, beta, v)'s.
    """
    from deep_delta.models.ddl.configuration_ddl import DDLConfig
    from deep_delta.ops.compress.lean import channel_compress_lean, embed_conv_lean, token_compress_lean
    from deep_delta.ops.compress.naive import (
        channel_compress_reference,
        embed_conv_reference,
        token_compress_reference,
    )
    from deep_delta.ops.delta.lean import delta_update_lean
    from deep_delta.ops.delta.naive import delta_update_reference
    from deep_delta.ops.hyper.lean import sinkhorn_knopp_lean, stream_read_lean, stream_write_lean
    from deep_delta.ops.hyper.naive import (
        sinkhorn_knopp_reference,
        stream_read_reference,
        stream_write_reference,
    )
    from deep_delta.ops.norm.lean import norm_gate_value_lean
    from deep_delta.ops.norm.naive import norm_gate_value_reference

    low = BENCH_DTYPES[dtype] or torch.float32
    d, dv, kk = hidden_size, VALUE_CHANNELS, TAPS
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dt=torch.float32):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dt).requires_grad_()

    x, k = rnd(batch_size, seq_len, d, dv), rnd(batch_size, seq_len, d, dt=low)
    v, beta = rnd(batch_size, seq_len, dv), rnd(batch_size, seq_len, 1)
    e, c, w = rnd(batch_size, seq_len, d), rnd(d, dv), rnd(kk, d, dv)
    n, iters = DDLConfig.hc_streams, DDLConfig.hc_sinkhorn_iters
    h, f = rnd(batch_size, seq_len, d, n), rnd(batch_size, seq_len, d, dt=low)
    r, a, b = rnd(batch_size, seq_len, n, n), rnd(batch_size, seq_len, n), rnd(batch_size, seq_len, n)
    norm_args = (e, rnd(d), rnd(1, d), rnd(1), rnd(dv, d), rnd(dv))  # src, g, w_g, b_g, W_v, b_v

    def with_consts(fn):
        return lambda *args: fn(*args, **NORM_CONSTS)

    return {
        "delta update": ((x, k, v, beta), delta_update_reference, delta_update_lean, "delta_update"),
        "CC read": ((x, c), channel_compress_reference, channel_compress_lean, "channel_compress"),
        "TC read": ((x, w), token_compress_reference, token_compress_lean, "token_compress"),
        "EC expand": ((e, w), embed_conv_reference, embed_conv_lean, "embed_conv"),
        "HC write": ((h, r, b, f), stream_write_reference, stream_write_lean, "stream_write"),
        "HC read": ((h, a), stream_read_reference, stream_read_lean, "stream_read"),
        "Sinkhorn": ((r,), lambda z: sinkhorn_knopp_reference(z, iters), lambda z: sinkhorn_knopp_lean(z, iters),
                     f"sinkhorn_knopp:{iters}"),
        "norm + gate + value": (norm_args, with_consts(norm_gate_value_reference), with_consts(norm_gate_value_lean),
                                "norm_gate_value"),
    }


def _triton_fn(name: str):
    if name == "norm_gate_value":
        from deep_delta.ops.norm.triton import norm_gate_value_triton

        return lambda *args: norm_gate_value_triton(*args, **NORM_CONSTS)
    if name == "delta_update":
        from deep_delta.ops.delta.triton import delta_update_triton

        return lambda x, k, v, b: delta_update_triton(x, k, v, b)
    if name.startswith(("stream_", "sinkhorn_")):
        from deep_delta.ops.hyper import triton as ht

        name, _, iters = name.partition(":")
        fn = getattr(ht, f"{name}_triton")
        return (lambda z: fn(z, int(iters))) if iters else fn
    from deep_delta.ops.compress import triton as ct

    return getattr(ct, f"{name}_triton")


def run_op_bench(settings: KernelBenchSettings) -> tuple[list[OpTiming], list[str]]:
    """Time every op's implementations interleaved; returns the timings and notes on what was skipped."""
    s = settings.resolved()
    device = torch.device(s.device)
    hidden = _hidden_size(s.preset)
    autocast = autocast_for(s.dtype, device)
    results, notes = [], []
    for op, (inputs, naive, lean, tname) in op_inputs(hidden, s.batch_size, s.seq_len, s.dtype, device).items():
        cases = {"ref": _fwd_bwd(naive, inputs, autocast), "lean": _fwd_bwd(lean, inputs, autocast)}
        if s.compile:
            try:
                cases["compiled"] = _fwd_bwd(torch.compile(naive), inputs, autocast)
            except Exception as err:  # pragma: no cover - depends on the toolchain
                notes.append(f"torch.compile of {op} failed: {type(err).__name__}: {err}")
        if device.type == "cuda":
            cases["triton"] = _fwd_bwd(_triton_fn(tname), inputs, autocast)
        results.append(OpTiming(op, interleaved_medians(cases, device, s.repeats, s.warmup),
                                triton_bytes=_triton_bytes(tname, inputs, autocast)))
    if device.type != "cuda":
        notes.append("Triton kernels: skipped, no GPU (on CPU they only run in the Triton interpreter, which is "
                     "a correctness check, not a speed measurement).")
    if not s.compile:
        notes.append("torch.compile: skipped (default off on CPU: the inductor C++ build takes minutes; --compile).")
    return results, notes


def _triton_bytes(tname: str, inputs: tuple, autocast) -> int:
    """The bytes the Triton kernels of one forward + backward move, from their launch arguments (dry launches: any
    device, nothing run; :mod:`deep_delta.ops.launch`)."""
    from deep_delta.ops.launch import count_traffic

    with count_traffic(dry=True) as counter:
        _fwd_bwd(_triton_fn(tname), inputs, autocast)
    return sum(la.read_bytes + la.write_bytes for la in counter.launches)


def device_peak_bandwidth(device: torch.device) -> tuple[str, float | None]:
    """(the device's name, its peak memory bandwidth in bytes/s or None): CUDA devices by name
    (:func:`deep_delta.eval.timing.peak_bandwidth`), none elsewhere."""
    from deep_delta.eval.timing import peak_bandwidth

    if device.type != "cuda":
        return device.type, None
    name = torch.cuda.get_device_name(device)
    return name, peak_bandwidth(name)


def _op_dtype_label(dtype: str) -> str:
    return dtype if BENCH_DTYPES[dtype] is None else f"{dtype} autocast (fp32 states, {dtype} k, as in the model)"


def op_table(timings: Sequence[OpTiming], notes: Sequence[str], settings: KernelBenchSettings,
             device: tuple[str, float | None] | None = None) -> str:
    """The ops table; ``device``: (name, peak bytes/s or None), default :func:`device_peak_bandwidth` of the
    settings' device. The Triton kernels' bytes per forward + backward are counted on any device; their achieved
    bandwidth (bytes over the median time) and its share of the device's peak where the kernels were timed."""
    s = settings.resolved()
    hidden_size = _hidden_size(s.preset)
    name, peak = device if device is not None else device_peak_bandwidth(torch.device(s.device))
    peak_text = f"{peak / 1e12:.2f} TB/s" if peak else "unknown"
    lines = [
        f"### Ops, forward + backward ({s.batch_size} x {s.seq_len} tokens, d={hidden_size}, d_v={VALUE_CHANNELS}, "
        f"{_op_dtype_label(s.dtype)}, {torch.device(s.device).type}; HC / mHC: n={_streams()} streams, per-token "
        f"coefficients): median ms, ratio vs the plain reference; the Triton kernels' bytes (counted from their launch "
        f"arguments) and bandwidth against the device's peak ({name}: {peak_text})",
        "",
        "| op | reference ms | lean torch ms (speed-up) | compiled ref ms (speed-up) | triton ms (speed-up) | "
        "triton MB | triton TB/s (x peak) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in timings:
        ref = t.seconds["ref"]

        def cell(key: str, t=t, ref=ref) -> str:
            return f"{t.seconds[key] * 1e3:.2f} ({ref / t.seconds[key]:.2f}x)" if key in t.seconds else "n/a"

        mb = f"{t.triton_bytes / 1e6:,.1f}" if t.triton_bytes is not None else "n/a"
        rate = "n/a"
        if t.triton_bytes is not None and "triton" in t.seconds:
            achieved = t.triton_bytes / t.seconds["triton"]
            rate = f"{achieved / 1e12:.2f}" + (f" ({achieved / peak:.2f}x)" if peak else "")
        lines.append(f"| {t.op} | {ref * 1e3:.2f} | {cell('lean')} | {cell('compiled')} | {cell('triton')} | {mb} "
                     f"| {rate} |")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def _streams() -> int:
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    return DDLConfig.hc_streams


def _hidden_size(preset: str) -> int:
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    return DDLConfig.from_variant("ddl-cc", preset).hidden_size


# --------------------------------------------------------------------------------------- training step


@dataclass
class StepRow:
    variant: str
    step_seconds: float  # median
    saved_bytes: int  # activations autograd keeps after one forward
    saved_bytes_recompute: int  # the same with recompute_states
    peak_memory_bytes: int  # weights + AdamW state + peak transient (activations, grads) of a step
    samples: list[float] = field(default_factory=list)  # seconds per round


def run_step_bench(settings: KernelBenchSettings, progress: Callable[[str], None] | None = None) -> list[StepRow]:
    """Build every variant, time their training steps interleaved, then measure their memory."""
    s = settings.resolved()
    device = torch.device(s.device)
    say = progress or (lambda msg: None)
    overrides = {"max_position_embeddings": s.seq_len, **s.model}
    subjects = {}
    for v in s.variants:
        say(f"building {v}")
        subjects[v] = StepSubject(v, s.preset, batch_size=s.batch_size, seq_len=s.seq_len, device=device,
                                  dtype=s.dtype, overrides=overrides, seed=s.seed)
    samples = interleaved({v: (lambda sub=sub: timed(sub.train_step, device)) for v, sub in subjects.items()},
                          s.repeats, s.warmup, progress=say)
    rows = []
    for v, sub in subjects.items():
        say(f"memory {v}")
        rows.append(StepRow(v, statistics.median(samples[v]), sub.saved_activation_bytes(False),
                            sub.saved_activation_bytes(True), sub.peak_train_memory(), samples[v]))
    return rows


def step_table(rows: Sequence[StepRow], settings: KernelBenchSettings) -> str:
    s = settings.resolved()
    dev = torch.device(s.device)
    tokens = s.batch_size * s.seq_len
    base = next(r for r in rows if r.variant == "baseline")
    sb = base.saved_bytes
    lines = [
        f"### Training step (the trainer's: fwd + bwd, clip 1.0, AdamW), preset {s.preset}, {s.batch_size} x "
        f"{s.seq_len} tokens, {dtype_label(s.dtype)}, {dev.type}, delta_backend auto: median of {s.repeats} "
        "interleaved rounds",
        "",
        "| variant | ms / step | tokens/s | step time vs baseline | throughput vs baseline "
        "| saved activations MiB, x baseline | with recompute_states |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        t, bt = r.step_seconds, base.step_seconds
        mem = " | ".join(f"{b / 2**20:.1f} ({b / sb:.3f}x)" for b in (r.saved_bytes, r.saved_bytes_recompute))
        lines.append(f"| {r.variant} | {t * 1e3:.1f} | {tokens / t:,.0f} | {t / bt:.3f}x | {bt / t:.3f}x | {mem} |")
    method = "torch.cuda.max_memory_allocated" if dev.type == "cuda" else "torch profiler CPU allocation events"
    lines += ["", "Saved activations: bytes autograd keeps for backward after one forward (saved-tensor hooks, "
              "storages deduplicated, parameters excluded); recompute_states keeps only the last DDL state and "
              "rebuilds the others in backward (ops/delta/recompute.py).", "",
              f"Peak memory of a training step: the variant's weights + AdamW state + the step's peak transient "
              f"allocation (activations, gradients; {method}); the other models in the process do not count.", ""]
    for r in rows:
        lines.append(f"- peak memory {r.variant}: {r.peak_memory_bytes / 2**30:.3f} GiB "
                     f"({r.peak_memory_bytes / base.peak_memory_bytes:.3f}x baseline)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- the report


def device_description(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} threads"


def kernel_bench_report(settings: KernelBenchSettings, progress: Callable[[str], None] | None = None) -> str:
    """Run the tables ``settings`` asks for; returns the markdown report."""
    s = settings.resolved()
    out = [f"## ddl bench-kernels on {device_description(s.device)}, torch {torch.__version__}", ""]
    if not s.skip_ops:
        timings, notes = run_op_bench(s)
        out += [op_table(timings, notes, s), ""]
    if not s.skip_steps:
        out += [step_table(run_step_bench(s, progress), s), ""]
    return "\n".join(out)
