"""Find and load a model for inference: an HF directory, a training checkpoint, or a training run.

Every inference command (``ddl generate``, ``ddl eval``, ``ddl export``) goes through :func:`load_model`.

A model directory is data, never code. config.json is read as JSON and must say ``model_type: deep_delta``
before anything else happens; its ``auto_map`` is ignored, no Python file in the directory is imported and every
Auto class is called with ``trust_remote_code=False``. Weights are read from safetensors only: pickled files
(``.bin``, ``.pt``, ``.pth``), also as shards of an index, are refused without being opened. Before any weight is
read, the files are checked against the directory's checksums.json (when it has one), and the tensors must match
the model config.json describes name for name and shape for shape: nothing is left randomly initialised.
Every refusal is a ``ValueError`` (or ``FileNotFoundError``, or :class:`deep_delta.fsutil.IntegrityError`) with a
one-line message naming the file and the cause.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from deep_delta.models.ddl.weights import (  # noqa: F401 (re-exported: the loader's public pieces)
    CONFIG,
    ONLY_SAFETENSORS,
    PICKLE_SUFFIXES,
    WEIGHTS,
    WEIGHTS_INDEX,
    load_ddl_model,
    load_weights,
    read_config,
    weight_files,
)
from deep_delta.models.ddl.weights import one_line as _one_line
from deep_delta.models.ddl.weights import read_json as _read_json
from deep_delta.runtime import resolve_device, resolve_dtype

TRAIN_META = "train_meta.json"
LATEST = "LATEST"


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
        if p.suffix in PICKLE_SUFFIXES:
            raise _not_a_model(p, f"{p.name} is a pickled weight file: {ONLY_SAFETENSORS}")
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
    pickles = sorted(q.name for q in p.iterdir() if q.suffix in PICKLE_SUFFIXES)
    if pickles and (p / CONFIG).is_file():
        raise _not_a_model(p, f"found {pickles[0]}: {ONLY_SAFETENSORS} (save with model.save_pretrained(dir), "
                              f"which writes {WEIGHTS})")
    if (p / CONFIG).is_file():
        raise _not_a_model(p, f"{CONFIG} is there but {WEIGHTS} is missing")
    raise _not_a_model(p)


# What a caller that can choose another tokenizer is told when the saved one cannot be used.
CHOOSE_TOKENIZER = "set `tokenizer` to byte or gpt2 to use a built-in tokenizer"


def load_tokenizer(source: ModelSource, name: str | None = None, model_max_length: int | None = None,
                   config=None, hint: str = CHOOSE_TOKENIZER):
    """The tokenizer for ``source``: ``name`` if given, else the saved tokenizer.json, else the training
    tokenizer named in train_meta.json. Returns (tokenizer or None, name or None).

    ``config``: the model's DDLConfig, handed to AutoTokenizer so that it does not read config.json itself.
    ``hint``: what the error says to do when the saved tokenizer cannot be used."""
    if name is not None:
        return _build(name, model_max_length), name
    if (source.model_dir / "tokenizer.json").is_file():
        return _saved_tokenizer(source.model_dir, config, hint), source.train_meta.get("tokenizer")
    meta_name = source.train_meta.get("tokenizer")
    if meta_name is not None:
        return _build(meta_name, model_max_length), meta_name
    return None, None


def _saved_tokenizer(model_dir: Path, config=None, hint: str = CHOOSE_TOKENIZER):
    """The tokenizer saved in ``model_dir``; a tokenizer class named in its auto_map is never imported."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), config=config, local_files_only=True,
                                             trust_remote_code=False)
    except (MemoryError, PermissionError):
        raise
    except Exception as e:  # tokenizers' parse errors are plain Exceptions; transformers' are several kinds
        tcfg = model_dir / "tokenizer_config.json"
        try:
            custom = tcfg.is_file() and "auto_map" in _read_json(tcfg)
        except ValueError:
            custom = False
        if custom:
            raise ValueError(
                f"{tcfg}: the tokenizer class is custom code named in auto_map, and code from a model directory is "
                f"never run; {hint}"
            ) from None
        why = _one_line(e)
        why = why if len(why) <= 300 else why[:300] + " ..."
        raise ValueError(
            f"{model_dir / 'tokenizer.json'}: the tokenizer saved with the model does not load ({type(e).__name__}: "
            f"{why}); {hint}"
        ) from None


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
    known tokenizer is an error naming how to provide one. Without it (a command that reads token ids only, and has
    no tokenizer option), a saved tokenizer that cannot be used is a warning saying so, and ``tokenizer`` is None.
    """
    source = resolve_model_dir(path)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    model = load_ddl_model(source.model_dir, dtype=dt)
    model.to(dev)
    config = model.config
    if require_tokenizer or tokenizer is not None:
        tok, tok_name = load_tokenizer(source, tokenizer, config.max_position_embeddings, config)
    else:
        try:
            tok, tok_name = load_tokenizer(source, None, config.max_position_embeddings, config,
                                           hint="this command reads token ids only, so it goes on without it")
        except ValueError as e:
            warnings.warn(str(e), stacklevel=2)
            tok, tok_name = None, source.train_meta.get("tokenizer")
    if tok is None and require_tokenizer:
        raise ValueError(
            f"{source.model_dir}: no tokenizer found (no tokenizer.json, no 'tokenizer' in {TRAIN_META}); "
            "set `tokenizer` to byte or gpt2"
        )
    if tok is not None and len(tok) > config.vocab_size:
        raise ValueError(
            f"tokenizer {tok_name or 'tokenizer.json'} has {len(tok)} tokens but the model's vocab_size is "
            f"{config.vocab_size}: they do not belong together"
        )
    return LoadedModel(model, tok, source, tok_name)


def quiet_transformers() -> None:
    """For command-line use: no per-file loading bars and only transformers' errors on stderr."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
