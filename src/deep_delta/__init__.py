"""Deep Delta Learning (arXiv:2601.00417) for PyTorch.

    from deep_delta import DDLConfig, DDLForCausalLM, DeltaResidual, delta_update

``import deep_delta`` itself loads nothing heavy: the names below are imported from their modules on first
use, so that ``ddl --help`` (whose parser lives in :mod:`deep_delta.cli`) starts without PyTorch or
transformers. ``model_type="deep_delta"`` is registered with the transformers Auto classes as soon as both
deep_delta and transformers are imported, in either order (:func:`deep_delta._lazy.import_after`), so
``import deep_delta`` then ``AutoModelForCausalLM.from_pretrained(...)`` works as with any model package.
"""

from deep_delta._lazy import import_after, lazy_names

__version__ = "0.1.0"

# the module -> the public names it defines
__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "deep_delta.designs": ("ResidualDesign", "register_design"),
    "deep_delta.layers": ("AdditiveResidual", "ChannelCompressor", "DeltaResidual", "StateExpander",
                          "TokenConvCompressor"),
    "deep_delta.models": ("DDLCache", "DDLConfig", "DDLForCausalLM", "DDLModel", "DDLStaticCache"),
    "deep_delta.ops": ("delta_operator", "delta_update"),
})
import_after("transformers", "deep_delta.models")
