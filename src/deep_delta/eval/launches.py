"""Kernel launches of one training step, per variant and per sublayer, counted on CPU (``ddl bench-kernels
--launches``).

An eager step at 8 x 1024 tokens is host-bound on a GPU: each launch costs host time whether its kernel is
large or small, so the number of launches a DDL sublayer adds over the baseline's is a cost of its own (issue 40,
item 4). The count runs the GPU's eager path on CPU tensors, on any machine:

- the model in train mode under the training autocast, ``delta_backend="triton"`` (what ``"auto"`` resolves to on
  CUDA; in eager both call the kernels' autograd Functions) and the state dtype ``state_dtype="auto"`` gives under
  CUDA autocast (:func:`gpu_path_config`);
- forward, then the trainer's backward (``OptimizerStep.accumulate_gradients``) into gradients that are None, as
  the trainer's step (:class:`deep_delta.train.step.OptimizerStep`) runs them after ``zero_grad(set_to_none=True)``
  (its running loss sum, the same launch for every variant, is left out, as is the optimizer update);
- every Triton launch recorded and not run (:class:`deep_delta.ops.launch.count_traffic`, dry), and every ATen op
  that launches a kernel recorded by a ``TorchDispatchMode`` (:func:`launches_kernel`): the torch work around the
  kernels (partial sums, casts, gradient copies) and the rest of the model (GEMMs, attention, norms, the loss);
- the step runs on fake tensors (``FakeTensorMode``: nothing computed or allocated), so the count is the same
  at any token count and takes seconds at any size.

``rms_norm`` takes the path it takes on CUDA (:func:`cuda_rms_norm_dispatch`): one fused op forward and one
backward, where the CPU build decomposes it into 20 (6 forward, 14 backward).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deep_delta.ops.launch import kernel_name

PHASES = ("forward", "backward")

# ATen ops with a tensor result that launch nothing on a GPU: allocations (their memory comes from the caching
# allocator, no kernel) and ops that only change a tensor's metadata in place or build a view the schema does
# not mark as one (_unsafe_view)
NO_KERNEL_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view", "resize_", "set_",
    "detach_", "as_strided_", "squeeze_", "unsqueeze_", "t_", "transpose_",
})

EXCLUDED = ("views and other aliases of their input (the schema's non-writing alias annotation: view, expand, t, "
            "transpose, slice, select, split, as_strided, detach, ...; reshape is one of them or a clone): no data "
            "moves; "
            f"allocations and in-place metadata changes ({', '.join(sorted(NO_KERNEL_OPS))}): no kernel; ops "
            "without a tensor result (promote_types, sizes): host-side only. Counted: every other op, copies "
            "included (_to_copy, clone, copy_, also when the dtype stays: a gradient copied to its own tensor is a "
            "kernel on a GPU), fills (zeros, ones_like) and in-place arithmetic.")

GPU_DIFFERENCES = ("an ATen op counted once may launch several kernels on a GPU (the fused RMSNorm's backward, "
                   "the embedding's backward, reductions over long rows, cat of many tensors); cuBLAS may split a "
                   "GEMM (split-K) and SDPA's flash kernels run extra preprocessing launches in backward; CPU "
                   "autocast's op lists stand in for CUDA's (for this model they cast the same: its ops on bf16 "
                   "tensors are the matmuls, attention, cat and elementwise ops that neither list casts up); the batch's host-to-device copy and the optimizer update (gradient clipping and "
                   "the fused AdamW, a few multi-tensor launches per group of up to ~100 tensors on a GPU; on CPU "
                   "they take per-tensor paths) are not counted.")


def launches_kernel(func: torch._ops.OpOverload) -> bool:
    """Whether ATen op ``func`` launches a kernel on a GPU (the rules: :data:`EXCLUDED`)."""
    if func.overloadpacket.__name__ in NO_KERNEL_OPS:
        return False
    returns = func._schema.returns
    if not any("Tensor" in str(r.type) for r in returns):
        return False
    views = all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
    return not views


class AtenLaunches(TorchDispatchMode):
    """Records ``(phase, "aten.<op>")`` for every ATen op that launches a kernel (:func:`launches_kernel`)."""

    def __init__(self):
        super().__init__()
        self.phase, self.ops = "", []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches_kernel(func):
            self.ops.append((self.phase, f"aten.{func.overloadpacket.__name__}"))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def cuda_rms_norm_dispatch():
    """``rms_norm`` on CPU tensors as on CUDA, for the duration: ``aten::rms_norm`` calls the fused
    ``_fused_rms_norm`` (input and weight of one dtype), which a CUDA build runs as one kernel with its own
    backward op, ``_fused_rms_norm_backward``. The CPU build has no CPU kernel for them and decomposes the norm into
    6 ops forward and 14 backward, which would count the baseline's two norms per block (and every model's QK
    and final norms) many times over. Registering torch's own decompositions as the CPU kernels (for this process,
    until the end of the block) routes the op through its autograd formula, as on CUDA. Does nothing where a CPU
    kernel is registered already."""
    from torch._decomp import decomposition_table

    aten = torch.ops.aten
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "CPU"):
        yield
        return
    lib = torch.library.Library("aten", "IMPL")
    try:
        for op in (aten._fused_rms_norm.default, aten._fused_rms_norm_backward.default):
            lib.impl(op.overloadpacket.__name__, decomposition_table[op], "CPU")
        yield
    finally:
        lib._destroy()


@dataclass
class TritonLaunch:
    phase: str
    kernel: str
    dtypes: tuple[str | None, ...]  # :func:`argument_dtypes` of the launch's positional arguments


@dataclass
class StepLaunches:
    """The launches of one training step of ``variant``: its Triton kernels and the ATen ops that launch one."""

    variant: str
    sublayers: int  # 2 per block (attention, MLP)
    triton: list[TritonLaunch] = field(default_factory=list)
    aten: list[tuple[str, str]] = field(default_factory=list)  # (phase, "aten.<op>") in launch order

    def count(self, phase: str | None = None, source: str | None = None) -> int:
        """Launches of ``phase`` ("forward" | "backward"; None: both) from ``source`` ("triton" | "aten"; None:
        both)."""
        n = 0
        if source in (None, "triton"):
            n += sum(1 for la in self.triton if phase in (None, la.phase))
        if source in (None, "aten"):
            n += sum(1 for p, _ in self.aten if phase in (None, p))
        return n

    def by_name(self) -> Counter:
        """Launches per kernel or op name over the step: Triton kernels by their name, ATen ops as "aten.<op>"."""
        return Counter([la.kernel for la in self.triton] + [name for _, name in self.aten])

    def per_sublayer(self) -> float:
        return self.count() / self.sublayers


def gpu_path_config(variant: str, preset: str, dtype: str, **overrides):
    """The :class:`~deep_delta.models.ddl.configuration_ddl.DDLConfig` of ``variant`` as a GPU's eager training
    step runs it, for a step on CPU tensors: ``delta_backend="triton"`` (what "auto" resolves to on CUDA) and, for
    a d_v > 1 state under autocast (``dtype`` not "float32") with ``state_dtype="auto"``, the state stored in
    ``dtype`` (what "auto" gives under CUDA autocast; on CPU it keeps fp32). ``overrides``: other fields (their
    delta_backend is replaced; an explicit state_dtype is kept)."""
    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    fields = {**overrides, "delta_backend": "triton"}
    cfg = DDLConfig.from_variant(variant, preset, **fields)
    if cfg.state_dtype == "auto" and cfg.value_channels > 1 and dtype != "float32":
        cfg = DDLConfig.from_variant(variant, preset, **fields, state_dtype=dtype)
    return cfg


def step_launches(variant: str, preset: str = "small", batch_size: int = 1, seq_len: int = 16,
                  dtype: str = "bfloat16", **overrides) -> StepLaunches:
    """Count the launches of one training step of ``variant`` at ``preset`` (module docstring): the model in train
    mode on fake CPU tensors, fp32 weights, the forward under the training autocast of ``dtype`` ("float32",
    "bfloat16", "float16"), then the backward; the kernels' Triton launches dry. ``overrides``: DDLConfig fields."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from deep_delta.eval.settings import check_dtype
    from deep_delta.eval.timing import autocast_for
    from deep_delta.models.ddl.modeling_ddl import DDLForCausalLM
    from deep_delta.ops.launch import count_traffic
    from deep_delta.settings import check_count
    from deep_delta.train.step import OptimizerStep

    check_dtype(dtype)
    check_count("batch_size", batch_size, 1)
    check_count("seq_len", seq_len, 1)
    cfg = gpu_path_config(variant, preset, dtype, **{"max_position_embeddings": seq_len, **overrides})
    with FakeTensorMode(), cuda_rms_norm_dispatch():
        model = DDLForCausalLM(cfg).train()
        ids = torch.zeros(batch_size, seq_len, dtype=torch.long)
        with count_traffic(dry=True, keep_calls=True) as triton, AtenLaunches() as aten:
            phases = []
            for phase in PHASES:
                aten.phase = triton.phase = phase
                start = len(triton.calls)
                if phase == "forward":
                    with autocast_for(dtype, torch.device("cpu")):
                        loss = model(ids, shift_labels=ids).loss
                else:
                    OptimizerStep.accumulate_gradients(loss)
                phases += [phase] * (len(triton.calls) - start)
    launches = [TritonLaunch(phase, kernel_name(kernel), argument_dtypes(args))
                for phase, (kernel, _, args, _) in zip(phases, triton.calls)]
    return StepLaunches(variant, 2 * cfg.num_hidden_layers, launches, aten.ops)


