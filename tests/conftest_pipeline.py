"""Fixtures of the pipeline tests: one small ILSVRC-shaped digits tree with every quirk, converted once.

Loaded by the pipeline test modules through ``pytest_plugins = ["conftest_pipeline"]`` so the
session fixtures are built once per run, whichever pipeline tests are selected.
"""

from __future__ import annotations

import os

import pytest
from pipeline_support import IMAGE_SIZE, PER_CLASS

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory):
    from pinstorm.pipeline import make_digits_tree

    return make_digits_tree(tmp_path_factory.mktemp("digits"), image_size=IMAGE_SIZE, per_class=PER_CLASS,
                            quirks=True, seed=0)


@pytest.fixture(scope="session")
def digits_layout(digits_root):
    from pinstorm.pipeline import scan

    return scan(digits_root)


@pytest.fixture(scope="session")
def digits_dataset(digits_layout, tmp_path_factory):
    """(url, ConvertResult) of the train split in 2 partitions, 8 row groups."""
    from pinstorm.pipeline import convert

    url = tmp_path_factory.mktemp("datasets") / "train"
    result = convert(digits_layout, url, partitions=2, min_row_groups=8, seed=0, progress=False)
    return str(url), result


@pytest.fixture(scope="session")
def digits_val_dataset(digits_layout, tmp_path_factory):
    from pinstorm.pipeline import convert

    url = tmp_path_factory.mktemp("datasets") / "val"
    result = convert(digits_layout, url, split="val", min_row_groups=4, progress=False)
    return str(url), result
