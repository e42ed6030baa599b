"""The authors' published model code beside ours: the training step of each pair, in one process, interleaved.

Their code is the `model/` folder of the paper's repository (yifanzhang-pro/deep-delta-learning on GitHub). It is
never part of ours: ``--authors DIR`` names an extracted copy (how to make one: below), which this tool imports
as a package (its files have dashes in their names and import each other relatively); their snapshot's commit is
``--authors-commit``, else the file COMMIT beside their folder.

Pairs (:data:`PAIRS`): their baseline (``gpt_base.GPTBase`` with their attention; their folder has no baseline
file of its own) <-> ``baseline``, ``DDL-vdim1`` <-> ``ddl-dv1``, ``EC`` (token-axis compressor + embedding conv)
<-> ``ddl-tc``, ``CC-EC`` and ``CC-EC-accelerated`` (their Triton path) <-> ``ddl-cc``, ``DDL-gpt-mha-rope``
<-> ``ddl-tc-noec``, ``CC`` <-> ``ddl-cc-noec``; any other variant of ours is listed with no counterpart.

What is timed, per model and mode: ``--steps`` training steps on one fixed (B, T) batch, each our trainer's
:class:`deep_delta.train.step.OptimizerStep` (forward + backward under the autocast, gradient clipping at the
training default 1.0, AdamW, zero_grad); ours through :class:`deep_delta.eval.step_bench.StepSubject` (the
optimizer ``ddl train`` builds), theirs with ``torch.optim.AdamW`` over all their parameters at the same lr,
betas and weight decay (fused on CUDA, as ours) and their loss (``model(idx, targets)``). Modes: ``eager``, and
``compiled``: each block compiled in place (``block.compile()``), ours as ``ddl train --set compile=true`` does,
theirs the same way. Every model of a mode is measured in the same interleaved rounds
(:func:`deep_delta.eval.timing.interleaved`, as ``ddl bench``); the figure is the median tokens/s over repeats.
Peak training memory where the device reports it (CUDA): :meth:`StepSubject.peak_train_memory`.

Their code run as published, with what this process needs to run it at all, said in the table's notes:
- transformers 5: their config validation (``pydantic_config``) resolves the annotations of transformers' own
  config class, which name ``torch`` only for type checkers: the loaded module's ``get_type_hints`` is given
  ``torch``; their ``GPTBase`` declares its tied weights as a list, transformers 5 wants a mapping: the baseline
  subclass built here declares the mapping.
- ``causal_conv1d`` (their TC models' short convolution; a CUDA package built from source, not on this image):
  when it is not installed, a PyTorch stand-in (``F.conv1d``, causal) is put in its place, and the TC rows say so.
- on CPU their Triton kernels run under the Triton interpreter (``TRITON_INTERPRET=1``): a smoke test, no timing.

Needs pydantic (their configs). A model that fails to build or to take its first step is listed with the error
and the line of their code it failed at; the others are measured. Known: their Triton path's backward multiplies
an fp32 gradient by a bf16 activation (``DDL_utils.py``, ``dW_v = torch.matmul(dv_logits.t(), v_in_flat)``), so it
fails under bf16 autocast in eager mode; ``--dtype float32`` times it.

    python benchmarks/tools/authors_bench.py --authors third_party/ddl-authors/model --out DIR/authors.md \
        [--preset small --batch 8 --seq 1024 --modes eager compiled --variants baseline ddl-dv1 ddl-tc ddl-cc]

For a GPU session (its image has no pydantic and may hold an older transformers; nothing can be fetched there),
prepare here, then carry ``third_party`` (it is ignored by git):

    mkdir -p third_party/ddl-authors
    git -C /work/.mirror/yifanzhang-pro+deep-delta-learning/repo archive HEAD model | tar -x -C third_party/ddl-authors
    git -C /work/.mirror/yifanzhang-pro+deep-delta-learning/repo rev-parse HEAD > third_party/ddl-authors/COMMIT
    pip download pydantic --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
        --implementation cp -d third_party/wheels
    pip download transformers==5.24.0 --no-deps --only-binary=:all: -d third_party/wheels

and run there (``--commit``: our commit, where the copy of the tree there has no git history):

    pip install -q --no-index --find-links third_party/wheels pydantic transformers==5.24.0
    PYTHONPATH=src python3 benchmarks/tools/authors_bench.py --out $OUT/authors_small_bf16.md --commit SHA
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import importlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_AUTHORS = "third_party/ddl-authors/model"
EXTRACT_HINT = ("extract their model folder with `git -C <their repository> archive HEAD model | tar -x -C "
                "third_party/ddl-authors` and pass --authors third_party/ddl-authors/model")
PACKAGE = "ddl_authors_model"  # the name their folder is imported under
BASELINE = "gpt_base"  # their baseline: GPTBase with the attention of their model files


@dataclass(frozen=True)
class Pair:
    """One row: our variant and their model file (its stem; None: no counterpart in their code)."""

    variant: str
    theirs: str | None
    label: str = ""  # the row's name when it differs from the paper's name of the variant


PAIRS: tuple[Pair, ...] = (
    Pair("baseline", BASELINE),
    Pair("ddl-dv1", "DDL-vdim1-gpt-mha-rope"),
    Pair("ddl-tc", "DDL-gpt-mha-rope-EC"),
    Pair("ddl-cc", "DDL-gpt-mha-rope-CC-EC"),
    Pair("ddl-cc", "DDL-gpt-mha-rope-CC-EC-accelerated", "DDL-CC, their Triton path"),
    Pair("ddl-tc-noec", "DDL-gpt-mha-rope"),
    Pair("ddl-cc-noec", "DDL-gpt-mha-rope-CC"),
)
THEIR_FILES = tuple(sorted({p.theirs for p in PAIRS if p.theirs} - {BASELINE}))
REQUIRED = (*(f"{stem}.py" for stem in THEIR_FILES), "gpt_base.py", "DDL_utils.py", "pydantic_config.py")
TC_FILES = ("DDL-gpt-mha-rope-EC", "DDL-gpt-mha-rope")  # their token-axis compressor: causal_conv1d
TRITON_FILES = ("DDL-gpt-mha-rope-CC-EC-accelerated",)
CC_FILES = ("DDL-gpt-mha-rope-CC-EC", "DDL-gpt-mha-rope-CC-EC-accelerated", "DDL-gpt-mha-rope-CC")
MODES = ("eager", "compiled")


class AuthorsError(ValueError):
    """Their code cannot be used: the message is one line and names --authors where the folder is at fault."""


def pairs_for(variants: Sequence[str]) -> list[Pair]:
    """The rows for our ``variants``, in their order: each variant's pairs, or one row with no counterpart."""
    rows = []
    for v in variants:
        rows += [p for p in PAIRS if p.variant == v] or [Pair(v, None)]
    return rows


