"""The test split a study reports on once each variant's lr is chosen on validation data: its size checked before
anything trains, each evaluation run's final model measured on it, and the result kept beside the run.

By contract a prepared data directory's ``val`` split is the selection split (validation during training, the lr
grid's choice) and its ``test`` split (``test_*.bin``, written by ``ddl data prepare --test-fraction F``) is
touched only here, after training: ``ceil(tokens / seq_len)`` windows of ``seq_len`` tokens (rounded up to whole
batches), chosen as the run's validation chooses them (``TrainConfig.eval_windows``: spread evenly over the split, or
its first ones) and batched as its validation is, so every run of a study is measured on the same windows. The result
is ``RUN/test.json``, written atomically, with the windows' plan (``eval_windows``) and, where the data records
where its named sources lie (prose-v1: its packages), the loss of each source (``sources``: ``{name: {"loss",
"tokens"}}``, each token counted for the source of its target); a rerun reuses it when it was measured on the same
windows of the same data at the run's final step, and measures again (from the final checkpoint) otherwise. A
record without a plan was measured before plans existed, on the first windows.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deep_delta.train.config import TrainConfig
    from deep_delta.train.data import TrainData

TEST_SPLIT = "test"
TEST_FILE = "test.json"
DEFAULT_TEST_TOKENS = 250_000


def split_tokens(data: TrainData, split: str = TEST_SPLIT) -> int:
    """The tokens of ``split`` in ``data`` as meta.json records them (or, without split records, as its shards
    hold them); 0 when it has none."""
    from deep_delta.data.loader import split_shards
    from deep_delta.data.shards import read_header

    splits = data.meta.get("splits")
    if isinstance(splits, dict) and split in splits:
        return int(splits[split].get("num_tokens", 0))
    return sum(read_header(p).num_tokens for p in split_shards(data.dir, split))


def resolve_test_tokens(data: TrainData, asked: int | None, seq_len: int) -> int:
    """The test tokens every evaluation run is measured on: ``asked`` (None: :data:`DEFAULT_TEST_TOKENS`, or the
    whole split where it holds fewer). Refused, before anything trains, when the data has no test split or holds
    fewer tokens than ``asked`` explicitly."""
    have = split_tokens(data)
    if have < seq_len + 1:
        raise ValueError(f"`test_tokens`: the evaluation runs are reported on the test split, but {data.dir} has "
                         f"{'no test split (no test_*.bin shards)' if have == 0 else f'a test split of {have} tokens'}"
                         f"; allowed: data prepared with a test split (`ddl data prepare --test-fraction 0.05`) of at "
                         f"least one window of {seq_len + 1} tokens")
    usable = (have - 1) // seq_len * seq_len
    if asked is None:
        return min(DEFAULT_TEST_TOKENS, usable)
    if asked > usable:
        raise ValueError(f"`test_tokens` got {asked:,}, but the test split of {data.dir} holds {have:,} tokens "
                         f"({usable:,} in whole windows of {seq_len}); allowed: at most {usable:,}, or data prepared "
                         "with a larger test split (`ddl data prepare --test-fraction F`)")
    return asked


def windows(tokens: int, seq_len: int) -> int:
    """The test windows that hold ``tokens``: ``ceil(tokens / seq_len)``."""
    return math.ceil(tokens / seq_len)


def measured_batches(tokens: int, seq_len: int, batch_size: int) -> int:
    """The evaluation batches that measure ``tokens`` test tokens: :func:`windows` rounded up to whole batches."""
    return math.ceil(windows(tokens, seq_len) / batch_size)


def measured_tokens(data: TrainData, tokens: int, seq_len: int, batch_size: int) -> int:
    """The test tokens an evaluation of ``tokens`` measures: :func:`measured_batches` whole batches of windows, at
    most every whole window of the split (a count below one batch is measured on one whole batch)."""
    return min(measured_batches(tokens, seq_len, batch_size) * batch_size, (split_tokens(data) - 1) // seq_len) * seq_len


def rounding_said(measured: int, asked: int | None, seq_len: int, batch_size: int) -> str | None:
    """Why the test tokens ``measured`` are not the count ``asked``, in a few words (None where they are)."""
    if asked is None or measured is None or asked == measured:
        return None
    return f"the {asked:,} asked rounded up to whole batches of {batch_size} windows of {seq_len} tokens"


EARLIER_WINDOWS = "first"  # the plan of a test.json written before test.json recorded one


def sources_note(data: TrainData) -> str | None:
    """The one line to say before a study measures on ``data``'s test split when no loss per source can be measured
    there although the data is a named corpus (prepared before source runs were recorded); None otherwise."""
    from deep_delta.data.corpora import named_corpus
    from deep_delta.data.loader import no_sources_reason, split_sources

    if split_sources(data.meta, TEST_SPLIT) is not None or named_corpus(data.meta.get("source")) is None:
        return None
    return f"no test loss per source: the test split of {data.dir} records no sources ({no_sources_reason(data.meta)})"


def measured_windows(record: dict[str, Any]) -> str:
    """The windows' plan a test record was measured with (``eval_windows``; one written before records said it:
    the first windows)."""
    return record.get("eval_windows", EARLIER_WINDOWS)


def _wanted(cfg: TrainConfig, data: TrainData, tokens: int, step: int) -> dict[str, Any]:
    return {"split": TEST_SPLIT, "tokens_asked": tokens, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
            "step": step, "data_fingerprint": data.fingerprint, "eval_windows": cfg.eval_windows}


def read_test(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``RUN/test.json`` (None when there is none), checked to be a record of a test loss: an object with a
    finite ``loss`` and an integer ``step`` and ``windows``; anything else is an error naming the file."""
    from deep_delta.fsutil import read_json_file

    path = Path(run_dir) / TEST_FILE
    if not path.is_file():
        return None
    record = read_json_file(path, "a test loss record (the test.json `ddl compare --eval-seeds` writes)",
                            limit=1 << 20)
    ok = isinstance(record, dict) and isinstance(record.get("loss"), (int, float)) and math.isfinite(
        record["loss"]) and all(isinstance(record.get(k), int) for k in ("step", "windows", "tokens"))
    if not ok:
        raise ValueError(f"{path} is not a test loss record (an object with a finite loss and integer step, windows "
                         "and tokens, as `ddl compare --eval-seeds` writes it); remove it to measure again")
    return record


