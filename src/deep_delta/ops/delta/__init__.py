from deep_delta.ops.delta import naive as _naive
from deep_delta.ops.delta.naive import delta_operator_reference, delta_update_reference, unit_direction

__all__ = ["delta_operator_reference", "delta_update_reference", "unit_direction"]

__getattr__ = _naive.__getattr__  # the old names (delta_update_torch, ...), deprecated
