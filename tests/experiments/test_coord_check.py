"""The coordinate check at reduced size: muP keeps every activation's width exponent, sp and muP without its
learning-rate scaling do not (docs/mup.md has the full-size run)."""

from __future__ import annotations

import json

import pytest
import torch

from deep_delta.experiments.coord_check import coord_table, run_coord_check, violations
from deep_delta.experiments.settings import MUP_SLOPE_BOUND, CoordCheckSettings

# 64 tokens a step: widths above the tokens per step are where muP's limit is near (a readout's update sums
# over tokens, and their cross terms ~ sqrt(tokens * d) stop mattering once d > tokens).
SMALL = dict(variants=("baseline", "ddl-cc"), widths=(32, 64, 128, 256), steps=3, batch_size=2, seq_len=32,
             seeds=(0,))


@pytest.fixture(scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_mup_keeps_the_width_exponents_and_sp_does_not(one_thread):
    report = run_coord_check(CoordCheckSettings(**SMALL))
    assert violations(report) == [], coord_table(report)
    for variant in SMALL["variants"]:
        change = report["slopes"]["sp"][variant]["change"]
        # sp: Adam moves each weight by ~lr whatever the width, so what a layer's update changes grows ~ width
        assert change["logits"][-1] > MUP_SLOPE_BOUND, coord_table(report)
        assert change["mlp_out"][-1] > 2 * MUP_SLOPE_BOUND, coord_table(report)
        # the sizes are kept beside the changes, one slope per recorded forward (init, then after each step)
        assert len(report["slopes"]["mup"][variant]["size"]["logits"]) == SMALL["steps"] + 1
        assert len(report["slopes"]["mup"][variant]["change"]["logits"]) == SMALL["steps"]
    # the DDL write k v^T: without v ~ sqrt(d) its per-coordinate size would fall like 1/sqrt(d), as under sp
    assert report["slopes"]["sp"]["ddl-cc"]["change"]["update"][-1] < -0.4
    assert report["slopes"]["mup"]["ddl-cc"]["change"]["update"][-1] > -0.3
    json.dumps(report)  # the CLI writes it as JSON


def test_mup_without_its_learning_rate_scaling_fails_the_check(one_thread):
    settings = CoordCheckSettings(**{**SMALL, "variants": ("baseline",), "parametrizations": ("mup",)})
    report = run_coord_check(settings, lr_multipliers=lambda model: {})
    assert any(v.startswith(("baseline/mlp_out", "baseline/attn_out")) for v in violations(report)), \
        coord_table(report)


CLI = ["coord-check", "--variants", "baseline", "--widths", "32", "64", "128", "256", "--steps", "3",
       "--batch-size", "2", "--seq-len", "32", "--parametrizations", "mup", "--threads", "1"]


def test_the_command_exits_1_on_a_broken_mup_rule(tmp_path, monkeypatch, one_thread, capsys):
    from deep_delta.cli.main import main
    from deep_delta.models.ddl.modeling_ddl import DDLPreTrainedModel

    assert main(CLI + ["--out", str(tmp_path / "right")]) == 0
    assert "mup: every change's slope within" in capsys.readouterr().out
    # a broken rule: the hidden matrices at the base learning rate whatever the width
    monkeypatch.setattr(DDLPreTrainedModel, "lr_multipliers", lambda self: {})
    assert main(CLI + ["--out", str(tmp_path / "broken")]) == 1
    out = capsys.readouterr().out
    assert "change slope(s) beyond" in out and "baseline/mlp_out" in out
    assert "change last" in (tmp_path / "broken" / "coord_check.md").read_text()


# The logits' change after a few small AdamW steps (lr 2e-4: Adam's first steps stay in the linear regime),
# widths 32..256 at base 256. Tied, the LM head is the embedding, whose random init reads the body's change
# on every token, a part that shrinks like width^-1/2 under muP; untied, muP's zero-init head (docs/mup.md).
LOGITS = dict(SMALL, lr=2e-4)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_mup_logit_change_is_flat_with_an_untied_zero_head(tied, one_thread):
    params = ("mup",) if tied else ("sp", "mup")
    report = run_coord_check(CoordCheckSettings(**LOGITS, parametrizations=params,
                                                model={"tie_word_embeddings": tied}))
    for variant in LOGITS["variants"]:
        mup = report["slopes"]["mup"][variant]["change"]["logits"][-1]
        if tied:
            assert mup < -0.3, coord_table(report)  # the rule before: fails the muP promise
        else:
            assert abs(mup) <= 0.3, coord_table(report)
            assert report["slopes"]["sp"][variant]["change"]["logits"][-1] > 0.6, coord_table(report)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="`widths` got"):
        run_coord_check(CoordCheckSettings(widths=(48, 64), head_dim=32))
    with pytest.raises(ValueError, match=r"`widths` got \[32, 32\]; allowed: two or more different"):
        run_coord_check(CoordCheckSettings(widths=(32, 32)))  # no slope from one width (a ZeroDivisionError)
    with pytest.raises(ValueError, match="`head_dim` got 0; allowed: an integer >= 1"):
        run_coord_check(CoordCheckSettings(head_dim=0))  # checked before it divides the widths
    with pytest.raises(ValueError, match="`variants` got"):
        run_coord_check(CoordCheckSettings(variants=("nope",)))


