"""benchmarks/tools/device_call.sh, the machinery of both device calls (first_call.sh, cost_call.sh): the call fails
loudly (the probe of round 6, section 4: FC11, FC12, FC13).

- FC11: a DEADLINE below the first step's minimum (env, 15 s; a dry run's 15 / DRY_SCALE) is refused before anything
  runs: one line naming DEADLINE, the value and the minimum, exit 2 (it used to skip every step and exit 0).
- FC12: a failed environment step (no GPU: no nvidia-smi, a torch without CUDA) ends the call right there: one line
  saying why, exit 4, no other step run (it used to run the rest on the CPU and exit 0); a real run on this machine,
  which has no GPU, stops after env in seconds. A step that failed, timed out or was skipped ends the call non-zero
  (test_first_call.py, test_cost_call.py), and a skipped probe is not a passed one.
- FC13: a call never writes into a used OUT: one that holds anything is refused (one line naming it, exit 2), its
  files untouched; an empty one (the device tool's $OUT) is used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CALLS = ["first_call.sh", "cost_call.sh"]
HAS_GPU = torch.cuda.is_available()


def run(script, out, **values):
    """``bash benchmarks/tools/SCRIPT`` from the repository root with ``values`` in its environment, OUT ``out``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDL_", "DRY"))}
    env.update(OUT=str(out), BEFORE="", **values)
    return subprocess.run(["bash", str(ROOT / "benchmarks/tools" / script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def rows(out):
    return [line.split("\t") for line in (out / "timeline.tsv").read_text().splitlines()[1:]]


# FC11 -----------------------------------------------------------------------------------------------------------

# the probe's commands: (script, its values, the minimum the line names)
FC11 = {"first-real-10": ("first_call.sh", {"COMMIT": "x", "PY": "/bin/true", "DEADLINE": "10"}, 15),
        "first-real-0": ("first_call.sh", {"COMMIT": "x", "PY": "/bin/true", "DEADLINE": "0"}, 15),
        "cost-real-14": ("cost_call.sh", {"COMMIT": "x", "PY": "/bin/true", "DEADLINE": "14"}, 15),
        "first-dry-0": ("first_call.sh", {"DRY": "1", "DEADLINE": "0"}, 1),
        "cost-dry-1-at-scale-10": ("cost_call.sh", {"DRY": "1", "DEADLINE": "1", "DRY_SCALE": "10"}, 2)}


@pytest.mark.parametrize(("script", "values", "minimum"), list(FC11.values()), ids=list(FC11))
def test_fc11_deadline_below_first_step_is_refused(tmp_path, script, values, minimum):
    """FC11: ``COMMIT=x PY=/bin/true DEADLINE=10 OUT=fc/f11 FC``; ``DEADLINE=0``; ``DEADLINE=14 CC``: every step was
    skipped and the call exited 0. Now: one line naming DEADLINE, its value and the first step's minimum, exit 2,
    before anything runs (OUT not even created)."""
    out = tmp_path / "f11"
    t0 = time.time()
    done = run(script, out, **values)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"{script}: DEADLINE {values['DEADLINE']} s cannot fit the first step (env needs at least {minimum} s"
        + ("" if values.get("DRY") != "1" else f" in a dry run at DRY_SCALE {values.get('DRY_SCALE', '60')}")
        + f"), so nothing would run; allowed: DEADLINE >= {minimum}"]
    assert done.stdout == "" and not out.exists() and time.time() - t0 < 5


@pytest.mark.parametrize("script", CALLS)
def test_fc11_a_deadline_of_the_minimum_runs_the_first_step(tmp_path, script):
    """The bound is the minimum itself: DEADLINE 1 in a dry run at DRY_SCALE 60 (env's 15 s -> 1 s) is taken, env
    runs, and the steps that no longer fit are skipped, which ends the call non-zero (exit 5)."""
    out = tmp_path / "out"
    done = run(script, out, DRY="1", DEADLINE="1", DRY_SLEEP="0")
    assert rows(out)[0][:2] == ["env", "0"] and rows(out)[0][4] == "ok"
    assert done.returncode == 5 and "skipped for want of time" in done.stderr, done.stdout + done.stderr


# FC12 -----------------------------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("nvidia-smi") is not None or HAS_GPU, reason="a machine with a GPU runs the steps")
@pytest.mark.parametrize("script", CALLS)
def test_fc12_a_real_run_without_a_gpu_stops_after_env(tmp_path, script):
    """FC12: ``COMMIT=x PY=$PWD/.venv/bin/python WORKERS=1 DEADLINE=150 OUT=fc/f12 FC`` on a machine without a GPU:
    env failed, then ``partials`` ran 129 s on the CPU, the rest were skipped and the call exited 0. Now: a real
    (not dry) run stops right after env, in seconds: one line saying why (no nvidia-smi here), exit 4, the
    timeline holding env alone, env.txt ending in the reason."""
    out = tmp_path / "f12"
    t0 = time.time()
    done = run(script, out, COMMIT="x", PY=sys.executable, WORKERS="1", DEADLINE="150",
               WHEELS=str(tmp_path / "no-wheels"))
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"{script}: the environment step failed, so no other step ran: no GPU: nvidia-smi is not on PATH (env.txt "
        f"and steps.log in {out})"]
    assert [r[0] for r in rows(out)] == ["env"] and rows(out)[0][3:] == ["1", "failed"]
    assert (out / "env.txt").read_text().splitlines()[-1] == "env failed: no GPU: nvidia-smi is not on PATH"
    assert "=== partials" not in done.stdout and "=== rules" not in done.stdout
    assert time.time() - t0 < 30


@pytest.mark.skipif(HAS_GPU, reason="a machine with a GPU passes the environment step")
@pytest.mark.parametrize("script", CALLS)
def test_fc12_a_torch_that_sees_no_gpu_stops_the_call(tmp_path, script):
    """FC12, the torch side: an ``nvidia-smi`` that answers, but this machine's torch (built without CUDA, or
    seeing no device): the call stops after env, the line naming torch."""
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771 MiB'\n")
    smi.chmod(0o755)
    out = tmp_path / "f12"
    done = run(script, out, COMMIT="x", PY=sys.executable, WORKERS="1", DEADLINE="150",
               WHEELS=str(tmp_path / "no-wheels"), PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert done.returncode == 4, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{script}: the environment step failed, so no other step ran: no GPU: torch "), line
    assert "built without CUDA" in line or "torch.cuda.is_available() is False" in line
    assert [r[0] for r in rows(out)] == ["env"]


@pytest.mark.parametrize("script", CALLS)
@pytest.mark.parametrize(("how", "why"), [("DRY_FAIL", "stand-in failure"), ("DRY_HANG", "timed out at its cap")])
def test_fc12_a_failed_env_stops_a_dry_run_too(tmp_path, script, how, why):
    """A dry run's env stands in for a GPU's and passes; made to fail (DRY_FAIL=env) or hang (DRY_HANG=env, round
    6's FC15, where the rest then ran) it stops the call as a real one does: exit 4, no other step."""
    out = tmp_path / "out"
    done = run(script, out, DRY="1", DEADLINE="9", DRY_SLEEP="0", **{how: "env"})
    assert done.returncode == 4, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{script}: the environment step failed, so no other step ran: {why}"), line
    assert [r[0] for r in rows(out)] == ["env"]


def test_fc12_a_skipped_probe_is_not_a_passed_one(tmp_path):
    """FC12 said ``the reduction protocol failed (partials rc 124, probe rc 0)`` of a probe that was skipped. Now a
    skipped step is said to be skipped and counts as not passed: the in-kernel reduction is turned off after it, and
    the call ends non-zero naming it."""
    out = tmp_path / "out"
    # at DRY_SCALE 10 env needs 2 s, partials 4, probe 6: env and partials (3 s each) leave too little for the probe
    done = run("first_call.sh", out, DRY="1", DEADLINE="8", DRY_SCALE="10", DRY_SLEEP="3")
    log = (out / "steps.log").read_text()
    assert "probe skipped): later steps with DDL_INKERNEL_REDUCE=0" in log, log
    assert done.returncode == 5 and "skipped for want of time: " in done.stderr and "probe" in done.stderr


# FC13 -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", CALLS)
def test_fc13_a_used_out_is_refused(tmp_path, script):
    """FC13: ``DRY=1 DRY_SLEEP=0.1 DEADLINE=9 OUT=fc/c2 CC`` into a finished call's OUT truncated its timeline, log
    and tests and added a second table to its bench.md, exit 0. Now the second call is refused before any step: one
    line naming OUT, exit 2, the first call's files as they were."""
    out = tmp_path / "c2"
    first = run(script, out, DRY="1", DEADLINE="20", DRY_SLEEP="0")
    assert first.returncode == 0, first.stdout + first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    done = run(script, out, DRY="1", DEADLINE="20", DRY_SLEEP="0")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"{script}: OUT '{out}' is not empty (another call's results, which this call would overwrite or mix with its "
        "own); allowed: a new or empty directory, one per call"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and done.stdout == ""


def test_fc13_an_empty_out_is_used(tmp_path):
    """The device tool's $OUT exists and is empty: the call writes there."""
    out = tmp_path / "empty"
    out.mkdir()
    done = run("cost_call.sh", out, DRY="1", DEADLINE="20", DRY_SLEEP="0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "timeline.tsv").is_file()
