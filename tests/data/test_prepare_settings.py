"""`PrepareSettings`: the options of `prepare` and of `ddl data prepare`, their defaults stated once, their checks,
and the flags generated from them (with the count and fraction grammars of the hand-written flags they replace)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from deep_delta.cli.main import build_parser, command_parser, main
from deep_delta.data import ByteTokenizer, PrepareSettings, prepare, prepare_from, read_meta


def test_prepare_takes_the_settings_and_their_defaults():
    """prepare()'s keywords are the settings' fields (``out_dir``: ``out``), with the same defaults."""
    parameters = inspect.signature(prepare).parameters
    fields = {f.name: f for f in dataclasses.fields(PrepareSettings)}
    assert {"out" if n == "out_dir" else n for n in parameters} == set(fields)
    keywords = {n: p.default for n, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert keywords == {n: fields[n].default for n in keywords}
    assert fields["out"].default is dataclasses.MISSING  # required, as --out


def test_the_help_shows_the_defaults_as_the_flags_read_them():
    parser = command_parser(build_parser(), ["data", "prepare"])
    shown = " ".join(parser.format_help().split())
    assert "--shard-tokens N tokens per shard file (default 100M)" in shown
    assert ("--val-fraction F share of tokens in the validation split (val, the selection split), in [0, 1) "
            "(default 0.01)") in shown
    assert "--test-fraction F share of tokens in the test split" in shown and "less than 1 (default 0.0)" in shown
    assert "--tokenizer {byte,gpt2} byte: UTF-8 bytes" in shown and "--out DIR output directory (created)" in shown


def test_max_tokens_counts_every_split_as_its_help_says(tmp_path):
    """Round 6's D8: the help said "N tokens in all (train + val)" while the test split counts too."""
    shown = " ".join(command_parser(build_parser(), ["data", "prepare"]).format_help().split())
    assert "--max-tokens N stop after N tokens in all, every split counted (train + val + test" in shown
    assert "(train + val)" not in shown
    src = tmp_path / "book.txt"
    src.write_text("The delta rule erases what it writes over. " * 100)
    meta = prepare(src, "byte", tmp_path / "o", val_fraction=0.1, test_fraction=0.1, max_tokens=2000, progress=False)
    counts = [meta["splits"][s]["num_tokens"] for s in ("train", "val", "test")]
    assert sum(counts) == 2000 and all(counts), counts


@pytest.mark.parametrize("changes, said", [
    ({"val_fraction": 1.5}, r"`val_fraction` got 1.5; allowed: a number in \[0, 1\)"),
    ({"test_fraction": -0.1}, r"`test_fraction` got -0.1; allowed: a number in \[0, 1\)"),
    ({"val_fraction": 0.5, "test_fraction": 0.5}, r"`val_fraction` 0.5 and `test_fraction` 0.5 add up to 1; "
                                                  r"allowed: a sum below 1"),
    ({"shard_tokens": 0}, "`shard_tokens` got 0; allowed: an integer >= 1 and <= 2,147,483,647"),
    ({"shard_tokens": "lots"}, "`shard_tokens` got 'lots'; allowed: an integer"),
    ({"max_tokens": 0}, r"`max_tokens` got 0; allowed: an integer >= 1, or None \(no cap\)"),
    ({"num_proc": 0}, r"`num_proc` got 0; allowed: an integer >= 1, or None \(the CPUs available\)"),
    ({"tokenizer": "bert"}, "`tokenizer` got 'bert'; allowed: byte | gpt2"),
    ({"bpe_file": "vocab.bpe"}, "`bpe_file` got 'vocab.bpe' with `tokenizer` 'byte'; allowed: a BPE file only with "
                                "`tokenizer` gpt2"),
    ({"text_suffixes": ["py"]}, "`text_suffixes` got 'py'; allowed: file suffixes such as '.py'"),
])
def test_each_bad_setting_is_named(tmp_path, changes, said):
    with pytest.raises(ValueError, match=said):
        PrepareSettings(out=str(tmp_path / "o"), **changes)
    with pytest.raises(ValueError, match=said):  # the Python API checks through the same class
        prepare("default", changes.get("tokenizer", "byte"), tmp_path / "o", progress=False,
                **{k: v for k, v in changes.items() if k != "tokenizer"})
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, said", [
    (["--val-fraction", "1.5"], "argument --val-fraction: expected a number in [0, 1), got '1.5'"),
    (["--shard-tokens", "0"], "argument --shard-tokens: expected a positive whole number"),
    (["--shard-tokens", "3e9"], "PrepareSettings: --shard-tokens got 3000000000; allowed: an integer >= 1 and <= "
                                "2,147,483,647"),
    (["--num-proc", "0"], "argument --num-proc: expected a positive whole number"),
    (["--tokenizer", "bert"], "argument --tokenizer: invalid choice: 'bert'"),
    (["--bpe-file", "vocab.bpe", "--tokenizer", "byte"],
     "PrepareSettings: --bpe-file got 'vocab.bpe' with --tokenizer 'byte'; allowed: a BPE file only with --tokenizer "
     "gpt2"),
    (["--source", "default"], "the following arguments are required: --out"),
    (["--val-fraction", "0.6", "--test-fraction", "0.5"], "PrepareSettings: --val-fraction 0.6 and --test-fraction "
                                                          "0.5 add up to 1.1; allowed: a sum below 1"),
])
def test_each_bad_flag_is_a_usage_error_naming_it(tmp_path, capsys, args, said):
    out = [] if "required" in said else ["--out", str(tmp_path / "o")]
    try:
        code = main(["data", "prepare", *out, "--no-progress", *args])
    except SystemExit as e:  # refused by the parser
        code = e.code
    assert code == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_counts_with_suffixes_reach_the_data(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["data", "prepare", "--out", str(out), "--shard-tokens", "1k", "--max-tokens", "5k",
                 "--val-fraction", "0", "--num-proc", "1", "--no-progress"]) == 0
    meta = read_meta(out)
    assert (meta["shard_tokens"], meta["num_tokens"], len(meta["splits"]["train"]["shards"])) == (1000, 5000, 5)
    assert f"written to {out} in" in capsys.readouterr().out


def test_prepare_from_passes_every_setting(tmp_path):
    settings = PrepareSettings(out=str(tmp_path / "a"), shard_tokens=700, max_tokens=3000, val_fraction=0.1,
                               num_proc=1, progress=False)
    meta = prepare_from(settings)
    again = prepare("default", ByteTokenizer(), tmp_path / "b", shard_tokens=700, max_tokens=3000, val_fraction=0.1,
                    num_proc=1, progress=False)
    assert (meta["shard_tokens"], meta["max_tokens"], meta["val_fraction"]) == (700, 3000, 0.1)
    assert meta["splits"] == again["splits"]
