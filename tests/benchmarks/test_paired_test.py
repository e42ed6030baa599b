"""benchmarks/tools/paired_test.py: one design of one held-out study against one of another, paired by evaluation
seed from the runs' test.json (issue 64 item 3: the old baseline beside the strong one), overall and per source;
sides measured on other windows or data refused."""

from __future__ import annotations

import json

import pytest

from helpers import load_tool


def _test(out, variant, seed, loss, sources, **extra):
    run = out / "evaluation" / f"seed_{seed}" / variant
    run.mkdir(parents=True)
    record = {"loss": loss, "step": 300, "windows": 8, "tokens": 2048, "data_fingerprint": "f" * 64,
              "eval_windows": "spread", "sources": {k: {"loss": v, "tokens": 1024} for k, v in sources.items()},
              **extra}
    (run / "test.json").write_text(json.dumps(record))


def test_two_studies_paired_by_seed_overall_and_per_source(tmp_path, capsys):
    mod = load_tool("paired_test")
    new, old = tmp_path / "new", tmp_path / "old"
    for seed, (a, b) in enumerate([(2.0, 2.3), (2.1, 2.3), (2.2, 2.3)], start=100):
        _test(new, "baseline", seed, a, {"python": a - 0.1, "linux": a + 0.1})
        _test(old, "baseline", seed, b, {"python": b, "linux": b})
    _test(old, "baseline", 103, 2.3, {})  # one side only: left out, said
    assert mod.main([f"{new}:baseline", f"{old}:baseline", "--json", str(tmp_path / "r.json")]) == 0
    shown = capsys.readouterr().out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["seeds"] == [100, 101, 102] and result["left_out"] == [103]
    assert result["overall"]["mean"] == pytest.approx(-0.2) and result["overall"]["wins"] == 3
    half = 4.303 * 0.1 / 3 ** 0.5  # t(2) x sd of the differences (-0.3, -0.2, -0.1) / sqrt(3)
    assert result["overall"]["ci95"] == pytest.approx([-0.2 - half, -0.2 + half])
    assert result["sources"]["python"]["mean"] == pytest.approx(-0.3)
    assert result["sources"]["linux"]["mean"] == pytest.approx(-0.1)
    assert "| overall | 2.1000 | 2.3000 | -0.2000 |" in shown and "left out, on one side only: 103" in shown


@pytest.mark.parametrize("extra, refusal", [({"eval_windows": "first"}, "windows of different plans"),
                                            ({"tokens": 4096}, "different test tokens"),
                                            ({"data_fingerprint": "0" * 64}, "different data")])
def test_sides_measured_on_other_windows_or_data_are_refused(tmp_path, extra, refusal):
    mod = load_tool("paired_test")
    _test(tmp_path / "a", "ddl-cc", 100, 2.0, {})
    _test(tmp_path / "b", "baseline", 100, 2.2, {}, **extra)
    with pytest.raises(SystemExit, match=refusal):
        mod.main([f"{tmp_path / 'a'}:ddl-cc", f"{tmp_path / 'b'}:baseline"])


def test_a_side_without_records_is_refused_naming_where_it_looked(tmp_path):
    with pytest.raises(SystemExit, match="evaluation/seed_\\*/baseline/test.json: none found"):
        load_tool("paired_test").main([f"{tmp_path}:baseline", f"{tmp_path}:ddl-cc"])
