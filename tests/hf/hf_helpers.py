"""Tiny models and training-run directories for the Hugging Face tests (everything in tmp_path, offline).

A module with its own name (not conftest) so tests import it without clashing with other test folders."""

from __future__ import annotations

from pathlib import Path

import torch

from deep_delta import DDLConfig, DDLForCausalLM

# vocab 320 > 257 byte ids: the byte tokenizer fits; context 64 keeps every forward in milliseconds
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=320, max_position_embeddings=64)


def tiny_model(variant: str, *, perturb: float = 0.1, seed: int = 0, **overrides) -> DDLForCausalLM:
    """A tiny model in eval mode whose weights are moved away from their init.

    At init the token convolutions (EC, TC) are identities and the gates constant, so a cache that lost the
    token history would go unnoticed; the perturbation makes every tap and gate matter.
    """
    torch.manual_seed(seed)
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **{**TINY, **overrides}))
    if perturb:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(perturb * torch.randn(p.shape, generator=g))
    return model.eval()


def make_run(root: Path, variant: str = "ddl-tc", tokenizer: str = "byte", step: int = 7) -> tuple[Path, DDLForCausalLM]:
    """A training-run directory as the trainer writes it (checkpoints/step_*/ + LATEST), via its own saver."""
    from deep_delta.train.checkpoint import save_checkpoint

    model = tiny_model(variant)
    save_checkpoint(root, step, save_model=lambda d: model.save_pretrained(d),
                    train_state={"step": step}, meta={"variant": variant, "preset": "tiny", "tokenizer": tokenizer})
    return root, model


def hf_dir(path: Path, variant: str = "ddl-cc", **overrides) -> Path:
    """A plain HF directory as transformers writes it (no checksums.json, no train_meta.json) + the byte
    tokenizer."""
    from deep_delta.hf import save_tokenizer

    tiny_model(variant, **overrides).save_pretrained(path)
    save_tokenizer("byte", path)
    return path


def cli_error(capsys, argv: list[str], *needles: str, code: int = 2) -> str:
    """``ddl ARGV`` (in-process) fails with ``code`` and one line on stderr that contains every needle, no
    traceback; returns that line."""
    from deep_delta.cli.main import main

    capsys.readouterr()  # what the setup printed (save_pretrained's progress bars)
    got = main(argv)
    err = capsys.readouterr().err
    assert got == code, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith(f"ddl {argv[0]}: error: "), err
    for needle in needles:
        assert needle in err, err
    return err
