"""The `ddl` entry point: an interrupt while modules are still importing prints one line, no traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


# A finder that raises KeyboardInterrupt when MODULE is first imported: the moment a user's Ctrl-C lands while
# `ddl` starts (the parser's modules) or while a command starts (PyTorch, which takes seconds).
@pytest.mark.parametrize(("module", "argv", "said"), [
    ("deep_delta.cli.main", ["data", "prepare", "--help"], "ddl: interrupted\n"),
    ("torch", ["info", "--variant", "baseline"], "ddl info: interrupted\n"),
])
def test_ctrl_c_during_start_up_prints_one_line(module, argv, said):
    script = textwrap.dedent(
        f"""
        import sys

        class Interrupt:
            def find_spec(self, name, path=None, target=None):
                if name == {module!r}:
                    raise KeyboardInterrupt
                return None

        sys.meta_path.insert(0, Interrupt())
        import deep_delta_cli
        sys.argv = ["ddl", *{argv!r}]
        sys.exit(deep_delta_cli.main())
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 130, r.stderr
    assert r.stderr == said
    assert "Traceback" not in r.stdout + r.stderr


def test_entry_point_runs_the_command_line():
    r = subprocess.run([sys.executable, "-m", "deep_delta_cli", "--version"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "0.1.0" in r.stdout + r.stderr


def test_console_script_names_the_guarded_entry():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="console_scripts") if e.name == "ddl"]
    assert ep.value == "deep_delta_cli:main"
