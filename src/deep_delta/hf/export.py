"""Export a trained model (checkpoint or run) as a clean Hugging Face directory.

The directory holds config.json, model.safetensors, generation_config.json, the tokenizer
(tokenizer.json + tokenizer_config.json), a short model card (README.md), checksums.json (the SHA-256 of the
weights, verified whenever the directory is loaded) and ddl_export.json, the marker that says ``ddl export``
wrote the directory and which files it wrote: ``--overwrite`` replaces only such a directory. It loads with
``AutoModelForCausalLM.from_pretrained(dir)`` after ``import deep_delta`` and
``AutoTokenizer.from_pretrained(dir)`` (no import needed).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from deep_delta.fsutil import (
    fsync_dir,
    fsync_file,
    refuse_replaced_dir,
    remove_stale,
    staging_dir,
    swap_in,
    write_checksums,
)
from deep_delta.hf.loading import LoadedModel, load_model, resolve_model_dir
from deep_delta.models.utils import count_parameters

MARKER = "ddl_export.json"
WRITTEN_BY = "ddl export"




def model_card(loaded: LoadedModel) -> str:
    """A short README.md for an exported model: what it is, how it was trained, how to load it."""
    from deep_delta.variants import paper_name

    cfg = loaded.model.config
    meta = loaded.source.train_meta
    variant = cfg.variant or "custom"
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [deep-delta-learning, ddl]",
        "---",
        "",
        f"# {paper_name(variant)} ({variant}, preset {cfg.preset or 'custom'})",
        "",
        # the design's own line for this model (a design's `about` is the design's, e.g. the additive design's is the
        # baseline's, not Peri-LN's)
        f"A decoder-only language model whose residual is {cfg.design.describe(cfg)}. Exported by `ddl export` from "
        "the `deep-delta-learning` package (Deep Delta Learning, arXiv:2601.00417, and the designs it is compared "
        "with).",
        "",
        "| field | value |",
        "| --- | --- |",
        f"| parameters | {count_parameters(loaded.model):,} |",
        f"| layers x width x heads | {cfg.num_hidden_layers} x {cfg.hidden_size} x {cfg.num_attention_heads} |",
        f"| residual design | {cfg.design.name} |",
        f"| embedding norm | {'yes (an RMSNorm on the embedding before the first sublayer)' if cfg.embed_norm else 'no'} |",
        f"| context | {cfg.max_position_embeddings} tokens |",
        f"| vocab | {cfg.vocab_size} (tokenizer: {loaded.tokenizer_name or 'see tokenizer.json'}) |",
    ]
    for key in ("step", "tokens", "data_dir"):
        if key in meta:
            lines.append(f"| training {key} | {meta[key]} |")
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "import deep_delta  # registers model_type 'deep_delta' with the Auto classes",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'tok = AutoTokenizer.from_pretrained("PATH")',
        'model = AutoModelForCausalLM.from_pretrained("PATH")',
        'ids = tok("The", return_tensors="pt").input_ids',
        "print(tok.decode(model.generate(ids, max_new_tokens=32)[0]))",
        "```",
        "",
        "or `ddl generate --model PATH --prompt \"The\"`.",
        "",
    ]
    return "\n".join(lines)


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` that export may not (re)place: with ``overwrite``, only a directory that an earlier
    export wrote and that holds nothing else (its :data:`MARKER` lists the files) is replaced; an empty
    directory is always fine."""
    if out.is_symlink():
        raise ValueError(f"`out_dir` {out} is a symbolic link; give the directory it points to, or another "
                         "`out_dir`")
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"`out_dir` {out} exists and is not a directory; `overwrite` only replaces a directory "
                         "that ddl export wrote: remove the file or choose another `out_dir`")
    entries = sorted(out.iterdir())
    if not entries:
        return
    if not overwrite:
        raise ValueError(f"`out_dir` {out} exists and is not empty; set `overwrite` to replace it")
    why = _not_ours(out / MARKER, entries)
    if why:
        raise ValueError(f"`out_dir` {out} was not written by ddl export ({why}); `overwrite` only replaces an "
                         "earlier export: move your files out of it, or choose another `out_dir`")


