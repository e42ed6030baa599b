"""The switches of the paths that have not run on a GPU (issue 47, ``deep_delta.ops.switches``) and the 32-bit
offsets' guard (``deep_delta.ops.launch.check_sizes``).

Off by default in a fresh process; each environment variable read at import, any other value an error naming
it; ``override`` restores what it set. Both ways of each switch are tested where its path is
(tests/ops/test_partials.py, test_kernels_token_read.py, test_kernels_fused_model.py, test_update_and_norm.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from deep_delta.ops import switches
from deep_delta.ops.delta import update_and_channel_read
from deep_delta.ops.launch import MAX_ELEMENTS, check_sizes, count_traffic

CODE = "import json; from deep_delta.ops import switches; print(json.dumps(switches.current()))"
RECORDED = ["INKERNEL_REDUCE", "FUSE_NEXT_NORM", "TC_ONE_PASS", "FUSED_RULES"]  # the names run records keep


def _fresh(env: dict) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in switches.VARIABLES.values()}
    return subprocess.run([sys.executable, "-c", CODE], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)


def test_every_switch_is_off_by_default_and_read_from_its_variable():
    assert list(switches.VARIABLES.values()) == [f"DDL_{name}" for name in RECORDED]
    done = _fresh({})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == dict.fromkeys(RECORDED, False)
    done = _fresh({variable: value for variable, value in zip(switches.VARIABLES.values(), ("1", "On", "yes", "TRUE"))})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == dict.fromkeys(RECORDED, True)
    assert switches.KernelSwitches.from_env({"DDL_FUSED_RULES": "off", "DDL_TC_ONE_PASS": "1"}) == \
        switches.KernelSwitches(tc_one_pass=True)


def test_a_bad_value_names_the_variable():
    done = _fresh({"DDL_TC_ONE_PASS": "maybe"})
    assert done.returncode != 0
    assert "environment variable DDL_TC_ONE_PASS: got 'maybe'; allowed: 1, true, on, yes" in done.stderr


def test_override_sets_and_restores():
    before = switches.get()
    with switches.override(inkernel_reduce=not before.inkernel_reduce) as inside:
        assert switches.get() is inside and inside.inkernel_reduce is (not before.inkernel_reduce)
        assert switches.current()["INKERNEL_REDUCE"] is (not before.inkernel_reduce)
        with switches.override(fused_rules=True):
            assert switches.get().fused_rules and switches.get().inkernel_reduce is inside.inkernel_reduce
        assert switches.get() is inside
    assert switches.get() is before
    with pytest.raises(ValueError, match="unknown switch 'FAST'"):
        with switches.override(FAST=True):
            pass
    with pytest.raises(ValueError, match="unknown switch 'TC_ONE_PASS'"):  # the field's name, not the record's
        with switches.override(TC_ONE_PASS=True):
            pass
    with pytest.raises(ValueError, match="`tc_one_pass` must be True or False, got 1"):
        with switches.override(tc_one_pass=1):
            pass
    assert switches.get() is before


def test_tensors_past_32_bit_offsets_are_refused_before_launching():
    """A launch whose tensor holds more than MAX_ELEMENTS elements (the kernels' int32 offsets) is refused with the
    kernel's name and the argument, on fake tensors (nothing allocated): here a fused CC update of 700K tokens at
    d = 768, d_v = 4 (2.15e9 elements)."""
    n, d, dv = 700_000, 768, 4
    assert n * d * dv > MAX_ELEMENTS
    with FakeTensorMode():
        x, k = torch.empty(n, d, dv, dtype=torch.bfloat16), torch.empty(n, d, dtype=torch.bfloat16)
        v, beta, c = torch.empty(n, dv), torch.empty(n, 1), torch.empty(d, dv)
        with count_traffic(dry=True), pytest.raises(ValueError, match=r"delta_fwd_kernel: argument 0 holds "
                                                                      r"2,150,400,000 elements .* 32-bit offsets"):
            update_and_channel_read(x, k, v, beta, c, backend="triton")
        small = torch.empty(MAX_ELEMENTS // (d * dv), d, dv)
        check_sizes("any_kernel", (small, 3, 1.0))  # at the limit: allowed
