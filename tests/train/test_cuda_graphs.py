"""``cuda_graphs`` (``ddl train --cuda-graphs``, ``ddl bench --cuda-graphs``): the training step replayed as CUDA
graphs through ``torch.compile(mode="reduce-overhead")`` (issue 40, item 4). The graphs themselves need a GPU
(benchmarks/tools/session.sh's ``graphs`` step); here, on CPU: every refusal names the setting, the blocks (or the
whole model) are compiled with the mode, and every micro-batch begins a new graph step."""

from __future__ import annotations

import pytest
import torch

from deep_delta import DDLConfig, DDLForCausalLM
from deep_delta.eval.settings import BenchSettings
from deep_delta.train import TrainConfig, train
from deep_delta.train import distributed as distr
from deep_delta.train.optim import build_optimizer
from deep_delta.train.step import OptimizerStep
from helpers import DEBUG, DEBUG_MODEL


def test_settings_refuse_what_the_graphs_cannot_do():
    assert TrainConfig().cuda_graphs == "off"
    with pytest.raises(ValueError, match="`cuda_graphs` got 'both'; allowed: off \\| blocks \\| model"):
        TrainConfig(cuda_graphs="both")
    with pytest.raises(ValueError, match="`cuda_graphs` got 'blocks'; allowed: off unless compile is true"):
        TrainConfig(cuda_graphs="blocks")
    with pytest.raises(ValueError, match="`cuda_graphs` got 'model'; allowed: off with activation_checkpointing"):
        TrainConfig(cuda_graphs="model", compile=True, activation_checkpointing=True)
    with pytest.raises(ValueError, match="`cuda_graphs` got 'blocks'; allowed: off with model.recompute_states"):
        TrainConfig(cuda_graphs="blocks", compile=True, model={"recompute_states": True})
    assert TrainConfig(cuda_graphs="blocks", compile=True).cuda_graphs == "blocks"
    with pytest.raises(ValueError, match="`cuda_graphs` got 'blocks'; allowed: off \\| blocks \\| model, and other than "
                                         "off only with --compile"):
        BenchSettings(cuda_graphs="blocks").resolved()


def test_a_run_on_the_cpu_is_refused_before_it_trains(tmp_path, data_dir):
    cfg = TrainConfig(variant="ddl-dv1", model=dict(DEBUG_MODEL), data=str(data_dir), out=str(tmp_path / "run"), steps=2,
                      batch_size=2, seq_len=16, device="cpu", compile=True, cuda_graphs="blocks", log_every=0)
    with pytest.raises(ValueError, match="`cuda_graphs` got 'blocks' on device cpu; allowed: off"):
        train(cfg, progress=False, quiet=True)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_more_than_one_process_is_refused(mode):
    info = distr.DistInfo(device=torch.device("cuda"), mode=mode, world_size=2)
    with pytest.raises(ValueError, match=f"`cuda_graphs` got 'model' under {mode.upper()}; allowed: off"):
        distr.check_cuda_graphs("model", info)
    distr.check_cuda_graphs("off", info)


def _tiny(**overrides):
    return DDLForCausalLM(DDLConfig.from_variant("ddl-dv1", "tiny", **{**DEBUG, **overrides}))


@pytest.mark.parametrize("cuda_graphs", ["off", "blocks", "model"])
def test_parallelize_compiles_with_the_mode(monkeypatch, cuda_graphs):
    """Which modules ``parallelize`` compiles and with what (``nn.Module.compile`` recorded, not run): the blocks
    plainly, the blocks with mode="reduce-overhead", or the whole model with it."""
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: calls.append((type(self).__name__, kw)))
    monkeypatch.setattr(distr, "check_cuda_graphs", lambda mode, info: None)  # the device check: a GPU's
    model = _tiny()
    distr.parallelize(model, distr.DistInfo(), compile=True, cuda_graphs=cuda_graphs)
    graphs = {"mode": "reduce-overhead"}
    expected = {"off": [("DDLBlock", {})] * 2, "blocks": [("DDLBlock", graphs)] * 2,
                "model": [("DDLForCausalLM", graphs)]}[cuda_graphs]
    assert calls == expected
    with pytest.raises(ValueError, match="`cuda_graphs` got 'blocks' with compile=False"):
        distr.parallelize(_tiny(), distr.DistInfo(), compile=False, cuda_graphs="blocks")
    with pytest.raises(ValueError, match="for a model with recompute_states; allowed: off"):
        distr.parallelize(_tiny(recompute_states=True), distr.DistInfo(), compile=True, cuda_graphs="blocks")


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_every_micro_batch_begins_a_graph_step(monkeypatch, cuda_graphs):
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    model = _tiny()
    step = OptimizerStep(model, build_optimizer(model, 1e-3, 0.1, (0.9, 0.95)), cuda_graphs=cuda_graphs)
    ids = torch.randint(0, DEBUG["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    loss, _ = step([(ids[:, :-1], ids[:, 1:])] * 3, accum=3)
    assert torch.isfinite(loss) and len(marks) == (3 if cuda_graphs else 0)
