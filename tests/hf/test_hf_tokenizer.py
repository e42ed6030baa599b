"""HF tokenizers saved beside the weights: ids equal the training tokenizers' (deep_delta.data.get_tokenizer)."""

from __future__ import annotations

import base64

import pytest
from transformers import AutoTokenizer

from deep_delta.data import get_tokenizer
from deep_delta.data.tokenizers import GPT2_PAT
from deep_delta.hf.tokenizer import build_tokenizer, byte_tokenizer, save_tokenizer, tokenizer_from_tiktoken

TEXTS = [
    "Hello, world!",
    "  leading spaces\tand\ttabs\n\nnew lines \r\n",
    "unicode: héllo wörld, 日本語, emoji 🙂, combining é",
    "numbers 1234567 and 3.14159; code: def f(x): return x**2",
    "the literal <|endoftext|> text is plain text",
    "",
]


def _corpus() -> str:
    from pydoc_data.topics import topics

    return "\n".join(topics[k] for k in sorted(topics)[:30])


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_byte_ids_are_utf8_bytes_and_match_training_tokenizer(text):
    hf, train = byte_tokenizer(), get_tokenizer("byte")
    ids = hf.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8")) == train.encode(text)
    assert hf.decode(ids) == text


def test_byte_tokenizer_special_token_and_save_reload(tmp_path):
    hf = save_tokenizer("byte", tmp_path, model_max_length=64)
    assert (tmp_path / "tokenizer.json").is_file()
    back = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert len(back) == 257 and back.eos_token_id == 256 and back.pad_token_id == 256
    assert back.padding_side == "left" and back.model_max_length == 64
    text = _corpus()[:5000]
    assert back.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False) == list(text.encode())
    assert back.decode([104, 105, 256, 33]) == "hi<|endoftext|>!"
    assert back.decode([104, 105, 256, 33], skip_special_tokens=True) == "hi!"


def _write_tiny_gpt2_bpe(path, text: str, merges: int = 200) -> None:
    """A GPT-2-format ranks file (.tiktoken) learned from ``text``: 256 bytes, then ``merges`` BPE merges."""
    import collections

    import regex

    ranks = {bytes([b]): b for b in range(256)}
    words = [[bytes([c]) for c in w.encode()] for w in regex.findall(GPT2_PAT, text)]
    for _ in range(merges):
        pairs = collections.Counter(p for w in words for p in zip(w, w[1:]))
        if not pairs:
            break
        (a, b), _ = pairs.most_common(1)[0]
        ranks[a + b] = len(ranks)
        for i, w in enumerate(words):
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(a + b)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks.items()))


@pytest.mark.filterwarnings("ignore:BPE file .* merge ranks")
def test_gpt2_from_local_bpe_matches_tiktoken(tmp_path, monkeypatch):
    corpus = _corpus()
    bpe = tmp_path / "gpt2.tiktoken"
    _write_tiny_gpt2_bpe(bpe, corpus[:20000])
    monkeypatch.setenv("DDL_GPT2_BPE", str(bpe))
    train = get_tokenizer("gpt2")
    hf = build_tokenizer("gpt2")
    assert len(hf) == train.vocab_size and hf.eos_token_id == train.eot_token
    for text in TEXTS + [corpus[20000:30000], corpus[:3000].upper()]:
        ids = hf.encode(text, add_special_tokens=False)
        assert ids == train.encode(text)
        assert hf.decode(ids) == text
    assert max(hf.encode(corpus[:3000], add_special_tokens=False)) > 255  # merges were used
    save_tokenizer("gpt2", tmp_path / "tok")
    back = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    assert back.encode(corpus[30000:34000], add_special_tokens=False) == train.encode(corpus[30000:34000])


def test_gpt2_offline_without_bpe_says_how_to_provide_it(monkeypatch):
    import tiktoken

    from deep_delta.data import DataUnavailableError

    def offline(name):
        raise ConnectionError("network unreachable")

    monkeypatch.delenv("DDL_GPT2_BPE", raising=False)
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(DataUnavailableError, match="DDL_GPT2_BPE"):
        build_tokenizer("gpt2")


def test_tiktoken_conversion_needs_every_byte():
    import tiktoken

    enc = tiktoken.Encoding("partial", pat_str=GPT2_PAT, mergeable_ranks={b"a": 0, b"b": 1}, special_tokens={})
    with pytest.raises(ValueError, match="every single byte"):
        tokenizer_from_tiktoken(enc)


def test_unknown_tokenizer_name():
    with pytest.raises(ValueError, match=r"got 'bpe'; allowed: byte \| gpt2"):
        build_tokenizer("bpe")
