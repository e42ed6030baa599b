"""Size a CPU study: the training step of small deep models, eager against compiled blocks, and one process at
2 threads against two processes at 1 thread each (issue 57, item 4: "measure before you size it").

    python benchmarks/tools/cpu_step_sizing.py --variants baseline ddl-cc --width 64 --layers 12 --out sizing.json

Every case runs in its own process (threads are a per-process setting, and a compiled model keeps its graphs):
``--mode single`` times one process; ``--mode pair`` starts two identical processes at once and reports each one's
time, so that the throughput of two runs side by side can be set against one run with both threads. Each process
builds the model of ``--variant`` at the given shape (vocab 257, the byte tokenizer), runs ``--steps`` optimizer
steps of the trainer's kind (forward, backward, clipping, AdamW) on random token ids and reports the median of the
steps after ``--warmup``. The figures depend on what else the machine runs: say so with them.

Bad values are refused in one line on stderr (exit 1) in the parent, before any sizing process starts: a variant
the library does not have, a size below its minimum (``--width``, ``--layers``, ``--batch``, ``--steps`` at least 1,
``--seq`` at least 2, ``--warmup`` at least 0), a shape that makes no model of a variant (the library's check, e.g.
an odd head size), an ``--out`` in a folder that does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# each size's smallest value and what it sizes
MINIMUM = {"width": (1, "the hidden size"), "layers": (1, "blocks"), "batch": (1, "sequences per step"),
           "seq": (2, "tokens per sequence; a next-token loss needs two"), "steps": (1, "timed steps"),
           "warmup": (0, "untimed steps first")}


def config(variant: str, width: int, layers: int, seq: int):
    """The model of ``variant`` at the sizing shape (vocab 257, the byte tokenizer; a head per 32 channels)."""
    from deep_delta import DDLConfig

    return DDLConfig.from_variant(variant, "tiny", hidden_size=width, num_hidden_layers=layers,
                                  num_attention_heads=max(1, width // 32), vocab_size=257,
                                  max_position_embeddings=seq)


def check(args: argparse.Namespace) -> None:
    """Refuse bad values in one line, before any sizing process starts."""
    from deep_delta.variants import VARIANTS

    for v in args.variants:
        if v not in VARIANTS:
            raise SystemExit(f"cpu_step_sizing.py: --variants got {v!r}; allowed: {', '.join(VARIANTS)}")
    for name, (least, what) in MINIMUM.items():
        if getattr(args, name) < least:
            raise SystemExit(f"cpu_step_sizing.py: --{name} got {getattr(args, name)}; allowed: a whole number >= "
                             f"{least} ({what})")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise SystemExit(f"cpu_step_sizing.py: --out got {args.out!r}, but its folder does not exist; allowed: a file "
                         "in an existing folder")
    for v in args.variants:
        try:
            config(v, args.width, args.layers, args.seq)
        except ValueError as e:
            raise SystemExit(f"cpu_step_sizing.py: --width {args.width} --layers {args.layers} --seq {args.seq} makes "
                             f"no {v} model: {e}") from None


def one(variant: str, width: int, layers: int, batch: int, seq: int, threads: int, compiled: bool, steps: int,
        warmup: int) -> dict:
    import torch

    from deep_delta import DDLForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = config(variant, width, layers, seq)
    model = DDLForCausalLM(cfg).train()
    if compiled:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * layers)
        for block in model.model.layers:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 257, (batch, seq), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(warmup + steps):
        t = time.perf_counter()
        model(ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    step = statistics.median(times[warmup:])
    return {"variant": variant, "width": width, "layers": layers, "batch": batch, "seq": seq, "threads": threads,
            "compiled": compiled, "step_s": step, "tokens_per_s": batch * seq / step}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["baseline", "ddl-cc"])
    sizes = {"width": 64, "layers": 12, "batch": 16, "seq": 256, "steps": 5, "warmup": 3}  # the model, batch, timing
    for name, default in sizes.items():
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", nargs=3, metavar=("VARIANT", "THREADS", "COMPILED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        variant, threads, compiled = args.child[0], int(args.child[1]), args.child[2] == "1"
        print(json.dumps(one(variant, args.width, args.layers, args.batch, args.seq, threads, compiled, args.steps,
                             args.warmup)))
        return 0
    check(args)
    shape = [item for name in sizes for item in (f"--{name}", str(getattr(args, name)))]

    def start(variant: str, threads: int, compiled: bool) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, __file__, *shape, "--child", variant, str(threads),
                                 "1" if compiled else "0"], stdout=subprocess.PIPE, text=True)

    def result(proc: subprocess.Popen) -> dict:
        out, _ = proc.communicate(timeout=3600)
        if proc.returncode:
            raise SystemExit(f"a sizing process failed (rc {proc.returncode})")
        return json.loads(out.strip().splitlines()[-1])

    rows = []
    for variant in args.variants:
        for compiled in (False, True):
            for threads in (1, 2):
                rows.append({"mode": "single", **result(start(variant, threads, compiled))})
            pair = [start(variant, 1, compiled) for _ in range(2)]
            for r in map(result, pair):
                rows.append({"mode": "pair", **r})
    for r in rows:
        print(f"{r['variant']:>14} {'compiled' if r['compiled'] else 'eager':>8} {r['mode']:>6} {r['threads']}t "
              f"{1000 * r['step_s']:7.0f} ms/step {r['tokens_per_s']:7.0f} tok/s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
