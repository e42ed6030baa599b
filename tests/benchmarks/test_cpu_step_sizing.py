"""benchmarks/tools/cpu_step_sizing.py refuses bad values in one line in the parent, before any sizing process starts
(the probe of round 6, S3: ``--variants foo``, ``--steps 0 --warmup 1`` and ``--width 0`` each printed a child's raw
traceback, then ``a sizing process failed (rc 1)``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from deep_delta.variants import VARIANTS
from helpers import TOOLS, load_tool

SMALL = ["--layers", "2", "--batch", "2", "--seq", "16"]
S3 = {"variant-foo": (["--variants", "foo", *SMALL], "--variants got 'foo'; allowed: baseline, "),
      "steps-0": (["--steps", "0", "--warmup", "1", *SMALL], "--steps got 0; allowed: a whole number >= 1"),
      "width-0": (["--width", "0", *SMALL], "--width got 0; allowed: a whole number >= 1"),
      "seq-1": (["--layers", "2", "--seq", "1"], "--seq got 1; allowed: a whole number >= 2"),
      "warmup-negative": (["--warmup", "-1", *SMALL], "--warmup got -1; allowed: a whole number >= 0"),
      "odd-head-size": (["--width", "70", *SMALL],
                        "--width 70 --layers 2 --seq 16 makes no baseline model: DDLConfig: `num_attention_heads` got "
                        "2; allowed: a value giving an even head_dim"),
      "out-in-a-missing-folder": (["--out", "no/such/folder/sizing.json", *SMALL], "but its folder does not exist")}


@pytest.mark.parametrize(("argv", "says"), list(S3.values()), ids=list(S3))
def test_s3_bad_values_are_refused_before_any_sizing_process(monkeypatch, argv, says):
    """S3: one line naming the flag, what it got and what is allowed; no sizing process started."""
    mod = load_tool("cpu_step_sizing")

    def no_child(*args, **kwargs):
        raise AssertionError(f"a sizing process was started: {args}")

    monkeypatch.setattr(mod.subprocess, "Popen", no_child)
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    said = e.value.code
    assert isinstance(said, str) and "\n" not in said and said.startswith("cpu_step_sizing.py: "), said
    assert says in said, said


def test_s3_from_the_command_line_one_line_and_no_traceback(tmp_path):
    """The probe's first command as it ran it: exit 1, one line on stderr, no child's traceback."""
    done = subprocess.run([sys.executable, str(TOOLS / "cpu_step_sizing.py"), "--variants", "foo", *SMALL],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(TOOLS.parents[1] / "src")))
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"cpu_step_sizing.py: --variants got 'foo'; allowed: {', '.join(VARIANTS)}"]
