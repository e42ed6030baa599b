"""Helpers of the data reliability tests: tiny prepared directories and in-process ``ddl`` runs."""

from __future__ import annotations

import json

from deep_delta.cli.main import main
from deep_delta.data import prepare

TEXT = "The delta rule writes a value along a direction. " * 8  # 392 bytes


def one_line_error(capsys, code, argv):
    """Run ``ddl`` in-process; it must exit with ``code`` and print one error line, no traceback."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def prepared(tmp_path, name="data", val_fraction=0.2):
    """``tmp_path/name``: ten documents from ``tmp_path/name.jsonl``, byte tokenizer."""
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i}: {TEXT}"}) + "\n" for i in range(10)))
    out = tmp_path / name
    prepare(src, "byte", out, val_fraction=val_fraction, progress=False)
    return out


def edit_meta(d, **changes):
    meta = json.loads((d / "meta.json").read_text())
    meta.update(changes)
    (d / "meta.json").write_text(json.dumps(meta))
