from deep_delta.ops.delta.naive import delta_operator_reference, delta_update_reference, unit_direction

__all__ = ["delta_operator_reference", "delta_update_reference", "unit_direction"]
