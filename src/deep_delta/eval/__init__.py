"""Evaluation of trained models: validation loss, lm-evaluation-harness, and the cost benchmark.

The names load on first use (:mod:`deep_delta._lazy`), so that the command line's parser imports no PyTorch.
"""

from deep_delta._lazy import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {"deep_delta.eval.loss": ("LossResult", "evaluate_loss")})
