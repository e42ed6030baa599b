"""`import deep_delta` registers model_type "deep_delta" with transformers' Auto classes, as a model package
does, in either import order, while importing deep_delta alone loads neither PyTorch nor transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
{first}
light = "torch" not in sys.modules and "transformers" not in sys.modules
{second}
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.for_model("deep_delta", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              vocab_size=64, max_position_embeddings=16)
model = AutoModelForCausalLM.from_config(config)
print(light, type(model).__name__)
"""


@pytest.mark.parametrize("order", ["deep_delta first", "transformers first"])
def test_import_deep_delta_registers_the_auto_classes(order):
    first, second = ("import deep_delta", "import transformers") if order == "deep_delta first" else (
        "import transformers", "import deep_delta")
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first, second=second)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    light, name = out.stdout.split()
    assert name == "DDLForCausalLM"
    assert light == ("True" if order == "deep_delta first" else "False")
