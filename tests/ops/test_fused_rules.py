"""The write-only and untied update rules on the delta rule's fused kernels (issue 59, item 1; the ``fused_rules`` switch).

Each fused update kernel has the rule as a mode (``ERASE`` in ops/delta/triton.py: 1 the delta rule, 0 the write-only
control, which reads no state, 2 the untied gates, beta (..., 2) = (erase, write)), and the sublayer's norm, gate and
value kernels a gate of two outputs (``GATES``) for the untied rule's next sublayer. Under the Triton interpreter
(native on CUDA), against the plain reference (``delta_update_reference`` through ``rule_reference``; the references
of the reads and of the norm): values and the gradients of x, k, v, both gates and every weight, for

- the update alone (d_v = 1 and 4), fused with the next CC read (the read's weight), with the next TC read (K = 4 and
  5, the one-pass backward on and off), with the next sublayer's norm, gate and value (d_v = 1, and d_v > 1 through
  its CC read; the next gate of one output and of two), fp32 and bf16 states;
- the norm, gate and value of a two-output gate alone, and its closed-form lean backward;
- the custom ops' lean kernels (``backend="auto"`` off the Triton path, fp64) and ``opcheck`` with a rule;
- the switch: off, the rules run their lean path as before (no kernel, the same bits), on, the kernels;
- whole models (ddl-cc-write, ddl-cc-untied, ddl-tc-write, ddl-dv1-untied): with the switch on every update fuses where
  ddl-cc's / ddl-tc's / ddl-dv1's does (the kernels launched), and forward and backward equal the same model with the
  switch off (the lean update, then the separate read or norm).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from collections import Counter  # noqa: E402

import pytest  # noqa: E402
from tests.ops.test_kernels import DEVICE, delta_inputs, run_both  # noqa: E402
from tests.ops.test_norm_gate_value import compare as compare_norm  # noqa: E402
from tests.ops.test_norm_gate_value import norm_inputs  # noqa: E402
from tests.ops.test_update_and_norm import (  # noqa: E402
    compare,
    compare_read,
    make_inputs,
    make_read_inputs,
    read_triton_fn,
    triton_fn,
)

from deep_delta import DDLConfig, DDLForCausalLM  # noqa: E402
from deep_delta.ops import launch as ops_launch  # noqa: E402
from deep_delta.ops.compress.naive import channel_compress_reference, token_compress_reference  # noqa: E402
from deep_delta.ops.delta import (  # noqa: E402
    apply_update,
    untied_update,
    update_and_channel_read,
    update_and_token_read,
)
from deep_delta.ops.delta.lean import untied_update_lean, write_update_lean  # noqa: E402
from deep_delta.ops.delta.naive import rule_reference  # noqa: E402
from deep_delta.ops.launch import count_traffic  # noqa: E402
from deep_delta.ops.norm import norm_gate_value  # noqa: E402
from helpers import DEBUG  # noqa: E402

RULES = ["write", "untied", "delta"]
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]


@pytest.fixture(autouse=True)
def fused_rules(set_switches):
    """The rules' kernels switched on (off by default until a GPU run has passed), the next norm fusion too."""
    set_switches(fused_rules=True)
    set_switches(fuse_next_norm=True)


def gates(rule, beta, seed=11):
    """The rule's gates from a (..., 1) gate: (erase, write) for the untied rule, the erase gate drawn apart."""
    if rule != "untied":
        return beta
    erase = 2 * torch.rand(beta.shape, generator=torch.Generator().manual_seed(seed))
    return torch.cat([erase.to(beta.device, beta.dtype), beta], dim=-1)


def reference(rule):
    return lambda x, k, v, b: rule_reference(rule, x, k, v, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("lead", "d", "dv"), [((2, 3), 7, 1), ((5,), 16, 4)], ids=["d7-dv1", "d16-dv4"])
