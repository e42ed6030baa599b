"""Registers and spills of every DDL Triton kernel compiled ahead of time for an H100 (sm_90), without a GPU.

Each op runs forward + backward at the small preset's shapes (d = 768, d_v = 4, K = 4 taps, n = 4 streams,
8 x 1024 tokens) on fake tensors inside ``count_traffic(dry=True, keep_calls=True)``, so nothing is launched or
allocated and every launch's kernel, arguments and meta-parameters are the ones the ops pass. Each distinct
launch is then compiled with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` at the num_warps the op chose
and at the other candidates, and ``cuobjdump --dump-resource-usage`` (shipped with Triton) reports the
registers per thread (REG) and the stack + local memory per thread (> 0: spills; ptxas spills to the stack frame). The specialisation follows Triton's JIT:
an int argument equal to 1 becomes a constant, pointers and ints divisible by 16 get the divisibility hint.

Slow (minutes on 2 CPU cores), not a test. Run from the repository root:

    PYTHONPATH=src python benchmarks/tools/kernel_resources.py \
        --out benchmarks/records/YYYY-MM-DD-kernel-resources-sm90-cpu/kernel_resources.md
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # the kernels must be JIT functions, not the interpreter's

import torch  # noqa: E402
import triton  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from deep_delta.ops.compress import channel_compress, embed_conv, token_compress  # noqa: E402
from deep_delta.ops.delta import (  # noqa: E402
    delta_update,
    update_and_channel_read,
    update_and_norm,  # noqa: E402
    update_and_token_read,
)
from deep_delta.ops.hyper import sinkhorn_knopp, stream_read, stream_write  # noqa: E402
from deep_delta.ops.launch import count_traffic  # noqa: E402
from deep_delta.ops.norm import norm_gate_value  # noqa: E402

D, DV, K, NS, BATCH, SEQ = 768, 4, 4, 4, 8, 1024
TARGET = GPUTarget("cuda", 90, 32)
WARPS = (2, 4, 8)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64", torch.int32: "i32"}


def op_steps(dtype: torch.dtype) -> dict:
    """name -> a forward + backward of one op on fake tensors (state and branch outputs in ``dtype``; gates,
    values, coefficients and weights fp32, as the layers make them)."""

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, dtype=dt).requires_grad_()

    x, k, v, beta = rnd(BATCH, SEQ, D, DV), rnd(BATCH, SEQ, D), rnd(BATCH, SEQ, DV, dt=torch.float32), rnd(
        BATCH, SEQ, 1, dt=torch.float32)
    c, w = rnd(D, DV, dt=torch.float32), rnd(K, D, DV, dt=torch.float32)
    e = rnd(BATCH, SEQ, D)
    h, f = rnd(BATCH, SEQ, D, NS), rnd(BATCH, SEQ, D)
    r, b, a = rnd(BATCH, SEQ, NS, NS, dt=torch.float32), rnd(BATCH, SEQ, NS, dt=torch.float32), rnd(
        BATCH, SEQ, NS, dt=torch.float32)
    rs, bs, as_ = rnd(NS, NS, dt=torch.float32), rnd(NS, dt=torch.float32), rnd(NS, dt=torch.float32)
    z = rnd(BATCH, SEQ, NS, NS, dt=torch.float32)
    # the sublayer's source row as the models pass it (the state's dtype; read in the norm weight's dtype), c
    # written in that dtype under autocast (norm_output="autocast"), fp32 otherwise
    src = rnd(BATCH, SEQ, D)
    c_dtype = None if dtype == torch.float32 else dtype
    norm_weights = (rnd(D, dt=torch.float32), rnd(1, D, dt=torch.float32), rnd(1, dt=torch.float32),
                    rnd(DV, D, dt=torch.float32), rnd(DV, dt=torch.float32))

    # a d_v = 1 update (its state fp32, as the models keep it) fused with the next sublayer's norm, gate and value
    x1, v1 = rnd(BATCH, SEQ, D, dt=torch.float32), rnd(BATCH, SEQ, 1, dt=torch.float32)
    norm_weights1 = (rnd(D, dt=torch.float32), rnd(1, D, dt=torch.float32), rnd(1, dt=torch.float32),
                     rnd(1, D, dt=torch.float32), rnd(1, dt=torch.float32))

    leaves = [x, k, v, beta, c, w, e, h, f, r, b, a, rs, bs, as_, z, src, *norm_weights, x1, v1, *norm_weights1]

    def back(out):  # the op's backward: the gradients of every input it reads (none accumulated into .grad)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.grad(outs, leaves, [torch.ones_like(o) for o in outs], allow_unused=True)

    t = "triton"
    return {
        "delta update": lambda: back(delta_update(x, k, v, beta, backend=t)),
        "update + CC read": lambda: back(update_and_channel_read(x, k, v, beta, c, backend=t)),
        "update + TC read": lambda: back(update_and_token_read(x, k, v, beta, w, backend=t)),
        "CC read": lambda: back(channel_compress(x, c, backend=t)),
        "TC read": lambda: back(token_compress(x, w, backend=t)),
        "EC expansion": lambda: back(embed_conv(e, w, backend=t)),
        "HC write (per token)": lambda: back(stream_write(h, r, b, f, backend=t)),
        "HC write (static)": lambda: back(stream_write(h, rs, bs, f, backend=t)),
        "HC read (per token)": lambda: back(stream_read(h, a, backend=t)),
        "HC read (static)": lambda: back(stream_read(h, as_, backend=t)),
        "Sinkhorn-Knopp": lambda: back(sinkhorn_knopp(z, 20, 1e-6, backend=t)),
        "norm + gate + value": lambda: back(norm_gate_value(src, *norm_weights, eps=1e-5, beta_max=2.0,
                                                            value_scale=4.0, c_dtype=c_dtype, backend=t)),
        "update + CC read + next norm": lambda: back(update_and_norm(
            x, k, v, beta, *norm_weights, read=c, k_eps=1e-5, eps=1e-5, beta_max=2.0, value_scale=4.0, c_dtype=c_dtype,
            backend=t)),
        "update + next norm (d_v = 1)": lambda: back(update_and_norm(
            x1, k, v1, beta, *norm_weights1, k_eps=1e-5, eps=1e-5, beta_max=2.0, value_scale=4.0, c_dtype=c_dtype,
            backend=t)),
    }


def captured_launches(dtype: torch.dtype, ops: list[str] | None = None) -> list[tuple[str, object, tuple, dict]]:
    """(op, kernel, args, meta) of every launch of every op (or of the ops named in ``ops``), in order (fake
    tensors, dry launches)."""
    out = []
    with FakeTensorMode():
        steps = op_steps(dtype)
        unknown = sorted(set(ops or ()) - set(steps))
        if unknown:
            raise ValueError(f"--ops: unknown op(s) {unknown}; allowed: {sorted(steps)}")
        for op, step in steps.items():
            if ops and op not in ops:
                continue
            with count_traffic(dry=True, keep_calls=True) as counter:
                step()
            out += [(op, kernel, args, meta) for kernel, _, args, meta in counter.calls]
    return out


def source(kernel, args: tuple, meta: dict) -> tuple[ASTSource, str]:
    """The kernel specialised as Triton's JIT would for these arguments, and a short label of its constants."""
    names = kernel.arg_names
    sig, consts, attrs = {}, {}, {}
    for i, (name, arg) in enumerate(zip(names, args)):
        if isinstance(arg, torch.Tensor):
            sig[name] = "*" + TYPES[arg.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch allocations are 16-byte aligned
        elif isinstance(arg, bool):
            sig[name] = "i1"
        elif isinstance(arg, int):
            if arg == 1:
                sig[name], consts[(i,)] = "constexpr", 1
                continue
            sig[name] = "i32" if -(2**31) <= arg < 2**31 else "i64"
            if arg % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(arg, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}: argument {name} of type {type(arg)}")
    label = []
    for name in names[len(args):]:
        i = names.index(name)
        sig[name], consts[(i,)] = "constexpr", meta[name]
        label.append(f"{name}={meta[name]}")
    return ASTSource(kernel, sig, constexprs=consts, attrs=attrs), " ".join(label)


def resources(src: ASTSource, num_warps: int, tmp: str) -> tuple[int, int]:
    """(registers per thread, stack + local memory bytes per thread) of ``src`` compiled for sm_90 at
    ``num_warps``: ptxas puts spilled registers in the stack frame (STACK), so both count as spills."""
    compiled = triton.compile(src, target=TARGET, options={"num_warps": num_warps})
    path = os.path.join(tmp, "k.cubin")
    with open(path, "wb") as fh:
        fh.write(compiled.asm["cubin"])
    text = subprocess.run([CUOBJDUMP, "--dump-resource-usage", path], capture_output=True, text=True,
                          check=True).stdout
    reg, local, stack = (re.search(rf"{field}:(\d+)", text) for field in ("REG", "LOCAL", "STACK"))
    return int(reg.group(1)), int(local.group(1)) + int(stack.group(1))


def report(dtypes: list[torch.dtype], warps: tuple[int, ...], progress, ops: list[str] | None = None) -> str:
    rows, seen = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in dtypes:
            for op, kernel, args, meta in captured_launches(dtype, ops):
                src, label = source(kernel, args, meta)
                key = (kernel.__name__, tuple(sorted(src.signature.items())), label)
                if key in seen:
                    continue
                seen.add(key)
                chosen = meta.get("num_warps", 4)
                cells = []
                for nw in sorted(set(warps) | {chosen}):
                    t0 = time.time()
                    reg, local = resources(src, nw, tmp)
                    mark = "**" if nw == chosen else ""
                    cells.append(f"{mark}{nw}: {reg} / {local}{mark}")
                    progress(f"{op} {kernel.__name__} {TYPES[dtype]} {label} warps {nw}: REG {reg} STACK+LOCAL {local} "
                             f"({time.time() - t0:.1f} s)")
                rows.append(f"| {op} | `{kernel.__name__.lstrip('_')}` | {TYPES[dtype]} | {label} | "
                            + "; ".join(cells) + " |")
    head = ["### DDL kernels compiled for an H100 (sm_90) without a GPU: registers / stack + local bytes per num_warps", "",
            f"Small preset shapes: d = {D}, d_v = {DV}, K = {K} taps, n = {NS} streams, {BATCH} x {SEQ} tokens; "
            "state and branch outputs in the dtype column, gates, coefficients and weights fp32. Each cell is "
            "`num_warps: registers per thread / stack + local bytes per thread` (> 0: spilled registers); **bold**: the num_warps the "
            "op launches with. Hopper has 65,536 registers per SM, at most 255 per thread.", "",
            "| op | kernel | dtype | constants | num_warps: REG / STACK+LOCAL |", "| --- | --- | --- | --- | --- |"]
    return "\n".join(head + rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    p.add_argument("--warps", nargs="+", type=int, default=list(WARPS))
    p.add_argument("--ops", nargs="+", default=None, metavar="OP",
                   help="only these ops, by their row name (e.g. 'update + TC read'); default: every op")
    p.add_argument("--out", default=None, help="also write the markdown table to this file")
    args = p.parse_args(argv)
    try:
        text = report([getattr(torch, n) for n in args.dtypes], tuple(args.warps),
                      lambda m: print(m, file=sys.stderr, flush=True), args.ops)
    except ValueError as err:
        p.error(str(err))
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
