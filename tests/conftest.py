import os

import pytest
import torch

# Without a GPU the Triton kernels are tested on CPU tensors in the Triton interpreter
# (tests/ops/test_kernels.py). The flag must be set before anything imports triton, and importing
# deep_delta does (transformers -> torch._dynamo), so it is set here, before any test module is collected.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Two cores on CI: one intra-op thread per test process keeps timings stable and avoids oversubscription.
torch.set_num_threads(int(os.environ.get("DDL_TEST_THREADS", "2")))


def pytest_report_header(config):
    """Which way the pinned results are checked in this session (tests/helpers.py, ``same_as_pinned``)."""
    from helpers import PIN_TOLERANCE, PINNING_PROBE, computes_as_pinned, cpu_probe

    if computes_as_pinned():
        return f"pinned results: bit for bit (this CPU's probe {cpu_probe()} is the pinning machine's)"
    return (f"pinned results: to {PIN_TOLERANCE:g} relative (this CPU's probe {cpu_probe()} is not the pinning "
            f"machine's {PINNING_PROBE}: it rounds differently)")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _threads():
    """A command run in-process sets PyTorch's threads (`--threads`, auto by default in `ddl train` and `ddl
    compare`); the next test starts with the session's again."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def set_switches():
    """Sets kernel switches for one test by their field names, ``set_switches(fused_rules=True)``
    (``deep_delta.ops.switches.override``), all restored after it; later calls inside the test stack on earlier
    ones."""
    import contextlib

    from deep_delta.ops import switches

    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(switches.override(**values))


class OfflineWandb:
    """The W&B runs written offline under ``root`` (``WANDB_DIR``), read back from their ``run-ID.wandb`` files:
    wandb 0.31 writes no config.yaml or wandb-summary.json offline, only that record log (a LevelDB-style log of
    ``wandb.proto`` Records behind a 7-byte ``:W&B`` header)."""

    BLOCK = 32768

    def __init__(self, root):
        self.root = root

    def files(self) -> list:
        return sorted((self.root / "wandb").glob("offline-run-*/run-*.wandb"))

    def runs(self) -> list[dict]:
        """Every offline run folder, in the order they were started: id, project, name, group, job_type, config,
        history (one dict per logged row), summary (the final values), exit_code and folder."""
        return sorted((self.read(path) for path in self.files()), key=lambda run: run["start"])

    @staticmethod
    def table(run: dict, key: str) -> list[dict]:
        """The rows of the ``wandb.Table`` a run logged under ``key``, as dicts of column -> value (wandb keeps it
        offline as ``files/media/table/KEY_STEP_HASH.table.json``)."""
        import json

        [path] = (run["folder"] / "files" / "media" / "table").glob(f"{key}_[0-9]*.table.json")
        table = json.loads(path.read_text())
        return [dict(zip(table["columns"], row)) for row in table["data"]]

    @classmethod
    def records(cls, path) -> list:
        import struct

        from wandb.proto import wandb_internal_pb2 as pb

        raw = path.read_bytes()
        assert raw[:4] == b":W&B", f"{path} is not a W&B record log"
        out, pending, pos = [], b"", 7
        while pos + 7 <= len(raw):
            left = cls.BLOCK - pos % cls.BLOCK
            if left < 7:  # a block's tail too short for a header is padding
                pos += left
                continue
            _crc, size, kind = struct.unpack("<IHB", raw[pos:pos + 7])
            if pos + 7 + size > len(raw):  # still being written
                break
            data, pos = raw[pos + 7:pos + 7 + size], pos + 7 + size
            if kind == 0:  # zero padding to the end of the block
                pos += left - 7 - size
                continue
            pending = data if kind in (1, 2) else pending + data  # full / first, middle / last
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(pending)
                out.append(record)
        return out

    @classmethod
    def read(cls, path, timeout: float = 60.0) -> dict:
        """One run's file, once it is complete: ``run.finish()`` returns before wandb's service has written
        the records out, so this waits (up to ``timeout`` seconds) for the exit record."""
        import json
        import time

        deadline = time.monotonic() + timeout
        records = cls.records(path)
        while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < deadline:
            time.sleep(0.1)
            records = cls.records(path)
        run = {"config": {}, "history": [], "summary": {}, "exit_code": None, "folder": path.parent}

        def put(target, item):
            keys = list(item.nested_key) or [item.key]
            for k in keys[:-1]:
                target = target.setdefault(k, {})
            target[keys[-1]] = json.loads(item.value_json)

        for record in records:
            kind = record.WhichOneof("record_type")
            if kind == "run":
                r = record.run
                run.update(id=r.run_id, project=r.project, name=r.display_name, group=r.run_group,
                           job_type=r.job_type, start=(r.start_time.seconds, r.start_time.nanos))
                for item in r.config.update:
                    put(run["config"], item)
            elif kind == "config":
                for item in record.config.update:
                    put(run["config"], item)
            elif kind == "history":
                row = {}
                for item in record.history.item:
                    put(row, item)
                run["history"].append(row)
            elif kind == "summary":
                for item in record.summary.update:
                    put(run["summary"], item)
            elif kind == "exit":
                run["exit_code"] = record.exit.exit_code
        return run


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch) -> OfflineWandb:
    """W&B in offline mode into ``tmp_path/wandb-root``: no API key, an unreachable host, every W&B folder
    (config, cache, artifacts) inside the test's directory; read the runs back with ``.runs()``."""
    root = tmp_path / "wandb-root"
    root.mkdir()
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_GROUP",
                 "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    env = {"WANDB_MODE": "offline", "WANDB_DIR": root, "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
           "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_BASE_URL": "http://127.0.0.1:9",
           "WANDB_CONFIG_DIR": root / "config", "WANDB_CACHE_DIR": root / "cache", "WANDB_DATA_DIR": root / "data",
           "WANDB_ARTIFACT_DIR": root / "artifacts", "NETRC": root / "netrc"}
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    return OfflineWandb(root)
