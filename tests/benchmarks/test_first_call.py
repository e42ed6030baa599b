"""benchmarks/tools/first_call.sh in its dry run (stand-in steps, any machine) and reduce_probe.py on CPU.

The device call must end inside its window whatever a step does: each step under its own timeout (the stand-in
for ``probe`` hangs and is killed at its cap), steps skipped when too little time is left, a failed protocol step
turning the in-kernel reduction off for the rest, and results that fit what the device returns (at most 8
files, no folders). It must not spend the window on values it cannot use: DEADLINE, DRY_SCALE, COMMIT and OUT
are checked before any step (issue 58 item 3; the probe of round 5, FC1-FC7), a result it could not keep ends
the call with a non-zero exit, and no value is pasted into a shell string (benchmarks/tools/device_call.sh, the
machinery it shares with cost_call.sh). The probe runs end to end under the Triton interpreter at small shapes,
every check passing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/tools/first_call.sh"


def dry_run(out, timeout=60, **values):
    """first_call.sh's dry run into ``out`` with ``values`` set in its environment (None: unset)."""
    env = dict(os.environ, DRY="1", DEADLINE="6", DRY_SCALE="60", DRY_SLEEP="0.2", OUT=str(out), BEFORE="")
    for name, value in values.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_dry_run_keeps_the_deadline_skips_and_packs(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, DRY="1", DEADLINE="6", DRY_SCALE="60", DRY_SLEEP="0.5", DRY_HANG="probe",
               DRY_FAIL="partials", OUT=str(out), BEFORE="")
    t0 = time.time()
    done = subprocess.run(["bash", str(ROOT / "benchmarks/tools/first_call.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    took = time.time() - t0
    # a failed step, a timed-out one and the skipped ones: the call ends non-zero, one line naming them (FC12)
    assert done.returncode == 5, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("first_call.sh: not every step passed (failed: partials failed (rc 3), probe timed out "
                           "(rc 124); skipped for want of time: "), line
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
    assert (out / "env.txt").read_text().strip()


# each bad value (id: the variable, its value) and what the one line says of it
BAD = {"deadline-abc": ("DEADLINE", "abc"), "deadline-1e3": ("DEADLINE", "1e3"), "deadline-3.5": ("DEADLINE", "3.5"),
       "deadline-negative": ("DEADLINE", "-5"), "scale-0": ("DRY_SCALE", "0"), "scale-abc": ("DRY_SCALE", "abc"),
       "sleep-soon": ("DRY_SLEEP", "soon"), "no-commit-real-run": ("COMMIT", None),
       "out-not-creatable": ("OUT", "file/under/a/file"), "out-not-empty": ("OUT", "tests.txt is a folder"),
       "out-not-writable": ("OUT", "an empty folder of sysfs")}


def said(name, value):
    """What the one line says of a bad value."""
    if name == "DEADLINE":
        return f"DEADLINE must be a whole number of seconds >= 0, got '{value}'"
    if name == "OUT":
        return {"t": "is not empty", "a": "OUT: cannot write", "f": "OUT: cannot create the directory"}[value[0]]
    return {"DRY_SCALE": "DRY_SCALE must be a whole number >= 1", "DRY_SLEEP": "DRY_SLEEP must be a number of seconds >= 0",
            "COMMIT": "COMMIT must name the commit"}[name]


@pytest.mark.parametrize(("name", "value"), list(BAD.values()), ids=list(BAD))
def test_bad_values_are_refused_before_any_step(tmp_path, name, value):
    """Each bad value: one line on stderr naming it, exit 2, in well under a second, and no step run (the probe of
    round 5: DEADLINE=abc ran every step for 1 s and exited 0; an OUT it could not create lost every result and
    exited 0; no COMMIT recorded "unknown"). COMMIT is required for a real run only (the dry run records "dry")."""
    out = tmp_path / "out"
    says = said(name, value)
    values = {name: value}
    if name == "COMMIT":  # a real run without COMMIT: refused before it would run anything
        values.update(DRY="0", PY=sys.executable, DEADLINE="540")  # a real run's DEADLINE: at least env's 15 s
    elif name == "OUT" and value.startswith("file"):
        (tmp_path / "file").write_text("a file, not a folder")
        values["OUT"] = str(tmp_path / value)
    elif name == "OUT" and value.startswith("tests"):
        (out / "tests.txt").mkdir(parents=True)
        values["OUT"] = str(out)
    elif name == "OUT":  # an empty folder no file can be made in, even by root: sysfs refuses new files
        empty = [d for d in (Path("/sys/kernel/software_nodes"), Path("/sys/kernel/security"))
                 if d.is_dir() and not any(d.iterdir())]
        if not empty:
            pytest.skip("no empty sysfs folder here to stand for an OUT that cannot be written")
        values["OUT"] = str(empty[0])
    t0 = time.time()
    done = dry_run(out, **values)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("first_call.sh: ") and says in lines[0], done.stderr
    assert "===" not in done.stdout and time.time() - t0 < 5
    timeline = out / "timeline.tsv"
    assert not timeline.is_file() or len(timeline.read_text().splitlines()) <= 1


def test_the_commit_heads_the_log_and_a_dry_run_records_dry(tmp_path):
    done = dry_run(tmp_path / "out", COMMIT=None, DRY_SLEEP="0", DEADLINE="20")
    assert done.returncode == 0, done.stdout + done.stderr  # every step ran and passed
    assert (tmp_path / "out" / "steps.log").read_text().startswith("=== first_call.sh at commit dry, deadline 20 s")
    done = dry_run(tmp_path / "out2", COMMIT="abc123", DRY_SLEEP="0", DEADLINE="20")
    assert (tmp_path / "out2" / "steps.log").read_text().startswith("=== first_call.sh at commit abc123")


def test_a_result_not_kept_ends_the_call_non_zero(tmp_path):
    """A step that exits 0 without writing its file (the stand-in of DRY_LOSE keeps nothing): the call goes on, says
    which file, and exits 3; the timeline says which step."""
    out = tmp_path / "out"
    done = dry_run(out, DRY_LOSE="bench_on", DRY_SLEEP="0", DEADLINE="20")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "results not kept" in done.stderr and "bench.md" in done.stderr and "samples.jsonl" in done.stderr
    rows = {r.split("\t")[0]: r.split("\t")[4] for r in (out / "timeline.tsv").read_text().splitlines()[1:]}
    assert rows["bench_on"] == "ok, but samples.jsonl not written" and rows["bench_off"] == "ok"
    assert rows["oldtests"] == "ok"  # the steps after it still ran


def test_out_with_quotes_and_semicolons_is_one_path(tmp_path):
    """OUT is a value, never shell code: a quote, a semicolon, a command substitution and spaces in it name one
    folder that every file of the call goes to, and run nothing (the probe of round 5, FC7: OUT was pasted into
    ``bash -c "bench '$OUT/...'"``, so a quote broke the step and a semicolon ran a command)."""
    out = tmp_path / "it's a; touch PWN1; $(touch PWN2) `touch PWN3` dir"
    done = dry_run(out, DRY_SLEEP="0", DEADLINE="20")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {f.name for f in out.iterdir()} >= {"timeline.tsv", "steps.log", "tests.txt", "env.txt", "bench.md",
                                               "samples.jsonl"}
    assert not any(p.name.startswith("PWN") for p in [*tmp_path.iterdir(), *ROOT.iterdir()])


def test_the_bench_step_passes_out_and_its_arguments_as_values(tmp_path):
    """The bench helper itself (benchmarks/tools/device_call.sh) with a stand-in Python that writes what
    ``ddl bench --out FILE`` writes: its table lands in OUT/bench.md under its title and its samples in one line of
    OUT/samples.jsonl with the DDL_* switches, for an OUT full of shell syntax, and nothing else runs."""
    out = tmp_path / "x'; touch PWN; echo '"
    stub = tmp_path / "py"
    stub.write_text(f"""#!/usr/bin/env bash
if [ "$1" = - ]; then exec {sys.executable} "$@"; fi
while [ $# -gt 0 ]; do if [ "$1" = --out ]; then out=$2; fi; shift; done
echo "| variant | tokens/s |" > "$out"
echo '{{"rows": [1, 2]}}' > "${{out%.md}}.json"
""")
    stub.chmod(0o755)
    script = ('NAME=t; source benchmarks/tools/device_call.sh; '
              'env DDL_FUSED_RULES=1 bash -c \'bench "$@"\' bench "on; touch PWN" "$PYTHONPATH" --preset tiny')
    env = dict(os.environ, DRY="1", OUT=str(out), PY=str(stub))
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "## on; touch PWN\n\n| variant | tokens/s |" in (out / "bench.md").read_text()
    [line] = (out / "samples.jsonl").read_text().splitlines()
    sample = json.loads(line)
    assert sample["title"] == "on; touch PWN" and sample["bench"] == {"rows": [1, 2]}
    assert sample["switches"]["DDL_FUSED_RULES"] == "1"
    assert not any(p.name == "PWN" for p in [*tmp_path.iterdir(), *ROOT.iterdir()])


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
