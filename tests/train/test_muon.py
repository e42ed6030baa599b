"""``TrainConfig.optimizer="muon"``: Muon on the hidden matrices and AdamW on the rest (train/optim.py): which
tensor goes where, the AdamW group's ratio, the muP rule for the Muon group, an exact resume, run.json's record
of the groups, and the settings refused."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from deep_delta.models import DDLConfig, DDLForCausalLM
from deep_delta.train import TrainConfig, train
from deep_delta.train.checkpoint import latest_checkpoint
from deep_delta.train.metrics import read_metrics
from deep_delta.train.optim import MuonWithAdamW, build_optimizer, optimizer_record
from helpers import DEBUG

# the hidden matrices, by name: the attention's and the MLP's own projections (modeling_ddl.py: Attention, SwiGLU)
HIDDEN = re.compile(r".*\.branch\.(q|k|v|o|gate|up|down)_proj\.weight")


def groups_by_name(model, optimizer) -> dict[str, list[str]]:
    """Tensor name -> the torch optimizers whose groups hold it (a tensor in two groups shows twice)."""
    where: dict[str, list[str]] = {}
    for group in optimizer_record(optimizer, model, "muon")["groups"]:
        for name in group["params"]:
            where.setdefault(name, []).append(group["optimizer"])
    return where


@pytest.mark.parametrize("variant, extra", [("baseline", {}), ("ddl-cc", {}), ("attnres-block", {}), ("hc", {}),
                                            ("baseline", {"tie_word_embeddings": False})],
                         ids=["baseline", "ddl-cc", "attnres-block", "hc", "baseline-untied-head"])
def test_muon_trains_the_hidden_matrices_and_adamw_everything_else(variant, extra):
    model = DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **DEBUG, **extra))
    optimizer = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95), optimizer="muon")
    where = groups_by_name(model, optimizer)
    names = [n for n, _ in model.named_parameters()]  # a tied tensor once
    assert sorted(where) == sorted(names), "every tensor in a group"
    assert all(len(w) == 1 for w in where.values()), [n for n, w in where.items() if len(w) > 1]
    muon = sorted(n for n, w in where.items() if w == ["muon"])
    assert muon == sorted(n for n in names if HIDDEN.fullmatch(n))
    assert len(muon) == 7 * DEBUG["num_hidden_layers"]
    # what the rule keeps out of Muon though it is 2-D: embeddings, head, the residuals' own matrices
    two_d_adamw = {n for n, p in model.named_parameters() if p.dim() == 2 and where[n] == ["adamw"]}
    assert "model.embed_tokens.weight" in two_d_adamw
    expected = {"baseline": set(), "attnres-block": set(),
                "ddl-cc": {"model.layers.0.attn.value_proj.weight", "model.layers.0.mlp.gate.proj.weight",
                           "model.layers.1.compressor.weight", "model.final_compressor.weight"},
                "hc": {"model.layers.0.attn.static_alpha", "model.layers.1.mlp.dynamic_proj"}}[variant]
    if extra:
        expected = {"lm_head.weight"}
    assert expected <= two_d_adamw
    assert all(p.dim() == 2 for p in optimizer.muon.param_groups[0]["params"])
    assert not any(not g["params"] for g in optimizer.param_groups), "no empty group (the checkpoints' state dict)"


def test_a_model_without_the_rule_gives_muon_its_2d_parameters_but_the_embeddings():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 10))
    optimizer = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95), optimizer="muon")
    where = groups_by_name(model, optimizer)
    assert where == {"0.weight": ["adamw"], "1.weight": ["muon"], "1.bias": ["adamw"], "2.weight": ["adamw"],
                     "2.bias": ["adamw"], "3.weight": ["muon"], "3.bias": ["adamw"]}


def test_the_adamw_group_trains_at_lr_times_the_ratio_and_muon_as_adamw_matches_rms():
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", **DEBUG))
    optimizer = build_optimizer(model, 2e-3, 0.1, (0.9, 0.95), optimizer="muon", adamw_lr_ratio=0.25)
    assert isinstance(optimizer, MuonWithAdamW) and optimizer.defaults["lr"] == 2e-3
    assert [g["initial_lr"] for g in optimizer.muon.param_groups] == [2e-3]
    assert {g["initial_lr"] for g in optimizer.adamw.param_groups} == {5e-4}
    muon = optimizer.muon.param_groups[0]
    assert (muon["momentum"], muon["nesterov"], muon["adjust_lr_fn"], muon["weight_decay"]) == (
        0.95, True, "match_rms_adamw", 0.1)
    assert [g["weight_decay"] for g in optimizer.adamw.param_groups] == [0.1, 0.0]  # matrices decay, vectors not
    # the schedule scales every group from its own base rate, and the run logs Muon's
    from deep_delta.train.optim import set_learning_rate

    assert set_learning_rate(optimizer, 0.5) == 1e-3
    assert [g["lr"] for g in optimizer.param_groups] == [1e-3, 2.5e-4, 2.5e-4]


def test_under_mup_the_muon_group_trains_at_lr_over_sqrt_m_and_adamw_keeps_its_multipliers():
    model = DDLForCausalLM(DDLConfig.from_variant("ddl-cc", "tiny", **{**DEBUG, "hidden_size": 128,
                                                                       "num_attention_heads": 4},
                                                  parametrization="mup", mup_base_width=32))
    optimizer = build_optimizer(model, 1e-2, 0.1, (0.9, 0.95), optimizer="muon", adamw_lr_ratio=0.5)
    (muon,) = optimizer.muon.param_groups  # m = 4: every hidden matrix in one group at lr / 2, decay x 2
    assert (muon["lr"], muon["weight_decay"], len(muon["params"])) == (5e-3, 0.2, 14)
    adamw = {(g["lr"], g["weight_decay"]) for g in optimizer.adamw.param_groups}
    # embeddings and vectors at lr x ratio; the readouts' weights (value and gate projections) at lr x ratio / m,
    # decay x m
    assert adamw == {(5e-3, 0.1), (5e-3, 0.0), (1.25e-3, 0.4)}


def test_under_mup_the_muon_update_has_a_width_independent_spectral_norm():
    """The muP rule for Muon (docs/mup.md, "Muon"): its update of a hidden matrix, scaled to AdamW's RMS, has a
    spectral norm ~ lr 0.2 sqrt(width); at lr / sqrt(m) it stays put as the width grows (the spectral condition,
    sqrt(fan_out / fan_in), is constant for these matrices), while under sp it grows like sqrt(width)."""
    def update_norms(parametrization: str) -> list[float]:
        norms = []
        for width in (64, 128, 256, 512):
            torch.manual_seed(0)
            model = DDLForCausalLM(DDLConfig.from_variant(
                "baseline", "tiny", hidden_size=width, num_hidden_layers=1, num_attention_heads=width // 32,
                vocab_size=64, parametrization=parametrization, mup_base_width=64))
            optimizer = build_optimizer(model, 1e-2, 0.0, (0.9, 0.95), optimizer="muon")
            q = model.model.layers[0].attn.branch.q_proj.weight
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            before = q.detach().clone()
            optimizer.step()
            norms.append(torch.linalg.matrix_norm(q.detach() - before, ord=2).item())
        return norms

    def slope(norms: list[float]) -> float:  # of log norm against log width, end to end
        return math.log(norms[-1] / norms[0]) / math.log(512 / 64)

    assert abs(slope(update_norms("mup"))) < 0.05
    assert slope(update_norms("sp")) == pytest.approx(0.5, abs=0.05)


def test_adamw_lr_ratio_is_refused_unless_the_optimizer_is_muon(tmp_path):
    with pytest.raises(ValueError, match=r"TrainConfig: `adamw_lr_ratio` got 0\.5; allowed: 1\.0 unless `optimizer` "
                                         "is muon"):
        TrainConfig(adamw_lr_ratio=0.5)
    with pytest.raises(ValueError, match=r"`adamw_lr_ratio` got 0\.0; allowed: a finite float > 0"):
        TrainConfig(optimizer="muon", adamw_lr_ratio=0.0)
    with pytest.raises(ValueError, match=r"`optimizer` got 'sgd'; allowed: adamw \| muon"):
        TrainConfig(optimizer="sgd")
    with pytest.raises(ValueError, match=r"`optimizer` got 'muon'; allowed: adamw under `distributed` fsdp"):
        TrainConfig(optimizer="muon", distributed="fsdp")
    assert TrainConfig(optimizer="muon", adamw_lr_ratio=0.5).adamw_lr_ratio == 0.5
    with pytest.raises(ValueError, match="`adamw_lr_ratio` got 0.5"):
        build_optimizer(torch.nn.Linear(2, 2), 1e-3, 0.1, (0.9, 0.95), adamw_lr_ratio=0.5)


def _steps(out):
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in read_metrics(out) if "loss" in r]


def test_a_muon_run_resumed_from_its_checkpoint_is_the_uninterrupted_run(tmp_path, make_config):
    """Bitwise on the CPU: every step's loss, gradient norm and lr, the validation, the final weights; the
    checkpoint holds both optimizers' state (Muon's momentum, AdamW's moments) without pickle."""
    settings = dict(optimizer="muon", adamw_lr_ratio=0.5, save_every=0)
    full = make_config(tmp_path / "full", **settings)
    train(full, progress=False, quiet=True)
    part = make_config(tmp_path / "part", **settings)
    train(part, stop_at=3, progress=False, quiet=True)
    state = json.loads((latest_checkpoint(part.out) / "train_state.json").read_text())["optimizer"]
    assert {"momentum_buffer"} <= set(json.dumps(state["state"]["model.layers.0.attn.branch.q_proj.weight"]).split('"'))
    train(part, resume=True, progress=False, quiet=True)
    assert _steps(part.out) == _steps(full.out) and len(_steps(full.out)) == full.steps
    vals = [[(r["step"], r["val_loss"]) for r in read_metrics(o) if "val_loss" in r] for o in (part.out, full.out)]
    assert vals[0][-1] == vals[1][-1]
    a = DDLForCausalLM.from_pretrained(latest_checkpoint(full.out)).state_dict()
    b = DDLForCausalLM.from_pretrained(latest_checkpoint(part.out)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # and Muon trained something else than AdamW does from the same start
    adamw = make_config(tmp_path / "adamw", save_every=0)
    train(adamw, progress=False, quiet=True)
    assert _steps(adamw.out)[0][1] == _steps(full.out)[0][1]  # the same first loss: same init and batch
    assert _steps(adamw.out)[1][1] != _steps(full.out)[1][1]


def test_run_json_records_which_tensor_trains_where(tmp_path, make_config):
    cfg = make_config(tmp_path / "run", optimizer="muon", adamw_lr_ratio=0.5, steps=1, eval_every=0)
    train(cfg, progress=False, quiet=True)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    record = run["optimizer"]
    assert record["name"] == "muon" and run["train_config"]["optimizer"] == "muon"
    assert [(g["optimizer"], g["lr"], g["weight_decay"]) for g in record["groups"]] == [
        ("muon", cfg.lr, 0.1), ("adamw", cfg.lr * 0.5, 0.1), ("adamw", cfg.lr * 0.5, 0.0)]
    muon = record["groups"][0]["params"]
    assert muon and all(HIDDEN.fullmatch(n) for n in muon)
    every = [n for g in record["groups"] for n in g["params"]]
    model = DDLForCausalLM.from_pretrained(latest_checkpoint(cfg.out))
    assert sorted(every) == sorted(n for n, _ in model.named_parameters())
    # the default: one AdamW, as every run before this setting trained
    plain = make_config(tmp_path / "plain", steps=1, eval_every=0)
    train(plain, progress=False, quiet=True)
    record = json.loads((tmp_path / "plain" / "run.json").read_text())["optimizer"]
    assert record["name"] == "adamw" and {g["optimizer"] for g in record["groups"]} == {"adamw"}


def _forget_the_optimizer_fields(out):
    """Make the run in ``out`` look recorded before `optimizer` and `adamw_lr_ratio` existed."""
    path = out / "run.json"
    run = json.loads(path.read_text())
    for key in ("train_config", "identity"):
        del run[key]["optimizer"], run[key]["adamw_lr_ratio"]
    path.write_text(json.dumps(run))
    meta_path = latest_checkpoint(out) / "train_meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["train_config"]["optimizer"], meta["train_config"]["adamw_lr_ratio"]
    meta_path.write_text(json.dumps(meta))


def test_a_run_recorded_before_the_optimizer_field_is_an_adamw_run(tmp_path, make_config):
    cfg = make_config(tmp_path / "run", steps=3, eval_every=0, save_every=2)
    train(cfg, stop_at=2, progress=False, quiet=True)
    _forget_the_optimizer_fields(tmp_path / "run")
    with pytest.raises(FileExistsError, match=r"optimizer: run has 'adamw', now 'muon'"):
        train(make_config(tmp_path / "run", steps=3, eval_every=0, save_every=2, optimizer="muon"), resume=True,
              progress=False, quiet=True)
    train(cfg, resume=True, progress=False, quiet=True)  # as an AdamW run it resumes
    assert [r["step"] for r in read_metrics(cfg.out) if "loss" in r] == [1, 2, 3]
