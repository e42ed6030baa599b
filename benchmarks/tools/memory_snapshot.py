"""What a compiled training step keeps at its memory peak, by source line (issue 40, item 6; needs a CUDA GPU).

For each variant (default baseline, ddl-dv1, ddl-cc) at the small preset, 32 x 1024 tokens, bf16 autocast, each block
compiled as ``ddl train --set compile=true`` compiles it (``deep_delta.eval.step_bench.StepSubject``): two untimed
steps (compilation, the optimizer state), then one step with ``torch.cuda.memory._record_memory_history`` on, in
the trainer step's three phases (forward, backward, optimizer: clip, AdamW, zero_grad). Writes, under ``--out``:

- ``<variant>.pickle``: the snapshot (``torch.cuda.memory._dump_snapshot``; open it at pytorch.org/memory_viz);
- ``memory_snapshot.md``: per variant the peak of the recorded step (the live allocations' sum over the trace)
  and ``torch.cuda.max_memory_allocated``, the phase the peak falls in, and what is live at the peak grouped by its
  source: the innermost frame in this library (``src/deep_delta/...:line function``), else the innermost frame of
  torch (``torch/...``), else ``(no Python frame)`` (allocations made before recording began, e.g. the weights,
  appear only in the allocator's segments, not in the trace: reported apart as "allocated before the step"); and the
  difference of each variant from the baseline by source.

    python benchmarks/tools/memory_snapshot.py --out DIR [--variants baseline ddl-dv1 ddl-cc] [--batch 32 --seq 1024]

The reading of the pickles (what the compiled DDL variants' extra memory is) goes into the record with them. The
summary (:func:`live_at_peak`, :func:`by_source`) is plain Python over the snapshot's trace events and is tested
on CPU with a synthetic trace (tests/benchmarks/test_memory_snapshot.py).
"""

from __future__ import annotations

import argparse
import pickle
from collections import Counter
from pathlib import Path

MIB = 2**20


def source_of(frames: list[dict]) -> str:
    """The allocation's source: its innermost frame in this library, else in torch, else "(no Python frame)"."""
    for marker, prefix in (("deep_delta/", "src/deep_delta/"), ("torch/", "torch/")):
        for f in frames:
            name = f.get("filename", "")
            if marker in name:
                return f"{prefix}{name.split(marker, 1)[1]}:{f.get('line', '?')} {f.get('name', '')}".rstrip()
    return "(no Python frame)"


def live_at_peak(events: list[dict]) -> tuple[int, int, dict[int, dict]]:
    """(peak bytes, index of the event that reached it, the allocations live then: addr -> event) over a device's
    trace: "alloc" adds a block, "free_completed" removes it (the caching allocator's own segment events are not
    allocations). A block freed that the trace never saw allocated (made before recording) is ignored."""
    live: dict[int, int] = {}
    total = peak = 0
    at = -1
    for i, ev in enumerate(events):
        action, addr = ev.get("action"), ev.get("addr")
        if action == "alloc":
            live[addr] = ev["size"]
            total += ev["size"]
            if total > peak:
                peak, at = total, i
        elif action == "free_completed" and addr in live:
            total -= live.pop(addr)
    blocks: dict[int, dict] = {}
    for ev in events[: at + 1]:  # replay up to the peak to name what is live there
        if ev.get("action") == "alloc":
            blocks[ev["addr"]] = ev
        elif ev.get("action") == "free_completed":
            blocks.pop(ev.get("addr"), None)
    return peak, at, blocks


def by_source(blocks: dict[int, dict]) -> Counter:
    """Bytes live at the peak per source (:func:`source_of`)."""
    out: Counter = Counter()
    for ev in blocks.values():
        out[source_of(ev.get("frames", []))] += ev["size"]
    return out


def phase_of(index: int, boundaries: list[tuple[str, int]]) -> str:
    """The phase of event ``index``: the first phase whose end (a trace length) lies past it."""
    for phase, end in boundaries:
        if index < end:
            return phase
    return boundaries[-1][0] if boundaries else "?"


def record_step(subject, boundaries: list[tuple[str, int]]) -> dict:
    """One training step of ``subject`` (a StepSubject) in its three phases, recorded; returns the snapshot."""
    import torch

    dev = torch.cuda.current_device()

    def mark(phase: str) -> None:
        torch.cuda.synchronize()
        boundaries.append((phase, len(torch.cuda.memory._snapshot()["device_traces"][dev])))

    step = subject.step  # the trainer's OptimizerStep, in its three parts
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        loss = step.forward(subject.x, subject.y)
        mark("forward")
        step.accumulate_gradients(loss)
        mark("backward")
        step.update(loss.detach())
        mark("optimizer")
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return snap


def run(variant: str, args, out: Path) -> dict:
    import torch

    from deep_delta.eval.step_bench import StepSubject

    torch.cuda.empty_cache()
    subject = StepSubject(variant, "small", batch_size=args.batch, seq_len=args.seq, device="cuda", dtype="bfloat16",
                          compile=True)
    for _ in range(2):
        subject.train_step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    boundaries: list[tuple[str, int]] = []
    snap = record_step(subject, boundaries)
    with open(out / f"{variant}.pickle", "wb") as f:
        pickle.dump(snap, f)
    events = snap["device_traces"][torch.cuda.current_device()]
    peak, at, blocks = live_at_peak(events)
    result = dict(variant=variant, before=before, peak=peak, max_allocated=torch.cuda.max_memory_allocated(),
                  phase=phase_of(at, boundaries), sources=by_source(blocks))
    del subject
    return result


def markdown(results: list[dict], top: int) -> str:
    lines = []
    base = next((r for r in results if r["variant"] == "baseline"), None)
    lines += ["| variant | allocated before the step MiB | step's own peak MiB | max_memory_allocated MiB | peak in |",
              "| --- | --- | --- | --- | --- |"]
    for r in results:
        lines.append(f"| {r['variant']} | {r['before'] / MIB:,.1f} | {r['peak'] / MIB:,.1f} | "
                     f"{r['max_allocated'] / MIB:,.1f} | {r['phase']} |")
    for r in results:
        lines += ["", f"#### {r['variant']}: live at the peak by source (top {top}, MiB)", "",
                  "| source | MiB | minus the baseline's |", "| --- | --- | --- |"]
        for src, size in r["sources"].most_common(top):
            diff = (size - base["sources"].get(src, 0)) / MIB if base else float("nan")
            lines.append(f"| `{src}` | {size / MIB:,.1f} | {diff:+,.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import torch
    from tune_kernels import library_commit  # this directory's tool (run as a script: it is on sys.path)

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for the pickles and memory_snapshot.md")
    p.add_argument("--variants", nargs="+", default=["baseline", "ddl-dv1", "ddl-cc"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--top", type=int, default=15, help="sources listed per variant")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("memory_snapshot.py: needs a CUDA GPU (torch.cuda.memory's history is CUDA-only)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = [run(v, args, out) for v in args.variants]
    head = (f"### Memory of one compiled training step (preset small, {args.batch} x {args.seq}, bf16 autocast, "
            f"blocks compiled), {torch.cuda.get_device_name()}, torch {torch.__version__}, commit {library_commit()}\n\n")
    text = head + markdown(results, args.top)
    (out / "memory_snapshot.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
