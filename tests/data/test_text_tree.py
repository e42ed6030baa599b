"""`ddl data prepare --source DIR --text-suffixes ...`: a corpus from any tree of UTF-8 text files (source code,
say), one document per file, in sorted path order; binary files and other suffixes left out."""

from __future__ import annotations

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