def _not_ours(marker: Path, entries: list[Path]) -> str | None:
    """Why the directory holding ``entries`` is not an export of ours, None when it is one."""
    if not marker.is_file() or marker.is_symlink():
        return f"it has no {MARKER}"
    try:
        record = json.loads(marker.read_bytes())
    except ValueError:
        return f"its {MARKER} is not valid JSON"
    if not isinstance(record, dict) or record.get("written_by") != WRITTEN_BY:
        return f"its {MARKER} does not say written_by {WRITTEN_BY!r}"
    files = record.get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return f"its {MARKER} has no list of the files export wrote"
    foreign = [p.name for p in entries if p.name not in files or p.is_symlink() or not p.is_file()]
    if foreign:
        more = f", ... ({len(foreign)} in all)" if len(foreign) > 3 else ""
        return f"it holds {', '.join(foreign[:3])}{more}, which export did not write"
    return None


def export_model(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    tokenizer: str | None = None,
    dtype: str | torch.dtype | None = "float32",
    overwrite: bool = False,
) -> Path:
    """Write the model at ``src`` (HF dir, checkpoint or run dir) to ``out_dir`` as a clean HF directory.

    The directory is built beside ``out_dir`` and renamed into place, so a failure leaves no half export.
    An existing non-empty ``out_dir`` is refused unless ``overwrite``, and even then unless it is an earlier
    export holding only what export wrote (see :func:`check_out_dir`): nothing else is ever deleted.
    """
    from transformers import GenerationConfig

    out = Path(out_dir)
    source = resolve_model_dir(src)  # cheap checks first: nothing is loaded for a refused export
    o = out.resolve()
    for s in (source.model_dir.resolve(), Path(src).resolve()):
        if s == o or o in s.parents:  # replacing OUT_DIR would delete the source
            raise ValueError(f"`out_dir` {out} is or contains the source model {src}; choose another directory")
    refuse_replaced_dir(out, "out_dir", itself=False)  # an export inside a run's checkpoints is rotated away
    check_out_dir(out, overwrite)
    loaded = load_model(src, device="cpu", dtype=dtype, tokenizer=tokenizer, require_tokenizer=True)
    model, tok = loaded.model, loaded.tokenizer
    eot = tok.eos_token_id
    model.config.bos_token_id = model.config.eos_token_id = model.config.pad_token_id = eot
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
    remove_stale(out)  # what a killed export left beside OUT_DIR
    tmp = staging_dir(out)
    try:
        _write_export(tmp, loaded)
        check_out_dir(out, overwrite)  # again: OUT_DIR may have changed while the model loaded
        swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_export(tmp: Path, loaded: LoadedModel) -> None:
    """Everything an export holds, written into ``tmp`` and fsynced: weights, config, tokenizer, model card,
    checksums.json and the marker listing the files."""
    from deep_delta import __version__

    model, tok = loaded.model, loaded.tokenizer
    model.save_pretrained(str(tmp))
    tok.model_max_length = model.config.max_position_embeddings
    tok.save_pretrained(str(tmp))
    (tmp / "README.md").write_text(model_card(loaded))
    write_checksums(tmp)
    summary = {k: loaded.source.train_meta[k] for k in ("step", "variant", "preset", "tokenizer")
               if k in loaded.source.train_meta}
    files = sorted({p.name for p in tmp.iterdir()} | {MARKER})
    record = {"written_by": WRITTEN_BY, "version": __version__, "source": str(loaded.source.model_dir),
              **summary, "files": files}
    (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    for f in tmp.iterdir():
        fsync_file(f)
    fsync_dir(tmp)

