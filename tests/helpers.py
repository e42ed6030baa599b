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

import functools
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


def tool_refusal(name: str, *argv) -> str:
    """The one line a benchmarks tool (``benchmarks/tools/NAME.py``, its ``main``) exits with on bad input: a
    SystemExit with one line naming the tool, printed on stderr, exit 1."""
    import pytest

    with pytest.raises(SystemExit) as e:
        load_tool(name).main([str(a) for a in argv])
    said = e.value.code
    assert isinstance(said, str) and "\n" not in said and said.startswith(f"{name}.py: "), said
    return said


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


# The pins (tests/train/test_pinned_results.py, tests/experiments/test_main_job_records.py) hold bit for bit only on
# a machine shown to compute as the pinning machine did: one whose :func:`cpu_probe` gives this value. A label does
# not show it: two CPUs that both report torch 2.13.0+cpu and AVX512 can take different matmul kernels (the math
# library picks them by CPU model) and round ~1e-7 relative differently (issue 66). Recorded on the pinning machine
# (AMD EPYC, x86_64 with AVX512, torch 2.13.0+cpu); after a deliberate re-pin, print the new value with
# ``PYTHONPATH=src:tests python -c "import helpers; print(helpers.cpu_probe())"``.
PINNING_PROBE = "d48606b08148599d"
# Elsewhere a pin holds to this relative tolerance: ~84 fp32 ulps (2^-23 = 1.2e-7 relative), over 100x the
# differences seen on another CPU (7.6e-8, one ulp of a loss near 6.24: 6.240715503692627 vs 6.240715980529785),
# and a sixteenth of the smallest difference the docs report (0.001 nats on a loss near 6: 1.6e-4 relative).
PIN_TOLERANCE = 1e-5
# The shapes of the pinned runs (width, heads, vocabulary, batch, sequence): the debug recipe on the tests' byte
# data (test_pinned_results.py), and the recipe ``compare`` at the tiny preset (test_main_job_records.py).
_PROBE_SHAPES = ((32, 2, 257, 4, 32), (256, 4, 257, 16, 64))


def _probe_step(width: int, heads: int, vocab: int, batch: int, seq: int, g: torch.Generator) -> list[torch.Tensor]:
    """One training step of a one-block Llama-style model written in plain torch ops (not the library's model, so
    that a change to the library cannot move the probe and loosen the pins it keys): embedding, RMSNorm,
    causal SDPA, a SiLU-gated MLP written through a sigmoid gate and a bmm (the delta update's kernels),
    cross entropy, backward, gradient clipping and AdamW. Returns the loss, the gradient norm and the updated
    parameters."""
    import torch.nn.functional as F

    inter, hd = 8 * width // 3, width // heads

    def weight(*shape):
        return (0.02 * torch.randn(shape, generator=g)).requires_grad_()

    emb, wqkv, wo = weight(vocab, width), weight(3 * width, width), weight(width, width)
    wg, wu, wd, wb = weight(inter, width), weight(inter, width), weight(width, inter), weight(1, width)
    n1, n2, nf = (torch.ones(width).requires_grad_() for _ in range(3))
    params = [emb, wqkv, wo, wg, wu, wd, wb, n1, n2, nf]
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    x = emb[ids[:, :-1]]
    c = F.rms_norm(x, (width,), n1, 1e-5)
    q, k, v = (t.reshape(batch, seq, heads, hd).transpose(1, 2) for t in F.linear(c, wqkv).split(width, -1))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, width)
    x = x + F.linear(y, wo)
    c = F.rms_norm(x, (width,), n2, 1e-5)
    h = F.linear(F.silu(F.linear(c, wg)) * F.linear(c, wu), wd)
    beta = 2 * torch.sigmoid(F.linear(torch.tanh(c), wb))  # (batch, seq, 1): a gate in (0, 2)
    kdir = F.normalize(h, dim=-1).reshape(-1, width, 1)
    read = torch.bmm(kdir.transpose(1, 2), x.reshape(-1, width, 1)).reshape(batch, seq, 1)  # k^T x
    x = x + beta * (h - read * kdir.reshape(batch, seq, width))
    logits = F.linear(F.rms_norm(x, (width,), nf, 1e-5), emb)
    loss = F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
    torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1).step()
    return [loss.detach(), norm, *(p.detach() for p in params)]


@functools.cache
def cpu_probe() -> str:
    """What this machine computes for a fixed fp32 computation through the kernels the pinned runs use (matmuls
    forward and backward, attention, norms, exp / log / sigmoid / tanh / SiLU, reductions, AdamW), on one
    thread as the pins were made, at the pinned runs' shapes: the first 16 hex digits of a sha256 of every
    result's bits. Once per test process; PyTorch's thread count and random state are left as they were."""
    import hashlib

    threads, digest = torch.get_num_threads(), hashlib.sha256()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(66)
        for shape in _PROBE_SHAPES:
            for t in _probe_step(*shape, g):
                digest.update(t.detach().contiguous().numpy().tobytes())
    finally:
        torch.set_num_threads(threads)
    return digest.hexdigest()[:16]


def computes_as_pinned() -> bool:
    """Whether this machine's :func:`cpu_probe` is the pinning machine's (:data:`PINNING_PROBE`)."""
    return cpu_probe() == PINNING_PROBE


def same_as_pinned(got: float, want: float, what: str) -> None:
    """``got`` equals the pinned ``want``: bit for bit on a machine that computes as the pinning one did
    (:func:`computes_as_pinned`), to :data:`PIN_TOLERANCE` relative elsewhere; the message says which one ran."""
    import math

    if computes_as_pinned():
        assert got.hex() == want.hex(), (f"{what}: {got!r} != pinned {want!r} (bit for bit: this machine's probe "
                                         "is the pinning machine's)")
    else:
        assert math.isclose(got, want, rel_tol=PIN_TOLERANCE), (
            f"{what}: {got!r} vs pinned {want!r} (to {PIN_TOLERANCE:g} relative: this machine's probe "
            f"{cpu_probe()} is not the pinning machine's {PINNING_PROBE})")
