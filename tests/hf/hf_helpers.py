"""Training-run and model directories for the Hugging Face tests (everything in tmp_path, offline).

A module with its own name (not conftest) so tests import it without clashing with other test folders."""

from __future__ import annotations

from pathlib import Path

from deep_delta import DDLForCausalLM
from helpers import tiny_model


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
