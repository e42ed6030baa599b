"""The tests' models, in one place: the ``debug`` recipe's shape (deep_delta/train/recipes.py) at the vocabulary
a test needs. ``from helpers import ...`` works from every test folder (tests/conftest.py's folder is on
``sys.path``); a module with its own name, not conftest, so that it never clashes with a folder's conftest.

- ``DEBUG_MODEL``: the debug recipe's model (width 32, 2 layers, 2 heads, context 64); its vocabulary comes
  from the run's data (the trainer's rule), as in ``ddl train --config debug/VARIANT``.
- ``DEBUG``: that shape with a 64-token vocabulary, for models fed random token ids.
- :func:`tiny_model`: that shape with a 320-token vocabulary (> the 257 byte ids, so the byte tokenizer fits),
  its weights moved off their init.
- :func:`load_tool`: a script of benchmarks/tools/ imported as a module (the scripts are not a package).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch

from deep_delta.models import DDLConfig, DDLForCausalLM
from deep_delta.train.recipes import debug

DEBUG_MODEL: dict[str, Any] = debug()["model"]
DEBUG: dict[str, Any] = {**DEBUG_MODEL, "vocab_size": 64}
BYTE_VOCAB = 320
TOOLS = Path(__file__).resolve().parents[1] / "benchmarks" / "tools"


def load_tool(name: str):
    """``benchmarks/tools/NAME.py`` imported as the module ``NAME`` (registered in ``sys.modules``: a tool's
    dataclasses look their module up by name)."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """|got - ref| / |ref| (Frobenius norms, in fp64): the tolerance measure of the kernel and dtype tests."""
    return ((got.double() - ref.double()).norm() / (ref.double().norm() + 1e-30)).item()


def debug_config(variant: str, **overrides: Any) -> DDLConfig:
    """``variant`` at the ``DEBUG`` shape (the tiny preset narrowed), with ``overrides`` on top."""
    return DDLConfig.from_variant(variant, "tiny", **{**DEBUG, **overrides})


def tiny_model(variant: str = "ddl-cc", *, perturb: float = 0.1, seed: int = 0, **overrides: Any) -> DDLForCausalLM:
    """A model of ``DEBUG_MODEL``'s shape with the byte vocabulary (``BYTE_VOCAB``), in eval mode, built after
    ``torch.manual_seed(seed)``, its weights then moved by ``perturb`` x N(0, 1) (a generator seeded
    ``seed + 1``).

    At init the token convolutions (EC, TC) are identities and the gates constant, so a cache that lost the
    token history, or a branch that was skipped, would go unnoticed; the perturbation makes every tap and gate
    matter.
    """
    torch.manual_seed(seed)
    model = DDLForCausalLM(debug_config(variant, **{"vocab_size": BYTE_VOCAB, **overrides}))
    if perturb:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(perturb * torch.randn(p.shape, generator=g))
    return model.eval()


def with_options(argv: list[str], *extra: str) -> list[str]:
    """``argv`` + ``extra``, where an option in ``extra`` replaces the same option (and its values) in ``argv``:
    the command line refuses a non-appending option given twice. ``--set`` and ``--prompt`` append."""
    given = {x for x in extra if x.startswith("--") and x not in ("--set", "--prompt")}
    kept, skip = [], False
    for x in argv:
        if x.startswith("--"):
            skip = x in given
        if not skip:
            kept.append(x)
    return [*kept, *extra]


def readme_python_blocks() -> list[tuple[int, str]]:
    """Every fenced ```python block of README.md: (its first line's number, its code), in order."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    blocks, start = [], None
    for i, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = i
        elif start is not None and line.strip() == "```":
            blocks.append((start + 1, "\n".join(lines[start:i - 1]) + "\n"))
            start = None
    return blocks


# Where pinned numbers were made: there they hold bit for bit; a machine whose PyTorch picks other CPU kernels
# (another instruction set, another release) rounds differently, and there they hold to 1e-5 relative.
PINNED_ON = ("2.13.0+cpu", "AVX512")


def same_as_pinned(got: float, want: float, what: str) -> None:
    """``got`` equals the pinned ``want``: bit for bit on the pinning machine (:data:`PINNED_ON`), to 1e-5 relative
    elsewhere; the message says which one ran."""
    import math

    if (torch.__version__, torch.backends.cpu.get_cpu_capability()) == PINNED_ON:
        assert got.hex() == want.hex(), f"{what}: {got!r} != pinned {want!r} (bit for bit, the pinning machine)"
    else:
        assert math.isclose(got, want, rel_tol=1e-5), f"{what}: {got!r} vs pinned {want!r} (to 1e-5 elsewhere)"
