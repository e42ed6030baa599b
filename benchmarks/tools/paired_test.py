"""The test loss of one design of one study against one design of another, paired by evaluation seed: how two
held-out comparisons that share their evaluation seeds, test windows and data (e.g. studies/deep12e's baseline
with the embedding norm and its `old_baseline`, without it) stand against each other, overall and per source.

    python benchmarks/tools/paired_test.py A_OUT:VARIANT B_OUT:VARIANT [--json FILE]

Each side is the ``--out`` of a ``ddl compare --eval-seeds`` and a variant of it; its evaluation runs' test.json
(``OUT/evaluation/seed_S/VARIANT/test.json``) are read, never the reports. The two sides must have been measured on
the same test windows (tokens and plan) of the same data (fingerprint) at the same evaluation seeds; a seed one side
lacks is left out and said. Prints A minus B: the mean paired difference with its 95% t-interval and the seeds in
which A was lower, then the same for each source the records name (prose-v1's packages).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deep_delta.experiments.held_out_split import measured_windows, read_test
from deep_delta.experiments.plan import EVAL_DIR
from deep_delta.experiments.stats import mean_sd, paired_difference


def side(spec: str) -> tuple[Path, str, dict[int, dict]]:
    """``OUT:VARIANT`` -> (OUT, VARIANT, {seed: its test record}); refused, naming the path, when none is there."""
    out, sep, variant = spec.rpartition(":")
    if not sep or not out or not variant:
        raise SystemExit(f"paired_test: {spec!r} is not OUT:VARIANT (e.g. runs/deep12e/old_baseline:baseline)")
    root = Path(out) / EVAL_DIR
    records = {}
    for seed_dir in sorted(root.glob("seed_*")) if root.is_dir() else []:
        record = read_test(seed_dir / variant) if seed_dir.name[5:].isdigit() else None
        if record is not None:
            records[int(seed_dir.name[5:])] = record
    if not records:
        raise SystemExit(f"paired_test: {root}/seed_*/{variant}/test.json: none found (a finished `ddl compare "
                         "--eval-seeds` study's --out, and one of its variants)")
    return Path(out), variant, records


def compare(a: dict[int, dict], b: dict[int, dict]) -> dict:
    """A minus B over the seeds both have, overall and per source; refused when their windows or data differ."""
    for key, what in (("tokens", "test tokens"), ("data_fingerprint", "data")):
        values = {r.get(key) for r in (*a.values(), *b.values())}
        if len(values) > 1:
            raise SystemExit(f"paired_test: the two sides were measured on different {what} ({sorted(map(str, values))})")
    plans = {measured_windows(r) for r in (*a.values(), *b.values())}
    if len(plans) > 1:
        raise SystemExit(f"paired_test: the two sides were measured on windows of different plans ({sorted(plans)})")
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise SystemExit(f"paired_test: no evaluation seed in common (A: {sorted(a)}, B: {sorted(b)})")

    def row(get) -> dict:
        xs, ys = [get(a[s]) for s in seeds], [get(b[s]) for s in seeds]
        return {"a": mean_sd(xs)[0], "b": mean_sd(ys)[0], **paired_difference(xs, ys)}

    sources = sorted({name for r in (*a.values(), *b.values()) for name in (r.get("sources") or {})})
    return {"seeds": seeds, "left_out": sorted(set(a) ^ set(b)), "tokens": next(iter(a.values()))["tokens"],
            "windows": plans.pop(), "overall": row(lambda r: r["loss"]),
            "sources": {name: row(lambda r, n=name: ((r.get("sources") or {}).get(n) or {}).get("loss"))
                        for name in sources}}


def text(result: dict, a: str, b: str) -> str:
    def line(name: str, r: dict) -> str:
        ci = "no interval (one seed)" if r["ci95"] is None else f"[{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}]"
        return (f"| {name} | {r['a']:.4f} | {r['b']:.4f} | {r['mean']:+.4f} | {ci} | {r['wins']}/{r['n']} |"
                if r["mean"] is not None else f"| {name} | - | - | - | - | - |")
    lines = [f"A = {a}, B = {b}: test loss on {result['tokens']:,} tokens ({result['windows']} windows), seeds "
             f"{', '.join(map(str, result['seeds']))}"
             + (f" (left out, on one side only: {', '.join(map(str, result['left_out']))})" if result["left_out"] else ""),
             "", "| test loss | A | B | A - B | 95% CI | A lower in |", "| --- | ---: | ---: | ---: | ---: | ---: |",
             line("overall", result["overall"])]
    lines += [line(name, r) for name, r in result["sources"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", metavar="A_OUT:VARIANT")
    p.add_argument("b", metavar="B_OUT:VARIANT")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE")
    args = p.parse_args(argv)
    (_, _, a), (_, _, b) = side(args.a), side(args.b)
    result = compare(a, b)
    print(text(result, args.a, args.b))
    if args.json:
        Path(args.json).write_text(json.dumps({"a": args.a, "b": args.b, **result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
