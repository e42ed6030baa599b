"""The tools users already have, on an exported model: lm-eval's own HFLM loading the directory by path
(loglikelihood and greedy generate_until) and transformers' AutoModelForCausalLM + generate (greedy, sampling,
beam search), everything offline. Each is checked against full forwards of the same model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from eval_helpers import make_run

import deep_delta  # noqa: F401  (registers model_type "deep_delta" with the Auto classes)
from deep_delta.cli.main import main

PROMPTS = ["The delta rule", "Householder", "A reflection of x"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("hflm")
    run, _ = make_run(root / "run", variant="ddl-tc", max_position_embeddings=128)
    assert main(["export", "--model", str(run), "--out", str(root / "exported")]) == 0
    return root / "exported"


@pytest.fixture
def offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _auto(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _greedy_reference(model, ids: list[int], n: int) -> list[int]:
    """n tokens, each the argmax of a full forward over everything so far (no cache)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    return seq[len(ids):]


def test_lm_eval_hflm_loads_the_directory_and_scores_it(exported, offline):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(exported), tokenizer=str(exported), batch_size=2, device="cpu", max_length=128)
    model, tok = _auto(exported)
    reqs = [Instance("loglikelihood", {}, (p, " and more"), i) for i, p in enumerate(PROMPTS)]
    for (score, _), p in zip(lm.loglikelihood(reqs, disable_tqdm=True), PROMPTS):
        ctx, cont = tok.encode(p, add_special_tokens=False), tok.encode(" and more", add_special_tokens=False)
        with torch.no_grad():
            lp = F.log_softmax(model(torch.tensor([ctx + cont])).logits[0, :-1].float(), -1)[len(ctx) - 1 :]
        assert score == pytest.approx(float(lp.gather(-1, torch.tensor(cont)[:, None]).sum()), abs=1e-4)
    gen_kwargs = {"until": ["\x00never"], "max_gen_toks": 8, "do_sample": False}
    reqs = [Instance("generate_until", {}, (p, dict(gen_kwargs)), i) for i, p in enumerate(PROMPTS)]
    for text, p in zip(lm.generate_until(reqs, disable_tqdm=True), PROMPTS):
        want = _greedy_reference(model, tok.encode(p, add_special_tokens=False), 8)
        assert text == tok.decode(want), p


def test_auto_model_generate_greedy_sampling_and_beams(exported, offline):
    model, tok = _auto(exported)
    enc = tok(PROMPTS[0], return_tensors="pt")
    kw = dict(max_new_tokens=10, pad_token_id=tok.pad_token_id, eos_token_id=None)
    greedy = model.generate(**enc, do_sample=False, **kw)
    assert greedy[0, enc.input_ids.shape[1]:].tolist() == _greedy_reference(model, enc.input_ids[0].tolist(), 10)
    sampled = []
    for use_cache in (True, False):
        torch.manual_seed(5)
        sampled.append(model.generate(**enc, do_sample=True, top_p=0.9, temperature=1.3, use_cache=use_cache, **kw))
    assert torch.equal(sampled[0], sampled[1])
    beams = [model.generate(**enc, num_beams=4, do_sample=False, use_cache=c, **kw) for c in (True, False)]
    assert torch.equal(beams[0], beams[1])