def ours_key(variant: str) -> str:
    return f"ours:{variant}"


def theirs_key(stem: str) -> str:
    return f"theirs:{stem}"


# ---------------------------------------------------------------------------------------------------------------
# Their code


def check_authors_dir(path: str | os.PathLike) -> Path:
    """``path`` as their model folder, or :class:`AuthorsError` saying what is missing."""
    d = Path(path)
    if not d.is_dir():
        raise AuthorsError(f"--authors {path}: no such folder; {EXTRACT_HINT}")
    missing = [f for f in REQUIRED if not (d / f).is_file()]
    if missing:
        raise AuthorsError(f"--authors {path}: not the authors' model folder (no {', '.join(missing)}); "
                           f"{EXTRACT_HINT}")
    return d.resolve()


def _causal_conv1d_standin() -> types.ModuleType:
    """A module ``causal_conv1d`` whose ``causal_conv1d_fn`` is the package's causal depthwise convolution in
    PyTorch: x (B, C, T), weight (C, K) -> (B, C, T), ``out[t] = sum_k weight[:, k] x[t - K + 1 + k]``."""
    import torch.nn.functional as F

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                         final_states_out=None, activation=None):
        if seq_idx is not None or initial_states is not None or return_final_states:
            raise NotImplementedError("the causal_conv1d stand-in has no seq_idx / initial or final states")
        k = weight.shape[1]
        y = F.conv1d(F.pad(x, (k - 1, 0)), weight.unsqueeze(1), bias, groups=x.shape[1])
        return F.silu(y) if activation in ("silu", "swish") else y

    mod = types.ModuleType("causal_conv1d")
    mod.causal_conv1d_fn = causal_conv1d_fn
    mod.STANDIN = True  # authors_bench.py's, not the CUDA package
    return mod


