"""bf16 under FSDP2: the training setting ``dtype: bfloat16`` (or ``auto`` on CUDA) selects a mixed-precision
policy of bf16 parameters and fp32 gradient reduction. On CPU (one process, gloo) the policy is checked by its
fields and by a step: the blocks compute with bf16 weights, the gradients and master weights stay fp32."""

from __future__ import annotations

import torch

from deep_delta import DDLForCausalLM
from deep_delta.train import distributed as distr
from helpers import debug_config


def test_policy_dtypes():
    mp = distr.fsdp_mixed_precision(True)
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.bfloat16, torch.float32)
    plain = distr.fsdp_mixed_precision(False)
    assert (plain.param_dtype, plain.reduce_dtype) == (None, None)


def test_fsdp_bf16_step_computes_in_bf16_and_keeps_fp32_master_weights():
    info = distr.setup("fsdp", "cpu")
    try:
        torch.manual_seed(0)
        model = DDLForCausalLM(debug_config("ddl-cc")).train()
        seen = []
        model.model.layers[0].attn.branch.q_proj.register_forward_hook(lambda m, a, o: seen.append(m.weight.dtype))
        wrapped = distr.parallelize(model, info, bf16=True)
        ids = torch.randint(0, 64, (2, 8))
        wrapped(ids, labels=ids).loss.backward()
        assert seen == [torch.bfloat16]
        params = list(model.parameters())
        assert all(p.dtype == torch.float32 for p in params)
        assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)
    finally:
        distr.teardown(info)
