"""``ddl bench-kernels --traffic``: the bytes each DDL kernel moves in a training step, against a hand count.

ddl-cc-noec, one block, d = 8, d_v = 4, fp32, 1 x 4 tokens (N = 4; one token per program, so 4 programs).
One token's state is S = 8 * 4 * 4 = 128 bytes; a d-vector 32 bytes, v 16, beta 4, the weight c 128.
Forward: the first CC read (x0 is not an update's output), the attention sublayer's norm, gate and value of it
(``norm_gate_value``: the weights g, w_g, b_g, W_v (d_v, d) = 128 bytes, b_v), the attention update fused with the
MLP sublayer's read and input stage (``update_read_norm``: its own record is the update's tensors and the read
weight; the input stage's tensors are recorded apart, "(norm share)"), then the MLP update fused with the final
read. Backward: the MLP update with the read's gradient (its partial buffer of grad_c, one (d, d_v) fp32 tile per
program, summed in the launch and recorded as a partial sum), the fused attention update (grad_c's partials, then
the norm share's: (g, w_g), (b_g, b_v) and W_v per program), the attention norm's backward and the first read's.
"""

from __future__ import annotations

import pytest

from deep_delta.eval.traffic import step_traffic, traffic_markdown
from deep_delta.ops import switches
from deep_delta.ops.launch import Launch

TINY = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, vocab_size=16)
N, S, VEC, V, B, C = 4, 128, 32, 16, 4, 128


@pytest.fixture(autouse=True)
def switched_on(set_switches):
    """The counts here are of the fused paths (the in-kernel sums, the next norm inside the update, TC's one-pass
    backward), which are off by default until a GPU run has passed (``deep_delta.ops.switches``, issue 47)."""
    set_switches(**dict.fromkeys(switches.VARIABLES, True))


def test_traffic_of_a_step_matches_a_hand_count():
    res = step_traffic("ddl-cc-noec", "tiny", batch_size=1, seq_len=N, **TINY)
    fwd_update = Launch("delta_fwd_kernel", "forward", N * (S + VEC + V + B) + C, N * (S + VEC))
    bwd_update = Launch("delta_bwd_kernel", "backward", N * (S + VEC + V + B + S + VEC) + C,
                        N * (S + VEC + V + B) + N * C)  # grad_x, grad_k, grad_v, grad_beta; partials
    partial_sum = Launch("partial_sum", "backward", N * C, C)
    weights = 2 * VEC + B + C + V  # g, w_g, b_g, W_v, b_v
    fwd_norm = Launch("norm_gate_value_fwd_kernel", "forward", N * VEC + weights, N * (VEC + B + V))
    bwd_norm = Launch("norm_gate_value_bwd_kernel", "backward", N * VEC + weights + N * (VEC + B + V),
                      N * VEC + N * (2 * VEC + B + V + C))  # grad_src; partials (g, w_g), (b_g, b_v), W_v
    norm_partials = [Launch("partial_sum", "backward", N * 2 * VEC, 2 * VEC),
                     Launch("partial_sum", "backward", N * (B + V), B + V), partial_sum]
    # the fused attention update: the update's tensors and the read weight (no x_in written, no g_in read), and the
    # next sublayer's input stage apart: its weights, c / beta' / v' forward; their gradients and partials backward
    share = " (norm share)"
    fused_fwd = Launch("update_read_norm_fwd_kernel", "forward", N * (S + VEC + V + B) + C, N * S)
    fused_fwd_share = Launch("update_read_norm_fwd_kernel" + share, "forward", weights, N * (VEC + B + V))
    fused_bwd = Launch("update_read_norm_bwd_kernel", "backward", N * (S + VEC + V + B + S) + C,
                       N * (S + VEC + V + B) + N * C)
    fused_bwd_share = Launch("update_read_norm_bwd_kernel" + share, "backward", weights + N * (VEC + B + V),
                             N * (2 * VEC + C + B + V))
    assert res.launches == [
        Launch("cc_fwd_kernel", "forward", N * S + C, N * VEC),
        fwd_norm,
        fused_fwd,
        fused_fwd_share,
        fwd_update,
        bwd_update,
        partial_sum,
        fused_bwd,
        partial_sum,
        fused_bwd_share,
        *norm_partials,
        bwd_norm,
        *norm_partials,
        Launch("cc_bwd_kernel", "backward", N * S + C + N * VEC, N * S + N * C),
        partial_sum,
    ]
    assert res.state_bytes == S and res.sublayers == 2 and res.tokens == N
    assert res.ideal("forward") == 2 * (2 * S + 4 * 8)
    assert res.ideal("backward") == 2 * (3 * S + 6 * 8)
    size = lambda *launches: sum(la.read_bytes + la.write_bytes for la in launches)  # noqa: E731
    first_read = Launch("cc_fwd_kernel", "forward", N * S + C, N * VEC)
    assert res.total("forward") == size(first_read, fwd_norm, fused_fwd, fused_fwd_share, fwd_update) / N
    assert res.total("forward", norm=False) == size(first_read, fused_fwd, fwd_update) / N
    assert res.total("forward", norm=True) == size(fwd_norm, fused_fwd_share) / N
    assert res.total("backward", norm=True) == size(fused_bwd_share, *norm_partials, bwd_norm, *norm_partials) / N
    assert res.total("backward", norm=False) + res.total("backward", norm=True) == res.total("backward")
    step = (res.total("forward", norm=False) + res.total("backward", norm=False)) / (2 * (5 * S + 10 * 8))
    assert res.step_ratio() == pytest.approx(step)
    text = traffic_markdown([res], "tiny", "float32")
    assert f"| {step:.2f} |" in text
    assert "| ddl-cc-noec | forward | delta_fwd_kernel | 1 |" in text


