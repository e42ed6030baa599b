"""Atomic training checkpoints: a Hugging Face model directory plus the training state.

Layout of ``OUT/checkpoints/``::

    step_0001000/            one complete checkpoint
        config.json              \\ model.save_pretrained(..., safe_serialization=True):
        model.safetensors        /  DDLForCausalLM.from_pretrained(step_dir) loads it directly
        train_state.safetensors  \\ optimizer, scheduler, step, data position, RNG states: the tensors, and
        train_state.json         /  the structure around them (no pickle anywhere)
        train_meta.json          step, variant, preset, tokenizer, data dir, train config
        checksums.json           SHA-256 and size of both .safetensors files, verified at load
    LATEST                       the name of the newest complete checkpoint

A checkpoint is built in ``checkpoints/.tmp-step_...``, every file fsynced, then renamed to its final name;
only then is ``LATEST`` replaced (temporary file + ``os.replace``). A crash at any point leaves ``LATEST``
naming the previous complete checkpoint; the temporary files it may leave are removed by
:func:`clean_stale` when the next process takes the run's lock (:func:`run_lock`).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from deep_delta.fsutil import (
    CHECKSUMS,
    DirectoryLockedError,
    IntegrityError,
    as_os_error,
    dir_lock,
    fsync_dir,
    fsync_file,
    swap_in,
    verify_checksums,
    write_checksums,
)
from deep_delta.fsutil import atomic_write as write_text_atomic

CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
STATE_TENSORS = "train_state.safetensors"
STATE_TREE = "train_state.json"
META_FILE = "train_meta.json"
REQUIRED = ("config.json", "model.safetensors", STATE_TENSORS, STATE_TREE, META_FILE, CHECKSUMS)
LOCK_FILE = ".lock"
_STEP_DIR = re.compile(r"step_(\d{7,})")
# What a checkpoint directory holds besides REQUIRED: what save_pretrained may add (the generation config, the
# weights in shards with their index)
_CHECKPOINT_EXTRAS = re.compile(r"generation_config\.json|model(-\d+-of-\d+)?\.safetensors(\.index\.json)?")
# The most bytes LATEST holds: a checkpoint's name and a newline
_LATEST_LIMIT = 64


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: incomplete, corrupt, pickled, or of another run."""


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


# ---------------------------------------------------------------------- training state without pickle
def _encode(obj: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """``obj`` as JSON, each tensor replaced by a reference into ``tensors``."""
    if isinstance(obj, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = obj.detach().to("cpu", copy=True).contiguous()  # own storage: safetensors refuses sharing
        return {"__tensor__": key}
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, float, str)):
        return obj
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors, f"{where}.{k}") for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, where), _encode(v, tensors, f"{where}[{k!r}]")]
                              for k, v in obj.items()]}
    raise TypeError(f"training state: {where} is a {type(obj).__name__}; allowed: tensors, dicts, lists, tuples, "
                    "numbers, strings, None")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save_state(directory: str | os.PathLike, state: dict[str, Any]) -> None:
    """Write ``state`` as ``train_state.safetensors`` (its tensors) + ``train_state.json`` (the rest)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors, "state")
    save_file(tensors, str(directory / STATE_TENSORS))
    (directory / STATE_TREE).write_text(json.dumps(tree))


def load_state(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read what :func:`save_state` wrote; nothing is unpickled."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    try:
        tensors = load_file(str(directory / STATE_TENSORS), device=str(map_location))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{directory / STATE_TENSORS} is not a readable safetensors file ({e})") from None
    try:
        return _decode(json.loads((directory / STATE_TREE).read_text()), tensors)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{directory / STATE_TREE} is not a valid training-state file ({e!r})") from None


# ---------------------------------------------------------------------- one process per run directory
RunLockedError = DirectoryLockedError  # another process holds the run directory's lock


def run_lock(out_dir: str | os.PathLike, what: str = "ddl train"):
    """Hold the run directory's lock, ``OUT/.lock``, for the duration (:func:`deep_delta.fsutil.dir_lock`): one
    process writes a run directory; a second is refused naming the first one's pid."""
    return dir_lock(out_dir, what, name=LOCK_FILE,
                    busy="two processes writing one run directory would lose each other's steps. Wait for it to "
                         "finish (or stop it), or choose another output directory")


def is_checkpoint_dir(path: Path) -> bool:
    """Whether ``path`` is a checkpoint directory as :func:`save_checkpoint` writes it: a real directory named
    ``step_N`` holding the checkpoint's files and nothing else (a user's file or an export put there is not one)."""
    if path.is_symlink() or not path.is_dir() or not _STEP_DIR.fullmatch(path.name):
        return False
    names = [p.name for p in path.iterdir()]
    return META_FILE in names and all(
        (n in REQUIRED or _CHECKPOINT_EXTRAS.fullmatch(n)) and (path / n).is_file() and not (path / n).is_symlink()
        for n in names)


def foreign_entries(out_dir: str | os.PathLike) -> list[Path]:
    """What ``OUT/checkpoints`` holds that training did not write: anything but complete checkpoints
    (:func:`is_checkpoint_dir`), ``LATEST`` and the temporary files of a killed writer. Training rotates and
    ``overwrite`` removes that directory, so what is listed here would be lost with it."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    ours = (lambda p: (p.name == LATEST and p.is_file() and not p.is_symlink()) or p.name.startswith(".tmp-")
            or (p.name.startswith(f".{LATEST}.") and p.name.endswith(".tmp")) or is_checkpoint_dir(p))
    return sorted(p for p in root.iterdir() if not ours(p))


def clean_stale(out_dir: str | os.PathLike) -> list[Path]:
    """Remove the temporary files a killed writer can leave in ``OUT/checkpoints`` (``.tmp-*`` builds,
    ``.LATEST.*.tmp``). Call only while holding :func:`run_lock`: then no other writer is alive."""
    root = Path(out_dir) / CHECKPOINTS
    removed = [p for p in (*root.glob(".tmp-*"), *root.glob(f".{LATEST}.*.tmp"))] if root.is_dir() else []
    for p in removed:
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return removed



# ---------------------------------------------------------------------- RNG states (weights_only-safe)
def rng_state() -> dict[str, Any]:
    """torch / CUDA / numpy / python RNG states as tensors, lists, numbers and strings."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


