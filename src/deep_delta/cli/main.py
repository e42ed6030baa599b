"""Entry point of the ``ddl`` command: discovers subcommand modules in :mod:`deep_delta.cli`.

A subcommand module defines ``add_parser(subparsers)`` which adds its parser and sets ``func`` (a callable
taking the parsed namespace and returning an exit code). Modules import heavy dependencies lazily so
``ddl --help`` stays fast.

Errors: :func:`main` is the one place where exceptions become what the user sees. Known failure classes
(bad input or config, missing or corrupt files, permissions, a full disk, undecodable text, an interrupt)
print one line, ``ddl <command>: error: <message>``, naming the file and the cause, and exit non-zero;
anything else is a bug and keeps its traceback. ``--debug`` (or ``DDL_DEBUG=1``) shows every traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import re
import shlex
import sys

import deep_delta.cli as cli_pkg


class UsageError(Exception):
    """A user error: printed as ``ddl <cmd>: error: ...`` with exit code 2, no traceback."""


class _StoreOnce(argparse._StoreAction):
    """An option that stores its value(s): a second occurrence would silently replace the first (``--lrs 1e-3
    --lrs 2e-3`` keeping only 2e-3), so it is an error. Options that collect (``--set``, ``--prompt``) append."""

    given = False

    def __call__(self, parser, namespace, values, option_string=None):
        if self.given and option_string is not None:
            many = " takes all its values at once" if self.nargs not in (None, "?") else " takes one value"
            raise argparse.ArgumentError(self, f"given twice; it{many}, and the second would replace the first "
                                         "(give it once)")
        self.given = True
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """The parser of ``ddl`` and every subcommand (subparsers take the class of their parent): an option given
    twice that does not append is an error (:class:`_StoreOnce`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        for action in self._actions:
            if isinstance(action, _StoreOnce):
                action.given = False
        return super().parse_known_args(args, namespace)


def build_parser() -> argparse.ArgumentParser:
    from deep_delta import __version__

    parser = Parser(
        prog="ddl",
        description="Deep Delta Learning: train, compare, evaluate and benchmark DDL language models.",
    )
    parser.add_argument("--version", action="version", version=f"deep-delta-learning {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks of errors (also with the environment variable DDL_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name in ("main",) or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"deep_delta.cli.{info.name}")
        if hasattr(module, "add_parser"):
            module.add_parser(sub)
    return parser


# How PyTorch words an allocation that failed (torch.OutOfMemoryError on a GPU, a plain RuntimeError on the CPU).
_OUT_OF_MEMORY = re.compile(r"out of memory|can't allocate memory|not enough memory", re.IGNORECASE)


def describe_error(error: BaseException) -> tuple[str, int] | None:
    """(one-line message, exit code) for a known failure class, None for anything else (a bug)."""
    from deep_delta.extras import MissingExtra, extra_of_error
    from deep_delta.fsutil import as_os_error

    data_errors = sys.modules.get("deep_delta.data.errors")
    if isinstance(error, (UsageError, MissingExtra)) or (
            data_errors and isinstance(error, data_errors.DataUnavailableError)):
        return str(error), 2
    missing = extra_of_error(error)  # an optional package no check caught first
    if missing is not None:
        return missing, 2
    if _is_divergence(error):
        return str(error), 1
    if isinstance(error, UnicodeError):  # before ValueError: the codec's text alone does not say what was read
        return f"text that is not valid UTF-8 ({error})", 2
    if isinstance(error, (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)):
        return _os_message(error), 2
    if isinstance(error, ValueError):
        return str(error), 2
    error = as_os_error(error, getattr(error, "filename", None) or "")
    if isinstance(error, PermissionError):
        return f"permission denied: {error.filename or error} (choose a directory you can write to)", 1
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        where = f" while writing {error.filename}" if error.filename else ""
        return f"no space left on device{where}; free some space (or choose another output directory) and run " \
               "the command again: nothing half-written is kept", 1
    if isinstance(error, OSError) and (error.filename or error.strerror):
        return _os_message(error), 1
    if isinstance(error, MemoryError) or (isinstance(error, RuntimeError) and _OUT_OF_MEMORY.search(str(error))):
        what = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return f"out of memory{f' ({what})' if what else ''}: a smaller batch size, sequence length or model " \
               "fits in less", 1
    return None


# Python parameter names whose flag is not --<name-with-dashes> nor an option's dest (those two are found
# without a table): the library's name -> the flag, where a command has that flag.
PARAMETER_FLAGS = {
    "model": "--set",
    "out_dir": "--out",  # ddl data prepare (export's --out has dest out_dir, found without this)  # a command's DDLConfig fields come from --set model.FIELD=VALUE (where it has no --model)
    "use_cache=False": "--no-cache",  # a switched-off library setting whose flag is a negative one
}


def command_parser(parser: argparse.ArgumentParser, path: list[str]) -> argparse.ArgumentParser | None:
    """The parser of the (sub-)subcommand ``path`` (``["eval", "loss"]``), None if there is none."""
    for name in path:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or name not in sub.choices:
            return None
        parser = sub.choices[name]
    return parser


def command_path(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The subcommand names the parsed ``args`` went through: ``["eval", "loss"]``."""
    path = []
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if name is None or name not in sub.choices:
            return path
        path.append(name)
        parser = sub.choices[name]


def as_flags(message: str, parser: argparse.ArgumentParser, command: str | list[str]) -> str:
    """Library errors name Python parameters in backticks (`eval_every`); on the command line, name the flag
    instead (--eval-every) wherever the subcommand has one: ``--<name>``, the option whose dest is the name
    (`assignments` -> --set, `prompts` -> --prompt), or :data:`PARAMETER_FLAGS`."""
    cmd = command_parser(parser, [command] if isinstance(command, str) else command)
    if cmd is None:
        return message
    by_dest, flags = {}, set()
    for a in cmd._actions:
        if a.option_strings and a.help != argparse.SUPPRESS:
            by_dest.setdefault(a.dest, max(a.option_strings, key=len))
            flags.update(a.option_strings)  # --compile of --compile / --no-compile, not the longest

    def flag(m: re.Match) -> str:
        name = m.group(1)
        for candidate in ("--" + name.replace("_", "-"), by_dest.get(name), PARAMETER_FLAGS.get(name)):
            if candidate in flags:
                return candidate
        return m.group(0)

    return re.sub(r"`([a-z][a-z0-9_]*(?:=False|=True)?)`", flag, message)


def _os_message(error: OSError) -> str:
    if error.filename and error.strerror:
        return f"{error.strerror}: {error.filename}"
    return str(error)


# Exceptions that end a command after a signal, having kept its work; the message says what was kept.
_STOPPED = (("deep_delta.train.trainer", "TrainingInterrupted"), ("deep_delta.experiments.study", "StudyInterrupted"))


def _is_divergence(error: BaseException) -> bool:
    """A training run whose loss diverged (``on_divergence`` raise): the message names the step, the last good
    checkpoint and what to do."""
    trainer = sys.modules.get("deep_delta.train.trainer")
    return trainer is not None and isinstance(error, trainer.NonFiniteLossError)


def _stopped_by_signal(error: BaseException) -> bool:
    return any(module in sys.modules and isinstance(error, getattr(sys.modules[module], name))
               for module, name in _STOPPED)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush into a closed pipe says nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (a captured stdout in tests)
        pass


# The commands whose reports draw figures (matplotlib, the `plot` extra). Without it they still write every report,
# without its figures, and say so twice: in one line before any work (here) and where the report is written.
DRAWS_FIGURES = (("compare",), ("analyze",), ("coord-check",), ("tasks", "run"))


def note_missing_figures(path: list[str]) -> None:
    """Before a command of :data:`DRAWS_FIGURES` starts any work: one line, when matplotlib is missing, naming the
    extra that draws its figures (the README promises that a missing extra is named before a command starts)."""
    from deep_delta.extras import install_hint, installed

    if tuple(path) in DRAWS_FIGURES and not installed("matplotlib"):
        print(f"note: matplotlib is not installed: `ddl {' '.join(path)}` writes its report without the figures; "
              f"`{install_hint('matplotlib')}` draws them", flush=True)


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("ddl: interrupted", file=sys.stderr)
        return 130
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    debug = args.debug or os.environ.get("DDL_DEBUG", "") not in ("", "0")
    try:
        note_missing_figures(command_path(parser, args))
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"ddl {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`ddl ... | head`): stop quietly, as other tools do
        _quiet_stdout()
        return 141
    except Exception as e:
        if _stopped_by_signal(e) and not debug:
            again = list(sys.argv[1:] if argv is None else argv)
            if args.command == "train" and "--resume" not in again:
                again.append("--resume")
            print(f"ddl {args.command}: {e}. Continue with: ddl {shlex.join(again)}", file=sys.stderr)
            return e.exit_code
        known = describe_error(e)
        if debug or known is None:
            raise
        message, code = known
        print(f"ddl {args.command}: error: {as_flags(message, parser, command_path(parser, args))}",
              file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
