"""Read a saved DDLForCausalLM as data: config.json as JSON, weights from safetensors only.

The one safe loader of model weights, used by every inference command (through :mod:`deep_delta.hf.loading`)
and by the trainer's resume. config.json must say ``model_type: deep_delta`` before anything else happens; its
``auto_map`` is dropped and no Auto class is called. Pickled files (``.bin``, ``.pt``, ``.pth``), also as shards
of an index, are refused without being opened. The files are checked against the directory's checksums.json
(when it has one) before any weight is interpreted, and the tensors must match the model config.json describes
name for name and shape for shape: nothing is left randomly initialised. Every refusal is a ``ValueError``
(or ``FileNotFoundError``, or :class:`deep_delta.fsutil.IntegrityError`) naming the file and the cause.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle")
ONLY_SAFETENSORS = "pickled weights are never loaded; only safetensors is accepted"


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; anything else (not UTF-8, not JSON, not an object) is a ValueError naming it."""
    try:
        data = json.loads(path.read_bytes())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object (got {type(data).__name__})")
    return data


def one_line(error: BaseException) -> str:
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__


def read_config(model_dir: str | os.PathLike):
    """The :class:`DDLConfig` in ``model_dir/config.json``, read as JSON: no Auto class, no code from the directory.

    A model_type other than "deep_delta" is refused before anything else is looked at; ``auto_map`` (which names
    Python files to import) is dropped. A bad field is a ValueError naming the file and the field.
    """
    from huggingface_hub.errors import StrictDataclassError

    from deep_delta.models.ddl.configuration_ddl import DDLConfig

    path = Path(model_dir) / CONFIG
    data = read_json(path)
    model_type = data.get("model_type")
    if model_type != DDLConfig.model_type:
        raise ValueError(
            f"{path}: model_type {model_type!r}; only {DDLConfig.model_type} models are loaded (code a model "
            "directory names in auto_map is never run)"
        )
    fields = {k: v for k, v in data.items() if k not in ("auto_map", "custom_pipelines")}
    for key in ("dtype", "torch_dtype"):  # transformers would look the name up in torch: say which field it was
        value = fields.get(key)
        if value is not None and not (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)):
            raise ValueError(f"{path}: \"{key}\" got {value!r}; allowed: null or a torch dtype name such as float32")
    try:
        return DDLConfig.from_dict(fields)
    except (ValueError, TypeError, KeyError, AttributeError, StrictDataclassError) as e:
        raise ValueError(f"{path}: {one_line(e)}") from None


def weight_files(model_dir: str | os.PathLike) -> list[Path]:
    """The safetensors files of ``model_dir``: model.safetensors, or the shards model.safetensors.index.json
    names. A shard that is not a ``.safetensors`` file beside the index is refused without being opened."""
    d = Path(model_dir)
    if (d / WEIGHTS).is_file():
        return [d / WEIGHTS]
    index = d / WEIGHTS_INDEX
    if not index.is_file():
        raise FileNotFoundError(f"{d}: no {WEIGHTS} (nor {WEIGHTS_INDEX})")
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index}: expected a \"weight_map\" object from tensor names to .safetensors file names")
    shards = sorted(set(weight_map.values()))
    for name in shards:
        if not name.endswith(".safetensors"):
            raise ValueError(f"{index}: weight_map names {name}: {ONLY_SAFETENSORS}")
        if Path(name).name != name or name.startswith("."):
            raise ValueError(f"{index}: weight_map names {name}, which is not a file beside the index; shards "
                             f"must sit in {d}")
        if not (d / name).is_file():
            raise FileNotFoundError(f"{index}: weight_map names {name}, which is missing from {d}")
    return [d / name for name in shards]


def _headers(files: list[Path]) -> dict[str, tuple[Path, list[int]]]:
    """name -> (file, shape) of every tensor in ``files``, from the safetensors headers (no tensor is read)."""
    from safetensors import SafetensorError, safe_open

    found: dict[str, tuple[Path, list[int]]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as sf:
                shapes = {k: list(sf.get_slice(k).get_shape()) for k in sf.keys()}
        except SafetensorError as e:
            raise ValueError(f"{f} is not a valid safetensors file ({one_line(e)})") from None
        for k, shape in shapes.items():
            if k in found:
                raise ValueError(f"{f}: tensor {k} is also in {found[k][0]}")
            found[k] = (f, shape)
    return found


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names)} in all)" if len(names) > n else "")


def _parameter_groups(model) -> list[list[str]]:
    """The names of each tensor of ``model``'s state dict; tied weights (one tensor, two names) share a group."""
    groups: dict[int, list[str]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), []).append(name)
    return list(groups.values())


