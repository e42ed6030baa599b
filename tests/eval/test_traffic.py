"""``ddl bench-kernels --traffic``: the bytes each DDL kernel moves in a training step, against a hand count.

ddl-cc-noec, one block, d = 8, d_v = 4, fp32, 1 x 4 tokens (N = 4; one token per program, so 4 programs).
One token's state is S = 8 * 4 * 4 = 128 bytes; a d-vector 32 bytes, v 16, beta 4, the weight c 128.
Forward: the first CC read (x0 is not an update's output), then two updates, each fused with the next read
(the MLP's read, the final readout). Backward: the two fused updates (each with its partial buffer of grad_c,
one (d, d_v) fp32 tile per program, summed by torch), then the first read's backward and its partial sum.
"""

from __future__ import annotations

import pytest

from deep_delta.eval.traffic import step_traffic, traffic_markdown
from deep_delta.ops.launch import Launch

TINY = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, vocab_size=16)
N, S, VEC, V, B, C = 4, 128, 32, 16, 4, 128


def test_traffic_of_a_step_matches_a_hand_count():
    res = step_traffic("ddl-cc-noec", "tiny", batch_size=1, seq_len=N, **TINY)
    fwd_update = Launch("delta_fwd_kernel", "forward", N * (S + VEC + V + B) + C, N * (S + VEC))
    bwd_update = Launch("delta_bwd_kernel", "backward", N * (S + VEC + V + B + S + VEC) + C,
                        N * (S + VEC + V + B) + N * C)  # grad_x, grad_k, grad_v, grad_beta; partials
    partial_sum = Launch("partial_sum", "backward", N * C, C)
    assert res.launches == [
        Launch("cc_fwd_kernel", "forward", N * S + C, N * VEC),
        fwd_update,
        fwd_update,
        bwd_update,
        partial_sum,
        bwd_update,
        partial_sum,
        Launch("cc_bwd_kernel", "backward", N * S + C + N * VEC, N * S + N * C),
        partial_sum,
    ]
    assert res.state_bytes == S and res.sublayers == 2 and res.tokens == N
    assert res.ideal("forward") == 2 * (2 * S + 4 * 8)
    assert res.ideal("backward") == 2 * (3 * S + 6 * 8)
    assert res.total("forward") == (N * S + C + N * VEC + 2 * (fwd_update.read_bytes + fwd_update.write_bytes)) / N
    text = traffic_markdown([res], "tiny", "float32")
    assert "| ddl-cc-noec | forward | delta_fwd_kernel | 2 |" in text


def test_traffic_refuses_a_variant_without_ddl_kernels():
    with pytest.raises(ValueError, match="`variant` must be a DDL delta variant"):
        step_traffic("baseline", "tiny", **TINY)


def test_traffic_counts_a_realistic_step_with_bounded_partials():
    """8 x 1024 tokens on fake tensors (nothing of the step's size is allocated): the partial buffers of the
    weight gradients stay at most MAX_PROGRAMS (d, d_v) fp32 tiles per launch, not one per token."""
    from deep_delta.ops.delta.triton import MAX_PROGRAMS

    res = step_traffic("ddl-cc-noec", "tiny", batch_size=8, seq_len=1024, **TINY)
    assert res.tokens == 8 * 1024
    partials = [la.read_bytes for la in res.launches if la.kernel == "partial_sum"]
    assert len(partials) == 3 and all(p == MAX_PROGRAMS * C for p in partials)
    updates = [la for la in res.launches if la.kernel == "delta_bwd_kernel"]
    assert all(la.write_bytes == res.tokens * (S + VEC + V + B) + MAX_PROGRAMS * C for la in updates)
