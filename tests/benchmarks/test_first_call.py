"""benchmarks/tools/first_call.sh in its dry run (stand-in steps, any machine) and reduce_probe.py on CPU.

The device call must end inside its window whatever a step does: each step under its own timeout (the stand-in
for ``probe`` hangs and is killed at its cap), steps skipped when too little time is left, a failed protocol step
turning the in-kernel reduction off for the rest, and results that fit what the device returns (at most 8
files, no folders). The probe runs end to end under the Triton interpreter at small shapes, every check passing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_keeps_the_deadline_skips_and_packs(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, DRY="1", DEADLINE="6", DRY_SCALE="60", DRY_SLEEP="0.5", DRY_HANG="probe",
               DRY_FAIL="partials", OUT=str(out), BEFORE="")
    t0 = time.time()
    done = subprocess.run(["bash", str(ROOT / "benchmarks/tools/first_call.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    took = time.time() - t0
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in (out / "timeline.tsv").read_text().splitlines()[1:]]
    status = {r[0]: (r[3], r[4]) for r in rows}
    assert list(status) == ["env", "partials", "probe", "newtests", "bench_on", "bench_off", "bench_before",
                            "oldtests"]
    assert status["env"] == ("0", "ok")
    assert status["partials"] == ("3", "failed")
    assert status["probe"] == ("124", "timed out")  # hung: killed at its cap (180 / 60 = 3 s), not at the deadline
    assert any(s.startswith("skipped") for _, s in status.values())
    log = (out / "steps.log").read_text()
    assert "later steps with DDL_INKERNEL_REDUCE=0" in log
    assert took < 6 + 10  # the deadline (6 s) and one step's kill grace at most
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.is_file() for f in files)


def test_probe_runs_on_cpu(tmp_path):
    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/tools/reduce_probe.py"), "--tiny", "--out", str(out),
                           "--only", "update + CC read", "norm + gate + value, d_v = 1", "HC write, static"],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["failed"] == [] and len(result["cases"]) == 3
    for case in result["cases"].values():
        assert case["same_bits"] and case["no_nan"] and case["counters_zero"] and case["rel_diff"] < 1e-5
