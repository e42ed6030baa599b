"""Find and load a model for inference: an HF directory, a training checkpoint, or a training run.

Every inference command (``ddl generate``, ``ddl eval``, ``ddl export``) goes through :func:`load_model`.
Weights are read from safetensors only; pickled files (``pytorch_model.bin``) are never opened.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
TRAIN_META = "train_meta.json"
LATEST = "LATEST"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelSource:
    """Where a model lives: ``model_dir`` holds config.json + model.safetensors.

    kind: "hf" (a plain HF directory), "checkpoint" (a training checkpoint with train_meta.json) or
    "run" (a training run directory resolved through checkpoints/LATEST). ``train_meta`` is the
    checkpoint's train_meta.json ({} for a plain HF directory).
    """

    path: Path
    model_dir: Path
    kind: str
    train_meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadedModel:
    model: Any  # DDLForCausalLM, in eval mode
    tokenizer: Any  # a transformers tokenizer, or None when none was found and none was required
    source: ModelSource
    tokenizer_name: str | None = None  # "byte" | "gpt2" when known


def _not_a_model(path: Path, why: str = "") -> FileNotFoundError:
    msg = (
        f"{path} is not a model directory: expected {CONFIG} + {WEIGHTS}, or a training run with "
        f"checkpoints/{LATEST}"
    )
    return FileNotFoundError(msg + (f" ({why})" if why else ""))


def _is_model_dir(d: Path) -> bool:
    return (d / CONFIG).is_file() and ((d / WEIGHTS).is_file() or (d / WEIGHTS_INDEX).is_file())


def resolve_model_dir(path: str | os.PathLike) -> ModelSource:
    """Resolve ``path`` (HF dir, checkpoint dir, run dir, or a run's checkpoints/ dir) to a model directory."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist (expected a model directory or a training run)")
    if not p.is_dir():
        raise _not_a_model(p, "it is a file")
    if _is_model_dir(p):
        meta = _read_json(p / TRAIN_META) if (p / TRAIN_META).is_file() else {}
        return ModelSource(p, p, "checkpoint" if meta else "hf", meta)
    for run_dir in (p, p.parent) if p.name == "checkpoints" else (p,):  # a run, or its checkpoints/ directory
        if (run_dir / "checkpoints" / LATEST).is_file():
            from deep_delta.train.checkpoint import latest_checkpoint

            try:
                ckpt = latest_checkpoint(run_dir)
            except (FileNotFoundError, ValueError) as e:
                raise _not_a_model(p, str(e)) from None
            return ModelSource(p, ckpt, "run", _read_json(ckpt / TRAIN_META))
    if (p / "pytorch_model.bin").exists() and (p / CONFIG).is_file():
        raise _not_a_model(p, "found pytorch_model.bin: pickled weights are never loaded; save with safetensors")
    if (p / CONFIG).is_file():
        raise _not_a_model(p, f"{CONFIG} is there but {WEIGHTS} is missing")
    raise _not_a_model(p)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def resolve_device(device: str = "auto") -> torch.device:
    """"auto" -> cuda when available, else cpu; "cpu", "cuda", "cuda:N" as given (cuda must exist)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"--device: got {device!r}; allowed: auto | cpu | cuda | cuda:N") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: got {device!r} but CUDA is not available on this machine; use cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: got {device!r}; allowed: auto | cpu | cuda | cuda:N")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """"auto" -> bfloat16 on a CUDA device that supports it, else float32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"--dtype: got {dtype!r}; allowed: auto | {' | '.join(DTYPES)}")
    return DTYPES[dtype]


def load_tokenizer(source: ModelSource, name: str | None = None, model_max_length: int | None = None):
    """The tokenizer for ``source``: ``name`` if given, else the saved tokenizer.json, else the training
    tokenizer named in train_meta.json. Returns (tokenizer or None, name or None)."""
    if name is not None:
        return _build(name, model_max_length), name
    if (source.model_dir / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(source.model_dir), local_files_only=True)
        return tok, source.train_meta.get("tokenizer")
    meta_name = source.train_meta.get("tokenizer")
    if meta_name is not None:
        return _build(meta_name, model_max_length), meta_name
    return None, None


def _build(name: str, model_max_length: int | None):
    from deep_delta.data import DataUnavailableError
    from deep_delta.hf.tokenizer import build_tokenizer

    try:
        return build_tokenizer(name, model_max_length)
    except DataUnavailableError as e:  # a missing local BPE file is the user's to provide: a clear error
        raise ValueError(f"tokenizer {name!r}: {e}") from e


def load_model(
    path: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = "float32",
    tokenizer: str | None = None,
    require_tokenizer: bool = True,
) -> LoadedModel:
    """Load the DDL model at ``path`` (see :func:`resolve_model_dir`) in eval mode, with its tokenizer.

    ``tokenizer`` ("byte" | "gpt2") overrides the saved one. With ``require_tokenizer`` a model without a
    known tokenizer is an error naming how to provide one.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    import deep_delta.models  # noqa: F401  (registers model_type "deep_delta" with the Auto classes)

    source = resolve_model_dir(path)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    config = AutoConfig.from_pretrained(str(source.model_dir), local_files_only=True)
    if config.model_type != "deep_delta":
        raise ValueError(
            f"{source.model_dir}: config.json has model_type {config.model_type!r}; this loader reads "
            "deep_delta models only"
        )
    model = AutoModelForCausalLM.from_pretrained(
        str(source.model_dir), config=config, local_files_only=True, use_safetensors=True, dtype=dt
    )
    model.to(dev).eval()
    if dev.type == "cpu":
        _realign(model)
    tok, tok_name = load_tokenizer(source, tokenizer, config.max_position_embeddings)
    if tok is None and require_tokenizer:
        raise ValueError(
            f"{source.model_dir}: no tokenizer found (no tokenizer.json, no 'tokenizer' in {TRAIN_META}); "
            "pass --tokenizer byte|gpt2"
        )
    if tok is not None and len(tok) > config.vocab_size:
        raise ValueError(
            f"tokenizer {tok_name or 'tokenizer.json'} has {len(tok)} tokens but the model's vocab_size is "
            f"{config.vocab_size}: they do not belong together"
        )
    return LoadedModel(model, tok, source, tok_name)


@torch.no_grad()
def _realign(model) -> None:
    """Copy tensors that live in the memory-mapped safetensors file into fresh allocations.

    Weights read from the file sit at arbitrary byte offsets; CPU kernels pick different vector paths for
    unaligned data and round differently (~1e-7), so a loaded model would not reproduce the saved one's
    logits bit for bit. Fresh allocations are 64-byte aligned. Tied weights stay tied (one Parameter).
    """
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() % 64:
            t.data = t.data.clone()


def quiet_transformers() -> None:
    """For command-line use: no per-file loading bars and only transformers' errors on stderr."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
