"""Stress probe of the in-kernel weight-gradient reduction (:mod:`deep_delta.ops.partials`) on a GPU (issue 47).

Every backward that sums a weight gradient over its tokens runs at the small preset's shapes (d = 768, d_v = 4,
K = 4 taps, n = 4 streams, 32 x 1024 tokens; bf16 state) with the partial rows summed inside the launch
(the ``inkernel_reduce`` switch on) and by torch (off), and the probe records per case:

- ``rel_diff``: the largest relative difference of any input's gradient between the two (the same partial rows,
  summed in another order: about 1e-6 for fp32 sums);
- ``same_bits``: the in-kernel sum twice gives the same bits (its order is fixed);
- ``no_nan``: every gradient finite although the partial buffers were handed memory filled with NaN (a reducer
  reading a row no worker wrote would carry a NaN);
- ``big_grid``: the same with 16 workers per SM (more programs than fit at once: reducers take their tickets
  after every worker has started, so they wait only for running programs), equal to the default grid's sum within
  ``rel_diff``'s bound;
- ``counters_zero``: the cached counters are all zero after the case;
- ``ms_inkernel`` / ``ms_torch``: the op's forward + backward, median of 10 (host clock, the device synchronised).

Then one CUDA graph: the fused CC read's backward captured with the in-kernel sum (fresh counters inside the graph)
and replayed three times, equal bit for bit to eager, the cached counters untouched. Results as JSON (``--out``);
the exit code is 1 if any check failed. ``--tiny`` runs it on CPU under the Triton interpreter at small shapes (the
test that the probe itself works: tests/benchmarks). Run from the repository root:

    PYTHONPATH=src python benchmarks/tools/reduce_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from deep_delta.eval import timing  # noqa: E402
from deep_delta.ops import launch as ops_launch  # noqa: E402
from deep_delta.ops import partials, switches  # noqa: E402
from deep_delta.ops.compress import channel_compress, embed_conv, token_compress  # noqa: E402
from deep_delta.ops.delta import triton as delta_triton  # noqa: E402
from deep_delta.ops.delta import (  # noqa: E402
    update_and_channel_read,
    update_and_norm,  # noqa: E402
    update_and_token_read,
)
from deep_delta.ops.hyper import stream_read, stream_write  # noqa: E402
from deep_delta.ops.norm import norm_gate_value  # noqa: E402

SMALL = dict(batch=32, seq=1024, d=768, dv=4, k=4, ns=4)
TINY = dict(batch=2, seq=5, d=12, dv=3, k=4, ns=4)


def cases(s: dict, device: torch.device) -> dict:
    """name -> (leaves, forward): each op's inputs (fresh random values, requires_grad) and its forward."""
    b, t, d, dv, kk, ns = s["batch"], s["seq"], s["d"], s["dv"], s["k"], s["ns"]
    bf16, f32 = torch.bfloat16, torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape, dtype=bf16, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, dtype).requires_grad_()

    def beta():
        return (torch.rand(b, t, 1, generator=gen) * 2).to(device).requires_grad_()

    def norm_weights(v):
        return [rnd(d, dtype=f32), rnd(1, d, dtype=f32, scale=0.1), rnd(1, dtype=f32), rnd(v, d, dtype=f32, scale=0.1),
                rnd(v, dtype=f32)]

    consts = dict(eps=1e-5, beta_max=2.0, value_scale=4.0, c_dtype=bf16)
    out: dict = {}
    x, k, v, bb, c = rnd(b, t, d, dv), rnd(b, t, d), rnd(b, t, dv, dtype=f32), beta(), rnd(d, dv, dtype=f32, scale=0.5)
    out["update + CC read"] = ([x, k, v, bb, c], lambda x, k, v, bb, c: update_and_channel_read(x, k, v, bb, c,
                                                                                             backend="triton"))
    w4, w5 = rnd(kk, d, dv, dtype=f32, scale=0.3), rnd(kk + 1, d, dv, dtype=f32, scale=0.3)
    for name, w, one_pass in (("update + TC read, K = 4, one pass", w4, True),
                              ("update + TC read, K = 4, two passes", w4, False),
                              ("update + TC read, K = 5, one pass", w5, True)):
        def tc(x, k, v, bb, w, one_pass=one_pass):
            with switches.override(tc_one_pass=one_pass):
                return update_and_token_read(x, k, v, bb, w, backend="triton")
        out[name] = ([x, k, v, bb, w], tc)
    out["CC read"] = ([x, c], lambda x, c: channel_compress(x, c, backend="triton"))
    out["TC read"] = ([x, w4], lambda x, w: token_compress(x, w, backend="triton"))
    e = rnd(b, t, d)
    out["EC expansion"] = ([e, w4], lambda e, w: embed_conv(e, w, backend="triton"))
    h, f = rnd(b * t, d, ns), rnd(b * t, d)
    rs, bs, a_s = rnd(ns, ns, dtype=f32), rnd(ns, dtype=f32), rnd(ns, dtype=f32)
    out["HC write, static"] = ([h, rs, bs, f], lambda h, r, bs, f: stream_write(h, r, bs, f, backend="triton"))
    out["HC read, static"] = ([h, a_s], lambda h, a: stream_read(h, a, backend="triton"))
    for v_ch in (dv, 1):
        src = rnd(b, t, d)
        out[f"norm + gate + value, d_v = {v_ch}"] = (
            [src, *norm_weights(v_ch)],
            lambda *a: norm_gate_value(*a, **consts, backend="triton"))
    out["update + CC read + next norm"] = (
        [x, k, v, bb, c, *norm_weights(dv)],
        lambda x, k, v, bb, c, *nw: update_and_norm(x, k, v, bb, *nw, read=c, k_eps=1e-5, **consts, backend="triton"))
    x1, v1 = rnd(b, t, d, dtype=f32), rnd(b, t, 1, dtype=f32)  # a d_v = 1 state: (..., d), fp32
    out["update + next norm, d_v = 1"] = (
        [x1, k, v1, bb, *norm_weights(1)],
        lambda x, k, v, bb, *nw: update_and_norm(x, k, v, bb, *nw, k_eps=1e-5, **consts, backend="triton"))
    return out