@pytest.mark.parametrize("argv, says", [
    (["--widths", "32", "32"], "--widths got [32, 32]; allowed: two or more different multiples of"),
    (["--head-dim", "0"], "--head-dim got 0; allowed: an integer >= 1"),
    (["--widths", "32", "1048576"], "a model of width 1048576 needs at least"),  # ~400 TB: refused by estimate
], ids=["same-width-twice", "head-dim-0", "width-beyond-memory"])
def test_bad_widths_are_one_line_errors_before_anything_is_allocated(tmp_path, capsys, argv, says):
    """Before: ZeroDivisionError (--widths 32 32, --head-dim 0) and an unmapped RuntimeError from a 4 TB
    allocation, each a traceback."""
    from deep_delta.cli.main import main

    assert main(["coord-check", *argv, "--out", str(tmp_path / "cc"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "cc").exists()


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you tried to "
                 "allocate 4398046511104 bytes."),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 TiB."),
    MemoryError(),
], ids=["cpu-allocator", "cuda", "python"])
def test_an_allocation_that_fails_is_named_out_of_memory(error):
    from deep_delta.cli.main import describe_error

    message, code = describe_error(error)
    assert message.startswith("out of memory") and code == 1


def test_a_result_path_that_is_a_directory_is_refused_before_the_models_train(tmp_path, capsys, monkeypatch):
    import deep_delta.experiments.coord_check as cc
    from deep_delta.cli.main import main

    monkeypatch.setattr(cc, "measure", lambda *a, **k: pytest.fail("a model trained before the outputs were checked"))
    (tmp_path / "cc" / "coord_check.md").mkdir(parents=True)
    assert main(["coord-check", "--widths", "32", "64", "--out", str(tmp_path / "cc"), "--device", "cpu"]) == 2
    assert f"{tmp_path / 'cc' / 'coord_check.md'} is a directory" in capsys.readouterr().err


def test_the_new_designs_own_parts_have_rows(one_thread):
    """Round 6's N8: AttnRes's depth attention (what each pseudo-query reads, and the readout's) and the untied
    rule's write gate beside its erase gate each have a row of their own; the other designs have neither."""
    report = run_coord_check(CoordCheckSettings(variants=("attnres-block", "ddl-cc-untied", "ddl-cc"), widths=(32, 64),
                                                parametrizations=("mup",), steps=1, layers=1, batch_size=1,
                                                seq_len=16))
    rows = {v: set(per["change"]) for v, per in report["slopes"]["mup"].items()}
    assert "depth_read" in rows["attnres-block"] and not {"beta", "beta_write"} & rows["attnres-block"]
    assert {"beta", "beta_logit", "beta_write", "beta_write_logit"} <= rows["ddl-cc-untied"]
    assert "beta_write" not in rows["ddl-cc"] and "depth_read" not in rows["ddl-cc"]
    init = report["results"]["mup"]["ddl-cc-untied"]["32"][0]["size"]
    assert init["beta_write"] == pytest.approx(init["beta"])  # the two gates start equal (at beta_init)
    table = coord_table(report)
    assert "| attnres-block | depth_read |" in table and "| ddl-cc-untied | beta_write |" in table
