"""`ddl --help` and every `ddl COMMAND --help` build the parser without importing PyTorch or transformers
(seconds of start-up): the heavy modules load only when a command runs."""

from __future__ import annotations

import json
import subprocess
import sys

# In a fresh interpreter: print the help of the top level and of every (sub-)subcommand, then report which
# heavy modules were imported on the way.
PROBE = r"""
import argparse, contextlib, io, json, sys
from deep_delta.cli.main import build_parser

def paths(parser, prefix=()):
    yield list(prefix)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from paths(sub, (*prefix, name))

helped = []
for path in paths(build_parser()):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            build_parser().parse_args([*path, "--help"])
        except SystemExit:
            pass
    assert "usage: ddl" in out.getvalue(), path
    helped.append(" ".join(path))
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "triton", "safetensors"))
print(json.dumps({"helped": helped, "heavy": heavy[:10]}))
"""


def test_every_help_imports_no_torch_nor_transformers():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"", "train", "compare", "bench", "eval loss", "tasks run", "data prepare"} <= set(report["helped"])
    assert report["heavy"] == [], f"--help imported {report['heavy']}"


def test_importing_the_package_is_light_and_its_names_load_on_use():
    code = ("import sys, deep_delta; before = 'torch' in sys.modules; cfg = deep_delta.DDLConfig; "
            "from transformers import AutoConfig; "
            "print(before, cfg.__name__, AutoConfig.for_model('deep_delta').__class__.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "DDLConfig", "DDLConfig"]  # registered with the Auto classes on use
