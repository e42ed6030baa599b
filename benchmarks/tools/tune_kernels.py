"""Launch parameters of the delta kernels on one GPU: time each kernel over a grid of settings (a development
probe, not part of the library).

For the training shape (B x T tokens, width d, d_v; every input in the dtype the model hands that kernel under
bf16 autocast, :func:`inputs`) it times, per kernel, every combination of the launch parameters the library
chooses by heuristic: warps per program, tokens per program (``ROWS``, the TC ``CHUNK``) and the persistent grid's
programs per SM (the fused CC-read and TC backward). Each row: median milliseconds (CUDA events over ``--iters``
calls, after warm-up), the bytes the launch arguments imply (``deep_delta.ops.launch.count_traffic``) and the
bandwidth that gives; the library's current choice comes first, with the launch settings it makes. The header
names the device, torch and the library's commit. Prints markdown, writes it and a JSON beside it.

    python benchmarks/tools/tune_kernels.py --out DIR [--batch 32 --seq 1024 --d 768] [--only KERNEL ...]
        [--params warps per_sm ...] [--grid per_sm=4,8,16 prefetch=0,1 one_pass=0,1 ...]
    TRITON_INTERPRET=1 python benchmarks/tools/tune_kernels.py --device cpu --quick   # a smoke test on CPU
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import itertools
import json
import statistics
import subprocess
from pathlib import Path

import torch

import deep_delta.ops.delta.triton as dt
import deep_delta.ops.delta.triton_token as tt
import deep_delta.ops.launch as gl
import deep_delta.ops.norm.triton as nt

try:  # the updates fused with the next sublayer's input stage (ops/delta/triton_norm.py since 2026-11-28,
    import deep_delta.ops.delta.triton_norm as tu  # ops/norm/triton_update.py on 2026-11-27); a before-run lacks them
except ImportError:
    try:
        import deep_delta.ops.norm.triton_update as tu
    except ImportError:
        tu = None
from deep_delta.eval.timing import timed
from deep_delta.ops.launch import count_traffic, launch


@contextlib.contextmanager
def settings(warps=None, rows=None, per_sm=None, chunk=None, stages=None, prefetch=None, one_pass=None):
    """Patch the library's launch heuristics for the duration (None: keep the library's choice). Only the names
    the library has are patched: an older checkout (a before-run, ``--no-sweep``) lacks some, and had
    ``READ_BWD_WARPS`` where the library now uses ``delta_warps``."""
    patches = {}
    if stages is not None:  # the launch's num_stages (software pipelining of the loops' loads)
        patches.update({(dt, "launch"): functools.partial(launch, num_stages=stages),
                        (tt, "launch"): functools.partial(launch, num_stages=stages)})
    if warps is not None:
        fixed = lambda elements, w=warps: w  # noqa: E731
        patches.update({(dt, "delta_warps"): fixed, (tt, "delta_warps"): fixed, (dt, "READ_BWD_WARPS"): warps,
                        (nt, "WARPS"): warps, (tu, "WARPS"): warps})
    if rows is not None:
        fixed_rows = lambda n, tile, r=rows: r  # noqa: E731
        patches.update({(dt, "delta_rows"): fixed_rows, (tt, "delta_rows"): fixed_rows, (nt, "FWD_ROWS"): rows})
    if per_sm is not None:
        # the launch geometry in ops/launch.py since 2026-11-27 (gl), in ops/delta/triton.py before (dt)
        patches.update({(gl, "PROGRAMS_PER_SM"): per_sm, (gl, "MAX_PROGRAMS"): per_sm * 4,
                        (dt, "PROGRAMS_PER_SM"): per_sm, (dt, "READ_BWD_PER_SM"): per_sm, (nt, "BWD_PER_SM"): per_sm,
                        (tt, "BWD_PER_SM"): per_sm,  # the one-pass TC backward's persistent grid
                        (tu, "BWD_PER_SM"): per_sm, (tu, "READ_BWD_PER_SM"): per_sm,  # the fused norm backwards
                        (dt, "MAX_PROGRAMS"): per_sm * 4})  # off CUDA (the smoke test): a small grid that varies
    if chunk is not None:
        patches[(tt, "CHUNK")] = chunk
    if prefetch is not None:  # every token loop that has the knob
        patches.update({(tt, "PREFETCH"): prefetch, (tt, "GRAD_W_PREFETCH"): prefetch, (tt, "BWD_PREFETCH"): prefetch,
                        (dt, "READ_BWD_PREFETCH"): prefetch, (nt, "BWD_PREFETCH"): prefetch})
    if one_pass is not None:  # the norm kernels' per-token reductions at once or chained (ops/norm/triton.py)
        patches[(nt, "ONE_PASS")] = one_pass
    patches = {key: value for key, value in patches.items() if hasattr(*key)}
    saved = {key: getattr(*key) for key in patches}
    try:
        for (module, name), value in patches.items():
            setattr(module, name, value)
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def state_dtype(dv: int, compute: torch.dtype) -> torch.dtype:
    """The dtype the model stores its state in under ``compute`` autocast on a GPU (``DDLConfig.state_dtype``
    "auto"): fp32 at d_v = 1, the compute dtype at d_v > 1."""
    return torch.float32 if dv == 1 else compute


def inputs(b, t, d, dv, ks, device, compute=torch.bfloat16, seed=0):
    """Every kernel's inputs in the dtype the model passes it under ``compute`` autocast (a training step on the
    GPU; tests/benchmarks/test_device_probes.py compares them with the model's launches): the state x, its
    gradient and the read x_in's gradient in the state's dtype (:func:`state_dtype`); the branch output k (a
    matmul's) and its gradient in ``compute``; v and beta fp32 (the norm, gate and value kernel writes them in its
    weights' dtype); the compressor weights c and w fp32 (parameters). The sublayer's norm, gate and value
    (ops.norm) reads src as stored (the state at d_v = 1, the read x_in at d_v > 1: the state's dtype), fp32
    weights, and writes c in ``compute`` (the models' norm_output="autocast"; its gradient the same), beta and v
    fp32."""
    g = torch.Generator().manual_seed(seed)
    state = state_dtype(dv, compute)

    def r(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    x = r(b, t, d, dv, dtype=state)
    k, v, beta = r(b, t, d, dtype=compute), r(b, t, dv), torch.rand(b, t, generator=g).to(device)
    c, w = r(d, dv, scale=0.1), r(ks, d, dv, scale=0.1)
    g_state, g_in = r(b, t, d, dv, dtype=state), r(b, t, d, dtype=state)
    norm = (r(b * t, d, dtype=state), 1 + r(d, scale=0.1), r(1, d, scale=0.1), r(1), r(dv, d, scale=0.1), r(dv))
    norm_grads = (r(b * t, d, dtype=compute), r(b * t, 1), r(b * t, dv))
    return dict(x=x, k=k, v=v, beta=beta, c=c, w=w, g=g_state, gin=g_in, norm=norm, norm_grads=norm_grads,
                c_dtype=compute)


def kernels(a, eps=1e-5):
    """name -> (call, which parameters it takes), for the d_v of ``a`` (:func:`inputs`): d_v = 1 has no
    compressor, so no kernel with a read."""
    b, t, d, dv = a["x"].shape
    n = b * t
    flat = dict(x=a["x"].view(n, d, dv), k=a["k"].view(n, d), v=a["v"].view(n, dv), beta=a["beta"].view(n))
    g, gin = a["g"].view(n, d, dv), a["gin"].view(n, d)
    f = flat
    consts = (1e-5, 2.0, 4.0)  # the norm's eps, beta_max, value_scale
    table = {  # the likeliest to gain first: a short call may be cut off
        "delta bwd + TC read": (lambda: tt.token_read_backward(a["g"], a["gin"], a["x"], *tc_out(a), a["k"], a["v"],
                                                               a["beta"], a["w"], eps),
                                ("warps", "rows", "per_sm", "prefetch")),
        "delta bwd + CC read": (lambda: dt.triton_backward(g, gin, f["x"], f["k"], f["v"], f["beta"], a["c"], eps),
                                ("warps", "per_sm", "prefetch")),
        "norm bwd": (lambda: nt.triton_backward(*a["norm_grads"], *a["norm"], *consts),
                     ("warps", "per_sm", "prefetch", "one_pass")),
        "norm fwd": (lambda: nt.triton_forward(*a["norm"], *consts, *norm_c_dtype(a)), ("warps", "rows", "one_pass")),
        "delta fwd + TC read": (lambda: tt.token_read_forward(a["x"], a["k"], a["v"], a["beta"], a["w"], eps),
                                ("warps", "chunk", "prefetch")),
        "delta fwd + CC read": (lambda: dt.triton_forward(f["x"], f["k"], f["v"], f["beta"], a["c"], eps),
                                ("warps", "rows")),
        "delta bwd": (lambda: dt.triton_backward(g, None, f["x"], f["k"], f["v"], f["beta"], None, eps),
                      ("warps", "rows")),
        "delta fwd": (lambda: dt.triton_forward(f["x"], f["k"], f["v"], f["beta"], None, eps), ("warps", "rows")),
    }
    if tu is not None:  # the next sublayer's input stage inside the update (d_v = 1; through the CC read)
        w, ng, c_dtype = a["norm"][1:], a["norm_grads"], a["c_dtype"]
        fb = f["beta"].view(n, 1)
        if dv == 1:
            x1, g1 = f["x"].view(n, d), g.view(n, d)
            table.update({
                "delta bwd + norm (d_v = 1)": (lambda: tu.triton_backward(g1, *ng, x1, f["k"], f["v"], fb, *w, eps,
                                                                          *consts), ("warps", "per_sm")),
                "delta fwd + norm (d_v = 1)": (lambda: tu.triton_forward(x1, f["k"], f["v"], fb, *w, eps, *consts,
                                                                         c_dtype), ("warps",)),
            })
        else:
            table.update({
                "delta bwd + CC read + norm": (lambda: tu.read_triton_backward(g, *ng, f["x"], f["k"], f["v"], fb,
                                                                               a["c"], *w, eps, *consts),
                                               ("warps", "per_sm")),
                "delta fwd + CC read + norm": (lambda: tu.read_triton_forward(f["x"], f["k"], f["v"], fb, a["c"], *w,
                                                                              eps, *consts, c_dtype), ("warps",)),
            })
    return {name: call for name, call in table.items() if dv > 1 or "read" not in name}


def norm_c_dtype(a) -> tuple:
    """The forward's c_dtype argument where the library has one (an older checkout, a before-run, has not)."""
    return (a["c_dtype"],) if "c_dtype" in inspect.signature(nt.triton_forward).parameters else ()


def tc_out(a: dict) -> tuple:
    """x' for the TC backward where it takes one (since 2026-11-26: the taps' gradient reads x' instead of
    recomputing it; x stands in, the same shape and bytes), nothing for a copy of older code."""
    return (a["x"],) if "out" in inspect.signature(tt.token_read_backward).parameters else ()


def traffic(fn) -> int:
    with count_traffic() as c:
        fn()
    return sum(x.read_bytes + x.write_bytes for x in c.launches)


LAUNCH_KNOBS = ("num_warps", "num_stages", "ROWS", "CHUNK", "PREFETCH", "ONE_PASS")  # the meta the sweep varies


def launch_settings(fn) -> str:
    """The launch settings the library chooses for ``fn``'s kernels, from a dry launch of each: the grid and the
    tuned meta-parameters the call passes (a knob a kernel does not take is left out), e.g. ``delta_fwd_kernel
    grid 1024, num_warps=4, ROWS=1``; launches joined by ``; ``."""
    with count_traffic(dry=True, keep_calls=True) as c:
        fn()
    out = []
    for kernel, grid, _, meta in c.calls:
        name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", str(kernel))
        knobs = ", ".join(f"{k}={meta[k]}" for k in LAUNCH_KNOBS if k in meta)
        out.append(f"{name.lstrip('_')} grid {' x '.join(map(str, grid))}, {knobs}")
    return "; ".join(out)


def peak_text(device_name: str) -> str:
    """The device's peak memory bandwidth as the header states it (deep_delta.eval.timing.peak_bandwidth)."""
    try:
        from deep_delta.eval.timing import peak_bandwidth
    except ImportError:  # an older checkout (a before-run)
        return "not known to this library"
    peak = peak_bandwidth(device_name)
    return f"{peak / 1e9:,.0f} GB/s" if peak else "unknown"


def library_commit() -> str:
    """The commit of the checkout the imported library lives in (``git rev-parse HEAD`` there), marked when it has
    uncommitted changes; "not recorded" without git (e.g. a ``git archive`` copy for a before-run)."""
    where = Path(dt.__file__).resolve().parent

    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):
        return f"not recorded (no git checkout at {where})"
    return sha + (" with uncommitted changes to the library" if changed else "")


def time_ms(fn, device, iters: int, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    if device.type != "cuda":
        return statistics.median(timed(fn, device) for _ in range(iters)) * 1e3
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def raise_clocks(device, seconds: float = 0.5) -> None:
    """Keep the GPU busy for a moment before timing (nvidia-smi shows an idle H200 at 345 MHz). The first setting
    timed for a kernel sometimes read slow (the norm backward's library choice 0.582 ms against 0.372 for the same
    setting timed next, run_2026-11-26d/call2/tune_lib; the cause is not established), so the library's choice
    also gets more warm-up calls than the sweep's settings."""
    if device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(10):
            a @ a
        stop.record()
        stop.synchronize()
        if start.elapsed_time(stop) >= seconds * 1e3:
            return


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--dvs", type=int, nargs="+", default=[4, 1])
    ap.add_argument("--taps", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--only", nargs="*", default=None, help="kernel names (as printed) to sweep; default all")
    ap.add_argument("--params", nargs="*", default=None,
                    choices=["warps", "rows", "per_sm", "chunk", "stages", "prefetch", "one_pass"],
                    help="sweep these parameters for every kernel (the others at the library's choice); default: "
                         "each kernel's own launch parameters")
    ap.add_argument("--grid", nargs="*", default=[], metavar="NAME=V1,V2",
                    help="the values to sweep for a parameter, e.g. per_sm=4,8,16 prefetch=0,1 (default: all the "
                         "script's values)")
    ap.add_argument("--no-sweep", action="store_true",
                    help="time the library's own choice only (e.g. an older checkout, for a before/after)")
    ap.add_argument("--quick", action="store_true", help="a tiny shape and two settings per parameter (CPU smoke)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    grid = dict(warps=[4, 8, 16], rows=[1, 2, 4, 16], per_sm=[2, 4, 8, 16], chunk=[8, 16, 32, 64],
                stages=[1, 2, 3, 4], prefetch=[False, True], one_pass=[False, True])
    if args.quick:
        args.batch, args.seq, args.d, args.iters = 2, 8, 12, 1
        grid = dict(warps=[1, 2], rows=[1, 4], per_sm=[1, 2], chunk=[2, 4], stages=[1, 2], prefetch=[False, True],
                    one_pass=[False, True])
    for item in args.grid:
        name, _, values = item.partition("=")
        if name not in grid or not values:
            ap.error(f"--grid: expected NAME=V1,V2 with NAME one of {sorted(grid)}, got {item!r}")
        try:
            grid[name] = [bool(int(x)) if name in ("prefetch", "one_pass") else int(x) for x in values.split(",")]
        except ValueError:
            ap.error(f"--grid {name}: values must be integers (prefetch, one_pass: 0 or 1), got {values!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    states = ", ".join(f"{str(state_dtype(dv, torch.bfloat16)).removeprefix('torch.')} at d_v = {dv}" for dv in args.dvs)
    lines = [f"## tune_kernels on {name}, torch {torch.__version__}, library commit {library_commit()}", "",
             f"{args.batch} x {args.seq} tokens, d = {args.d}, K = {args.taps} taps; the inputs in the dtypes the model "
             f"passes each kernel under bf16 autocast (state: {states}; k and c bf16; v, beta and the weights fp32); "
             f"median ms of {args.iters} calls (CUDA events); GB/s = the launch arguments' bytes / time (the device's "
             f"peak: {peak_text(name)}); 'library' = the library's current choice, with the launch settings it makes",
             ""]
    results = []
    raise_clocks(device)
    for dv in args.dvs:
        a = inputs(args.batch, args.seq, args.d, dv, args.taps, device)
        for kname, (fn, params) in kernels(a).items():
            params = () if args.no_sweep else tuple(args.params) if args.params else params
            if args.only and kname not in args.only:
                continue
            default_ms = time_ms(fn, device, args.iters, warm=5)
            nbytes = traffic(fn)
            library = launch_settings(fn)
            rows = [dict(kernel=kname, dv=dv, setting="library", launch=library, ms=default_ms,
                         gbs=nbytes / default_ms / 1e6)]
            # a 4x smaller tile at d_v = 1: half the warps
            axes = dict(grid, warps=sorted({max(1, w // 2) for w in grid["warps"]})) if dv == 1 else grid
            for combo in itertools.product(*(axes[p] for p in params)):
                setting = dict(zip(params, combo))
                try:
                    with settings(**setting):
                        ms = time_ms(fn, device, args.iters)
                        nb = traffic(fn)
                    rows.append(dict(kernel=kname, dv=dv, setting=setting, ms=ms, gbs=nb / ms / 1e6))
                except Exception as e:  # a setting the compiler refuses (e.g. out of resources): say so, go on
                    rows.append(dict(kernel=kname, dv=dv, setting=setting, error=f"{type(e).__name__}: {e}"[:200]))
            best = min((r for r in rows if "ms" in r), key=lambda r: r["ms"])
            lines += [f"### {kname}, d_v = {dv}: library {default_ms:.3f} ms ({rows[0]['gbs']:.0f} GB/s); "
                      f"best {best['setting']} {best['ms']:.3f} ms ({best['gbs']:.0f} GB/s, "
                      f"{default_ms / best['ms']:.2f}x)", "", "| setting | ms | GB/s |", "| --- | --- | --- |",
                      f"| library: {library} | {default_ms:.3f} | {rows[0]['gbs']:.0f} |"]
            for r in sorted(rows[1:], key=lambda r: r.get("ms", float("inf"))):
                lines.append(f"| {r['setting']} | {r['ms']:.3f} | {r['gbs']:.0f} |" if "ms" in r
                             else f"| {r['setting']} | {r['error']} | |")
            lines.append("")
            print("\n".join(lines[-(len(rows) + 5):]), flush=True)
            results += rows
            (out / "tune_kernels.json").write_text(json.dumps(results, indent=1))
            (out / "tune_kernels.md").write_text("\n".join(lines) + "\n")
        del a
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
