"""Generation with the cache, for every variant: the cache (attention K/V + DDL's token history) must give
the same logits as a full forward over the same tokens, and greedy decoding must not depend on it.

Tolerance: fp32 logits agree to atol 1e-5 (observed differences ~1e-6: the same math in a different
summation order, e.g. attention over a cached prefix vs one causal pass).
"""

from __future__ import annotations

import pytest
import torch
from hf_helpers import cli_error, hf_dir, make_run, tiny_model

from deep_delta.cli.main import main
from deep_delta.hf import SamplingOptions, byte_tokenizer, generate_text, load_model
from deep_delta.models import DDLCache
from deep_delta.variants import VARIANTS

ATOL, RTOL = 1e-5, 1e-5
VARIANT_IDS = list(VARIANTS)


def _full_logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def _chunked_logits(model, ids, chunks):
    """Feed ``ids`` through the cache in pieces of the given sizes; concatenated logits."""
    cache, out, pos = None, [], 0
    with torch.no_grad():
        for n in chunks:
            o = model(ids[:, pos : pos + n], past_key_values=cache, use_cache=True)
            cache, pos = o.past_key_values, pos + n
            out.append(o.logits)
    assert pos == ids.shape[1] and isinstance(cache, DDLCache)
    return torch.cat(out, dim=1), cache


@pytest.mark.parametrize("variant", VARIANT_IDS)
def test_incremental_decoding_matches_full_forward(variant):
    model = tiny_model(variant)
    ids = torch.randint(0, 320, (2, 24))
    full = _full_logits(model, ids)
    # prefill 8, then one token at a time
    step, cache = _chunked_logits(model, ids, [8] + [1] * 16)
    torch.testing.assert_close(step, full, atol=ATOL, rtol=RTOL)
    # chunked prefill: uneven chunks, some shorter and some longer than the conv kernels (4)
    chunked, _ = _chunked_logits(model, ids, [3, 1, 6, 2, 5, 7])
    torch.testing.assert_close(chunked, full, atol=ATOL, rtol=RTOL)
    # what each variant carries beyond K/V: EC keeps embeddings, TC keeps expanded states, CC and d_v=1 nothing
    cfg = model.config
    keys = set(cache.token_history)
    assert ("embed" in keys) == (cfg.state_init == "conv")
    assert any(k.endswith(".attn") for k in keys) == (cfg.compressor == "token")
    for k, t in cache.token_history.items():
        assert t.shape[1] == 3, k  # the last K-1 = 3 inputs of a kernel-4 convolution


@pytest.mark.parametrize("variant", ["ddl-tc", "ddl-cc"])
def test_a_cache_without_token_history_would_be_caught(variant):
    """The check above can fail: dropping the token history changes TC/EC logits."""
    model = tiny_model(variant)
    ids = torch.randint(0, 320, (1, 12))
    full = _full_logits(model, ids)
    with torch.no_grad():
        o = model(ids[:, :8], use_cache=True)
        o.past_key_values.token_history.clear()
        last = model(ids[:, 8:], past_key_values=o.past_key_values, use_cache=True).logits
    assert not torch.allclose(last, full[:, 8:], atol=1e-3)


