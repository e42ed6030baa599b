"""Atomic training checkpoints: a Hugging Face model directory plus the training state.

Layout of ``OUT/checkpoints/``::

    step_0001000/            one complete checkpoint
        config.json          \\ model.save_pretrained(..., safe_serialization=True):
        model.safetensors    /  DDLForCausalLM.from_pretrained(step_dir) loads it directly
        train_state.pt       optimizer, scheduler, step, data position, RNG states (torch.load(weights_only=True))
        train_meta.json      step, variant, preset, tokenizer, data dir, train config
    LATEST                   the name of the newest complete checkpoint

A checkpoint is built in ``checkpoints/.tmp-step_...``, every file fsynced, then renamed to its final name;
only then is ``LATEST`` replaced (temporary file + ``os.replace``). A crash at any point leaves ``LATEST``
naming the previous complete checkpoint.
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

from deep_delta.fsutil import atomic_write as write_text_atomic
from deep_delta.fsutil import fsync_dir, fsync_file

CHECKPOINTS = "checkpoints"
LATEST = "LATEST"
STATE_FILE = "train_state.pt"
META_FILE = "train_meta.json"
_STEP_DIR = re.compile(r"step_(\d{7,})")


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"




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
    if not latest.is_file():
        return None
    name = latest.read_text().strip()
    if not _STEP_DIR.fullmatch(name):
        raise ValueError(f"{latest}: expected a checkpoint name like step_0001000, got {name!r}")
    path = root / name
    missing = [f for f in ("config.json", "model.safetensors", STATE_FILE, META_FILE) if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{latest} names {path}, which lacks {', '.join(missing)}")
    return path


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
    ``train_state`` goes to ``train_state.pt`` (tensors, dicts, lists, numbers, strings only) and ``meta`` to
    ``train_meta.json``. Afterwards only the newest ``keep`` checkpoints are kept.
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
        torch.save(train_state, tmp / STATE_FILE)
        (tmp / META_FILE).write_text(json.dumps({**meta, "step": step}, indent=2, sort_keys=True))
        for f in tmp.iterdir():
            fsync_file(f)
        fsync_dir(tmp)
        old = None
        if final.exists():  # an older copy of the same step: set it aside, swap in the new one, then delete it
            old = root / f".tmp-old-{name}-{os.getpid()}"
            os.rename(final, old)
        os.rename(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(root / LATEST, name + "\n")
    prune_checkpoints(out_dir, keep)
    return final


def prune_checkpoints(out_dir: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (never the one LATEST names) and stale
    temporary builds."""
    root = Path(out_dir) / CHECKPOINTS
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
    dirs = checkpoint_dirs(out_dir)
    for path in dirs[: max(0, len(dirs) - keep)]:
        if path.name != latest:
            shutil.rmtree(path, ignore_errors=True)
    for path in root.glob(".tmp-*"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------- reading
def load_checkpoint(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint directory: ``{"path", "meta", "state"}`` (the model loads with
    ``DDLForCausalLM.from_pretrained(path)``). ``state`` is loaded with ``torch.load(weights_only=True)``."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    for f in ("config.json", "model.safetensors", STATE_FILE, META_FILE):
        if not (path / f).is_file():
            raise FileNotFoundError(f"checkpoint {path} is incomplete: {f} is missing")
    meta = json.loads((path / META_FILE).read_text())
    state = torch.load(path / STATE_FILE, map_location=map_location, weights_only=True)
    return {"path": path, "meta": meta, "state": state}