@dataclass
class AuthorsCode:
    """Their model folder, imported as the package :data:`PACKAGE`."""

    path: Path
    commit: str
    sha256: str  # of their .py files, sorted by name: which code ran when no commit is known
    standins: list[str] = field(default_factory=list)  # packages replaced by a stand-in (causal_conv1d)
    interpreted: bool = False  # their Triton kernels built by the Triton interpreter (CPU)

    def module(self, stem: str) -> types.ModuleType:
        return importlib.import_module(f"{PACKAGE}.{stem}")


def load_authors(path: str | os.PathLike, commit: str | None = None, *, interpret_triton: bool = False) -> AuthorsCode:
    """Import their folder as a package (its modules are loaded on first use by :meth:`AuthorsCode.module`).

    ``interpret_triton``: set ``TRITON_INTERPRET=1`` before their kernels are defined (CPU runs)."""
    d = check_authors_dir(path)
    if importlib.util.find_spec("pydantic") is None:
        raise AuthorsError("their code needs pydantic, not installed here: pip install pydantic (a machine without "
                           "the network: pip install --no-index --find-links DIR pydantic, with its wheels in DIR)")
    if interpret_triton:
        os.environ["TRITON_INTERPRET"] = "1"
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]  # another folder loaded before under the same name
    pkg = types.ModuleType(PACKAGE)
    pkg.__path__ = [str(d)]
    pkg.__package__ = PACKAGE
    pkg.__file__ = None
    sys.modules[PACKAGE] = pkg
    standins = []
    cc = sys.modules.get("causal_conv1d")
    if cc is None and importlib.util.find_spec("causal_conv1d") is None:
        cc = sys.modules["causal_conv1d"] = _causal_conv1d_standin()
    if getattr(cc, "STANDIN", False):
        standins.append("causal_conv1d")
    _adapt_config_validation(importlib.import_module(f"{PACKAGE}.pydantic_config"))
    digest = hashlib.sha256()
    for f in sorted(d.glob("*.py")):
        digest.update(f.name.encode() + b"\0" + f.read_bytes())
    if commit is None:
        marker = d.parent / "COMMIT"
        commit = marker.read_text().strip() if marker.is_file() else "not recorded"
    return AuthorsCode(d, commit, digest.hexdigest(), standins, interpreted=interpret_triton)


def _adapt_config_validation(pc: types.ModuleType) -> None:
    """Their config validation calls ``get_type_hints`` on their config class, which also resolves the
    annotations of transformers 5's ``PreTrainedConfig`` (``dtype: "str | torch.dtype | None"``, with torch
    imported there for type checkers only): hand it ``torch``."""
    import typing

    import torch

    def get_type_hints(obj, globalns=None, localns=None, include_extras=False):
        return typing.get_type_hints(obj, globalns, {"torch": torch, **(localns or {})}, include_extras)

    pc.get_type_hints = get_type_hints


