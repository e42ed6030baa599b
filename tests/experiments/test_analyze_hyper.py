"""``ddl analyze`` on HC / mHC models: known answers at init (docs/rivals.md), coefficients set by hand, the CLI."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from deep_delta.designs.hyper.probe import stream_drift
from deep_delta.experiments.analyze import analyze_model, format_analysis
from deep_delta.layers.hyper_connections import HyperResidual
from deep_delta.models import DDLConfig, DDLForCausalLM
from helpers import DEBUG

TINY = {**DEBUG, "max_position_embeddings": 32}
N = 4  # streams, the variants' default
NAMES = [f"model.layers.{b}.{s}" for b in range(2) for s in ("attn", "mlp")]


def _model(variant: str, **overrides) -> DDLForCausalLM:
    torch.manual_seed(0)
    return DDLForCausalLM(DDLConfig.from_variant(variant, "tiny", **{**TINY, **overrides})).eval()


def _batches(n=2):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (3, 16), generator=g) for _ in range(n)]


def _one_hot(k: int) -> list[float]:
    return [1.0 if j == k else 0.0 for j in range(N)]


def test_stream_drift_by_hand():
    e = torch.eye(3)
    cos, spread = stream_drift(torch.stack([e[:, 0], e[:, 1]], -1))  # two orthogonal unit streams
    assert cos.item() == pytest.approx(0.0) and spread.item() == pytest.approx(1 / math.sqrt(2))
    cos, spread = stream_drift(torch.stack([e[:, 0]] * 3 + [-e[:, 0]], -1))  # pairs: 3 x (+1), 3 x (-1)
    assert cos.item() == pytest.approx(0.0) and spread.item() == pytest.approx(math.sqrt(0.75))
    cos, spread = stream_drift(torch.randn(5, 3, 1))  # one stream: nothing to drift from
    assert torch.equal(cos, torch.ones(5)) and torch.equal(spread, torch.zeros(5))


@pytest.mark.parametrize("variant", ["hc-static", "hc"])
def test_hc_at_init_reads_one_stream_keeps_the_identity_and_writes_ones(variant):
    report = analyze_model(_model(variant), _batches())
    assert report["probes"] == ["embedding", "hyper"] and report["windows"] == 6
    hy = report["hyper"]
    assert (hy["kind"], hy["dynamic"], hy["streams"], hy["mixing_matrix"]) == ("hc", variant == "hc", N, "A_r^T")
    assert list(hy["sublayers"]) == NAMES
    for k, r in enumerate(hy["sublayers"].values()):
        assert r["tokens"] == 6 * 16
        assert r["read"]["mean"] == _one_hot(k % N) and r["read"]["sd"] == [0.0] * N and r["read"]["sum"] == 1.0
        mx = r["mixing"]
        assert mx["mean"] == torch.eye(N).tolist() and mx["identity_distance"] == 0.0
        assert mx["row_sum_error"] == 0.0 and mx["column_sum_error"] == 0.0
        assert r["write"]["mean"] == [1.0] * N and r["write"]["sd"] == [0.0] * N
        # copied streams, A_r = I and b = 1: every stream gets the same update and they stay identical
        assert r["streams_after"]["spread"] == 0.0
        assert r["streams_after"]["cosine"] == pytest.approx(1.0, abs=1e-12)
    assert "| layers.1.mlp | 0.00 0.00 0.00 1.00 |" in format_analysis(report)


def test_mhc_static_at_init_is_halfway_to_the_uniform_mixture():
    report = analyze_model(_model("mhc-static"), _batches())
    hy = report["hyper"]
    assert (hy["kind"], hy["dynamic"], hy["mixing_matrix"]) == ("mhc", False, "H_res")
    want_res = ((torch.eye(N) + 1.0 / N) / 2).tolist()
    for k, r in enumerate(hy["sublayers"].values()):
        assert r["read"]["mean"] == pytest.approx([(e + 1 / N) / 2 for e in _one_hot(k % N)], abs=1e-6)
        assert r["read"]["sum"] == pytest.approx(1.0, abs=1e-6)
        mx = r["mixing"]
        for row, want in zip(mx["mean"], want_res):
            assert row == pytest.approx(want, abs=1e-5)  # Sinkhorn with its eps guard leaves it (nearly) as is
        assert mx["identity_distance"] == pytest.approx(float(torch.tensor(want_res).sub(torch.eye(N)).norm()),
                                                        abs=1e-5)
        assert mx["row_sum_error"] < 1e-5 and mx["column_sum_error"] < 1e-5
        assert r["write"]["mean"] == [1.0] * N  # 2 sigmoid(0)
        # a row-stochastic H_res and h_post = 1 keep copied streams copies (up to rounding)
        assert r["streams_after"]["spread"] < 1e-5 and r["streams_after"]["cosine"] == pytest.approx(1.0, abs=1e-9)


# read a, mixing A_r (h' = h A_r + f b^T, so M = A_r^T) and write b, set by hand in every sublayer
A = [0.4, 0.3, 0.2, 0.1]
A_R = [[0.5, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.2], [0.1, 0.0, 0.0, 0.8]]
B = [1.0, 0.5, 0.0, -1.0]


def _hand_set_model() -> DDLForCausalLM:
    model = _model("hc-static")
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, HyperResidual):
                m.static_alpha.copy_(torch.cat([torch.tensor(A)[:, None], torch.tensor(A_R)], 1))
                m.static_beta.copy_(torch.tensor(B))
    return model


def test_hand_set_coefficients_give_the_hand_computed_figures():
    model = _hand_set_model()
    seen = {}
    hooks = [model.model.embed_tokens.register_forward_hook(lambda m, a, o: seen.setdefault("x", o)),
             model.model.layers[0].attn.branch.register_forward_hook(lambda m, a, o: seen.setdefault("f", o))]
    report = analyze_model(model, _batches(1))
    for h in hooks:
        h.remove()
    # by hand: |A_r - I|_F, the worst row and column sum error of M = A_r^T
    dist = math.sqrt(sum((A_R[i][j] - (i == j)) ** 2 for i in range(N) for j in range(N)))
    col_sums_of_ar = [sum(A_R[i][j] for i in range(N)) for j in range(N)]  # = row sums of M
    row_err = max(abs(s - 1) for s in col_sums_of_ar)
    col_err = max(abs(sum(row) - 1) for row in A_R)
    for r in report["hyper"]["sublayers"].values():
        assert r["read"]["mean"] == pytest.approx(A) and r["read"]["sum"] == pytest.approx(1.0)
        assert r["write"]["mean"] == pytest.approx(B)
        assert r["mixing"]["mean"] == [pytest.approx([A_R[i][j] for i in range(N)]) for j in range(N)]
        assert r["mixing"]["identity_distance"] == pytest.approx(dist)
        assert r["mixing"]["identity_distance_tokens"] == pytest.approx(dist)
        assert r["mixing"]["row_sum_error"] == pytest.approx(row_err)
        assert r["mixing"]["column_sum_error"] == pytest.approx(col_err)
        assert r["mixing"]["row_sum_error_mean"] == pytest.approx(row_err)  # the same matrix at every token
        assert r["mixing"]["column_sum_error_mean"] == pytest.approx(col_err)
        assert r["mixing"]["min"] == 0.0
    # the first sublayer meets copies of the embedding x: stream j = (sum_i A_r[i][j]) x + b_j f
    x, f = seen["x"].double().reshape(-1, TINY["hidden_size"]), seen["f"].double().reshape(-1, TINY["hidden_size"])
    streams = [s * x + b * f for s, b in zip(col_sums_of_ar, B)]
    unit = [s / s.norm(dim=-1, keepdim=True) for s in streams]
    cos = sum((unit[i] * unit[j]).sum(-1) for i, j in itertools.combinations(range(N), 2)) / 6
    mean = sum(streams) / N
    spread = torch.sqrt(sum(((s - mean) ** 2).sum(-1) for s in streams)) / torch.sqrt(
        sum((s ** 2).sum(-1) for s in streams))
    first = report["hyper"]["sublayers"]["model.layers.0.attn"]["streams_after"]
    assert first["cosine"] == pytest.approx(cos.mean().item(), abs=1e-6)
    assert first["cosine_min"] == pytest.approx(cos.min().item(), abs=1e-6)
    assert first["spread"] == pytest.approx(spread.mean().item(), abs=1e-6)
    assert 0.05 < first["spread"] and first["cosine"] < 0.95  # the streams did drift apart


def test_cli_analyses_a_trained_hc_model(tmp_path, capsys):
    from deep_delta.cli.main import main
    from deep_delta.data import ByteTokenizer, write_dataset
    from deep_delta.train.optim import build_optimizer

    data = tmp_path / "data"
    write_dataset(["some text to read " * 40, "another document here " * 40], ByteTokenizer(), data,
                  val_fraction=0.5)
    model = _model("hc", vocab_size=257).train()
    opt = build_optimizer(model, 1e-2, 0.0, (0.9, 0.95))
    x = torch.randint(0, 257, (2, 16), generator=torch.Generator().manual_seed(2))
    for _ in range(2):  # two steps: the dynamic projections leave zero, so the coefficients vary by token
        model(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    out = tmp_path / "an"
    assert main(["analyze", "--model", str(model_dir), "--data", str(data), "--batch-size", "2", "--seq-len", "16",
                 "--batches", "2", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    report = json.loads((out / "analysis.json").read_text())
    assert report["probes"] == ["embedding", "hyper"] and report["windows"] == 4 and "sublayers" not in report
    layers = report["hyper"]["sublayers"]
    assert list(layers) == NAMES
    assert all(max(r["read"]["sd"]) > 0 and max(r["write"]["sd"]) > 0 for r in layers.values())
    assert all(r["mixing"]["identity_distance"] > 0 for r in layers.values())
    assert "| layers.0.attn |" in capsys.readouterr().out
    md = (out / "analysis.md").read_text()
    for png in ("stream_weights.png", "stream_mixing.png", "stream_drift.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG" and f"({png})" in md