def poison(device: torch.device, mib: int) -> None:
    """Fill ``mib`` MiB of fresh memory with NaN and free it: the caching allocator hands those blocks to the next
    allocations (the partial buffers among them)."""
    if device.type == "cuda":  # a large block and many small ones (the allocator's two pools)
        junk = [torch.full((mib * 2**18,), float("nan"), device=device)]
        junk += [torch.full((2**14,), float("nan"), device=device) for _ in range(256)]
        del junk


def grads_of(leaves, forward, upstream=None):
    outs = forward(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    if upstream is None:
        gen = torch.Generator(device="cpu").manual_seed(1)
        upstream = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]
    return torch.autograd.grad(outs, leaves, upstream, allow_unused=True), upstream


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def timed(fn, device: torch.device, reps: int) -> float | None:
    """Median milliseconds of ``reps`` calls after one untimed (the library's timer, the device synchronised
    around each call); None off CUDA."""
    if device.type != "cuda":
        return None
    fn()
    return statistics.median(timing.timed(fn, device) for _ in range(reps)) * 1e3


def probe_case(leaves, forward, device, poison_mib: int, reps: int, big_per_sm: int) -> dict:
    with switches.override(inkernel_reduce=False):
        want, upstream = grads_of(leaves, forward)
    poison(device, poison_mib)
    with switches.override(inkernel_reduce=True):
        got, _ = grads_of(leaves, forward, upstream)
        poison(device, poison_mib)
        again, _ = grads_of(leaves, forward, upstream)
        sms = ops_launch.max_programs(device, per_sm=1)
        default = ops_launch.max_programs
        ops_launch.max_programs = lambda dev, per_sm=None: big_per_sm * sms
        try:
            poison(device, poison_mib)
            big, _ = grads_of(leaves, forward, upstream)
        finally:
            ops_launch.max_programs = default
        ms_in = timed(lambda: grads_of(leaves, forward, upstream), device, reps)
    with switches.override(inkernel_reduce=False):
        ms_torch = timed(lambda: grads_of(leaves, forward, upstream), device, reps)
    pairs = [(g, w) for g, w in zip(got, want) if g is not None]
    if device.type == "cuda":
        torch.cuda.synchronize()
    counters_zero = all(int(t.abs().sum()) == 0 for t in partials.cached_counters().values())
    diff = max(rel(g, w) for g, w in pairs)
    return dict(
        rel_diff=diff,
        same_bits=all(torch.equal(g, a) for g, a in zip(got, again) if g is not None),
        no_nan=all(bool(torch.isfinite(g).all()) for g in (*got, *big) if g is not None),
        big_grid=max(rel(g, w) for g, w in zip(big, want) if g is not None),
        counters_zero=counters_zero,
        ms_inkernel=ms_in, ms_torch=ms_torch,
    )


