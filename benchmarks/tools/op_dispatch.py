"""Host time of the custom ops' Python dispatch against the kernels' autograd Functions (no GPU needed).

``backend="auto"`` on CUDA used to call the ``torch.library`` custom ops in eager too; it now calls them only
while ``torch.compile`` traces (:func:`deep_delta.ops.backend.through_registered_op`) and the Triton autograd
Functions otherwise. This probe measures what that saves per call on the host, on any machine: the same Triton
launch wrappers run both ways on CPU tensors inside ``count_traffic(dry=True)`` (the kernels are not launched,
so only host work is timed), the ops called with ``backend="triton"`` (their kernel on any device then calls the
Triton wrappers, as the CUDA kernel does). Each row:
median microseconds of a forward + backward (best of ``--repeats`` medians over ``--iters`` calls), tiny
tensors, so the torch ops around the kernels cost little.

    PYTHONPATH=src python benchmarks/tools/op_dispatch.py [--iters 300] [--repeats 5] [--threads 1]

Prints markdown. Not a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch

from deep_delta.ops.delta import library as delta_library
from deep_delta.ops.delta.triton import delta_update_read_triton, delta_update_triton
from deep_delta.ops.launch import count_traffic
from deep_delta.ops.norm import library as norm_library
from deep_delta.ops.norm.triton import norm_gate_value_triton


def cases(n: int, d: int, dv: int):
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).requires_grad_()

    src, weights = r(n, d), (r(d), r(1, d), r(1), r(dv, d), r(dv))
    x, k, v, beta, c = r(n, d, dv), r(n, d), r(n, dv), r(n, 1), r(d, dv)
    consts = (1e-5, 2.0, 4.0)
    LEAVES[:] = [src, *weights, x, k, v, beta, c]
    return {
        "norm + gate + value": (lambda: norm_library.norm_gate_value_with_op(src, *weights, *consts, backend="triton"),
                                lambda: norm_gate_value_triton(src, *weights, eps=1e-5, beta_max=2.0,
                                                               value_scale=4.0)),
        "delta update": (lambda: delta_library.update_with_op(x, k, v, beta, None, 1e-5, backend="triton"),
                         lambda: delta_update_triton(x, k, v, beta, k_eps=1e-5)),
        "update + CC read": (lambda: delta_library.update_with_op(x, k, v, beta, c, 1e-5, backend="triton"),
                             lambda: delta_update_read_triton(x, k, v, beta, c, k_eps=1e-5)),
    }


LEAVES: list[torch.Tensor] = []  # the cases' inputs: what each backward is taken with respect to


def fwd_bwd(fn) -> None:
    """The op and its backward (the gradients of every input, none accumulated into ``.grad``)."""
    out = fn()
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.grad(outs, LEAVES, [torch.ones_like(o) for o in outs], allow_unused=True)


def median_us(fn, iters: int, repeats: int) -> float:
    for _ in range(20):
        fwd_bwd(fn)
    best = float("inf")
    for _ in range(repeats):
        ts = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fwd_bwd(fn)
            ts.append(time.perf_counter() - t0)
        best = min(best, statistics.median(ts))
    return best * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.iters < 1 or args.repeats < 1 or args.threads < 1:
        ap.error(f"--iters, --repeats and --threads must be >= 1, got {args.iters}, {args.repeats}, {args.threads}")
    torch.set_num_threads(args.threads)
    rows = []
    with count_traffic(dry=True):
        for name, (op, function) in cases(n=8, d=64, dv=4).items():
            t_op, t_fn = median_us(op, args.iters, args.repeats), median_us(function, args.iters, args.repeats)
            rows.append(f"| {name} | {t_op:.0f} | {t_fn:.0f} | {t_op - t_fn:.0f} | {t_op / t_fn:.2f}x |")
            print(rows[-1], file=sys.stderr, flush=True)
    print(f"\n### Host time per forward + backward, custom op vs autograd Function ({platform.machine() or 'cpu'}, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}; dry launches, 8 tokens, d = 64, d_v = 4)\n")
    print("| op | custom op (us) | autograd Function (us) | saved (us) | op / Function |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
