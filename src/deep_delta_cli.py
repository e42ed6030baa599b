"""The ``ddl`` console command's entry point.

Importing the package loads PyTorch and transformers, which takes seconds; a Ctrl-C in that time would
surface as a KeyboardInterrupt traceback from deep inside an import. This module lives outside the package
so that the import itself runs under a guard: an interrupt during start-up prints one line and exits 130,
like an interrupt anywhere else in ``ddl``.
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from deep_delta.cli.main import main as ddl_main
    except KeyboardInterrupt:
        print("ddl: interrupted", file=sys.stderr)
        return 130
    return ddl_main()


if __name__ == "__main__":
    sys.exit(main())
