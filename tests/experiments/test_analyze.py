"""``ddl analyze`` on models whose gates are set by hand, where every figure is known in advance."""

from __future__ import annotations

import json

import pytest
import torch

from deep_delta.experiments.analyze import analyze_model, format_analysis
from deep_delta.models import DDLConfig, DDLForCausalLM
from helpers import DEBUG

TINY = {**DEBUG, "max_position_embeddings": 32}


def _model(variant: str, logit: float, value_scale: float = 0.0) -> DDLForCausalLM:
    """Every gate outputs beta = 2 sigmoid(logit) for every token; v = value_scale * sigmoid(.)."""
    from deep_delta.layers.delta_residual import DeltaResidual

    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **TINY)).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, DeltaResidual):
                m.value_scale = value_scale
                for name, p in m.gate.named_parameters():
                    p.fill_(logit) if name.endswith("bias") else p.zero_()
    return model


def _batches(n=2):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (3, 16), generator=g) for _ in range(n)]


@pytest.mark.parametrize("variant", ["ddl-dv1", "ddl-cc", "ddl-tc"])
def test_every_beta_two_is_a_reflection_that_flips_the_k_component(variant):
    # beta = 2, v = 0: k^T X' = (1 - 2) k^T X = -k^T X, same size, opposite sign
    report = analyze_model(_model(variant, 50.0), _batches())
    assert len(report["sublayers"]) == 4 and report["windows"] == 6
    for r in report["sublayers"].values():
        b = r["beta"]
        assert b["mean"] == 2.0 and b["share_reflection"] == 1.0 and b["share_identity"] == 0.0
        assert r["k_component"]["ratio_after_before"] == pytest.approx(1.0, abs=1e-4)  # fp32 update
        assert r["k_component"]["share_sign_flipped"] == 1.0
        assert r["v"]["mean"] == 0.0 and r["tokens"] == 6 * 16


def test_every_beta_one_erases_the_k_component():
    # beta = 1, v = 0: the update projects the state onto the plane orthogonal to k: k^T X' = 0
    report = analyze_model(_model("ddl-cc", 0.0), _batches())
    for r in report["sublayers"].values():
        assert r["beta"]["share_projection"] == 1.0 and r["beta"]["quantiles"]["0.5"] == 1.0
        assert r["k_component"]["ratio_after_before"] == pytest.approx(0.0, abs=1e-4)


def test_small_beta_is_the_identity_and_figures_match_a_hand_computation():
    """beta = 2 sigmoid(-6) ~ 0.005; the k-component ratio equals |1 - beta| (v = 0) computed by hand."""
    model = _model("ddl-dv1", -6.0)
    beta = 2 * torch.sigmoid(torch.tensor(-6.0)).item()
    report = analyze_model(model, _batches())
    for r in report["sublayers"].values():
        assert r["beta"]["share_identity"] == 1.0
        assert r["beta"]["mean"] == pytest.approx(beta, rel=1e-6)
        assert r["k_component"]["ratio_after_before"] == pytest.approx(1 - beta, rel=1e-5)
        assert r["k_component"]["share_sign_flipped"] == 0.0
    # the cosine between successive directions, by hand from the branch outputs of the first block
    k = {}
    hooks = [model.model.layers[0].attn.branch.register_forward_hook(lambda m, a, o: k.setdefault("attn", o)),
             model.model.layers[0].mlp.branch.register_forward_hook(lambda m, a, o: k.setdefault("mlp", o))]
    with torch.no_grad():
        model(torch.cat(_batches(1)), use_cache=False)
    for h in hooks:
        h.remove()
    eps = model.model.layers[0].attn.k_eps
    unit = {n: t.double() / torch.sqrt((t.double() ** 2).sum(-1, keepdim=True) + eps ** 2) for n, t in k.items()}
    want = (unit["attn"] * unit["mlp"]).sum(-1).mean().item()
    got = analyze_model(model, _batches(1))["sublayers"]["model.layers.0.mlp"]["cos_previous_k"]["mean"]
    assert got == pytest.approx(want, abs=1e-6)


def test_compressors_at_init_read_the_plain_mean():
    report = analyze_model(_model("ddl-tc", 0.0, value_scale=4.0), _batches())
    assert set(report["compressor_drift"]) == {"model.layers.0", "model.layers.1"}
    assert all(v < 1e-6 for v in report["compressor_drift"].values())


