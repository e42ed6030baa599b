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

A reducer's wait ends when every worker has signalled: every worker took its ticket before any reducer did, so
every worker has started and runs on its SM while reducers wait (a started program is never evicted). The same
argument as CUB's decoupled look-back; a static ``program_id`` split would rely on the order in which the hardware
starts programs.

Deterministic: a worker's row depends only on its ticket (its chunk of tokens), and a column is summed over the
rows in the same order whatever the scheduling (blocks of ``REDUCE_ROWS`` rows in order, each block's sum a fixed
tree): the same P on the same device gives the same bits, as torch's sum did. Chosen over fp32 atomic adds into
the gradient, which need a zeroed buffer (a fill launch) and whose order, so whose bits, depends on the
scheduling. The bytes are those of torch's sum: every partial row read once (``.cg``, from L2), each gradient
written once.

The counters: four int32 (tickets, stored rows, finished reducers, failed), zero between launches; launches on
one stream run one after another, so one launch at a time uses them. On CUDA one set per device and stream,
except while a CUDA graph is being captured (then fresh zeros, allocated and filled inside the graph, so that no
graph's private memory is ever shared with a launch outside it); elsewhere (the interpreter) fresh zeros at every
launch. Under the Triton interpreter the programs run one after another in grid order, so the workers finish
before the first reducer starts.

**Off by default.** The in-kernel reduction has not yet run on a GPU: ``switches.get().inkernel_reduce`` (environment
``DDL_INKERNEL_REDUCE``) turns it on. Off, a launch is its P workers and torch sums their rows
(:meth:`Reduction.finish`), as until 2026-11-27.

**Guarded.** Counters that are not zero at a launch (a launch that died mid-way, memory handed to another tensor)
would make reducers wait forever, sum rows nobody wrote, or reset the counters while programs still need them. So
every state of the counters either gives the launch's gradients or fails it, and no program writes outside its
buffers whatever they hold: a negative ticket (below zero, or past int32) is replaced by one past every program
(:func:`take_ticket`); a program whose ticket is past the launch's programs, a worker that finds the stored count
at P or below zero or the finished count not zero when it signals, a reducer that finds more stored rows than
workers, counts itself past the launch's reducers or below zero, or is the last to finish while the tickets and
stored rows are not exactly the launch's, and a reducer that has waited ``SPIN_LIMIT`` polls without seeing every
worker (a uniform count: every thread of the program sees the same value) sets the failed counter and writes
nothing; on a GPU it then traps (the launch fails with a CUDA error instead of hanging or writing wrong
gradients). Under the interpreter the host reads the counters after the launch and raises
:class:`ReductionError` naming the kernel when the failed counter is set or any counter is not back at zero.

Offsets: the kernels index with 32-bit integers; :func:`deep_delta.ops.launch.launch` refuses a tensor of more
than ``MAX_ELEMENTS`` elements before launching.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from deep_delta.ops import launch as launch_geometry
from deep_delta.ops import switches
from deep_delta.ops.launch import counting_dry, record

# The reducers' shape: about one reducer per SM (all of them reading at once, the reduction's bandwidth the GPU's,
# not one SM's) with C columns each, a power of two from MIN_COLS (a 128-byte line of each row) to MAX_COLS, each
# loading REDUCE_TILE values (REDUCE_TILE // C rows) per step: 16 KB in flight per reducer. Tests patch them small.
REDUCE_TILE = 4096
MIN_COLS, MAX_COLS = 32, 256
SLOTS = 4  # tickets, stored rows, finished reducers, failed
_COUNTERS: dict[tuple, torch.Tensor] = {}


class ReductionError(RuntimeError):
    """An in-kernel reduction found its counters stale or waited too long for its workers (module docstring)."""


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


def inkernel() -> bool:
    """Whether weight gradients are summed inside their launches now (``switches.get().inkernel_reduce``)."""
    return switches.get().inkernel_reduce


@dataclass(frozen=True)
class Reduction:
    """How one launch sums its partial rows: in the launch (``inkernel``: ``plan.total`` reducer programs beside
    the workers, the ``counters``) or by torch after it (no reducers; ``counters`` an unused placeholder)."""

    plan: ReducePlan
    inkernel: bool
    counters: torch.Tensor

    @property
    def total(self) -> int:
        """Reducer programs to launch beside the workers (0 when torch sums)."""
        return self.plan.total if self.inkernel else 0

    @property
    def reducers(self) -> tuple[int, ...]:
        """Reducers per partial buffer (zeros when torch sums)."""
        return self.plan.reducers if self.inkernel else tuple(0 for _ in self.plan.reducers)

    def meta(self) -> dict:
        """The kernels' constants: ``REDUCE`` and the plan's ``REDUCE_ROWS``, ``REDUCE_COLS``."""
        return dict(REDUCE=self.inkernel, **self.plan.meta())

    def finish(self, kernel: str, *buffers: tuple) -> None:
        """After the launch of ``kernel``: each ``(part, *grads)`` in ``buffers`` summed (by torch when not in the
        kernel: ``part``'s rows summed in fp32, its columns split over ``grads`` in order, each written in its
        dtype) and recorded for ``count_traffic``; in the kernel, under the interpreter, :func:`check`."""
        if self.inkernel:
            check(self.counters, kernel)
        for part, *grads in buffers:
            if not self.inkernel:
                torch_sum(part, *grads)
            record_sum(part, *grads)


def start(device: torch.device, *widths: int) -> Reduction:
    """The reduction of a launch on ``device`` with partial buffers of rows of ``widths`` values: the reducers'
    plan (about one per SM: ``max_programs(device, per_sm=1)``) and, when the switch is on, the counters."""
    on = inkernel()
    red_plan = plan(launch_geometry.max_programs(device, per_sm=1), *widths)
    return Reduction(red_plan, on, counters(device) if on else _placeholder(device))


def _placeholder(device: torch.device) -> torch.Tensor:
    return torch.empty(SLOTS, dtype=torch.int32, device=device)


def torch_sum(part: torch.Tensor, *grads: torch.Tensor) -> None:
    """The rows of ``part`` (P, ...) summed in fp32, the sum's columns split over ``grads`` in order (each the
    next ``numel`` values, in its own dtype and shape): the reduction when it is not in the kernel."""
    total = part.reshape(part.shape[0], -1).sum(0, dtype=torch.float32)
    start_col = 0
    for g in grads:
        g.copy_(total[start_col:start_col + g.numel()].view(g.shape))
        start_col += g.numel()
    if start_col != total.numel():
        raise ValueError(f"partials.torch_sum: the gradients hold {start_col} values, the partial rows "
                         f"{total.numel()}")


def counters(device: torch.device) -> torch.Tensor:
    """The four int32 counters of an in-kernel reduction on ``device``, zero: one set per CUDA device and stream
    (the kernel's last reducer sets them back to zero), fresh zeros while a CUDA graph is being captured, while
    compiling and off CUDA. While counting launches dry (fake tensors), an empty placeholder."""
    if counting_dry():
        return _placeholder(device)
    if device.type != "cuda" or torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
        return torch.zeros(SLOTS, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = ("cuda", index, torch.cuda.current_stream(index).cuda_stream)
    found = _COUNTERS.get(key)
    if found is None:
        found = _COUNTERS[key] = torch.zeros(SLOTS, dtype=torch.int32, device=device)
    return found


def cached_counters() -> dict[tuple, torch.Tensor]:
    """The counters cached per CUDA device and stream (a copy of the mapping): for probes that check they are back
    at zero after the launches, or untouched by a CUDA graph's."""
    return dict(_COUNTERS)


def check(count: torch.Tensor, kernel: str) -> None:
    """Raise :class:`ReductionError` naming ``kernel`` if its launch set the failed counter, or left any counter
    not zero (a clean launch's last reducer sets them back: counters left otherwise were stale at the launch and
    would be handed to the next). Read on the host only where that costs no synchronisation (CPU tensors: the
    interpreter); on a GPU the kernel traps instead, and :func:`check_device` reads the counters on request."""
    if count.device.type == "cpu" and not counting_dry() and bool(count.any()):
        raise ReductionError(_failure(kernel, count))


def check_device(device: torch.device) -> None:
    """Synchronise and raise :class:`ReductionError` if any cached counters on ``device`` are not zero (stale, or
    failed): for probes and tests on a GPU."""
    for key, count in _COUNTERS.items():
        if count.device == device or (device.type == "cuda" and count.device.type == "cuda" and device.index is None):
            if int(count.abs().sum()) != 0:
                raise ReductionError(_failure(f"a launch on stream {key[2]}", count))


def _failure(kernel: str, count: torch.Tensor) -> str:
    return (f"{kernel}: the in-kernel reduction of its weight gradient failed (counters {count.tolist()}: tickets, "
            f"stored rows, finished reducers, failed): its counters were not zero at the launch, or a reducer "
            f"polled {SPIN_LIMIT} times without seeing every worker's row; no gradient was written. Run with "
            f"DDL_INKERNEL_REDUCE=0 (torch sums the partial rows; deep_delta.ops.switches) and report it.")


# The ticket a negative count hands out is replaced by this one, past every launch's programs (a launch has far fewer
# than 2^30): its program is then a reducer past the launch's reducers, which fails and writes nothing. A negative
# ticket (a stale counter below zero, or one that overflowed int32) would otherwise be a worker of chunk -1, -2^31, ...
# and store its partial row before the buffer.
PAST_EVERY_PROGRAM: tl.constexpr = tl.constexpr(1 << 30)


@triton.jit
def take_ticket(COUNTERS, REDUCE: tl.constexpr):
    """This program's ticket: with REDUCE the order in which the launch's programs started (counter 0), else its
    program id (no reducers, no counters). Never negative: a negative count gives ``PAST_EVERY_PROGRAM``."""
    ticket = tl.program_id(0)
    if REDUCE:
        ticket = tl.atomic_add(COUNTERS, 1, sem="relaxed")
        ticket = tl.where(ticket < 0, PAST_EVERY_PROGRAM, ticket)
    return ticket


_INTERPRETED = type(take_ticket).__name__ == "InterpretedFunction"
# Polls of a reducer waiting for its workers before it gives up: on a GPU about 2^24 (each an L2 round trip of
# about a microsecond: tens of seconds, far past any launch's workers); under the interpreter, where the workers
# have all run before the first reducer, a few, so that stale counters fail in well under a second.
SPIN_LIMIT: tl.constexpr = tl.constexpr(64 if _INTERPRETED else 1 << 24)
TRAP: tl.constexpr = tl.constexpr(not _INTERPRETED)


@triton.jit
def signal_stored(COUNTERS, P, REDUCE: tl.constexpr):
    """A worker's partial row is stored: with REDUCE, counter 1 += 1, released after every thread of the program has
    stored its part (the barrier orders them before the release). Stale counters: :func:`fail` when the count was
    already at the launch's P workers or below zero, or when the finished reducers' count (counter 2, read before
    the release) is not zero: no reducer can finish before every worker has signalled, so a count there is stale,
    and would let a reducer believe itself the last and reset the counters while others still run."""
    if REDUCE:
        tl.debug_barrier()
        finished = tl.atomic_add(COUNTERS + 2, 0, sem="relaxed")
        stored = tl.atomic_add(COUNTERS + 1, 1, sem="release")
        if (stored >= P) | (stored < 0) | (finished != 0):
            fail(COUNTERS)


@triton.jit
def fail(COUNTERS):
    """Set the failed counter; on a GPU, trap (the launch fails with a CUDA error)."""
    tl.atomic_xchg(COUNTERS + 3, 1, sem="relaxed")
    if TRAP:
        tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait_for_workers(COUNTERS, P, rid, R):
    """Reducer ``rid`` of R: spin until all P workers have signalled (acquire), then let every thread of the
    program go on. True when the reducer may sum; False after :func:`fail` when its ticket is past the launch's
    reducers, more than P rows were signalled, or SPIN_LIMIT polls did not see all P (stale counters). A stale
    count below P can let a reducer go on early; a worker then finds the count at P (:func:`signal_stored`) and
    fails the launch."""
    fresh = rid < R
    seen = tl.atomic_add(COUNTERS + 1, 0, sem="acquire")
    spins = 0
    while fresh & (seen < P) & (spins < SPIN_LIMIT):
        seen = tl.atomic_add(COUNTERS + 1, 0, sem="acquire")
        spins += 1
    ok = fresh & (seen == P)
    if not ok:
        fail(COUNTERS)
    tl.debug_barrier()
    return ok


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
    if wait_for_workers(COUNTERS, WORKERS, rid, R):
        reduce_into(PART, OUT, rid, P, WIDTH, REDUCE_ROWS, REDUCE_COLS)
        reducer_finished(COUNTERS, WORKERS, R)


@triton.jit
def reducer_finished(COUNTERS, WORKERS, R):
    """Counter 2 += 1; the last of the R reducers (every program has taken its ticket, every reducer has stopped
    reading counter 1) sets the three counters back to zero for the next launch, after checking that they say so:
    exactly WORKERS + R tickets taken and WORKERS rows stored. Otherwise (a stale finished count made an early
    reducer the "last": programs may not have their tickets yet) it resets nothing and fails (:func:`fail`), as for a
    count past R or below zero."""
    tl.debug_barrier()
    done = tl.atomic_add(COUNTERS + 2, 1, sem="acq_rel")
    if done == R - 1:
        tickets = tl.atomic_add(COUNTERS, 0, sem="relaxed")
        stored = tl.atomic_add(COUNTERS + 1, 0, sem="relaxed")
        if (tickets == WORKERS + R) & (stored == WORKERS):
            tl.atomic_xchg(COUNTERS, 0, sem="relaxed")
            tl.atomic_xchg(COUNTERS + 1, 0, sem="relaxed")
            tl.atomic_xchg(COUNTERS + 2, 0, sem="relaxed")
        else:
            fail(COUNTERS)
    elif (done >= R) | (done < 0):
        fail(COUNTERS)


def record_sum(part: torch.Tensor, *grads: torch.Tensor) -> None:
    """Count the reduction of the partial buffer ``part`` into ``grads`` for ``count_traffic``, as torch's sum was
    counted: every row read once, each gradient written once (``partial_sum``, owned by the launch before it)."""
    record("partial_sum", (part,), grads)