def test_traffic_refuses_a_variant_without_ddl_kernels():
    with pytest.raises(ValueError, match="`variant` must be a DDL delta variant"):
        step_traffic("baseline", "tiny", **TINY)


def test_traffic_counts_a_realistic_step_with_bounded_partials():
    """8 x 1024 tokens on fake tensors (nothing of the step's size is allocated): the partial buffers of the
    weight gradients stay at most MAX_PROGRAMS fp32 copies of their weight per launch ((d, d_v) tiles for the
    update and the read; the norm's weights), not one per token."""
    from deep_delta.ops.launch import MAX_PROGRAMS

    res = step_traffic("ddl-cc-noec", "tiny", batch_size=8, seq_len=1024, **TINY)
    assert res.tokens == 8 * 1024
    partials = [la for la in res.launches if la.kernel == "partial_sum"]
    assert len(partials) == 3 + 2 * 3  # grad_c of the two updates and the first read; the two norms' three each
    assert all(la.read_bytes == MAX_PROGRAMS * la.write_bytes for la in partials)
    assert sum(la.read_bytes == MAX_PROGRAMS * C for la in partials) == 3 + 2  # the (d, d_v) tiles and W_v
    updates = [la for la in res.launches if la.kernel in ("delta_bwd_kernel", "update_read_norm_bwd_kernel")]
    assert len(updates) == 2
    assert all(la.write_bytes == res.tokens * (S + VEC + V + B) + MAX_PROGRAMS * C for la in updates)


def test_a_fused_dv1_update_records_the_next_norm_apart():
    """ddl-dv1, one block, d = 8, fp32, N = 4: the attention update computes the MLP sublayer's norm, gate and value
    (``update_norm_*``), the MLP update is plain. The fused launch's own record is exactly a plain d_v = 1 update's
    (x, k, v, beta read, x' written; backward G read too, four gradients written), and the tensors only the norm
    part moves are a record of their own, counted with the norm: forward the weights read and c, beta', v'
    written (no read of x': that is the fusion), backward the weights and the three upstream gradients read and
    the partial rows written (one program per token here), summed by three partial sums."""
    res = step_traffic("ddl-dv1", "tiny", batch_size=1, seq_len=N, **TINY)
    weights = 2 * VEC + B + VEC + B  # g, w_g, b_g, W_v (1, d), b_v
    row = 2 * VEC + 2 * B  # x, k, v, beta of one token
    fwd = Launch("delta_fwd_kernel", "forward", N * row, N * VEC)
    bwd = Launch("delta_bwd_kernel", "backward", N * (row + VEC), N * row)
    partials = [Launch("partial_sum", "backward", N * 2 * VEC, 2 * VEC), Launch("partial_sum", "backward", N * 2 * B,
                                                                               2 * B),
                Launch("partial_sum", "backward", N * VEC, VEC)]
    norm_fwd = Launch("norm_gate_value_fwd_kernel", "forward", N * VEC + weights, N * (VEC + 2 * B))
    norm_bwd = Launch("norm_gate_value_bwd_kernel", "backward", N * VEC + weights + N * (VEC + 2 * B),
                      N * VEC + N * (3 * VEC + 2 * B))
    share = " (norm share)"
    assert res.launches == [
        norm_fwd,
        Launch("update_norm_fwd_kernel", "forward", fwd.read_bytes, fwd.write_bytes),
        Launch("update_norm_fwd_kernel" + share, "forward", weights, N * (VEC + 2 * B)),
        fwd,
        bwd,
        Launch("update_norm_bwd_kernel", "backward", bwd.read_bytes, bwd.write_bytes),
        Launch("update_norm_bwd_kernel" + share, "backward", weights + N * (VEC + 2 * B), N * (3 * VEC + 2 * B)),
        *partials,
        norm_bwd,
        *partials,
    ]
    total = lambda *launches: sum(la.read_bytes + la.write_bytes for la in launches) / N  # noqa: E731
    assert res.total("forward", norm=False) == total(fwd, fwd)
    assert res.total("backward", norm=False) == total(bwd, bwd)
    assert res.total("forward", norm=True) == total(norm_fwd, res.launches[2])
    assert res.total("backward", norm=True) == total(res.launches[6], *partials, norm_bwd, *partials)


