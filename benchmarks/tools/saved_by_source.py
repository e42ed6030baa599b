"""What autograd keeps for backward, by the line of library code that saved it (no GPU needed).

The GPU's eager training path, run on CPU tensors: each DDL variant on the Triton backend inside
``count_traffic(dry=True)`` (the kernels' wrappers run and save what they save; the kernels are not launched, so
the values are meaningless and only shapes and dtypes count), the baseline as it runs anywhere, all under bf16
autocast. One forward per variant with saved-tensor hooks; each storage is counted once, parameters (and the
weights' autocast copies, which are the same for every variant) are left out. A row is one (source line, dtype,
last dimension): bytes per token per layer, and the number of tensors. The last table is each variant's rows
minus the baseline's, so it shows what a variant adds and what it no longer saves.

    PYTHONPATH=src python benchmarks/tools/saved_by_source.py [--variants baseline ddl-cc ddl-tc] [--preset small]
        [--layers 2] [--tokens 256]

Prints markdown. Counts are exact for this path; a compiled step saves what Inductor's partitioner chooses
around the custom ops, which this does not show.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import traceback

import torch

import deep_delta
from deep_delta.models.ddl.configuration_ddl import DDLConfig
from deep_delta.models.ddl.modeling_ddl import DDLForCausalLM
from deep_delta.ops.launch import count_traffic
from deep_delta.variants import PRESETS, VARIANTS

_PACKAGE = os.path.dirname(os.path.abspath(deep_delta.__file__)) + os.sep


def _source() -> str:
    """The innermost frame in the library's own code, as ``path:line function`` (path within the package)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(_PACKAGE):
            return f"{frame.filename[len(_PACKAGE):]}:{frame.lineno} {frame.name}"
    return "(outside the library)"


def saved_by_source(variant: str, preset: str, layers: int, tokens: int) -> dict[tuple[str, str, int], list[int]]:
    """{(source, dtype, last dim): [bytes per token per layer, tensors]} of one forward of ``variant``."""
    over = {"num_hidden_layers": layers}
    cfg = DDLConfig.from_variant(variant, preset, **over)
    if cfg.design.fused_kernels(cfg):  # the GPU's path: the Triton wrappers, a bf16 state under autocast
        state = {"state_dtype": "bfloat16"} if cfg.value_channels > 1 else {}
        cfg = DDLConfig.from_variant(variant, preset, delta_backend="triton", **over, **state)
    torch.manual_seed(0)
    model = DDLForCausalLM(cfg).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters()}  # the weights' autocast copies are told apart by shape
    if any(tokens in shape for shape in shapes):
        raise ValueError(f"`tokens` got {tokens}, a dimension of one of the weights, so activations could not be "
                         f"told from the weights' autocast copies by shape; allowed: any other length")
    found: dict[int, tuple[int, str, int, str]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() not in found and tuple(t.shape) not in shapes:
            found[st.data_ptr()] = (st.nbytes(), str(t.dtype).replace("torch.", ""),
                                    t.shape[-1] if t.dim() else 0, _source())
        return t

    ids = torch.zeros(1, tokens, dtype=torch.long)
    with count_traffic(dry=True), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(ids, labels=ids)
    rows: dict[tuple[str, str, int], list[int]] = collections.defaultdict(lambda: [0, 0])
    for nbytes, dtype, last, where in found.values():
        rows[(where, dtype, last)][0] += nbytes
        rows[(where, dtype, last)][1] += 1
    return {k: [round(b / tokens / layers), n] for k, (b, n) in rows.items()}


def _table(title: str, rows: dict, signed: bool = False) -> list[str]:
    fmt = "{:+,}" if signed else "{:,}"
    out = [f"### {title}", "", "| source | dtype | last dim | bytes / token / layer | tensors |",
           "| --- | --- | ---: | ---: | ---: |"]
    for (where, dtype, last), (b, n) in sorted(rows.items(), key=lambda kv: (-abs(kv[1][0]), kv[0])):
        if b:
            out.append(f"| `{where}` | {dtype} | {last} | {fmt.format(b)} | {fmt.format(n)} |")
    total = fmt.format(sum(b for b, _ in rows.values()))
    return out + ["", f"{'difference' if signed else 'total'}: {total} bytes / token / layer", ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", nargs="+", default=["baseline", "ddl-cc", "ddl-tc"], choices=list(VARIANTS))
    ap.add_argument("--preset", default="small", choices=list(PRESETS))
    ap.add_argument("--layers", type=int, default=2, help="num_hidden_layers (default 2; the rows are per layer)")
    ap.add_argument("--tokens", type=int, default=256, help="sequence length of the one batch row (default 256)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    for name in ("layers", "tokens", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if "baseline" not in args.variants:
        ap.error(f"--variants must include baseline (the differences are against it), got {' '.join(args.variants)}")
    torch.set_num_threads(args.threads)
    found = {v: saved_by_source(v, args.preset, args.layers, args.tokens) for v in args.variants}
    print(report(found, args.preset, args.layers, args.tokens))
    return 0


def report(found: dict[str, dict], preset: str, layers: int, tokens: int) -> str:
    """The markdown of :func:`saved_by_source`'s rows per variant (``found``, baseline included), each variant's
    table, then each DDL variant's rows minus the baseline's."""
    lines = [f"## Saved for backward by source: preset {preset}, {layers} layers, {tokens} tokens, "
             "bf16 autocast, the GPU's eager path (Triton wrappers, dry launches) on CPU", ""]
    for v in found:
        lines += _table(v, found[v])
    base, zero = found["baseline"], [0, 0]
    for v in found:
        if v == "baseline":
            continue
        diff = {k: [a - b for a, b in zip(found[v].get(k, zero), base.get(k, zero))] for k in set(found[v]) | set(base)}
        lines += _table(f"{v} minus baseline", diff, signed=True)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
