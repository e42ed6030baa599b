import bpe_fixtures
import pytest

from deep_delta.data import DataUnavailableError, get_tokenizer
from deep_delta.data.tokenizers import load_bpe_ranks

TEXT = "the cat and the hat, an anthem: <|endoftext|> naïve 東京 ✓\n\ttheta"


def test_byte_tokenizer():
    tok = get_tokenizer("byte")
    assert (tok.name, tok.vocab_size, tok.eot_token) == ("byte", 257, 256)
    ids = tok.encode(TEXT)
    assert ids == list(TEXT.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == TEXT
    assert tok.decode(tok.encode("a") + [256] + tok.encode("b")) == "a<|endoftext|>b"
    assert tok.encode_batch(["a", "é"]) == [[97], [195, 169]]
    with pytest.raises(ValueError, match="token id 257 is outside the vocabulary 0..256"):
        tok.decode([257])


def test_unknown_tokenizer():
    with pytest.raises(ValueError, match="unknown tokenizer 'bert'; choose one of: byte, gpt2"):
        get_tokenizer("bert")
    with pytest.raises(ValueError, match="bpe_file is only used by the gpt2 tokenizer"):
        get_tokenizer("byte", bpe_file="x")


def _check_tiny_gpt2(tok):
    n = len(bpe_fixtures.ranks())
    assert (tok.name, tok.vocab_size, tok.eot_token) == ("gpt2", n + 1, n)
    r = bpe_fixtures.ranks()
    assert tok.encode(" the") == [r[b" the"]]
    assert tok.encode("the an") == [r[b"the"], r[b" an"]]
    ids = tok.encode(TEXT)
    assert tok.eot_token not in ids  # special-token text in a document is plain text
    assert tok.decode(ids) == TEXT
    assert tok.decode([tok.eot_token]) == "<|endoftext|>"
    assert tok.encode_batch([TEXT, "the"]) == [ids, [r[b"the"]]]


def test_gpt2_from_tiktoken_file(tmp_path):
    path = bpe_fixtures.write_tiktoken(tmp_path / "tiny.tiktoken")
    with pytest.warns(UserWarning, match="not GPT-2's 50256"):
        tok = get_tokenizer("gpt2", bpe_file=path)
    _check_tiny_gpt2(tok)


@pytest.mark.parametrize("names", [("vocab.bpe", "encoder.json"), ("merges.txt", "vocab.json")], ids=["openai", "hf"])
def test_gpt2_from_data_gym_files(tmp_path, names):
    d = bpe_fixtures.write_data_gym(tmp_path / "bpe", *names)
    assert load_bpe_ranks(d) == bpe_fixtures.ranks()
    assert load_bpe_ranks(d / names[0]) == bpe_fixtures.ranks()
    with pytest.warns(UserWarning):
        _check_tiny_gpt2(get_tokenizer("gpt2", bpe_file=d))


def test_gpt2_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DDL_GPT2_BPE", str(bpe_fixtures.write_tiktoken(tmp_path / "g.tiktoken")))
    with pytest.warns(UserWarning):
        _check_tiny_gpt2(get_tokenizer("gpt2"))


def test_bad_bpe_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="BPE file .*missing.tiktoken does not exist"):
        get_tokenizer("gpt2", bpe_file=tmp_path / "missing.tiktoken")
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("dGhl 0\nnot-a-line\n")
    with pytest.raises(ValueError, match=r"bad\.tiktoken, line 2: expected '<base64 token> <rank>'"):
        get_tokenizer("gpt2", bpe_file=bad)
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\n")
    with pytest.raises(FileNotFoundError, match="needs encoder.json beside it"):
        get_tokenizer("gpt2", bpe_file=tmp_path / "vocab.bpe")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds neither vocab.bpe"):
        get_tokenizer("gpt2", bpe_file=tmp_path / "empty")


def test_gpt2_offline_error(tmp_path, monkeypatch):
    import requests
    import tiktoken.load
    import tiktoken.registry

    urls = []

    def no_network(blobpath):
        urls.append(blobpath)
        raise requests.exceptions.ConnectionError(f"Failed to resolve host for {blobpath}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("DDL_GPT2_BPE", raising=False)
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "gpt2", raising=False)
    with pytest.raises(DataUnavailableError) as info:
        get_tokenizer("gpt2")
    message = str(info.value)
    assert "cannot load the GPT-2 BPE" in message and "ConnectionError" in message
    assert "$DDL_GPT2_BPE" in message and "--bpe-file" in message and "$TIKTOKEN_CACHE_DIR" in message
    assert urls and urls[0].startswith("https://openaipublic.blob.core.windows.net/gpt-2/")
