"""Fast paths against the plain references, in values and gradients.

- Triton kernels (delta update, fused update + CC read, CC, TC, EC), run on CPU under the Triton
  interpreter (``TRITON_INTERPRET=1``, set here before Triton is imported) or natively on CUDA.
- The lean PyTorch path (``backend="torch"``): custom autograd Functions of :mod:`deep_delta.ops.delta.lean`
  and :mod:`deep_delta.ops.compress.lean`.
- A whole model on ``delta_backend="triton"`` against ``"torch"``, and ``torch.compile`` of a model.

Tolerances (relative error ``|got - ref| / |ref|`` over the whole tensor, and elementwise
``|got - ref| <= atol + rtol |ref|``):
    fp64 lean vs reference: 1e-12.   fp32: rel 2e-6, elementwise 1e-5 + 1e-5 |ref|.
    bf16: the kernels read and write bf16 (unit roundoff 2^-8) and compute in fp32 (the lean path also
    rounds a few intermediates); the reference runs in fp32 on the same rounded inputs and upstream
    gradients, so rel 1e-2 and elementwise 2^-6 (|ref| + max|ref| / 4).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before deep_delta (and triton) is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from deep_delta.ops import delta_update  # noqa: E402
from deep_delta.ops.compress import channel_compress, embed_conv, token_compress  # noqa: E402
from deep_delta.ops.compress.lean import channel_compress_lean, embed_conv_lean, token_compress_lean  # noqa: E402
from deep_delta.ops.compress.naive import (  # noqa: E402
    channel_compress_reference,
    embed_conv_reference,
    token_compress_reference,
)
from deep_delta.ops.delta import update_and_channel_read  # noqa: E402
from deep_delta.ops.delta.lean import delta_update_lean  # noqa: E402
from deep_delta.ops.delta.naive import delta_update_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float64: (1e-12, 1e-12, 1e-12), torch.float32: (2e-6, 1e-5, 1e-5), torch.bfloat16: (1e-2, 2**-6, 2**-6)}


def assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    rel, atol, rtol = TOL[dtype]
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    got, ref = got.double(), ref.double()
    err = (got - ref).abs()
    scale = ref.abs().max().item() + 1e-30
    ratio = (err.norm() / (ref.norm() + 1e-30)).item()
    assert ratio <= rel, f"{name}: relative error {ratio:.2e} > {rel:.0e}"
    if dtype == torch.bfloat16:
        bound = atol * scale / 4 + rtol * ref.abs()
    else:
        bound = atol + rtol * ref.abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"{name}: elementwise error exceeds the bound by {worst:.2e} (max |ref| {scale:.2e})"


def run_both(fast, ref, inputs, grad_out, dtype, n_grad=None):
    """Call ``fast`` on inputs (dtype) and ``ref`` on fp32/fp64 copies of the same rounded values;
    compare outputs and the gradients of the first ``n_grad`` inputs (all by default)."""
    ref_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    n_grad = len(inputs) if n_grad is None else n_grad
    a = [t.detach().clone().requires_grad_(i < n_grad) for i, t in enumerate(inputs)]
    b = [t.detach().to(ref_dtype).requires_grad_(i < n_grad) for i, t in enumerate(inputs)]
    out_a, out_b = fast(*a), ref(*b)
    out_a = out_a if isinstance(out_a, tuple) else (out_a,)
    out_b = out_b if isinstance(out_b, tuple) else (out_b,)
    grads = [g.to(o.dtype) for g, o in zip(grad_out, out_a)]
    torch.autograd.backward(out_a, grads)
    torch.autograd.backward(out_b, [g.to(ref_dtype) for g in grads])  # the same rounded upstream gradients
    for i, (oa, ob) in enumerate(zip(out_a, out_b)):
        assert oa.dtype == inputs[0].dtype, f"output {i} dtype {oa.dtype}"
        assert_close(f"output {i}", oa, ob, dtype)
    for i, (ta, tb) in enumerate(zip(a, b)):
        if ta.requires_grad:
            assert ta.grad is not None, f"input {i} got no gradient"
            assert_close(f"grad of input {i}", ta.grad, tb.grad, dtype)


def delta_inputs(lead, d, dv, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, d, dv, generator=g)
    k = torch.randn(*lead, d, generator=g)
    v = 4 * torch.rand(*lead, dv, generator=g)
    beta = 2 * torch.rand(*lead, 1, generator=g)
    # the state and the direction in the model's dtype; value and gate come in fp32 from the layers
    return x.to(dtype).to(DEVICE), k.to(dtype).to(DEVICE), v.to(DEVICE), beta.to(DEVICE)


DELTA_SHAPES = [((2, 3), 7, 1), ((5,), 12, 3), ((3,), 16, 4), ((2, 2), 33, 8), ((1,), 48, 4)]
DELTA_IDS = ["b2x3-d7-dv1", "b5-d12-dv3", "b3-d16-dv4", "b2x2-d33-dv8", "b1-d48-dv4"]
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]


# ----------------------------------------------------------------------------- Triton kernels


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,dv", DELTA_SHAPES, ids=DELTA_IDS)
def test_triton_delta_update_matches_reference(lead, d, dv, dtype):
    x, k, v, beta = delta_inputs(lead, d, dv, dtype, seed=d + dv)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    fast = lambda x, k, v, b: delta_update(x, k, v, b, backend="triton")  # noqa: E731
    run_both(fast, delta_update_reference, (x, k, v, beta), (g,), dtype)


@pytest.mark.parametrize("read", [False, True], ids=["update", "update+read"])
def test_triton_delta_kernels_with_several_tokens_per_program(monkeypatch, read):
    """The launch heuristic gives one token per program at the sizes tested here; three, with 7 tokens, leaves
    the last program a partial block (its masks), as two per program does for d_v = 1 past 4096 tokens."""
    import deep_delta.ops.delta.triton as dt

    monkeypatch.setattr(dt, "delta_rows", lambda n, tile: 3)
    x, k, v, beta = delta_inputs((7,), 12, 4, torch.float32, seed=5)
    gen = torch.Generator().manual_seed(6)
    if read:
        c = torch.randn(12, 4).to(DEVICE)
        grads = (torch.randn(x.shape, generator=gen).to(DEVICE), torch.randn(7, 12, generator=gen).to(DEVICE))
        fast = lambda x, k, v, b, c: update_and_channel_read(x, k, v, b, c, backend="triton")  # noqa: E731

        def ref(x, k, v, b, c):
            out = delta_update_reference(x, k, v, b)
            return out, channel_compress_reference(out, c)

        run_both(fast, ref, (x, k, v, beta, c), grads, torch.float32)
    else:
        fast = lambda x, k, v, b: delta_update(x, k, v, b, backend="triton")  # noqa: E731
        run_both(fast, delta_update_reference, (x, k, v, beta), (torch.randn(x.shape, generator=gen).to(DEVICE),),
                 torch.float32)


def test_delta_launch_heuristic():
    """The measured choices (tune_kernels.py): one warp per 1024 fp32 values held, 2 to 16; one token per program
    for tiles of 4096 elements or more, two below past 4096 tokens."""
    import deep_delta.ops.delta.triton as dt

    assert [dt.delta_warps(e) for e in (64, 1024, 4096, 16384, 65536)] == [2, 2, 4, 16, 16]
    assert [dt.delta_rows(n, tile) for n, tile in ((32768, 4096), (32768, 1024), (4096, 1024), (8, 64))] == [1, 2, 1, 1]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("lead,d,dv", [((2, 3), 7, 1), ((3,), 12, 4), ((2,), 33, 3)], ids=["d7-dv1", "d12-dv4", "d33-dv3"])
def test_triton_fused_update_and_read_matches_reference(lead, d, dv, dtype):
    x, k, v, beta = delta_inputs(lead, d, dv, dtype, seed=3)
    c = torch.randn(d, dv).to(DEVICE)
    gen = torch.Generator().manual_seed(2)
    grads = (torch.randn(x.shape, generator=gen).to(DEVICE), torch.randn(*lead, d, generator=gen).to(DEVICE))

    def fast(x, k, v, b, c):
        return update_and_channel_read(x, k, v, b, c, backend="triton")

    def ref(x, k, v, b, c):
        out = delta_update_reference(x, k, v, b)
        return out, channel_compress_reference(out, c)

    run_both(fast, ref, (x, k, v, beta, c), grads, dtype)


def test_triton_zero_direction_and_beta_limits():
    """k = 0 writes nothing; beta = 1 overwrites the k-component with v; all finite."""
    x, k, v, beta = delta_inputs((4,), 9, 3, torch.float32)
    out = delta_update(x, torch.zeros_like(k), v, beta, backend="triton")
    torch.testing.assert_close(out, x, rtol=0, atol=0)
    out = delta_update(x, k, v, torch.ones_like(beta), backend="triton")
    u = k / k.norm(dim=-1, keepdim=True)
    torch.testing.assert_close(torch.einsum("nd,ndj->nj", u, out), v, rtol=1e-5, atol=1e-5)


STATE_SHAPES = [(2, 5, 7, 1, 4), (1, 6, 12, 3, 2), (2, 3, 16, 4, 4), (1, 4, 9, 8, 1)]
STATE_IDS = ["b2t5-d7-dv1-k4", "t6-d12-dv3-k2", "b2t3-d16-dv4-k4", "t4-d9-dv8-k1"]


def state_inputs(b, t, d, dv, kk, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, d, dv, generator=g).to(dtype).to(DEVICE)
    e = torch.randn(b, t, d, generator=g).to(dtype).to(DEVICE)
    w = torch.randn(kk, d, dv, generator=g).to(DEVICE)
    c = torch.randn(d, dv, generator=g).to(DEVICE)
    past = torch.randn(b, kk - 1, d, dv, generator=g).to(dtype).to(DEVICE)
    past_e = torch.randn(b, kk - 1, d, generator=g).to(dtype).to(DEVICE)
    gx = torch.randn(b, t, d, dv, generator=g).to(DEVICE)
    gin = torch.randn(b, t, d, generator=g).to(DEVICE)
    return x, e, w, c, past, past_e, gx, gin


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("b,t,d,dv,kk", STATE_SHAPES, ids=STATE_IDS)
def test_triton_compressors_match_reference(b, t, d, dv, kk, dtype):
    x, e, w, c, past, past_e, gx, gin = state_inputs(b, t, d, dv, kk, dtype, seed=t + d)
    run_both(lambda x, c: channel_compress(x, c, backend="triton"), channel_compress_reference, (x, c), (gin,), dtype)
    run_both(lambda x, w: token_compress(x, w, backend="triton"), token_compress_reference, (x, w), (gin,), dtype)
    run_both(lambda e, w: embed_conv(e, w, backend="triton"), embed_conv_reference, (e, w), (gx,), dtype)


@pytest.mark.parametrize("b,t,d,dv,kk", [(2, 3, 7, 3, 4), (1, 1, 12, 4, 4)], ids=["t3-d7-dv3", "t1-d12-dv4"])
def test_triton_token_convolutions_with_history(b, t, d, dv, kk):
    x, e, w, _, past, past_e, gx, gin = state_inputs(b, t, d, dv, kk, torch.float32, seed=5)
    f32 = torch.float32
    run_both(lambda *a: token_compress(*a, backend="triton"), token_compress_reference, (x, w, past), (gin,), f32, 2)
    run_both(lambda *a: embed_conv(*a, backend="triton"), embed_conv_reference, (e, w, past_e), (gx,), f32, 2)


def test_triton_backend_on_cpu_without_interpreter_is_a_clear_error():
    code = (
        "import torch\n"
        "from deep_delta.ops import delta_update\n"
        "try:\n"
        "    delta_update(torch.zeros(1, 4, 2), torch.ones(1, 4), torch.ones(1, 2), torch.ones(1), backend='triton')\n"
        "except ValueError as e:\n"
        "    print('ERR', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "ERR delta_update: backend='triton' needs CUDA tensors" in out.stdout, out.stdout + out.stderr
    assert "got a tensor on cpu" in out.stdout


# ----------------------------------------------------------------------------- lean PyTorch path


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["fp64", "fp32", "bf16"])
@pytest.mark.parametrize("lead,d,dv", DELTA_SHAPES[:4], ids=DELTA_IDS[:4])
def test_lean_delta_update_matches_reference(lead, d, dv, dtype):
    x, k, v, beta = delta_inputs(lead, d, dv, dtype, seed=7)
    if dtype == torch.float64:
        v, beta = v.double(), beta.double()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    run_both(delta_update_lean, delta_update_reference, (x, k, v, beta), (g,), dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["fp64", "fp32", "bf16"])
@pytest.mark.parametrize("b,t,d,dv,kk", STATE_SHAPES, ids=STATE_IDS)
def test_lean_compressors_match_reference(b, t, d, dv, kk, dtype):
    x, e, w, c, past, past_e, gx, gin = state_inputs(b, t, d, dv, kk, dtype, seed=11)
    if dtype == torch.float64:
        w, c, gx, gin = w.double(), c.double(), gx.double(), gin.double()
    run_both(channel_compress_lean, channel_compress_reference, (x, c), (gin,), dtype)
    run_both(token_compress_lean, token_compress_reference, (x, w), (gin,), dtype)
    run_both(token_compress_lean, token_compress_reference, (x, w, past), (gin,), dtype, 2)
    run_both(embed_conv_lean, embed_conv_reference, (e, w), (gx,), dtype)
    run_both(embed_conv_lean, embed_conv_reference, (e, w, past_e), (gx,), dtype, 2)


def test_lean_functions_gradcheck():
    f64 = dict(dtype=torch.float64)
    x = torch.randn(2, 3, 4, 2, **f64, requires_grad=True)
    w = torch.randn(3, 4, 2, **f64, requires_grad=True)
    c = torch.randn(4, 2, **f64, requires_grad=True)
    e = torch.randn(2, 3, 4, **f64, requires_grad=True)
    past = torch.randn(2, 2, 4, 2, **f64)
    assert torch.autograd.gradcheck(channel_compress_lean, (x, c))
    assert torch.autograd.gradcheck(lambda x, w: token_compress_lean(x, w, past), (x, w))
    assert torch.autograd.gradcheck(embed_conv_lean, (e, w))
    k, v, b = torch.randn(2, 3, 4, **f64), torch.randn(2, 3, 2, **f64), torch.rand(2, 3, 1, **f64)
    inputs = (x, k.requires_grad_(), v.requires_grad_(), b.requires_grad_())
    assert torch.autograd.gradcheck(delta_update_lean, inputs)
    assert torch.autograd.gradgradcheck(delta_update_lean, inputs)


# ----------------------------------------------------------------------------- whole model


def tiny_model(variant: str, backend: str):
    from deep_delta.models import DDLConfig, DDLForCausalLM

    cfg = DDLConfig.from_variant(
        variant, "tiny", hidden_size=24, num_hidden_layers=1, num_attention_heads=2, vocab_size=32,
        max_position_embeddings=16, delta_backend=backend,
    )
    torch.manual_seed(0)
    return DDLForCausalLM(cfg).to(DEVICE)


@pytest.mark.parametrize("variant", ["ddl-dv1", "ddl-cc", "ddl-tc"])
def test_model_on_triton_backend_matches_torch_backend(variant):
    ref, fast = tiny_model(variant, "torch"), tiny_model(variant, "triton")
    fast.load_state_dict(ref.state_dict())
    assert_same_loss_and_grads(ref, fast)


def assert_same_loss_and_grads(ref, fast) -> None:
    """Two tiny models with the same weights: the same loss (1e-5) and parameter gradients (1e-4 relative)."""
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    lr, lf = ref(ids, labels=ids).loss, fast(ids, labels=ids).loss
    lr.backward()
    lf.backward()
    torch.testing.assert_close(lf, lr, rtol=1e-5, atol=1e-5)
    for (name, pr), pf in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(pf.grad, pr.grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("variant", ["ddl-cc", "ddl-tc"])
def test_torch_compile_of_the_model_on_the_torch_backend(variant):
    """Dynamo + AOTAutograd trace the custom autograd Functions (inductor also works, but its C++ build
    takes over a minute on a 2-core CPU; see docs/kernels.md)."""
    model = tiny_model(variant, "torch")
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    loss = model(ids, labels=ids).loss
    loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(model, backend="aot_eager")
    closs = compiled(ids, labels=ids).loss
    closs.backward()
    torch.testing.assert_close(closs, loss)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], msg=lambda m, n=n: f"{n}: {m}")
