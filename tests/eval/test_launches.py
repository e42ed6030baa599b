"""``ddl bench-kernels --launches``: the kernel launches of a training step on the GPU's eager path, counted on CPU
(dry Triton launches + the ATen ops that launch a kernel)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from deep_delta.cli.main import main
from deep_delta.eval.launches import (
    AtenLaunches,
    cuda_rms_norm_dispatch,
    launches_kernel,
    launches_markdown,
    step_launches,
)
from deep_delta.ops import switches

aten = torch.ops.aten
DDL = ("ddl-dv1", "ddl-tc", "ddl-cc")


@pytest.fixture(autouse=True)
def switched_on(set_switches):
    """The counts here are of the fused paths (the in-kernel sums, the next norm inside the update, TC's one-pass
    backward), which are off by default until a GPU run has passed (``deep_delta.ops.switches``, issue 47)."""
    set_switches(**dict.fromkeys(switches.VARIABLES, True))


@pytest.mark.parametrize(("op", "launches"), [
    (aten.mm.default, True), (aten.add_.Tensor, True), (aten._to_copy.default, True), (aten.clone.default, True),
    (aten.zeros.default, True), (aten.ones_like.default, True), (aten.sum.dim_IntList, True),
    (aten.view.default, False), (aten.t.default, False), (aten.expand.default, False),
    (aten.detach.default, False), (aten.split.Tensor, False), (aten.as_strided.default, False),
    (aten._unsafe_view.default, False), (aten.empty.memory_format, False), (aten.empty_like.default, False),
    (aten.promote_types.default, False),
], ids=str)
def test_which_aten_ops_count_as_launches(op, launches):
    assert launches_kernel(op) is launches


def test_rms_norm_is_one_op_each_way_as_on_cuda_and_only_for_the_block():
    x, w = torch.randn(2, 3, 8, requires_grad=True), torch.ones(8, requires_grad=True)
    with cuda_rms_norm_dispatch(), AtenLaunches() as seen:
        seen.phase = "forward"
        y = F.rms_norm(x, (8,), w, 1e-5)
        seen.phase = "backward"
        y.backward(torch.ones_like(y))
    names = [name for _, name in seen.ops]
    assert names.count("aten._fused_rms_norm") == 1 and names.count("aten._fused_rms_norm_backward") == 1
    assert not any(n in names for n in ("aten.pow", "aten.rsqrt", "aten.mean"))
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "CPU")
    with AtenLaunches() as seen:  # the CPU build's decomposition again
        F.rms_norm(x, (8,), w, 1e-5)
    assert "aten.rsqrt" in [name for _, name in seen.ops]


def test_counts_are_deterministic_and_do_not_depend_on_the_token_count():
    one = step_launches("ddl-cc", "tiny", 1, 8)
    assert one == step_launches("ddl-cc", "tiny", 1, 8)
    more = step_launches("ddl-cc", "tiny", 3, 32)
    assert (more.triton, more.aten) == (one.triton, one.aten)
    assert one.sublayers == 8 and one.count() == one.count("forward") + one.count("backward")
    assert one.count(source="triton") == len(one.triton) and one.count(source="aten") == len(one.aten)


# Issue 40's bound on an eager step's launches per DDL sublayer over the baseline's (ddl-dv1, ddl-cc): 2. At the tiny
# preset (8 sublayers, so the model-level ops weigh more than at small) ddl-tc's read-vector fold in
# layers/compressors.py still adds about 3 (docs/kernels.md, "Launches").
EXTRA_BOUND = {"ddl-dv1": 2, "ddl-cc": 2, "ddl-tc": 4}


def test_every_ddl_variant_keeps_its_launches_per_sublayer_within_the_bound():
    base = step_launches("baseline", "tiny", 1, 8)
    assert base.count(source="triton") == 0 and base.count(source="aten") > 0
    for v in DDL:
        res = step_launches(v, "tiny", 1, 8)
        assert res.per_sublayer() <= base.per_sublayer() + EXTRA_BOUND[v], (v, res.per_sublayer(), base.per_sublayer())
        kernels = res.by_name()
        # per sublayer: the update forward and backward (the fused TC forward is its own kernel), the norm's two;
        # d_v = 1 and CC: every update but the last computes the next sublayer's norm, gate and value
        # (update_norm_*, update_read_norm_*), so one plain update and one norm each way per step
        fwd = "delta_tc_fwd_kernel" if v == "ddl-tc" else "delta_fwd_kernel"
        fused = 0 if v == "ddl-tc" else res.sublayers - 1
        name = "update_norm" if v == "ddl-dv1" else "update_read_norm"
        assert kernels[f"{name}_fwd_kernel"] == kernels[f"{name}_bwd_kernel"] == fused, v
        assert kernels[fwd] == kernels["delta_bwd_kernel"] == res.sublayers - fused, v
        assert (kernels["norm_gate_value_fwd_kernel"] == kernels["norm_gate_value_bwd_kernel"]
                == res.sublayers - fused), v
        # the pre-norms are the kernel's now; the QK norms and the final norm stay
        assert kernels["aten._fused_rms_norm"] == base.by_name()["aten._fused_rms_norm"] - res.sublayers, v


def test_an_extra_launch_in_an_op_shows_up(monkeypatch):
    """One more Triton launch per kernel call of the delta kernels and the fused update + read + norm kernels, one
    more ATen op per norm forward: each appears once per call in the count (ddl-cc: per step one plain update with the
    final read, the fused updates of the other sublayers, one norm kernel, the first sublayer's)."""
    import deep_delta.ops.delta.triton as dt
    import deep_delta.ops.delta.triton_norm as tu
    import deep_delta.ops.norm.triton as nt

    before = step_launches("ddl-cc", "tiny", 1, 8)
    launch, forward = dt.launch, nt.triton_forward

    def twice(kernel, grid, args, writes, **meta):
        launch(kernel, grid, args, writes, **meta)
        launch(kernel, grid, args, writes, **meta)

    def with_a_copy(src, *args, **kwargs):
        src.clone()
        return forward(src, *args, **kwargs)

    monkeypatch.setattr(dt, "launch", twice)
    monkeypatch.setattr(tu, "launch", twice)
    monkeypatch.setattr(nt, "triton_forward", with_a_copy)
    after = step_launches("ddl-cc", "tiny", 1, 8)
    names = before.by_name()
    doubled = sum(names[k] for k in ("delta_fwd_kernel", "delta_bwd_kernel", "update_read_norm_fwd_kernel",
                                     "update_read_norm_bwd_kernel"))
    norms = names["norm_gate_value_fwd_kernel"]
    assert doubled == 2 * before.sublayers and norms == 1
    assert after.count(source="triton") == before.count(source="triton") + doubled
    assert after.count("forward", "aten") == before.count("forward", "aten") + norms
    assert after.count("backward", "aten") == before.count("backward", "aten")
    assert after.by_name()["aten.clone"] == names["aten.clone"] + norms


def test_markdown_names_the_differences_and_how_it_was_counted():
    results = [step_launches(v, "tiny", 1, 8) for v in ("baseline", "ddl-dv1")]
    text = launches_markdown(results, "tiny", "bfloat16", 8)
    base, dv1 = results
    diff = dv1.per_sublayer() - base.per_sublayer()
    assert f"| ddl-dv1 | 8 | {dv1.count(source='triton')} | {dv1.count(source='aten')} | {dv1.count()} |" in text
    assert f"| {dv1.per_sublayer():.2f} | {diff:+.2f} |" in text
    # 7 of the 8 updates fused with the next sublayer's norm (update_norm_*), the last one plain
    assert "- ddl-dv1: " in text and "update_norm_fwd_kernel +0.88" in text and "delta_fwd_kernel +0.12" in text
    assert "aten._fused_rms_norm -1.00" in text
    assert "counted on CPU (Triton launches + ATen compute ops)" in text
    assert "Where a GPU's count can differ" in text and "Not counted: views" in text


def test_ddl_bench_kernels_launches_cli(tmp_path, capsys):
    out = tmp_path / "launches.md"
    assert main(["bench-kernels", "--launches", "--variants", "ddl-cc", "--batch-size", "1", "--seq-len", "8",
                 "--dtype", "bfloat16", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^\| baseline \| 8 \| 0 \|", printed, re.M) and re.search(r"^\| ddl-cc \| 8 \|", printed, re.M)
    assert "preset tiny, bfloat16 autocast" in printed and out.read_text().strip() == printed.strip()
    with pytest.raises(SystemExit) as exc:
        main(["bench-kernels", "--launches", "--traffic"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_the_default_paths_launch_the_unfused_kernels_and_torch_sums(set_switches):
    """With the switches off (the default until a GPU run has passed), no update computes the next norm and the
    partial rows are summed by torch (ATen sums in the backward); the bound above is for the switched-on paths."""
    set_switches(**dict.fromkeys(switches.VARIABLES, False))
    for v in DDL:
        res = step_launches(v, "tiny", 1, 8)
        kernels = res.by_name()
        assert not any(k.startswith(("update_norm", "update_read_norm")) for k in kernels), v
        assert kernels["norm_gate_value_bwd_kernel"] == res.sublayers, v
        assert kernels.get("aten.sum", 0) > 0, (v, sorted(kernels))
        if v == "ddl-tc":
            assert kernels["delta_tc_grad_w_kernel"] == res.sublayers  # the taps' gradient in its own kernel
