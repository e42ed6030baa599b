import pytest

from deep_delta import runtime


def test_auto_threads_counts_the_cores_other_work_keeps_busy(monkeypatch):
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runtime.time, "sleep", lambda s: None)
    samples = iter([(100, 1000), (100 + 150, 1000 + 400)])  # 150 of 400 jiffies busy: 1.5 of 4 cores
    monkeypatch.setattr(runtime, "_cpu_times", lambda: next(samples))
    assert runtime.busy_cores() == pytest.approx(1.5)
    samples = iter([(0, 0), (0, 400)])  # idle machine: every core
    assert runtime.cpu_threads("auto") == 4
    samples = iter([(0, 0), (400, 400)])  # every core busy: still one thread
    assert runtime.cpu_threads("auto") == 1
    samples = iter([(0, 0), (100, 400)])  # one of 4 busy: 3 threads, and why (`ddl train` says it)
    assert runtime.chosen_threads("auto") == (3, "auto: 4 cores, 1.0 kept busy by other work")


def test_auto_threads_falls_back_to_load_average(monkeypatch):
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(runtime, "_cpu_times", lambda: None)
    monkeypatch.setattr(runtime.os, "getloadavg", lambda: (1.2, 0.0, 0.0))
    assert runtime.busy_cores() == pytest.approx(1.2)
    assert runtime.cpu_threads("auto") == 1


def test_threads_spec_errors():
    assert runtime.cpu_threads(None) is None
    assert runtime.cpu_threads("3") == 3
    assert runtime.chosen_threads("3") == (3, "as given") and runtime.chosen_threads(None) == (None,
                                                                                           "PyTorch's own choice")
    with pytest.raises(ValueError, match="`threads` got 'x'"):
        runtime.cpu_threads("x")


@pytest.mark.parametrize("spec", ["cuda:x", "gpu", "", "cuda:-1", 3])
def test_device_spec_errors(spec):
    with pytest.raises(ValueError, match="`device` got .*; allowed: auto \\| cpu \\| cuda \\| cuda:N"):
        runtime.resolve_device(spec)


def test_device_resolution_on_this_machine():
    import torch

    assert runtime.resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert runtime.resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ValueError, match="CUDA is not available"):
            runtime.resolve_device("cuda:0")
