"""The fused "delta update + next CC read" wired into the model, against the unfused path.

``DeltaResidual(x, ..., emit=Emit("read", read=compressor))`` returns ``(x_new, Carry(read=compressor(x_new)))`` from one op;
``DDLModel`` uses it for every update of a channel-compressor model (attention update + MLP read, MLP
update + next block's read, last MLP update + final readout). ``model.model.fuse_reads = False`` is the
unfused path. Both backends: the lean torch path and the Triton kernel (interpreter on CPU).

Tolerances: the fused op does the same arithmetic as the separate ops, so logits, loss and gradients
agree to fp32 rounding: 1e-6 relative on the torch backend (bit-identical on the CPU machine), 1e-5 with the
Triton kernels, whose fused and separate launches sum in different orders on a GPU (3.6e-6 observed on an
H200 once d_v became a compile-time constant, 2026-11-26).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # also set in tests/conftest.py, before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import deep_delta.layers.delta_residual as dr_mod  # noqa: E402
from deep_delta.layers.compressors import ChannelCompressor, TokenConvCompressor  # noqa: E402
from deep_delta.layers.delta_residual import DeltaResidual, Emit  # noqa: E402
from deep_delta.models.ddl.configuration_ddl import DDLConfig  # noqa: E402
from deep_delta.models.ddl.modeling_ddl import DDLForCausalLM  # noqa: E402
from helpers import DEBUG, rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"



def _run(model, ids, mask=None):
    model.zero_grad(set_to_none=True)
    out = model(ids, attention_mask=mask, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.loss.detach(), out.logits.detach(), grads


def _count_calls(monkeypatch, name: str) -> list:
    """Replace ``deep_delta.layers.delta_residual.<name>`` by a wrapper that records each call's backend."""
    calls = []
    real = getattr(dr_mod, name)

    def counting(*args, **kwargs):
        calls.append(kwargs.get("backend"))
        return real(*args, **kwargs)

    monkeypatch.setattr(dr_mod, name, counting)
    return calls


@pytest.fixture
def count_fused(monkeypatch):
    return _count_calls(monkeypatch, "update_and_channel_read")


@pytest.fixture
def count_norm_fused(monkeypatch):
    """The updates that also compute the next sublayer's norm, gate and value from the read (Triton, training)."""
    return _count_calls(monkeypatch, "update_and_norm")


@pytest.mark.parametrize("fuse_norm", [False, True], ids=["norm-apart", "norm-fused"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("variant", ["ddl-cc", "ddl-cc-noec"])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_reads_equal_unfused(variant, backend, padded, fuse_norm, count_fused, count_norm_fused, set_switches):
    """The model with every read fused into the update before it equals the model without, with the next norm
    inside the update switched on and off (the ``fuse_next_norm`` switch)."""
    set_switches(fuse_next_norm=fuse_norm)
    cfg = DDLConfig.from_variant(variant, "tiny", delta_backend=backend, **DEBUG)
    model = DDLForCausalLM(cfg).to(DEVICE)
    ids = torch.randint(0, 64, (2, 5), device=DEVICE)  # few tokens: the interpreter runs a program per token
    mask = None
    if padded:  # left padding of the first row: pad positions are masked in the state and in its read
        mask = torch.ones(2, 5, dtype=torch.long, device=DEVICE)
        mask[0, :2] = 0
    model.model.fuse_reads = True
    loss_f, logits_f, grads_f = _run(model, ids, mask)
    # every update is fused: 2 per block, the last one with the final readout; on the Triton backend in training
    # (no pads) every one but the last also computes the next sublayer's norm, gate and value from its read
    norms = fuse_norm and not padded and backend == "triton"
    assert len(count_fused) + len(count_norm_fused) == 2 * cfg.num_hidden_layers
    assert len(count_norm_fused) == (2 * cfg.num_hidden_layers - 1 if norms else 0)
    assert set(count_fused + count_norm_fused) == {backend}
    model.model.fuse_reads = False
    count_fused.clear()
    count_norm_fused.clear()
    loss_u, logits_u, grads_u = _run(model, ids, mask)
    # only the in-block attention update + MLP read (with the MLP sublayer's norm where it can)
    assert len(count_fused) + len(count_norm_fused) == cfg.num_hidden_layers
    model.model.fuse_reads = True
    assert torch.isfinite(loss_f)
    tol = 1e-6 if backend == "torch" else 1e-5
    assert rel_error(logits_f, logits_u) <= tol and abs(loss_f.item() - loss_u.item()) <= tol
    assert grads_f.keys() == grads_u.keys()
    for name, g in grads_u.items():
        assert rel_error(grads_f[name], g) <= tol, name


@pytest.fixture
def count_token_fused(monkeypatch):
    return _count_calls(monkeypatch, "update_and_token_read")


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("variant", ["ddl-tc", "ddl-tc-noec"])
def test_fused_token_reads_equal_unfused(variant, backend, count_fused, count_token_fused):
    """TC: fused in a forward without cache or padding (training). The lean path runs the same two ops (bit for
    bit); the Triton kernel adds the read's gradient to the state's in fp32 registers, in another order than
    autograd's add (all gradients as one vector 1e-5 relative; each on its own 1e-3)."""
    cfg = DDLConfig.from_variant(variant, "tiny", delta_backend=backend, **DEBUG)
    model = DDLForCausalLM(cfg).to(DEVICE)
    with torch.no_grad():  # off the init, where every tap but the first is zero
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE))
    ids = torch.randint(0, 64, (2, 6), device=DEVICE)  # T = 6 > the K = 4 taps: every halo position occurs
    model.model.fuse_reads = True
    loss_f, logits_f, grads_f = _run(model, ids)
    assert len(count_token_fused) == 2 * cfg.num_hidden_layers and set(count_token_fused) == {backend}
    assert count_fused == []
    for m in (model.model, *model.model.layers):  # every read separate: the model's and each block's switch
        m.fuse_reads = False
    count_token_fused.clear()
    loss_u, logits_u, grads_u = _run(model, ids)
    assert count_token_fused == []
    tol = 1e-6 if backend == "torch" else 1e-5
    assert rel_error(logits_f, logits_u) <= tol and abs(loss_f.item() - loss_u.item()) <= tol
    names = sorted(grads_u)
    assert rel_error(torch.cat([grads_f[n].flatten() for n in names]), torch.cat([grads_u[n].flatten() for n in names])) <= tol
    for name in names:  # one by one: a small gradient (a gate bias, 2e-4) cancels to 1e-4 relative
        assert rel_error(grads_f[name], grads_u[name]) <= (tol if backend == "torch" else 1e-3), name


