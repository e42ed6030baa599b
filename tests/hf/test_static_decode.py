"""Decoding with the fixed-shape cache (DDLStaticCache) and one compiled step (StaticDecoder).

The reference is the dynamic cache (DDLCache), itself checked against full forwards in test_generation.py:
the same prompt and tokens must give the same logits at every step, eagerly and through torch.compile
(fullgraph; the "eager" backend traces exactly what inductor would compile, without its minutes of codegen on
CPU). A compiled step must compile once: a second graph would mean a shape or a host number left in the step,
which CUDA graphs cannot replay.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from deep_delta.hf.decode import StaticDecoder
from deep_delta.models.ddl import DDLStaticCache, output_cache
from helpers import tiny_model

ATOL = 1e-5
STEPS = 4


def _dynamic(model, prompt, tokens):
    """Last-position logits after the prompt and after each token, with the dynamic cache."""
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        logits = [out.logits[:, -1]]
        for tok in tokens:
            out = model(input_ids=tok[:, None], cache=output_cache(out), use_cache=True)
            logits.append(out.logits[:, -1])
    return logits


def _static(decoder, prompt, tokens):
    decoder.reset()
    return [decoder.prefill(prompt)] + [decoder.step(tok) for tok in tokens]


# every residual kind: additive, delta d_v = 1, CC (fused update-and-read), TC + EC (token history), mHC (streams);
# compiled for the two with the most in the step (CC's fused op; TC's and EC's history buffers), eager for all
@pytest.mark.parametrize("variant", ["baseline", "ddl-dv1", "mhc"])
def test_static_decoding_equals_the_dynamic_cache(variant):
    model = tiny_model(variant)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (2, 5), generator=g)
    tokens = torch.randint(0, 256, (STEPS, 2), generator=g)
    for step, (r, a) in enumerate(zip(_dynamic(model, prompt, tokens), _static(StaticDecoder(model, 2, 12), prompt,
                                                                                tokens))):
        assert torch.allclose(a, r, atol=ATOL), (variant, step, (a - r).abs().max().item())


@pytest.mark.parametrize("variant", ["ddl-cc", "ddl-tc"])
def test_static_decoding_equals_the_dynamic_cache_and_compiles_once(variant):
    model = tiny_model(variant)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (2, 5), generator=g)
    tokens = torch.randint(0, 256, (STEPS, 2), generator=g)
    ref = _dynamic(model, prompt, tokens)
    eager = _static(StaticDecoder(model, 2, 12), prompt, tokens)
    torch._dynamo.reset()
    counters.clear()
    compiled = StaticDecoder(model, 2, 12, compile=True, backend="eager")
    got = _static(compiled, prompt, tokens)
    for step, (r, a, b) in enumerate(zip(ref, eager, got)):
        assert torch.allclose(a, r, atol=ATOL), (variant, step, (a - r).abs().max().item())
        assert torch.allclose(b, r, atol=ATOL), (variant, step, (b - r).abs().max().item())
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    # a second batch of prompts through the same decoder: the buffers emptied, nothing recompiled, and the
    # token history of the first batch gone (TC / EC would read it otherwise)
    prompt2 = torch.randint(0, 256, (2, 3), generator=g)
    again = _static(compiled, prompt2, tokens[:2])
    for r, b in zip(_dynamic(model, prompt2, tokens[:2]), again):
        assert torch.allclose(b, r, atol=ATOL)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_static_decoding_under_autocast():
    """Under bf16 autocast the K/V buffers take the dtype attention computes in (allocated at the prefill), and
    the logits match the dynamic cache's to bf16 rounding."""
    model = tiny_model("ddl-tc")
    g = torch.Generator().manual_seed(2)
    prompt, tokens = torch.randint(0, 256, (2, 5), generator=g), torch.randint(0, 256, (2, 2), generator=g)
    with torch.autocast("cpu", torch.bfloat16):
        ref = _dynamic(model, prompt, tokens)
        decoder = StaticDecoder(model, 2, 8)
        got = _static(decoder, prompt, tokens)
    for r, a in zip(ref, got):
        assert (a.float() - r.float()).abs().max() <= 0.02 * r.float().abs().max()