@pytest.mark.parametrize("variant", VARIANT_IDS)
def test_greedy_generate_same_with_and_without_cache(variant):
    model = tiny_model(variant)
    ids = torch.randint(0, 320, (2, 6))
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=256, eos_token_id=None)
    with_cache = model.generate(ids, use_cache=True, **kw)
    without = model.generate(ids, use_cache=False, **kw)
    assert torch.equal(with_cache, without)
    # and both are the argmax of full forwards, token by token
    seq = ids
    for _ in range(12):
        seq = torch.cat([seq, _full_logits(model, seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(with_cache, seq)


@pytest.mark.parametrize("variant", VARIANT_IDS)
def test_left_padded_batch_matches_each_prompt_alone(variant):
    model = tiny_model(variant)
    tok = byte_tokenizer()
    prompts = ["The delta rule", "A", "Householder reflections"]
    kw = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True,
              pad_token_id=256, eos_token_id=None)
    enc = tok(prompts, padding=True, return_tensors="pt")
    assert enc.attention_mask[1, 0] == 0  # left padding
    batch = model.generate(**enc, **kw)
    texts, _ = generate_text(model, tok, prompts, SamplingOptions(max_new_tokens=6, greedy=True))
    for row, p in enumerate(prompts):
        ids = torch.tensor([tok.encode(p, add_special_tokens=False)])
        alone = model.generate(ids, **kw)
        assert torch.equal(batch.sequences[row, enc.input_ids.shape[1]:], alone.sequences[0, ids.shape[1]:]), p
        for s_batch, s_alone in zip(batch.scores, alone.scores):
            torch.testing.assert_close(s_batch[row], s_alone[0], atol=ATOL, rtol=RTOL)
        new = alone.sequences[0, ids.shape[1]:].tolist()
        new = new[: new.index(256)] if 256 in new else new
        assert texts[row].text == tok.decode(new)  # ddl generate's batch path gives the same text


def test_sampling_options():
    model = tiny_model("ddl-cc")
    tok = byte_tokenizer()
    greedy, _ = generate_text(model, tok, ["abc"], SamplingOptions(max_new_tokens=10, greedy=True))
    top1, _ = generate_text(model, tok, ["abc"], SamplingOptions(max_new_tokens=10, top_k=1, seed=3))
    assert top1[0].text == greedy[0].text  # top-k 1 is greedy
    tiny_p, _ = generate_text(model, tok, ["abc"], SamplingOptions(max_new_tokens=10, top_p=1e-6, seed=3))
    assert tiny_p[0].text == greedy[0].text  # a vanishing nucleus keeps only the top token
    a, _ = generate_text(model, tok, ["abc"], SamplingOptions(max_new_tokens=20, temperature=1.5, seed=7))
    b, _ = generate_text(model, tok, ["abc"], SamplingOptions(max_new_tokens=20, temperature=1.5, seed=7))
    c, _ = generate_text(model, tok, ["abc"], SamplingOptions(max_new_tokens=20, temperature=1.5, seed=8))
    assert a[0].text == b[0].text and a[0].text != c[0].text
    zero_t, _ = generate_text(model, tok, ["abc"], SamplingOptions(max_new_tokens=10, temperature=0.0))
    assert zero_t[0].text == greedy[0].text


@pytest.mark.parametrize(
    ("opts", "msg"),
    [
        (SamplingOptions(max_new_tokens=0), "^`max_new_tokens` got 0"),
        (SamplingOptions(temperature=-1.0), "^`temperature` got -1.0"),
        (SamplingOptions(top_k=-2), "^`top_k` got -2"),
        (SamplingOptions(top_p=0.0), r"^`top_p` got 0.0; allowed: a float in \(0, 1\]"),
    ],
)
def test_bad_sampling_options(opts, msg):
    with pytest.raises(ValueError, match=msg):
        opts.check()


def test_prompt_longer_than_context_is_refused_and_new_tokens_fit(tmp_path):
    model = tiny_model("ddl-tc")  # context 64
    tok = byte_tokenizer()
    with pytest.raises(ValueError, match="^`prompts`: the prompt is 64 tokens, but the model's context is 64 tokens"):
        generate_text(model, tok, ["x" * 64], SamplingOptions(max_new_tokens=4, greedy=True))
    gens, max_new = generate_text(model, tok, ["x" * 60], SamplingOptions(max_new_tokens=50, greedy=True))
    assert max_new == 4 and gens[0].new_tokens <= 4


def test_ddl_generate_cli(tmp_path, capsys):
    run, _ = make_run(tmp_path / "run", variant="ddl-tc")
    args = ["generate", "--model", str(run), "--prompt", "Delta", "--max-new-tokens", "6", "--greedy"]
    assert main(args) == 0
    cached = capsys.readouterr().out
    assert cached.startswith("Delta")
    assert main(args + ["--no-cache"]) == 0
    assert capsys.readouterr().out == cached
    assert main(["generate", "--model", str(run), "--prompt", "y" * 80]) == 2
    # the library names its parameters (`prompts`, `top_p`); the command line shows the flags instead
    assert "error: --prompt: the prompt is 80 tokens, but the model's context is 64 tokens" in capsys.readouterr().err
    assert main(["generate", "--model", str(run), "--prompt", "x", "--top-p", "0"]) == 2
    assert "error: --top-p got 0.0; allowed: a float in (0, 1]" in capsys.readouterr().err
    assert main(["generate", "--model", str(tmp_path), "--prompt", "x"]) == 2
    assert "is not a model directory" in capsys.readouterr().err


def test_a_prompt_that_is_not_utf8_is_a_clear_error(tmp_path, capsys):
    model = hf_dir(tmp_path / "m")
    bad = b"ab\xffc".decode("utf-8", "surrogateescape")  # what Python makes of such bytes in sys.argv
    cli_error(capsys, ["generate", "--model", str(model), "--prompt", bad], "--prompt", "not valid UTF-8",
               "byte 2", "0xff")
    cli_error(capsys, ["generate", "--model", str(model), "--prompt", "ok", "--prompt", bad], "prompt 2", "byte 2")
    loaded = load_model(model)
    with pytest.raises(ValueError, match="not valid UTF-8"):
        generate_text(loaded.model, loaded.tokenizer, ["x\ud800"], SamplingOptions(max_new_tokens=1))
