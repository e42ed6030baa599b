"""benchmarks/tools/memory_snapshot.py's summary (the GPU run itself needs a device): the peak over a trace of
allocations and frees, what is live there grouped by source line, the phase it falls in, and the table."""

from __future__ import annotations

from collections import Counter

from helpers import load_tool


def load():
    return load_tool("memory_snapshot")


def frame(path, line, name):
    return {"filename": path, "line": line, "name": name}


OURS = [frame("/site/torch/nn/functional.py", 10, "linear"),
        frame("/repo/src/deep_delta/ops/delta/triton.py", 42, "triton_forward")]
TORCH = [frame("/site/torch/_inductor/output_code.py", 7, "run")]


def trace():
    """1000 B of torch's and 300 B of ours: 1300 B at event 1, the peak; the torch block freed, then 500 B of
    torch's and 64 B without frames (864 B live); a free of a block allocated before recording (ignored), an
    allocator segment event (not an allocation), frees, and a 700 B block at the end (under the peak)."""
    return [
        {"action": "alloc", "addr": 1, "size": 1000, "frames": TORCH},
        {"action": "alloc", "addr": 2, "size": 300, "frames": OURS},
        {"action": "free_requested", "addr": 1, "size": 1000},
        {"action": "free_completed", "addr": 1, "size": 1000},
        {"action": "alloc", "addr": 3, "size": 500, "frames": TORCH},
        {"action": "alloc", "addr": 4, "size": 64, "frames": []},
        {"action": "free_completed", "addr": 99, "size": 4096},
        {"action": "segment_alloc", "addr": 5, "size": 2 << 20},
        {"action": "free_completed", "addr": 2, "size": 300},
        {"action": "free_completed", "addr": 3, "size": 500},
        {"action": "alloc", "addr": 6, "size": 700, "frames": OURS},
    ]


def test_peak_and_what_is_live_there():
    mod = load()
    peak, at, blocks = mod.live_at_peak(trace())
    assert (peak, at) == (1300, 1)  # 1000 + 300 before the first free; later 300 + 500 + 64 = 864 stays under it
    assert set(blocks) == {1, 2}
    assert mod.by_source(blocks) == Counter({"torch/_inductor/output_code.py:7 run": 1000,
                                             "src/deep_delta/ops/delta/triton.py:42 triton_forward": 300})


def test_a_later_higher_peak_replaces_the_earlier_one():
    mod = load()
    events = trace()[:6] + [{"action": "alloc", "addr": 7, "size": 600, "frames": OURS}]
    peak, at, blocks = mod.live_at_peak(events)
    assert (peak, at) == (300 + 500 + 64 + 600, 6) and set(blocks) == {2, 3, 4, 7}
    sources = mod.by_source(blocks)
    assert sources["src/deep_delta/ops/delta/triton.py:42 triton_forward"] == 900
    assert sources["(no Python frame)"] == 64
    assert mod.phase_of(6, [("forward", 3), ("backward", 7), ("optimizer", 9)]) == "backward"
    assert mod.phase_of(0, [("forward", 3), ("backward", 7)]) == "forward"


def test_markdown_lists_each_variant_and_the_difference_from_the_baseline():
    mod = load()
    base = dict(variant="baseline", before=1 << 20, peak=3 << 20, max_allocated=4 << 20, phase="backward",
                sources=Counter({"a": 2 << 20, "b": 1 << 20}))
    ddl = dict(variant="ddl-cc", before=1 << 20, peak=5 << 20, max_allocated=6 << 20, phase="forward",
               sources=Counter({"a": 2 << 20, "c": 3 << 20}))
    text = mod.markdown([base, ddl], top=5)
    assert "| ddl-cc | 1.0 | 5.0 | 6.0 | forward |" in text
    assert "| `c` | 3.0 | +3.0 |" in text and "| `a` | 2.0 | +0.0 |" in text
