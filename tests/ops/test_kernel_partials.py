"""The weight-gradient kernels' partial buffers are bounded (issue 24, item 1).

Every kernel that sums a weight gradient over tokens (the fused update + CC read's grad_c, the CC read's
grad_c, the TC / EC convolutions' grad_w, the HC / mHC write's and read's static coefficients) runs on a persistent grid of at most ``max_programs`` programs
(2 x the SM count on CUDA, ``MAX_PROGRAMS`` elsewhere), each accumulating a contiguous chunk of tokens in fp32
registers, then one partial per program, summed by reducer programs of the same launch (ops/partials.py;
tests/ops/test_partials.py runs several reducers per row). Here ``max_programs`` is patched to 4 so that the
interpreter runs the persistent loop with more tokens than programs (chunks of several tokens, a short last
chunk, chunks across batch rows): values and every gradient still equal the references (fp32, bf16), and the
partial buffers (their reduction recorded as ``partial_sum`` by :class:`deep_delta.ops.launch.count_traffic`)
have the same size at n and 4n tokens, at most ``max_programs`` x the weight in fp32.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from tests.ops.test_hyper_kernels import check_linear, hyper_inputs  # noqa: E402
from tests.ops.test_kernels import DEVICE, DTYPE_IDS, DTYPES, delta_inputs, run_both, state_inputs  # noqa: E402

from deep_delta.ops import launch as ops_launch  # noqa: E402
from deep_delta.ops.compress import channel_compress, embed_conv, token_compress  # noqa: E402
from deep_delta.ops.compress.naive import (  # noqa: E402
    channel_compress_reference,
    embed_conv_reference,
    token_compress_reference,
)
from deep_delta.ops.delta import triton as delta_triton  # noqa: E402
from deep_delta.ops.delta import update_and_channel_read  # noqa: E402
from deep_delta.ops.delta.naive import delta_update_reference  # noqa: E402
from deep_delta.ops.hyper import stream_read, stream_write  # noqa: E402
from deep_delta.ops.hyper.naive import stream_read_reference, stream_write_reference  # noqa: E402
from deep_delta.ops.launch import count_traffic  # noqa: E402

PROGRAMS = 4
B, T = 3, 5  # 15 tokens: 4 programs of 4, 4, 4, 3 tokens (2 of 8 and 7 per tap at K = 2), across batch rows


@pytest.fixture
def few_programs(monkeypatch):
    monkeypatch.setattr(ops_launch, "max_programs", lambda device, per_sm=None: PROGRAMS)


def fused(x, k, v, beta, c):
    return update_and_channel_read(x, k, v, beta, c, backend="triton")


def fused_reference(x, k, v, beta, c):
    out = delta_update_reference(x, k, v, beta)
    return out, channel_compress_reference(out, c)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d,dv,kk", [(12, 4, 2), (7, 3, 3)], ids=["d12-dv4-k2", "d7-dv3-k3"])
def test_persistent_kernels_match_reference_with_more_tokens_than_programs(few_programs, d, dv, kk, dtype):
    x, k, v, beta = delta_inputs((B, T), d, dv, dtype, seed=d)
    xs, e, w, c, past, past_e, gx, gin = state_inputs(B, T, d, dv, kk, dtype, seed=d + 1)
    run_both(fused, fused_reference, (x, k, v, beta, c), (gx, gin), dtype)
    run_both(lambda x, c: channel_compress(x, c, backend="triton"), channel_compress_reference, (xs, c), (gin,), dtype)
    run_both(lambda x, w: token_compress(x, w, backend="triton"), token_compress_reference, (xs, w), (gin,), dtype)
    run_both(lambda e, w: embed_conv(e, w, backend="triton"), embed_conv_reference, (e, w), (gx,), dtype)
    f32 = torch.float32
    if dtype == f32:  # with decoding history: the chunks index the outputs, the sources start P rows earlier
        tc = lambda *a: token_compress(*a, backend="triton")  # noqa: E731
        run_both(tc, token_compress_reference, (xs, w, past), (gin,), f32, 2)
        run_both(lambda *a: embed_conv(*a, backend="triton"), embed_conv_reference, (e, w, past_e), (gx,), f32, 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_channel_read_backward_without_the_prefetch(few_programs, monkeypatch, dtype):
    """The fused CC read's backward loop in its other form (``READ_BWD_PREFETCH`` off: each token loaded in its
    own iteration, not one ahead) also equals the reference."""
    monkeypatch.setattr(delta_triton, "READ_BWD_PREFETCH", False)
    x, k, v, beta = delta_inputs((B, T), 12, 4, dtype, seed=5)
    *_, c, _past, _past_e, gx, gin = state_inputs(B, T, 12, 4, 2, dtype, seed=6)
    run_both(fused, fused_reference, (x, k, v, beta, c), (gx, gin), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("d,n,mixed", [(33, 4, False), (300, 3, True)], ids=["d33-n4", "d300-n3-r-per-token"])
def test_static_stream_coefficients_with_more_tokens_than_programs(few_programs, d, n, mixed, dtype):
    """Static a, R, b (mixed: R per token, b static): their gradients summed on the persistent grid."""
    h, r, b, f, a, gh, gin = hyper_inputs((B, T), d, n, "static", dtype, seed=d)
    if mixed:
        r = hyper_inputs((B, T), d, n, "token", dtype, seed=d)[1]
    write = lambda *x: stream_write(*x, backend="triton")  # noqa: E731
    check_linear(write, stream_write_reference, (h, r, b, f), gh, dtype)
    check_linear(lambda *x: stream_read(*x, backend="triton"), stream_read_reference, (h, a), gin, dtype)


def partial_bytes(b: int, d: int, dv: int, kk: int) -> dict[str, list[int]]:
    """Bytes of every partial buffer summed in one forward + backward of each reduction kernel at b x T tokens."""
    x, k, v, beta = delta_inputs((b, T), d, dv, torch.float32)
    xs, e, w, c, *_ = state_inputs(b, T, d, dv, kk, torch.float32)
    h, r, bw, f, a, *_ = hyper_inputs((b, T), d, dv, "static", torch.float32)  # n = dv streams
    cases = {
        "fused": lambda: torch.autograd.backward(fused(x, k, v, beta, c), [torch.ones_like(x), torch.ones(b, T, d, device=x.device)]),
        "cc": lambda: channel_compress(xs, c, backend="triton").sum().backward(),
        "tc": lambda: token_compress(xs, w, backend="triton").sum().backward(),
        "ec": lambda: embed_conv(e, w, backend="triton").sum().backward(),
        "hyper_write": lambda: stream_write(h, r, bw, f, backend="triton").sum().backward(),
        "hyper_read": lambda: stream_read(h, a, backend="triton").sum().backward(),
    }
    for t in (x, k, v, beta, xs, e, w, c, h, r, bw, f, a):
        t.requires_grad_(True)
    out = {}
    for name, step in cases.items():
        with count_traffic() as counter:
            step()
        out[name] = [la.read_bytes for la in counter.launches if la.kernel == "partial_sum"]
    return out


def test_partial_buffers_do_not_grow_with_the_token_count(few_programs):
    d, dv, kk = 9, 4, 2
    small, large = partial_bytes(2, d, dv, kk), partial_bytes(8, d, dv, kk)  # n = 10 and 4n = 40 tokens
    weight = {"fused": [d * dv * 4], "cc": [d * dv * 4], "tc": [kk * d * dv * 4], "ec": [kk * d * dv * 4],
              "hyper_write": [dv * dv * 4, dv * 4], "hyper_read": [dv * 4]}  # (n, n) and (n,) coefficients
    for name, sizes in large.items():
        assert len(sizes) == len(weight[name]), f"{name}: partial buffers recorded: {sizes}"
        assert sizes == small[name], f"{name}: partial bytes {small[name]} at {2 * T} tokens, {sizes} at {8 * T}"
        bound = [PROGRAMS * w for w in weight[name]]
        assert all(s <= b for s, b in zip(sizes, bound)), f"{name}: {sizes} > {PROGRAMS} x {weight[name]}"


def test_reduction_grid_covers_the_tokens_within_the_bound():
    for n in (0, 1, 3, 15, 256, 257, 4097, 100_000):
        for axis in (1, 3, 4):
            progs, chunk = ops_launch.reduction_grid(n, torch.device("cpu"), per_program_axis=axis)
            assert progs * axis <= max(axis, ops_launch.MAX_PROGRAMS)
            assert progs * chunk >= n and (progs - 1) * chunk < max(n, 1), (n, axis, progs, chunk)


def test_persistent_sums_are_deterministic(few_programs):
    x, k, v, beta = delta_inputs((B, T), 12, 4, torch.float32)
    c = torch.randn(12, 4, device=DEVICE)
    grads = []
    for _ in range(2):
        cc = c.clone().requires_grad_(True)
        out, xin = fused(x, k, v, beta, cc)
        (out.sum() + xin.square().sum()).backward()
        grads.append(cc.grad)
    assert torch.equal(grads[0], grads[1])