@dataclass(frozen=True)
class Shape:
    vocab_size: int
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    max_position_embeddings: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def ours(self) -> dict:
        """Our DDLConfig overrides."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        return (f"{self.num_hidden_layers} layers, width {self.hidden_size}, {self.num_attention_heads} heads of "
                f"{self.head_dim}, vocab {self.vocab_size}")


def build_theirs(code: AuthorsCode, stem: str, shape: Shape, seq_len: int):
    """Their model of file ``stem`` at ``shape`` (fp32 weights, on the CPU, their own initialisation)."""
    if stem == BASELINE:
        # no baseline file: GPTBase (their additive pre-norm block, SwiGLU MLP) with their attention and config
        attn = code.module("DDL-vdim1-gpt-mha-rope")
        base = code.module(BASELINE).GPTBase
        cls = type("AuthorsBaseline", (base,), {
            "attention_cls": attn.CausalSelfAttention,
            # transformers 5 reads the tied weights as {target: source}; GPTBase lists them (transformers 4)
            "_tied_weights_keys": {"lm_head.weight": "transformer.wte.weight"},
        })
        config_cls = attn.GPTConfig
    else:
        mod = code.module(stem)
        cls, config_cls = mod.GPT, mod.GPTConfig
    cfg = config_cls(vocab_size=shape.vocab_size, num_hidden_layers=shape.num_hidden_layers,
                     hidden_size=shape.hidden_size, num_attention_heads=shape.num_attention_heads,
                     head_dim=shape.head_dim, block_size=seq_len)
    return cls(cfg)


# ---------------------------------------------------------------------------------------------------------------
# The subjects


def _their_subject(model, *, x, y, device, dtype: str, compile: bool):
    """Their model as a :class:`StepSubject`: the same step object, memory measurement and batch as ours."""
    import torch

    from deep_delta.eval.step_bench import StepSubject
    from deep_delta.eval.timing import autocast_for
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.distributed import DistInfo
    from deep_delta.train.step import build_step

    class LossOnly(torch.nn.Module):
        """Their model behind the call our step makes, ``model(x, shift_labels=y).loss``; their forward is
        ``model(idx, targets) -> (logits, loss)``."""

        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, idx, shift_labels):
            return types.SimpleNamespace(loss=self.inner(idx, targets=shift_labels)[1])

    class TheirSubject(StepSubject):
        def __init__(self):  # StepSubject's fields, filled for their model
            self.variant, self.device, self.dtype = "theirs", device, dtype
            self.batch_size, self.seq_len = x.shape
            self.model = LossOnly(model).to(device)
            self.params = sum(p.numel() for p in self.model.parameters())
            self.compiled = bool(compile)
            if self.compiled:
                for block in model.transformer.h:
                    block.compile()
            # our step, built as ours is (train.step.build_step: the trainer's defaults, AdamW with weight decay on
            # the matrices); their blocks compiled above, in place
            run = TrainConfig(device=str(device))
            self.grad_clip = run.grad_clip
            self.x, self.y = x, y
            self.autocast = autocast_for(dtype, device)
            self.info = DistInfo(device=device)
            built = build_step(self.model, run, self.info, autocast=self.autocast)
            self.opt, self.step = built.optimizer, built.step

    return TheirSubject()


def _error(e: BaseException, code: AuthorsCode | None = None) -> str:
    """One line: the exception, and the innermost line of their code it passed through (if any)."""
    import traceback

    msg = " ".join(str(e).split())
    where = ""
    if code is not None:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).parent == code.path]
        if frames:
            where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno}: `{frames[-1].line}`)"
    return f"{type(e).__name__}: {msg[:300]}{where}"


@dataclass
class Settings:
    preset: str
    shape: Shape
    variants: list[str]
    modes: list[str]
    device: str
    dtype: str
    batch_size: int
    seq_len: int
    steps: int
    repeats: int
    warmup: int
    seed: int


@dataclass
class Measured:
    """What a run measured; keys are :func:`ours_key` / :func:`theirs_key`."""

    params: dict[str, int] = field(default_factory=dict)
    rates: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # mode -> key -> tokens/s per repeat
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # mode -> key -> peak bytes (CUDA)
    failed: dict[str, dict[str, str]] = field(default_factory=dict)  # mode -> key -> the error
    untimed: dict[str, list[str]] = field(default_factory=dict)  # mode -> keys that took their first step only


def measure(s: Settings, code: AuthorsCode, say=print) -> Measured:
    """Every model of ``s`` in each mode, the models of a mode interleaved; modes one after another."""
    import torch

    from deep_delta.eval.step_bench import StepSubject
    from deep_delta.eval.timing import interleaved, timed

    device = torch.device(s.device)
    rows = pairs_for(s.variants)
    ours = list(dict.fromkeys(p.variant for p in rows))
    theirs = list(dict.fromkeys(p.theirs for p in rows if p.theirs))
    g = torch.Generator().manual_seed(s.seed)  # StepSubject's batch: the same tokens for every model
    tokens = torch.randint(0, s.shape.vocab_size, (s.batch_size, s.seq_len + 1), generator=g).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    out = Measured()
    for mode in s.modes:
        compile = mode == "compiled"
        failed = out.failed.setdefault(mode, {})
        subjects = {}
        for v in ours:
            say(f"[{mode}] building ours {v}")
            try:
                subjects[ours_key(v)] = StepSubject(v, s.preset, batch_size=s.batch_size, seq_len=s.seq_len,
                                                    device=device, dtype=s.dtype, overrides=s.shape.ours(),
                                                    seed=s.seed, compile=compile)
            except Exception as e:  # a model that cannot be built is a row with its error, not a lost run
                failed[ours_key(v)] = _error(e)
        for stem in theirs:
            say(f"[{mode}] building theirs {stem}")
            try:
                torch.manual_seed(s.seed)
                model = build_theirs(code, stem, s.shape, s.seq_len)
                subjects[theirs_key(stem)] = _their_subject(model, x=x, y=y, device=device, dtype=s.dtype,
                                                            compile=compile)
            except Exception as e:
                failed[theirs_key(stem)] = _error(e, code)
        for key, sub in subjects.items():
            out.params[key] = sub.params
        with torch._dynamo.config.patch(recompile_limit=8 * max(1, len(subjects)), fail_on_recompile_limit_hit=True):
            for key in list(subjects):  # the first step (untimed; compiles): a model that fails it is left out
                say(f"[{mode}] first step {key}")
                try:
                    subjects[key].train_step()
                except Exception as e:
                    failed[key] = _error(e, code)
                    del subjects[key]
            # Interpreted Triton (CPU) is a check that their code runs, not a timing, and it slows the models
            # timed after it (its numpy threads keep the cores): it takes its first step only.
            untimed = [k for k in subjects if code.interpreted and k in {theirs_key(t) for t in TRITON_FILES}]
            out.untimed[mode] = untimed
            for key in untimed:
                del subjects[key]

            def case(sub):
                def run() -> float:
                    def steps() -> None:
                        for _ in range(s.steps):
                            sub.train_step()

                    return s.batch_size * s.seq_len * s.steps / timed(steps, device)

                return run

            out.rates[mode] = interleaved({k: case(sub) for k, sub in subjects.items()}, s.repeats, s.warmup,
                                          progress=lambda m, mode=mode: say(f"[{mode}] {m}"))
            if device.type == "cuda":
                mem = out.memory.setdefault(mode, {})
                for key, sub in subjects.items():
                    say(f"[{mode}] peak memory {key}")
                    mem[key] = sub.peak_train_memory()
        subjects.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        torch._dynamo.reset()
    return out


# ---------------------------------------------------------------------------------------------------------------
# The table


def _rate(x: float) -> str:
    if math.isnan(x):
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.3f}M"
    return f"{x / 1e3:.1f}K" if x >= 1e3 else f"{x:.0f}"


def _median(m: Measured, mode: str, key: str | None) -> float:
    xs = m.rates.get(mode, {}).get(key) if key else None
    return statistics.median(xs) if xs else math.nan


def _rate_cell(m: Measured, mode: str, key: str | None, base: float) -> str:
    """Median tokens/s and its factor over ``base``, or why there is none."""
    if key is None:
        return "-"
    if key in m.failed.get(mode, {}):
        return "failed"
    if key in m.untimed.get(mode, ()):
        return "ran, not timed"
    x = _median(m, mode, key)
    return _rate(x) if math.isnan(x * base) else f"{_rate(x)} ({x / base:.2f})"


def _params(m: Measured, a: str, b: str | None) -> str:
    pa, pb = m.params.get(a), m.params.get(b) if b else None
    if pa is None or pb is None:
        return " / ".join("-" if p is None else f"{p:,}" for p in (pa, pb))
    same = "equal" if pa == pb else f"{pa - pb:+,}"
    return f"{pa:,} / {pb:,} ({same})"


def table(s: Settings, m: Measured, header: dict[str, str]) -> str:
    """Markdown: one row per pair; per mode our and their tokens/s, each as x our baseline of that mode, and
    ours / theirs; peak memory per mode where measured; the notes below say what ran in place of what."""
    from deep_delta.eval.timing import dtype_label
    from deep_delta.variants import paper_name

    rows = pairs_for(s.variants)
    mem_modes = [mode for mode in s.modes if m.memory.get(mode)]
    lines = [
        "# The authors' code beside ours: the training step",
        "",
        f"On {header['device']}, torch {header['torch']}. Ours: deep-delta-learning at {header['ours_commit']}. "
        f"Theirs: the `model/` folder of yifanzhang-pro/deep-delta-learning at {header['theirs_commit']} (its .py "
        f"files' sha256 {header['theirs_sha256'][:16]}). Shape: {s.shape.describe()} (our preset {s.preset}); "
        f"batch {s.batch_size} x {s.seq_len} tokens; {dtype_label(s.dtype)}. Modes: "
        + ", ".join({"eager": "eager", "compiled": "compiled (each block compiled in place with `block.compile()`, "
                     "ours as `ddl train --set compile=true`, theirs the same way)"}[x] for x in s.modes) + ". "
        f"Step: our trainer's OptimizerStep for both (forward + backward, clip 1.0, AdamW, zero_grad); ours with the "
        f"AdamW `ddl train` builds, theirs with torch.optim.AdamW at the same lr, betas and weight decay. Median "
        f"tokens/s of {s.repeats} interleaved repeats of {s.steps} steps, after {s.warmup} warm-up round(s) and "
        f"a first step. x: over our baseline in the same mode; ours/theirs above 1: ours is faster.",
        "",
    ]
    head = ["Model", "ours", "theirs", "params ours / theirs"]
    for mode in s.modes:
        head += [f"{mode}: ours tok/s (x)", f"{mode}: theirs tok/s (x)", f"{mode}: ours/theirs"]
    for mode in mem_modes:
        head += [f"{mode}: peak memory ours / theirs"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in rows:
        ok, tk = ours_key(p.variant), theirs_key(p.theirs) if p.theirs else None
        cells = [p.label or paper_name(p.variant), f"`{p.variant}`",
                 f"`{p.theirs}.py`" if p.theirs and p.theirs != BASELINE else
                 ("`gpt_base.py` (GPTBase + their attention)" if p.theirs else "no counterpart"),
                 _params(m, ok, tk)]
        for mode in s.modes:
            base = _median(m, mode, ours_key("baseline"))
            ratio = _median(m, mode, ok) / _median(m, mode, tk)
            cells += [_rate_cell(m, mode, ok, base), _rate_cell(m, mode, tk, base),
                      "-" if math.isnan(ratio) else f"{ratio:.2f}"]
        for mode in mem_modes:
            mem = m.memory[mode]
            cells.append(" / ".join(f"{mem[k] / 2**20:,.0f} MiB" if k in mem else "-" for k in (ok, tk)))
        lines.append("| " + " | ".join(cells) + " |")
    notes = _notes(s, m, header)
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def _notes(s: Settings, m: Measured, header: dict[str, str]) -> list[str]:
    rows = pairs_for(s.variants)
    stems = {p.theirs for p in rows if p.theirs}
    notes = []
    tc = [f"`{t}.py`" for t in TC_FILES if t in stems]
    if tc and "causal_conv1d" in header.get("standins", ""):
        notes.append(f"causal_conv1d is not installed: their TC models ({', '.join(tc)}) ran with a PyTorch "
                     "stand-in (`F.conv1d`, causal) for its CUDA kernel, not with the kernel they used.")
    if header.get("triton_interpreted") == "yes" and stems & set(TRITON_FILES):
        notes.append("their Triton kernels ran under the Triton interpreter (TRITON_INTERPRET=1, CPU): their "
                     "Triton model took its first step (a check that it runs) and was not timed.")
    cc = [f"`{p.theirs}.py`" for p in rows if p.theirs in CC_FILES
          and m.params.get(theirs_key(p.theirs), 0) > m.params.get(ours_key(p.variant), math.inf)]
    if cc:
        notes.append(f"parameters: their CC compressors ({', '.join(dict.fromkeys(cc))}) hold d_v more each (one per "
                     "block and the readout): a read vector beside their (d, kernel) weights, which our (d, d_v) "
                     "channel weights fold in (the same family of maps).")
    if header["device"].startswith("CPU"):
        notes.append("CPU timings: not the GPU comparison this table is for.")
    for mode, fails in m.failed.items():
        for key, err in fails.items():
            notes.append(f"{mode}: {key} failed: {err}")
    return notes


def header_for(s: Settings, code: AuthorsCode, ours_commit: str | None) -> dict[str, str]:
    import torch

    if s.device.startswith("cuda"):
        device = torch.cuda.get_device_name(torch.device(s.device))
    else:
        device = f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    return {"device": device, "torch": torch.__version__, "ours_commit": ours_commit or _git_commit(),
            "theirs_commit": code.commit, "theirs_sha256": code.sha256, "standins": ", ".join(code.standins),
            "triton_interpreted": "yes" if code.interpreted else "no"}


def _git_commit() -> str:
    try:
        sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "not recorded (no git here: pass --commit)"


def write(path: str | os.PathLike, s: Settings, m: Measured, header: dict[str, str]) -> Path:
    """The table to ``path``, the settings, header and every sample to ``path`` with suffix .json."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table(s, m, header) + "\n")
    payload = {"settings": dataclasses.asdict(s), "header": header,
               "pairs": [dataclasses.asdict(p) for p in pairs_for(s.variants)], **dataclasses.asdict(m)}
    path.with_suffix(".json").write_text(json.dumps(payload, indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------------------------------
# The command


def parse(argv=None) -> argparse.Namespace:
    from deep_delta.variants import DEFAULT_VARIANTS, PRESETS, VARIANTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", default=DEFAULT_AUTHORS, metavar="DIR",
                    help=f"their model/ folder (default {DEFAULT_AUTHORS})")
    ap.add_argument("--authors-commit", default=None, metavar="SHA",
                    help="their snapshot's commit (default: the file COMMIT beside their model/ folder)")
    ap.add_argument("--commit", default=None, help="our commit (default: git rev-parse HEAD)")
    ap.add_argument("--out", default=None, metavar="FILE", help="write the table here and the samples to FILE.json")
    ap.add_argument("--device", default="auto", help="cuda | cpu | auto (CUDA when there is one)")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="default: bfloat16 autocast on CUDA, float32 on CPU")
    ap.add_argument("--preset", default="small", choices=tuple(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="override the preset's layers")
    ap.add_argument("--width", type=int, default=None, help="override the preset's hidden size")
    ap.add_argument("--heads", type=int, default=None, help="override the preset's attention heads")
    ap.add_argument("--vocab", type=int, default=None, help="override the preset's vocabulary")
    ap.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=tuple(VARIANTS),
                    help="our variants; each brings its pairs (ddl-cc: their CC-EC and their Triton CC-EC)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--batch", type=int, default=None, help="sequences per batch (default: the preset's)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: the preset's)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up rounds after the first step")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    from deep_delta.eval.settings import DEFAULT_SHAPES
    from deep_delta.runtime import resolve_device
    from deep_delta.variants import PRESETS

    p = PRESETS[args.preset]
    shape = Shape(vocab_size=args.vocab or p["vocab_size"], num_hidden_layers=args.layers or p["num_hidden_layers"],
                  hidden_size=args.width or p["hidden_size"],
                  num_attention_heads=args.heads or p["num_attention_heads"],
                  max_position_embeddings=p["max_position_embeddings"])
    b, t = DEFAULT_SHAPES.get(args.preset, (8, 1024))
    b, t = args.batch or b, args.seq or t
    shape = dataclasses.replace(shape, max_position_embeddings=max(shape.max_position_embeddings, t))
    device = str(resolve_device(args.device))
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if shape.hidden_size % shape.num_attention_heads:
        raise ValueError(f"--width {shape.hidden_size} is not a multiple of --heads {shape.num_attention_heads}")
    for name, v in (("batch", b), ("seq", t), ("steps", args.steps), ("repeats", args.repeats)):
        if v < 1:
            raise ValueError(f"--{name} got {v}; at least 1")
    return Settings(args.preset, shape, list(dict.fromkeys(args.variants)), list(dict.fromkeys(args.modes)), device,
                    dtype, b, t, args.steps, args.repeats, args.warmup, args.seed)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        s = settings_from(args)
        code = load_authors(args.authors, args.authors_commit, interpret_triton=s.device == "cpu")
    except (AuthorsError, ValueError) as e:
        print(f"authors_bench.py: error: {e}", file=sys.stderr)
        return 2
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    m = measure(s, code, say)
    header = header_for(s, code, args.commit)
    text = table(s, m, header)
    print(text)
    if args.out:
        write(args.out, s, m, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
