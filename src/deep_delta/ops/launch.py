"""Kernel launches: the geometry every kernel family shares, and launches that can be counted.

**Geometry** (:func:`state_blocks`, :func:`max_programs`, :func:`reduction_grid`, the warps and rows per program):
how the op packages size their grids, here so that the packages stand side by side (none imports another's launch
choices). Pure Python: importing it needs no Triton. :func:`check_device` says where the kernels can run.

**Counting**: the bytes each Triton kernel reads and writes, from its arguments.

Every DDL kernel is launched through :func:`launch`, which passes the call on unchanged unless a
:class:`count_traffic` context is active; then each launch is also recorded as a :class:`Launch` with the
bytes of its tensor arguments: each distinct tensor once (an argument that repeats an earlier one, such as a
placeholder for an unused pointer, counts nothing), as a read, or as a write for the argument positions the
call site names. ``count_traffic(dry=True)`` records without launching (outputs stay unwritten), so a
training step on CPU tensors gives every launch's traffic on any machine, without a GPU or the Triton
interpreter (``ddl bench-kernels --traffic``).

What this counts is the traffic the launch arguments imply, not a measurement: a small weight read by every
program (the compressor weights c and w) is counted once per launch (it stays in L2), and taps that read a
neighbour's state row (TC) count that row once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_COUNTERS: list[count_traffic] = []
# the suffix of a record holding the next sublayer's norm, gate and value's share of a fused update's launch (the
# tensors only that part reads or writes: deep_delta.ops.delta.triton_norm), apart from the update's own bytes
NORM_SHARE = " (norm share)"


@dataclass
class Launch:
    kernel: str
    phase: str  # the counter's phase when it was launched ("forward", "backward", ...)
    read_bytes: int
    write_bytes: int


class count_traffic:
    """Context manager: record every :func:`launch` (and :func:`record`) into ``self.launches``.

    dry: do not launch the kernels (outputs stay unwritten; the kernels' device check lets any tensor by).
    keep_calls: also keep every launch's ``(kernel, grid, args, meta)`` in ``self.calls`` (for compiling the
    kernels ahead of time with the arguments the ops pass: benchmarks/tools/kernel_resources.py), each tensor
    argument as a detached alias (the same alias where an argument repeats): a reference to the tensor itself
    would keep a weight's gradient from being handed to ``.grad`` as it is (autograd copies a gradient someone
    else holds), a copy per weight that an uncounted step does not make.
    ``phase`` is a free label stored with each launch; set it between the forward and the backward.
    """

    def __init__(self, dry: bool = False, keep_calls: bool = False):
        self.dry, self.keep_calls, self.phase, self.launches, self.calls = dry, keep_calls, "", [], []

    def __enter__(self) -> count_traffic:
        _COUNTERS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _COUNTERS.remove(self)


def counting_dry() -> bool:
    """True inside ``count_traffic(dry=True)``: kernels are not launched (device checks let any tensor by)."""
    return any(c.dry for c in _COUNTERS)


def record(kernel: str, reads: tuple, writes: tuple) -> None:
    """Record traffic of an op that is not a Triton launch (e.g. the torch sum of partial buffers)."""
    if not _COUNTERS:
        return
    rb = sum(t.numel() * t.element_size() for t in reads)
    wb = sum(t.numel() * t.element_size() for t in writes)
    for c in _COUNTERS:
        c.launches.append(Launch(kernel, c.phase, rb, wb))


# The kernels index with 32-bit integers (n * d * d_v and the like): a tensor past 2^31 elements would address out
# of bounds. Refused before any launch, with a margin for the offsets a masked load computes past a tensor's end
# (a row or a tap beyond the last token).
MAX_ELEMENTS = 2**31 - 2**24


def check_sizes(kernel: str, args: tuple) -> None:
    """``ValueError`` naming ``kernel`` and the argument if a tensor in ``args`` holds more than ``MAX_ELEMENTS``."""
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.numel() > MAX_ELEMENTS:
            raise ValueError(
                f"{kernel}: argument {i} holds {a.numel():,} elements (shape {tuple(a.shape)}); the Triton kernels "
                f"index with 32-bit offsets, at most {MAX_ELEMENTS:,} elements per tensor: split the batch (fewer "
                f"tokens per call or micro-batch), or use backend='torch'")


def kernel_name(kernel) -> str:
    """A Triton kernel's name without its leading underscore."""
    name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", str(kernel))
    return name.lstrip("_")


def launch(kernel, grid: tuple, args: tuple, writes: tuple[int, ...], apart: tuple[int, ...] = (), **meta) -> None:
    """``kernel[grid](*args, **meta)``; with a counter active, also record the bytes of the tensor arguments:
    positions in ``writes`` are written, the others read; a tensor already seen in ``args`` counts once. Positions
    in ``apart`` are left out of this record: the gradients an in-kernel reduction writes, which the caller records
    with the reduction's reads (:func:`record`, as ``partial_sum``: what torch's sum of the partials was), and its
    counters (:mod:`deep_delta.ops.partials`). A tensor past ``MAX_ELEMENTS`` is refused first (:func:`check_sizes`)."""
    check_sizes(kernel_name(kernel), args)
    if _COUNTERS:
        seen: set[int] = set()
        reads, outs = [], []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or id(a) in seen or i in apart:
                continue
            seen.add(id(a))
            (outs if i in writes else reads).append(a)
        record(kernel_name(kernel), tuple(reads), tuple(outs))
        if any(c.keep_calls for c in _COUNTERS):
            aliases: dict[int, torch.Tensor] = {}
            kept = tuple(aliases.setdefault(id(a), a.detach()) if isinstance(a, torch.Tensor) else a for a in args)
            for c in _COUNTERS:
                if c.keep_calls:
                    c.calls.append((kernel, grid, kept, meta))
        if counting_dry():
            return
    kernel[grid](*args, **meta)


