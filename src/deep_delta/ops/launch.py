"""Kernel launches that can be counted: the bytes each Triton kernel reads and writes, from its arguments.

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
# tensors only that part reads or writes: deep_delta.ops.norm.triton_update), apart from the update's own bytes
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
