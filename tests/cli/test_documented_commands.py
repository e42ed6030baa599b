"""Every `ddl` command in README.md's code blocks and in scripts/*.sh still parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from deep_delta.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "README.md", *sorted((ROOT / "scripts").glob("*.sh"))]
# `ddl ...` (or .venv/bin/ddl, or `-m deep_delta.cli.main ...` under torchrun) up to a comment or the line's end
COMMAND = re.compile(r"(?:^|&&|`|\s)(?:\.venv/bin/)?(?:ddl|-m deep_delta\.cli\.main) ([a-z][^#`\n]*)")


def code_lines(path: Path) -> list[str]:
    """A script's lines; of markdown, the lines of code blocks (indented by four spaces, or fenced)."""
    lines = path.read_text().splitlines()
    if path.suffix != ".md":
        return lines
    out, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            out.append(line)
    return out


def commands() -> list[tuple[str, str]]:
    found = []
    for path in SOURCES:
        for line in code_lines(path):
            for m in COMMAND.finditer(line):
                argv = m.group(1).strip()
                if not re.search(r"[A-Z]{2,}|\.\.\.|\[|\|", argv):  # placeholders (RUN_OR_DIR, [opts], a|b) are prose
                    found.append((path.name, argv))
    return found


COMMANDS = commands()
PARSER = build_parser()


def test_the_readme_commands_are_found():
    readme = [argv for name, argv in COMMANDS if name == "README.md"]
    assert any(a.startswith("export --model") for a in readme) and any(a.startswith("bench-kernels") for a in readme)


@pytest.mark.parametrize(("source", "argv"), COMMANDS, ids=[f"{s}: {a}" for s, a in COMMANDS])
def test_documented_command_parses(source, argv, capsys):
    args = PARSER.parse_args(shlex.split(argv))
    assert getattr(args, "func", None), f"{source}: `ddl {argv}` names no command"
    assert not capsys.readouterr().err, f"{source}: `ddl {argv}` printed on stderr while parsing"
