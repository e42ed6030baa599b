"""lm-evaluation-harness: the DDL adapter's scores, and a fully offline task run through `ddl eval lm-eval`."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from eval_helpers import make_run

from deep_delta.cli.main import main
from deep_delta.eval import harness
from deep_delta.hf import byte_tokenizer
from helpers import tiny_model

DOCS = [
    ("What color is a clear sky at noon?", ["blue", "green", "red", "black"], 0),
    ("How many legs does a spider have?", ["six", "eight", "four", "ten"], 1),
    ("Which is the largest planet?", ["Mars", "Venus", "Jupiter", "Mercury"], 2),
    ("Water freezes at how many degrees Celsius?", ["zero", "ten", "fifty", "one hundred"], 0),
    ("What do bees make?", ["milk", "silk", "wax and honey", "glass"], 2),
    ("Which animal barks?", ["cat", "dog", "fish", "owl"], 1),
    ("What is the opposite of hot?", ["warm", "cold", "loud", "bright"], 1),
    ("What gas do plants take in?", ["carbon dioxide", "helium", "neon", "argon"], 0),
]

TASK_YAML = """task: ddl_toy_mc
dataset_path: json
dataset_kwargs:
  data_files:
    train: {train}
    validation: {validation}
output_type: multiple_choice
training_split: train
validation_split: validation
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def _write_task(root):
    root.mkdir(parents=True)
    files = {}
    for split, docs in (("train", DOCS[:3]), ("validation", DOCS)):
        files[split] = root / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps({"question": q, "choices": c, "label": y}) + "\n" for q, c, y in docs))
    (root / "tasks").mkdir()
    (root / "tasks" / "ddl_toy_mc.yaml").write_text(TASK_YAML.format(**files))
    return root / "tasks"


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network: the hub and datasets in offline mode, datasets' cache in tmp_path."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")


def _logprob(model, tok, context: str, continuation: str) -> float:
    """Reference: one unpadded forward over context + continuation; summed log-probs of the continuation."""
    ctx = tok.encode(context, add_special_tokens=False)
    cont = tok.encode(continuation, add_special_tokens=False)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        lp = F.log_softmax(model(ids, use_cache=False).logits[0, :-1].float(), -1)
    return float(lp[len(ctx) - 1 :].gather(-1, torch.tensor(cont)[:, None]).sum())


def test_adapter_loglikelihood_matches_unpadded_reference():
    model, tok = tiny_model("ddl-tc"), byte_tokenizer()
    lm = harness.make_harness_lm(model, tok, batch_size=3)
    g = torch.Generator().manual_seed(0)
    reqs = []
    for i in range(7):
        n_ctx = int(torch.randint(1, 40, (1,), generator=g))
        n_cont = int(torch.randint(1, 6, (1,), generator=g))
        reqs.append(((f"c{i}", f"x{i}"), torch.randint(0, 256, (n_ctx,), generator=g).tolist(),
                     torch.randint(0, 256, (n_cont,), generator=g).tolist()))
    got = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    for (_, ctx, cont), (score, greedy) in zip(reqs, got):
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            lp = F.log_softmax(model(ids, use_cache=False).logits[0, :-1], -1)[len(ctx) - 1 :]
        assert score == pytest.approx(float(lp.gather(-1, torch.tensor(cont)[:, None]).sum()), abs=1e-4)
        assert greedy == bool((lp.argmax(-1) == torch.tensor(cont)).all())
    # the model's own greedy continuation is reported as greedy
    ctx = tok.encode("Question: x", add_special_tokens=False)
    with torch.no_grad():
        nxt = int(model(torch.tensor([ctx])).logits[0, -1].argmax())
    assert lm._loglikelihood_tokens([(("a", "b"), ctx, [nxt])], disable_tqdm=True)[0][1] is True


def test_offline_task_through_ddl_eval_lm_eval(tmp_path, offline, capsys):
    tasks_dir = _write_task(tmp_path / "toy")
    # context 128: every 0-shot request fits (the reference below does not truncate); 1-shot ones get cut
    run, model = make_run(tmp_path / "run", variant="ddl-cc", max_position_embeddings=128)
    out = tmp_path / "res" / "table.md"
    argv = ["eval", "lm-eval", "--model", str(run), "--name", "toy-cc", "--tasks", "ddl_toy_mc",
            "--include-path", str(tasks_dir), "--num-fewshot", "0", "1", "--batch-size", "4", "--device", "cpu",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    # reference for 0-shot: score every choice with an unpadded forward, lm-eval's conventions
    # (context "Question: q\nAnswer:", continuation " choice"; acc_norm divides by len(choice), no space)
    tok = byte_tokenizer()
    acc = acc_norm = 0
    for q, choices, label in DOCS:
        scores = [_logprob(model, tok, f"Question: {q}\nAnswer:", " " + c) for c in choices]
        acc += int(max(range(4), key=lambda i: scores[i]) == label)
        acc_norm += int(max(range(4), key=lambda i: scores[i] / len(choices[i])) == label)
    raw = json.loads(out.with_suffix(".json").read_text())["toy-cc"]
    zero = raw["0"]["results"]["ddl_toy_mc"]
    assert zero["acc,none"] == pytest.approx(acc / len(DOCS))
    assert zero["acc_norm,none"] == pytest.approx(acc_norm / len(DOCS))
    assert raw["1"]["n-shot"]["ddl_toy_mc"] == 1
    table = out.read_text()
    assert f"| toy-cc | 0 | {100 * acc_norm / len(DOCS):.2f} | {100 * acc_norm / len(DOCS):.2f} |" in table
    assert "| toy-cc | 1 |" in table and table.split("\n", 2)[2] in printed + "\n"


def test_unknown_task_lists_close_matches(tmp_path, capsys):
    run, _ = make_run(tmp_path / "run")
    assert main(["eval", "lm-eval", "--model", str(run), "--tasks", "arc_easy", "hellaswagg",
                 "--out", str(tmp_path / "t.md")]) == 2
    err = capsys.readouterr().err
    assert "lm-eval does not know the task 'hellaswagg'; close matches: hellaswag" in err
    assert not (tmp_path / "t.md").exists()


def test_results_table_paper_metrics():
    run = harness.HarnessRun("DDL-CC")
    run.scores[1] = {"arc_easy": {"acc": 0.50, "acc_norm": 0.40}, "winogrande": {"acc": 0.52, "acc_norm": 0.9}}
    table = harness.results_table([run], ["arc_easy", "winogrande"])
    assert "| Model | Shots | ARC-E | WG | Avg. |" in table
    assert "| DDL-CC | 1 | 40.00 | 52.00 | 46.00 |" in table
    assert "ARC-E: acc_norm, WG: acc" in table
    assert "| DDL-CC | 1 | 50.00 | 52.00 | 51.00 |" in harness.results_table([run], ["arc_easy", "winogrande"], "acc")
    with pytest.raises(ValueError, match="^`metric` got 'f1'"):
        harness.pick_metric("arc_easy", {}, "f1")


def test_missing_lm_eval_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ImportError, match=r"pip install 'deep-delta-learning\[eval\]'"):
        harness.require_lm_eval()
    run, _ = make_run(tmp_path / "run")
    assert main(["eval", "lm-eval", "--model", str(run)]) == 2
    assert "needs lm_eval, which is not installed: pip install 'deep-delta-learning[eval]'" in capsys.readouterr().err
