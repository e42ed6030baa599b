"""Model directories from elsewhere: planted code, pickles, corrupt or mismatched files, bit rot. Every refusal
is a one-line error naming the file and the cause (``ddl`` exits 2, no traceback); nothing planted ever runs,
even when every prompt on stdin is answered "y"."""

from __future__ import annotations

import builtins
import io
import json
import sys
from pathlib import Path

import pytest
import torch
from hf_helpers import cli_error, hf_dir, make_run
from safetensors.torch import load_file

from deep_delta.cli.main import main
from deep_delta.hf import load_model, resolve_model_dir
from helpers import tiny_model

# ---------------------------------------------------------------------- 1. code in a model directory never runs
PLANTED = """import pathlib
pathlib.Path({marker!r}).write_text("planted code ran")
"""


@pytest.fixture
def say_yes(monkeypatch, tmp_path):
    """Every prompt is answered "y" (the tester's stdin); transformers' module cache goes to tmp_path."""
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setattr(builtins, "input", lambda *a, **k: "y")
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 100))
    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.delenv("TRUST_REMOTE_CODE", raising=False)


def _plant(model_dir: Path, marker: Path, model_type: str = "evil") -> Path:
    """Python files that write ``marker`` when imported, named by config.json's and tokenizer_config.json's
    auto_map; config.json gets ``model_type``."""
    for name in ("configuration_evil", "modeling_evil", "tokenization_evil"):
        (model_dir / f"{name}.py").write_text(PLANTED.format(marker=str(marker)))
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg.update(model_type=model_type, architectures=["EvilForCausalLM"], auto_map={
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
        "AutoTokenizer": ["tokenization_evil.EvilTokenizer", None],
    })
    (model_dir / "config.json").write_text(json.dumps(cfg))
    if (model_dir / "tokenizer_config.json").is_file():
        tcfg = json.loads((model_dir / "tokenizer_config.json").read_text())
        tcfg.update(auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]})
        (model_dir / "tokenizer_config.json").write_text(json.dumps(tcfg))
    return model_dir


def _harness_without_tasks(monkeypatch):
    """``ddl eval lm-eval`` up to and including loading the model, without indexing lm-eval's tasks."""
    from deep_delta.eval import harness

    monkeypatch.setattr(harness, "require_lm_eval", lambda: None)
    monkeypatch.setattr(harness, "task_manager", lambda *a, **k: None)
    monkeypatch.setattr(harness, "check_tasks", lambda tasks, manager: tasks)


def _commands(model: Path, tmp_path: Path) -> dict[str, list[str]]:
    data = tmp_path / "data"
    if not data.exists():
        from deep_delta.data import ByteTokenizer, write_dataset

        write_dataset(["The delta rule writes a value along a direction. " * 20] * 4, ByteTokenizer(), data,
                      val_fraction=0.25)
    return {
        "generate": ["generate", "--model", str(model), "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu"],
        "export": ["export", "--model", str(model), "--out", str(tmp_path / "exported")],
        "eval-loss": ["eval", "loss", "--model", str(model), "--data", str(data), "--max-batches", "1",
                      "--device", "cpu"],
        "eval-lm-eval": ["eval", "lm-eval", "--model", str(model), "--tasks", "toy", "--device", "cpu",
                         "--out", str(tmp_path / "res.md")],
    }


@pytest.mark.parametrize("command", ["generate", "export", "eval-loss", "eval-lm-eval"])
def test_planted_code_of_an_unknown_model_type_never_runs(tmp_path, say_yes, monkeypatch, capsys, command):
    _harness_without_tasks(monkeypatch)
    marker = tmp_path / "planted-code-ran"
    model = _plant(hf_dir(tmp_path / "evil"), marker)
    argv = _commands(model, tmp_path)[command]
    cli_error(capsys, argv, str(model / "config.json"), "model_type 'evil'", "deep_delta")
    assert not marker.exists()
    assert not (tmp_path / "exported").exists()
    with pytest.raises(ValueError, match="model_type 'evil'"):
        load_model(model, tokenizer="byte")
    assert not marker.exists()


