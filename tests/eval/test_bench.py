"""`ddl bench` and `ddl bench-kernels`: the shared timer and interleaving, the trainer's step as the measured
step, the cost table and the kernel tables (no test asserts timings)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.cli.main import main
from deep_delta.eval import timing
from deep_delta.eval.bench import bench_table, run_bench
from deep_delta.eval.kernel_bench import (
    op_inputs,
    op_table,
    run_op_bench,
    run_step_bench,
    step_table,
)
from deep_delta.eval.settings import BenchSettings, KernelBenchSettings
from deep_delta.eval.step_bench import StepSubject, cpu_transient_peak
from helpers import DEBUG


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
                      decode_tokens=4, model=DEBUG)
    rows = run_bench(s)
    assert [r.variant for r in rows] == ["baseline", "ddl-cc"]
    for r in rows:
        model = DDLForCausalLM(DDLConfig.from_variant(r.variant, "tiny", **DEBUG))
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


def test_bench_without_decode():
    """decode_tokens 0: no decode measured (the column reads "-"), the other columns as usual."""
    s = BenchSettings(variants=["baseline", "ddl-dv1"], batch_size=1, seq_len=8, steps=1, repeats=1, warmup=0,
                      decode_tokens=0, model=DEBUG)
    rows = run_bench(s)
    assert all(math.isnan(x) for r in rows for x in r.decode_samples)
    assert all(r.train_tokens_per_s > 0 and r.prefill_tokens_per_s > 0 for r in rows)
    table = bench_table(rows, s.resolved())
    assert "decode: not measured" in table
    line = next(line for line in table.splitlines() if line.startswith("| DDL"))
    assert line.split("|")[7:9] == [" - ", " - "]


def test_ddl_bench_cli_writes_markdown_and_json(tmp_path, capsys):
    out = tmp_path / "bench.md"
    args = ["bench", "--variants", "baseline", "ddl-tc", "--batch-size", "1", "--seq-len", "12", "--steps", "1",
            "--repeats", "1", "--warmup", "0", "--decode-tokens", "3", "--device", "cpu", "--out", str(out)]
    for kv in ("hidden_size=32", "num_hidden_layers=1", "num_attention_heads=2", "vocab_size=64"):
        args += ["--set", f"model.{kv}"]
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
        (["--variants", "baseline", "ddl-xx"], "error: --variants got 'ddl-xx'; allowed: one or more of baseline"),
        (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
        (["--seq-len", "999"], r"error: --seq-len got 999; allowed: 2..256"),
        (["--decode-tokens", "300"], "error: --decode-tokens got 300"),
        (["--set", "model.hidden_sise=3"], r"unknown field\(s\) \['hidden_sise'\]"),
        (["--set", "oops"], "error: --set got 'oops'; allowed: KEY=VALUE"),
        (["--set", "sede=1"], r"error: --set: unknown setting\(s\) \['sede'\]; allowed: model.FIELD"),
        (["--override", "hidden_sise=3"], "unrecognized arguments: --override"),
        (["--threads", "0"], "error: --threads got '0'; allowed: an integer >= 1 or 'auto'"),
        (["--threads", "-1"], "error: --threads got '-1'; allowed: an integer >= 1 or 'auto'"),
    ],
)
def test_bench_bad_arguments(args, msg, capsys):
    try:
        code = main(["bench", "--device", "cpu", *args])
    except SystemExit as e:  # argparse's own refusals (an invalid choice)
        code = e.code
    assert code == 2
    assert re.search(msg, capsys.readouterr().err)


def test_bench_set_reaches_settings_and_models():
    from deep_delta.cli.main import build_parser
    from deep_delta.eval.settings import with_assignments

    args = build_parser().parse_args(["bench", "--set", "model.hidden_size=32", "--set", "model.vocab_size=64",
                                      "--set", "seed=3"])
    s = with_assignments(BenchSettings(), args.assignments)
    assert s.model == {"hidden_size": 32, "vocab_size": 64} and s.seed == 3
    with pytest.raises(ValueError, match=r"^`assignments`: unknown setting\(s\) \['bogus'\]"):
        with_assignments(KernelBenchSettings(), ["bogus=1"])


def test_interleaved_rotates_the_first_case_and_drops_warmup():
    calls = []
    cases = {name: (lambda name=name: calls.append(name) or len(calls)) for name in "abc"}
    samples = timing.interleaved(cases, repeats=3, warmup=1)
    assert calls == list("abc" "bca" "cab" "abc")  # round r starts at case r mod 3; round 0 is the warm-up
    assert samples == {"a": [6, 8, 10], "b": [4, 9, 11], "c": [5, 7, 12]}  # each case's results, warm-up dropped
    medians = timing.interleaved_medians({"x": lambda: None}, torch.device("cpu"), repeats=3)
    assert medians["x"] >= 0


def test_library_errors_name_parameters_not_flags():
    with pytest.raises(ValueError, match=r"^`repeats` got 0; allowed: an integer >= 1 and <= 1,000,000,000$"):
        timing.interleaved({}, repeats=0)
    with pytest.raises(ValueError, match=r"^`batch_size` got 0; allowed: an integer >= 1 and <= 1,000,000,000$"):
        BenchSettings(batch_size=0, device="cpu").resolved()
    with pytest.raises(ValueError, match=r"^`seq_len` got 0"):
        KernelBenchSettings(seq_len=0).resolved()
    with pytest.raises(ValueError, match=r"^`dtype` got 'half'"):
        KernelBenchSettings(dtype="half").resolved()
    with pytest.raises(ValueError, match=r"^`device` got 'tpu'"):
        KernelBenchSettings(device="tpu").resolved()


def test_step_subject_runs_the_trainers_optimizer_step(monkeypatch):
    from deep_delta.train.step import OptimizerStep

    seen = []
    real = OptimizerStep.__call__

    def spy(self, batches, **kw):
        seen.append(self)
        return real(self, batches, **kw)

    monkeypatch.setattr(OptimizerStep, "__call__", spy)
    sub = StepSubject("ddl-cc", batch_size=2, seq_len=8, overrides=DEBUG, dtype="bfloat16")
    before = [p.detach().clone() for p in sub.model.parameters()]
    sub.train_step()
    assert len(seen) == 1 and seen[0].grad_clip == 1.0  # the training default
    assert isinstance(seen[0].autocast, torch.autocast)  # bfloat16 = autocast; the weights stay fp32
    assert all(p.dtype == torch.float32 for p in sub.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, sub.model.parameters()))
    assert all(p.grad is None for p in sub.model.parameters())  # zero_grad(set_to_none) as in training
    # weights + 2 AdamW moments between steps (zero_grad drops the gradients); the peak adds grads and activations
    assert sub.peak_train_memory() > 4 * 4 * sub.params and sub.persistent_bytes() >= 3 * 4 * sub.params
    assert sub.saved_activation_bytes(True) < sub.saved_activation_bytes(False)


def test_op_inputs_follow_autocast():
    ops = op_inputs(16, 1, 4, "bfloat16", torch.device("cpu"))
    (x, k, v, beta), *_ = ops["delta update"]
    assert (x.dtype, k.dtype, v.dtype, beta.dtype) == (torch.float32, torch.bfloat16, torch.float32, torch.float32)
    assert all(t.dtype == torch.float32 for name in ("CC read", "TC read", "EC expand") for t in ops[name][0])
    (h, r, b, f), *_ = ops["HC write"]  # the branch output f in bf16; the state and the coefficients fp32
    assert (h.dtype, r.dtype, b.dtype, f.dtype) == (torch.float32, torch.float32, torch.float32, torch.bfloat16)
    assert h.shape == (1, 4, 16, 4) and r.shape == (1, 4, 4, 4)


def test_kernel_bench_tables():
    s = KernelBenchSettings(variants=["ddl-cc"], batch_size=1, seq_len=8, repeats=1, warmup=0, model=DEBUG)
    rows = run_step_bench(s)
    assert [r.variant for r in rows] == ["baseline", "ddl-cc"]  # the baseline is added first
    cc = rows[1]
    assert cc.step_seconds > 0 and cc.saved_bytes_recompute < cc.saved_bytes and cc.peak_memory_bytes > 0
    table = step_table(rows, s)
    assert "| baseline | " in table and "1.000x | 1.000x |" in table and "- peak memory ddl-cc:" in table
    timings, notes = run_op_bench(s)
    assert [t.op for t in timings] == ["delta update", "CC read", "TC read", "EC expand", "HC write", "HC read",
                                       "Sinkhorn", "norm + gate + value"]
    assert all(set(t.seconds) == {"ref", "lean"} for t in timings)  # CPU: no triton, no compile by default
    table = op_table(timings, notes, s)
    assert table.count("| n/a | n/a |") == 8 and "Triton kernels: skipped" in table and "HC / mHC: n=4 streams" in table
    # the kernels' bytes are counted on any device (dry launches); their bandwidth needs their time (a GPU)
    assert all(t.triton_bytes and t.triton_bytes > 0 for t in timings)
    for t in timings:
        assert f"| {t.triton_bytes / 1e6:,.1f} | n/a |" in table, t.op
    assert "(cpu: unknown)" in table


def test_op_table_gives_the_kernels_bandwidth_against_the_device_peak():
    """With the Triton kernels timed: bytes over the median time, and its share of the device's peak
    (deep_delta.eval.timing.peak_bandwidth, by the device's name)."""
    from deep_delta.eval.kernel_bench import OpTiming
    from deep_delta.eval.timing import peak_bandwidth

    assert peak_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12 and peak_bandwidth("NVIDIA H200") == 4.8e12
    assert peak_bandwidth("NVIDIA H100 PCIe") == 2.0e12 and peak_bandwidth("a CPU") is None
    s = KernelBenchSettings(variants=["ddl-cc"], batch_size=1, seq_len=8, repeats=1, warmup=0, model=DEBUG)
    t = OpTiming("delta update", {"ref": 4e-3, "lean": 2e-3, "triton": 1e-3}, triton_bytes=2_400_000_000)
    table = op_table([t], [], s, device=("NVIDIA H200", 4.8e12))
    assert "| delta update | 4.00 | 2.00 (2.00x) | n/a | 1.00 (4.00x) | 2,400.0 | 2.40 (0.50x) |" in table
    assert "(NVIDIA H200: 4.80 TB/s)" in table
    unknown = op_table([t], [], s, device=("some GPU", None))
    assert "| 2,400.0 | 2.40 |" in unknown and "(some GPU: unknown)" in unknown


def test_ddl_bench_kernels_cli(tmp_path, capsys):
    out = tmp_path / "k.md"
    threads = torch.get_num_threads()
    assert main(["bench-kernels", "--device", "cpu", "--batch-size", "1", "--seq-len", "8", "--repeats", "1",
                 "--warmup", "0", "--skip-ops", "--variants", "baseline", "--threads", "1", "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads
    printed = capsys.readouterr().out
    assert "### Training step" in printed and "1 x 8 tokens, float32" in printed
    assert out.read_text().strip() == printed.strip()
    # the header says what bfloat16 means
    assert main(["bench-kernels", "--device", "cpu", "--batch-size", "1", "--seq-len", "4", "--repeats", "1",
                 "--warmup", "0", "--skip-steps", "--dtype", "bfloat16"]) == 0
    cap = capsys.readouterr()
    assert "(1 x 4 tokens, d=256, d_v=4, bfloat16 autocast" in cap.out
    assert main(["bench-kernels", "--device", "cpu", "--batch-size", "0"]) == 2
    assert re.search(r"batch.size.? got 0; allowed: an integer >= 1", capsys.readouterr().err)


def test_compiled_bench_compiles_the_blocks_for_training_and_the_decoding_step(monkeypatch):
    """`ddl bench --compile`: the blocks are compiled as the trainer compiles them (parallelize), prefill runs
    them eagerly (no compilation: the forced-eager stance), giving the same logits as the eager model, and
    decode compiles one step over the fixed-shape cache (StaticDecoder)."""
    from deep_delta.eval.bench import BenchSubject
    from deep_delta.hf import decode
    from deep_delta.hf.decode import StaticDecoder
    from deep_delta.train import distributed

    monkeypatch.setattr(decode, "DEFAULT_BACKEND", "eager")

    calls = []
    real = distributed.parallelize
    monkeypatch.setattr(distributed, "parallelize", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    s = BenchSettings(variants=["ddl-cc"], device="cpu", batch_size=1, seq_len=8, decode_tokens=2, model=dict(DEBUG),
                      compile=True).resolved()
    sub = BenchSubject("ddl-cc", s, torch.device("cpu"))
    assert calls == [{"compile": True, "bf16": False, "cuda_graphs": "off"}]  # as the trainer: train.step.build_step
    assert all(block._compiled_call_impl is not None for block in sub.model.model.layers)
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    sub.prefill()
    assert counters["stats"]["unique_graphs"] == 0
    # decode: the fixed-shape cache and one compiled step, the same graph in every round
    sub.decode()
    sub.decode()
    assert isinstance(sub.decoder, StaticDecoder) and counters["stats"]["unique_graphs"] == 1
    plain = BenchSubject("ddl-cc", BenchSettings(variants=["ddl-cc"], device="cpu", batch_size=1, seq_len=8, decode_tokens=2,
                                             model=dict(DEBUG)).resolved(), torch.device("cpu"))
    with torch.no_grad():
        a = sub.model(input_ids=sub.x).logits
        with torch.compiler.set_stance("force_eager"):
            b = sub.model(input_ids=sub.x).logits
    assert torch.equal(b, plain.model.eval()(input_ids=plain.x).logits.detach()) and a.shape == b.shape
    with pytest.raises(ValueError, match="`compile` got 'yes'"):
        BenchSettings(device="cpu", model=dict(DEBUG), compile="yes").resolved()


def test_compiled_bench_of_every_variant_writes_its_table(monkeypatch, tmp_path, capsys):
    """`ddl bench --compile` with every variant (more than torch's recompile limit of 8 per code object): each
    variant's decoder compiles its own step and the blocks of every variant compile (none falls back to eager
    and is timed as compiled), and the table is written. The "eager" backend traces what inductor would."""
    from deep_delta.hf import decode
    from deep_delta.variants import VARIANTS, paper_name

    monkeypatch.setattr(decode, "DEFAULT_BACKEND", "eager")
    compile_module = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **kw: compile_module(self, *a, backend="eager"))
    torch._dynamo.reset()
    out = tmp_path / "bench.md"
    assert len(VARIANTS) > 8
    assert main(["bench", "--compile", "--variants", *VARIANTS, "--device", "cpu", "--batch-size", "1", "--seq-len",
                 "8", "--steps", "1", "--repeats", "1", "--warmup", "1", "--decode-tokens", "2", "--threads", "1",
                 *[x for k, v in DEBUG.items() for x in ("--set", f"model.{k}={v}")], "--out", str(out)]) == 0
    table = out.read_text()
    assert all(f"| {paper_name(v)} |" in table for v in VARIANTS), table
    capsys.readouterr()


def test_a_compiled_bench_without_warm_up_is_refused(tmp_path, capsys):
    """`ddl bench --compile --warmup 0` timed compilation as the step (1164x "speed-ups"): refused before any model
    is built, in ddl bench and ddl bench-kernels alike."""
    for argv in (["bench", "--compile", "--warmup", "0", "--device", "cpu", "--out", str(tmp_path / "b.md")],
                 ["bench-kernels", "--compile", "--warmup", "0", "--device", "cpu"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--warmup got 0 with --compile; allowed: at least 1 with --compile" in err and "Traceback" not in err
    assert not (tmp_path / "b.md").exists()


@pytest.mark.parametrize("flag", ["--launches", "--traffic"])
def test_counted_steps_of_impossible_sizes_are_refused_before_any_model(capsys, flag):
    """`ddl bench-kernels --launches / --traffic` of 10^18 tokens once ended in a traceback (storage size overflow);
    a step whose tensors the Triton kernels cannot index is refused naming the sizes and the bound."""
    assert main(["bench-kernels", flag, "--preset", "small", "--variants", "ddl-tc", "--device", "cpu",
                 "--batch-size", "1000000000", "--seq-len", "1000000000"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size x --seq-len got 1000000000 x 1000000000" in err and "32-bit offsets" in err, err
    assert "with ddl-tc's 3,072 values per token" in err and "allowed: at most 693,589 tokens per step" in err
    assert err.count("\n") == 1