# ---------------------------------------------------------------------- finding checkpoints
def checkpoint_dirs(out_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoint directories of a run, oldest first (temporary builds are not listed)."""
    root = Path(out_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The checkpoint directory ``OUT/checkpoints/LATEST`` names, or None when the run has none.

    Raises ``FileNotFoundError`` if LATEST names a directory that is missing or incomplete.
    """
    root = Path(out_dir) / CHECKPOINTS
    latest = root / LATEST
    if latest.is_symlink():  # never written by training: what it points to is not read, nor shown
        raise CheckpointError(f"{latest} is a symbolic link; LATEST is the file `ddl train` writes with the name of "
                              "the newest checkpoint: remove the link (the newest complete checkpoint is named "
                              "again by the next save), or start a new run (`overwrite`)")
    if not latest.is_file():
        return None
    if latest.stat().st_size > _LATEST_LIMIT:
        raise CheckpointError(f"{latest} holds {latest.stat().st_size:,} bytes, not a checkpoint's name (at most "
                              f"{_LATEST_LIMIT}, like step_0001000); it was not written by `ddl train`")
    name = latest.read_bytes().decode("utf-8", "replace").strip()
    if not _STEP_DIR.fullmatch(name):
        raise CheckpointError(f"{latest} does not hold a checkpoint's name (expected one like step_0001000); it was "
                              "changed after `ddl train` wrote it")
    path = root / name
    _check_complete(path, f"{latest} names {path}, which")
    return path


def _check_complete(path: Path, subject: str) -> None:
    """Refuse a checkpoint that holds a pickle (whatever else it holds: a pickle beside the safetensors state
    was planted or left by an older version, and nothing in the directory is trusted then), or that lacks a
    required file."""
    from deep_delta.models.ddl.weights import PICKLE_SUFFIXES

    missing = [f for f in REQUIRED if not (path / f).is_file()]
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES) if path.is_dir() else []
    if pickles:
        raise CheckpointError(
            f"{path / pickles[0]}: this checkpoint holds a pickle (written by an older version, or planted); "
            f"pickles are never opened, and a checkpoint holding one is refused: training state is only "
            f"{STATE_TENSORS} + {STATE_TREE}. Start a new run (or `overwrite`), or remove the file if you know "
            "where it came from"
        )
    if missing:
        raise FileNotFoundError(f"{subject} lacks {', '.join(missing)}")


# ---------------------------------------------------------------------- writing
def save_checkpoint(
    out_dir: str | os.PathLike,
    step: int,
    *,
    save_model: Callable[[Path], None],
    train_state: dict[str, Any],
    meta: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint ``step`` atomically and return its directory.

    ``save_model(dir)`` writes the HF model files (``model.save_pretrained(dir, safe_serialization=True)``);
    ``train_state`` (tensors, dicts, lists, tuples, numbers, strings only) goes to ``train_state.safetensors`` +
    ``train_state.json`` (:func:`save_state`) and ``meta`` to ``train_meta.json``; ``checksums.json`` records
    the digests of the weight files. Afterwards only the newest ``keep`` checkpoints are kept.
    """
    root = Path(out_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    name = step_dir_name(step)
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_model(tmp)
        save_state(tmp, train_state)
        (tmp / META_FILE).write_text(json.dumps({**meta, "step": step}, indent=2, sort_keys=True))
        write_checksums(tmp)
        for f in tmp.iterdir():
            fsync_file(f)
        fsync_dir(tmp)
        # an older copy of this step is set aside under a .tmp-* name, which clean_stale removes after a kill
        swap_in(tmp, final, aside=root / f".tmp-old-{name}-{os.getpid()}")
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        disk = as_os_error(e, tmp)
        if disk is e:
            raise
        raise disk from e
    write_text_atomic(root / LATEST, name + "\n")
    prune_checkpoints(out_dir, keep)
    return final


def prune_checkpoints(out_dir: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (never the one LATEST names) and stale
    temporary builds."""
    root = Path(out_dir) / CHECKPOINTS
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    dirs = [p for p in checkpoint_dirs(out_dir) if is_checkpoint_dir(p)]  # a user's step_N is not rotated away
    for path in dirs[: max(0, len(dirs) - keep)]:
        if path.name != latest:
            shutil.rmtree(path, ignore_errors=True)
    for path in root.glob(".tmp-*"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------- reading
def load_checkpoint(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint directory: ``{"path", "meta", "state"}`` (the model loads with
    ``DDLForCausalLM.from_pretrained(path)``). The weight files are verified against ``checksums.json``
    first; the state is read from safetensors + JSON (nothing is unpickled)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    _check_complete(path, f"checkpoint {path} is incomplete: it")
    verify_checksums(path)
    try:
        meta = json.loads((path / META_FILE).read_text())
    except ValueError as e:
        raise CheckpointError(f"{path / META_FILE} is not valid JSON ({e})") from None
    return {"path": path, "meta": meta, "state": load_state(path, map_location)}


__all__ = ["CheckpointError", "IntegrityError", "RunLockedError", "clean_stale", "foreign_entries",
           "is_checkpoint_dir", "latest_checkpoint", "load_checkpoint", "run_lock", "save_checkpoint"]