@pytest.mark.parametrize("rule", RULES)
def test_the_update_in_each_mode_matches_the_reference(rule, lead, d, dv, dtype):
    x, k, v, beta = delta_inputs(lead, d, dv, dtype, seed=d + dv)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    fast = lambda x, k, v, b: apply_update(rule, x, k, v, b, backend="triton")  # noqa: E731
    with count_traffic() as counter:
        run_both(fast, reference(rule), (x, k, v, gates(rule, beta)), (g,), dtype)
    assert [la.kernel for la in counter.launches] == ["delta_fwd_kernel", "delta_bwd_kernel"]


def test_the_write_only_backward_reads_no_state():
    """The write-only mode skips the read k^T x: its backward launch does not take the state (G in its place)."""
    x, k, v, beta = delta_inputs((4,), 16, 4, torch.float32)
    x.requires_grad_()
    backward_reads = {}
    for rule in ("write", "delta"):
        out = apply_update(rule, x, k, v, beta, backend="triton")
        with count_traffic() as counter:
            out.backward(torch.ones_like(out))
        [launch] = counter.launches
        backward_reads[rule] = launch.read_bytes
    assert backward_reads["delta"] - backward_reads["write"] == x.numel() * x.element_size()


def test_untied_update_takes_its_gates_apart():
    """``untied_update(x, k, v, beta_erase, beta_write)`` on the kernels equals the reference (the gates joined)."""
    x, k, v, beta = delta_inputs((3,), 12, 3, torch.float32, seed=4)
    erase = gates("untied", beta)[..., :1]
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    run_both(lambda x, k, v, be, bw: untied_update(x, k, v, be, bw, backend="triton"),
             lambda x, k, v, be, bw: rule_reference("untied", x, k, v, torch.cat([be, bw], -1)),
             (x, k, v, erase, beta), (g,), torch.float32)


@pytest.mark.parametrize("rule", ["write", "untied"])
def test_switched_off_the_rules_run_their_lean_path(rule, set_switches):
    """The ``fused_rules`` switch off: no kernel, the lean functions' bits, the model's plain updates (as before the switch)."""
    set_switches(fused_rules=False)
    x, k, v, beta = delta_inputs((2, 3), 12, 4, torch.float32, seed=3)
    both = gates(rule, beta)
    with count_traffic() as counter:
        got = apply_update(rule, x, k, v, both, backend="triton")
    assert counter.launches == []
    want = write_update_lean(x, k, v, beta) if rule == "write" else untied_update_lean(x, k, v, both[..., :1],
                                                                                        both[..., 1:])
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("rule", RULES)
def test_the_update_with_the_next_cc_read(rule, dtype, monkeypatch):
    """The persistent backward grid with more tokens than programs (3): the read's weight gradient summed over
    programs."""
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 3)
    x, k, v, beta = delta_inputs((2, 4), 12, 4, dtype, seed=5)
    gen = torch.Generator().manual_seed(6)
    c = torch.randn(12, 4, generator=gen).to(DEVICE)
    grads = (torch.randn(x.shape, generator=gen).to(DEVICE), torch.randn(2, 4, 12, generator=gen).to(DEVICE))

    def ref(x, k, v, b, c):
        out = rule_reference(rule, x, k, v, b)
        return out, channel_compress_reference(out, c)

    run_both(lambda *a: update_and_channel_read(*a, backend="triton", rule=rule), ref, (x, k, v, gates(rule, beta), c),
             grads, dtype)


