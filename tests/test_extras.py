"""Any install runs what it offers: the package alone (no extra installed) runs the main job, `ddl compare` on the
embedded text, to a written compare.md (the report without its figures, saying which extra draws them), and
`ddl analyze` likewise; every command that needs an optional package says so in one line, naming its extra, before
any work. The optional packages are blocked in a fresh process (``sys.modules[name] = None``: ``import name``
fails and ``importlib.util.find_spec(name)`` finds nothing, as when the package is not installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from deep_delta.extras import EXTRAS, PACKAGE

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--set", "model.hidden_size=32", "--set", "model.num_hidden_layers=1", "--set",
         "model.num_attention_heads=2", "--set", "model.max_position_embeddings=64"]
# the distribution that installs each import name, where they differ
DISTRIBUTIONS = {"lm_eval": "lm-eval"}

# The child: block every optional package, then run each command in-process and report its exit code and output.
CHILD = """
import contextlib, io, json, sys
from deep_delta.extras import EXTRAS
for name in EXTRAS:
    sys.modules[name] = None
from deep_delta.cli.main import main
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results[name] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
    # what the commands imported of the optional packages: nothing (a blocked import cannot succeed)
    assert not any(sys.modules.get(m) for m in EXTRAS), name
print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory):
    """Every command of the table, run in one process with no optional package importable; the embedded text is
    prepared into a fresh cache."""
    root = tmp_path_factory.mktemp("no-extras")
    cmp = root / "cmp"
    (root / "rows.parquet").write_bytes(b"PAR1 not read")  # refused before it is opened
    (root / "doc.txt").write_text("some text\n")
    train = ["train", "--config", "debug", "--variant", "ddl-dv1", "--device", "cpu", "--no-progress", "--steps", "1"]
    commands = {
        "compare": ["compare", "--variants", "baseline", "ddl-dv1", "--out", str(cmp), "--steps", "2",
                    "--batch-size", "2", "--seq-len", "16", "--eval-every", "2", "--eval-batches", "1",
                    "--warmup-steps", "0", "--device", "cpu", "--threads", "1", "--no-progress", "--time-repeats",
                    "0", *MODEL],
        "report-only": ["compare", "--out", str(cmp), "--report-only"],
        "analyze": ["analyze", "--model", str(cmp / "ddl-dv1"), "--batches", "1", "--batch-size", "2", "--seq-len",
                    "16", "--device", "cpu", "--no-progress", "--out", str(root / "analysis")],
        "coord-check": ["coord-check", "--variants", "baseline", "--widths", "16", "32", "--parametrizations", "mup",
                        "--steps", "1", "--layers", "1", "--head-dim", "8", "--batch-size", "2", "--seq-len", "8",
                        "--seeds", "1", "--device", "cpu", "--threads", "1", "--out", str(root / "coord")],
        "tasks": ["tasks", "run", "flip-flop", "--variants", "baseline", "--seeds", "1", "--steps", "2", "--threads", "1",
                  "--no-progress", "--device", "cpu", "--set", "test_size=8", "--set", "eval_size=8", "--set",
                  "batch_size=4", "--set", "model.hidden_size=16", "--set", "model.num_hidden_layers=1", "--set",
                  "model.num_attention_heads=2", "--out", str(root / "tk")],
        "gpt2 tokenizer": ["data", "prepare", "--source", str(root / "doc.txt"), "--tokenizer", "gpt2", "--out",
                           str(root / "gpt2"), "--no-progress"],
        "parquet": ["data", "prepare", "--source", str(root / "rows.parquet"), "--out", str(root / "pq"),
                    "--no-progress"],
        "fineweb": ["data", "prepare", "--source", "fineweb-edu", "--out", str(root / "fw"), "--no-progress"],
        "lm-eval": ["eval", "lm-eval", "--model", str(cmp / "ddl-dv1"), "--out", str(root / "lm.md")],
        "traffic": ["bench-kernels", "--traffic", "--device", "cpu", "--variants", "ddl-cc"],
        "tensorboard": [*train, "--tensorboard", "--out", str(root / "tb")],
        "wandb": [*train, "--wandb", "--out", str(root / "wb")],
        "wandb compare": ["compare", "--config", "debug", "--variants", "baseline", "--steps", "1", "--time-repeats",
                          "0", "--device", "cpu", "--no-progress", "--wandb", "--out", str(root / "wbc")],
        "triton train": [*train, "--set", "model.delta_backend=triton", "--out", str(root / "tri")],
        "triton train corrected": [*train, "--out", str(root / "tri")],
    }
    env = {**os.environ, "DDL_CACHE_DIR": str(root / "cache"), "PYTHONPATH": str(ROOT / "src"),
           "WANDB_MODE": "offline", "WANDB_DIR": str(root / "wandb-dir")}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(commands)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULTS "))
    return root, json.loads(line[len("RESULTS "):])


