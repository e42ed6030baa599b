"""Residual designs: the residual around every sublayer, as components behind one interface, chosen by name.

``DDLConfig.residual`` names the design a model uses; :func:`get_design` returns it. The built-in designs, one module
(or small package) each: ``additive`` (the baseline and Peri-LN, :mod:`deep_delta.designs.additive`), ``delta``
(Deep Delta Learning and its update rules, :mod:`deep_delta.designs.delta`), ``hyper`` (HC / mHC,
:mod:`deep_delta.designs.hyper`) and ``attnres`` (Attention Residuals, :mod:`deep_delta.designs.attnres`). A design of
a user's own subclasses :class:`ResidualDesign` and calls :func:`register_design`; docs/designs.md walks through one.
"""

from deep_delta._lazy import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "deep_delta.designs.base": ("Carry", "Emit", "NOTHING", "ResidualDesign", "mask_pads", "mup_readout_init_",
                                "read_with_history", "unfused"),
    "deep_delta.designs.probes": ("EmbeddingProbe", "Probe", "StateProbe"),
    "deep_delta.designs.registry": ("design_module_of", "design_names", "get_design", "load_design_module",
                                    "register_design"),
})
