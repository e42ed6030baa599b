"""Every Python block of README.md runs as written (issue 58: the tour's second block failed with `NameError: name
'input_ids' is not defined`). Each block runs in a fresh namespace in an empty working directory; where the README
makes what a block reads in a command beside it (`ddl export ... --out exported/cc` before the block that loads
exported/cc), the test makes it the same way first. The `ddl` commands of its shell blocks are parsed by
tests/cli/test_documented_commands.py; the scripts they run must exist (below)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import readme_python_blocks, tiny_model

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = readme_python_blocks()


def _exported(cwd: Path) -> None:
    """`ddl export --model runs/cc --out exported/cc`, of a small DDL-CC run as training writes it."""
    from deep_delta.hf import export_model
    from deep_delta.train.checkpoint import save_checkpoint

    model = tiny_model("ddl-cc")
    save_checkpoint(cwd / "runs" / "cc", 1, save_model=lambda d: model.save_pretrained(d), train_state={"step": 1},
                    meta={"variant": "ddl-cc", "preset": "tiny", "tokenizer": "byte"})
    export_model(cwd / "runs" / "cc", cwd / "exported" / "cc")


# What a block reads that a command of the README makes (the block's text names it).
MADE_BY_THE_README = {'"exported/cc"': _exported}


def test_the_readme_has_its_python_blocks():
    assert len(BLOCKS) >= 3 and "DeltaResidual" in BLOCKS[0][1]


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_every_python_block_of_the_readme_runs(line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for needle, make in MADE_BY_THE_README.items():
        if needle in code:
            make(tmp_path)
    exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "readme"})


def test_the_scripts_the_readme_runs_exist():
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"(?:bash |python )((?:scripts|benchmarks)/[\w/.-]+\.(?:sh|py))", readme))
    assert "scripts/setup.sh" in named
    for path in named:
        assert (ROOT / path).is_file(), path
