"""Decode tokens/s of every variant: eager with the dynamic cache (what ``generate()`` does) against the
fixed-shape cache and one compiled step (``StaticDecoder``; CUDA graphs on CUDA) -- without ``ddl bench
--compile``'s compiled training step, whose compilation a short device call cannot afford (a development probe).

Per variant and repeat: prefill T - n tokens of B random sequences (untimed), then n greedy one-token steps
timed; the variants interleaved, median of ``--repeats``; ratios against the baseline of the same run.

    python benchmarks/tools/decode_probe.py --out DIR [--preset small --batch 8 --seq 1024 --tokens 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from deep_delta.eval.bench import BenchSubject
from deep_delta.eval.settings import BenchSettings
from deep_delta.eval.timing import interleaved
from deep_delta.models.ddl import output_cache


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--variants", nargs="+", default=["baseline", "ddl-dv1", "ddl-cc", "ddl-tc"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    n = args.tokens
    # `ddl bench`'s own subjects and decode loops, without its compiled training step (not compiled unless run)
    s = BenchSettings(args.preset, args.variants, str(device), args.dtype, args.batch, args.seq,
                      decode_tokens=n).resolved()
    subs = {v: BenchSubject(v, s, device) for v in args.variants}

    @torch.no_grad()
    def agree(v):
        """Largest |logit difference| of the compiled static step against the eager dynamic cache, fed the same
        tokens, relative to the largest |logit| (bf16 rounding differs between the two: about 1e-2)."""
        sub, steps = subs[v], min(4, n)  # the cache holds n positions past the prompt
        m, dec, ids = sub.model, sub.decoder, sub.x[:, : args.seq - n]
        with sub.autocast:
            dec.reset()
            ls = [dec.prefill(ids)]
            toks = []
            for _ in range(steps):
                toks.append(ls[-1].argmax(-1))
                ls.append(dec.step(toks[-1]))
            out = m(input_ids=ids, use_cache=True, logits_to_keep=1)
            le = [out.logits[:, -1]]
            for tok in toks:
                out = m(input_ids=tok[:, None], cache=output_cache(out), use_cache=True)
                le.append(out.logits[:, -1])
        return max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(ls, le))

    t0 = time.perf_counter()
    err = {}
    for v in args.variants:  # compile (and capture the graphs) once, untimed, reported
        s = time.perf_counter()
        subs[v].decode(static=True)
        err[v] = agree(v)
        print(f"{v}: first static decode (compilation) {time.perf_counter() - s:.1f} s; static vs eager logits: "
              f"max relative difference {err[v]:.2e}", flush=True)
    cases = {f"{v} {kind}": (lambda v=v, st=st: subs[v].decode(static=st))
             for kind, st in (("eager", False), ("static", True)) for v in args.variants}
    samples = interleaved(cases, args.repeats, warmup=1)
    rate = {k: args.batch * n / statistics.median(s) for k, s in samples.items()}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    lines = [f"## decode_probe on {name}, torch {torch.__version__}: preset {args.preset}, {args.batch} sequences, "
             f"{n} steps after a {args.seq - n}-token prefill, {args.dtype}; median of {args.repeats} interleaved",
             "", "| variant | eager, dynamic cache tok/s | vs baseline | static + compiled tok/s | vs baseline | "
             "static / eager | static vs eager logits |", "| --- | --- | --- | --- | --- | --- | --- |"]
    base = args.variants[0]
    for v in args.variants:
        e, s = rate[f"{v} eager"], rate[f"{v} static"]
        lines.append(f"| {v} | {e:.0f} | {e / rate[f'{base} eager']:.2f}x | {s:.0f} | "
                     f"{s / rate[f'{base} static']:.2f}x | {s / e:.2f}x | {err[v]:.1e} |")
    lines.append(f"\n(total {time.perf_counter() - t0:.0f} s)")
    print("\n".join(lines), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode_probe.md").write_text("\n".join(lines) + "\n")
    (out / "decode_probe.json").write_text(json.dumps({k: s for k, s in samples.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
