"""The experiments' tests train small runs on the training tests' data: their fixtures, shared."""

from tests.train.conftest import data_dir, make_config, tiny_model  # noqa: F401
