"""Evaluation of trained models: validation loss, lm-evaluation-harness, and the cost benchmark.

The names load on first use (:mod:`deep_delta._lazy`), so that the command line's parser imports no PyTorch.
"""

from deep_delta._lazy import lazy_names

_PUBLIC = {"LossResult": "deep_delta.eval.loss", "evaluate_loss": "deep_delta.eval.loss"}

__all__ = sorted(_PUBLIC)
__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
