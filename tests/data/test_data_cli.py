import json

import pytest

from deep_delta.cli.main import main
from deep_delta.data import read_meta


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": f"line {i} " * (i + 3)}) + "\n" for i in range(30)))
    return path


def test_prepare_and_info(tmp_path, corpus, capsys):
    out = tmp_path / "out"
    rc = main(["data", "prepare", "--source", str(corpus), "--tokenizer", "byte", "--out", str(out),
               "--val-fraction", "0.2", "--shard-tokens", "500", "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    meta = read_meta(out)
    assert f"prepared {meta['num_tokens']:,} tokens (30 documents)" in printed
    assert meta["val_fraction"] == 0.2 and meta["shard_tokens"] == 500
    assert len(meta["splits"]["train"]["shards"]) > 1
    assert main(["data", "info", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "train_000001.bin" in printed and "ok: meta.json and shard headers agree" in printed
    assert main(["data", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["meta"]["num_tokens"] == meta["num_tokens"] and info["problems"] == []


def test_info_reports_damage(tmp_path, corpus, capsys):
    out = tmp_path / "out"
    assert main(["data", "prepare", "--source", str(corpus), "--out", str(out), "--no-progress"]) == 0
    shard = out / "train_000000.bin"
    shard.write_bytes(shard.read_bytes()[:-4])
    capsys.readouterr()
    assert main(["data", "info", str(out)]) == 1
    assert "train_000000.bin is truncated" in capsys.readouterr().out
    shard.unlink()
    assert main(["data", "info", str(out)]) == 1
    assert "train_000000.bin listed in meta.json does not exist" in capsys.readouterr().out


def test_user_errors_exit_2(tmp_path, corpus, capsys):
    out = tmp_path / "out"
    assert main(["data", "prepare", "--source", str(corpus), "--out", str(out), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["data", "prepare", "--source", str(corpus), "--out", str(out)]) == 2
    assert "is not empty; pass --overwrite" in capsys.readouterr().err
    assert main(["data", "prepare", "--source", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "x")]) == 2
    assert "missing.txt' is neither" in capsys.readouterr().err
    assert main(["data", "prepare", "--bpe-file", "x", "--out", str(tmp_path / "x")]) == 2
    assert "--bpe-file got 'x' with --tokenizer 'byte'; allowed: a BPE file only with --tokenizer gpt2" in (
        capsys.readouterr().err)
    assert main(["data", "info", str(tmp_path / "nowhere")]) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["data", "prepare", "--source", str(corpus), "--out", str(out), "--overwrite",
                 "--max-tokens", "300", "--no-progress"]) == 0
    assert read_meta(out)["num_tokens"] == 300


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-tokens", "0"], "argument --max-tokens: expected a positive whole number"),
        (["--shard-tokens", "1.5"], "argument --shard-tokens: expected a positive whole number"),
        (["--val-fraction", "1"], r"argument --val-fraction: expected a number in \[0, 1\)"),
        (["--tokenizer", "bert"], "argument --tokenizer: invalid choice: 'bert'"),
    ],
)
def test_bad_arguments(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["data", "prepare", "--out", str(tmp_path / "o"), *args])
    assert info.value.code == 2
    import re

    assert re.search(message, capsys.readouterr().err)


def test_counts():
    from deep_delta.cli.options import count

    assert [count(s) for s in ["1000", "1_000", "1e6", "500k", "10M", "2B", "1.5k"]] == [
        1000, 1000, 10**6, 500_000, 10**7, 2 * 10**9, 1500]


def test_gpt2_offline_cli(tmp_path, monkeypatch, capsys):
    import requests
    import tiktoken.load
    import tiktoken.registry

    def no_network(blobpath):
        raise requests.exceptions.ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DDL_GPT2_BPE", raising=False)
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    assert main(["data", "prepare", "--tokenizer", "gpt2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "ddl data: error: cannot load the GPT-2 BPE" in err and "$DDL_GPT2_BPE" in err
    assert not (tmp_path / "o").exists()
