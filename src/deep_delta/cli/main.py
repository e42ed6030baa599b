"""Entry point of the ``ddl`` command: discovers subcommand modules in :mod:`deep_delta.cli`.

A subcommand module defines ``add_parser(subparsers)`` which adds its parser and sets ``func`` (a callable
taking the parsed namespace and returning an exit code). Modules import heavy dependencies lazily so
``ddl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import deep_delta.cli as cli_pkg


class UsageError(Exception):
    """A user error: printed as ``ddl <cmd>: error: ...`` with exit code 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    from deep_delta import __version__

    parser = argparse.ArgumentParser(
        prog="ddl",
        description="Deep Delta Learning: train, compare, evaluate and benchmark DDL language models.",
    )
    parser.add_argument("--version", action="version", version=f"deep-delta-learning {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name in ("main",) or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"deep_delta.cli.{info.name}")
        if hasattr(module, "add_parser"):
            module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError) as e:
        print(f"ddl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"ddl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