def test_the_baseline_gets_the_state_through_the_depth():
    """The additive baseline has no beta or k, but a state: its norm entering and leaving each sublayer and the
    update's, equal to a hand computation from hooks on the first sublayer."""
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("baseline", "tiny", **TINY)).eval()
    seen = []
    handle = model.model.layers[0].attn.register_forward_hook(lambda m, a, o: seen.append((a[0].double(),
                                                                                         o.double())))
    report = analyze_model(model, _batches(1))
    handle.remove()
    assert report["probes"] == ["embedding", "state"] and len(report["states"]) == 2 * TINY["num_hidden_layers"]
    x, new = seen[0]
    first = report["states"]["model.layers.0.attn"]
    assert first["norm_before"] == pytest.approx(float(x.norm(dim=-1).mean()), rel=1e-9)
    assert first["update_norm"] == pytest.approx(float((new - x).norm(dim=-1).mean()), rel=1e-9)


@pytest.mark.parametrize("variant", ["ddl-dv1", "ddl-cc"])
def test_the_erased_share_and_the_write_only_control(variant):
    """beta = 1 and v = 0: the delta update is X - k k^T X, so the share it erases is the update's size over the
    state's (the state probe's figure); its write-only twin on the same weights writes beta k v^T = 0 and erases
    nothing, while the delta rule would erase as much from the twin's states."""
    ddl = _model(variant, 0.0)
    twin = _model(f"{variant}-write", 0.0)
    twin.load_state_dict(ddl.state_dict())
    for model, rule in ((ddl, "delta"), (twin, "write")):
        report = analyze_model(model, _batches(1))
        assert report["probes"] == ["embedding", "state", "delta"]
        for name, r in report["sublayers"].items():
            assert r["rule"] == rule and r["delta_would_erase"] > 0.01
            state = report["states"][name]
            if rule == "delta":
                assert r["erased"] == pytest.approx(r["delta_would_erase"])
                assert r["erased"] == pytest.approx(state["update_relative"], rel=1e-3), name
            else:
                assert r["erased"] == 0.0 and state["update_norm"] == 0.0, name


