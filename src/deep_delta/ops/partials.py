"""A weight gradient summed over the tokens inside the launch that computes it: no torch sum, no copy after.

A kernel that sums a weight gradient over its tokens runs on a persistent grid
(:func:`deep_delta.ops.delta.triton.reduction_grid`): P worker programs, each a contiguous chunk of tokens, each
accumulating in fp32 registers and storing one fp32 partial row. Torch summed the (P, W) rows after the kernel
(until 2026-11-27), and each gradient that had to be its own tensor, or in its weight's dtype, was copied: up to 8
launches more per sublayer of an eager step, each a host cost (issue 40, item 4). Now the same launch sums
them:

- the launch has P + R programs, R reducers (:func:`plan`: about one per SM, each ``REDUCE_COLS`` columns of the
  rows);
- every program first takes a ticket, counter 0 (:func:`take_ticket`): the tickets are handed out in the order
  the programs start, tickets 0 .. P-1 are the workers (ticket i does chunk i), ticket P + r is reducer r;
- a worker stores its row, then counts itself done, counter 1 (:func:`signal_stored`: a barrier, so that every
  thread's stores precede the release);
- a reducer waits until counter 1 reaches P (:func:`wait_for_workers`, acquire), sums its columns of the P rows
  in row order in fp32 (:func:`sum_columns`, loads from L2: the rows were written by other SMs) and stores them
  in the gradient's dtype into the gradient tensor those columns belong to (:func:`store_columns`); the last
  reducer to finish sets the three counters back to zero (:func:`reducer_finished`), so they are zero for the next
  launch without a fill kernel.

A reducer's wait always ends: every worker took its ticket before any reducer did, so every worker has started
and runs on its SM while reducers wait (a started program is never evicted). The same argument as CUB's
decoupled look-back; a static ``program_id`` split would rely on the order in which the hardware starts programs.

Deterministic: a worker's row depends only on its ticket (its chunk of tokens), and a column is summed over the
rows in the same order whatever the scheduling (blocks of ``REDUCE_ROWS`` rows in order, each block's sum a fixed
tree): the same P on the same device gives the same bits, as torch's sum did. Chosen over fp32 atomic adds into
the gradient, which need a zeroed buffer (a fill launch) and whose order, so whose bits, depends on the
scheduling. The bytes are those of torch's sum: every partial row read once (``.cg``, from L2), each gradient
written once.

The counters: three int32 per device and CUDA stream (:func:`counters`), zero between launches; launches on one
stream run one after another, so one launch at a time uses them. Under the Triton interpreter (CPU) the programs
run one after another in grid order, so the workers finish before the first reducer starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deep_delta.ops.launch import counting_dry, record

# The reducers' shape: about one reducer per SM (all of them reading at once, the reduction's bandwidth the GPU's,
# not one SM's) with C columns each, a power of two from MIN_COLS (a 128-byte line of each row) to MAX_COLS, each
# loading REDUCE_TILE values (REDUCE_TILE // C rows) per step: 16 KB in flight per reducer. Tests patch them small.
REDUCE_TILE = 4096
MIN_COLS, MAX_COLS = 32, 256
_COUNTERS: dict[tuple, torch.Tensor] = {}


@dataclass(frozen=True)
class ReducePlan:
    """The reducers of one launch: ``reducers[i]`` for partial buffer i (rows of ``widths[i]`` values), ``cols``
    columns each, ``rows`` rows loaded per step."""

    reducers: tuple[int, ...]
    cols: int
    rows: int

    @property
    def total(self) -> int:
        return sum(self.reducers)

    def meta(self) -> dict[str, int]:
        """The kernels' compile-time constants ``REDUCE_ROWS``, ``REDUCE_COLS``."""
        return dict(REDUCE_ROWS=self.rows, REDUCE_COLS=self.cols)


