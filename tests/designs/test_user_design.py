"""A residual design of a user's own in every tool (issue 65, item 2): tests/designs/rezero_design.py, which nothing
under src/ knows, named by its file, trains (``ddl train``), compares (``ddl compare``, beside the baseline), is
analysed (``ddl analyze``: its own probe), exports (``ddl export``), loads (``from_pretrained`` in a fresh process,
which imports the design's module from the saved config) and generates (``ddl generate``). A saved model whose
design's module is not installed says which module is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from deep_delta.cli.main import main
from deep_delta.designs.registry import design_names, get_design

DESIGN_FILE = str(Path(__file__).with_name("rezero_design.py").resolve())


@pytest.fixture(autouse=True, scope="module")
def _registry_as_it_was():
    """What these tests register (the design, its variant and its table name) is gone after them, so that the
    tests run after them in the same process see the shipped designs only."""
    from deep_delta.designs import registry
    from deep_delta.variants import PAPER_NAMES, VARIANTS

    saved = [dict(d) for d in (VARIANTS, PAPER_NAMES, registry._DESIGNS, registry._MODULE_OF, registry._LOADED,
                                registry._module_names)]
    yield
    for d, old in zip((VARIANTS, PAPER_NAMES, registry._DESIGNS, registry._MODULE_OF, registry._LOADED,
                       registry._module_names), saved):
        for key in set(d) - set(old):
            if key not in registry.BUILTIN:  # a shipped design first imported meanwhile stays registered
                del d[key]
SMALL = ["--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=2", "--set", "model.num_attention_heads=2",
         "--set", "model.max_position_embeddings=64", "--set", f"model.design_module={DESIGN_FILE}",
         "--set", "model.design_settings={alpha_init: 0.1}"]
STEPS = ["--steps", "4", "--batch-size", "2", "--seq-len", "16", "--eval-every", "2", "--eval-batches", "1",
         "--warmup-steps", "1", "--threads", "1", "--no-progress", "--device", "cpu"]


def test_the_design_is_registered_by_its_file_with_its_variant():
    from deep_delta.designs.registry import load_design_module
    from deep_delta.variants import VARIANTS, paper_name

    load_design_module(DESIGN_FILE)
    assert "rezero" in design_names() and get_design("rezero").name == "rezero"
    assert VARIANTS["rezero"] == {"residual": "rezero"} and paper_name("rezero") == "ReZero"


def test_train_compare_analyze_export_load_generate(tmp_path, data_dir, capsys):
    run = tmp_path / "run"
    assert main(["train", "--variant", "rezero", "--data", str(data_dir), "--out", str(run), *SMALL, *STEPS]) == 0
    record = json.loads((run / "run.json").read_text())
    assert record["model_config"]["residual"] == "rezero"
    assert record["model_config"]["design_module"] == DESIGN_FILE
    assert record["model_config"]["design_settings"] == {"alpha_init": 0.1}

    # beside the baseline in one comparison (the same settings for both: the design's module is imported for every
    # run, the baseline's too; the design's settings are left at their defaults, which the baseline has none of)
    cmp = tmp_path / "cmp"
    assert main(["compare", "--variants", "baseline", "rezero", "--data", str(data_dir), "--out", str(cmp),
                 "--time-repeats", "0", *_sets_without_settings(), *STEPS]) == 0
    report = (cmp / "compare.md").read_text()
    assert "| ReZero | rezero |" in report

    an = tmp_path / "an"
    assert main(["analyze", "--model", str(run), "--out", str(an), "--threads", "1", "--data", str(data_dir),
                 "--batches", "1", "--batch-size", "2", "--seq-len", "16", "--no-progress"]) == 0
    analysis = json.loads((an / "analysis.json").read_text())
    assert analysis["probes"] == ["embedding", "rezero"] and len(analysis["rezero"]) == 4

    ex = tmp_path / "ex"
    assert main(["export", "--model", str(run), "--out", str(ex)]) == 0
    card = (ex / "README.md").read_text()
    assert "ReZero (x + alpha F(x), alpha from 0.1)" in card
    capsys.readouterr()

    # a fresh process, which has imported nothing of the design: the saved config names its module
    code = ("import sys, torch, deep_delta\n"
            "from transformers import AutoModelForCausalLM\n"
            f"m = AutoModelForCausalLM.from_pretrained({str(ex)!r}).eval()\n"
            "ids = torch.tensor([[1, 2, 3, 4, 5]])\n"
            "print(type(m.model.layers[0].attn).__name__, float(m.model.layers[0].attn.alpha))\n"
            "print(m(ids).logits[0, -1, :4].tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    name, alpha = out.stdout.splitlines()[0].split()
    from deep_delta.hf import load_model

    here = load_model(run).model.eval()
    assert name == "ReZeroResidual" and float(alpha) == pytest.approx(float(here.model.layers[0].attn.alpha.detach()))
    with torch.no_grad():
        want = here(torch.tensor([[1, 2, 3, 4, 5]])).logits[0, -1, :4].tolist()
    assert json.loads(out.stdout.splitlines()[1]) == pytest.approx(want, rel=1e-5, abs=1e-6)

    assert main(["generate", "--model", str(ex), "--prompt", "The ", "--greedy", "--max-new-tokens", "8",
                 "--threads", "1"]) == 0
    assert capsys.readouterr().out.strip()


def _sets_without_settings() -> list[str]:
    """The model settings of SMALL for a comparison of the baseline and rezero: the design's module (so that the
    variant is known), the shape; not the design's settings (the baseline's design has none)."""
    out = []
    for key, value in zip(SMALL[::2], SMALL[1::2]):
        if not value.startswith("model.design_settings"):
            out += [key, value]
    return out


def test_a_saved_model_whose_design_module_is_missing_names_it(tmp_path):
    from deep_delta import DDLConfig, DDLForCausalLM

    model = DDLForCausalLM(DDLConfig.from_variant("rezero", "tiny", hidden_size=16, num_hidden_layers=1,
                                                  num_attention_heads=2, design_module=DESIGN_FILE))
    model.save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["residual"], cfg["design_module"] = "elsewhere", "not_installed_pkg.designs"
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    from deep_delta.hf import load_model

    with pytest.raises(ValueError, match=r"`design_module` got 'not_installed_pkg.designs', which cannot be imported "
                                         r".*install the package that provides it"):
        load_model(tmp_path / "m")


def test_its_settings_are_checked_by_its_settings_class():
    from deep_delta import DDLConfig

    with pytest.raises(ValueError, match=r"`alpha_init` got -1; allowed: a float >= 0"):
        DDLConfig.from_variant("rezero", design_module=DESIGN_FILE, design_settings={"alpha_init": -1})
    with pytest.raises(ValueError, match=r"`design_settings` names \['beta'\] for the design 'rezero'; allowed: "
                                         r"alpha_init"):
        DDLConfig.from_variant("rezero", design_module=DESIGN_FILE, design_settings={"beta": 1})
    with pytest.raises(ValueError, match=r"`design_settings` got \{'alpha_init': 0.5\}; allowed: None with "
                                         r"residual='additive'"):
        DDLConfig.from_variant("baseline", design_settings={"alpha_init": 0.5})
