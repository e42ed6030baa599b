"""`ddl data prepare --source DIR --text-suffixes ...`: a corpus from any tree of UTF-8 text files (source code,
say), one document per file, in sorted path order; binary files and other suffixes left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deep_delta.cli.main import main
from deep_delta.data import read_meta

FILES = {
    "pkg/a.py": "def f(x):\n    return x + 1\n",
    "pkg/sub/d.py": "# héllo, UTF-8 beyond ASCII\nimport os\n",
    "README.md": "# A tree\nSome prose.\n",
    "notes.txt": "a plain text file\n",
    "pkg/setup.cfg": "[metadata]\nname = left out\n",
}


def _tree(root):
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    (root / "pkg" / "native.so").write_bytes(bytes(range(256)))  # binary, never read
    return root


def _tokens(out):
    """Every token of the train split, in order."""
    from deep_delta.data.shards import open_shard

    return np.concatenate([open_shard(p) for p in sorted(out.glob("train_*.bin"))]).tolist()


def test_a_text_tree_becomes_one_document_per_file(tmp_path, capsys):
    src, out = _tree(tmp_path / "src"), tmp_path / "out"
    assert main(["data", "prepare", "--source", str(src), "--text-suffixes", ".py", ".md", "--out", str(out),
                 "--val-fraction", "0", "--no-progress", "--num-proc", "1"]) == 0
    meta = read_meta(out)
    chosen = sorted(["README.md", "notes.txt", "pkg/a.py", "pkg/sub/d.py"], key=lambda r: str(src / r))
    assert meta["source_files"] == [str(src / r) for r in chosen]
    assert meta["text_suffixes"] == [".py", ".md"] and meta["num_documents"] == 4
    eot = 256
    want = []
    for rel in chosen:
        want += list(FILES[rel].encode("utf-8")) + [eot]
    assert _tokens(out) == want
    # without the suffixes only the .txt file is taken
    assert main(["data", "prepare", "--source", str(src), "--out", str(tmp_path / "txt"), "--val-fraction", "0",
                 "--no-progress", "--num-proc", "1"]) == 0
    assert read_meta(tmp_path / "txt")["num_documents"] == 1


def test_text_tree_errors(tmp_path, capsys):
    src = _tree(tmp_path / "src")
    (src / "pkg" / "latin1.py").write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    assert main(["data", "prepare", "--source", str(src), "--text-suffixes", ".py", "--out", str(tmp_path / "o"),
                 "--no-progress", "--num-proc", "1"]) == 2
    err = capsys.readouterr().err
    assert "latin1.py" in err and "UTF-8" in err and "Traceback" not in err
    for bad, msg in ((["py"], "error: --text-suffixes got 'py'"), ([".jsonl"], "always read as records")):
        assert main(["data", "prepare", "--source", str(src), "--text-suffixes", *bad,
                     "--out", str(tmp_path / "o2")]) == 2
        assert msg in capsys.readouterr().err
    assert main(["data", "prepare", "--text-suffixes", ".py", "--out", str(tmp_path / "o3")]) == 2
    assert "apply to local files only, got source 'default'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o3").exists()


@pytest.mark.parametrize("suffixes", [(".py",), (".py", ".md")])
def test_python_api(tmp_path, suffixes):
    from deep_delta.data.sources import resolve_source

    src = resolve_source(_tree(tmp_path / "src"), suffixes)
    assert len(list(src.documents)) == 1 + sum(rel.endswith(suffixes) for rel in FILES if not rel.endswith(".txt"))


def test_our_own_outputs_are_never_read_as_sources(tmp_path, capsys):
    """`--out` inside `--source` with `--text-suffixes .md .json`: neither that run nor a rerun, nor a later run
    with another `--out` in the tree, reads meta.json, a shard or anything else of our outputs (prepared data,
    a preparation in progress, a training run, an exported model) as a document."""
    src = _tree(tmp_path / "src")
    argv = ["data", "prepare", "--source", str(src), "--text-suffixes", ".py", ".md", ".json", "--val-fraction", "0",
            "--no-progress", "--num-proc", "1"]
    assert main([*argv, "--out", str(src / "out")]) == 0
    first = read_meta(src / "out")
    assert main([*argv, "--out", str(src / "out"), "--overwrite"]) == 0
    assert main([*argv, "--out", str(src / "out2")]) == 0
    for name in ("out", "out2"):
        meta = read_meta(src / name)
        assert (meta["num_tokens"], meta["num_documents"]) == (first["num_tokens"], 4)
        assert not any("out" in Path(f).relative_to(src).parts[0] for f in meta["source_files"])
    # a run, a checkpoint, an export and a preparation in progress inside the tree are left out too
    for marker, text in (("runs/a/run.json", RUN_JSON), ("ckpt/train_meta.json", TRAIN_META),
                         ("export/config.json", '{"model_type": "deep_delta"}'), (".o3.partial/.prepare.lock", "")):
        (src / marker).parent.mkdir(parents=True)
        (src / marker).write_text(text)
        (src / marker).with_name("notes.md").write_text("written by us\n")
    (src / "other" / "config.json").parent.mkdir()
    (src / "other" / "config.json").write_text('{"model_type": "llama"}')  # someone else's: read
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "o4")]) == 0
    files = {Path(f).relative_to(src).as_posix() for f in read_meta(tmp_path / "o4")["source_files"]}
    assert files == {"README.md", "notes.txt", "pkg/a.py", "pkg/sub/d.py", "other/config.json"}


def test_a_tree_without_source_files_names_text_suffixes(tmp_path, capsys):
    src = tmp_path / "src"
    for i in range(3):
        (src / f"m{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (src / f"m{i}.py").write_text(f"x = {i}\n")
    assert main(["data", "prepare", "--source", str(src), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "holds no .txt/.jsonl/.parquet files (it holds .py (3) files" in err
    assert "name their suffixes with --text-suffixes, e.g. .py" in err


RUN_JSON = '{"identity": {"variant": "ddl-cc"}, "train_config": {"variant": "ddl-cc"}, "parameters": 10}'
TRAIN_META = '{"step": 7, "train_config": {"variant": "ddl-cc"}, "variant": "ddl-cc"}'
COMPARE_JSON = '{"rows": [], "reference": "baseline", "machine": {"device": "cpu"}}'


def test_outputs_are_recognised_by_content_and_what_is_skipped_is_said(tmp_path, capsys):
    """A user's folder holding a file merely named run.json, compare.json or train_meta.json (a web app's state, a
    notebook's results) is read like any other, never taken for our output and skipped with everything under it;
    our own outputs are recognised by what their files hold, skipped, and named in the output and in meta.json."""
    src = _tree(tmp_path / "src")
    theirs = {"app/run.json": '{"port": 8080}', "notebook/compare.json": '[1, 2, 3]',
              "model/train_meta.json": '{"epochs": 3}'}
    for rel, text in theirs.items():
        (src / rel).parent.mkdir(parents=True)
        (src / rel).write_text(text)
        (src / rel).with_name("notes.md").write_text(f"the notes beside {rel}\n")
    ours = {"runs/cc/run.json": RUN_JSON, "runs/cc/checkpoints/step_0000007/train_meta.json": TRAIN_META,
            "cmp/compare.json": COMPARE_JSON}
    for rel, text in ours.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
        (src / rel).with_name("notes.md").write_text("written by us\n")
    capsys.readouterr()
    assert main(["data", "prepare", "--source", str(src), "--text-suffixes", ".md", ".json", "--out",
                 str(tmp_path / "out"), "--val-fraction", "0", "--no-progress", "--num-proc", "1"]) == 0
    printed = capsys.readouterr().out
    meta = read_meta(tmp_path / "out")
    read = {Path(f).relative_to(src).as_posix() for f in meta["source_files"]}
    assert {*theirs, *(str(Path(rel).with_name("notes.md").as_posix()) for rel in theirs)} <= read
    assert not any(r.startswith(("runs/", "cmp/")) for r in read)
    assert meta["skipped_outputs"] == {str(src / "cmp"): "a comparison (compare.json)",
                                       str(src / "runs" / "cc"): "a training run (run.json)"}
    assert "skipped 2 folder(s) our commands wrote, never read as text:" in printed
    assert f"{src / 'runs' / 'cc'} (a training run (run.json))" in printed