def measure_test(cfg: TrainConfig, data: TrainData, tokens: int, *, step: int, say=print) -> dict[str, Any]:
    """The test loss of the finished run ``cfg.out`` (its final checkpoint, of ``step``) on :func:`windows` windows
    of the test split chosen by ``cfg.eval_windows``, kept in ``RUN/test.json``; a record there of the same windows,
    data and step is reused (one of another plan is measured again). A run without its final checkpoint and without
    such a record is refused."""
    import json

    from deep_delta.fsutil import atomic_write

    run = Path(cfg.out)
    wanted = _wanted(cfg, data, tokens, step)
    kept = read_test(run)
    if kept is not None and all({**kept, "eval_windows": measured_windows(kept)}.get(k) == v for k, v in wanted.items()):
        return kept
    record = {**wanted, **_evaluate(cfg, data, tokens, step)}
    atomic_write(run / TEST_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")
    say(f"{cfg.variant} seed {cfg.seed}: test loss {record['loss']:.4f} on {record['tokens']:,} tokens")
    return record


def _evaluate(cfg: TrainConfig, data: TrainData, tokens: int, step: int) -> dict[str, Any]:
    """The final checkpoint's loss on the test windows (float64 sums, the training autocast)."""
    from deep_delta.data import TokenLoader
    from deep_delta.experiments.finished_runs import retrain_remedy
    from deep_delta.models.ddl.weights import load_ddl_model
    from deep_delta.runtime import resolve_device, training_autocast
    from deep_delta.train.checkpoint import latest_checkpoint, step_dir_name
    from deep_delta.train.validation import perplexity, source_numbers, summed_loss

    run = Path(cfg.out)
    path = latest_checkpoint(run)
    if path is None or path.name != step_dir_name(step):
        raise FileNotFoundError(f"{run} has no checkpoint of its final step {step} to measure its test loss on (and "
                                f"no {TEST_FILE} of these test windows); {retrain_remedy(run)}")
    device = resolve_device(cfg.device)
    model = load_ddl_model(path).to(device)
    loader = TokenLoader(data.dir, TEST_SPLIT, cfg.batch_size, cfg.seq_len, vocab_size=model.config.vocab_size)
    batches = measured_batches(tokens, cfg.seq_len, cfg.batch_size)
    names = loader.source_names
    total = summed_loss(model, loader.eval_batches(batches, windows=cfg.eval_windows, sources=bool(names)),
                        device=device, autocast=training_autocast(cfg.dtype, device), sources=len(names))
    per_source = {"sources": source_numbers(total, names)} if names else {}
    total = total[0] if names else total
    loss = float(total[0] / total[1])
    return {"loss": loss, "ppl": perplexity(loss), "tokens": int(total[1]), "windows": int(total[1]) // cfg.seq_len,
            "checkpoint": path.name, **per_source}


__all__ = ["DEFAULT_TEST_TOKENS", "TEST_FILE", "TEST_SPLIT", "measure_test", "measured_windows", "read_test",
           "resolve_test_tokens", "sources_note", "split_tokens", "measured_batches", "measured_tokens", "rounding_said",
           "windows"]
