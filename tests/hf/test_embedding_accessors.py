"""The Hugging Face embedding accessors of ``DDLModel`` and ``DDLForCausalLM`` (transformers' own, found by the
attribute names ``embed_tokens``, ``model`` and ``lm_head``): what they return, that setting one is seen by the
forward pass, and ``resize_token_embeddings`` built on them, with the readout tied or untied."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import tiny_model


@pytest.mark.parametrize("tied", [True, False])
def test_the_accessors_name_the_embedding_and_the_readout(tied):
    model = tiny_model("ddl-cc", tie_word_embeddings=tied)
    assert model.get_input_embeddings() is model.model.embed_tokens
    assert model.model.get_input_embeddings() is model.model.embed_tokens
    assert model.get_output_embeddings() is model.lm_head
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied


def test_a_set_embedding_is_the_one_the_forward_pass_uses():
    model = tiny_model("ddl-cc", tie_word_embeddings=False)
    ids = torch.tensor([[1, 2, 3, 4]])
    before = model(ids).logits
    d, vocab = model.config.hidden_size, model.config.vocab_size
    torch.manual_seed(5)
    model.set_input_embeddings(nn.Embedding(vocab, d))
    assert model.model.embed_tokens is model.get_input_embeddings()
    moved = model(ids).logits
    assert not torch.allclose(moved, before)
    model.set_output_embeddings(nn.Linear(d, vocab, bias=False))
    assert model.lm_head is model.get_output_embeddings()
    assert not torch.allclose(model(ids).logits, moved)
    base = model.model
    base.set_input_embeddings(nn.Embedding(vocab, d))
    assert base.embed_tokens is base.get_input_embeddings()


@pytest.mark.parametrize("tied", [True, False])
def test_resize_token_embeddings_keeps_the_old_rows_and_grows_the_readout(tied):
    model = tiny_model("ddl-tc", tie_word_embeddings=tied)
    vocab = model.config.vocab_size
    old_in = model.get_input_embeddings().weight.detach().clone()
    ids = torch.tensor([[5, 6, 7]])
    before = model(ids).logits
    model.resize_token_embeddings(vocab + 8)
    assert model.config.vocab_size == vocab + 8
    assert model.get_input_embeddings().weight.shape[0] == vocab + 8
    assert model.get_output_embeddings().weight.shape[0] == vocab + 8
    assert torch.equal(model.get_input_embeddings().weight[:vocab], old_in)
    after = model(ids).logits
    assert after.shape[-1] == vocab + 8
    torch.testing.assert_close(after[..., :vocab], before, rtol=1e-5, atol=1e-5)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
