"""docs/cli.md documents the real command line, and the shared options read the same in every command.

The parser is built as `ddl` builds it (every module in deep_delta.cli), so a flag added anywhere without a line
in docs/cli.md, or a shared option spelled differently somewhere, fails here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from deep_delta.cli.main import as_flags, build_parser, command_path
from deep_delta.cli.options import DTYPE_CHOICES, integer
from deep_delta.variants import PRESETS

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

# option -> the attributes that must agree wherever it appears
SHARED = {
    "--device": dict(metavar="auto|cpu|cuda|cuda:N", choices=None, nargs=None, type=None),
    "--threads": dict(metavar="N|auto", choices=None, nargs=None, type=None),
    "--set": dict(metavar="KEY=VALUE", choices=None, nargs=None, type=None, dest="assignments"),
    "--variants": dict(metavar="VARIANT", choices=None, nargs="+", type=None),
    "--batch-size": dict(metavar="B", choices=None, nargs=None, type=integer),
    "--seq-len": dict(metavar="T", choices=None, nargs=None, type=integer),
    "--seed": dict(metavar="S", choices=None, nargs=None, type=integer),
    "--seeds": dict(metavar="S", choices=None, nargs="+", type=integer),
    "--model": dict(metavar="PATH", choices=None, nargs=None, type=None),
    "--dtype": dict(metavar=None, nargs=None, type=None),  # choices: checked below
    "--data": dict(metavar="DIR", choices=None, nargs=None),
    "--tokenizer": dict(metavar=None, choices=["byte", "gpt2"], nargs=None),
    "--preset": dict(metavar=None, choices=list(PRESETS), nargs=None),
    # not choices: a design of the user's own registers its variants when its module is imported (docs/designs.md)
    "--variant": dict(metavar="VARIANT", choices=None, nargs=None),
}
DTYPE_MEANINGS = ("dtype of the weights", "compute dtype: autocast over float32 weights")


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(("eval", "loss"), parser) for every subcommand and sub-subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


def visible_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Options shown in --help (hidden deprecated aliases are not documented, on purpose)."""
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._HelpAction)]


def section(doc: str, path: tuple[str, ...]) -> str:
    """The text under the heading `## ddl CMD` (or `### ddl CMD SUB`), up to the next heading of its level or
    above."""
    level = "#" * (1 + len(path))
    title = re.escape("ddl " + " ".join(path))
    m = re.search(rf"^{level} `?{title}`?[ \t]*$", doc, re.M)
    assert m, f"docs/cli.md has no heading '{level} ddl {' '.join(path)}'"
    end = re.compile(rf"^#{{1,{len(level)}}} ", re.M).search(doc, m.end())
    return doc[m.end():end.start() if end else len(doc)]


PARSER = build_parser()
COMMANDS = list(commands(PARSER))


def test_the_tree_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"train", "compare", "eval loss", "eval lm-eval", "data prepare", "bench-kernels", "export"} <= names


@pytest.mark.parametrize(("path", "parser"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_option_is_documented_under_its_command(path, parser):
    text = section(DOC.read_text(), path)
    missing = [s for a in visible_options(parser) for s in a.option_strings
               if s.startswith("--") and not re.search(rf"{re.escape(s)}(?![\w-])", text)]
    assert not missing, f"docs/cli.md, section ddl {' '.join(path)}, does not document {missing}"


def test_the_section_finder_sees_a_missing_flag():
    doc = "## ddl bench\n\n`--device` ...\n\n## ddl info\n\n`--variant-x`\n"
    assert "--variant-x" not in section(doc, ("bench",))
    assert "--device" not in section(doc, ("info",))
    with pytest.raises(AssertionError, match="no heading"):
        section(doc, ("train",))


@pytest.mark.parametrize("flag", list(SHARED))
def test_shared_options_agree_everywhere(flag):
    seen = {}
    for path, parser in COMMANDS:
        for a in visible_options(parser):
            if flag in a.option_strings:
                seen[" ".join(path)] = a
    assert seen, f"no command has {flag}"
    for cmd, a in seen.items():
        for attr, want in SHARED[flag].items():
            assert getattr(a, attr) == want, f"ddl {cmd} {flag}: {attr} is {getattr(a, attr)!r}, elsewhere {want!r}"
        if flag == "--dtype":  # a command lists the dtypes it can run; the meaning is one of two, said the same way
            assert a.choices and set(a.choices) <= set(DTYPE_CHOICES), (cmd, a.choices)
            assert any(m in a.help for m in DTYPE_MEANINGS), (cmd, a.help)
        if flag == "--device":  # auto, or the config's device (itself auto by default)
            assert a.default in ("auto", None, argparse.SUPPRESS) and "(default auto)" in a.help, (cmd, a.default)


def test_library_parameters_become_the_commands_flags():
    msg = "`seq_len` got 0; `assignments` got 'x'; `prompts`: the prompt; `model`; `unknown_name`"
    assert as_flags(msg, PARSER, ["eval", "loss"]) == ("--seq-len got 0; `assignments` got 'x'; `prompts`: the "
                                                       "prompt; --model; `unknown_name`")
    assert as_flags(msg, PARSER, ["bench"]).startswith("--seq-len got 0; --set got 'x'; `prompts`: the prompt; --set")
    assert "--prompt: the prompt" in as_flags(msg, PARSER, ["generate"])
    assert as_flags("`out_dir` x; `source` y", PARSER, ["export"]) == "--out x; --model y"
    assert as_flags("`num_fewshot` got -1", PARSER, ["eval", "lm-eval"]) == "--num-fewshot got -1"
    assert as_flags("`batch` got 0", PARSER, ["bench-kernels"]) == "`batch` got 0"  # no flag has that dest
    args = PARSER.parse_args(["eval", "loss", "--model", "m", "--data", "d"])
    assert command_path(PARSER, args) == ["eval", "loss"]


def test_list_options_are_space_separated():
    from deep_delta.cli.options import variant_list

    b = PARSER.parse_args(["bench-kernels", "--variants", "baseline", "ddl-cc", "baseline"])
    assert variant_list(b.variants) == ["baseline", "ddl-cc"]
    with pytest.raises(ValueError, match="`variants` got 'baseline,ddl-cc'"):  # one list form, not two
        variant_list(PARSER.parse_args(["bench-kernels", "--variants", "baseline,ddl-cc"]).variants)
    lm = PARSER.parse_args(["eval", "lm-eval", "--model", "m", "--num-fewshot", "0", "1", "--tasks", "a", "b"])
    assert lm.num_fewshot == ["0", "1"] and lm.tasks == ["a", "b"]