@pytest.mark.parametrize("command", ["generate", "export", "eval-loss", "eval-lm-eval"])
def test_planted_code_beside_a_deep_delta_config_never_runs(tmp_path, say_yes, monkeypatch, capsys, command):
    """model_type deep_delta + auto_map: our own classes load it; auto_map is ignored (and not exported)."""
    _harness_without_tasks(monkeypatch)
    from deep_delta.eval import harness

    monkeypatch.setattr(harness, "evaluate_harness", lambda *a, **k: {"name": k["name"], "results": {}})
    monkeypatch.setattr(harness, "results_table", lambda *a, **k: "| table |")
    monkeypatch.setattr(harness, "write_results", lambda out, *a, **k: Path(out))
    marker = tmp_path / "planted-code-ran"
    model = _plant(hf_dir(tmp_path / "m"), marker, model_type="deep_delta")
    assert main(_commands(model, tmp_path)[command]) == 0, capsys.readouterr().err
    assert not marker.exists()
    loaded = load_model(model)
    assert type(loaded.model).__name__ == "DDLForCausalLM"
    assert type(loaded.tokenizer).__module__.startswith("transformers.")
    assert not marker.exists()
    if command == "export":
        out = tmp_path / "exported"
        assert "auto_map" not in json.loads((out / "config.json").read_text())
        assert not list(out.glob("*.py"))


# ---------------------------------------------------------------------- 2. nothing pickled is ever opened
@pytest.fixture
def no_torch_load(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("torch.load was called while loading a model directory")

    monkeypatch.setattr(torch, "load", refuse)


def _index_dir(path: Path, shard: str) -> Path:
    """A sharded directory whose index points every weight at ``shard`` (written with torch.save)."""
    model = tiny_model("baseline")
    model.save_pretrained(path)
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    torch.save(state, path / shard)
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for k in state}}))
    return path


@pytest.mark.parametrize("shard", ["pytorch_model-00001-of-00001.bin", "weights.pt", "weights.pth"])
def test_an_index_naming_pickles_is_refused(tmp_path, no_torch_load, capsys, shard):
    model = _index_dir(tmp_path / "m", shard)
    with pytest.raises(ValueError, match=f"model.safetensors.index.json.*{shard}.*only safetensors"):
        load_model(model, tokenizer="byte")
    cli_error(capsys, ["generate", "--model", str(model), "--prompt", "x", "--tokenizer", "byte"],
               "model.safetensors.index.json", shard, "only safetensors")


def test_an_index_naming_a_file_outside_the_directory_is_refused(tmp_path, no_torch_load):
    model = tiny_model("baseline")
    model.save_pretrained(tmp_path / "elsewhere")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text((tmp_path / "elsewhere" / "config.json").read_text())
    state = load_file(str(tmp_path / "elsewhere" / "model.safetensors"))
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: "../elsewhere/model.safetensors" for k in state}}))
    with pytest.raises(ValueError, match="model.safetensors.index.json.*../elsewhere/model.safetensors"):
        load_model(tmp_path / "m", tokenizer="byte")


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.pth"])
def test_pickled_weights_alone_are_refused(tmp_path, no_torch_load, capsys, name):
    model = _index_dir(tmp_path / "m", name)
    (model / "model.safetensors.index.json").unlink()
    with pytest.raises(FileNotFoundError, match=f"{name}: pickled weights are never loaded.*only safetensors"):
        load_model(model, tokenizer="byte")
    cli_error(capsys, ["export", "--model", str(model), "--out", str(tmp_path / "out")], name, "only safetensors")
    with pytest.raises(FileNotFoundError, match=f"{name} is a pickled weight file.*only safetensors"):
        resolve_model_dir(model / name)


# ---------------------------------------------------------------------- 3. corrupt or mismatched files
@pytest.mark.parametrize("content", [b"", b"garbage, not a safetensors file", "truncated"])
def test_corrupt_weights_are_one_line_errors(tmp_path, capsys, content):
    model = hf_dir(tmp_path / "m")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2] if content == "truncated" else content)
    with pytest.raises(ValueError, match=f"{weights} is not a valid safetensors file"):
        load_model(model)
    cli_error(capsys, ["generate", "--model", str(model), "--prompt", "x"], str(weights),
               "not a valid safetensors file")


@pytest.mark.parametrize("text, needle", [
    ("{not json", "is not valid JSON"),
    ("", "is not valid JSON"),
    ("[1, 2]", "is not a JSON object"),
    (b"\xff\xfe\x00garbage", "is not valid JSON"),
])
def test_a_config_that_is_not_json_is_a_one_line_error(tmp_path, capsys, text, needle):
    model = hf_dir(tmp_path / "m")
    cfg = model / "config.json"
    cfg.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=needle):
        load_model(model)
    cli_error(capsys, ["generate", "--model", str(model), "--prompt", "x"], str(cfg), needle)


