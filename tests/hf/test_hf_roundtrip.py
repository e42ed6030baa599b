"""save_pretrained / from_pretrained round trips, the model resolver, and `ddl export`."""

from __future__ import annotations

import json
import pickle
import re

import pytest
import torch
from hf_helpers import make_run
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import deep_delta.models  # noqa: F401  (registers the Auto classes)
from deep_delta.cli.main import main
from deep_delta.hf import export_model, load_model, resolve_model_dir
from deep_delta.variants import VARIANTS
from helpers import tiny_model

NOT_A_MODEL = re.escape(
    "is not a model directory: expected config.json + model.safetensors, or a training run with checkpoints/LATEST"
)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_save_load_identical_logits(tmp_path, variant):
    model = tiny_model(variant)
    model.save_pretrained(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt", ".pth")) for f in files)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "deep_delta"
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(back).__name__ == "DDLForCausalLM" and back.config.variant == variant
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()  # still tied
    want, got = model.state_dict(), back.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    ids = torch.randint(0, 320, (2, 20))
    with torch.no_grad():
        ref = model(ids).logits
        # weights straight from the memory-mapped file are not 64-byte aligned and CPU kernels may round
        # differently (~1e-7); load_model copies them into aligned memory and reproduces the logits exactly
        torch.testing.assert_close(back(ids).logits, ref, rtol=0, atol=2e-6)
        assert torch.equal(load_model(tmp_path, tokenizer="byte").model(ids).logits, ref)


class _Boom:
    """Unpickling this runs ``open(marker, "w")``: a stand-in for code hidden in a pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_loading_never_unpickles(tmp_path):
    src = tmp_path / "m"
    tiny_model("ddl-cc").save_pretrained(src)
    marker = tmp_path / "pickle-ran"
    (src / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(marker)))
    pickle.loads((src / "pytorch_model.bin").read_bytes()).close()  # the bait does run when unpickled
    assert marker.exists()
    marker.unlink()
    load_model(src, tokenizer="byte")
    assert not marker.exists()
    (src / "model.safetensors").unlink()  # only the pickle left: refused, not loaded
    with pytest.raises(FileNotFoundError, match="pickled weights are never loaded"):
        load_model(src, tokenizer="byte")
    assert not marker.exists()


def test_resolver_kinds(tmp_path):
    run, model = make_run(tmp_path / "run", step=7)
    ckpt = run / "checkpoints" / "step_0000007"
    for path, kind in ((run, "run"), (run / "checkpoints", "run"), (ckpt, "checkpoint")):
        src = resolve_model_dir(path)
        assert (src.kind, src.model_dir) == (kind, ckpt)
        assert src.train_meta["tokenizer"] == "byte" and src.train_meta["step"] == 7
    loaded = load_model(run)
    assert loaded.tokenizer_name == "byte" and loaded.tokenizer.eos_token_id == 256
    ids = torch.randint(0, 320, (1, 12))
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, model(ids).logits)
    assert not loaded.model.training


def test_resolver_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_dir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=NOT_A_MODEL):
        resolve_model_dir(tmp_path / "empty")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=NOT_A_MODEL):
        resolve_model_dir(tmp_path / "f.txt")
    run, _ = make_run(tmp_path / "run")
    (run / "checkpoints" / "LATEST").write_text("step_0000099\n")  # names a checkpoint that is gone
    with pytest.raises(FileNotFoundError, match=NOT_A_MODEL + ".*step_0000099"):
        resolve_model_dir(run)


def test_tokenizer_required_and_must_fit_vocab(tmp_path):
    tiny_model("baseline").save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="no tokenizer found.*set `tokenizer` to byte or gpt2"):
        load_model(tmp_path / "m")
    assert load_model(tmp_path / "m", require_tokenizer=False).tokenizer is None
    tiny_model("baseline", vocab_size=128).save_pretrained(tmp_path / "small")
    with pytest.raises(ValueError, match="257 tokens but the model's vocab_size is 128"):
        load_model(tmp_path / "small", tokenizer="byte")


def test_export_writes_a_clean_hf_directory(tmp_path, capsys):
    run, model = make_run(tmp_path / "run", variant="ddl-cc")
    out = tmp_path / "export"
    assert main(["export", "--model", str(run), "--out", str(out)]) == 0
    assert "exported" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "README.md"} <= names
    assert not any(n.endswith((".bin", ".pt")) for n in names)  # no train_state.pt, no pickles
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    back = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    ids = torch.tensor([tok.encode("Delta rule", add_special_tokens=False)])
    with torch.no_grad():
        ref = model(ids).logits
        torch.testing.assert_close(back(ids).logits, ref, rtol=0, atol=2e-6)  # unaligned mmap (see above)
        assert torch.equal(load_model(out).model(ids).logits, ref)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == gen["pad_token_id"] == 256
    assert back.config.eos_token_id == 256
    assert "DDL-CC" in (out / "README.md").read_text()
    # the export is itself a model directory for every command
    assert resolve_model_dir(out).kind == "hf"
    assert load_model(out).tokenizer.encode("ab", add_special_tokens=False) == [97, 98]


def test_export_refuses_to_overwrite_or_eat_its_source(tmp_path, capsys):
    run, _ = make_run(tmp_path / "run")
    out = tmp_path / "export"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", "--model", str(run), "--out", str(out)]) == 2
    assert f"error: --out {out} exists and is not empty; set --overwrite" in capsys.readouterr().err
    assert (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="^`out_dir` .* is or contains the source model"):
        export_model(run / "checkpoints" / "step_0000007", run, overwrite=True)
    assert (run / "checkpoints" / "LATEST").is_file()
    with pytest.raises(ValueError, match=r"was not written by ddl export \(it has no ddl_export.json\)"):
        export_model(run, out, overwrite=True)  # --overwrite replaces an earlier export, never a user's files
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    export_model(run, out)
    export_model(run, out, overwrite=True)
    assert (out / "model.safetensors").is_file()


def test_export_of_a_real_training_run(tmp_path):
    """The trainer's own checkpoint (2 steps on byte data) exports and loads."""
    from deep_delta.data import ByteTokenizer, write_dataset
    from deep_delta.train import TrainConfig, train

    data = tmp_path / "data"
    write_dataset(["The delta rule writes a value along a direction. " * 40] * 4, ByteTokenizer(), data,
                  val_fraction=0.25)
    cfg = TrainConfig(variant="ddl-tc", preset="tiny", model=dict(hidden_size=32, num_hidden_layers=1,
                      num_attention_heads=2, max_position_embeddings=32), data=str(data), out=str(tmp_path / "run"),
                      steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_every=0, save_every=2, log_every=0,
                      device="cpu")
    train(cfg)
    export_model(tmp_path / "run", tmp_path / "hf")
    loaded = load_model(tmp_path / "hf")
    assert loaded.tokenizer.eos_token_id == 256 and loaded.model.config.vocab_size >= 257


def test_gpt2_checkpoint_offline_without_bpe_is_a_clear_cli_error(tmp_path, monkeypatch, capsys):
    import tiktoken

    def offline(name):
        raise ConnectionError("network unreachable")

    monkeypatch.delenv("DDL_GPT2_BPE", raising=False)
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    run, _ = make_run(tmp_path / "run", tokenizer="gpt2")
    assert main(["generate", "--model", str(run), "--prompt", "x"]) == 2
    assert "tokenizer 'gpt2'" in capsys.readouterr().err


@pytest.mark.parametrize("variant, design, says", [
    ("peri-ln", "additive", "additive with a norm on each sublayer's output (Peri-LN)"),
    ("attnres-block", "attnres", "Attention Residuals, Block"),
    ("ddl-cc-untied", "delta", "delta (the untied gates X + k (beta_w v^T - beta_e k^T X)"),
])
def test_the_model_card_describes_the_exported_design(tmp_path, variant, design, says):
    """Round 6's N20: each card said "the Deep Delta Learning residual", Peri-LN's and AttnRes's too. The card now
    names the model's own design, from the design's one line for it, and DDL's rule (the untied gates) where it is
    DDL."""
    run, _ = make_run(tmp_path / "run", variant=variant)
    assert main(["export", "--model", str(run), "--out", str(tmp_path / "export")]) == 0
    card = (tmp_path / "export" / "README.md").read_text()
    intro = card.split("\n\n")[2]
    assert intro.startswith(f"A decoder-only language model whose residual is {says}"), intro
    assert "the Deep Delta Learning residual" not in card and "(the baseline)" not in intro
    assert f"| residual design | {design} |" in card
    if design != "delta":
        assert "delta" not in intro.split(". Exported")[0], intro