def plan(spread: int, *widths: int) -> ReducePlan:
    """The reducers for partial buffers with rows of ``widths`` values, about ``spread`` of them in all (the SM
    count on CUDA: ``max_programs(device, per_sm=1)``)."""
    per = max(1, sum(widths) // max(1, spread))
    cols = max(MIN_COLS, min(MAX_COLS, 1 << (per.bit_length() - 1)))
    return ReducePlan(tuple(triton.cdiv(w, cols) for w in widths), cols, max(1, REDUCE_TILE // cols))


def counters(device: torch.device) -> torch.Tensor:
    """The three int32 counters of an in-kernel reduction on ``device`` (zero between launches: the kernel's last
    reducer resets them), one set per device and CUDA stream. While counting launches dry (fake tensors) or
    compiling, a fresh tensor: nothing is launched there, or the compiled graph owns its buffers."""
    if counting_dry():
        return torch.empty(3, dtype=torch.int32, device=device)
    if torch.compiler.is_compiling():
        return torch.zeros(3, dtype=torch.int32, device=device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = ("cuda", index, torch.cuda.current_stream(index).cuda_stream)
    else:
        key = (device.type, device.index, 0)
    found = _COUNTERS.get(key)
    if found is None:
        found = _COUNTERS[key] = torch.zeros(3, dtype=torch.int32, device=device)
    return found


@triton.jit
def take_ticket(COUNTERS):
    """This program's ticket: the order in which the launch's programs started (counter 0)."""
    return tl.atomic_add(COUNTERS, 1, sem="relaxed")


@triton.jit
def signal_stored(COUNTERS):
    """A worker's partial row is stored: counter 1 += 1, released after every thread of the program has stored its
    part (the barrier orders them before the release)."""
    tl.debug_barrier()
    tl.atomic_add(COUNTERS + 1, 1, sem="release")


@triton.jit
def wait_for_workers(COUNTERS, P):
    """Spin until all P workers have signalled (acquire), then let every thread of the program go on."""
    seen = tl.atomic_add(COUNTERS + 1, 0, sem="acquire")
    while seen < P:
        seen = tl.atomic_add(COUNTERS + 1, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def reducer_columns(rid, REDUCE_COLS: tl.constexpr):
    """The columns reducer ``rid`` sums: [rid C, (rid + 1) C)."""
    return rid * REDUCE_COLS + tl.arange(0, REDUCE_COLS)


@triton.jit
def sum_columns(PART, P, WIDTH, cols, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr):
    """Sum over the P rows of PART (P, WIDTH) fp32 at ``cols`` (masked past WIDTH), in fp32: blocks of REDUCE_ROWS
    rows in order, so the same P sums in the same order. Loaded from L2 (``.cg``): other SMs wrote the rows."""
    rows = tl.arange(0, REDUCE_ROWS)
    ok_c = cols < WIDTH
    acc = tl.zeros([REDUCE_COLS], dtype=tl.float32)
    for r0 in range(0, P, REDUCE_ROWS):
        r = r0 + rows
        block = tl.load(PART + r[:, None] * WIDTH + cols[None, :], mask=(r < P)[:, None] & ok_c[None, :], other=0.0,
                        cache_modifier=".cg")
        acc += tl.sum(block, axis=0)
    return acc


@triton.jit
def store_columns(OUT, lo, hi, cols, acc):
    """The columns [lo, hi) of a summed row into OUT (its elements 0 .. hi - lo), in OUT's dtype."""
    ok = (cols >= lo) & (cols < hi)
    tl.store(OUT + tl.where(ok, cols - lo, 0), acc.to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def reduce_into(PART, OUT, rid, P, WIDTH, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr):
    """Reducer ``rid`` of one partial buffer: its columns of the P rows of PART (P, WIDTH) summed into OUT (WIDTH
    elements, in OUT's dtype)."""
    cols = reducer_columns(rid, REDUCE_COLS)
    store_columns(OUT, 0, WIDTH, cols, sum_columns(PART, P, WIDTH, cols, REDUCE_ROWS, REDUCE_COLS))


@triton.jit
def reducer(COUNTERS, WORKERS, PART, OUT, rid, P, WIDTH, R, REDUCE_ROWS: tl.constexpr, REDUCE_COLS: tl.constexpr):
    """Reducer ``rid`` of the R of a launch with one partial buffer: waits for its WORKERS, sums its columns of
    PART's P rows into OUT (:func:`reduce_into`), then counts itself finished."""
    wait_for_workers(COUNTERS, WORKERS)
    reduce_into(PART, OUT, rid, P, WIDTH, REDUCE_ROWS, REDUCE_COLS)
    reducer_finished(COUNTERS, R)


@triton.jit
def reducer_finished(COUNTERS, R):
    """Counter 2 += 1; the last of the R reducers (every program has taken its ticket, every reducer has stopped
    reading counter 1) sets the three counters back to zero for the next launch."""
    tl.debug_barrier()
    if tl.atomic_add(COUNTERS + 2, 1, sem="acq_rel") == R - 1:
        tl.atomic_xchg(COUNTERS, 0, sem="relaxed")
        tl.atomic_xchg(COUNTERS + 1, 0, sem="relaxed")
        tl.atomic_xchg(COUNTERS + 2, 0, sem="relaxed")


def record_sum(part: torch.Tensor, *grads: torch.Tensor) -> None:
    """Count the reduction of the partial buffer ``part`` into ``grads`` for ``count_traffic``, as torch's sum was
    counted: every row read once, each gradient written once (``partial_sum``, owned by the launch before it)."""
    record("partial_sum", (part,), grads)
