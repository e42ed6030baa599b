"""The delta update and the Delta Operator, with backend dispatch; the update fused with the next sublayer's read.

``backend`` follows :func:`deep_delta.ops.backend.resolve_backend`. Every public function here checks its inputs
and reaches its implementation through the one dispatch of the ops (:func:`deep_delta.ops.backend.dispatch`; the
routes each op has are registered at the end of this module): ``"torch"``, the lean PyTorch path (:mod:`.lean`,
tested against the plain reference :mod:`.naive`); ``"triton"``, the kernels' autograd Functions (:mod:`.triton`,
:mod:`.triton_token`, :mod:`.triton_norm`); ``"auto"``, the kernels on CUDA and elsewhere the ``torch.library``
custom op (:mod:`.library`), whose kernel there is the lean math: one opaque node under ``torch.compile``. While
``torch.compile`` traces, ``"auto"`` and ``"triton"`` call the custom op, told which kernels to run
(:func:`deep_delta.ops.backend.through_registered_op`). The fused update + read and update + input stage take the
next sublayer's weights; off the kernels they run the update and the next op one after the other (the one unfused
fallback, ``_update_then_*`` here: the compressors of :mod:`deep_delta.ops.compress` imported inside, so that
``ops.compress`` never waits on this package).

The update rules (``DDLConfig.update_rule``) are named once, in :mod:`.rules` (``rule_spec``: a rule's gates, its
kernels' mode ``ERASE``, whether it is behind the ``fused_rules`` switch; the one check of a rule's name). Every
update entry point takes the rule's gates as one tensor, beta (..., 1), or (..., 2) = (erase, write) for "untied",
and the fused ones a ``rule`` argument. The write-only and untied rules run the delta rule's kernels in their mode
where the backend resolves to Triton and the ``fused_rules`` switch is on (:func:`.rules.on_kernels`); otherwise
their lean path, as before the switch existed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from deep_delta.ops.backend import dispatch, lazy, register
from deep_delta.ops.delta.lean import update_lean
from deep_delta.ops.delta.naive import (
    delta_operator_reference,
    delta_update_reference,
    unit_direction,
    update_and_norm_reference,
)
from deep_delta.ops.delta.rules import RULE_GATES, RULES, UPDATE_RULES, UpdateRule, on_kernels, rule_spec


def _shape_error(name: str, expected: str, got: torch.Tensor, hint: str = "") -> ValueError:
    msg = f"delta_update: `{name}` must have shape {expected}, got {tuple(got.shape)}"
    return ValueError(msg + (f" ({hint})" if hint else ""))


def _check_inputs(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """Validate shapes; return beta as (..., 1)."""
    if x.dim() < 2:
        raise _shape_error("x", "(..., d, d_v)", x, "at least 2 dims")
    *lead, d, dv = x.shape
    lead = tuple(lead)
    if tuple(k.shape) != lead + (d,):
        raise _shape_error("k", str(lead + (d,)).replace(",)", ")"), k, f"x is {tuple(x.shape)}")
    if tuple(v.shape) != lead + (dv,):
        raise _shape_error("v", str(lead + (dv,)).replace(",)", ")"), v, f"x is {tuple(x.shape)}")
    if tuple(beta.shape) == lead:
        beta = beta.unsqueeze(-1)
    if tuple(beta.shape) != lead + (1,):
        raise _shape_error("beta", f"{lead} or {lead + (1,)}", beta, f"x is {tuple(x.shape)}")
    for name, t in (("x", x), ("k", k), ("v", v), ("beta", beta)):
        if not t.is_floating_point():
            raise TypeError(f"delta_update: `{name}` must be a floating-point tensor, got {t.dtype}")
    return beta


def _check_rule_inputs(spec: UpdateRule, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                       where: str = "delta update") -> torch.Tensor:
    """Validate shapes for an update by the rule ``spec``; return its gates as (..., 1), or (..., 2) for a rule of
    two gates (the untied rule's erase and write)."""
    gates = len(spec.gates)
    if gates == 1:
        return _check_inputs(x, k, v, beta)
    if beta.dim() < 1 or beta.shape[-1] != gates:
        raise ValueError(f"{where}: the {spec.name} rule takes beta (..., {gates}) ({', '.join(spec.gates)}), got "
                         f"{tuple(beta.shape)}")
    _check_inputs(x, k, v, beta[..., :1])
    return beta


def _kernels():
    from deep_delta.ops.delta import triton

    return triton


def _token_kernels():
    from deep_delta.ops.delta import triton_token

    return triton_token


def _norm_kernels():
    from deep_delta.ops.delta import triton_norm

    return triton_norm


def _library():
    from deep_delta.ops.delta import library

    return library


def _update_then_channel_read(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                              weight: torch.Tensor, *, k_eps: float, rule: str,
                              backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The update, then the CC read of the new state: two ops, each dispatched with ``backend``."""
    from deep_delta.ops.compress import channel_compress

    out = apply_update(rule, x, k, v, beta, k_eps=k_eps, backend=backend)
    return out, channel_compress(out, weight, backend=backend)


def _update_then_token_read(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                            weight: torch.Tensor, *, k_eps: float, rule: str,
                            backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The update, then the TC read of the new state (no token history): two ops, each dispatched with ``backend``."""
    from deep_delta.ops.compress import token_compress

    out = apply_update(rule, x, k, v, beta, k_eps=k_eps, backend=backend)
    return out, token_compress(out, weight, None, backend=backend)


def _update_then_norm(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *weights: torch.Tensor,
                      read: torch.Tensor | None, k_eps: float, eps: float, beta_max: float, value_scale: float,
                      c_dtype: torch.dtype | None, rule: str, backend: str) -> tuple[torch.Tensor, ...]:
    """The update (with the CC read through ``read``), then the next sublayer's input stage of the new state (or
    of the read): each op dispatched with ``backend``."""
    from deep_delta.ops.norm import norm_gate_value

    if read is None:
        out = apply_update(rule, x.unsqueeze(-1), k, v, beta, k_eps=k_eps, backend=backend).squeeze(-1)
        x_in = out
    else:
        out, x_in = update_and_channel_read(x, k, v, beta, read, k_eps=k_eps, backend=backend, rule=rule)
    return (out, *norm_gate_value(x_in, *weights, eps=eps, beta_max=beta_max, value_scale=value_scale,
                                  c_dtype=c_dtype, backend=backend))


def _any_lead(fused: Callable) -> Callable:
    """``fused`` (the kernels' or the custom op's update + input stage on flattened contiguous tensors) at any
    leading shape: its inputs flattened, its outputs back at x's."""

    def run(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *weights: torch.Tensor,
            read: torch.Tensor | None, **consts) -> tuple[torch.Tensor, ...]:
        outs = fused(*_flatten(x, k, v, beta, read), read, *weights, **consts)
        return _unflatten(outs, x, weights[3].shape[0])

    return run


def _rule_dispatch(op: str, spec: UpdateRule, backend: str, x: torch.Tensor, auto_library: bool = False) -> Callable:
    """The implementation of the update op ``op`` by the rule ``spec`` (:func:`deep_delta.ops.backend.dispatch`):
    the kernels only where the rule may (:func:`.rules.on_kernels`); with ``auto_library``, ``"auto"`` off the
    Triton path through the custom op (its lean kernel: one node under ``torch.compile``), for the rules not behind
    the switch (the delta rule's, as before issue 59; the others keep their lean path there)."""
    return dispatch(op, backend, x, kernels=on_kernels(spec.name), auto_library=auto_library and not spec.switched)


def apply_update(rule: str, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *,
                 k_eps: float = 1e-5, backend: str = "auto") -> torch.Tensor:
    """The update named by ``rule`` (:mod:`.rules`): "delta" (:func:`delta_update`), "write" (:func:`write_update`)
    or "untied" (:func:`untied_update`; beta (..., 2): the erase gate, then the write gate, as the rule names its
    gates). Arguments as :func:`delta_update`; every update reaches its implementation here."""
    spec = rule_spec(rule, "apply_update")
    beta = _check_rule_inputs(spec, x, k, v, beta, "apply_update")
    update = _rule_dispatch("update", spec, backend, x, auto_library=True)
    return update(x, k, v, beta, k_eps=k_eps, rule=rule)


def delta_update(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *, k_eps: float = 1e-5,
                 backend: str = "auto") -> torch.Tensor:
    """Deep Delta update ``x + beta k (v^T - k^T x)`` (eq. 2.5) with k normalised inside.

    Args:
        x: state, (..., d, d_v); d_v >= 1 (use d_v = 1 for a vector residual stream).
        k: raw direction k~, (..., d); normalised as ``k~ / sqrt(|k~|^2 + k_eps^2)``.
        v: value, (..., d_v).
        beta: gate, (...) or (..., 1); the paper keeps it in (0, 2).
        k_eps: the eps guard of the normalisation (a zero k gives a zero update, finite gradients).
        backend: "auto" (the custom op ``deep_delta::delta_update``: the Triton kernel on CUDA, the lean math
            elsewhere; see :mod:`deep_delta.ops.delta.library`; in eager on CUDA the kernel's autograd Function
            directly, :func:`deep_delta.ops.backend.through_registered_op`), "torch" (the lean autograd
            Function) or "triton" (the kernel's autograd Function, and the custom op running the kernels while
            ``torch.compile`` traces; CPU tensors only under the Triton interpreter).
    Returns:
        the new state, (..., d, d_v), in x's dtype.
    """
    return apply_update("delta", x, k, v, beta, k_eps=k_eps, backend=backend)


def write_update(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *, k_eps: float = 1e-5,
                 backend: str = "auto") -> torch.Tensor:
    """The write-only control ``x + beta k v^T`` (issue 48): the delta update with its read ``k^T x`` removed, so
    it writes along k without erasing what the state holds there. The authors' named missing control: the same
    model, state, compressor, EC, gate and init, only the update differs (``DDLConfig.update_rule = "write"``).

    Arguments as :func:`delta_update`. The lean path (:func:`.lean.write_update_lean`, one ``addcmul``), or with
    the ``fused_rules`` switch on where the backend resolves to Triton the delta update's kernels in their write-only
    mode (no read of the state: :func:`.rules.on_kernels`).
    """
    return apply_update("write", x, k, v, beta, k_eps=k_eps, backend=backend)


def untied_update(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta_erase: torch.Tensor,
                  beta_write: torch.Tensor, *, k_eps: float = 1e-5, backend: str = "auto") -> torch.Tensor:
    """The delta update with untied gates, ``x + k (beta_write v^T - beta_erase k^T x)`` (issue 56): how much of the
    state along k is erased and how much of v is written, each with its own gate. ``beta_erase == beta_write``
    is :func:`delta_update`; ``beta_erase == 0`` is :func:`write_update` (``DDLConfig.update_rule = "untied"``).

    Arguments as :func:`delta_update`, the gates each (...) or (..., 1), joined as (..., 2) for
    :func:`apply_update`. The lean path (the delta update's autograd Function in its untied mode,
    :func:`.lean.untied_update_lean`), or with the ``fused_rules`` switch on where the backend resolves to Triton
    the delta update's kernels in their untied mode (:func:`.rules.on_kernels`).
    """
    beta_write = _check_inputs(x, k, v, beta_write)
    beta_erase = _check_inputs(x, k, v, beta_erase)
    return apply_update("untied", x, k, v, torch.cat([beta_erase, beta_write], dim=-1), k_eps=k_eps, backend=backend)


def delta_operator(k: torch.Tensor, beta: torch.Tensor, *, k_eps: float = 1e-5) -> torch.Tensor:
    """Dense Delta Operator ``I - beta k k^T`` (eq. 2.3) for analysis and tests.

    k: raw direction (..., d); beta: (...) or (..., 1). Returns (..., d, d) in fp32 (fp64 for fp64 k).
    """
    if k.dim() < 1:
        raise ValueError(f"delta_operator: `k` must have shape (..., d), got {tuple(k.shape)}")
    lead = tuple(k.shape[:-1])
    if tuple(beta.shape) == lead:
        beta = beta.unsqueeze(-1)
    if tuple(beta.shape) != lead + (1,):
        raise ValueError(
            f"delta_operator: `beta` must have shape {lead} or {lead + (1,)}, got {tuple(beta.shape)}"
        )
    return delta_operator_reference(k, beta, k_eps=k_eps)


def update_and_channel_read(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, weight: torch.Tensor,
                            *, k_eps: float = 1e-5, backend: str = "auto",
                            rule: str = "delta") -> tuple[torch.Tensor, torch.Tensor]:
    """The update of one sublayer fused with the CC read of the next: returns (x', x_in).

    x: (..., d, d_v), k: (..., d), v: (..., d_v), beta: (..., 1) ((..., 2) for the untied rule), weight: (d, d_v) the
    next sublayer's channel compressor; ``rule`` the update rule. Equals ``x' = apply_update(rule, x, k, v, beta)``,
    ``x_in = channel_compress(x', weight)``; the Triton kernel computes x_in from the tile it has just written (no
    second pass over x'). Off the kernels (a backend other than Triton, or a rule behind its switch:
    :func:`.rules.on_kernels`) the two ops run one after the other, each with ``backend``.
    """
    spec = rule_spec(rule, "update_and_channel_read")
    beta = _check_rule_inputs(spec, x, k, v, beta, "update_and_channel_read")
    fused = _rule_dispatch("update_and_channel_read", spec, backend, x, auto_library=True)
    return fused(x, k, v, beta, weight, k_eps=k_eps, rule=rule)


def update_and_token_read(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, weight: torch.Tensor,
                          *, k_eps: float = 1e-5, backend: str = "auto",
                          rule: str = "delta") -> tuple[torch.Tensor, torch.Tensor]:
    """The update of one sublayer fused with the TC read of the next (no token history): (x', x_in).

    x: (B, T, d, d_v), k: (B, T, d), v: (B, T, d_v), beta: (B, T, 1) ((B, T, 2) for the untied rule), weight:
    (K, d, d_v) the next sublayer's folded TC taps; ``rule`` the update rule. Equals
    ``x' = apply_update(rule, x, k, v, beta)``, ``x_in = token_compress(x', weight)``; the Triton kernels
    (:mod:`deep_delta.ops.delta.triton_token`) make one pass over the state each way (a rule other than the delta
    rule only where :func:`.rules.on_kernels` holds; elsewhere the two ops one after the other).
    """
    spec = rule_spec(rule, "update_and_token_read")
    beta = _check_rule_inputs(spec, x, k, v, beta, "update_and_token_read")
    if x.dim() != 4 or weight.dim() != 3 or tuple(weight.shape[1:]) != tuple(x.shape[2:]):
        raise ValueError(f"update_and_token_read: expected x (B, T, d, d_v) and weight (K, d, d_v), got "
                         f"{tuple(x.shape)} and {tuple(weight.shape)}")
    fused = _rule_dispatch("update_and_token_read", spec, backend, x)
    return fused(x, k, v, beta, weight, k_eps=k_eps, rule=rule)


def _flatten(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, read: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """(x, k, v, beta) with one leading dimension, contiguous: x (N, d) or (N, d, d_v) with ``read``, beta (N, 1) or
    (N, 2)."""
    d, dv = x.shape[-1] if read is None else x.shape[-2], v.shape[-1]
    n = k.numel() // d
    state = (n, d) if read is None else (n, d, dv)
    return (x.reshape(state).contiguous(), k.reshape(n, d).contiguous(), v.reshape(n, dv).contiguous(),
            beta.reshape(n, beta.shape[-1]).contiguous())


def _unflatten(outs: tuple[torch.Tensor, ...], x: torch.Tensor, dv_next: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused op's flat outputs (x', c, beta' (N, G'), v') back at x's leading shape."""
    out, c, beta2, v2 = outs
    d = c.shape[-1]
    lead = x.shape[: x.dim() - (out.dim() - 1)]
    return out.view(x.shape), c.view(*lead, d), beta2.view(*lead, beta2.shape[-1]), v2.view(*lead, dv_next)


def update_and_norm(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, norm_weight: torch.Tensor,
                    gate_weight: torch.Tensor, gate_bias: torch.Tensor, value_weight: torch.Tensor,
                    value_bias: torch.Tensor, *, read: torch.Tensor | None = None, k_eps: float, eps: float,
                    beta_max: float, value_scale: float, c_dtype: torch.dtype | None = None,
                    backend: str = "auto",
                    rule: str = "delta") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An update fused with the next sublayer's input stage: ``(x', c, beta', v')``.

    Without ``read`` (a d_v = 1 state): ``x' = delta_update(x[..., None], k, v, beta)[..., 0]`` followed by
    ``norm_gate_value(x', norm_weight, ...)``. With ``read`` (d_v > 1, the next sublayer's channel compressor
    weight (d, d_v)): ``x' = delta_update(x, k, v, beta)``, ``x_in = channel_compress(x', read)`` and
    ``(c, beta', v') = norm_gate_value(x_in, norm_weight, ...)``. The Triton kernels (:mod:`.triton_norm`)
    compute the next sublayer's inputs from the tile they have just written (the read without storing it), and the
    backward runs the input stage's (and the read's) backward in registers before the update's: each state row
    read once per direction.

    Args:
        x: (..., d) without ``read``, (..., d, d_v) with it; k: (..., d), the raw direction; v: (..., 1) or
            (..., d_v); beta: (..., 1), or (..., 2) for the untied ``rule`` (erase, write).
        norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype: the
            next sublayer's, as :func:`deep_delta.ops.norm.norm_gate_value` takes them (value_weight (d_v', d): the next sublayer's
            value width).
        read: the next sublayer's channel compressor weight (d, d_v) for a d_v > 1 state, else None.
        k_eps: this update's direction normalisation guard.
        backend: "auto", "torch" or "triton" (:func:`deep_delta.ops.norm.norm_gate_value`'s rules).
        rule: the update rule, "delta", "write" or "untied" (the kernels' mode only where :func:`.rules.on_kernels` holds;
            else the update and the input stage apart). The next sublayer's gate may have two outputs
            (gate_weight (2, d): beta' (..., 2)).
    """
    spec = rule_spec(rule, "update_and_norm")
    gates = len(spec.gates)
    if read is None:
        if x.dim() < 1 or tuple(k.shape) != tuple(x.shape):
            raise ValueError(f"update_and_norm: `x` and `k` must have the same shape (..., d) without `read`, got "
                             f"{tuple(x.shape)} and {tuple(k.shape)}")
        shapes = (("v", v, tuple(x.shape[:-1]) + (1,)), ("beta", beta, tuple(x.shape[:-1]) + (gates,)))
        src = x
    else:
        if x.dim() < 2 or tuple(k.shape) != tuple(x.shape[:-1]):
            raise ValueError(f"update_and_norm: with `read`, `x` must have shape (..., d, d_v) and `k` (..., d), got "
                             f"{tuple(x.shape)} and {tuple(k.shape)}")
        lead, dv = tuple(x.shape[:-2]), x.shape[-1]
        shapes = (("v", v, lead + (dv,)), ("beta", beta, lead + (gates,)),
                  ("read", read, tuple(x.shape[-2:])))
        src = x[..., 0]
    for name, t, shape in shapes:
        if tuple(t.shape) != shape:
            raise ValueError(f"update_and_norm: `{name}` must have shape {shape} (x is {tuple(x.shape)}), got "
                             f"{tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"update_and_norm: `{name}` must be a floating-point tensor, got {t.dtype}")
    if not (math.isfinite(k_eps) and k_eps >= 0):
        raise ValueError(f"update_and_norm: `k_eps` got {k_eps}; allowed: a finite number >= 0")
    from deep_delta.ops.norm import check_norm_inputs

    check_norm_inputs(src, norm_weight, gate_weight, gate_bias, value_weight, value_bias, eps, beta_max, value_scale, c_dtype)
    fused = _rule_dispatch("update_and_norm", spec, backend, x)
    return fused(x, k, v, beta, norm_weight, gate_weight, gate_bias, value_weight, value_bias, read=read, k_eps=k_eps,
                 eps=eps, beta_max=beta_max, value_scale=value_scale, c_dtype=c_dtype, rule=rule)


# every update by a rule, alone and fused with the next sublayer's read or input stage: its routes in the table of
# deep_delta.ops.backend.dispatch (the lean update runs the rule's lean function: .lean.update_lean)
register("update", torch=update_lean, triton=lazy(_kernels, "delta_update_triton"),
         library=lazy(_library, "update_with_op"))
register("update_and_channel_read", unfused=_update_then_channel_read,
         triton=lazy(_kernels, "delta_update_read_triton"), library=lazy(_library, "update_with_op"))
register("update_and_token_read", unfused=_update_then_token_read,
         triton=lazy(_token_kernels, "delta_update_token_read_triton"))
register("update_and_norm", unfused=_update_then_norm, triton=_any_lead(lazy(_norm_kernels, "update_and_norm_triton")),
         library=_any_lead(lazy(_library, "update_norm_with_op")))


__all__ = [
    "RULES",
    "RULE_GATES",
    "UPDATE_RULES",
    "UpdateRule",
    "on_kernels",
    "rule_spec",
    "update_and_norm",
    "update_and_norm_reference",
    "apply_update",
    "delta_operator",
    "delta_operator_reference",
    "delta_update",
    "delta_update_reference",
    "unit_direction",
    "update_and_channel_read",
    "update_and_token_read",
    "untied_update",
    "write_update",
]
