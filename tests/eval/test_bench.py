"""`ddl bench`: the cost table (parameters, throughput, peak memory) in one process."""

from __future__ import annotations

import json
import re

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.cli.main import main
from deep_delta.eval.bench import BenchSettings, bench_table, cpu_transient_peak, run_bench

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=64, max_position_embeddings=64)


def test_cpu_peak_follows_allocations():
    mb = 2**20

    def work():
        a = torch.empty(4 * mb, dtype=torch.uint8)
        b = torch.empty(8 * mb, dtype=torch.uint8)
        del a
        c = torch.empty(2 * mb, dtype=torch.uint8)
        del b, c

    peak = cpu_transient_peak(work)
    assert 12 * mb <= peak < 12.5 * mb  # a and b live together; c comes after a is freed


def test_run_bench_rows_and_factors():
    s = BenchSettings(variants=["baseline", "ddl-cc"], batch_size=2, seq_len=16, steps=1, repeats=2,
                      decode_tokens=4, overrides=SMALL)
    rows = run_bench(s)
    assert [r.variant for r in rows] == ["baseline", "ddl-cc"]
    for r in rows:
        model = DDLForCausalLM(DDLConfig.from_variant(r.variant, "tiny", **SMALL))
        assert r.params == sum(p.numel() for p in model.parameters())
        # weights + grads + 2 AdamW moments in fp32 at least, plus the step's activations
        assert r.peak_memory_bytes > 4 * 4 * r.params
        for samples in (r.train_samples, r.prefill_samples, r.decode_samples):
            assert len(samples) == 2 and all(x > 0 for x in samples)
    assert rows[1].params > rows[0].params
    table = bench_table(rows, s.resolved())
    assert "| Baseline | " in table and "| DDL-CC | " in table
    base_line = next(line for line in table.splitlines() if line.startswith("| Baseline"))
    assert base_line.count("| 1.00 |") == 4  # every factor of the baseline is 1


def test_ddl_bench_cli_writes_markdown_and_json(tmp_path, capsys):
    out = tmp_path / "bench.md"
    args = ["bench", "--variants", "baseline,ddl-tc", "--batch-size", "1", "--seq-len", "12", "--steps", "1",
            "--repeats", "1", "--warmup", "0", "--decode-tokens", "3", "--device", "cpu", "--out", str(out)]
    for kv in ("hidden_size=32", "num_hidden_layers=1", "num_attention_heads=2", "vocab_size=64"):
        args += ["--override", kv]
    threads = torch.get_num_threads()
    assert main(args) == 0
    assert torch.get_num_threads() == threads  # --threads 1 (the default) is undone for in-process callers
    printed = capsys.readouterr().out
    assert "| DDL-TC |" in printed and "Peak train memory" in printed and "1 torch thread)" in printed
    assert "| DDL-TC |" in out.read_text()
    data = json.loads(out.with_suffix(".json").read_text())
    assert [r["variant"] for r in data["rows"]] == ["baseline", "ddl-tc"]
    assert data["settings"]["seq_len"] == 12


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--variants", "baseline,ddl-xx"], "--variants: got 'ddl-xx'; allowed: baseline"),
        (["--preset", "huge"], "--preset: got 'huge'; allowed: tiny | small | medium"),
        (["--seq-len", "999"], r"--seq-len: got 999; allowed: 2..256"),
        (["--decode-tokens", "300"], "--decode-tokens: got 300"),
        (["--override", "hidden_sise=3"], r"unknown field\(s\) \['hidden_sise'\]"),
        (["--override", "oops"], "--override: got 'oops'; allowed: KEY=VALUE"),
    ],
)
def test_bench_bad_arguments(args, msg, capsys):
    assert main(["bench", "--device", "cpu", *args]) == 2
    assert re.search(msg, capsys.readouterr().err)
