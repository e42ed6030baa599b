"""Generation with the cache, for every variant: the cache (attention K/V + DDL's token history) must give
the same logits as a full forward over the same tokens, and greedy decoding must not depend on it.

Tolerance: fp32 logits agree to atol 1e-5 (observed differences ~1e-6: the same math in a different
summation order, e.g. attention over a cached prefix vs one causal pass).
"""

from __future__ import annotations

import pytest
import torch
from hf_helpers import cli_error, hf_dir, make_run

from deep_delta.cli.main import main
from deep_delta.hf import SamplingOptions, byte_tokenizer, generate_text, load_model
from deep_delta.models import DDLCache
from deep_delta.models.ddl import output_cache
from deep_delta.variants import VARIANTS
from helpers import tiny_model

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
            o = model(ids[:, pos : pos + n], cache=cache, use_cache=True)
            cache, pos = output_cache(o), pos + n
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
        output_cache(o).token_history.clear()
        last = model(ids[:, 8:], cache=output_cache(o), use_cache=True).logits
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


@pytest.mark.parametrize("name", ["cache", "past_key_values", "cache_params"])
@pytest.mark.parametrize("variant", ["baseline", "ddl-tc", "hc"])
def test_the_cache_under_every_name_transformers_has_used(variant, name):
    """`cache` (transformers >= 5.24), `past_key_values` (before) and `cache_params` are the same argument: cached decoding
    through either equals the full forward; giving both, or a misspelt name, is an error, never a no-op."""
    model = tiny_model(variant)
    ids = torch.randint(0, 320, (2, 10))
    full = _full_logits(model, ids)
    with torch.no_grad():
        o = model(ids[:, :6], use_cache=True)
        steps = [o.logits]
        for t in range(6, 10):
            o = model(ids[:, t : t + 1], use_cache=True, **{name: output_cache(o)})
            steps.append(o.logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=ATOL, rtol=RTOL)
    with torch.no_grad():
        o = model(ids[:, :6], use_cache=True)
        other = model(ids[:, :6], use_cache=True)
        with pytest.raises(ValueError, match="pass the cache once, as `cache`, not under several names"):
            model(ids[:, 6:7], cache=output_cache(o), past_key_values=output_cache(other))
        for typo in ("past_key_value", "caches", "kv_cache"):
            with pytest.raises(TypeError, match=f"unexpected keyword argument\\(s\\) `{typo}`"):
                model(ids[:, 6:7], use_cache=True, **{typo: output_cache(o)})
            with pytest.raises(TypeError, match=f"`{typo}`"):
                model.model(ids[:, 6:7], use_cache=True, **{typo: output_cache(o)})


def test_flags_transformers_passes_are_honoured_or_refused():
    model = tiny_model("ddl-cc")
    ids = torch.randint(0, 320, (1, 5))
    with torch.no_grad():
        ref = model(ids).logits
        # neutral values and the position range generate() used to pass are accepted
        out = model(ids, output_attentions=False, output_hidden_states=None, cache_position=torch.arange(5))
        torch.testing.assert_close(out.logits, ref, atol=0, rtol=0)
        as_tuple = model(ids, return_dict=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], ref)
        for flag in ("output_attentions", "output_hidden_states"):
            with pytest.raises(ValueError, match=f"`{flag}=True` is not supported"):
                model(ids, **{flag: True})
        # transformers' Trainer divides the summed token losses by the items in the whole accumulated batch
        mean = model(ids, labels=ids).loss
        summed = model(ids, labels=ids, num_items_in_batch=8).loss
        torch.testing.assert_close(summed, mean * 4 / 8)


def test_a_cache_that_cannot_carry_the_token_history_is_refused():
    from transformers import DynamicCache

    model = tiny_model("ddl-tc")
    ids = torch.randint(0, 320, (1, 5))
    with torch.no_grad():
        filled = DynamicCache()
        k = torch.zeros(1, model.config.num_attention_heads, 5, model.config.head_dim)
        filled.update(k, k, 0)
        with pytest.raises(ValueError, match="must be a DDLCache"):
            model(ids, cache=filled, use_cache=True)
        # the empty DynamicCache that generate() makes is replaced by a DDLCache
        out = model(ids, cache=DynamicCache(), use_cache=True)
        assert isinstance(output_cache(out), DDLCache)


@pytest.mark.parametrize("variant", ["baseline", "ddl-tc", "ddl-cc", "mhc"])
def test_sampling_and_beam_search_through_generate(variant):
    """generate() with sampling (seeded: equal with and without the cache) and with beam search (the cache's
    rows reordered, token history included: equal with and without the cache)."""
    model = tiny_model(variant)
    ids = torch.randint(0, 320, (2, 6))
    kw = dict(max_new_tokens=8, pad_token_id=256, eos_token_id=None)
    runs = []
    for use_cache in (True, False):
        torch.manual_seed(11)
        runs.append(model.generate(ids, do_sample=True, top_k=20, use_cache=use_cache, **kw))
    assert torch.equal(runs[0], runs[1])
    beams = [model.generate(ids, num_beams=3, do_sample=False, use_cache=c, **kw) for c in (True, False)]
    assert torch.equal(beams[0], beams[1])


def test_static_cache_is_a_clear_error():
    model = tiny_model("ddl-tc")
    ids = torch.randint(0, 320, (1, 6))
    with pytest.raises(ValueError, match="static or quantized cache"):
        model.generate(ids, max_new_tokens=3, cache_implementation="static", pad_token_id=256, eos_token_id=None)


@pytest.mark.parametrize("variant", VARIANT_IDS)
def test_ddl_generate_greedy_is_the_argmax_continuation(tmp_path, capsys, variant):
    """`ddl generate --greedy` (the cache on, as by default) prints the prompt and then, token by token, the
    argmax of a full forward over everything before it."""
    run, model = make_run(tmp_path / "run", variant=variant)
    capsys.readouterr()
    assert main(["generate", "--model", str(run), "--prompt", "Delta rule", "--max-new-tokens", "8", "--greedy"]) == 0
    printed = capsys.readouterr().out
    tok = byte_tokenizer()
    seq = torch.tensor([tok.encode("Delta rule", add_special_tokens=False)])
    for _ in range(8):
        seq = torch.cat([seq, _full_logits(model, seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    new = seq[0, -8:].tolist()
    new = new[: new.index(tok.eos_token_id)] if tok.eos_token_id in new else new
    assert printed.rstrip("\n") == "Delta rule" + tok.decode(new)
