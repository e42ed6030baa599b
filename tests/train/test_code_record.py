"""run.json names the code a run trained at (train/provenance.py::code_record): the commit of the package's git
checkout and whether its tree was clean, None where there is no checkout to name; every segment of a resumed run
its own."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from deep_delta.train import provenance, train
from deep_delta.train.provenance import code_record

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed (code_record gives None)")


def git(where, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def package(tmp_path):
    """A git checkout holding a package directory (``pkg/__init__.py``, committed), as src/deep_delta stands in
    ours."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("x = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", "pkg/__init__.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    return repo / "pkg"


@needs_git
def test_a_clean_checkout_gives_its_commit(package):
    assert code_record(package) == {"commit": git(package, "rev-parse", "HEAD"), "clean": True}


@needs_git
def test_a_changed_or_added_file_makes_the_tree_dirty(package):
    (package / "__init__.py").write_text("x = 2\n")
    assert code_record(package) == {"commit": git(package, "rev-parse", "HEAD"), "clean": False}
    git(package, "checkout", "--", "__init__.py")
    (package / "new.py").write_text("")  # untracked: it could change what runs
    assert code_record(package)["clean"] is False


@needs_git
def test_no_checkout_or_no_git_gives_none(tmp_path, package, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert code_record(plain) is None
    inside = package.parent / "venv" / "pkg"  # a copy inside another checkout but not tracked by it
    inside.mkdir(parents=True)
    (inside / "__init__.py").write_text("")
    assert code_record(inside) is None
    monkeypatch.setenv("PATH", str(plain))  # no git on the PATH
    assert code_record(package) is None


@needs_git
def test_a_git_that_hangs_is_given_up(package, monkeypatch):
    def hang(*args, timeout=None, **kwargs):
        assert timeout is not None and timeout <= provenance.GIT_TIMEOUT_S
        raise subprocess.TimeoutExpired(args[0], timeout)

    monkeypatch.setattr(provenance.subprocess, "run", hang)
    assert code_record(package) is None


@needs_git
def test_our_own_checkout_is_named():
    """Where the tests run from a git checkout of the package, its record names HEAD."""
    from pathlib import Path

    import deep_delta

    source = Path(deep_delta.__file__).parent
    tracked = subprocess.run(["git", "-C", str(source), "ls-files", "--error-unmatch", "__init__.py"],
                             capture_output=True).returncode == 0
    if not tracked:
        pytest.skip("the package is not in a git checkout here (an installed copy)")
    record = code_record()
    assert record is not None and record["commit"] == git(source, "rev-parse", "HEAD")


def test_run_json_records_the_code_of_each_segment(tmp_path, make_config, monkeypatch):
    codes = iter([{"commit": "a" * 40, "clean": True}, {"commit": "b" * 40, "clean": False}])
    monkeypatch.setattr(provenance, "code_record", lambda: next(codes))
    cfg = make_config(tmp_path / "run", steps=4, eval_every=0, save_every=2)
    train(cfg, stop_at=2, progress=False, quiet=True)
    first = json.loads((tmp_path / "run" / "run.json").read_text())
    assert first["code"] == {"commit": "a" * 40, "clean": True}
    train(cfg, resume=True, progress=False, quiet=True)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["code"] == {"commit": "b" * 40, "clean": False}  # this process's
    assert [(s["from"], s["to"], s["code"]["commit"][0]) for s in run["segments"]] == [(0, 2, "a"), (2, 4, "b")]