def test_cli_writes_json_table_and_figures(tmp_path, capsys):
    from deep_delta.cli.main import main
    from deep_delta.data import ByteTokenizer, write_dataset

    data = tmp_path / "data"
    write_dataset(["some text to read " * 40, "another document here " * 40], ByteTokenizer(), data,
                  val_fraction=0.5)
    model_dir = tmp_path / "model"
    torch.manual_seed(0)
    DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", **{**TINY, "vocab_size": 257})).save_pretrained(model_dir)
    out = tmp_path / "an"
    assert main(["analyze", "--model", str(model_dir), "--data", str(data), "--batch-size", "2", "--seq-len", "16",
                 "--batches", "2", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    report = json.loads((out / "analysis.json").read_text())
    assert report["windows"] == 4 and len(report["sublayers"]) == 4
    assert "| layers.0.attn |" in capsys.readouterr().out
    for png in ("beta_regimes.png", "beta_quantiles.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def _run_with_checkpoint(tmp_path):
    """A run directory laid out as training writes it: RUN/checkpoints/step_0000003 (a model) and LATEST."""
    from safetensors.torch import save_file

    from deep_delta.fsutil import write_checksums

    run = tmp_path / "run"
    step = run / "checkpoints" / "step_0000003"
    torch.manual_seed(0)
    DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", **{**TINY, "vocab_size": 257})).save_pretrained(step)
    (step / "train_state.json").write_text("{}")  # the training state is not read by analyze
    save_file({}, str(step / "train_state.safetensors"))
    (step / "train_meta.json").write_text(json.dumps({"step": 3, "tokenizer": "byte"}))
    write_checksums(step)
    (run / "checkpoints" / "LATEST").write_text("step_0000003\n")
    return run, step


def _data(tmp_path):
    from deep_delta.data import ByteTokenizer, write_dataset

    data = tmp_path / "data"
    write_dataset(["some text to read " * 40, "another document here " * 40], ByteTokenizer(), data,
                  val_fraction=0.5)
    return data


ARGS = ["--batch-size", "2", "--seq-len", "16", "--batches", "1", "--no-progress", "--device", "cpu"]


def test_analyzing_a_checkpoint_writes_beside_the_checkpoints_never_inside_them(tmp_path, capsys):
    """Before: `ddl analyze --model RUN/checkpoints/step_N` wrote step_N/analysis/, which the next resume's
    rotation deleted with the checkpoint."""
    from deep_delta.cli.main import main

    run, step = _run_with_checkpoint(tmp_path)
    data = _data(tmp_path)
    assert main(["analyze", "--model", str(step), "--data", str(data), *ARGS]) == 0
    assert not (step / "analysis").exists()
    assert (run / "analysis" / "step_0000003" / "analysis.json").is_file()
    assert main(["analyze", "--model", str(run), "--data", str(data), *ARGS]) == 0
    assert (run / "analysis" / "analysis.json").is_file()
    capsys.readouterr()


@pytest.mark.parametrize("inside", ["checkpoints", "checkpoints/step_0000003/analysis", "data/figures"])
def test_an_out_inside_a_rotated_or_replaced_directory_is_refused_naming_out(tmp_path, capsys, inside):
    from deep_delta.cli.main import main

    run, step = _run_with_checkpoint(tmp_path)
    data = _data(tmp_path)
    out = (run if inside.startswith("checkpoints") else tmp_path) / inside
    assert main(["analyze", "--model", str(step), "--data", str(data), "--out", str(out), *ARGS]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "lost" in err and "Traceback" not in err
    assert not (out / "analysis.json").exists()


def test_data_that_is_a_file_is_named_as_a_file(tmp_path, capsys):
    from deep_delta.cli.main import main

    _, step = _run_with_checkpoint(tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("plain text, not prepared")
    assert main(["analyze", "--model", str(step), "--data", str(text), "--out", str(tmp_path / "an"), *ARGS]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "prepared data directory" in err and "does not exist" not in err


def test_the_twins_table_says_which_figures_are_the_delta_rules(tmp_path):
    """T3: the write-only twin's table showed beta's identity / projection / reflection shares and k^T X
    after/before, figures of the delta rule's action, which its update (nothing read, nothing erased) does not
    have. They are "n/a" for the twin (None in the JSON), with a line saying why; the DDL variant keeps them."""
    from deep_delta.experiments.analyze import format_analysis as format_report

    twin = analyze_model(_model("ddl-cc-write", 50.0), _batches(1))
    ddl = analyze_model(_model("ddl-cc", 50.0), _batches(1))
    for r in twin["sublayers"].values():
        assert r["beta"]["mean"] == 2.0 and r["beta"]["share_reflection"] is None
        assert r["k_component"]["ratio_after_before"] is None and r["k_component"]["share_sign_flipped"] is None
    def delta_rows(report):  # the delta probe's table: 12 columns
        return [line.split(" | ") for line in format_report(report).splitlines()
                if line.startswith("| layers.") and line.count(" | ") == 11]

    assert len(delta_rows(twin)) == 4 and all(cells[3:8] == ["n/a"] * 5 for cells in delta_rows(twin))
    assert "do not apply to it" in format_report(twin)
    assert len(delta_rows(ddl)) == 4 and all(cells[5] == "1.00" for cells in delta_rows(ddl))
    assert "n/a" not in format_report(ddl)
    from deep_delta.experiments.analyze import plot_analysis

    drawn = {p.name for p in plot_analysis(twin, tmp_path)}  # no regime heat map for the twin
    assert "beta_quantiles.png" in drawn and "beta_regimes.png" not in drawn


def test_the_embedding_entering_the_stream_is_reported_before_and_after_its_norm():
    """Issue 64: what enters the residual stream, the embedding's mean norm per token, and with ``embed_norm`` the
    normed embedding's, equal to a hand computation; the report's text says both."""
    torch.manual_seed(0)
    model = DDLForCausalLM(DDLConfig.from_variant("baseline", "tiny", **TINY, embed_norm=True)).eval()
    batches = _batches(1)
    report = analyze_model(model, batches)
    ids = batches[0]
    with torch.no_grad():
        e = model.model.embed_tokens(ids).double()
        n = model.model.embed_norm(model.model.embed_tokens(ids)).double()
    got = report["embedding"]
    assert abs(got["embed_tokens"] - float(e.norm(dim=-1).mean())) < 1e-9
    assert abs(got["embed_norm"] - float(n.norm(dim=-1).mean())) < 1e-9
    assert got["embed_norm"] > 10 * got["embed_tokens"]  # std 0.02: the raw embedding enters tiny
    text = format_analysis(report)
    assert "after the embedding norm" in text
    plain = analyze_model(DDLForCausalLM(DDLConfig.from_variant("baseline", "tiny", **TINY)).eval(), batches)
    assert set(plain["embedding"]) == {"embed_tokens"} and "after the embedding norm" not in format_analysis(plain)