def _one_line(result: dict, *needles: str) -> None:
    err = result["err"]
    assert result["code"] == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def test_the_main_job_runs_without_any_extra(without_extras):
    """`ddl compare` on the embedded text: every run trains and compare.md and compare.json are written; the
    figures are not drawn, and the report and the terminal say which extra draws them."""
    root, results = without_extras
    cmp = root / "cmp"
    for name in ("compare", "report-only"):
        assert results[name]["code"] == 0, results[name]["err"][-2000:]
        assert f"note: The figures (curves.png) are not drawn: matplotlib is not installed; `pip install " \
               f"'{PACKAGE}[plot]'` draws them" in results[name]["out"]
        assert f"wrote {cmp}/compare.md, {cmp}/compare.json\n" in results[name]["out"]
    report = (cmp / "compare.md").read_text()
    assert "| DDL (d_v=1) | ddl-dv1 |" in report and f"pip install '{PACKAGE}[plot]'" in report
    assert "curves.png" not in report.replace("The figures (curves.png)", "") and not (cmp / "curves.png").exists()
    assert json.loads((cmp / "compare.json").read_text())["notes"]


@pytest.mark.parametrize("name, command", [("compare", "compare"), ("report-only", "compare"), ("analyze", "analyze"),
                                           ("coord-check", "coord-check"), ("tasks", "tasks run")])
def test_the_missing_plot_extra_is_named_before_any_work(without_extras, name, command):
    """README: "A command that needs an extra that is not installed says which, in one line, before it starts."
    `ddl compare`, `ddl analyze`, `ddl coord-check` and `ddl tasks run` named the plot extra only after the work;
    now their first line says it (and the report is still written, without its figures)."""
    _, results = without_extras
    assert results[name]["out"].startswith(
        f"note: matplotlib is not installed: `ddl {command}` writes its report without the figures; `pip install "
        f"'{PACKAGE}[plot]'` draws them\n"), results[name]["out"][:300]
    assert results[name]["code"] in (0, 1), results[name]["err"][-2000:]  # coord-check: 1 for slopes at 1 step


def test_analyze_runs_without_any_extra(without_extras):
    root, results = without_extras
    assert results["analyze"]["code"] == 0, results["analyze"]["err"][-2000:]
    assert f"pip install '{PACKAGE}[plot]'" in results["analyze"]["out"]
    assert f"pip install '{PACKAGE}[plot]'" in (root / "analysis" / "analysis.md").read_text()
    assert not list((root / "analysis").glob("*.png"))


@pytest.mark.parametrize("name, extra", [("gpt2 tokenizer", "data"), ("parquet", "data"), ("fineweb", "data"),
                                         ("lm-eval", "eval"), ("traffic", "triton"), ("tensorboard", "tensorboard"),
                                         ("wandb", "wandb"), ("wandb compare", "wandb"), ("triton train", "triton")])
def test_a_command_that_needs_an_extra_names_it_before_any_work(without_extras, name, extra):
    root, results = without_extras
    _one_line(results[name], "which is not installed", f"pip install '{PACKAGE}[{extra}]'")
    assert not any((root / d).exists() for d in ("gpt2", "pq", "fw", "lm.md", "tb", "wb", "wbc"))


def test_the_refusals_name_what_the_user_asked_for(without_extras):
    """Issue 58: a class name was shown (`TrainConfig's --tensorboard`), `ddl train` named `ddl bench-kernels`, and
    --wandb went on without wandb while --tensorboard refused. E4: `--set model.delta_backend=triton` wrote run.json
    and an empty metrics.jsonl before refusing, and the corrected command was then refused as "already holds a
    training run"."""
    root, results = without_extras
    assert results["tensorboard"]["err"].startswith("ddl train: error: --tensorboard (TensorBoard logging) needs")
    assert results["wandb"]["err"].startswith("ddl train: error: --wandb (Weights & Biases logging) needs wandb")
    assert results["traffic"]["err"].startswith("ddl bench-kernels: error: `ddl bench-kernels --traffic` (it counts "
                                                "the Triton kernels' memory traffic) needs triton")
    triton = results["triton train"]["err"]
    assert triton.startswith("ddl train: error: `model.delta_backend` triton (the fused Triton kernels) needs triton")
    assert "bench-kernels" not in triton
    corrected = results["triton train corrected"]
    assert corrected["code"] == 0, corrected["err"][-2000:]
    assert json.loads((root / "tri" / "run.json").read_text())["finished"]["step"] == 1


def test_the_extras_table_matches_pyproject_and_the_readme():
    """Each optional package is in the pyproject extra named for it (and in dev); the README's install lines say
    what the package alone runs and what each extra adds."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    for module, (extra, _) in EXTRAS.items():
        dist = DISTRIBUTIONS.get(module, module)
        for group in (extra, "dev"):
            assert any(req.split(">")[0].split("=")[0].strip() == dist for req in optional[group]), (module, group)
    readme = (ROOT / "README.md").read_text()
    assert "pip install ." in readme and "the report without its figures" in readme
    for extra in {e for e, _ in EXTRAS.values()}:
        assert f"`{extra}`" in readme or f"[{extra}]'" in readme, extra
