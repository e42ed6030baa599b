"""The attention's order of operations, pinned: RoPE on q and k first, then their RMSNorms (as the authors'
model does). With unit norm gains the two orders agree (RoPE rotates pairs of coordinates and keeps the norm of
each head vector), so the gains are drawn away from 1 here, and the test shows that the other order differs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.models.ddl.modeling_ddl import rotate_half


def _attention(model, c, *, norm_first: bool):
    """The first block's attention branch composed by hand from its submodules."""
    attn = model.model.layers[0].attn.branch
    b, t, d = c.shape
    cos, sin = model.model.rotary(torch.arange(t).expand(b, t), c.dtype)

    def heads(lin):
        return lin(c).view(b, t, attn.n_heads, attn.head_dim).transpose(1, 2)

    def rope(x):
        return x * cos + rotate_half(x) * sin

    q, k, v = heads(attn.q_proj), heads(attn.k_proj), heads(attn.v_proj)
    if norm_first:
        q, k = rope(attn.q_norm(q)), rope(attn.k_norm(k))
    else:
        q, k = attn.q_norm(rope(q)), attn.k_norm(rope(k))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn.o_proj(y.transpose(1, 2).reshape(b, t, d))


def test_qk_norms_come_after_rope_with_non_unit_gains():
    torch.manual_seed(0)
    cfg = DDLConfig.from_variant("baseline", "tiny", hidden_size=64, num_attention_heads=2, num_hidden_layers=1,
                                 vocab_size=64, max_position_embeddings=32)
    model = DDLForCausalLM(cfg).eval()
    attn = model.model.layers[0].attn.branch
    with torch.no_grad():
        attn.q_norm.weight.copy_(torch.rand(attn.head_dim) * 2 + 0.2)
        attn.k_norm.weight.copy_(torch.rand(attn.head_dim) * 2 + 0.2)
    c = torch.randn(2, 12, 64)
    rope = model.model.rotary(torch.arange(12).expand(2, 12), c.dtype)
    with torch.no_grad():
        got = attn(c, rope, None, None)
        after = _attention(model, c, norm_first=False)
        before = _attention(model, c, norm_first=True)
    torch.testing.assert_close(got, after, rtol=1e-6, atol=1e-6)
    assert (got - before).abs().max() > 1e-3  # the other order is told apart at these gains
