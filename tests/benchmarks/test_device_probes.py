"""The device-session probes of benchmarks/tools/ run end to end on CPU, so a broken probe is found here and not
on the GPU machine, where each minute is scarce (the kernels under the Triton interpreter; the decoder traced with
torch.compile's "eager" backend)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from helpers import load_tool

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "benchmarks" / "tools"


def _load(name: str):
    return load_tool(name)


def test_tune_kernels_sweeps_and_restores_the_library_settings(tmp_path):
    import deep_delta.ops.delta.triton as dt
    import deep_delta.ops.delta.triton_token as tt
    import deep_delta.ops.launch as gl

    before = (dt.delta_warps, dt.delta_rows, gl.PROGRAMS_PER_SM, dt.READ_BWD_PER_SM, tt.CHUNK, tt.PREFETCH, dt.launch)
    tune = _load("tune_kernels")
    assert tune.main(["--device", "cpu", "--quick", "--dvs", "1", "--only", "delta fwd", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "tune_kernels.json").read_text())
    assert rows[0]["setting"] == "library"
    assert {tuple(sorted(r["setting"].items())) for r in rows[1:]} == {
        (("rows", r), ("warps", w)) for r in (1, 4) for w in (1,)
    }
    assert all(r["ms"] > 0 and r["gbs"] > 0 for r in rows)
    assert "### delta fwd, d_v = 1" in (tmp_path / "tune_kernels.md").read_text()
    assert (dt.delta_warps, dt.delta_rows, gl.PROGRAMS_PER_SM, dt.READ_BWD_PER_SM, tt.CHUNK, tt.PREFETCH, dt.launch) == before


def test_tune_kernels_times_the_library_setting_of_the_tc_backward(tmp_path):
    """The TC backward's call (it takes x' since the taps' gradient reads it) runs as the library launches it."""
    tune = _load("tune_kernels")
    assert tune.main(["--device", "cpu", "--quick", "--dvs", "4", "--only", "delta bwd + TC read", "--no-sweep",
                      "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "tune_kernels.json").read_text())
    assert rows[0]["setting"] == "library" and all(r["ms"] > 0 and r["gbs"] > 0 for r in rows)


def _launch_dtypes(fn) -> dict[str, set[tuple]]:
    """kernel -> the argument dtypes of each of its launches while ``fn`` runs (dry: nothing is launched)."""
    from deep_delta.eval.launches import argument_dtypes, kernel_name
    from deep_delta.ops.launch import count_traffic

    with count_traffic(dry=True, keep_calls=True) as counter:
        fn()
    found: dict[str, set[tuple]] = {}
    for kernel, _, args, _ in counter.calls:
        found.setdefault(kernel_name(kernel), set()).add(argument_dtypes(args))
    return found


def _agree(a: tuple, b: tuple) -> bool:
    """Two launches' argument dtypes agree where both pass a tensor (a placeholder or a scalar is None)."""
    return len(a) == len(b) and all(x == y or x is None or y is None for x, y in zip(a, b))


@pytest.mark.parametrize(("dv", "variants"), [(1, ("ddl-dv1",)), (4, ("ddl-cc", "ddl-tc"))], ids=["dv1", "dv4"])
def test_tune_kernels_inputs_have_the_dtypes_the_model_passes(dv, variants):
    """Each kernel tune_kernels.py times gets its arguments in the dtypes the model passes that kernel in a training
    step on the GPU's path under bf16 autocast (deep_delta.eval.launches: the Triton path on CPU tensors, dry
    launches; a d_v = 1 state in fp32, a d_v > 1 state in bf16), and every way the model launches such a kernel is
    timed with its own dtypes."""
    import torch

    from deep_delta.eval.launches import step_launches
    from deep_delta.ops import switches

    model: dict[str, set[tuple]] = {}
    tune = _load("tune_kernels")
    a = tune.inputs(2, 8, 16, dv, 4, torch.device("cpu"))
    timed: dict[str, set[tuple]] = {}
    # the kernels tune_kernels.py times include the paths behind the switches (issue 47): counted with them on
    with switches.override(inkernel_reduce=True, fuse_next_norm=True, tc_one_pass=True):
        for v in variants:
            for la in step_launches(v, "tiny", 1, 8, "bfloat16").triton:
                model.setdefault(la.kernel, set()).add(la.dtypes)
        for fn, _ in tune.kernels(a).values():
            for kernel, sigs in _launch_dtypes(fn).items():
                timed.setdefault(kernel, set()).update(sigs)
    assert timed and set(timed) <= set(model)
    for kernel, sigs in timed.items():
        for sig in sigs:
            assert any(_agree(sig, m) for m in model[kernel]), f"d_v={dv} {kernel}: timed with {sig}, model: {model[kernel]}"
        for m in model[kernel]:
            assert any(_agree(sig, m) for sig in sigs), f"d_v={dv} {kernel}: the model's {m} is not timed: {sigs}"


def test_tune_kernels_names_device_commit_and_the_library_launch(tmp_path):
    tune = _load("tune_kernels")
    assert tune.main(["--device", "cpu", "--quick", "--dvs", "4", "--only", "delta fwd + CC read", "--no-sweep",
                      "--out", str(tmp_path)]) == 0
    text = (tmp_path / "tune_kernels.md").read_text()
    header = text.splitlines()[0]
    assert header.startswith("## tune_kernels on cpu (interpreter), torch ") and ", library commit " in header
    assert re.search(r"^\| library: delta_fwd_kernel grid \d+, num_warps=\d+, ROWS=\d+ \|", text, re.M), text
    rows = json.loads((tmp_path / "tune_kernels.json").read_text())
    assert rows[0]["launch"].startswith("delta_fwd_kernel grid ")


def test_decode_probe_times_both_paths_and_compares_logits(tmp_path, monkeypatch):
    import deep_delta.hf.decode as decode

    monkeypatch.setattr(decode, "DEFAULT_BACKEND", "eager")
    probe = _load("decode_probe")
    args = ["--device", "cpu", "--preset", "tiny", "--variants", "baseline", "ddl-cc", "--batch", "2", "--seq", "16",
            "--tokens", "3", "--repeats", "1", "--dtype", "float32", "--out", str(tmp_path)]
    assert probe.main(args) == 0
    table = (tmp_path / "decode_probe.md").read_text()
    line = next(x for x in table.splitlines() if x.startswith("| ddl-cc"))
    err = float(line.split("|")[7])
    assert err < 1e-4, line  # fp32: the static cache gives the dynamic cache's logits
    samples = json.loads((tmp_path / "decode_probe.json").read_text())
    assert set(samples) == {f"{v} {m}" for v in ("baseline", "ddl-cc") for m in ("eager", "static")}
    assert all(s > 0 and not math.isnan(s) for v in samples.values() for s in v)


@pytest.mark.parametrize("script", ["session.sh", "evidence_124m.sh"])
def test_session_script_parses(script):
    import subprocess

    subprocess.run(["bash", "-n", str(TOOLS / script)], check=True)


def test_op_dispatch_probe_prints_both_paths():
    """benchmarks/tools/op_dispatch.py (host time of the custom ops against the Functions) runs in its own process: it
    points the ops' CPU kernels at the Triton wrappers, which must not leak into this one."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, str(TOOLS / "op_dispatch.py"), "--iters", "2", "--repeats",
                           "1"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "us" not in line
            and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows] == ["norm + gate + value", "delta update", "update + CC read"]
    for r in rows:
        op_us, fn_us = (float(x) for x in r.split("|")[2:4])
        assert op_us > 0 and fn_us > 0


def test_saved_by_source_counts_the_state_and_the_differences():
    """benchmarks/tools/saved_by_source.py: DDL-CC on the GPU's path keeps one bf16 (d, d_v) state per sublayer (the
    first from the expander, the others from the fused update + read), the norm op's source and the update's k,
    and none of the baseline's fp32 norm inputs; each difference row is the two variants' rows subtracted."""
    saved = _load("saved_by_source")
    layers, tokens, d, dv = 2, 24, 256, 4  # preset tiny: d = 256, d_v = 4
    cc = saved.saved_by_source("ddl-cc", "tiny", layers, tokens)
    base = saved.saved_by_source("baseline", "tiny", layers, tokens)
    states = sum(b for (where, dtype, last), (b, _) in cc.items() if dtype == "bfloat16" and last == dv)
    assert states == 2 * d * dv * 2  # 2 sublayers per layer, bf16
    assert any("norm_gate_value_triton" in where for where, _, _ in cc)  # the Triton path ran (dry)
    assert not any(dtype == "float32" and last == d and "_update_inputs" in where for where, dtype, last in cc)
    # the baseline's residual reads its state in fp32 for its norm (layers/additive.py)
    assert any(dtype == "float32" and last == d and "additive.py" in where for where, dtype, last in base)
    out = saved.report({"baseline": base, "ddl-cc": cc}, "tiny", layers, tokens)
    totals = [int(line.split(": ")[1].split()[0].replace(",", "").replace("+", "")) for line in out.splitlines()
              if line.startswith(("total:", "difference:"))]
    assert totals[2] == totals[1] - totals[0] == sum(b for b, _ in cc.values()) - sum(b for b, _ in base.values())
    with pytest.raises(ValueError, match="`tokens` got 256"):
        saved.saved_by_source("baseline", "tiny", 1, 256)
    with pytest.raises(SystemExit):
        saved.main(["--variants", "ddl-cc"])  # no baseline to subtract


@pytest.mark.parametrize("env, said", [
    ({"STEPS": "abc"}, "STEPS got 'abc'; allowed: an integer >= 1"),
    ({"BATCH": "1;rm -rf x"}, "BATCH got '1;rm -rf x'; allowed: an integer >= 1"),
    ({"LR": "nan"}, "LR got 'nan'; allowed: a number > 0"),
    ({"LRS": "1e-3 0"}, "LRS got '1e-3 0'; allowed: numbers > 0"),
    ({"SEEDS": "0 x"}, "SEEDS got '0 x'; allowed: integers >= 0"),
    ({"CORPUS_MB": "-5"}, "CORPUS_MB got '-5'; allowed: a number > 0"),
])
def test_evidence_script_checks_its_numbers_before_any_work(tmp_path, env, said):
    """benchmarks/tools/evidence_124m.sh: a number that is not one (bash's arithmetic read STEPS=abc as 0) is named
    before the corpus is built or anything is written."""
    import os
    import subprocess

    run = subprocess.run(["bash", str(TOOLS / "evidence_124m.sh")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
                              "PY": "false", **env})
    assert run.returncode == 2 and said in run.stderr, run.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