@pytest.mark.parametrize("field, value, needle", [
    ("hidden_size", "thirty-two", "`hidden_size`"),
    ("num_attention_heads", 3, "`num_attention_heads`"),
    ("compressor", "magic", "`compressor`"),
    ("beta_init", 7.0, "`beta_init`"),
    ("model_type", None, "model_type None"),
])
def test_a_config_with_bad_fields_names_the_file_and_field(tmp_path, capsys, field, value, needle):
    model = hf_dir(tmp_path / "m")
    cfg_path = model / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg[field] = value
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"{cfg_path}.*{needle}"):
        load_model(model)
    cli_error(capsys, ["generate", "--model", str(model), "--prompt", "x"], str(cfg_path), needle)


@pytest.mark.parametrize("change, needles", [
    ({"hidden_size": 64}, ["shape", "model.embed_tokens.weight"]),
    ({"num_hidden_layers": 3}, ["missing", "model.layers.2."]),
    ({"num_hidden_layers": 1}, ["no place for", "model.layers.1."]),
    ({"residual": "additive", "value_channels": 1, "compressor": "none", "compressor_kernel_size": None,
      "state_init": "repeat", "variant": "baseline"}, ["no place for"]),
    ({"tie_word_embeddings": False}, ["missing", "lm_head.weight"]),
])
def test_a_config_that_does_not_match_the_weights_is_refused(tmp_path, capsys, change, needles):
    """transformers would only warn about missing weights and initialise them at random."""
    model = hf_dir(tmp_path / "m")
    cfg_path = model / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **change}))
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(model)
    err = cli_error(capsys, ["generate", "--model", str(model), "--prompt", "x"], str(model / "model.safetensors"),
                     "config.json", *needles)
    assert len(err) < 600, err  # a few keys, not hundreds


def test_a_corrupt_saved_tokenizer_is_a_one_line_error(tmp_path, capsys):
    model = hf_dir(tmp_path / "m")
    (model / "tokenizer.json").write_text("{broken")
    cli_error(capsys, ["generate", "--model", str(model), "--prompt", "x"], str(model / "tokenizer.json"),
               "set --tokenizer to byte or gpt2")
    assert main(["generate", "--model", str(model), "--prompt", "x", "--max-new-tokens", "1",
                 "--tokenizer", "byte"]) == 0


def test_a_corrupt_train_meta_is_a_one_line_error(tmp_path, capsys):
    run, _ = make_run(tmp_path / "run")
    meta = run / "checkpoints" / "step_0000007" / "train_meta.json"
    meta.write_text("[]")
    cli_error(capsys, ["generate", "--model", str(run), "--prompt", "x"], str(meta), "not a JSON object")


# ---------------------------------------------------------------------- 4. checksums (export: test_export_safety)
def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # inside the last tensor: still a valid safetensors file
    path.write_bytes(bytes(data))


def test_checkpoint_bit_flip_is_refused(tmp_path, capsys):
    from deep_delta.fsutil import write_checksums

    run, _ = make_run(tmp_path / "run")
    ckpt = run / "checkpoints" / "step_0000007"
    write_checksums(ckpt)  # whether or not the trainer wrote one, the record of the original weights
    _flip_last_byte(ckpt / "model.safetensors")
    cli_error(capsys, ["generate", "--model", str(run), "--prompt", "x"], str(ckpt / "model.safetensors"))


@pytest.mark.parametrize("command", ["analyze", "eval-loss"])
def test_commands_without_a_tokenizer_option_never_tell_to_set_one(tmp_path, say_yes, capsys, command):
    """Before: `ddl analyze` and `ddl eval loss` on a model whose saved tokenizer is custom code refused, telling
    the user to set a `tokenizer` flag these commands do not have. They read token ids only: they go on without
    it, saying so; a command that has --tokenizer still refuses and names it."""
    marker = tmp_path / "planted-code-ran"
    model = _plant(hf_dir(tmp_path / "m"), marker, model_type="deep_delta")
    (model / "tokenizer.json").write_text("{broken")  # only the custom class could read it
    argv = {**_commands(model, tmp_path), "analyze": [
        "analyze", "--model", str(model), "--data", str(tmp_path / "data"), "--batch-size", "1", "--seq-len", "8",
        "--batches", "1", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "an")]}[command]
    capsys.readouterr()
    with pytest.warns(UserWarning, match="custom code named in auto_map.*reads token ids only, so it goes on"):
        assert main(argv) == 0
    assert "tokenizer" not in capsys.readouterr().err
    assert not marker.exists()
    cli_error(capsys, _commands(model, tmp_path)["generate"], "custom code", "set --tokenizer to byte or gpt2")
