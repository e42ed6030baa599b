"""The update rules (``DDLConfig.update_rule``), named once: for each rule its gates, its kernels' mode and whether
it runs on the kernels only behind a switch. Every other site asks this table (:func:`rule_spec`), which is also the
one validation of a rule's name; the kernels take the mode as a compile-time constant (``ERASE``).

All three are one update, ``x + u (beta_w v^T - beta_e u^T x)`` with u = k normalised (the one reference is
:func:`deep_delta.ops.delta.naive.delta_update_reference`):

========  ===================  =====  ==========================================================================
rule      gates (beta's last   ERASE  the update
          axis, in order)
========  ===================  =====  ==========================================================================
delta     beta                 1      the paper's ``x + beta u (v^T - u^T x)``: beta_e = beta_w = beta
write     beta                 0      the write-only control ``x + beta u v^T``: beta_e = 0, the state not read
untied    erase, write         2      ``x + u (beta_w v^T - beta_e u^T x)``, each gate its own output
========  ===================  =====  ==========================================================================

The write-only and untied rules run the delta rule's kernels (in their mode) only with the ``fused_rules`` switch on
(:mod:`deep_delta.ops.switches`; :func:`on_kernels`), their lean path otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from deep_delta.ops import switches


@dataclass(frozen=True)
class UpdateRule:
    """One update rule: ``name``; ``gates``, the columns of its gate tensor beta in the order of the gate
    projection's outputs (``BetaGate(outputs=len(gates))``); ``erase``, the kernels' ``ERASE`` constant (0: no read
    of the state, 1: the read erased by the write gate, 2: by a gate of its own, beta (..., 2) = (erase, write));
    ``switched``: on the kernels only with the ``fused_rules`` switch on (not yet run on a GPU)."""

    name: str
    gates: tuple[str, ...]
    erase: int
    switched: bool

    @property
    def reads(self) -> bool:
        """Whether the update reads the state (``u^T x``): every rule but the write-only control."""
        return self.erase != 0

    @property
    def paper(self) -> bool:
        """Whether this is the paper's rule (the default; a module's repr names any other)."""
        return self.name == UPDATE_RULES[0]

    @property
    def erase_gate(self) -> bool:
        """Whether the erase has a gate of its own, the first column of beta (the untied rule)."""
        return self.erase == 2


RULES = {rule.name: rule for rule in (UpdateRule("delta", ("beta",), 1, switched=False),
                                      UpdateRule("write", ("beta",), 0, switched=True),
                                      UpdateRule("untied", ("erase", "write"), 2, switched=True))}
UPDATE_RULES = tuple(RULES)  # the names, for choices
RULE_GATES = {name: rule.gates for name, rule in RULES.items()}  # each rule's gates, as BetaGate orders them


def rule_spec(rule: str, where: str = "delta update", param: str = "rule") -> UpdateRule:
    """The rule named ``rule``: the one check of a rule's name. Anything else is a ``ValueError`` naming ``where``
    (the function or class asked) and its parameter ``param``."""
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"{where}: `{param}` got {rule!r}; allowed: {' | '.join(UPDATE_RULES)}")
    return RULES[rule]


def on_kernels(rule: str) -> bool:
    """Whether an update by ``rule`` may run on the fused kernels (where the backend resolves to Triton) and fuse
    with the next sublayer: the delta rule always, the write-only and untied rules with the ``fused_rules`` switch
    on (off: their lean update, never fused, as before issue 59)."""
    return not rule_spec(rule).switched or switches.get().fused_rules


__all__ = ["RULES", "RULE_GATES", "UPDATE_RULES", "UpdateRule", "on_kernels", "rule_spec"]
