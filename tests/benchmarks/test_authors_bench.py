"""benchmarks/tools/authors_bench.py without the authors' code: the error when their folder is missing or is not
theirs, the import of a folder of dashed files with relative imports, the pairing of their models with our
variants, the causal_conv1d stand-in, and the table from fake samples. Nothing here needs their code or downloads
it; the parameter counts of their models against ours are printed by the tool itself (its table's first column),
where their folder is extracted."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from helpers import load_tool


def _load():
    return load_tool("authors_bench")


ab = _load()


@pytest.fixture
def clean_modules():
    """Forget the package and the stand-in a test loaded, so that no other test sees them."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(ab.PACKAGE) or name == "causal_conv1d":
            del sys.modules[name]


def _one_line_error(capsys, argv) -> str:
    assert ab.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "--authors" in err, err
    return err


def test_a_missing_folder_fails_with_one_line_naming_authors(tmp_path, capsys):
    err = _one_line_error(capsys, ["--authors", str(tmp_path / "absent"), "--device", "cpu"])
    assert "no such folder" in err and "archive HEAD model" in err


def test_a_folder_that_is_not_theirs_fails_with_one_line_naming_what_is_missing(tmp_path, capsys):
    (tmp_path / "model.py").write_text("x = 1\n")
    (tmp_path / "gpt_base.py").write_text("x = 1\n")
    err = _one_line_error(capsys, ["--authors", str(tmp_path), "--device", "cpu"])
    assert "not the authors' model folder" in err
    assert "DDL-gpt-mha-rope-CC-EC-accelerated.py" in err and "gpt_base.py," not in err


def test_their_folder_is_imported_as_a_package_of_dashed_files_with_relative_imports(tmp_path, clean_modules):
    for name in ab.REQUIRED:
        (tmp_path / name).write_text("")
    (tmp_path / "gpt_base.py").write_text("BASE = 'base'\n")
    (tmp_path / "DDL-vdim1-gpt-mha-rope.py").write_text("from .gpt_base import BASE\nSEEN = BASE + '!'\n")
    (tmp_path.parent / "COMMIT").write_text("abc123\n")
    code = ab.load_authors(tmp_path)
    assert code.module("DDL-vdim1-gpt-mha-rope").SEEN == "base!"
    assert code.commit == "abc123" and len(code.sha256) == 64 and not code.interpreted
    assert code.module("pydantic_config").get_type_hints is not None  # transformers 5's annotations resolvable
    assert ab.load_authors(tmp_path, "def456").commit == "def456"  # loads again, the given commit first


def test_every_model_file_of_theirs_is_paired_and_each_variant_brings_its_rows():
    published = {"DDL-gpt-mha-rope-CC-EC-accelerated", "DDL-gpt-mha-rope-CC-EC", "DDL-gpt-mha-rope-CC",
                 "DDL-gpt-mha-rope-EC", "DDL-gpt-mha-rope", "DDL-vdim1-gpt-mha-rope"}
    assert set(ab.THEIR_FILES) == published
    rows = ab.pairs_for(["baseline", "ddl-dv1", "ddl-tc", "ddl-cc", "ddl-tc-noec", "ddl-cc-noec", "hc"])
    assert [(p.variant, p.theirs) for p in rows] == [
        ("baseline", "gpt_base"),
        ("ddl-dv1", "DDL-vdim1-gpt-mha-rope"),
        ("ddl-tc", "DDL-gpt-mha-rope-EC"),
        ("ddl-cc", "DDL-gpt-mha-rope-CC-EC"),
        ("ddl-cc", "DDL-gpt-mha-rope-CC-EC-accelerated"),
        ("ddl-tc-noec", "DDL-gpt-mha-rope"),
        ("ddl-cc-noec", "DDL-gpt-mha-rope-CC"),
        ("hc", None),
    ]
    assert [p.variant for p in ab.pairs_for(["ddl-cc", "baseline"])] == ["ddl-cc", "ddl-cc", "baseline"]


def test_the_causal_conv1d_stand_in_is_a_causal_depthwise_convolution():
    fn = ab._causal_conv1d_standin().causal_conv1d_fn
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 7, generator=g), torch.randn(3, 4, generator=g)
    want = torch.zeros_like(x)
    for t in range(7):
        for k in range(4):
            s = t - 3 + k
            if s >= 0:
                want[:, :, t] += w[:, k] * x[:, :, s]
    torch.testing.assert_close(fn(x, w), want)
    torch.testing.assert_close(fn(x, w, activation="silu"), torch.nn.functional.silu(want))


def _settings(variants, modes=("eager", "compiled"), device="cpu"):
    shape = ab.Shape(vocab_size=512, num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                     max_position_embeddings=256)
    return ab.Settings("tiny", shape, list(variants), list(modes), device, "float32", 2, 64, 2, 3, 1, 0)


HEADER = {"device": "CPU (2 cores, 2 torch threads)", "torch": "2.13.0", "ours_commit": "ours123",
          "theirs_commit": "theirs456", "theirs_sha256": "f" * 64, "standins": "causal_conv1d",
          "triton_interpreted": "yes"}