@pytest.mark.parametrize("one_pass", [True, False], ids=["one-pass", "two-kernels"])
@pytest.mark.parametrize("taps", [4, 5])
@pytest.mark.parametrize("rule", ["write", "untied"])
def test_the_update_with_the_next_tc_read(rule, taps, one_pass, monkeypatch, set_switches):
    """Chunks of 4 tokens (the halo crosses chunks), a backward grid of 3 programs (its window crosses sequences),
    bf16 state."""
    from deep_delta.ops.delta import triton_token

    set_switches(tc_one_pass=one_pass)
    monkeypatch.setattr(triton_token, "CHUNK", 4)
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 3)
    x, k, v, beta = delta_inputs((2, 7), 9, 3, torch.bfloat16, seed=taps)
    gen = torch.Generator().manual_seed(7)
    w = (torch.randn(taps, 9, 3, generator=gen) / 3).to(DEVICE)
    grads = (torch.randn(x.shape, generator=gen).to(DEVICE), torch.randn(2, 7, 9, generator=gen).to(DEVICE))

    def ref(x, k, v, b, w):
        out = rule_reference(rule, x, k, v, b)
        return out, token_compress_reference(out, w)

    run_both(lambda *a: update_and_token_read(*a, backend="triton", rule=rule), ref, (x, k, v, gates(rule, beta), w),
             grads, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("next_gates", [1, 2], ids=["next-1-gate", "next-2-gates"])
@pytest.mark.parametrize("rule", RULES)
def test_the_update_with_the_next_norm(rule, next_gates, dtype, monkeypatch, set_switches):
    """d_v = 1 (``update_norm_*``) and d_v = 3 through the next CC read (``update_read_norm_*``), more tokens than
    programs (4), the weight gradients summed in the launch: x', the next sublayer's (c, beta', v') and every gradient
    against the reference (the next sublayer reading the kernel's stored x', as tests/ops/test_update_and_norm.py)."""
    set_switches(inkernel_reduce=True)
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 4)
    compare(triton_fn, make_inputs((3, 5), 17, 1, dtype, seed=3, rule=rule, gates=next_gates), rule=rule)
    compare_read(read_triton_fn, make_read_inputs((3, 5), 12, 3, dtype, seed=4, rule=rule, gates=next_gates),
                 rule=rule)


@pytest.mark.parametrize("rule", ["write", "untied"])
def test_the_lean_paths_and_closed_forms_in_fp64(rule):
    """The custom ops' lean kernels (``backend="auto"`` off the Triton path, fp64 on CUDA) against the reference to
    1e-12: the update alone, with the next CC read, with the next norm (d_v = 1 and through the read, the next gate
    of two outputs), values and every gradient."""
    from tests.ops.test_update_and_norm import read_upstream, run, upstream

    from deep_delta.ops.delta import update_and_norm, update_and_norm_reference
    from deep_delta.ops.delta.library import update_norm_with_op, update_with_op

    x, k, v, beta = (t.double() for t in delta_inputs((3, 2), 10, 3, torch.float32, seed=8))
    both = gates(rule, beta)
    g = torch.randn(x.shape, dtype=torch.float64, device=DEVICE)
    run_both(lambda *a: update_with_op(*a, None, 1e-5, "auto", rule), reference(rule), (x, k, v, both), (g,),
             torch.float64)
    c = torch.randn(10, 3, dtype=torch.float64, device=DEVICE)

    def ref_read(x, k, v, b, c):
        out = rule_reference(rule, x, k, v, b)
        return out, channel_compress_reference(out, c)

    run_both(lambda *a: update_with_op(*a, 1e-5, "auto", rule), ref_read, (x, k, v, both, c),
             (g, torch.randn(3, 2, 10, dtype=torch.float64, device=DEVICE)), torch.float64)
    for inputs, ups, read in ((make_inputs((4, 3), 12, 1, torch.float64, seed=9, rule=rule, gates=2), upstream, False),
                              (make_read_inputs((4, 3), 12, 3, torch.float64, seed=9, rule=rule, gates=2),
                               read_upstream, True)):
        grads = ups(inputs)

        def via_op(x, k, v, beta, *rest, read=read, **kw):
            read_w, weights = (rest[0], rest[1:]) if read else (None, rest)
            flat = (x.reshape(12, *x.shape[2:]), k.reshape(12, -1), v.reshape(12, -1), beta.reshape(12, -1))
            outs = update_norm_with_op(*flat, read_w, *weights, **kw, backend="auto", rule=rule)
            return tuple(o.reshape(*x.shape[:2], *o.shape[1:]) for o in outs)

        def ref(x, k, v, beta, *rest, read=read, **kw):
            read_w, weights = (rest[0], rest[1:]) if read else (None, rest)
            return update_and_norm_reference(x, k, v, beta, *weights, read=read_w, rule=rule, **kw)

        def lean(x, k, v, beta, *rest, read=read, **kw):
            read_w, weights = (rest[0], rest[1:]) if read else (None, rest)
            return update_and_norm(x, k, v, beta, *weights, read=read_w, rule=rule, backend="torch", **kw)

        want, want_grads = run(ref, inputs, grads)
        for fn in (via_op, lean):
            got, got_grads = run(fn, inputs, grads)
            for a, b in zip([*got, *got_grads], [*want, *want_grads]):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("lead", "d", "dv"), [((7,), 33, 1), ((3, 5), 48, 4)], ids=["n7-d33-dv1", "n15-d48-dv4"])
