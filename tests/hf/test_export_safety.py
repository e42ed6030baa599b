"""`ddl export`: checksums.json in every export, and --overwrite that replaces only an earlier export (its
ddl_export.json lists what it wrote): a user's files, folders or a regular file at OUT_DIR are never deleted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_helpers import cli_error, hf_dir, make_run
from safetensors.torch import load_file

from deep_delta.cli.main import main
from deep_delta.fsutil import CHECKSUMS, IntegrityError
from deep_delta.hf import export_model, load_model


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # inside the last tensor: still a valid safetensors file
    path.write_bytes(bytes(data))


def test_export_writes_checksums_and_a_bit_flip_is_refused(tmp_path, capsys):
    run, _ = make_run(tmp_path / "run")
    out = export_model(run, tmp_path / "hf")
    listed = json.loads((out / CHECKSUMS).read_text())["files"]
    assert set(listed) == {"model.safetensors"}
    load_model(out)
    _flip_last_byte(out / "model.safetensors")
    load_file(str(out / "model.safetensors"))  # the flip leaves a readable file: only the checksum sees it
    with pytest.raises(IntegrityError, match="model.safetensors does not match its SHA-256"):
        load_model(out)
    cli_error(capsys, ["generate", "--model", str(out), "--prompt", "x"], str(out / "model.safetensors"), "SHA-256")
    cli_error(capsys, ["export", "--model", str(out), "--out", str(tmp_path / "again")], str(out / "model.safetensors"), "SHA-256")
    assert not (tmp_path / "again").exists()


def test_overwrite_never_deletes_what_export_did_not_write(tmp_path, capsys):
    run, _ = make_run(tmp_path / "run")
    out = tmp_path / "out"
    # a user's directory
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "data.bin").write_text("mine too")
    cli_error(capsys, ["export", "--model", str(run), "--out", str(out), "--overwrite"], str(out), "ddl_export.json")
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub" / "data.bin").read_text() == "mine too"
    # a regular file
    f = tmp_path / "file.txt"
    f.write_text("keep")
    cli_error(capsys, ["export", "--model", str(run), "--out", str(f), "--overwrite"], str(f), "not a directory")
    assert f.read_text() == "keep"


def test_overwrite_replaces_an_earlier_export_but_not_files_added_to_it(tmp_path, capsys):
    run, _ = make_run(tmp_path / "run")
    out = tmp_path / "out"
    assert main(["export", "--model", str(run), "--out", str(out)]) == 0
    marker = json.loads((out / "ddl_export.json").read_text())
    assert marker["written_by"] == "ddl export"
    assert set(marker["files"]) == {p.name for p in out.iterdir()}
    capsys.readouterr()
    cli_error(capsys, ["export", "--model", str(run), "--out", str(out)], "--overwrite")  # without --overwrite: refused
    assert main(["export", "--model", str(run), "--out", str(out), "--overwrite"]) == 0  # our own export: replaced
    (out / "notes.txt").write_text("added by the user")
    capsys.readouterr()
    cli_error(capsys, ["export", "--model", str(run), "--out", str(out), "--overwrite"], "notes.txt")
    assert (out / "notes.txt").read_text() == "added by the user"
    (out / "notes.txt").unlink()
    (out / "extra").mkdir()
    cli_error(capsys, ["export", "--model", str(run), "--out", str(out), "--overwrite"], "extra")
    assert (out / "extra").is_dir()
    (out / "extra").rmdir()
    (out / "README.md").unlink()  # a file of ours missing is fine
    assert main(["export", "--model", str(run), "--out", str(out), "--overwrite"]) == 0
    assert (out / "README.md").is_file() and not list(tmp_path.glob(".out.*"))


def test_a_forged_or_broken_marker_does_not_license_overwrite(tmp_path, capsys):
    run, _ = make_run(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "ddl_export.json").write_text("{broken")
    cli_error(capsys, ["export", "--model", str(run), "--out", str(out), "--overwrite"], "ddl_export.json")
    (out / "ddl_export.json").write_text(json.dumps({"step": 7}))  # an old marker: no written_by, no file list
    cli_error(capsys, ["export", "--model", str(run), "--out", str(out), "--overwrite"], "ddl_export.json")
    assert (out / "notes.txt").read_text() == "mine"


def test_export_of_an_hf_dir_writes_the_marker_and_an_empty_out_dir_is_fine(tmp_path):
    src = hf_dir(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    export_model(src, out)
    marker = json.loads((out / "ddl_export.json").read_text())
    assert marker["written_by"] == "ddl export" and "step" not in marker
    export_model(src, out, overwrite=True)


@pytest.mark.parametrize(("argv", "missing"), [(["--model", "RUN"], "--out"), (["--out", "B"], "--model"),
                                               (["RUN", "A"], "--model, --out")])  # no positional form
def test_export_takes_model_and_out_as_flags_only(tmp_path, capsys, argv, missing):
    argv = [str(tmp_path / a) if a.isupper() else a for a in argv]
    with pytest.raises(SystemExit) as e:
        main(["export", *argv])
    assert e.value.code == 2 and f"the following arguments are required: {missing}" in capsys.readouterr().err
    assert not (tmp_path / "A").exists() and not (tmp_path / "B").exists()