def _fake() -> ab.Measured:
    k, t = ab.ours_key, ab.theirs_key
    m = ab.Measured()
    m.params = {k("baseline"): 1000, t("gpt_base"): 1000, k("ddl-cc"): 1040, t("DDL-gpt-mha-rope-CC-EC"): 1052,
                t("DDL-gpt-mha-rope-CC-EC-accelerated"): 1052, k("ddl-tc"): 1100, t("DDL-gpt-mha-rope-EC"): 1100}
    m.rates = {
        "eager": {k("baseline"): [90.0, 100.0, 110.0], t("gpt_base"): [50.0, 50.0, 50.0],
                  k("ddl-cc"): [80.0, 80.0, 80.0], t("DDL-gpt-mha-rope-CC-EC"): [40.0, 40.0, 40.0],
                  k("ddl-tc"): [60.0] * 3, t("DDL-gpt-mha-rope-EC"): [30.0] * 3},
        "compiled": {k("baseline"): [2000.0] * 3, t("gpt_base"): [1000.0] * 3, k("ddl-cc"): [1500.0] * 3,
                     t("DDL-gpt-mha-rope-CC-EC"): [500.0] * 3, t("DDL-gpt-mha-rope-CC-EC-accelerated"): [750.0] * 3,
                     k("ddl-tc"): [1000.0] * 3, t("DDL-gpt-mha-rope-EC"): [1000.0] * 3},
    }
    m.failed = {"eager": {}, "compiled": {}}
    m.untimed = {"eager": [t("DDL-gpt-mha-rope-CC-EC-accelerated")], "compiled": []}
    return m


def _row(text: str, start: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {start} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_table_pairs_rows_and_gives_each_rate_over_our_baseline_and_ours_over_theirs():
    s = _settings(["baseline", "ddl-cc", "ddl-tc", "ddl-dv1-vmap"])
    text = ab.table(s, _fake(), HEADER)
    head = _row(text, "Model")
    assert head[:4] == ["Model", "ours", "theirs", "params ours / theirs"]
    assert head[4:] == ["eager: ours tok/s (x)", "eager: theirs tok/s (x)", "eager: ours/theirs",
                        "compiled: ours tok/s (x)", "compiled: theirs tok/s (x)", "compiled: ours/theirs"]
    assert _row(text, "Baseline")[1:] == ["`baseline`", "`gpt_base.py` (GPTBase + their attention)",
                                          "1,000 / 1,000 (equal)", "100 (1.00)", "50 (0.50)", "2.00",
                                          "2.0K (1.00)", "1.0K (0.50)", "2.00"]
    assert _row(text, "DDL-CC")[3:] == ["1,040 / 1,052 (-12)", "80 (0.80)", "40 (0.40)", "2.00",
                                        "1.5K (0.75)", "500 (0.25)", "3.00"]
    triton = _row(text, "DDL-CC, their Triton path")
    assert triton[1:3] == ["`ddl-cc`", "`DDL-gpt-mha-rope-CC-EC-accelerated.py`"]
    assert triton[4:] == ["80 (0.80)", "ran, not timed", "-", "1.5K (0.75)", "750 (0.38)", "2.00"]
    assert _row(text, "DDL (d_v=1, v-Map)")[2:5] == ["no counterpart", "- / -", "-"]
    assert "ours123" in text and "theirs456" in text and "ffffffffffffffff" in text and "2 x 64 tokens" in text
    assert "2 layers, width 64, 2 heads of 32, vocab 512" in text
    assert "PyTorch stand-in" in text and "Triton interpreter" in text and "not the GPU comparison" in text
    assert ("their CC compressors (`DDL-gpt-mha-rope-CC-EC.py`, `DDL-gpt-mha-rope-CC-EC-accelerated.py`) hold d_v "
            "more each") in text


def test_failures_and_memory_show_in_the_table(tmp_path):
    s = _settings(["baseline", "ddl-cc"], modes=("compiled",), device="cuda")
    m = _fake()
    m.rates["compiled"].pop(ab.theirs_key("DDL-gpt-mha-rope-CC-EC-accelerated"))
    m.failed["compiled"][ab.theirs_key("DDL-gpt-mha-rope-CC-EC-accelerated")] = "RuntimeError: boom (at x.py:1)"
    m.memory = {"compiled": {ab.ours_key("baseline"): 3 * 2**30, ab.theirs_key("gpt_base"): 2**30}}
    header = HEADER | {"device": "NVIDIA H100 80GB HBM3", "standins": "", "triton_interpreted": "no"}
    text = ab.table(s, m, header)
    assert _row(text, "Model")[-1] == "compiled: peak memory ours / theirs"
    assert _row(text, "Baseline")[-1] == "3,072 MiB / 1,024 MiB"
    assert _row(text, "DDL-CC")[-1] == "- / -"
    assert _row(text, "DDL-CC, their Triton path")[5:7] == ["failed", "-"]
    assert "compiled: theirs:DDL-gpt-mha-rope-CC-EC-accelerated failed: RuntimeError: boom (at x.py:1)" in text
    assert "stand-in" not in text and "interpreter" not in text and "not the GPU comparison" not in text
    out = ab.write(tmp_path / "authors.md", s, m, header)
    assert out.read_text().startswith("# The authors' code beside ours")
    payload = json.loads(out.with_suffix(".json").read_text())
    assert payload["header"]["device"] == "NVIDIA H100 80GB HBM3" and payload["settings"]["shape"]["hidden_size"] == 64
    assert payload["rates"]["compiled"][ab.ours_key("baseline")] == [2000.0] * 3
    assert payload["pairs"][1] == {"variant": "ddl-cc", "theirs": "DDL-gpt-mha-rope-CC-EC", "label": ""}


def test_a_missing_baseline_leaves_the_factors_out():
    s = _settings(["ddl-cc"], modes=("eager",))
    m = _fake()
    del m.rates["eager"][ab.ours_key("baseline")]
    assert _row(ab.table(s, m, HEADER), "DDL-CC")[4:7] == ["80", "40", "2.00"]
    assert not math.isnan(ab._median(m, "eager", ab.ours_key("ddl-cc")))