def _check_match(model, found: dict[str, tuple[Path, list[int]]], label: Path, config_path: Path) -> dict[str, str]:
    """Which file name each tensor of ``model`` loads from; a ValueError unless the files hold exactly the
    model's tensors with the model's shapes."""
    state = model.state_dict()
    chosen: dict[str, str] = {}
    missing: list[str] = []
    for group in _parameter_groups(model):
        present = [n for n in group if n in found]
        if present:
            chosen[group[0]] = present[0]
        else:
            missing.append(group[0])
    known = {n for group in _parameter_groups(model) for n in group}
    unexpected = sorted(set(found) - known)
    problems = []
    if missing:
        problems.append(f"weights missing for {len(missing)} tensor(s) of the model {config_path.name} describes "
                        f"({_few(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} tensor(s) the model {config_path.name} describes has no place for "
                        f"({_few(unexpected)})")
    if problems:
        raise ValueError(f"{label}: {'; '.join(problems)}: the weights do not belong to {config_path}")
    for name, key in chosen.items():
        f, shape = found[key]
        if shape != list(state[name].shape):
            raise ValueError(f"{f}: {key} has shape {shape} but {config_path} makes it {list(state[name].shape)}: "
                             "the weights do not belong to this config")
    return chosen


def _empty_model(config, device: str | torch.device = "cpu"):
    """``DDLForCausalLM(config)`` with its tensors allocated but not initialised (they are loaded next)."""
    import contextlib

    from deep_delta.models.ddl.modeling_ddl import DDLForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - another transformers layout: initialise, then overwrite
        no_init_weights = contextlib.nullcontext
    with torch.device(device), no_init_weights():
        model = DDLForCausalLM(config)
    model.tie_weights()  # no_init_weights skips the tying post_init would do
    return model


def _checked_files(d: Path, verify: bool) -> dict[str, tuple[Path, list[int]]]:
    """The tensors of ``d``'s weight files (name -> (file, shape)), after the checksum check."""
    from deep_delta.fsutil import verify_checksums

    files = weight_files(d)
    if verify:
        verify_checksums(d)  # before any byte of the weights is interpreted
    return _headers(files)


def _label(d: Path, found: dict[str, tuple[Path, list[int]]]) -> Path:
    files = {f for f, _ in found.values()}
    return next(iter(files)) if len(files) == 1 else d / WEIGHTS_INDEX


@torch.no_grad()
def _copy(model, found: dict[str, tuple[Path, list[int]]], chosen: dict[str, str]) -> None:
    from safetensors import SafetensorError, safe_open

    state = model.state_dict(keep_vars=True)
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for name, key in chosen.items():
        by_file.setdefault(found[key][0], []).append((name, key))
    for f, pairs in by_file.items():
        try:
            with safe_open(str(f), framework="pt") as sf:
                for name, key in pairs:
                    state[name].copy_(sf.get_tensor(key))
        except SafetensorError as e:
            raise ValueError(f"{f} is not a valid safetensors file ({one_line(e)})") from None


def load_weights(model, model_dir: str | os.PathLike, *, verify: bool = True) -> None:
    """Fill ``model`` (a DDLForCausalLM) with the weights saved in ``model_dir``, safely.

    Safetensors only (:func:`weight_files`); with ``verify`` the files are first checked against
    ``model_dir/checksums.json`` (:func:`deep_delta.fsutil.verify_checksums`; none there: nothing to check).
    The files must hold exactly the model's tensors with its shapes (a ValueError naming the file and a few
    names otherwise); tied weights stay tied. The trainer's resume can call this on a model built from the
    checkpoint's config (or use :func:`load_ddl_model`) instead of ``from_pretrained``.
    """
    d = Path(model_dir)
    found = _checked_files(d, verify)
    _copy(model, found, _check_match(model, found, _label(d, found), d / CONFIG))


def load_ddl_model(model_dir: str | os.PathLike, *, dtype: torch.dtype = torch.float32, verify: bool = True):
    """The DDLForCausalLM saved in ``model_dir`` (config.json + safetensors weights), on the CPU in eval mode,
    without any Auto class: :func:`read_config`, the checksums, names and shapes checked against a model on the
    meta device (a forged config allocates nothing), then the weights copied into a model of its own."""
    d = Path(model_dir)
    config = read_config(d)
    found = _checked_files(d, verify)
    _check_match(_empty_model(config, "meta"), found, _label(d, found), d / CONFIG)
    model = _empty_model(config)
    _copy(model, found, _check_match(model, found, _label(d, found), d / CONFIG))
    model.to(dtype).eval()
    model.config.dtype = dtype  # what the model now holds, as from_pretrained records it (save_pretrained writes it)
    return model