def graph_case(s: dict, device: torch.device) -> dict:
    """The fused CC read's backward captured in a CUDA graph with the in-kernel sum and replayed."""
    if device.type != "cuda":
        return dict(skipped="needs CUDA")
    n, d, dv = s["batch"] * s["seq"], s["d"], s["dv"]
    gen = torch.Generator(device="cpu").manual_seed(3)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    x, k, v, beta, c = rnd(n, d, dv), rnd(n, d), rnd(n, dv, dtype=torch.float32), rnd(n, dtype=torch.float32), rnd(
        d, dv, dtype=torch.float32)
    g, gin = rnd(n, d, dv), rnd(n, d)
    with switches.override(inkernel_reduce=True):
        eager = delta_triton.triton_backward(g, gin, x, k, v, beta, c, 1e-5)
        cached = {key: t.clone() for key, t in partials.cached_counters().items()}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on the capture stream (its own cached counters)
            delta_triton.triton_backward(g, gin, x, k, v, beta, c, 1e-5)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = delta_triton.triton_backward(g, gin, x, k, v, beta, c, 1e-5)
        same = []
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            same.append(all(torch.equal(a, b) for a, b in zip(captured, eager)))
    untouched = all(torch.equal(partials.cached_counters()[key], t) for key, t in cached.items())
    return dict(replays_equal_eager=same, cached_counters_untouched=untouched,
                counters_zero=all(int(t.abs().sum()) == 0 for t in partials.cached_counters().values()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="reduce_probe.json")
    p.add_argument("--tiny", action="store_true", help="small shapes (CPU under the Triton interpreter)")
    p.add_argument("--only", nargs="+", default=None, metavar="CASE", help="run only these cases")
    p.add_argument("--reps", type=int, default=10, help="timed repeats per backward (median)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest rel_diff / big_grid that passes")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = TINY if args.tiny or device.type != "cuda" else SMALL
    results: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)",
                     "torch": torch.__version__, "shapes": shapes, "cases": {}}
    try:
        import triton

        results["triton"] = triton.__version__
    except ImportError:
        pass
    failed = []

    def save():
        with open(args.out, "w") as fh:
            json.dump(dict(results, failed=failed), fh, indent=1)

    all_cases = cases(shapes, device)
    unknown = sorted(set(args.only or ()) - set(all_cases))
    if unknown:
        p.error(f"--only: unknown case(s) {unknown}; allowed: {sorted(all_cases)}")
    for name, (leaves, forward) in all_cases.items():
        if args.only and name not in args.only:
            continue
        t0 = time.time()
        try:
            r = probe_case(leaves, forward, device, poison_mib=256 if device.type == "cuda" else 0, reps=args.reps,
                           big_per_sm=16 if device.type == "cuda" else 3)
        except Exception as exc:  # recorded and reported: the probe goes on with the next case
            r = dict(error=f"{type(exc).__name__}: {exc}"[:500])
        r["seconds"] = round(time.time() - t0, 1)
        ok = ("error" not in r and r["rel_diff"] <= args.tolerance and r["big_grid"] <= args.tolerance
              and r["same_bits"] and r["no_nan"] and r["counters_zero"])
        if not ok:
            failed.append(name)
        results["cases"][name] = r
        print(f"[probe] {name}: {'ok' if ok else 'FAILED'} {r}", flush=True)
        save()
    try:
        r = graph_case(shapes, device)
    except Exception as exc:
        r = dict(error=f"{type(exc).__name__}: {exc}"[:500])
    if "skipped" not in r and not ("error" not in r and all(r["replays_equal_eager"]) and r["counters_zero"]
                                   and r["cached_counters_untouched"]):
        failed.append("cuda graph")
    results["cuda graph"] = r
    print(f"[probe] cuda graph: {r}", flush=True)
    save()
    print(f"[probe] {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