def test_the_twins_and_untied_updates_are_counted_with_their_switch_on():
    """The ``fused_rules`` switch on (this file's fixture): the write-only and untied models launch ddl-dv1's kernels, in the same
    order, and their records differ from ddl-dv1's by what the rule moves: the write-only update's own backward reads
    no state (N d-vectors less), the untied update reads its two gates (N x 4 bytes more each way) and writes their
    gradients (N x 4 more), and the next sublayer's input stage its gate of two outputs."""
    delta, write, untied = (step_traffic(v, "tiny", batch_size=1, seq_len=N, **TINY)
                            for v in ("ddl-dv1", "ddl-dv1-write", "ddl-dv1-untied"))
    assert [la.kernel for la in write.launches] == [la.kernel for la in delta.launches]
    assert [la.kernel for la in untied.launches] == [la.kernel for la in delta.launches]
    plain = {la.kernel: la for la in delta.launches if la.kernel in ("delta_fwd_kernel", "delta_bwd_kernel")}
    got = {la.kernel: la for la in write.launches if la.kernel in plain}
    assert got["delta_fwd_kernel"] == plain["delta_fwd_kernel"]
    assert got["delta_bwd_kernel"].read_bytes == plain["delta_bwd_kernel"].read_bytes - N * VEC
    assert got["delta_bwd_kernel"].write_bytes == plain["delta_bwd_kernel"].write_bytes
    got = {la.kernel: la for la in untied.launches if la.kernel in plain}
    assert got["delta_fwd_kernel"].read_bytes == plain["delta_fwd_kernel"].read_bytes + N * B
    assert got["delta_bwd_kernel"].read_bytes == plain["delta_bwd_kernel"].read_bytes + N * B
    assert got["delta_bwd_kernel"].write_bytes == plain["delta_bwd_kernel"].write_bytes + N * B
    share = [la for la in untied.launches if la.kernel == "update_norm_fwd_kernel (norm share)"]
    assert share[0].read_bytes == VEC + 2 * VEC + 2 * B + VEC + B  # g, w_g (2, d), b_g (2,), W_v (1, d), b_v
    assert share[0].write_bytes == N * (VEC + 2 * B + B)  # c, beta' (N, 2), v'
    assert all(res.update_in_kernels() for res in (delta, write, untied))


def test_an_update_in_torch_is_not_a_kernel_not_zero_bytes(set_switches):
    """The probe's T7: with the ``fused_rules`` switch off a write-only update runs in torch; its row says so ("not a kernel",
    the ratios n/a) where it read "0 ... 0.00x the ideal"; the delta variant's row keeps its figures."""
    set_switches(fused_rules=False)
    results = [step_traffic(v, "tiny", batch_size=1, seq_len=N, **TINY) for v in ("ddl-dv1", "ddl-dv1-write")]
    assert results[0].update_in_kernels() and not results[1].update_in_kernels()
    table = traffic_markdown(results, "tiny", "float32")
    [delta_row] = [r for r in table.splitlines() if r.startswith("| ddl-dv1 | 8 |")]
    [write_row] = [r for r in table.splitlines() if r.startswith("| ddl-dv1-write | 8 |")]
    assert write_row.count("not a kernel") == 2 and write_row.count("n/a") == 3 and "0.00" not in write_row
    assert "not a kernel" not in delta_row and "n/a" not in delta_row
    assert "FUSED_RULES off" in table.splitlines()[0] and "INKERNEL_REDUCE on" in table.splitlines()[0]
