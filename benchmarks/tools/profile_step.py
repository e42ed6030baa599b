"""Where does a training step's time go on a GPU? (a development probe, not part of the library)

For each variant: median time of the trainer's own step (:class:`deep_delta.train.step.OptimizerStep`: fwd +
bwd under bf16 autocast over fp32 weights, clipping at 1.0, the fused AdamW ``ddl train`` builds; what ``ddl
bench`` times; built by ``train.step.build_step``) with each delta backend asked for (default ``auto``, what ``ddl bench`` runs, and the lean
``torch``), the summed GPU kernel time of one step from torch.profiler (the device-side events only: an op's
self device time and its kernels' would count each kernel twice; wall >> kernel sum means the host is the
bottleneck), the host-device syncs, and the top ops by self CPU / device time. Optionally times the step with
its blocks compiled, as ``ddl train --set compile=true`` (--compile).

    python benchmarks/tools/profile_step.py --out DIR [--compile] [--batch 8 --seq 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from deep_delta.models import DDLConfig, DDLForCausalLM


def build(variant, backend, preset, seq, device, compile=False):
    """The model and its training step as the trainer builds it (``train.step.build_step``: bf16 autocast, the
    fused AdamW, clipping at 1.0; ``compile``: the blocks compiled, as ``ddl train --set compile=true``)."""
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.distributed import DistInfo
    from deep_delta.train.step import build_step

    torch.manual_seed(0)
    cfg = DDLConfig.from_variant(variant, preset, delta_backend=backend, max_position_embeddings=max(seq, 1024))
    model = DDLForCausalLM(cfg).to(device).train()
    run = TrainConfig(variant=variant, preset=preset, device=str(device), dtype="bfloat16", lr=1e-4, compile=compile)
    return model, build_step(model, run, DistInfo(device=device)).step


def step_fn(step, ids, tgt):
    """The trainer's step on (ids, tgt)."""
    return lambda: step([(ids, tgt)])


def timed(fn, n=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def prof(fn, out: Path, tag: str):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    ka = p.key_averages()
    # us -> s; the device-side events only (an op's self device time is its kernels' time: both would count it)
    dev = sum(e.self_device_time_total for e in ka if e.device_type == torch.autograd.DeviceType.CUDA) / 1e6
    syncs = {e.key: e.count for e in ka if any(s in e.key for s in ("Synchronize", "cudaMemcpy", "_local_scalar_dense", "item"))}
    launches = sum(e.count for e in ka if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"))
    with open(out / "tables.txt", "a") as f:
        for key in ("self_cpu_time_total", "self_device_time_total"):
            f.write(f"\n##### {tag} by {key}\n")
            f.write(ka.table(sort_by=key, row_limit=25, max_name_column_width=70))
    return {"wall_s": wall, "kernel_sum_s": dev, "launches": launches, "syncs": syncs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gpu_out")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--variants", default="baseline,ddl-dv1,ddl-cc,ddl-tc")
    ap.add_argument("--backends", default="auto,torch", help="delta backends of the eager runs (auto: what ddl "
                    "bench runs)")
    ap.add_argument("--compile", default="", help="comma list variant:backend to time under torch.compile")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    results = {}
    for variant in a.variants.split(","):
        for backend in (a.backends.split(",") if variant != "baseline" else ["torch"]):
            model, step = build(variant, backend, a.preset, a.seq, dev)
            ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=g).to(dev)
            tgt = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=g).to(dev)
            fn = step_fn(step, ids, tgt)
            t = timed(fn)
            r = prof(fn, out, f"{variant}_{backend}")
            r["step_s"] = t
            results[f"{variant}/{backend}"] = r
            print(f"{variant:10s} {backend:6s} step {t*1e3:7.1f} ms  profiled wall {r['wall_s']*1e3:7.1f} ms  "
                  f"kernel sum {r['kernel_sum_s']*1e3:7.1f} ms  launches {r['launches']:5d}  syncs {r['syncs']}", flush=True)
            del model, step
            torch.cuda.empty_cache()
    for item in filter(None, a.compile.split(",")):
        variant, backend = item.split(":")
        torch._dynamo.reset()
        t0 = time.perf_counter()
        try:
            model, step = build(variant, backend, a.preset, a.seq, dev, compile=True)  # the blocks, as ddl train
            ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=g).to(dev)
            tgt = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), generator=g).to(dev)
            fn = step_fn(step, ids, tgt)
            fn()
            torch.cuda.synchronize()
            ct = time.perf_counter() - t0
            t = timed(fn)
            r = prof(fn, out, f"compiled_{variant}_{backend}")
            r.update(step_s=t, compile_s=ct)
            results[f"compiled {variant}/{backend}"] = r
            print(f"compiled {variant:10s} {backend:6s} step {t*1e3:7.1f} ms  (compile {ct:.0f} s)  kernel sum "
                  f"{r['kernel_sum_s']*1e3:7.1f} ms  launches {r['launches']}", flush=True)
        except Exception as err:
            print(f"compiled {variant} {backend}: {type(err).__name__}: {str(err)[:600]}", flush=True)
        model = step = None
        torch.cuda.empty_cache()
    (out / "profile.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
