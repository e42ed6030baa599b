"""``deep_delta._lazy.lazy_names``: a package's public names, listed per module, load on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deep_delta._lazy import lazy_names


def test_every_public_name_of_the_lazy_packages_loads_from_its_module():
    import deep_delta
    import deep_delta.eval
    import deep_delta.train

    for package in (deep_delta, deep_delta.eval, deep_delta.train):
        assert package.__all__ == sorted(package.__all__) and len(package.__all__) == len(set(package.__all__))
        for name in package.__all__:
            value = getattr(package, name)
            assert value.__name__ == name and name in dir(package)
        with pytest.raises(AttributeError, match=f"module '{package.__name__}' has no attribute 'nothing_here'"):
            _ = package.nothing_here


def test_a_name_listed_under_two_modules_is_an_error():
    with pytest.raises(ValueError, match="'f' is listed under 'a.one' and 'a.two'"):
        lazy_names("deep_delta", {"a.one": ("f",), "a.two": ("g", "f")})


def test_importing_the_packages_loads_no_pytorch():
    probe = "import sys, deep_delta, deep_delta.train, deep_delta.eval; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
