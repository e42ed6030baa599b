"""Export a trained model (checkpoint or run) as a clean Hugging Face directory.

The directory holds config.json, model.safetensors, generation_config.json, the tokenizer
(tokenizer.json + tokenizer_config.json) and a short model card (README.md). It loads with
``AutoModelForCausalLM.from_pretrained(dir)`` after ``import deep_delta`` and
``AutoTokenizer.from_pretrained(dir)`` (no import needed).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from deep_delta.hf.loading import LoadedModel, load_model, resolve_model_dir


def _param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def model_card(loaded: LoadedModel) -> str:
    """A short README.md for an exported model: what it is, how it was trained, how to load it."""
    from deep_delta.models.ddl.configuration_ddl import PAPER_NAMES

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
        f"# {PAPER_NAMES.get(variant, variant)} ({variant}, preset {cfg.preset or 'custom'})",
        "",
        "A decoder-only language model with the Deep Delta Learning residual (arXiv:2601.00417), exported by "
        "`ddl export` from the `deep-delta-learning` package.",
        "",
        "| field | value |",
        "| --- | --- |",
        f"| parameters | {_param_count(loaded.model):,} |",
        f"| layers x width x heads | {cfg.num_hidden_layers} x {cfg.hidden_size} x {cfg.num_attention_heads} |",
        f"| residual | {cfg.residual} (d_v = {cfg.value_channels}, compressor {cfg.compressor}, "
        f"state init {cfg.state_init}) |",
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
    An existing non-empty ``out_dir`` is refused unless ``overwrite``.
    """
    from transformers import GenerationConfig

    out = Path(out_dir)
    source = resolve_model_dir(src)  # cheap checks first: nothing is loaded for a refused export
    o = out.resolve()
    for s in (source.model_dir.resolve(), Path(src).resolve()):
        if s == o or o in s.parents:  # replacing OUT_DIR would delete the source
            raise ValueError(f"OUT_DIR {out} is or contains the source model {src}; choose another directory")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ValueError(f"OUT_DIR {out} exists and is not empty; pass --overwrite to replace it")
    loaded = load_model(src, device="cpu", dtype=dtype, tokenizer=tokenizer, require_tokenizer=True)
    model, tok = loaded.model, loaded.tokenizer
    eot = tok.eos_token_id
    model.config.bos_token_id = model.config.eos_token_id = model.config.pad_token_id = eot
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(str(tmp))
        tok.model_max_length = model.config.max_position_embeddings
        tok.save_pretrained(str(tmp))
        (tmp / "README.md").write_text(model_card(loaded))
        if loaded.source.train_meta:
            summary = {k: loaded.source.train_meta[k] for k in ("step", "variant", "preset", "tokenizer")
                       if k in loaded.source.train_meta}
            (tmp / "ddl_export.json").write_text(json.dumps({"source": str(loaded.source.model_dir), **summary},
                                                            indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
