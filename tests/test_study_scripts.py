"""The study scripts find `ddl` the way README sets it up (issue 66: they ran a bare `ddl`, which after
`bash scripts/setup.sh` is .venv/bin/ddl, not on PATH, and failed with rc 127 deep inside their logs):
studies/commands.sh, sourced by each, takes $DDL, else the repository's .venv/bin/ddl, else `ddl` on PATH, and
says in one line that there is none."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASH = shutil.which("bash")


BARE = r"(?:^|[;&|(]\s*|exec\s+)ddl\s"  # a bare `ddl` run


def _code(script: Path) -> str:
    """``script`` without its comment lines."""
    return "\n".join(line for line in script.read_text().splitlines() if not line.lstrip().startswith("#"))


def _runs_ddl(script: Path) -> bool:
    """Whether ``script`` runs ddl (``$ddl``, ``${DDL...}`` or a bare ``ddl``)."""
    return bool(re.search(rf"\$ddl\b|\$\{{DDL|{BARE}", _code(script), re.M))


SCRIPTS = sorted(p for p in (ROOT / "studies").glob("*/*.sh") if _runs_ddl(p))


def _stub(path: Path, name: str) -> Path:
    """An executable ``path`` that prints ``name`` and its arguments."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{name} $*"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def tree(tmp_path):
    """A copy of studies/commands.sh in a repository of its own (no .venv), a script that sources it, and a PATH
    that holds only the tools the script needs (no ddl)."""
    root = tmp_path / "repo"
    (root / "studies" / "x").mkdir(parents=True)
    shutil.copy(ROOT / "studies" / "commands.sh", root / "studies" / "commands.sh")
    script = root / "studies" / "x" / "run.sh"
    script.write_text('set -euo pipefail\nsource "$(dirname "$0")/../commands.sh"\n"$ddl" compare --out o\n')
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("dirname", "basename", "sh"):
        (tools / name).symlink_to(shutil.which(name))
    return root, script, tools


def _run(script: Path, path: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, str(script)], capture_output=True, text=True, cwd=script.parent,
                          env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), **env})


def test_every_study_script_finds_ddl_through_commands_sh():
    assert {p.name for p in SCRIPTS} >= {"run.sh", "finish.sh", "settings.sh"}, SCRIPTS
    for script in SCRIPTS:
        text = _code(script)
        assert "${DDL" not in text and not re.search(BARE, text, re.M), script
        if script.name != "settings.sh":  # sourced after commands.sh by run.sh and finish.sh
            assert re.search(r'^source "\$(?:here|\(dirname "\$0"\))/\.\./commands\.sh"', text, re.M), script


def test_ddl_from_DDL_then_the_venv_then_PATH_else_one_line(tree, tmp_path):
    root, script, tools = tree
    none = _run(script, str(tools))
    assert none.returncode == 2 and none.stdout == "", none
    assert none.stderr.count("\n") == 1 and "run.sh: no ddl command" in none.stderr
    assert "bash scripts/setup.sh" in none.stderr and "set DDL" in none.stderr
    on_path = _stub(tmp_path / "bin" / "ddl", "on-path")
    assert _run(script, f"{tools}:{on_path.parent}").stdout == "on-path compare --out o\n"
    _stub(root / ".venv" / "bin" / "ddl", "venv")
    assert _run(script, f"{tools}:{on_path.parent}").stdout == "venv compare --out o\n"
    given = _stub(tmp_path / "elsewhere" / "my ddl", "given")
    assert _run(script, str(tools), DDL=str(given)).stdout == "given compare --out o\n"
    wrong = _run(script, str(tools), DDL=str(tmp_path / "missing"))
    assert wrong.returncode == 2 and "no ddl command (DDL=" in wrong.stderr


def test_a_study_script_runs_the_ddl_it_found(tmp_path):
    """studies/firstlook_rivals/run.sh, as committed, with DDL set: its `ddl compare` is that command's."""
    stub = _stub(tmp_path / "ddl", "stub")
    done = _run(ROOT / "studies" / "firstlook_rivals" / "run.sh", os.environ["PATH"], DDL=str(stub))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("stub compare --variants baseline ddl-cc") and "--out runs/firstlook_rivals" in done.stdout
