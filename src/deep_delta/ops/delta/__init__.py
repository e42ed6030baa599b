from deep_delta.ops.delta.naive import delta_operator_torch, delta_update_torch, normalize_direction

__all__ = ["delta_operator_torch", "delta_update_torch", "normalize_direction"]