def test_greedy_equals_generate():
    model = tiny_model("ddl-tc")
    prompt = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.generate(input_ids=prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)[:, 4:]
    assert torch.equal(StaticDecoder(model, 3, 10).generate(prompt, 6), want)


def test_bad_use_is_refused_with_a_clear_error():
    model = tiny_model("ddl-cc")
    prompt = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="`max_length` got 65; allowed: at most the model's max_position_emb"):
        StaticDecoder(model, 2, 65)
    with pytest.raises(ValueError, match="`batch_size` got 0; allowed: an integer >= 1"):
        StaticDecoder(model, 0, 8)
    d = StaticDecoder(model, 2, 6)
    with pytest.raises(ValueError, match=r"step\(\) before prefill"):
        d.step(torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`input_ids` must have shape \(2, T\), got \(3, 4\)"):
        d.prefill(torch.zeros(3, 4, dtype=torch.long))
    d.prefill(prompt)
    with pytest.raises(ValueError, match=r"prefill\(\) needs an empty cache"):
        d.prefill(prompt)
    d.step(torch.zeros(2, dtype=torch.long))
    d.step(torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="6 positions written \\+ 1 new exceed `max_length` 6"):
        d.step(torch.zeros(2, dtype=torch.long))
    d.reset()
    d.prefill(prompt)
    with pytest.raises(ValueError, match="one token per row, got 2"):
        d.step(torch.zeros(2, 2, dtype=torch.long))
    cache = DDLStaticCache(model.config, 2, 8, device="cpu")
    with pytest.raises(ValueError, match="serves unpadded batches; `attention_mask` must be None"):
        model(input_ids=prompt, attention_mask=torch.ones(2, 4), cache=cache)
    with pytest.raises(ValueError, match="the batch has 1 rows, the DDLStaticCache 2"):
        model(input_ids=prompt[:1], cache=cache)
    model.train()
    with pytest.raises(ValueError, match=r"training mode; call `model.eval\(\)` first"):
        StaticDecoder(model, 2, 8)


def test_generate_text_with_compile(monkeypatch, tmp_path, capsys):
    """`generate_text(..., compile=True)` / `ddl generate --compile`: greedy gives generate()'s text; a seeded
    sample repeats; prompts of different lengths and `--no-cache` are refused, naming the flags."""
    from hf_helpers import cli_error, make_run

    from deep_delta.cli.main import main
    from deep_delta.hf import SamplingOptions, byte_tokenizer, decode, generate_text

    monkeypatch.setattr(decode, "DEFAULT_BACKEND", "eager")
    run, model = make_run(tmp_path / "run", variant="ddl-tc")
    tok = byte_tokenizer()
    prompts = ["Delta", "rule!"]
    want, _ = generate_text(model, tok, prompts[:1], SamplingOptions(max_new_tokens=6, greedy=True))
    sample = SamplingOptions(max_new_tokens=6, temperature=0.9, top_k=20, top_p=0.9, seed=3, compile=True)
    a, b = (generate_text(model, tok, prompts, sample)[0] for _ in range(2))
    assert [g.text for g in a] == [g.text for g in b]
    capsys.readouterr()
    assert main(["generate", "--model", str(run), "--prompt", "Delta", "--max-new-tokens", "6", "--greedy",
                 "--compile"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == "Delta" + want[0].text
    cli_error(capsys, ["generate", "--model", str(run), "--prompt", "ab", "--prompt", "abc", "--compile"],
              "--prompt", "with --compile every prompt must have the same number of tokens", "[2, 3]")
    err = cli_error(capsys, ["generate", "--model", str(run), "--prompt", "ab", "--compile", "--no-cache"],
                    "--compile", "--no-cache")
    assert "use_cache" not in err


def test_generate_text_compiles_once_per_shape_over_many_calls(monkeypatch):
    """A notebook or server calls generate_text(..., compile=True) again and again on one model: the decoder
    and its compiled step are made once per shape and reused (no recompilation per call, so no
    FailOnRecompileLimitHit at the ninth call); another length in the same bucket reuses it too, and a copy of
    the model starts without the decoders."""
    import copy

    from deep_delta.hf import SamplingOptions, byte_tokenizer, decode, generate_text

    monkeypatch.setattr(decode, "DEFAULT_BACKEND", "eager")
    model, tok = tiny_model("ddl-tc"), byte_tokenizer()
    greedy = SamplingOptions(max_new_tokens=4, greedy=True, compile=True)
    want = generate_text(model, tok, ["abcd"], SamplingOptions(max_new_tokens=4, greedy=True))[0][0].text
    torch._dynamo.reset()
    counters.clear()
    for _ in range(20):
        assert generate_text(model, tok, ["abcd"], greedy)[0][0].text == want
    assert generate_text(model, tok, ["abcdef"], greedy)[0][0].new_tokens == 4  # 10 positions: the same bucket
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert len(model._ddl_decoders) == 1 and not copy.deepcopy(model).__dict__["_ddl_decoders"]


def test_decoders_of_many_models_each_compile_their_own_step():
    """More decoders than torch's recompile limit (8 per code object) in one process, each of another model:
    every one compiles its own step (its own code object) instead of the ninth failing."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (1, 3), generator=g)
    torch._dynamo.reset()
    counters.clear()
    for i in range(10):
        model = tiny_model(("baseline", "ddl-dv1")[i % 2], seed=i)
        new = StaticDecoder(model, 1, 8, compile=True, backend="eager").generate(prompt, 3)
        assert torch.equal(new, StaticDecoder(model, 1, 8).generate(prompt, 3))
    assert counters["stats"]["unique_graphs"] == 10, dict(counters["stats"])


def test_bad_prompts_and_sizes_are_refused_before_decoding():
    """An empty prompt, ids outside the vocabulary and a generation longer than the cache are one clear error
    each, before anything is decoded (the cache stays empty)."""
    decoder = StaticDecoder(tiny_model("ddl-tc"), 1, 8)
    for ids, message in ((torch.zeros(1, 0, dtype=torch.long), r"shape \(1, 0\), an empty prompt"),
                         (torch.tensor([[3, 320]]), r"token ids in \[3, 320\]; allowed: ids in \[0, 320\)"),
                         (torch.tensor([[-1, 5]]), r"token ids in \[-1, 5\]")):
        with pytest.raises(ValueError, match=message):
            decoder.prefill(ids)
        assert decoder.filled == 0
    decoder.prefill(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"`ids` holds token ids in \[999, 999\]"):
        decoder.step(torch.tensor([999]))
    with pytest.raises(ValueError, match="a 3-token prompt and `max_new_tokens` 7 need 9 positions"):
        decoder.generate(torch.tensor([[1, 2, 3]]), 7)
    assert decoder.filled == 2  # nothing was decoded (generate() did not even reset)
    assert decoder.generate(torch.tensor([[1, 2, 3]]), 6).shape == (1, 6)  # 8 positions: fits


def test_sampling_filters():
    from deep_delta.hf import SamplingOptions

    logits = torch.tensor([[0.0, 3.0, 2.9, -1.0], [1.0, 0.0, 0.5, 0.9]])
    g = torch.Generator().manual_seed(0)
    assert SamplingOptions(greedy=True).pick(logits, g).tolist() == [1, 0]
    assert SamplingOptions(top_k=1).pick(logits, g).tolist() == [1, 0]  # top-k 1 is the argmax
    assert SamplingOptions(top_p=0.01).pick(logits, g).tolist() == [1, 0]  # so is the smallest nucleus
    # top-k 2: only the two most likely tokens are ever drawn; over many draws both are
    draws = torch.stack([SamplingOptions(top_k=2).pick(logits, g) for _ in range(200)])
    assert set(draws[:, 0].tolist()) == {1, 2} and set(draws[:, 1].tolist()) == {0, 3}
    # top-p 0.6 on row 0: softmax ~ (0.02, 0.51, 0.46, 0.01): 0.51 < 0.6, so tokens 1 and 2 stay
    draws = torch.stack([SamplingOptions(top_p=0.6).pick(logits, g) for _ in range(200)])
    assert set(draws[:, 0].tolist()) == {1, 2}
