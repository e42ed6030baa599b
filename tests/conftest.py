import os

import pytest
import torch

# Two cores on CI: one intra-op thread per test process keeps timings stable and avoids oversubscription.
torch.set_num_threads(int(os.environ.get("DDL_TEST_THREADS", "2")))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
