"""Pack the run records under folders in place (issue 65 item 5): every run's ``metrics.jsonl`` becomes
``metrics.jsonl.gz``, the same bytes gzip-compressed the same way every time (level 9, no file name, time 0; ``zcat``
gives the file back), which every reader of a run's metrics takes in its place (``ddl compare`` reusing a run,
``--report-only``, the tools). Each one is written atomically, read back from disk and compared with the plain file
byte for byte before the plain file is removed (``deep_delta.train.metrics.pack_metrics``). run.json and test.json
stay plain. A run directory another process holds (a run training now) is skipped and named; one holding both forms
with different records is refused, naming it, before anything of it is removed.

    python benchmarks/tools/pack_records.py DIR [DIR ...]

Prints each folder's packed count and its metrics' bytes before and after; run it again and nothing changes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def pack_tree(root: Path, say=print) -> tuple[int, int, int]:
    """Pack every run's metrics under ``root``: (runs packed, bytes of their plain files, bytes packed)."""
    from deep_delta.fsutil import lock_held
    from deep_delta.train.checkpoint import LOCK_FILE
    from deep_delta.train.metrics import METRICS_FILE, pack_metrics

    if not root.is_dir():
        raise SystemExit(f"pack_records.py: {root} is not a directory; allowed: folders of run records (studies/...)")
    count = before = after = 0
    for plain in sorted(root.rglob(METRICS_FILE)):
        run = plain.parent
        if lock_held(run, LOCK_FILE):
            say(f"skipped {run}: a process holds it (a run training now); pack it once it has finished")
            continue
        size = plain.stat().st_size
        try:
            packed = pack_metrics(run)
        except ValueError as e:
            raise SystemExit(f"pack_records.py: {e}") from None
        count, before, after = count + 1, before + size, after + packed.stat().st_size
    return count, before, after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="a folder of run records (searched whole)")
    args = parser.parse_args(argv)
    for root in args.dirs:
        count, before, after = pack_tree(root)
        saved = f": {before:,} bytes -> {after:,}" if count else ""
        print(f"{root}: packed {count} run(s){saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
