"""The user-design tests train small runs on the training tests' data."""

from tests.train.conftest import data_dir  # noqa: F401
