"""Old public names still work, as deprecated aliases of the new ones (a DeprecationWarning when looked up)."""

from __future__ import annotations

import importlib

import pytest

RENAMED = [
    ("deep_delta.ops.delta.naive", "delta_update_torch", "delta_update_reference"),
    ("deep_delta.ops.delta.naive", "delta_operator_torch", "delta_operator_reference"),
    ("deep_delta.ops.delta", "delta_update_torch", "delta_update_reference"),
    ("deep_delta.ops.delta", "delta_operator_torch", "delta_operator_reference"),
    ("deep_delta.ops.compress.naive", "channel_compress_naive", "channel_compress_reference"),
    ("deep_delta.ops.compress.naive", "token_compress_naive", "token_compress_reference"),
    ("deep_delta.ops.compress.naive", "embed_conv_naive", "embed_conv_reference"),
    ("deep_delta.ops.compress", "channel_compress_naive", "channel_compress_reference"),
]


@pytest.mark.parametrize("module,old,new", RENAMED)
def test_old_name_is_the_new_object_with_a_warning(module, old, new):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated; use {new}"):
        obj = getattr(mod, old)
    assert obj is getattr(mod, new)


def test_from_import_of_an_old_name_works():
    with pytest.warns(DeprecationWarning):
        from deep_delta.ops.delta.naive import delta_update_torch  # noqa: F401


def test_normalize_direction_is_the_unit_direction_times_sqrt_d():
    import torch

    from deep_delta.ops.delta import naive

    k = torch.randn(3, 16, dtype=torch.float64)
    with pytest.warns(DeprecationWarning, match="normalize_direction is deprecated"):
        old = naive.normalize_direction
    torch.testing.assert_close(old(k), naive.unit_direction(k)[0] * 4.0, rtol=1e-15, atol=0)


def test_unknown_names_still_raise_attribute_error():
    import deep_delta.ops.delta.naive as naive

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        naive.nope  # noqa: B018