def test_token_reads_are_not_fused_with_padding_or_a_cache(count_token_fused):
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-tc", "tiny", **DEBUG))
    ids = torch.randint(0, 64, (2, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0
    _run(model, ids, mask)
    with torch.no_grad():
        model.eval()(ids, use_cache=True)
    assert count_token_fused == []
    model.train()
    _run(model, ids)
    assert len(count_token_fused) == 2 * model.config.num_hidden_layers


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_delta_residual_read_returns_update_and_read(backend):
    """``forward(..., emit=Emit("read", read=cc))`` equals the plain forward followed by the compressor, in values
    and gradients."""
    d, dv = 12, 3
    mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
    res = DeltaResidual(d, mlp, value_channels=dv, backend=backend).to(DEVICE)
    cc = ChannelCompressor(d, dv, backend=backend).to(DEVICE)
    with torch.no_grad():
        cc.weight.normal_()
    x = torch.randn(2, 5, d, dv, device=DEVICE, requires_grad=True)
    x_in = torch.randn(2, 5, d, device=DEVICE, requires_grad=True)
    gx, gr = torch.randn(2, 5, d, dv, device=DEVICE), torch.randn(2, 5, d, device=DEVICE)
    params = [x, x_in, cc.weight, *res.parameters()]

    out, carry = res(x, x_in=x_in, emit=Emit("read", read=cc))
    read = carry.read
    fused = torch.autograd.grad((out * gx).sum() + (read * gr).sum(), params)
    out2 = res(x, x_in=x_in)
    read2, _ = cc(out2)
    plain = torch.autograd.grad((out2 * gx).sum() + (read2 * gr).sum(), params)
    assert rel_error(out, out2) <= 1e-6 and rel_error(read, read2) <= 1e-6
    for i, (a, b) in enumerate(zip(fused, plain)):
        assert rel_error(a, b) <= 1e-6, i


def test_delta_residual_read_errors():
    d = 8
    res = DeltaResidual(d, torch.nn.Linear(d, d), value_channels=2)
    x = torch.randn(1, 3, d, 2)
    with pytest.raises(ValueError, match="`read` must be a ChannelCompressor or a TokenConvCompressor.*Linear"):
        res(x, emit=Emit("read", read=torch.nn.Linear(d, d)))
    with pytest.raises(ValueError, match=r"fused TokenConvCompressor read needs a \(B, T, d, d_v\) state"):
        res(x[0], emit=Emit("read", read=TokenConvCompressor(d, 2)))
    with pytest.raises(ValueError, match=r"`read` must read a \(8, 2\) state"):
        res(x, emit=Emit("read", read=ChannelCompressor(d, 3)))
    with pytest.raises(ValueError, match="value_channels > 1, got value_channels=1"):
        DeltaResidual(d, torch.nn.Linear(d, d))(torch.randn(1, 3, d), emit=Emit("read", read=ChannelCompressor(d, 1)))
    with pytest.raises(ValueError, match=r"`emit.what` got 'everything'; allowed: nothing \| read \| inputs"):
        res(x, emit=Emit("everything"))


def test_delta_residual_forward_takes_no_read_keyword():
    """The fused read has one entry point, ``emit``; forward passes unknown keywords to the branch."""
    d = 8
    res = DeltaResidual(d, torch.nn.Linear(d, d), value_channels=2)
    with pytest.raises(TypeError, match="read"):
        res(torch.randn(1, 3, d, 2), read=ChannelCompressor(d, 2))
