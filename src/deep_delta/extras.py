"""The optional dependencies: which extra of the package installs each, whether one is installed, and the one
message that says which extra a command needs.

``pip install deep-delta-learning`` alone trains, compares (the report without its figures), evaluates the loss,
exports and generates; each extra adds what :data:`EXTRAS` says (pyproject.toml's ``optional-dependencies``
lists the same packages, ``tests/test_extras.py`` checks that they agree). A command that needs a package that
is not installed says so in one line, before any work, naming the extra that installs it
(:func:`require`); a figure that cannot be drawn is left out of a report that says so
(:func:`deep_delta.experiments.report.write_outputs`). No import of PyTorch.
"""

from __future__ import annotations

import importlib

PACKAGE = "deep-delta-learning"
# import name -> the extra that installs it, and what it is for
EXTRAS: dict[str, tuple[str, str]] = {
    "matplotlib": ("plot", "the figures of every report"),
    "tiktoken": ("data", "the gpt2 tokenizer"),
    "datasets": ("data", "FineWeb-Edu from the Hugging Face Hub"),
    "pyarrow": ("data", "parquet sources"),
    "lm_eval": ("eval", "`ddl eval lm-eval`"),
    "accelerate": ("eval", "`ddl eval lm-eval`"),
    "triton": ("triton", "the fused kernels and `ddl bench-kernels --traffic / --launches`"),
    "tensorboard": ("tensorboard", "TensorBoard logging"),
    "wandb": ("wandb", "Weights & Biases logging"),
}


class MissingExtra(ImportError):
    """A package a command needs is not installed; the message names the extra that installs it."""


def install_hint(module: str) -> str:
    """How to install ``module`` (an import name of :data:`EXTRAS`): ``pip install 'deep-delta-learning[plot]'``."""
    return f"pip install '{PACKAGE}[{EXTRAS[module][0]}]'"


def installed(module: str) -> bool:
    """Whether ``module`` imports (an optional dependency present and usable)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_message(module: str, what: str) -> str:
    """The one line for ``what`` (a command or feature) needing ``module``, which is not installed."""
    return f"{what} needs {module}, which is not installed: {install_hint(module)}"


def require(module: str, what: str) -> None:
    """Refuse, before any work, ``what`` (a command or feature) that needs ``module`` when it is not installed:
    :class:`MissingExtra` naming the extra."""
    if not installed(module):
        raise MissingExtra(missing_message(module, what))


def extra_of_error(error: BaseException) -> str | None:
    """For a ``ModuleNotFoundError`` of an optional dependency (one that no check caught first), the one line
    naming its extra; None for any other error."""
    if not isinstance(error, ModuleNotFoundError):
        return None
    module = (error.name or "").partition(".")[0]
    if module not in EXTRAS:
        return None
    return missing_message(module, EXTRAS[module][1])


__all__ = ["EXTRAS", "PACKAGE", "MissingExtra", "extra_of_error", "install_hint", "installed", "missing_message",
           "require"]