def argument_dtypes(args: tuple) -> tuple[str | None, ...]:
    """The dtype name of each positional argument of a launch ("bfloat16"); None for an argument that is not a
    tensor and for a tensor that repeats an earlier argument (a placeholder for a pointer the launch does not use,
    which ``count_traffic`` does not count either)."""
    seen: set[int] = set()
    out = []
    for a in args:
        fresh = isinstance(a, torch.Tensor) and id(a) not in seen
        out.append(str(a.dtype).removeprefix("torch.") if fresh else None)
        if fresh:
            seen.add(id(a))
    return tuple(out)


def launches_markdown(results: list[StepLaunches], preset: str, dtype: str, tokens: int) -> str:
    """The launches per step and per sublayer of every variant, next to the baseline's, and what each DDL variant
    adds per sublayer, op by op."""
    from deep_delta.eval.timing import dtype_label

    base = next((r for r in results if r.variant == "baseline"), None)
    out = [f"### Kernel launches of one training step (forward + backward), preset {preset}, {dtype_label(dtype)}, "
           "the GPU's eager path (delta_backend auto on CUDA = triton); counted on CPU (Triton launches + ATen "
           "compute ops), not measured", "",
           "| variant | sublayers | Triton launches | ATen ops | launches / step | forward | backward "
           "| per sublayer | per sublayer - baseline's |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        diff = f"{r.per_sublayer() - base.per_sublayer():+.2f}" if base is not None else "n/a"
        out.append(f"| {r.variant} | {r.sublayers} | {r.count(source='triton')} | {r.count(source='aten')} "
                   f"| {r.count()} | {r.count('forward')} | {r.count('backward')} | {r.per_sublayer():.2f} | {diff} |")
    if base is not None:
        out += ["", "Per sublayer against the baseline, by kernel or op (launches per step over the sublayers; only "
                "the names whose count differs):", ""]
        for r in results:
            if r is base:
                continue
            ours, theirs = r.by_name(), base.by_name()
            diffs = {name: (ours[name] - theirs[name]) / r.sublayers for name in ours | theirs}
            ranked = sorted((name for name, d in diffs.items() if d), key=lambda name: (-abs(diffs[name]), name))
            listed = ", ".join(f"{name} {diffs[name]:+.2f}" for name in ranked)
            out.append(f"- {r.variant}: {listed or 'none'}")
    out += ["", f"Counted at {tokens} tokens per step on fake CPU tensors (the count does not depend on the token "
            "count): each Triton launch of the step (dry, not run) and each ATen op that would launch a kernel, "
            "seen by a TorchDispatchMode under autograd, so the backward's ops are in. rms_norm goes through the "
            "fused op a CUDA build runs (one op forward, one backward). Not counted: " + EXCLUDED,
            "", "Where a GPU's count can differ: " + GPU_DIFFERENCES]
    return "\n".join(out)


def check_counted_step(settings, flag: str) -> None:
    """Refuse, before any model is built, a counted step (``ddl bench-kernels --traffic`` / ``--launches``, named by
    ``flag``; ``settings`` a resolved ``KernelBenchSettings``) that cannot be counted: without Triton (the counted
    launches are its kernels', dry), or with a step whose widest per-token tensor (a d x d_v state, d x n streams,
    over batch_size x seq_len tokens) holds more elements than the Triton kernels index with their 32-bit offsets
    (:data:`deep_delta.ops.launch.MAX_ELEMENTS`)."""
    from deep_delta.extras import require
    from deep_delta.models.ddl.configuration_ddl import DDLConfig
    from deep_delta.ops.launch import MAX_ELEMENTS

    counts = "memory traffic" if flag == "traffic" else "launches"
    require("triton", f"`ddl bench-kernels --{flag}` (it counts the Triton kernels' {counts})")
    tokens = settings.batch_size * settings.seq_len
    widths = {}
    for variant in settings.variants:
        cfg = DDLConfig.from_variant(variant, settings.preset,
                                     **{"max_position_embeddings": settings.seq_len, **settings.model})
        widths[variant] = cfg.design.state_width(cfg)
    variant = max(widths, key=widths.get)
    width = widths[variant]
    if tokens * width > MAX_ELEMENTS:
        raise ValueError(
            f"`batch_size` x `seq_len` got {settings.batch_size} x {settings.seq_len} = {tokens:,} tokens per step; "
            f"with {variant}'s {width:,} values per token a step's tensors hold {tokens * width:,} elements, past "
            f"the {MAX_ELEMENTS:,} the Triton kernels index with 32-bit offsets; allowed: at most "
            f"{MAX_ELEMENTS // width:,} tokens per step")


def launches_report(settings) -> str:
    """``ddl bench-kernels --launches``: :func:`launches_markdown` for ``settings.variants`` (a resolved
    :class:`deep_delta.eval.settings.KernelBenchSettings`; the baseline is among them)."""
    model_overrides = {k: v for k, v in settings.model.items() if k != "delta_backend"}
    results = [step_launches(v, settings.preset, settings.batch_size, settings.seq_len, settings.dtype,
                             **model_overrides) for v in settings.variants]
    return launches_markdown(results, settings.preset, settings.dtype, settings.batch_size * settings.seq_len)
