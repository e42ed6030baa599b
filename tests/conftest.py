import os

import pytest
import torch

# Without a GPU the Triton kernels are tested on CPU tensors in the Triton interpreter
# (tests/ops/test_kernels.py). The flag must be set before anything imports triton, and importing
# deep_delta does (transformers -> torch._dynamo), so it is set here, before any test module is collected.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Two cores on CI: one intra-op thread per test process keeps timings stable and avoids oversubscription.
torch.set_num_threads(int(os.environ.get("DDL_TEST_THREADS", "2")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
