"""benchmarks/tools/cost_call.sh, the queue's second device call (issue 59, item 2), on any machine.

Its dry run (stand-in steps) keeps the deadline, runs the steps in order, turns the fused rules off for the
switched-on bench when their tests fail, and packs what the device returns (at most 8 files, no folders); its values
are checked before any step (the machinery first_call.sh shares, benchmarks/tools/device_call.sh). A run with a
stand-in Python records the exact command lines: one ``ddl bench --compile`` process per switch setting, the seven
designs at the 124M shape, 32 x 1024 tokens, bf16 autocast, with every switch on, then every switch off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/tools/cost_call.sh"
VARIANTS = ["baseline", "peri-ln", "ddl-cc", "ddl-cc-write", "ddl-cc-untied", "mhc", "attnres-block"]


def call(out, timeout=60, **values):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDL_")}  # the call sets the switches it needs
    env.update(DRY="1", DEADLINE="9", DRY_SCALE="60", DRY_SLEEP="0.2", OUT=str(out))
    env.update(values)
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def timeline(out):
    rows = [line.split("\t") for line in (out / "timeline.tsv").read_text().splitlines()[1:]]
    return {r[0]: (r[3], r[4]) for r in rows}


def test_the_dry_run_passes_in_order_and_packs_small(tmp_path):
    out = tmp_path / "out"
    t0 = time.time()
    done = call(out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert timeline(out) == {name: ("0", "ok") for name in ("env", "rules", "bench_on", "bench_off")}
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.is_file() for f in files)
    assert {f.name for f in files} == {"timeline.tsv", "steps.log", "tests.txt", "env.txt", "bench.md",
                                       "samples.jsonl"}
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2  # one line per bench process
    assert time.time() - t0 < 9 + 5


def test_a_hung_bench_is_killed_at_its_cap_and_the_deadline_holds(tmp_path):
    out = tmp_path / "out"
    t0 = time.time()
    done = call(out, DEADLINE="5", DRY_HANG="bench_on")
    status = timeline(out)
    assert status["bench_on"] == ("124", "timed out")  # its cap, 200 / 60 -> 4 s, or the time left
    assert status["bench_off"][1].startswith("skipped")
    # a timed-out step and a skipped one: the call ends non-zero, naming them (FC12)
    assert done.returncode == 5, done.stdout + done.stderr
    assert done.stderr.strip() == (f"cost_call.sh: not every step passed (failed: bench_on timed out (rc 124); "
                                   f"skipped for want of time: bench_off); timeline.tsv in {out} says what ran")
    assert time.time() - t0 < 5 + 10


def test_failed_rule_tests_turn_the_fused_rules_off_for_the_bench(tmp_path):
    out = tmp_path / "out"
    done = call(out, DRY_FAIL="rules")
    assert timeline(out)["rules"] == ("3", "failed") and timeline(out)["bench_on"] == ("0", "ok")
    assert done.returncode == 5 and "failed: rules failed (rc 3)" in done.stderr, done.stdout + done.stderr
    assert "bench_on with DDL_FUSED_RULES=0" in (out / "steps.log").read_text()


def test_bad_values_are_refused_before_any_step(tmp_path):
    done = call(tmp_path / "out", INKERNEL="2", DEADLINE="1e3")
    assert done.returncode == 2
    assert sorted(done.stderr.splitlines()) == [
        "cost_call.sh: DEADLINE must be a whole number of seconds >= 0, got '1e3'",
        "cost_call.sh: INKERNEL must be 0 or 1, got '2'"]
    assert not (tmp_path / "out").exists()


def test_the_command_lines_of_a_real_run(tmp_path):
    """A real run (DRY=0) whose Python is a stand-in that records its arguments and the DDL_* switches and writes what
    ``ddl bench --out`` writes: the tests of the fused rules on 8 processes, then two bench processes with the seven
    designs, ``--compile --preset small --dtype bfloat16 --batch-size 32 --seq-len 1024``, the first with every switch
    on, the second with every switch off; their tables and samples land in OUT (an OUT with a quote in it). The
    stand-ins of a GPU: an ``nvidia-smi`` on PATH, and the stand-in Python answers the environment check (its
    script on stdin, no arguments) as a CUDA torch would."""
    out, log = tmp_path / "it's out", tmp_path / "calls.txt"
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771 MiB'\n")
    smi.chmod(0o755)
    stub = tmp_path / "py"
    stub.write_text(f"""#!/usr/bin/env bash
printf '%s|%s\\n' "$(env | grep '^DDL_' | sort | tr '\\n' ' ')" "$*" >> {str(log)!r}
if [ "$*" = - ]; then cat > /dev/null; echo "torch 2.11.0+cu130 (stand-in)"; exit 0; fi
if [ "$1" = - ]; then exec {sys.executable} "$@"; fi
if [ "$1 $2" = "-m pytest" ]; then echo "55 passed"; exit 0; fi
out=""; while [ $# -gt 0 ]; do if [ "$1" = --out ]; then out=$2; fi; shift; done
if [ -n "$out" ]; then echo "| Model | Train tok/s |" > "$out"; echo '{{"rows": []}}' > "${{out%.md}}.json"; fi
""")
    stub.chmod(0o755)
    done = call(out, DRY="0", COMMIT="abc123", PY=str(stub), WHEELS=str(tmp_path / "no-wheels"), DEADLINE="400",
                PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stdout + done.stderr
    calls = [line.split("|", 1) for line in log.read_text().splitlines()]
    tests = [(env, args) for env, args in calls if args.startswith("-m pytest")]
    assert tests == [("DDL_INKERNEL_REDUCE=1 ", "-m pytest -q -p no:cacheprovider -x -n 8 tests/ops/test_fused_rules.py")]
    benches = [(env, args.split()) for env, args in calls if args.startswith("-m deep_delta.cli.main bench")]
    assert len(benches) == 2
    on, off = benches
    assert on[0] == "DDL_FUSED_RULES=1 DDL_FUSE_NEXT_NORM=1 DDL_INKERNEL_REDUCE=1 DDL_TC_ONE_PASS=1 "
    assert off[0] == "DDL_FUSED_RULES=0 DDL_FUSE_NEXT_NORM=0 DDL_INKERNEL_REDUCE=0 DDL_TC_ONE_PASS=0 "
    for _, args in benches:
        assert args[:4] == ["-m", "deep_delta.cli.main", "bench", "--preset"] and args[4] == "small"
        for flag, value in (("--device", "cuda"), ("--dtype", "bfloat16"), ("--batch-size", "32"),
                            ("--seq-len", "1024"), ("--decode-tokens", "0")):
            assert args[args.index(flag) + 1] == value
        assert "--compile" in args
        start = args.index("--variants") + 1
        assert args[start:start + len(VARIANTS)] == VARIANTS
    assert timeline(out)["bench_on"] == ("0", "ok") and timeline(out)["bench_off"] == ("0", "ok")
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["switches"]["DDL_FUSED_RULES"] for s in samples] == ["1", "0"]
    assert (out / "bench.md").read_text().count("| Model | Train tok/s |") == 2
    assert "commit: abc123" in (out / "env.txt").read_text()
