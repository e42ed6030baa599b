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


def code_lines(path: Path, text: str | None = None) -> list[str]:
    """A script's lines; of markdown, the lines of code blocks (indented by four spaces, or fenced); ``text``: the
    part of ``path`` to read (default all of it)."""
    lines = (path.read_text() if text is None else text).splitlines()
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


def readme_tour() -> list[str]:
    """The `ddl` commands README.md gives a reader to run, in order: its code blocks above its Layout (the fresh
    machine's main job, then the tour)."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    return [m.group(1).strip() for line in code_lines(readme, text[:text.index("\n## Layout")])
            for m in COMMAND.finditer(line)]


def writes(argv: str) -> tuple[str | None, set[str]]:
    """(the directory a README command claims, or None: one it continues or none; the run / model directories it
    leaves there), as the command resolves them: ``train``'s --out or its recipe's, ``compare``'s --out (default
    runs/compare) with VARIANT/ for one seed and seed_S/VARIANT/ for several, ``export``'s --out, ``tasks run``'s
    and ``coord-check``'s (default) --out, ``data prepare``'s --out."""
    from deep_delta.cli import options
    from deep_delta.cli.compare import PER_RUN
    from deep_delta.cli.train import config_from_args
    from deep_delta.train.config import TrainConfig, load_config

    args, command = PARSER.parse_args(shlex.split(argv)), argv.split()[0]
    if command == "train":
        if args.print_config or args.list_configs:
            return None, set()
        out = config_from_args(args).out
        return (None if args.resume else out), {out}
    if command == "compare":
        base = load_config(args.config or "compare", options.given_settings(args, options.setting_names(
            TrainConfig, PER_RUN)), args.assignments)
        seeds, variants = options.seed_list(args.seeds, base.seed), options.variant_list(args.variants)
        runs = ({f"{args.out}/{v}" for v in variants} if len(seeds) == 1 else
                {f"{args.out}/seed_{s}/{v}" for s in seeds for v in variants})
        return (None if args.report_only else args.out), runs
    if command == "export":
        return args.out_dir, {args.out_dir}
    out = getattr(args, "out", None)
    if command in ("tasks", "coord-check", "data") and out is not None:
        return out, set()
    return None, set()


def test_the_readme_tour_runs_in_order_without_collisions():
    """Issue 66: after the main job (`ddl compare`, which writes runs/compare), the tour's `ddl compare --seeds 3`
    and `ddl compare --steps 400 --out runs/compare` were refused (runs/compare holds another comparison), and
    `ddl analyze --model runs/compare/seed_0/ddl-tc` had nothing to read. Each command that makes runs has a
    directory of its own (a --resume continues its run), and each --model a README command reads is a run or a
    model that an earlier command writes."""
    tour = readme_tour()
    assert tour[0] == "compare" and any(a.startswith("analyze --model") for a in tour), tour
    claimed, made = {}, set()
    for argv in tour:
        tokens = shlex.split(argv)
        if "--model" in tokens:
            model = tokens[tokens.index("--model") + 1]
            assert model in made, f"README: `ddl {argv}` reads {model}, which no command before it writes"
        out, runs = writes(argv)
        if out is not None:
            assert out not in claimed, f"README: `ddl {argv}` writes into {out}, as `ddl {claimed[out]}` does"
            claimed[out] = argv
        made |= runs
    assert {"runs/compare", "runs/cc", "exported/cc"} <= set(claimed), claimed
