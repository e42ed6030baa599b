"""The ``ddl`` console command's entry point.

A Ctrl-C while the command line's modules import would surface as a KeyboardInterrupt traceback from
inside an import. This module lives outside the package so that the import itself runs under a guard: an
interrupt during start-up prints one line and exits 130, like an interrupt anywhere else in ``ddl`` (PyTorch
and transformers load later, when a command runs, under :func:`deep_delta.cli.main.main`'s own guard).
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