def test_norm_gate_value_with_two_gates(lead, d, dv, dtype, monkeypatch, set_switches):
    """The untied sublayer's input stage: the gate (2, d), beta (..., 2), on the kernels (more tokens than
    programs, the reductions in the launch) and the lean path, against the reference."""
    set_switches(inkernel_reduce=True)
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: 4)
    src, nw, _, _, wv, bv = norm_inputs(lead, d, dv, dtype, seed=d)
    gen = torch.Generator().manual_seed(5)
    gw, gb = (0.5 * torch.randn(2, d, generator=gen)).to(DEVICE), (0.5 * torch.randn(2, generator=gen)).to(DEVICE)
    import tests.ops.test_norm_gate_value as norm_tests

    plain = norm_tests.upstream
    monkeypatch.setattr(norm_tests, "upstream", lambda s, dv, seed=1: (
        plain(s, dv, seed)[0], torch.randn(*s.shape[:-1], 2, generator=torch.Generator().manual_seed(9)).to(DEVICE),
        plain(s, dv, seed)[2]))
    for backend in ("triton", "torch"):
        compare_norm(lambda *a, backend=backend, **kw: norm_gate_value(*a, **kw, backend=backend),
                     (src, nw, gw, gb, wv, bv), dtype)


def test_the_closed_form_norm_backward_with_two_gates():
    from deep_delta.ops.norm.lean import norm_gate_value_backward_lean, norm_gate_value_lean

    gen = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    src, weights = r(9, 12), (1 + 0.3 * r(12), 0.5 * r(2, 12), 0.5 * r(2), 0.5 * r(3, 12), 0.5 * r(3))
    ups = (r(9, 12), r(9, 2), r(9, 3))
    leaves = [t.clone().requires_grad_() for t in (src, *weights)]
    torch.autograd.backward(norm_gate_value_lean(*leaves, eps=1e-5, beta_max=2.0, value_scale=4.0), ups)
    closed = norm_gate_value_backward_lean(*ups, src, *weights, 1e-5, 2.0, 4.0)
    for a, leaf in zip(closed, leaves):
        torch.testing.assert_close(a, leaf.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rule", ["write", "untied"])
def test_opcheck_of_the_ops_with_a_rule(rule):
    """``torch.library.opcheck`` of the update ops and the update + next norm ops with the rule (the kernels'
    ``backend="triton"``, fp32; the next gate of two outputs)."""
    from deep_delta.ops.delta.library import (
        delta_update_backward_op,
        delta_update_op,
        delta_update_read_backward_op,
        delta_update_read_op,
        update_norm_op,
        update_read_norm_op,
    )

    x, k, v, beta = delta_inputs((4,), 8, 2, torch.float32, seed=2)
    x, k, v = x.reshape(4, 8, 2), k.reshape(4, 8), v.reshape(4, 2)
    beta = gates(rule, beta.reshape(4, 1)).contiguous()
    c = torch.randn(8, 2, device=DEVICE)
    g, gin = torch.randn(4, 8, 2, device=DEVICE), torch.randn(4, 8, device=DEVICE)
    out = delta_update_op(x, k, v, beta, 1e-5, rule, "triton")
    leaves = lambda *t: [a.clone().requires_grad_() for a in t]  # noqa: E731
    for op, args in ((delta_update_op, (*leaves(x, k, v, beta), 1e-5, rule, "triton")),
                     (delta_update_read_op, (*leaves(x, k, v, beta, c), 1e-5, rule, "triton")),
                     (delta_update_backward_op, (g, x, k, v, beta, 1e-5, rule, "triton")),
                     (delta_update_read_backward_op, (g, gin, x, out, k, v, beta, c, 1e-5, rule, "triton"))):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    xd, kd, vd, bd, *w = make_inputs((4,), 8, 1, rule=rule, gates=2)
    torch.library.opcheck(update_norm_op, (*leaves(xd, kd, vd, bd, *w), 1e-5, 1e-5, 2.0, 4.0, None, rule, "triton"),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    xr, kr, vr, br, read, *w = make_read_inputs((4,), 8, 2, rule=rule, gates=2)
    torch.library.opcheck(update_read_norm_op, (*leaves(xr, kr, vr, br, read, *w), 1e-5, 1e-5, 2.0, 4.0, None, rule,
                                                "triton"),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


# ----------------------------------------------------------------------------- whole models

# per variant: the kernels a fused training step (2 blocks, 4 sublayers) launches, each direction
MODEL_KERNELS = {
    "ddl-cc-write": {"update_read_norm_fwd_kernel": 3, "update_read_norm_bwd_kernel": 3, "delta_fwd_kernel": 1},
    "ddl-cc-untied": {"update_read_norm_fwd_kernel": 3, "update_read_norm_bwd_kernel": 3, "delta_fwd_kernel": 1},
    "ddl-tc-write": {"delta_tc_fwd_kernel": 4, "delta_bwd_kernel": 4},
    "ddl-dv1-untied": {"update_norm_fwd_kernel": 3, "update_norm_bwd_kernel": 3, "delta_fwd_kernel": 1,
                       "norm_gate_value_fwd_kernel": 1},
}


def model_step(model, ids):
    model.zero_grad(set_to_none=True)
    with count_traffic() as counter:
        out = model(ids, labels=ids)
        out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), out.logits.detach(), grads, Counter(la.kernel for la in counter.launches)


@pytest.mark.parametrize("variant", list(MODEL_KERNELS))
def test_a_model_fuses_where_the_delta_rule_does_and_equals_its_unfused_self(variant, set_switches):
    """The switch on: every update of the twin or untied model runs a fused kernel where its delta variant's does
    (the update with the next read or the next norm, the last with the final read), the same kernels as the delta
    variant's step; forward and backward equal the model with the switch off (its lean updates, then the separate
    reads and norms): logits and loss 1e-5, every gradient 1e-5 relative as one vector (a small one, on its own,
    1e-3: tests/ops/test_kernels_fused_model.py's TC bound)."""
    set_switches(tc_one_pass=True)
    cfg = DDLConfig.from_variant(variant, "tiny", delta_backend="triton", **DEBUG)
    model = DDLForCausalLM(cfg).to(DEVICE)
    with torch.no_grad():  # off the init, where every tap but the first is zero and the untied gates equal
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE))
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    loss_f, logits_f, grads_f, kernels_f = model_step(model, ids)
    delta_kernels = model_step(DDLForCausalLM(DDLConfig.from_variant(variant.rsplit("-", 1)[0], "tiny",
                                                                     delta_backend="triton", **DEBUG)).to(DEVICE),
                               ids)[3]
    set_switches(fused_rules=False)
    loss_u, logits_u, grads_u, kernels_u = model_step(model, ids)
    for name, count in MODEL_KERNELS[variant].items():
        assert kernels_f[name] == count, (name, kernels_f)
    assert kernels_f == delta_kernels  # fused exactly where the delta rule is
    assert not [k for k in kernels_u if k.startswith(("delta_", "update_"))], kernels_u  # off: no update kernel
    assert abs(loss_f.item() - loss_u.item()) <= 1e-5
    assert ((logits_f - logits_u).norm() / logits_u.norm()).item() <= 1e-5
    names = sorted(grads_u)
    assert names == sorted(grads_f)
    flat_f, flat_u = (torch.cat([g[n].flatten() for n in names]) for g in (grads_f, grads_u))
    assert ((flat_f - flat_u).norm() / flat_u.norm()).item() <= 1e-5
    for n in names:
        assert ((grads_f[n] - grads_u[n]).norm() / (grads_u[n].norm() + 1e-30)).item() <= 1e-3, n