# ----------------------------------------------------------------------------- launch geometry

MAX_WIDTH = 8192  # a (d, d_v) tile per token lives in registers/L1; far above every preset
MAX_PROGRAMS = 256  # the persistent grid's size off CUDA (the interpreter, dry counting); tests patch it small
PROGRAMS_PER_SM = 2  # on CUDA: max_programs = 2 x the SM count (264 on an H100 SXM)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def state_blocks(d: int, dv: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_V) of a kernel's (d, d_v) state tile; ``ValueError`` past ``MAX_WIDTH``."""
    if d > MAX_WIDTH:
        raise ValueError(f"the Triton kernels: width d must be <= {MAX_WIDTH}, got {d}")
    return next_power_of_2(d), next_power_of_2(dv)


def rows_per_program(n: int) -> int:
    """Tokens per program of a kernel without a reduction over tokens: enough programs to fill a GPU."""
    return 1 if n <= 4096 else (4 if n <= 65536 else 16)


def max_programs(device: torch.device, per_sm: int | None = None) -> int:
    """Programs of a persistent reduction grid: ``per_sm`` (default ``PROGRAMS_PER_SM``, 2) x the SM count on
    CUDA, ``MAX_PROGRAMS`` elsewhere."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        sms = torch.cuda.get_device_properties(index).multi_processor_count  # cached by torch
        return (PROGRAMS_PER_SM if per_sm is None else per_sm) * sms
    return MAX_PROGRAMS


def reduction_grid(n: int, device: torch.device, per_program_axis: int = 1,
                   per_sm: int | None = None) -> tuple[int, int]:
    """(programs, tokens per program) of a kernel that sums a weight gradient over its n tokens.

    Each program takes a contiguous chunk of tokens and accumulates in fp32 registers, then writes one partial;
    the programs number ``min(cdiv(n, rows), max_programs // per_program_axis)`` (``per_program_axis``: the
    size of a second grid axis, e.g. the K taps), so the partial buffer is bounded by ``max_programs`` x the
    weight whatever the token count. Deterministic: the same n gives the same chunks and summation order.
    """
    cap = max(1, max_programs(device, per_sm) // per_program_axis)
    progs = max(1, min(cdiv(n, rows_per_program(n)), cap))
    chunk = max(1, cdiv(n, progs))
    return cdiv(n, chunk), chunk


def read_warps(block: int) -> int:
    """Warps per program of the compressor and norm kernels (a (d, d_v) tile of ``block`` elements)."""
    return 4 if block <= 2048 else 8


# The delta kernels' launch parameters, chosen by measurement (benchmarks/tools/tune_kernels.py on an H200,
# 32 x 1024 tokens, d = 768, bf16 state; benchmarks/records/2026-11-26-launch-tuning-decode-h200/): one token
# per program for a (d, d_v) tile of 4096 elements or more, and one warp per 1024 fp32 values a program holds per
# token, at least 2 (4 for d_v = 4 at d = 768, 2 for d_v = 1). With d_v a compile-time constant each thread holds
# whole rows of the tile (vectorised loads), and 4 warps then beat 8 by 1.0-1.2x on every d_v = 4 kernel; before
# it (d_v a runtime value), 8 did.
def delta_warps(elements: int) -> int:
    """Warps per program of a delta kernel holding ``elements`` fp32 values per token: one per 1024, 2 to 16."""
    return max(2, min(16, elements // 1024))


def delta_rows(n: int, tile: int) -> int:
    """Tokens per program of a delta kernel without a reduction over tokens (n tokens, a tile of ``tile``
    elements): one, or two for tiles under 4096 elements (d_v = 1) past 4096 tokens."""
    return 2 if tile < 4096 and n > 4096 else 1


_INTERPRETED: list[bool] = []


def interpreted() -> bool:
    """True when Triton builds kernels for its interpreter (TRITON_INTERPRET=1 when Triton was imported)."""
    if not _INTERPRETED:
        import triton

        @triton.jit
        def _probe():
            pass

        _INTERPRETED.append(type(_probe).__name__ == "InterpretedFunction")
    return _INTERPRETED[0]


def check_device(name: str, t: torch.Tensor) -> None:
    """The kernels run on CUDA tensors, or on CPU tensors under the Triton interpreter only."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and interpreted()):
        return
    if counting_dry():  # counting launch traffic without launching
        return
    raise ValueError(
        f"{name}: backend='triton' needs CUDA tensors (or CPU tensors with TRITON_INTERPRET=1 set before "
        f"Triton is imported), got a tensor on {t.device}; use backend='torch' or 'auto' here"
    )
