"""Evaluation of trained models: validation loss, lm-evaluation-harness, and the cost benchmark."""

from deep_delta.eval.loss import LossResult, evaluate_loss

__all__ = ["LossResult", "evaluate_loss"]
